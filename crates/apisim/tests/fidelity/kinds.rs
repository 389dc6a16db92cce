//! The kinds the differential trace writes, and the bodies it sends for each: what the
//! controller, its elector and the simulation's driver send (Leases, Services, ExternalWorkloads
//! in both versions, EndpointSlices, Events of both groups).

use kube::{api::ApiResource, core::GroupVersionKind};
use serde_json::{Value, json};

/// One kind in one served version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Lease,
    Service,
    WorkloadBeta,
    WorkloadAlpha,
    Slice,
    CoreEvent,
    Event,
}

/// Every kind, in the order their watches are opened and reported.
pub const KINDS: [Kind; 7] = [
    Kind::Lease,
    Kind::Service,
    Kind::WorkloadBeta,
    Kind::WorkloadAlpha,
    Kind::Slice,
    Kind::CoreEvent,
    Kind::Event,
];

/// A fixed time, in the precision each field is served in.
const MICRO_TIME: &str = "2026-01-01T00:00:00.000000Z";
const TIME: &str = "2026-01-01T00:00:00Z";

/// What a body of the trace depends on besides its name: a variant number, the namespace, and
/// the uid of the Service a slice is owned by (when that Service exists).
pub struct BodyOf<'a> {
    pub name: Option<&'a str>,
    pub generate_name: Option<&'a str>,
    pub variant: u64,
    pub namespace: &'a str,
    pub owner_uid: Option<&'a str>,
    pub finalizer: bool,
}

