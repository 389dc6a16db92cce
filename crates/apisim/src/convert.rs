//! Versions and defaults, as kube-apiserver 1.37 applies them (each rule below was found by the
//! differential trace, `tests/fidelity/trace.rs`):
//!
//! - Events are one storage served in two groups: `events.k8s.io/v1` converts to and from the
//!   core form (`regarding` is `involvedObject`, `note` is `message`, `deprecated*` are the core
//!   fields, `reportingController` is `reportingComponent`).
//! - Both Event versions are served with the fields Go writes for empty values (`null` times, `{}`
//!   sources, `""` reporting fields).
//! - ExternalWorkloads convert with no webhook (`conversion: None`): only `apiVersion` changes,
//!   and each version's schema prunes what it does not know, so `meshTls` sent as v1alpha1 is not
//!   stored, and a stored `meshTLS` is not served as v1alpha1 (the CRD's docs say so).
//! - Defaults: a port's `protocol` (`TCP`) on EndpointSlices, ExternalWorkloads (the CRD's
//!   default) and Services; a Service's `targetPort` (its `port`), `type`, `sessionAffinity`,
//!   `internalTrafficPolicy`, IP families and an allocated cluster IP; its status
//!   `loadBalancer: {}`.

use serde_json::{Map, Value, json};

use crate::kinds::Resource;

/// The fields of the two Event versions that differ only by name: (events.k8s.io, core).
const EVENT_RENAMES: [(&str, &str); 6] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// `object`, sent in `resource`'s version, in its stored form.
pub fn to_storage(resource: Resource, mut object: Value) -> Value {
    match (resource.group, resource.plural, resource.version) {
        ("events.k8s.io", "events", _) => {
            for (served, stored) in EVENT_RENAMES {
                rename(&mut object, served, stored);
            }
            rename(&mut object, "reportingController", "reportingComponent");
            object["apiVersion"] = Value::from("v1");
        }
        ("workload.linkerd.io", _, "v1alpha1") => {
            remove_in(&mut object, "spec", "meshTls");
            object["apiVersion"] = Value::from("workload.linkerd.io/v1beta1");
        }
        ("workload.linkerd.io", _, _) => remove_in(&mut object, "spec", "meshTls"),
        _ => {}
    }
    if resource.plural == "events" {
        // What Go writes for empty values is not kept (it is written again when served).
        if let Some(map) = fields(&mut object) {
            map.retain(|field, value| {
                !(value.is_null()
                    || (field == "source" && value.as_object().is_some_and(Map::is_empty))
                    || (field.starts_with("reporting") && value.as_str() == Some("")))
            });
        }
    }
    default_protocols(resource, &mut object);
    object
}

/// A stored object as served in `resource`'s version.
pub fn to_served(resource: Resource, mut object: Value) -> Value {
    match (resource.group, resource.plural, resource.version) {
        ("events.k8s.io", "events", _) => {
            for (served, stored) in EVENT_RENAMES {
                rename(&mut object, stored, served);
            }
            rename(&mut object, "reportingComponent", "reportingController");
            for field in ["reportingController", "reportingInstance"] {
                if object.get(field).and_then(Value::as_str) == Some("") {
                    remove(&mut object, field);
                }
            }
            for (field, empty) in [
                ("eventTime", Value::Null),
                ("deprecatedSource", json!({})),
                ("deprecatedFirstTimestamp", Value::Null),
                ("deprecatedLastTimestamp", Value::Null),
            ] {
                or_insert(&mut object, field, empty);
            }
        }
        ("", "events", _) => {
            for (field, empty) in [
                ("involvedObject", json!({})),
                ("source", json!({})),
                ("firstTimestamp", Value::Null),
                ("lastTimestamp", Value::Null),
                ("eventTime", Value::Null),
                ("reportingComponent", json!("")),
                ("reportingInstance", json!("")),
            ] {
                or_insert(&mut object, field, empty);
            }
        }
        ("workload.linkerd.io", _, "v1alpha1") => remove_in(&mut object, "spec", "meshTLS"),
        _ => {}
    }
    object["apiVersion"] = Value::from(resource.api_version());
    object["kind"] = Value::from(resource.kind);
    object
}

/// A new Service's defaults, with `cluster_ip` allocated to it.
pub fn default_service(object: &mut Value, cluster_ip: &str) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    if !headless
        && spec
            .get("clusterIP")
            .is_none_or(|ip| ip.as_str() == Some(""))
    {
        spec.insert("clusterIP".into(), Value::from(cluster_ip));
    }
    if let Some(ip) = spec.get("clusterIP").cloned() {
        spec.entry("clusterIPs").or_insert_with(|| json!([ip]));
    }
    for (field, value) in [
        ("type", json!("ClusterIP")),
        ("sessionAffinity", json!("None")),
        ("internalTrafficPolicy", json!("Cluster")),
        ("ipFamilies", json!(["IPv4"])),
        ("ipFamilyPolicy", json!("SingleStack")),
    ] {
        spec.entry(field).or_insert(value);
    }
    for port in spec
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(port) = port.as_object_mut()
            && let Some(number) = port.get("port").cloned()
        {
            port.entry("targetPort").or_insert(number);
        }
    }
    object["status"] = json!({"loadBalancer": {}});
}

fn default_protocols(resource: Resource, object: &mut Value) {
    let ports = match resource.plural {
        "endpointslices" => object.get_mut("ports"),
        "services" | "externalworkloads" => object.pointer_mut("/spec/ports"),
        _ => None,
    };
    for port in ports
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        if port.get("protocol").is_none_or(Value::is_null) {
            port.insert("protocol".into(), Value::from("TCP"));
        }
    }
}

fn fields(object: &mut Value) -> Option<&mut Map<String, Value>> {
    object.as_object_mut()
}

fn rename(object: &mut Value, from: &str, to: &str) {
    if let Some(map) = fields(object)
        && let Some(value) = map.remove(from)
    {
        map.insert(to.to_string(), value);
    }
}

fn remove(object: &mut Value, field: &str) {
    if let Some(map) = fields(object) {
        map.remove(field);
    }
}

fn remove_in(object: &mut Value, within: &str, field: &str) {
    if let Some(map) = object.get_mut(within).and_then(Value::as_object_mut) {
        map.remove(field);
    }
}

fn or_insert(object: &mut Value, field: &str, value: Value) {
    if let Some(map) = fields(object) {
        map.entry(field).or_insert(value);
    }
}
