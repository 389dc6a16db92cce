//! What the controller caches of each kind: the fields the planner, the event mapping and the
//! writer read, and nothing else (docs/benchmarks.md, scale and memory).
//!
//! Each is made once per watch event from the API object ([`CachedWorkload::new`] and so on,
//! with an [`Intern`] so that names and labels repeated across objects share one allocation).
//! Addresses are parsed once, readiness and conditions are flags, label maps are sorted arrays.

use std::net::IpAddr;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::desired::Family;
use crate::digest::workload_digest;
use crate::text::{Intern, Labels, NoIntern, Text, Token};

/// A Service as the planner reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedService {
    /// Name.
    pub name: Text,
    /// Namespace.
    pub namespace: Text,
    /// Uid (our slices' owner reference points at it).
    pub uid: Option<Token>,
    /// resourceVersion (a re-list skips unchanged objects by it).
    pub resource_version: Option<Token>,
    /// The Service's own labels (copied onto its slices).
    pub labels: Labels,
    /// deletionTimestamp is set.
    pub deleting: bool,
    /// The selector, when the Service gets slices from us: `None` for ExternalName Services and
    /// for a missing or empty selector (see `labels::active_selector`).
    pub selector: Option<Labels>,
    /// clusterIP `None`.
    pub headless: bool,
    /// `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// The Service ports.
    pub ports: Box<[CachedServicePort]>,
    /// Families the slices may have (`ipFamilies`; none listed means both).
    pub families: Families,
    /// `trafficDistribution`, as it decides endpoint hints (docs/slices.md, "Topology hints").
    pub traffic_distribution: TrafficDistribution,
}

/// A Service's `spec.trafficDistribution`, as far as it decides the hints of its endpoints
/// (docs/slices.md, "Topology hints"). One byte in the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    /// No preference: the field is unset, holds a value this controller does not know, or the
    /// Service asks for the older topology-aware routing by annotation, which takes precedence
    /// upstream. Endpoints carry no hints.
    #[default]
    Any,
    /// `PreferSameZone`, or `PreferClose` (its deprecated name, which means the same): a ready
    /// endpoint with a zone is hinted for that zone.
    PreferSameZone,
    /// `PreferSameNode`: hints for the endpoint's node and zone; external workloads run on no
    /// node, so only the zone hint is written.
    PreferSameNode,
}

/// A Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedServicePort {
    /// Port name (`None` for unnamed).
    pub name: Option<Text>,
    /// Port number.
    pub port: i32,
    /// Protocol (`None` reads as TCP).
    pub protocol: Option<Text>,
    /// targetPort.
    pub target: TargetPort,
}

/// A Service port's targetPort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    /// Not set: the Service port's own number.
    Same,
    /// A number.
    Number(i32),
    /// A name, resolved against each workload's ports.
    Name(Text),
}

/// A set of address families (two bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Families {
    v4: bool,
    v6: bool,
}

/// An ExternalWorkload as the planner and the event mapping read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedWorkload {
    /// Name.
    pub name: Text,
    /// Namespace.
    pub namespace: Text,
    /// Uid (written in endpoint target references).
    pub uid: Option<Token>,
    /// resourceVersion.
    pub resource_version: Option<Token>,
    /// Labels (selection and zone).
    pub labels: Labels,
    /// `spec.workloadIPs`, parsed, in order.
    pub addresses: Box<[WorkloadAddress]>,
    /// `spec.ports`.
    pub ports: Box<[CachedWorkloadPort]>,
    /// The Ready condition is `True`.
    pub ready: bool,
    /// deletionTimestamp is set.
    pub deleting: bool,
    /// `spec.meshTLS.identity`: a consumer (Linkerd's destination service) copies it when it reads
    /// a slice holding this workload, so the slice's identity digest covers it (issue 37).
    pub identity: Text,
    /// `spec.meshTLS.serverName`, copied and covered like [`CachedWorkload::identity`].
    pub server_name: Text,
    /// Name, identity and server name hashed once, for the slices' identity digest (set by
    /// [`CachedWorkload::new`]).
    mesh_digest: u64,
}

/// One `workloadIPs[].ip`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadAddress {
    /// An IP address.
    Ip(IpAddr),
    /// Text that is not an IP address (reported, never published).
    Invalid(Box<str>),
}

/// A workload port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedWorkloadPort {
    /// Number (kept wide: a bad value is reported by the planner).
    pub port: i32,
    /// IANA name.
    pub name: Option<Text>,
    /// Protocol (`None` reads as TCP).
    pub protocol: Option<Text>,
}

