//! Slices as Linkerd's external workload endpoints controller (in its destination service)
//! writes them, from these facts about it:
//!
//! - `generateName` `linkerd-external-<service>-`, the Service's namespace, one controller owner
//!   reference to the Service (`apiVersion: v1`, `kind: Service`, name, uid, `controller` and
//!   `blockOwnerDeletion` true);
//! - labels: the Service's labels except the three reserved ones, plus
//!   `kubernetes.io/service-name`, `endpointslice.kubernetes.io/managed-by:
//!   linkerd-external-workloads-controller` and `service.kubernetes.io/headless: ""` for a
//!   headless Service; it adds missing or changed Service labels to a slice it otherwise keeps,
//!   but removes a label only when it rewrites the slice for another reason;
//! - families from `ipFamilies` (both when none); a slice per family and port list, at most 100
//!   endpoints each; workloads without IPs skipped;
//! - ports: per Service port, a named `targetPort` resolves to the workload port of that name
//!   and protocol, a numeric one only if the workload declares that port and protocol;
//!   unresolved ports are left out for that workload; a headless Service without ports gives
//!   slices without ports; slice ports in the Service's order;
//! - endpoint: the workload's addresses of the family as written, `ready` and `serving` = its
//!   Ready condition, `terminating: false` always (deletion and `publishNotReadyAddresses` are
//!   ignored), `targetRef` {kind ExternalWorkload, namespace, name, uid}, `zone` from the
//!   `topology.kubernetes.io/zone` label, `hostname` = workload name for a headless Service;
//! - it does nothing for a Service without a selector or of type ExternalName (its slices stay);
//! - no `endpoints.kubernetes.io/last-change-trigger-time` annotation.

use std::collections::{BTreeMap, BTreeSet};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Service},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::{apis::meta::v1::OwnerReference, util::intstr::IntOrString},
};
use kube::{ResourceExt, api::ObjectMeta, api::PostParams};
use serde_json::Value;

use super::contender::LINKERD_MANAGED_BY;
use harness::Cluster;

const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const HEADLESS: &str = "service.kubernetes.io/headless";
const ZONE: &str = "topology.kubernetes.io/zone";
const MAX_ENDPOINTS: usize = 100;

/// The slices Linkerd's controller creates for `service` from the `selected` workloads (as the
/// API returned them, uids included), ready to be created.
pub fn slices_for(service: &Service, selected: &[ExternalWorkload]) -> Vec<EndpointSlice> {
    let spec = service.spec.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let mut families: Vec<&str> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|family| match family.as_str() {
            "IPv4" => Some("IPv4"),
            "IPv6" => Some("IPv6"),
            _ => None,
        })
        .collect();
    if families.is_empty() {
        families = vec!["IPv4", "IPv6"];
    }
    let mut slices = Vec::new();
    for family in families {
        // Port list (in the Service's order) → endpoints, groups in order of first appearance.
        let mut groups: Vec<(Vec<EndpointPort>, Vec<Endpoint>)> = Vec::new();
        for workload in selected {
            if workload.spec.workload_ips.is_empty() {
                continue;
            }
            let ports = ports_for(service, workload);
            let endpoint = endpoint_for(workload, family, headless);
            if endpoint.addresses.is_empty() {
                continue;
            }
            match groups
                .iter_mut()
                .find(|(p, _)| port_set(p) == port_set(&ports))
            {
                Some((_, endpoints)) => endpoints.push(endpoint),
                None => groups.push((ports, vec![endpoint])),
            }
        }
        for (ports, endpoints) in groups {
            for chunk in endpoints.chunks(MAX_ENDPOINTS) {
                slices.push(slice(service, family, &ports, chunk.to_vec(), headless));
            }
        }
    }
    slices
}

/// Creates `slices` through the API, as Linkerd's controller would; returns them as stored.
pub async fn create(cluster: &Cluster, slices: &[EndpointSlice]) -> Vec<EndpointSlice> {
    let api = cluster.slices_api();
    let mut created = Vec::new();
    for slice in slices {
        let mut slice = slice.clone();
        slice.metadata.namespace = Some(cluster.namespace.clone());
        created.push(api.create(&PostParams::default(), &slice).await.unwrap());
    }
    created
}

/// `Ok` when Linkerd's controller, reconciling `service` over `slices` (its managed slices as
/// stored), would write nothing: every slice owned by the Service with every label the Service
/// has, and the same endpoints, per family and port set, as [`slices_for`] gives.
pub fn keeps(
    service: &Service,
    selected: &[ExternalWorkload],
    slices: &[EndpointSlice],
) -> Result<(), String> {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    for slice in slices {
        let owned = slice
            .owner_references()
            .iter()
            .any(|owner| owner.uid == uid && owner.kind == "Service" && owner.api_version == "v1");
        if !owned {
            return Err(format!("{} is not owned by the Service", slice.name_any()));
        }
        for (key, value) in service.labels() {
            if ![SERVICE_NAME, MANAGED_BY, HEADLESS].contains(&key.as_str())
                && slice.labels().get(key) != Some(value)
            {
                return Err(format!(
                    "{} lacks the Service label {key}",
                    slice.name_any()
                ));
            }
        }
    }
    let expected = contents(&slices_for(service, selected));
    let actual = contents(slices);
    if expected == actual {
        Ok(())
    } else {
        Err(format!(
            "Linkerd would rewrite {}: it wants {expected:#?}\nthe slices hold {actual:#?}",
            service.name_any()
        ))
    }
}

