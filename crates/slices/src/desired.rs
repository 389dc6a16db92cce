//! What the slices of one Service should hold: endpoints grouped by family and port list.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

use crate::labels::selects;
use crate::model::{
    CachedEndpoint, CachedService, CachedServicePort, CachedSlicePort, CachedWorkload, Conditions,
    Families, SliceAddress, TargetPort, WorkloadAddress, zone_hints,
};
use crate::text::{Token, ip_text};
use crate::{Diagnostic, Problem};

/// An address family; slices hold one family each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

/// One slice port in comparable form. Ordered by name, then number, then protocol: a group's
/// port list is sorted, so two slices with the same ports in another order are one group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PortKey {
    pub(crate) name: String,
    pub(crate) port: i32,
    pub(crate) protocol: String,
}

/// Slices are grouped by family and resolved port list (sorted).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct GroupKey {
    pub(crate) family: Family,
    pub(crate) ports: Vec<PortKey>,
}

/// Everything the Service's slices should hold, plus what had to be left out.
///
/// Endpoints are kept as [`Wanted`] views borrowing from the workloads: a no-op pass compares
/// them with the cached endpoints and allocates nothing per endpoint (docs/benchmarks-journal.md,
/// 2026-12-02, "what made it fast").
#[derive(Debug)]
pub(crate) struct Desired<'a> {
    pub(crate) families: Families,
    /// Per group, sorted by workload name (one endpoint per workload).
    pub(crate) groups: BTreeMap<GroupKey, Vec<Wanted<'a>>>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// One desired endpoint, borrowed from its workload; [`Wanted::to_endpoint`] makes it a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wanted<'a> {
    pub(crate) name: &'a str,
    namespace: Option<&'a str>,
    uid: Option<&'a Token>,
    addresses: Addresses,
    zone: Option<&'a str>,
    /// Hinted for its own zone (`hints.forZones: [zone]`).
    zone_hint: bool,
    hostname: Option<&'a str>,
    ready: bool,
    serving: bool,
    terminating: bool,
    /// What a consumer copies from the workload besides the endpoint, hashed (the slice's
    /// identity digest).
    mesh_digest: u64,
}

/// A workload's addresses of one family, in order, without duplicates. The first is held
/// inline: nearly every workload has one address per family, and a no-op pass over a thousand
/// workloads should not allocate a thousand vectors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Addresses {
    first: Option<IpAddr>,
    rest: Vec<IpAddr>,
}

/// A resolved port borrowing the Service port's name and protocol; becomes a [`PortKey`] once
/// per group. Same field order (and so the same sort) as [`PortKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PortRef<'a> {
    name: &'a str,
    port: i32,
    protocol: &'a str,
}

/// The kind written in endpoint target references.
pub(crate) const WORKLOAD_KIND: &str = "ExternalWorkload";

// === impl Family ===

impl Family {
    /// The EndpointSlice `addressType` / Service `ipFamilies` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Parses an `addressType` / `ipFamilies` entry.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }
}

/// Slice port list in comparable form, as found on a slice.
pub(crate) fn port_keys(ports: &[CachedSlicePort]) -> Vec<PortKey> {
    let mut keys: Vec<PortKey> = ports
        .iter()
        .map(|p| PortKey {
            name: p.name.as_deref().unwrap_or_default().to_owned(),
            port: p.port.unwrap_or_default(),
            protocol: p.protocol.as_deref().unwrap_or("TCP").to_owned(),
        })
        .collect();
    keys.sort();
    keys
}

/// The slice ports of a group.
pub(crate) fn endpoint_ports(keys: &[PortKey]) -> Vec<EndpointPort> {
    keys.iter()
        .map(|key| EndpointPort {
            name: Some(key.name.clone()),
            port: Some(key.port),
            protocol: Some(key.protocol.clone()),
            app_protocol: None,
        })
        .collect()
}

