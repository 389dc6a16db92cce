//! An independent reference for what one Service's slices must hold, written from
//! docs/slices.md apart from the `slices` crate (it calls nothing of the planner), so that a
//! planner bug cannot be its own oracle.
//!
//! It judges what the spec fixes and leaves alone what it leaves free:
//!
//! - **Fixed, per endpoint**: which workloads are published in which family, their addresses,
//!   conditions, zone, hint, hostname and target, and the ports of the slice holding each.
//! - **Fixed, per slice**: at most the maximum of endpoints, labels, the controller owner
//!   reference, the name prefix, the identity digest, and placeholders (an empty slice only in
//!   a family with no endpoint, at most one, without ports).
//! - **Across slices**: every endpoint published once, none twice.
//! - **Free**: how endpoints are packed into slices, and how many slices there are. This is not
//!   a second packer: the planner's packing is checked by its own tests and by the simulation's
//!   "no write at rest".
//!
//! Where the spec is silent the reference says what it assumes, next to the rule.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{
    core::v1::Service,
    discovery::v1::{Endpoint, EndpointSlice},
};

const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const HEADLESS: &str = "service.kubernetes.io/headless";
const ZONE: &str = "topology.kubernetes.io/zone";
const DIGEST: &str = "external-endpoints.io/identity-digest";
const TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
const TOPOLOGY_HINTS: &str = "service.kubernetes.io/topology-aware-hints";

/// The settings the spec's rules depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// `--max-endpoints-per-slice`.
    pub max_endpoints_per_slice: usize,
    /// `--managed-by`.
    pub managed_by: String,
    /// `--slice-prefix`.
    pub name_prefix: String,
}

/// The rule a slice set breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// A workload the Service selects is not published in one of its families.
    Missing,
    /// An endpoint is published twice in one family.
    Twice,
    /// An endpoint is published that the Service does not select (or not in that family).
    Unwanted,
    /// An endpoint's addresses, conditions, zone, hint, hostname or target differ.
    Endpoint,
    /// The slice holding an endpoint has other ports than the endpoint resolves.
    Ports,
    /// A slice holds more endpoints than the maximum.
    Maximum,
    /// A slice's labels are not the Service's plus ours.
    Labels,
    /// A slice is not controller-owned by the Service (same uid).
    Owner,
    /// A slice's name does not start with `<prefix><service>-`.
    Name,
    /// A slice of a family the Service does not publish (or of a Service that selects nothing).
    Family,
    /// An empty slice where none may be.
    Placeholder,
    /// A slice's identity digest is not the digest of its endpoints' workloads.
    Digest,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The rule.
    pub rule: Rule,
    /// What breaks it.
    pub detail: String,
}

/// One endpoint as the spec fixes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// `targetRef.uid`.
    pub uid: Option<String>,
    /// The workload's addresses of the family, canonical text. Assumed: their order is free.
    pub addresses: BTreeSet<String>,
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// The zone label.
    pub zone: Option<String>,
    /// The one zone of `hints.forZones`, if hinted.
    pub hint: Option<String>,
    /// The workload's name, for a headless Service when it is a DNS label.
    pub hostname: Option<String>,
    /// The slice ports: (name, number, protocol), sorted; their order in a slice is free.
    pub ports: Vec<(String, i32, String)>,
    /// FNV-1a of `name NUL identity NUL serverName NUL`.
    pub mesh: u64,
}

/// What a Service must publish: per (family, workload name), one endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Publication {
    /// The families the Service publishes (none when it selects nothing).
    pub families: BTreeSet<String>,
    /// The endpoints, by family and workload name.
    pub endpoints: BTreeMap<(String, String), Wanted>,
}

// === impl Rules ===

impl Default for Rules {
    /// The spec's defaults.
    fn default() -> Self {
        Self {
            max_endpoints_per_slice: 100,
            managed_by: "linkerd-external-workloads-controller".to_string(),
            name_prefix: "linkerd-external-".to_string(),
        }
    }
}

// === impl Fault ===

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.rule, self.detail)
    }
}

// === impl Publication ===