/// A managed EndpointSlice as the planner compares it and the writer rewrites it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedSlice {
    /// Name.
    pub name: Text,
    /// Namespace.
    pub namespace: Text,
    /// Uid.
    pub uid: Option<Token>,
    /// resourceVersion (an update is guarded by it).
    pub resource_version: Option<Token>,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// Labels.
    pub labels: Labels,
    /// Annotations (an update carries them over).
    pub annotations: Labels,
    /// Owner references (an update carries them over).
    pub owner_references: Box<[CachedOwner]>,
    /// Finalizers (an update carries them over).
    pub finalizers: Box<[Box<str>]>,
    /// `addressType`.
    pub address_type: Text,
    /// Ports.
    pub ports: Box<[CachedSlicePort]>,
    /// Endpoints, in slice order.
    pub endpoints: Box<[CachedEndpoint]>,
}

/// An owner reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedOwner {
    /// apiVersion.
    pub api_version: Text,
    /// kind.
    pub kind: Text,
    /// name.
    pub name: Text,
    /// uid.
    pub uid: Token,
    /// controller.
    pub controller: Option<bool>,
    /// blockOwnerDeletion.
    pub block_owner_deletion: Option<bool>,
}

/// A slice port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedSlicePort {
    /// name.
    pub name: Option<Text>,
    /// port.
    pub port: Option<i32>,
    /// protocol.
    pub protocol: Option<Text>,
    /// appProtocol.
    pub app_protocol: Option<Text>,
}

/// A slice endpoint, with what the planner compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedEndpoint {
    /// Addresses, in order.
    pub addresses: Box<[SliceAddress]>,
    /// Conditions (`None` when the endpoint has none).
    pub conditions: Option<Conditions>,
    /// hostname.
    pub hostname: Option<Text>,
    /// zone.
    pub zone: Option<Text>,
    /// targetRef.
    pub target: Option<CachedTarget>,
    /// hints are exactly `forZones: [zone]`, this endpoint's own zone, and nothing else (the
    /// only hints this controller writes).
    pub zone_hint: bool,
    /// The endpoint sets a field this controller never writes (nodeName, deprecatedTopology,
    /// hints other than `zone_hint`, or a targetRef apiVersion, fieldPath or resourceVersion):
    /// it differs from any endpoint the planner wants.
    pub foreign: bool,
}

/// An endpoint's conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conditions {
    /// ready.
    pub ready: Option<bool>,
    /// serving.
    pub serving: Option<bool>,
    /// terminating.
    pub terminating: Option<bool>,
}

/// One endpoint address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceAddress {
    /// An IP address in canonical text.
    Ip(IpAddr),
    /// Any other text (not an IP, or not in canonical form).
    Text(Box<str>),
}

/// An endpoint's targetRef.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedTarget {
    /// kind.
    pub kind: Option<Text>,
    /// namespace.
    pub namespace: Option<Text>,
    /// name.
    pub name: Option<Text>,
    /// uid.
    pub uid: Option<Token>,
}

fn text(value: Option<&String>, intern: &impl Intern) -> Option<Text> {
    value.map(|v| intern.intern(v))
}

fn token(value: Option<&String>) -> Option<Token> {
    value.map(|v| Token::parse(v))
}

/// Name and namespace of an object (empty when missing).
fn identity(meta: &ObjectMeta, intern: &impl Intern) -> (Text, Text) {
    (
        intern.intern(meta.name.as_deref().unwrap_or_default()),
        intern.intern(meta.namespace.as_deref().unwrap_or_default()),
    )
}

// === impl Families ===

impl Families {
    /// Both families.
    pub const BOTH: Families = Families { v4: true, v6: true };

    /// Whether `family` is in the set.
    pub fn contains(self, family: Family) -> bool {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }

    /// The families of an `ipFamilies` list; none (or none known) means both.
    fn listed<'a>(list: impl IntoIterator<Item = &'a String>) -> Self {
        let mut families = Families {
            v4: false,
            v6: false,
        };
        for family in list.into_iter().filter_map(|f| Family::parse(f)) {
            match family {
                Family::V4 => families.v4 = true,
                Family::V6 => families.v6 = true,
            }
        }
        if families.v4 || families.v6 {
            families
        } else {
            Families::BOTH
        }
    }
}

// === impl TrafficDistribution ===

