//! The cached managed EndpointSlice: its owner, ports and endpoints (addresses, conditions,
//! targets, zone hints), as the planner compares it and the writer rewrites it.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::{identity, text, token};
use crate::text::{Intern, Labels, NoIntern, Text, Token};

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