impl Publication {
    /// What `service` must publish, from the workloads (of any namespace) that exist.
    pub fn of(service: &Service, workloads: &[&ExternalWorkload]) -> Self {
        let spec = service.spec.clone().unwrap_or_default();
        let namespace = service.metadata.namespace.clone().unwrap_or_default();
        // Selection: a selector with at least one label, not ExternalName.
        let selector = spec.selector.clone().unwrap_or_default();
        if selector.is_empty() || spec.type_.as_deref() == Some("ExternalName") {
            return Self::default();
        }
        // Families: those listed (known ones); none listed means both.
        let mut families: BTreeSet<String> = spec
            .ip_families
            .iter()
            .flatten()
            .filter(|family| *family == "IPv4" || *family == "IPv6")
            .cloned()
            .collect();
        if families.is_empty() {
            families = ["IPv4".to_string(), "IPv6".to_string()].into();
        }
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
        let hints = asks_for_hints(service);
        let mut endpoints = BTreeMap::new();
        for workload in workloads {
            let labels = workload.metadata.labels.clone().unwrap_or_default();
            let selected = workload.metadata.namespace.as_deref() == Some(namespace.as_str())
                && selector
                    .iter()
                    .all(|(key, value)| labels.get(key) == Some(value));
            if !selected {
                continue;
            }
            let name = workload.metadata.name.clone().unwrap_or_default();
            let serving = workload.status.as_ref().is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|condition| condition.type_ == "Ready" && condition.status == "True")
            });
            let terminating = workload.metadata.deletion_timestamp.is_some();
            let ready = publish_not_ready || (serving && !terminating);
            let zone = labels.get(ZONE).cloned();
            let mesh = &workload.spec.mesh_tls;
            for family in &families {
                let addresses: BTreeSet<String> = workload
                    .spec
                    .workload_ips
                    .iter()
                    .filter_map(|entry| entry.ip.parse::<IpAddr>().ok())
                    .filter(|ip| (family == "IPv4") == ip.is_ipv4())
                    .map(|ip| ip.to_string())
                    .collect();
                if addresses.is_empty() {
                    continue;
                }
                let wanted = Wanted {
                    uid: workload.metadata.uid.clone(),
                    addresses,
                    ready,
                    serving,
                    terminating,
                    hint: zone.clone().filter(|_| hints && ready),
                    zone: zone.clone(),
                    hostname: Some(name.clone()).filter(|name| headless && is_dns_label(name)),
                    ports: ports(&spec, workload),
                    mesh: fnv1a(
                        [&name, &mesh.identity, &mesh.server_name]
                            .iter()
                            .flat_map(|text| text.bytes().chain([0])),
                    ),
                };
                endpoints.insert((family.clone(), name.clone()), wanted);
            }
        }
        Self {
            families,
            endpoints,
        }
    }
}