impl TrafficDistribution {
    /// The `trafficDistribution` values that ask for hints.
    const PREFER_CLOSE: &str = "PreferClose";
    const PREFER_SAME_ZONE: &str = "PreferSameZone";
    const PREFER_SAME_NODE: &str = "PreferSameNode";

    /// What `service` asks for. The topology-mode annotation (or its deprecated predecessor)
    /// set to `Auto` makes upstream ignore `trafficDistribution` in favour of its CPU-weighted
    /// heuristic, which needs Nodes in each zone and does not apply to external workloads: we
    /// then write no hints (docs/slices.md, "Topology hints").
    pub fn of(service: &Service) -> Self {
        let annotations = service.metadata.annotations.as_ref();
        let auto = [
            TOPOLOGY_MODE_ANNOTATION,
            DEPRECATED_TOPOLOGY_HINTS_ANNOTATION,
        ]
        .iter()
        .find_map(|key| annotations.and_then(|a| a.get(*key)))
        .is_some_and(|mode| mode == "Auto" || mode == "auto");
        if auto {
            return TrafficDistribution::Any;
        }
        let value = service
            .spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref());
        match value {
            Some(Self::PREFER_CLOSE | Self::PREFER_SAME_ZONE) => {
                TrafficDistribution::PreferSameZone
            }
            Some(Self::PREFER_SAME_NODE) => TrafficDistribution::PreferSameNode,
            _ => TrafficDistribution::Any,
        }
    }

    /// Whether ready endpoints with a zone are hinted for it.
    pub fn zone_hints(self) -> bool {
        !matches!(self, TrafficDistribution::Any)
    }
}

/// The annotation that turns on upstream's older topology-aware routing (`Auto`).
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";

/// The deprecated predecessor of [`TOPOLOGY_MODE_ANNOTATION`] (`auto`); upstream reads it first.
pub const DEPRECATED_TOPOLOGY_HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";

// === impl CachedService ===

impl CachedService {
    /// The cached form of `service`.
    pub fn new(service: &Service, intern: &impl Intern) -> Self {
        let (name, namespace) = identity(&service.metadata, intern);
        let spec = service.spec.as_ref();
        let external_name = spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let selector = spec
            .and_then(|s| s.selector.as_ref())
            .filter(|s| !s.is_empty() && !external_name)
            .map(|s| Labels::from_map(Some(s), intern));
        let ports = spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .map(|p| CachedServicePort {
                name: text(p.name.as_ref(), intern),
                port: p.port,
                protocol: text(p.protocol.as_ref(), intern),
                target: match &p.target_port {
                    None => TargetPort::Same,
                    Some(IntOrString::Int(number)) => TargetPort::Number(*number),
                    Some(IntOrString::String(name)) => TargetPort::Name(intern.intern(name)),
                },
            })
            .collect();
        CachedService {
            name,
            namespace,
            uid: token(service.metadata.uid.as_ref()),
            resource_version: token(service.metadata.resource_version.as_ref()),
            labels: Labels::from_map(service.metadata.labels.as_ref(), intern),
            deleting: service.metadata.deletion_timestamp.is_some(),
            selector,
            headless: spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None"),
            publish_not_ready: spec
                .and_then(|s| s.publish_not_ready_addresses)
                .unwrap_or(false),
            ports,
            families: Families::listed(
                spec.and_then(|s| s.ip_families.as_ref())
                    .into_iter()
                    .flatten(),
            ),
            traffic_distribution: TrafficDistribution::of(service),
        }
    }

    /// A reference to the Service, for Events about it.
    pub fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Service".to_owned()),
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: self.uid.as_ref().map(Token::to_string),
            resource_version: self.resource_version.as_ref().map(Token::to_string),
            field_path: None,
        }
    }
}

impl From<&Service> for CachedService {
    fn from(service: &Service) -> Self {
        CachedService::new(service, &NoIntern)
    }
}

// === impl CachedWorkload ===