// === impl Kind ===

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Lease => "lease",
            Kind::Service => "service",
            Kind::WorkloadBeta => "workload/v1beta1",
            Kind::WorkloadAlpha => "workload/v1alpha1",
            Kind::Slice => "slice",
            Kind::CoreEvent => "event/v1",
            Kind::Event => "event/events.k8s.io",
        }
    }

    pub fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::Lease => ("coordination.k8s.io", "v1", "Lease", "leases"),
            Kind::Service => ("", "v1", "Service", "services"),
            Kind::WorkloadBeta => (
                "workload.linkerd.io",
                "v1beta1",
                "ExternalWorkload",
                "externalworkloads",
            ),
            Kind::WorkloadAlpha => (
                "workload.linkerd.io",
                "v1alpha1",
                "ExternalWorkload",
                "externalworkloads",
            ),
            Kind::Slice => ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
            Kind::CoreEvent => ("", "v1", "Event", "events"),
            Kind::Event => ("events.k8s.io", "v1", "Event", "events"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    /// The names the trace uses for this kind (the two versions of a kind share theirs, so
    /// one is read and written through the other).
    pub fn name(self, index: u64) -> String {
        let prefix = match self {
            Kind::Lease => "lease",
            Kind::Service => "svc",
            Kind::WorkloadBeta | Kind::WorkloadAlpha => "workload",
            Kind::Slice => "slice",
            Kind::CoreEvent | Kind::Event => "event",
        };
        format!("{prefix}-{index}")
    }

    pub fn has_status(self) -> bool {
        matches!(
            self,
            Kind::Service | Kind::WorkloadBeta | Kind::WorkloadAlpha
        )
    }

    pub fn is_event(self) -> bool {
        matches!(self, Kind::CoreEvent | Kind::Event)
    }

    /// A valid body.
    pub fn body(self, of: &BodyOf<'_>) -> Value {
        let variant = of.variant;
        let mut metadata =
            json!({"labels": {"app": "trace", "variant": format!("v{}", variant % 3)}});
        if let Some(name) = of.name {
            metadata["name"] = Value::from(name);
        }
        if let Some(prefix) = of.generate_name {
            metadata["generateName"] = Value::from(prefix);
        }
        if of.finalizer {
            metadata["finalizers"] = json!(["fidelity.test/hold"]);
        }
        let resource = self.resource();
        let mut body = match self {
            Kind::Lease => json!({
                "spec": {
                    "holderIdentity": format!("replica-{}", variant % 3),
                    "leaseDurationSeconds": 15,
                    "acquireTime": MICRO_TIME,
                    "renewTime": MICRO_TIME,
                    "leaseTransitions": variant % 4,
                }
            }),
            Kind::Service => {
                let mut port = json!({"name": "http", "port": 80 + variant % 2, "protocol": "TCP"});
                if variant.is_multiple_of(2) {
                    port["targetPort"] = json!(8080);
                }
                json!({"spec": {"selector": {"app": format!("web-{}", variant % 3)}, "ports": [port]}})
            }
            Kind::WorkloadBeta | Kind::WorkloadAlpha => {
                let tls_field = if self == Kind::WorkloadBeta {
                    "meshTLS"
                } else {
                    "meshTls"
                };
                let mut port = json!({"port": 8080 + variant % 3});
                if variant.is_multiple_of(2) {
                    port["protocol"] = json!("TCP");
                    port["name"] = json!("http");
                }
                json!({"spec": {
                    tls_field: {"identity": format!("id-{}", variant % 5), "serverName": "trace.test"},
                    "workloadIPs": [{"ip": format!("192.0.2.{}", 1 + variant % 200)}],
                    "ports": [port],
                }})
            }
            Kind::Slice => {
                metadata["labels"]["kubernetes.io/service-name"] =
                    Value::from(format!("svc-{}", variant % 2));
                metadata["labels"]["endpointslice.kubernetes.io/managed-by"] =
                    Value::from("fidelity-trace");
                if let Some(uid) = of.owner_uid {
                    metadata["ownerReferences"] = json!([{
                        "apiVersion": "v1", "kind": "Service", "name": format!("svc-{}", variant % 2),
                        "uid": uid, "controller": true, "blockOwnerDeletion": true,
                    }]);
                }
                let mut port = json!({"name": "http", "port": 8080});
                if variant.is_multiple_of(2) {
                    port["protocol"] = json!("TCP");
                }
                let mut endpoint = json!({
                    "addresses": [format!("192.0.2.{}", 1 + variant % 200)],
                    "conditions": {"ready": !variant.is_multiple_of(3), "serving": true, "terminating": false},
                });
                if variant % 2 == 1 {
                    endpoint["zone"] = json!("zone-a");
                    endpoint["hints"] = json!({"forZones": [{"name": "zone-a"}]});
                }
                json!({"addressType": "IPv4", "endpoints": [endpoint], "ports": [port]})
            }
            Kind::CoreEvent => json!({
                "involvedObject": {"apiVersion": "v1", "kind": "Service", "namespace": of.namespace, "name": "svc-0"},
                "reason": "Traced",
                "message": format!("note {variant}"),
                "type": "Normal",
                "source": {"component": "fidelity"},
                "count": 1,
                "firstTimestamp": TIME,
                "lastTimestamp": TIME,
            }),
            Kind::Event => json!({
                "eventTime": MICRO_TIME,
                "reportingController": "fidelity.test/trace",
                "reportingInstance": "trace-0",
                "action": "Reconcile",
                "reason": "Traced",
                "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": of.namespace, "name": "svc-0"},
                "note": format!("note {variant}"),
                "type": if variant.is_multiple_of(2) { "Normal" } else { "Warning" },
            }),
        };
        body["apiVersion"] = Value::from(resource.api_version.clone());
        body["kind"] = Value::from(resource.kind.clone());
        body["metadata"] = metadata;
        body
    }

    /// A body the API server refuses (422).
    pub fn invalid_body(self, name: &str) -> Value {
        let resource = self.resource();
        let body = match self {
            Kind::Lease => json!({"spec": {"leaseDurationSeconds": -1}}),
            Kind::Service => json!({"spec": {"ports": [{"port": 70000}]}}),
            Kind::WorkloadBeta => json!({"spec": {"workloadIPs": [{"ip": "not-an-ip"}]}}),
            Kind::WorkloadAlpha => json!({"spec": {}}),
            Kind::Slice => json!({"endpoints": []}),
            Kind::CoreEvent => json!({"involvedObject": {"namespace": "elsewhere"}}),
            Kind::Event => json!({"note": "no reporting controller"}),
        };
        let mut body = body;
        body["apiVersion"] = Value::from(resource.api_version.clone());
        body["kind"] = Value::from(resource.kind.clone());
        body["metadata"] = json!({"name": name});
        body
    }

    /// A change of spec (or the kind's main content) for an update.
    pub fn change(self, object: &mut Value, variant: u64) {
        match self {
            Kind::Lease => {
                object["spec"]["holderIdentity"] = Value::from(format!("replica-{}", variant % 3));
                object["spec"]["leaseTransitions"] = Value::from(variant % 7);
            }
            Kind::Service => {
                object["spec"]["selector"] = json!({"app": format!("web-{}", variant % 4)});
            }
            Kind::WorkloadBeta | Kind::WorkloadAlpha => {
                object["spec"]["workloadIPs"] =
                    json!([{"ip": format!("198.51.100.{}", 1 + variant % 200)}]);
            }
            Kind::Slice => {
                object["endpoints"] = json!([{
                    "addresses": [format!("198.51.100.{}", 1 + variant % 200)],
                    "conditions": {"ready": true},
                }]);
            }
            Kind::CoreEvent => {
                object["count"] = Value::from(1 + variant % 9);
                object["message"] = Value::from(format!("changed {variant}"));
            }
            Kind::Event => {
                object["series"] =
                    json!({"count": 2 + variant % 9, "lastObservedTime": MICRO_TIME});
            }
        }
    }

    /// A status for the `/status` subresource.
    pub fn status(self, variant: u64) -> Value {
        match self {
            Kind::Service => {
                json!({"loadBalancer": {"ingress": [{"ip": format!("203.0.113.{}", 1 + variant % 200)}]}})
            }
            _ => json!({"conditions": [{
                "type": "Ready",
                "status": if variant.is_multiple_of(2) { "True" } else { "False" },
                "lastTransitionTime": TIME,
                "reason": "Traced",
                "message": "",
            }]}),
        }
    }
}
