//! `workload.linkerd.io/v1beta1`: the served and stored version.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lenient;
pub use crate::types::{Condition, ExternalWorkloadStatus, MeshTls, PortSpec, WorkloadIp};

/// Desired state of a workload outside the cluster (a VM, a bare-metal host) that joins the mesh.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "workload.linkerd.io",
    version = "v1beta1",
    kind = "ExternalWorkload",
    plural = "externalworkloads",
    singular = "externalworkload",
    category = "external",
    namespaced,
    status = "ExternalWorkloadStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A workload outside the cluster that joins the mesh; Services select it by its labels.",
    // kubectl prints only the first match of a JSONPath, so each address gets its own column.
    printcolumn = r#"{"name": "IP", "type": "string", "jsonPath": ".spec.workloadIPs[0].ip", "description": "First workload IP address"}"#,
    printcolumn = r#"{"name": "Second IP", "type": "string", "jsonPath": ".spec.workloadIPs[1].ip", "description": "Second workload IP address (the other family)", "priority": 1}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "Whether the workload can take traffic"}"#,
    printcolumn = r#"{"name": "Identity", "type": "string", "jsonPath": ".spec.meshTLS.identity", "description": "Mesh TLS identity", "priority": 1}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = |s: &mut schemars::Schema| crate::schema::require(s, &["meshTLS"]))]
pub struct ExternalWorkloadSpec {
    /// Mesh identity (required by the schema). Decodes to empty when absent: an object created
    /// as v1alpha1 (`meshTls`) and read back as v1beta1 lacks it, since the versions convert with
    /// no webhook.
    #[serde(rename = "meshTLS", default, deserialize_with = "lenient::value")]
    pub mesh_tls: MeshTls,

    /// Ports the workload listens on.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "lenient::list"
    )]
    pub ports: Vec<PortSpec>,

    /// At most two addresses: one IPv4 and/or one IPv6.
    #[serde(
        rename = "workloadIPs",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "lenient::list"
    )]
    #[schemars(
        length(max = 2),
        extend("x-kubernetes-validations" = [{
            "rule": "self.size() < 2 || !isIP(self[0].ip) || !isIP(self[1].ip) || ip(self[0].ip).family() != ip(self[1].ip).family()",
            "message": "at most one IPv4 and one IPv6 address"
        }])
    )]
    pub workload_ips: Vec<WorkloadIp>,
}

// === impl ExternalWorkload ===

impl ExternalWorkload {
    /// Whether the workload's `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(ExternalWorkloadStatus::is_ready)
    }

    /// The workload's zone, from the `topology.kubernetes.io/zone` label.
    pub fn zone(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(crate::ZONE_LABEL)
            .map(String::as_str)
    }
}

impl From<crate::v1alpha1::ExternalWorkloadSpec> for ExternalWorkloadSpec {
    fn from(alpha: crate::v1alpha1::ExternalWorkloadSpec) -> Self {
        Self {
            mesh_tls: alpha.mesh_tls,
            ports: alpha.ports,
            workload_ips: alpha.workload_ips,
        }
    }
}