impl CachedWorkload {
    /// The cached form of `workload`.
    pub fn new(workload: &ExternalWorkload, intern: &impl Intern) -> Self {
        let (name, namespace) = identity(&workload.metadata, intern);
        let mesh = &workload.spec.mesh_tls;
        let mesh_digest = workload_digest(&name, &mesh.identity, &mesh.server_name);
        let addresses = workload
            .spec
            .workload_ips
            .iter()
            .map(|entry| match entry.ip.parse::<IpAddr>() {
                Ok(ip) => WorkloadAddress::Ip(ip),
                Err(_) => WorkloadAddress::Invalid(entry.ip.as_str().into()),
            })
            .collect();
        let ports = workload
            .spec
            .ports
            .iter()
            .map(|p| CachedWorkloadPort {
                port: p.port,
                name: text(p.name.as_ref(), intern),
                protocol: text(p.protocol.as_ref(), intern),
            })
            .collect();
        CachedWorkload {
            name,
            namespace,
            uid: token(workload.metadata.uid.as_ref()),
            resource_version: token(workload.metadata.resource_version.as_ref()),
            labels: Labels::from_map(workload.metadata.labels.as_ref(), intern),
            addresses,
            ports,
            ready: workload.is_ready(),
            deleting: workload.metadata.deletion_timestamp.is_some(),
            mesh_digest,
            // Not interned: identities are nearly always one per workload, so an intern table
            // would only hold each once more.
            identity: Text::from(workload.spec.mesh_tls.identity.as_str()),
            server_name: Text::from(workload.spec.mesh_tls.server_name.as_str()),
        }
    }

    /// What consumers copy from this workload at slice time, hashed (docs/slices.md, "Identity
    /// digest").
    pub(crate) fn mesh_digest(&self) -> u64 {
        self.mesh_digest
    }

    /// The workload's zone, from the `topology.kubernetes.io/zone` label.
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(api::ZONE_LABEL)
    }
}

impl From<&ExternalWorkload> for CachedWorkload {
    fn from(workload: &ExternalWorkload) -> Self {
        CachedWorkload::new(workload, &NoIntern)
    }
}

// === impl SliceAddress ===

impl SliceAddress {
    /// An endpoint address as found on a slice.
    fn parse(text: &str) -> Self {
        match text.parse::<IpAddr>() {
            Ok(ip) if ip.to_string() == text => SliceAddress::Ip(ip),
            _ => SliceAddress::Text(text.into()),
        }
    }
}

impl std::fmt::Display for SliceAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SliceAddress::Ip(ip) => write!(f, "{ip}"),
            SliceAddress::Text(text) => f.write_str(text),
        }
    }
}

// === impl CachedSlice ===

impl CachedSlice {
    /// The cached form of `slice`.
    pub fn new(slice: &EndpointSlice, intern: &impl Intern) -> Self {
        let meta = &slice.metadata;
        let (name, namespace) = identity(meta, intern);
        let owner_references = meta
            .owner_references
            .iter()
            .flatten()
            .map(|r| CachedOwner {
                api_version: intern.intern(&r.api_version),
                kind: intern.intern(&r.kind),
                name: intern.intern(&r.name),
                uid: Token::parse(&r.uid),
                controller: r.controller,
                block_owner_deletion: r.block_owner_deletion,
            })
            .collect();
        let ports = slice
            .ports
            .iter()
            .flatten()
            .map(|p| CachedSlicePort {
                name: text(p.name.as_ref(), intern),
                port: p.port,
                protocol: text(p.protocol.as_ref(), intern),
                app_protocol: text(p.app_protocol.as_ref(), intern),
            })
            .collect();
        let endpoints = slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| CachedEndpoint::new(e, intern))
            .collect();
        CachedSlice {
            name,
            namespace,
            uid: token(meta.uid.as_ref()),
            resource_version: token(meta.resource_version.as_ref()),
            generation: meta.generation,
            labels: Labels::from_map(meta.labels.as_ref(), intern),
            annotations: Labels::from_map_keys(meta.annotations.as_ref(), intern),
            owner_references,
            finalizers: meta
                .finalizers
                .iter()
                .flatten()
                .map(|f| f.as_str().into())
                .collect(),
            address_type: intern.intern(&slice.address_type),
            ports,
            endpoints,
        }
    }

    /// The metadata an update of this slice starts from: identity, version, and what others may
    /// have set (annotations, owner references, finalizers).
    pub fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: self.uid.as_ref().map(Token::to_string),
            resource_version: self.resource_version.as_ref().map(Token::to_string),
            generation: self.generation,
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            owner_references: (!self.owner_references.is_empty()).then(|| {
                self.owner_references
                    .iter()
                    .map(CachedOwner::to_reference)
                    .collect()
            }),
            finalizers: (!self.finalizers.is_empty())
                .then(|| self.finalizers.iter().map(|f| f.to_string()).collect()),
            ..ObjectMeta::default()
        }
    }

    /// The slice as an API object (for deletes and reports; fields the cache does not keep are
    /// absent).
    pub fn to_slice(&self) -> EndpointSlice {
        EndpointSlice {
            metadata: self.metadata(),
            address_type: self.address_type.to_string(),
            endpoints: Some(
                self.endpoints
                    .iter()
                    .map(CachedEndpoint::to_endpoint)
                    .collect(),
            ),
            ports: Some(
                self.ports
                    .iter()
                    .map(|p| EndpointPort {
                        name: p.name.as_ref().map(|n| n.to_string()),
                        port: p.port,
                        protocol: p.protocol.as_ref().map(|n| n.to_string()),
                        app_protocol: p.app_protocol.as_ref().map(|n| n.to_string()),
                    })
                    .collect(),
            ),
        }
    }
}

