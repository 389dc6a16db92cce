//! What the API server checks of an object before it stores it (shallow: names, required
//! fields, addresses), and what counts as a change of `generation`.

use serde_json::Value;

use super::Failure;
use crate::kinds::Resource;

pub(super) fn changed_beyond_metadata(resource: Resource, old: &Value, new: &Value) -> bool {
    let strip = |object: &Value| {
        let mut object = object.clone();
        if let Some(map) = object.as_object_mut() {
            map.remove("metadata");
            map.remove("status");
            map.remove("apiVersion");
            map.remove("kind");
        }
        object
    };
    // Slices count their labels too (the API server's rule for EndpointSlices).
    let labels_changed = resource.plural == "endpointslices"
        && old.pointer("/metadata/labels") != new.pointer("/metadata/labels");
    strip(old) != strip(new) || labels_changed
}

pub(super) fn validate(resource: Resource, name: &str, object: &Value) -> Result<(), Failure> {
    let valid_name = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_name {
        return Err(invalid(
            resource,
            name,
            &format!(
                "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
            ),
        ));
    }
    validate_simple(resource, name, object)?;
    match resource.plural {
        "endpointslices" => {
            let family = object.get("addressType").and_then(Value::as_str);
            let Some(family) = family.filter(|family| matches!(*family, "IPv4" | "IPv6" | "FQDN"))
            else {
                return Err(invalid(resource, name, "addressType: Required value"));
            };
            for endpoint in object
                .get("endpoints")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let addresses = endpoint
                    .get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if addresses.is_empty() {
                    return Err(invalid(
                        resource,
                        name,
                        "endpoints[].addresses: Required value: must contain at least 1 address",
                    ));
                }
                for address in addresses {
                    let text = address.as_str().unwrap_or_default();
                    let ok = match family {
                        "IPv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
                        "IPv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
                        _ => true,
                    };
                    if !ok {
                        return Err(invalid(
                            resource,
                            name,
                            &format!(
                                "endpoints[].addresses: Invalid value: \"{text}\": must be a valid {family} address"
                            ),
                        ));
                    }
                }
            }
        }
        "externalworkloads" => {
            for ip in object
                .pointer("/spec/workloadIPs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let text = ip.get("ip").and_then(Value::as_str).unwrap_or_default();
                if text.parse::<std::net::IpAddr>().is_err() {
                    return Err(invalid(
                        resource,
                        name,
                        &format!("spec.workloadIPs[].ip: Invalid value: \"{text}\""),
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// What the schema of the request's version requires of a sent object (before conversion and
/// pruning): an ExternalWorkload's mesh identity, spelled as its version spells it. An update
/// is held to it only when it changes `spec` (the schema's validation ratcheting): `old` is the
/// stored object as served in the request's version.
pub(super) fn sent(resource: Resource, object: &Value, old: Option<&Value>) -> Result<(), Failure> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if resource.group == "events.k8s.io" && old.is_none() {
        // A new Event of this group needs its reporter and what it reports (an update of one
        // made through the core group does not).
        for field in [
            "reportingController",
            "reportingInstance",
            "action",
            "reason",
            "eventTime",
        ] {
            if object
                .get(field)
                .is_none_or(|value| value.is_null() || value.as_str() == Some(""))
            {
                return Err(invalid(resource, name, &format!("{field}: Required value")));
            }
        }
    }
    if resource.plural != "externalworkloads" {
        return Ok(());
    }
    let field = if resource.version == "v1alpha1" {
        "meshTls"
    } else {
        "meshTLS"
    };
    let tls = object.pointer(&format!("/spec/{field}"));
    // `required` belongs to `spec`: ratcheted only while `spec` as a whole is unchanged.
    if old.is_some_and(|old| old.get("spec") == object.get("spec")) {
        return Ok(());
    }
    let present = |part: &str| {
        tls.and_then(|tls| tls.get(part))
            .and_then(Value::as_str)
            .is_some_and(|value| !value.is_empty())
    };
    if object.get("spec").is_none_or(|spec| !spec.is_object()) {
        return Err(invalid(resource, name, "spec: Required value"));
    }
    if !present("identity") || !present("serverName") {
        return Err(invalid(
            resource,
            name,
            &format!("spec.{field}: Required value"),
        ));
    }
    Ok(())
}

/// An update through events.k8s.io may change an Event's series and metadata only (compared in
/// the stored, core form, as the real server compares them).
pub(super) fn events_update(
    resource: Resource,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), Failure> {
    const IMMUTABLE: [&str; 13] = [
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "lastTimestamp",
        "count",
        "type",
        "eventTime",
        "action",
        "related",
        "reportingComponent",
        "reportingInstance",
    ];
    let changed: Vec<String> = IMMUTABLE
        .into_iter()
        .filter(|field| old.get(*field) != new.get(*field))
        .map(|field| format!("{field}: Invalid value: field is immutable"))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    Err(invalid(
        resource,
        name,
        &format!("[{}]", changed.join(", ")),
    ))
}

/// The checks of kinds whose rules are few: Leases, Services and both Event groups.
fn validate_simple(resource: Resource, name: &str, object: &Value) -> Result<(), Failure> {
    match (resource.group, resource.plural) {
        ("coordination.k8s.io", "leases")
            if object
                .pointer("/spec/leaseDurationSeconds")
                .and_then(Value::as_i64)
                .is_some_and(|seconds| seconds <= 0) =>
        {
            return Err(invalid(
                resource,
                name,
                "spec.leaseDurationSeconds: Invalid value: must be greater than 0",
            ));
        }
        ("", "services") => {
            let balancer =
                object.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer");
            if !balancer
                && object
                    .pointer("/status/loadBalancer/ingress")
                    .and_then(Value::as_array)
                    .is_some_and(|ingress| !ingress.is_empty())
            {
                return Err(invalid(
                    resource,
                    name,
                    "status.loadBalancer.ingress: Forbidden: may only be used when `spec.type` is 'LoadBalancer'",
                ));
            }
            for port in object
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
                if !(1..=65535).contains(&number) {
                    return Err(invalid(
                        resource,
                        name,
                        &format!(
                            "spec.ports[].port: Invalid value: {number}: must be between 1 and 65535, inclusive"
                        ),
                    ));
                }
            }
        }
        ("", "events") => {
            let namespace = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str);
            let involved = object
                .pointer("/involvedObject/namespace")
                .and_then(Value::as_str);
            if involved.is_some_and(|involved| Some(involved) != namespace) {
                return Err(invalid(
                    resource,
                    name,
                    "involvedObject.namespace: Invalid value: does not match event.namespace",
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

pub(super) fn invalid(resource: Resource, name: &str, detail: &str) -> Failure {
    Failure {
        code: 422,
        reason: "Invalid",
        message: format!("{} \"{name}\" is invalid: {detail}", resource.kind),
    }
}

pub(super) fn invalid_version(version: &str) -> Failure {
    Failure {
        code: 400,
        reason: "BadRequest",
        message: format!("invalid resource version \"{version}\""),
    }
}
