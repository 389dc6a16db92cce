//! `workload.linkerd.io/v1alpha1`: served, not stored. Differs from v1beta1 only in the spelling
//! `meshTls` and in allowing one IP at most.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lenient;
pub use crate::types::{Condition, ExternalWorkloadStatus, MeshTls, PortSpec, WorkloadIp};

/// Desired state of a workload outside the cluster (older spelling of v1beta1).
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "workload.linkerd.io",
    version = "v1alpha1",
    kind = "ExternalWorkload",
    plural = "externalworkloads",
    singular = "externalworkload",
    category = "external",
    namespaced,
    storage = false,
    served = true,
    status = "ExternalWorkloadStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A workload outside the cluster that joins the mesh; Services select it by its labels.",
    // kubectl prints only the first match of a JSONPath, so each address gets its own column.
    printcolumn = r#"{"name": "IP", "type": "string", "jsonPath": ".spec.workloadIPs[0].ip", "description": "First workload IP address"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "Whether the workload can take traffic"}"#,
    printcolumn = r#"{"name": "Identity", "type": "string", "jsonPath": ".spec.meshTls.identity", "description": "Mesh TLS identity", "priority": 1}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = |s: &mut schemars::Schema| crate::schema::require(s, &["meshTls"]))]
pub struct ExternalWorkloadSpec {
    /// Mesh identity (required by the schema).
    #[serde(rename = "meshTls", default, deserialize_with = "lenient::value")]
    pub mesh_tls: MeshTls,

    /// Ports the workload listens on.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "lenient::list"
    )]
    pub ports: Vec<PortSpec>,

    /// At most one address.
    #[serde(
        rename = "workloadIPs",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "lenient::list"
    )]
    #[schemars(length(max = 1))]
    pub workload_ips: Vec<WorkloadIp>,
}

impl From<crate::v1beta1::ExternalWorkloadSpec> for ExternalWorkloadSpec {
    fn from(beta: crate::v1beta1::ExternalWorkloadSpec) -> Self {
        Self {
            mesh_tls: beta.mesh_tls,
            ports: beta.ports,
            workload_ips: beta.workload_ips,
        }
    }
}