/// Per (family, port set): the endpoints, as JSON, in a set (slices and order do not matter).
fn contents(slices: &[EndpointSlice]) -> BTreeMap<(String, Vec<String>), BTreeSet<String>> {
    let mut out: BTreeMap<(String, Vec<String>), BTreeSet<String>> = BTreeMap::new();
    for slice in slices {
        let key = (
            slice.address_type.clone(),
            port_set(slice.ports.as_deref().unwrap_or_default()),
        );
        let endpoints = out.entry(key).or_default();
        for endpoint in slice.endpoints.iter().flatten() {
            endpoints.insert(normalized(endpoint));
        }
    }
    out
}

fn normalized(endpoint: &Endpoint) -> String {
    let value: Value = serde_json::to_value(endpoint).unwrap();
    value.to_string()
}

/// A port list as the API stores it (name `""` and protocol `TCP` when absent), sorted.
fn port_set(ports: &[EndpointPort]) -> Vec<String> {
    let mut set: Vec<String> = ports
        .iter()
        .map(|port| {
            format!(
                "{}/{}/{}",
                port.name.as_deref().unwrap_or_default(),
                port.port.unwrap_or_default(),
                port.protocol.as_deref().unwrap_or("TCP")
            )
        })
        .collect();
    set.sort();
    set
}

fn ports_for(service: &Service, workload: &ExternalWorkload) -> Vec<EndpointPort> {
    let spec = service.spec.clone().unwrap_or_default();
    let service_ports = spec.ports.unwrap_or_default();
    let mut ports = Vec::new();
    for service_port in &service_ports {
        let protocol = service_port
            .protocol
            .clone()
            .unwrap_or_else(|| "TCP".into());
        let declared =
            |matches: &dyn Fn(&api::v1beta1::PortSpec) -> bool| {
                workload.spec.ports.iter().find(|port| {
                    matches(port) && port.protocol.as_deref().unwrap_or("TCP") == protocol
                })
            };
        let number = match &service_port.target_port {
            Some(IntOrString::String(name)) => {
                declared(&|port| port.name.as_deref() == Some(name.as_str())).map(|p| p.port)
            }
            Some(IntOrString::Int(number)) => {
                declared(&|port| port.port == *number).map(|p| p.port)
            }
            None => declared(&|port| port.port == service_port.port).map(|p| p.port),
        };
        let Some(number) = number else { continue };
        ports.push(EndpointPort {
            name: service_port.name.clone().filter(|name| !name.is_empty()),
            port: Some(number),
            protocol: Some(protocol),
            app_protocol: None,
        });
    }
    ports
}

fn endpoint_for(workload: &ExternalWorkload, family: &str, headless: bool) -> Endpoint {
    let ready = workload
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|condition| condition.type_ == "Ready" && condition.status == "True");
    let addresses = workload
        .spec
        .workload_ips
        .iter()
        .map(|ip| ip.ip.clone())
        .filter(|ip| (family == "IPv6") == ip.contains(':'))
        .collect();
    Endpoint {
        addresses,
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(ready),
            terminating: Some(false),
        }),
        target_ref: Some(ObjectReference {
            kind: Some("ExternalWorkload".into()),
            namespace: workload.metadata.namespace.clone(),
            name: workload.metadata.name.clone(),
            uid: workload.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        zone: workload.labels().get(ZONE).cloned(),
        hostname: headless.then(|| workload.name_any()),
        ..Endpoint::default()
    }
}

fn slice(
    service: &Service,
    family: &str,
    ports: &[EndpointPort],
    endpoints: Vec<Endpoint>,
    headless: bool,
) -> EndpointSlice {
    let name = service.name_any();
    let mut labels: BTreeMap<String, String> = service
        .labels()
        .iter()
        .filter(|(key, _)| ![SERVICE_NAME, MANAGED_BY, HEADLESS].contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    labels.insert(SERVICE_NAME.into(), name.clone());
    labels.insert(MANAGED_BY.into(), LINKERD_MANAGED_BY.into());
    if headless {
        labels.insert(HEADLESS.into(), String::new());
    }
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("linkerd-external-{name}-")),
            namespace: service.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name,
                uid: service.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        address_type: family.into(),
        endpoints: Some(endpoints),
        ports: Some(ports.to_vec()),
    }
}
