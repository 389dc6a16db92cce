//! Types shared by every served version of ExternalWorkload.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lenient;
use crate::schema::require;

/// The condition type that says whether a workload can take traffic.
pub const READY_CONDITION: &str = "Ready";

/// The label whose value becomes the endpoint's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Mesh identity of the workload. Not used for slices; kept so objects round-trip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = |s: &mut schemars::Schema| require(s, &["identity", "serverName"]))]
pub struct MeshTls {
    /// The workload's TLS identity (1 to 253 characters).
    #[serde(default, deserialize_with = "lenient::value")]
    #[schemars(length(min = 1, max = 253))]
    pub identity: String,

    /// The server name the workload presents (1 to 253 characters).
    #[serde(default, deserialize_with = "lenient::value")]
    #[schemars(length(min = 1, max = 253))]
    pub server_name: String,
}

/// A port the workload listens on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = |s: &mut schemars::Schema| require(s, &["port"]))]
pub struct PortSpec {
    /// Port number, 1 to 65535. Kept as a wide integer so a bad value decodes (to 0 when it is not
    /// a number at all) and is rejected by the planner instead of by the decoder.
    #[serde(default, deserialize_with = "lenient::port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Optional IANA service name; a Service's named targetPort resolves against it.
    ///
    /// Not pattern-checked by the schema: Linkerd's CRD accepts any string here, and an object
    /// it accepts must stay accepted (its IPs and other ports are still usable). A name that is
    /// not a valid IANA service name can never match a Service's targetPort, so it is inert.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::text"
    )]
    pub name: Option<String>,

    /// `TCP` (the default when absent), `UDP` or `SCTP`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::text"
    )]
    #[schemars(extend("default" = "TCP", "enum" = ["TCP", "UDP", "SCTP"]))]
    pub protocol: Option<String>,
}

/// One address of the workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = |s: &mut schemars::Schema| require(s, &["ip"]))]
pub struct WorkloadIp {
    /// The IP address as text. Kept as a string: an object a looser CRD let in may hold anything
    /// here, and the planner skips and reports what is not an IP.
    #[serde(default, deserialize_with = "lenient::value")]
    #[schemars(
        length(max = 64),
        extend("x-kubernetes-validations" = [{"rule": "isIP(self)", "message": "must be an IPv4 or IPv6 address"}])
    )]
    pub ip: String,
}

/// Observed state of an ExternalWorkload, written by something outside this controller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalWorkloadStatus {
    /// Standard conditions; `Ready` = `True` means the workload can take traffic.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "lenient::list"
    )]
    pub conditions: Vec<Condition>,
}

/// A standard condition. Times stay text so a malformed timestamp never breaks decoding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = |s: &mut schemars::Schema| require(s, &["type", "status"]))]
pub struct Condition {
    /// Condition type, for example `Ready`.
    #[serde(rename = "type", default, deserialize_with = "lenient::value")]
    pub type_: String,

    /// `True`, `False` or `Unknown`.
    #[serde(default, deserialize_with = "lenient::value")]
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,

    /// When the condition was last probed (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::text"
    )]
    #[schemars(extend("format" = "date-time"))]
    pub last_probe_time: Option<String>,

    /// When the condition last changed status (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::text"
    )]
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: Option<String>,

    /// One-word CamelCase reason for the last transition.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::text"
    )]
    pub reason: Option<String>,

    /// Human-readable detail of the last transition.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::text"
    )]
    pub message: Option<String>,
}

// === impl ExternalWorkloadStatus ===

impl ExternalWorkloadStatus {
    /// Whether the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == READY_CONDITION && c.status == "True")
    }
}