impl From<&EndpointSlice> for CachedSlice {
    fn from(slice: &EndpointSlice) -> Self {
        CachedSlice::new(slice, &NoIntern)
    }
}

// === impl CachedOwner ===

impl CachedOwner {
    fn to_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            uid: self.uid.to_string(),
            controller: self.controller,
            block_owner_deletion: self.block_owner_deletion,
        }
    }
}

// === impl CachedEndpoint ===

impl CachedEndpoint {
    fn new(endpoint: &Endpoint, intern: &impl Intern) -> Self {
        let target = endpoint.target_ref.as_ref();
        let zone_hint = zone_hint(endpoint);
        let foreign = endpoint.node_name.is_some()
            || zone_hint.is_none()
            || endpoint.deprecated_topology.is_some()
            || target.is_some_and(|t| {
                t.api_version.is_some() || t.field_path.is_some() || t.resource_version.is_some()
            });
        CachedEndpoint {
            addresses: endpoint
                .addresses
                .iter()
                .map(|a| SliceAddress::parse(a))
                .collect(),
            conditions: endpoint.conditions.as_ref().map(|c| Conditions {
                ready: c.ready,
                serving: c.serving,
                terminating: c.terminating,
            }),
            hostname: text(endpoint.hostname.as_ref(), intern),
            zone: text(endpoint.zone.as_ref(), intern),
            target: target.map(|t| CachedTarget {
                kind: text(t.kind.as_ref(), intern),
                namespace: text(t.namespace.as_ref(), intern),
                name: text(t.name.as_ref(), intern),
                uid: token(t.uid.as_ref()),
            }),
            zone_hint: zone_hint.unwrap_or(false),
            foreign,
        }
    }

    fn to_endpoint(&self) -> Endpoint {
        Endpoint {
            addresses: self.addresses.iter().map(|a| a.to_string()).collect(),
            conditions: self.conditions.map(|c| EndpointConditions {
                ready: c.ready,
                serving: c.serving,
                terminating: c.terminating,
            }),
            hostname: self.hostname.as_ref().map(|h| h.to_string()),
            zone: self.zone.as_ref().map(|z| z.to_string()),
            hints: self
                .zone
                .as_ref()
                .filter(|_| self.zone_hint)
                .map(|zone| zone_hints(zone)),
            target_ref: self.target.as_ref().map(|t| ObjectReference {
                kind: t.kind.as_ref().map(|k| k.to_string()),
                namespace: t.namespace.as_ref().map(|n| n.to_string()),
                name: t.name.as_ref().map(|n| n.to_string()),
                uid: t.uid.as_ref().map(Token::to_string),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }
}

/// Whether `endpoint` has no hints (`Some(false)`), exactly the hint this controller writes,
/// `forZones: [its own zone]` (`Some(true)`), or any other hints (`None`, foreign). Empty lists
/// count as absent: the API server drops them.
fn zone_hint(endpoint: &Endpoint) -> Option<bool> {
    let Some(hints) = endpoint.hints.as_ref() else {
        return Some(false);
    };
    let zones = hints.for_zones.as_deref().unwrap_or_default();
    let nodes = hints.for_nodes.as_deref().unwrap_or_default();
    match (zones, nodes, endpoint.zone.as_deref()) {
        ([], [], _) => None,
        ([only], [], Some(zone)) if only.name == zone => Some(true),
        _ => None,
    }
}

/// The hints of an endpoint hinted for its own `zone`.
pub(crate) fn zone_hints(zone: &str) -> EndpointHints {
    EndpointHints {
        for_zones: Some(vec![ForZone {
            name: zone.to_owned(),
        }]),
        for_nodes: None,
    }
}
