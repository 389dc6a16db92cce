//! What the slices of one Service should hold: endpoints grouped by family and port list.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::{ObjectReference, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::labels::{is_headless, selects};
use crate::{Diagnostic, Problem};

/// An address family; slices hold one family each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Family {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

/// One slice port in comparable form: (name, number, protocol).
pub(crate) type PortKey = (String, i32, String);

/// Slices are grouped by family and resolved port list (sorted).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct GroupKey {
    pub(crate) family: Family,
    pub(crate) ports: Vec<PortKey>,
}

/// Desired endpoints of one group, by workload name.
pub(crate) type GroupEndpoints = BTreeMap<String, Endpoint>;

/// Everything the Service's slices should hold, plus what had to be left out.
#[derive(Debug, Default)]
pub(crate) struct Desired {
    pub(crate) families: BTreeSet<Family>,
    pub(crate) groups: BTreeMap<GroupKey, GroupEndpoints>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// The kind written in endpoint target references.
pub(crate) const WORKLOAD_KIND: &str = "ExternalWorkload";

// === impl Family ===

impl Family {
    /// The EndpointSlice `addressType` / Service `ipFamilies` spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Parses an `addressType` / `ipFamilies` entry.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// Slice port list in comparable form, as found on a slice.
pub(crate) fn port_keys(ports: Option<&Vec<EndpointPort>>) -> Vec<PortKey> {
    let mut keys: Vec<PortKey> = ports
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
            )
        })
        .collect();
    keys.sort();
    keys
}

/// The slice ports of a group.
pub(crate) fn endpoint_ports(keys: &[PortKey]) -> Vec<EndpointPort> {
    keys.iter()
        .map(|(name, port, protocol)| EndpointPort {
            name: Some(name.clone()),
            port: Some(*port),
            protocol: Some(protocol.clone()),
            app_protocol: None,
        })
        .collect()
}

/// Families the Service asks for; none listed means both.
pub(crate) fn service_families(service: &Service) -> BTreeSet<Family> {
    let listed: BTreeSet<Family> = service
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| Family::parse(f))
        .collect();
    if listed.is_empty() {
        [Family::V4, Family::V6].into()
    } else {
        listed
    }
}

/// Computes the desired endpoints of `service` from the workloads it selects.
pub(crate) fn desired(service: &Service, workloads: &[&ExternalWorkload]) -> Desired {
    let families = service_families(service);
    let headless = is_headless(service);
    let publish_not_ready = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let service_ports: &[ServicePort] = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();

    // Sorted by name so output and diagnostics never depend on input order.
    let mut selected: Vec<&ExternalWorkload> = workloads
        .iter()
        .copied()
        .filter(|w| selects(service, w))
        .collect();
    selected.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut out = Desired {
        families: families.clone(),
        ..Desired::default()
    };
    for workload in selected {
        let name = workload.metadata.name.clone().unwrap_or_default();
        let mut problems = Vec::new();
        let addresses = addresses_by_family(workload, &mut problems);
        if addresses.is_empty() {
            report(&mut out.diagnostics, &name, problems);
            continue;
        }
        let ports = resolve_ports(service_ports, workload, &mut problems);
        let hostname = if headless {
            if is_dns_label(&name) {
                Some(name.clone())
            } else {
                problems.push(Problem::InvalidHostname {
                    value: name.clone(),
                });
                None
            }
        } else {
            None
        };
        for (family, addresses) in addresses {
            if !families.contains(&family) {
                continue;
            }
            let endpoint = endpoint(workload, addresses, hostname.clone(), publish_not_ready);
            out.groups
                .entry(GroupKey {
                    family,
                    ports: ports.clone(),
                })
                .or_default()
                .insert(name.clone(), endpoint);
        }
        report(&mut out.diagnostics, &name, problems);
    }
    out
}

fn report(diagnostics: &mut Vec<Diagnostic>, workload: &str, problems: Vec<Problem>) {
    diagnostics.extend(problems.into_iter().map(|problem| Diagnostic {
        workload: workload.to_owned(),
        problem,
    }));
}

/// The workload's addresses in canonical text, by family; non-IPs are reported and skipped.
fn addresses_by_family(
    workload: &ExternalWorkload,
    problems: &mut Vec<Problem>,
) -> BTreeMap<Family, Vec<String>> {
    let mut by_family: BTreeMap<Family, Vec<String>> = BTreeMap::new();
    for entry in &workload.spec.workload_ips {
        match entry.ip.parse::<IpAddr>() {
            Ok(ip) => {
                let list = by_family.entry(Family::of(&ip)).or_default();
                let text = ip.to_string();
                if !list.contains(&text) {
                    list.push(text);
                }
            }
            Err(_) => problems.push(Problem::InvalidIp {
                value: entry.ip.clone(),
            }),
        }
    }
    by_family
}

/// Resolves each Service port for this workload (sorted); unresolvable ones are reported.
fn resolve_ports(
    service_ports: &[ServicePort],
    workload: &ExternalWorkload,
    problems: &mut Vec<Problem>,
) -> Vec<PortKey> {
    let mut resolved = Vec::with_capacity(service_ports.len());
    for service_port in service_ports {
        let protocol = service_port.protocol.as_deref().unwrap_or("TCP");
        let number = match &service_port.target_port {
            None => service_port.port,
            Some(IntOrString::Int(number)) => *number,
            Some(IntOrString::String(port_name)) => {
                let found = workload.spec.ports.iter().find(|p| {
                    p.name.as_deref() == Some(port_name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                });
                match found {
                    Some(p) if (1..=65535).contains(&p.port) => p.port,
                    Some(p) => {
                        problems.push(Problem::InvalidPort {
                            port_name: port_name.clone(),
                            value: p.port,
                        });
                        continue;
                    }
                    None => {
                        problems.push(Problem::UnresolvedPort {
                            port_name: port_name.clone(),
                            protocol: protocol.to_owned(),
                        });
                        continue;
                    }
                }
            }
        };
        resolved.push((
            service_port.name.clone().unwrap_or_default(),
            number,
            protocol.to_owned(),
        ));
    }
    resolved.sort();
    resolved
}

fn endpoint(
    workload: &ExternalWorkload,
    addresses: Vec<String>,
    hostname: Option<String>,
    publish_not_ready: bool,
) -> Endpoint {
    let serving = workload.is_ready();
    let terminating = workload.metadata.deletion_timestamp.is_some();
    Endpoint {
        addresses,
        conditions: Some(EndpointConditions {
            ready: Some(publish_not_ready || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        target_ref: Some(ObjectReference {
            kind: Some(WORKLOAD_KIND.to_owned()),
            namespace: workload.metadata.namespace.clone(),
            name: workload.metadata.name.clone(),
            uid: workload.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        zone: workload.zone().map(str::to_owned),
        ..Endpoint::default()
    }
}

/// RFC 1123 label: what an endpoint hostname must be.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}
