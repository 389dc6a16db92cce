//! The cached ExternalWorkload: its addresses, ports, readiness and identity digest.

use std::net::IpAddr;

use api::v1beta1::ExternalWorkload;

use super::{identity, text, token};
use crate::digest::workload_digest;
use crate::text::{Intern, Labels, NoIntern, Text, Token};

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
    /// Name, `spec.meshTLS.identity` and `spec.meshTLS.serverName` hashed once (set by
    /// [`CachedWorkload::new`]). A consumer (Linkerd's destination service) copies the identity
    /// and server name when it reads a slice holding this workload, so the slice's identity
    /// digest covers them (issue 37). Only the hash is kept: nothing else reads the two strings,
    /// and keeping them cost about 140 bytes per workload (7 MiB at 50,000).
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