/// Every rule `slices` (any slices of the cluster; the Service's own are picked out here)
/// breaks for `service`, given the workloads that exist. Empty when they hold what the spec
/// asks.
pub fn judge(
    service: &Service,
    workloads: &[&ExternalWorkload],
    slices: &[&EndpointSlice],
    rules: &Rules,
) -> Vec<Fault> {
    let publication = Publication::of(service, workloads);
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    let name = service.metadata.name.clone().unwrap_or_default();
    let labels = slice_labels(service, rules);
    let mut faults = Vec::new();
    let mut fault = |rule: Rule, detail: String| faults.push(Fault { rule, detail });
    // Where each (family, workload) is published, and the empty slices of each family.
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut empty: BTreeMap<String, u32> = BTreeMap::new();
    let ours = slices.iter().filter(|slice| {
        let slice_labels = slice.metadata.labels.clone().unwrap_or_default();
        slice.metadata.namespace.as_deref() == Some(namespace.as_str())
            && slice_labels.get(MANAGED_BY) == Some(&rules.managed_by)
            && slice_labels.get(SERVICE_NAME) == Some(&name)
    });
    for slice in ours {
        let slice_name = slice.metadata.name.clone().unwrap_or_default();
        let family = slice.address_type.clone();
        if slice.metadata.labels.as_ref() != Some(&labels) {
            fault(
                Rule::Labels,
                format!("{slice_name}: {:?}, want {labels:?}", slice.metadata.labels),
            );
        }
        let owned = slice
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|owner| {
                owner.api_version == "v1"
                    && owner.kind == "Service"
                    && owner.name == name
                    && Some(&owner.uid) == service.metadata.uid.as_ref()
                    && owner.controller == Some(true)
            });
        if !owned {
            fault(
                Rule::Owner,
                format!("{slice_name}: not owned by the Service"),
            );
        }
        if !slice_name.starts_with(&format!("{}{name}-", rules.name_prefix)) {
            fault(Rule::Name, slice_name.clone());
        }
        if !publication.families.contains(&family) {
            fault(Rule::Family, format!("{slice_name}: {family}"));
            continue;
        }
        let endpoints = slice.endpoints.as_deref().unwrap_or_default();
        if endpoints.len() > rules.max_endpoints_per_slice {
            fault(
                Rule::Maximum,
                format!("{slice_name}: {} endpoints", endpoints.len()),
            );
        }
        let slice_ports = sorted_ports(slice);
        if endpoints.is_empty() {
            let count = empty.entry(family.clone()).or_default();
            *count += 1;
            let others = publication.endpoints.keys().any(|(f, _)| *f == family);
            if others || *count > 1 || !slice_ports.is_empty() {
                fault(
                    Rule::Placeholder,
                    format!(
                        "{slice_name}: empty (endpoints in {family}: {others}, ports {slice_ports:?})"
                    ),
                );
            }
        }
        let mut digests = BTreeMap::new();
        for endpoint in endpoints {
            let workload = endpoint
                .target_ref
                .as_ref()
                .and_then(|target| target.name.clone())
                .unwrap_or_default();
            let key = (family.clone(), workload.clone());
            if let Some(first) = seen.insert(key.clone(), slice_name.clone()) {
                fault(
                    Rule::Twice,
                    format!("{workload} ({family}) in {first} and {slice_name}"),
                );
            }
            let Some(wanted) = publication.endpoints.get(&key) else {
                fault(
                    Rule::Unwanted,
                    format!("{workload} ({family}) in {slice_name}"),
                );
                continue;
            };
            digests.insert(workload.clone(), wanted.mesh);
            if let Some(difference) = differs(endpoint, wanted, &namespace) {
                fault(
                    Rule::Endpoint,
                    format!("{workload} in {slice_name}: {difference}"),
                );
            }
            if slice_ports != wanted.ports {
                fault(
                    Rule::Ports,
                    format!(
                        "{workload} in {slice_name}: {slice_ports:?}, want {:?}",
                        wanted.ports
                    ),
                );
            }
        }
        // The digest is defined over published endpoints; an unwanted one is its own fault.
        if digests.len() == endpoints.len() {
            let want = format!(
                "{:016x}",
                fnv1a(digests.values().flat_map(|mesh| mesh.to_le_bytes()))
            );
            let found = slice
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(DIGEST));
            if found != Some(&want) {
                fault(
                    Rule::Digest,
                    format!("{slice_name}: {found:?}, want {want}"),
                );
            }
        }
    }
    for (family, workload) in publication.endpoints.keys() {
        if !seen.contains_key(&(family.clone(), workload.clone())) {
            fault(Rule::Missing, format!("{workload} ({family})"));
        }
    }
    faults
}

/// Whether the topology hints are asked for: `trafficDistribution` is one of the three values
/// that write them, and the older annotation does not ask for `Auto`. Of the two annotations,
/// the first present counts (upstream's `hintsEnabled`; the spec does not say).
fn asks_for_hints(service: &Service) -> bool {
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    let auto = [TOPOLOGY_MODE, TOPOLOGY_HINTS]
        .iter()
        .find_map(|key| annotations.get(*key))
        .is_some_and(|mode| mode == "Auto" || mode == "auto");
    let value = service
        .spec
        .as_ref()
        .and_then(|spec| spec.traffic_distribution.as_deref());
    !auto
        && matches!(
            value,
            Some("PreferSameZone" | "PreferClose" | "PreferSameNode")
        )
}