/// Computes the desired endpoints of `service` from the workloads it selects.
pub(crate) fn desired<'a>(
    service: &'a CachedService,
    workloads: &[&'a CachedWorkload],
) -> Desired<'a> {
    let families = service.families;
    let headless = service.headless;
    let publish_not_ready = service.publish_not_ready;
    let zone_hints = service.traffic_distribution.zone_hints();
    let service_ports: &[CachedServicePort] = &service.ports;

    // Sorted by name so output and diagnostics never depend on input order. The sort compares
    // a 16-byte prefix as an integer first: names rarely share one, and a thousand string
    // compares through memcmp were most of a no-op pass (docs/benchmarks-journal.md, 2026-12-02,
    // "what made it fast").
    let mut selected: Vec<(u128, &str, &CachedWorkload)> = workloads
        .iter()
        .copied()
        .filter(|w| selects(service, w))
        .map(|w| (name_prefix(&w.name), &*w.name, w))
        .collect();
    selected.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));

    // Distinct resolved port lists (few per Service), and endpoints per (family, list).
    let mut port_lists: Vec<Vec<PortRef<'a>>> = Vec::new();
    let mut buckets: BTreeMap<(Family, usize), Vec<Wanted<'a>>> = BTreeMap::new();
    let mut diagnostics = Vec::new();
    let mut ports = Vec::with_capacity(service_ports.len());
    for (_, name, workload) in selected {
        let mut problems = Vec::new();
        let addresses = addresses_by_family(workload, &mut problems);
        if addresses.iter().all(|(_, a)| a.is_empty()) {
            report(&mut diagnostics, name, problems);
            continue;
        }
        ports.clear();
        resolve_ports(service_ports, workload, &mut ports, &mut problems);
        let list = match port_lists.iter().position(|l| *l == ports) {
            Some(index) => index,
            None => {
                port_lists.push(ports.clone());
                port_lists.len() - 1
            }
        };
        let hostname = if !headless {
            None
        } else if is_dns_label(name) {
            Some(name)
        } else {
            problems.push(Problem::InvalidHostname {
                value: name.to_owned(),
            });
            None
        };
        for (family, addresses) in addresses {
            if addresses.is_empty() || !families.contains(family) {
                continue;
            }
            let wanted = wanted(workload, addresses, hostname, publish_not_ready, zone_hints);
            buckets.entry((family, list)).or_default().push(wanted);
        }
        report(&mut diagnostics, name, problems);
    }

    let mut groups = BTreeMap::new();
    for ((family, list), endpoints) in buckets {
        let ports = port_lists[list]
            .iter()
            .map(|port| PortKey {
                name: port.name.to_owned(),
                port: port.port,
                protocol: port.protocol.to_owned(),
            })
            .collect();
        groups.insert(GroupKey { family, ports }, endpoints);
    }
    Desired {
        families,
        groups,
        diagnostics,
    }
}

/// The first 16 bytes of `name` as a big-endian integer (zero-padded): ordering by it and then
/// by the whole name is exactly ordering by name, since names hold no NUL byte.
fn name_prefix(name: &str) -> u128 {
    let mut prefix = [0u8; 16];
    let bytes = name.as_bytes();
    let len = bytes.len().min(16);
    prefix[..len].copy_from_slice(&bytes[..len]);
    u128::from_be_bytes(prefix)
}

fn report(diagnostics: &mut Vec<Diagnostic>, workload: &str, problems: Vec<Problem>) {
    diagnostics.extend(problems.into_iter().map(|problem| Diagnostic {
        workload: workload.to_owned(),
        problem,
    }));
}

/// The workload's addresses in canonical text, by family (IPv4 then IPv6); non-IPs are
/// reported and skipped.
fn addresses_by_family(
    workload: &CachedWorkload,
    problems: &mut Vec<Problem>,
) -> [(Family, Addresses); 2] {
    let mut v4 = Addresses::default();
    let mut v6 = Addresses::default();
    for address in &workload.addresses {
        match address {
            WorkloadAddress::Ip(ip @ IpAddr::V4(_)) => v4.push_unique(*ip),
            WorkloadAddress::Ip(ip @ IpAddr::V6(_)) => v6.push_unique(*ip),
            WorkloadAddress::Invalid(text) => problems.push(Problem::InvalidIp {
                value: text.to_string(),
            }),
        }
    }
    [(Family::V4, v4), (Family::V6, v6)]
}