/// The slice ports of a workload: each Service port resolved, those that do not resolve left
/// out. A missing targetPort means the Service port's number (the API's default).
fn ports(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    workload: &ExternalWorkload,
) -> Vec<(String, i32, String)> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let mut resolved = Vec::new();
    for port in spec.ports.iter().flatten() {
        let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".to_string());
        let number = match &port.target_port {
            None => Some(port.port),
            Some(IntOrString::Int(number)) => Some(*number),
            Some(IntOrString::String(target)) => workload
                .spec
                .ports
                .iter()
                .find(|declared| {
                    declared.name.as_deref() == Some(target.as_str())
                        && declared.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|declared| declared.port)
                .filter(|number| (1..=65535).contains(number)),
        };
        if let Some(number) = number {
            resolved.push((port.name.clone().unwrap_or_default(), number, protocol));
        }
    }
    resolved.sort();
    resolved
}

/// A slice's ports as (name, number, protocol), sorted; an absent name is the empty name and an
/// absent protocol TCP, as the API reads them.
fn sorted_ports(slice: &EndpointSlice) -> Vec<(String, i32, String)> {
    let mut ports: Vec<_> = slice
        .ports
        .iter()
        .flatten()
        .map(|port| {
            (
                port.name.clone().unwrap_or_default(),
                port.port.unwrap_or_default(),
                port.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
            )
        })
        .collect();
    ports.sort();
    ports
}

/// The labels of the Service's slices: its own, but for the three reserved ones, and ours.
fn slice_labels(service: &Service, rules: &Rules) -> BTreeMap<String, String> {
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    for reserved in [SERVICE_NAME, MANAGED_BY, HEADLESS] {
        labels.remove(reserved);
    }
    let name = service.metadata.name.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME.to_string(), name);
    labels.insert(MANAGED_BY.to_string(), rules.managed_by.clone());
    let headless = service
        .spec
        .as_ref()
        .and_then(|spec| spec.cluster_ip.as_deref())
        == Some("None");
    if headless {
        labels.insert(HEADLESS.to_string(), String::new());
    }
    labels
}

/// What differs between a published endpoint and the wanted one, if anything.
fn differs(endpoint: &Endpoint, wanted: &Wanted, namespace: &str) -> Option<String> {
    let addresses: BTreeSet<String> = endpoint.addresses.iter().cloned().collect();
    if addresses != wanted.addresses || addresses.len() != endpoint.addresses.len() {
        return Some(format!(
            "addresses {:?}, want {:?}",
            endpoint.addresses, wanted.addresses
        ));
    }
    let conditions = endpoint.conditions.clone().unwrap_or_default();
    let found = (conditions.ready, conditions.serving, conditions.terminating);
    let want = (
        Some(wanted.ready),
        Some(wanted.serving),
        Some(wanted.terminating),
    );
    if found != want {
        return Some(format!(
            "conditions (ready, serving, terminating) {found:?}, want {want:?}"
        ));
    }
    if endpoint.zone != wanted.zone {
        return Some(format!("zone {:?}, want {:?}", endpoint.zone, wanted.zone));
    }
    let hint = endpoint.hints.as_ref().map(|hints| {
        let zones: Vec<String> = hints
            .for_zones
            .iter()
            .flatten()
            .map(|zone| zone.name.clone())
            .collect();
        (zones, hints.for_nodes.clone().unwrap_or_default().len())
    });
    let want_hint = wanted.hint.clone().map(|zone| (vec![zone], 0));
    if hint != want_hint {
        return Some(format!(
            "hints {:?}, want {:?}",
            endpoint.hints, wanted.hint
        ));
    }
    if endpoint.hostname != wanted.hostname {
        return Some(format!(
            "hostname {:?}, want {:?}",
            endpoint.hostname, wanted.hostname
        ));
    }
    if endpoint.node_name.is_some() {
        return Some(format!("nodeName {:?}", endpoint.node_name));
    }
    let target = endpoint.target_ref.clone().unwrap_or_default();
    if target.kind.as_deref() != Some("ExternalWorkload")
        || target.namespace.as_deref() != Some(namespace)
        || target.uid != wanted.uid
    {
        return Some(format!(
            "targetRef {:?}/{:?}/{:?}, want ExternalWorkload/{namespace}/{:?}",
            target.kind, target.namespace, target.uid, wanted.uid
        ));
    }
    None
}

/// An RFC 1123 label: 1 to 63 of `[a-z0-9-]`, starting and ending alphanumeric.
fn is_dns_label(name: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&name.len())
        && name.chars().all(|c| alphanumeric(c) || c == '-')
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric)
}

/// 64-bit FNV-1a (the identity digest's hash, fixed by its definition).
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