/// Resolves each Service port for this workload into `resolved` (sorted); unresolvable ones
/// are reported.
fn resolve_ports<'a>(
    service_ports: &'a [CachedServicePort],
    workload: &CachedWorkload,
    resolved: &mut Vec<PortRef<'a>>,
    problems: &mut Vec<Problem>,
) {
    for service_port in service_ports {
        let protocol = service_port.protocol.as_deref().unwrap_or("TCP");
        let number = match &service_port.target {
            TargetPort::Same => service_port.port,
            TargetPort::Number(number) => *number,
            TargetPort::Name(port_name) => {
                let found = workload.ports.iter().find(|p| {
                    p.name.as_deref() == Some(&**port_name)
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                });
                match found {
                    Some(p) if (1..=65535).contains(&p.port) => p.port,
                    Some(p) => {
                        problems.push(Problem::InvalidPort {
                            port_name: port_name.to_string(),
                            value: p.port,
                        });
                        continue;
                    }
                    None => {
                        problems.push(Problem::UnresolvedPort {
                            port_name: port_name.to_string(),
                            protocol: protocol.to_owned(),
                        });
                        continue;
                    }
                }
            }
        };
        resolved.push(PortRef {
            name: service_port.name.as_deref().unwrap_or_default(),
            port: number,
            protocol,
        });
    }
    resolved.sort_unstable();
}

fn wanted<'a>(
    workload: &'a CachedWorkload,
    addresses: Addresses,
    hostname: Option<&'a str>,
    publish_not_ready: bool,
    zone_hints: bool,
) -> Wanted<'a> {
    let serving = workload.ready;
    let terminating = workload.deleting;
    let ready = publish_not_ready || (serving && !terminating);
    let zone = workload.zone();
    Wanted {
        name: &workload.name,
        namespace: Some(&*workload.namespace).filter(|n| !n.is_empty()),
        uid: workload.uid.as_ref(),
        addresses,
        zone,
        // Upstream's rule (k8s.io/endpointslice, trafficdist): only ready endpoints are
        // hinted, each for its own zone; an endpoint without a zone gets no hint.
        zone_hint: zone_hints && ready && zone.is_some(),
        hostname,
        ready,
        serving,
        terminating,
        mesh_digest: workload.mesh_digest(),
    }
}

// === impl Addresses ===

impl Addresses {
    fn push_unique(&mut self, address: IpAddr) {
        if self.iter().any(|a| *a == address) {
            return;
        }
        match self.first {
            None => self.first = Some(address),
            Some(_) => self.rest.push(address),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &IpAddr> {
        self.first.iter().chain(&self.rest)
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

// === impl Wanted ===

impl Wanted<'_> {
    /// The endpoint as written to the API.
    pub(crate) fn to_endpoint(&self) -> Endpoint {
        Endpoint {
            addresses: self.addresses.iter().map(ip_text).collect(),
            conditions: Some(self.conditions()),
            hostname: self.hostname.map(str::to_owned),
            target_ref: Some(ObjectReference {
                kind: Some(WORKLOAD_KIND.to_owned()),
                namespace: self.namespace.map(str::to_owned),
                name: Some(self.name.to_owned()),
                uid: self.uid.map(Token::text),
                ..ObjectReference::default()
            }),
            zone: self.zone.map(str::to_owned),
            hints: self.zone.filter(|_| self.zone_hint).map(zone_hints),
            ..Endpoint::default()
        }
    }

    /// Whether `endpoint` equals [`Wanted::to_endpoint`], checked without building it.
    ///
    /// The caller found `endpoint` by `pack::endpoint_key`, which already checked the target's
    /// kind and namespace (the Service's, which is this workload's); they are not compared again.
    pub(crate) fn matches(&self, endpoint: &CachedEndpoint) -> bool {
        let Some(target) = endpoint.target.as_ref() else {
            return false;
        };
        let conditions = Conditions {
            ready: Some(self.ready),
            serving: Some(self.serving),
            terminating: Some(self.terminating),
        };
        !endpoint.foreign
            && endpoint.addresses.len() == self.addresses.len()
            && endpoint
                .addresses
                .iter()
                .zip(self.addresses.iter())
                .all(|(a, b)| *a == SliceAddress::Ip(*b))
            && endpoint.conditions == Some(conditions)
            && endpoint.hostname.as_deref() == self.hostname
            && endpoint.zone.as_deref() == self.zone
            && endpoint.zone_hint == self.zone_hint
            && target.name.as_deref() == Some(self.name)
            && target.uid.as_ref() == self.uid
    }

    /// What a consumer copies from this endpoint's workload at slice time, hashed.
    pub(crate) fn mesh_digest(&self) -> u64 {
        self.mesh_digest
    }

    fn conditions(&self) -> EndpointConditions {
        EndpointConditions {
            ready: Some(self.ready),
            serving: Some(self.serving),
            terminating: Some(self.terminating),
        }
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
