//! What one planned write changes in a slice, as `diff` prints it: endpoints and ports added,
//! removed or changed (known by their addresses, and by name and protocol), and the other fields
//! that change, key by key. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use kube::ResourceExt;
use serde::Serialize;
use serde_json::Value;
use slices::{IDENTITY_DIGEST_ANNOTATION, LAST_CHANGE_TRIGGER_TIME_ANNOTATION};

/// The writes planned for one Service.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServiceDiff {
    /// `namespace/name` of the Service.
    pub service: String,
    /// Slices that would be created (everything in them is added).
    pub creates: Vec<SliceDiff>,
    /// Slices that would be replaced.
    pub updates: Vec<SliceDiff>,
    /// Slices that would be deleted (everything in them is removed).
    pub deletes: Vec<SliceDiff>,
}

/// One slice's change.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SliceDiff {
    /// Its name; none for a slice to create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its `generateName`, for a slice to create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    /// Its address type (after the change; before it, for a delete).
    pub address_type: String,
    /// The fields whose value changes (`endpoints`, `ports`, `metadata.labels`, ...).
    pub fields: Vec<String>,
    /// Endpoints added, removed and changed; an endpoint is known by its addresses.
    pub endpoints: Changes<Endpoint>,
    /// Ports added, removed and changed; a port is known by its name and protocol.
    pub ports: Changes<EndpointPort>,
    /// The other fields that change (address type, labels, annotations, owners), as JSON.
    pub other: Vec<FieldChange>,
}

/// What changes in a list of items known by a key.
#[derive(Clone, Debug, Serialize)]
pub struct Changes<T> {
    /// Items only in the planned slice.
    pub added: Vec<T>,
    /// Items only in the live slice.
    pub removed: Vec<T>,
    /// Items in both whose other fields differ.
    pub changed: Vec<Change<T>>,
}

/// One item before and after.
#[derive(Clone, Debug, Serialize)]
pub struct Change<T> {
    /// As live.
    pub before: T,
    /// As planned.
    pub after: T,
}

/// A field other than endpoints and ports (a label or annotation key on its own).
#[derive(Clone, Debug, Serialize)]
pub struct FieldChange {
    /// `addressType`, `metadata.labels.KEY`, `metadata.annotations.KEY`,
    /// `metadata.ownerReferences`.
    pub field: String,
    /// As live; none when added.
    pub before: Option<Value>,
    /// As planned; none when removed.
    pub after: Option<Value>,
}

/// The fields compared for an update, as JSON pointers into an EndpointSlice.
const FIELDS: &[(&str, &str)] = &[
    ("addressType", "/addressType"),
    ("endpoints", "/endpoints"),
    ("ports", "/ports"),
    ("metadata.labels", "/metadata/labels"),
    ("metadata.annotations", "/metadata/annotations"),
    ("metadata.ownerReferences", "/metadata/ownerReferences"),
];

// === impl ServiceDiff ===

impl ServiceDiff {
    /// `namespace/name: 1 create(s), 2 update(s), 0 delete(s)`.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} create(s), {} update(s), {} delete(s)",
            self.service,
            self.creates.len(),
            self.updates.len(),
            self.deletes.len()
        )
    }

    /// The summary, then per slice a `---`/`+++` header and its `-`/`+` lines, as `kubectl
    /// diff` prints them.
    pub fn lines(&self) -> Vec<String> {
        let namespace = self.service.split('/').next().unwrap_or_default();
        let mut lines = vec![self.summary()];
        for create in &self.creates {
            let name = create.generate_name.as_deref().unwrap_or_default();
            lines.push("--- /dev/null".into());
            lines.push(format!(
                "+++ {namespace}/{name}… (create, {})",
                create.address_type
            ));
            lines.extend(create.change_lines(true));
        }
        for update in &self.updates {
            let name = update.name.as_deref().unwrap_or_default();
            lines.push(format!("--- {namespace}/{name} (live)"));
            lines.push(format!("+++ {namespace}/{name} (update)"));
            lines.extend(update.change_lines(false));
        }
        for delete in &self.deletes {
            let name = delete.name.as_deref().unwrap_or_default();
            lines.push(format!(
                "--- {namespace}/{name} (live, {})",
                delete.address_type
            ));
            lines.push("+++ /dev/null (delete)".into());
            lines.extend(delete.change_lines(true));
        }
        lines
    }
}

// === impl SliceDiff ===

impl SliceDiff {
    /// Between `live` (none for a create) and `planned` (none for a delete).
    pub(super) fn between(live: Option<&EndpointSlice>, planned: Option<&EndpointSlice>) -> Self {
        let slice = planned.or(live);
        let endpoints =
            |s: Option<&EndpointSlice>| s.and_then(|s| s.endpoints.clone()).unwrap_or_default();
        let ports = |s: Option<&EndpointSlice>| s.and_then(|s| s.ports.clone()).unwrap_or_default();
        let (before, after) = (comparable(live), comparable(planned));
        let mut fields: Vec<String> = FIELDS
            .iter()
            .filter(|(_, pointer)| before.pointer(pointer) != after.pointer(pointer))
            .map(|(field, _)| (*field).to_string())
            .collect();
        let digest = |s: Option<&EndpointSlice>| {
            s.and_then(|s| s.metadata.annotations.as_ref())
                .and_then(|annotations| annotations.get(IDENTITY_DIGEST_ANNOTATION))
                .map(|digest| Value::String(digest.clone()))
        };
        let mut other = other_changes(&before, &after);
        if live.is_some() && planned.is_some() && digest(live) != digest(planned) {
            fields.push("identity-digest".into());
            other.push(FieldChange {
                field: "identity-digest".into(),
                before: digest(live),
                after: digest(planned),
            });
        }
        if fields.is_empty() {
            fields.push("(no compared field: only server-kept fields differ)".into());
        }
        SliceDiff {
            name: planned.map_or(live.map(ResourceExt::name_any), |p| p.metadata.name.clone()),
            generate_name: planned.and_then(|p| p.metadata.generate_name.clone()),
            address_type: slice.map(|s| s.address_type.clone()).unwrap_or_default(),
            fields,
            endpoints: Changes::between(endpoints(live), endpoints(planned), endpoint_key),
            ports: Changes::between(ports(live), ports(planned), port_key),
            other,
        }
    }

    /// `-`/`+` lines: the other fields, then ports, then endpoints. For a `whole` slice
    /// created or deleted, the header already gives the address type, and the owner is the
    /// Service: those two are left out (the JSON has them).
    fn change_lines(&self, whole: bool) -> Vec<String> {
        let mut lines = Vec::new();
        let shown = |change: &&FieldChange| {
            !whole
                || !matches!(
                    change.field.as_str(),
                    "addressType" | "metadata.ownerReferences"
                )
        };
        for change in self.other.iter().filter(shown) {
            if let Some(before) = &change.before {
                lines.push(format!("-{}: {before}", change.field));
            }
            if let Some(after) = &change.after {
                lines.push(format!("+{}: {after}", change.field));
            }
        }
        lines.extend(self.ports.lines("port", describe_port));
        lines.extend(self.endpoints.lines("endpoint", describe_endpoint));
        lines
    }
}

// === impl Changes ===

impl<T: Clone + PartialEq> Changes<T> {
    /// Matches `before` and `after` by `key`, keeping the planned order.
    fn between(before: Vec<T>, after: Vec<T>, key: fn(&T) -> String) -> Self {
        let mut live: BTreeMap<String, T> = before
            .iter()
            .map(|item| (key(item), item.clone()))
            .collect();
        let (mut added, mut changed) = (Vec::new(), Vec::new());
        for item in after {
            match live.remove(&key(&item)) {
                None => added.push(item),
                Some(old) if old != item => changed.push(Change {
                    before: old,
                    after: item,
                }),
                Some(_) => {}
            }
        }
        let removed = (before.into_iter())
            .filter(|item| live.contains_key(&key(item)))
            .collect();
        Changes {
            added,
            removed,
            changed,
        }
    }

    fn lines(&self, kind: &str, describe: fn(&T) -> String) -> Vec<String> {
        let mut lines = Vec::new();
        for item in &self.removed {
            lines.push(format!("-{kind} {}", describe(item)));
        }
        for change in &self.changed {
            lines.push(format!("-{kind} {}", describe(&change.before)));
            lines.push(format!("+{kind} {}", describe(&change.after)));
        }
        for item in &self.added {
            lines.push(format!("+{kind} {}", describe(item)));
        }
        lines
    }
}

impl<T> Default for Changes<T> {
    fn default() -> Self {
        Changes {
            added: Vec::new(),
            removed: Vec::new(),
            changed: Vec::new(),
        }
    }
}

fn endpoint_key(endpoint: &Endpoint) -> String {
    endpoint.addresses.join(",")
}

fn port_key(port: &EndpointPort) -> String {
    format!(
        "{}/{}",
        port.name.as_deref().unwrap_or_default(),
        port.protocol.as_deref().unwrap_or("TCP")
    )
}

/// `10.0.0.1 target=vm-1 ready=true serving=true terminating=false zone=z hints=zone-a`.
pub fn describe_endpoint(endpoint: &Endpoint) -> String {
    let mut text = endpoint.addresses.join(",");
    let mut field = |name: &str, value: Option<String>| {
        if let Some(value) = value {
            text.push_str(&format!(" {name}={value}"));
        }
    };
    field(
        "target",
        (endpoint.target_ref.as_ref()).and_then(|r| r.name.clone()),
    );
    let conditions = endpoint.conditions.as_ref();
    field(
        "ready",
        conditions.and_then(|c| c.ready).map(|b| b.to_string()),
    );
    field(
        "serving",
        conditions.and_then(|c| c.serving).map(|b| b.to_string()),
    );
    field(
        "terminating",
        conditions
            .and_then(|c| c.terminating)
            .map(|b| b.to_string()),
    );
    field("zone", endpoint.zone.clone());
    field("node", endpoint.node_name.clone());
    field("hostname", endpoint.hostname.clone());
    let hints = endpoint.hints.as_ref();
    let zones: Vec<String> = (hints
        .and_then(|h| h.for_zones.as_ref())
        .into_iter()
        .flatten())
    .map(|z| z.name.clone())
    .collect();
    field(
        "hints.forZones",
        (!zones.is_empty()).then(|| zones.join(",")),
    );
    let nodes: Vec<String> = (hints
        .and_then(|h| h.for_nodes.as_ref())
        .into_iter()
        .flatten())
    .map(|n| n.name.clone())
    .collect();
    field(
        "hints.forNodes",
        (!nodes.is_empty()).then(|| nodes.join(",")),
    );
    text
}

/// `http 8080/TCP appProtocol=http`.
pub fn describe_port(port: &EndpointPort) -> String {
    let mut text = format!(
        "{} {}/{}",
        port.name.as_deref().unwrap_or("(unnamed)"),
        port.port.map_or("(all)".to_string(), |p| p.to_string()),
        port.protocol.as_deref().unwrap_or("TCP")
    );
    if let Some(protocol) = &port.app_protocol {
        text.push_str(&format!(" appProtocol={protocol}"));
    }
    text
}

/// A slice as JSON without the trigger-time annotation, which every write sets.
fn comparable(slice: Option<&EndpointSlice>) -> Value {
    let Some(slice) = slice else {
        return Value::Null;
    };
    let mut value = serde_json::to_value(slice).unwrap_or(Value::Null);
    if let Some(annotations) = value
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(LAST_CHANGE_TRIGGER_TIME_ANNOTATION);
        // Named on its own, `identity-digest` (docs/slices.md): it changes with the endpoints'
        // workloads or identities, and is added once to slices written without it (Linkerd's).
        annotations.remove(IDENTITY_DIGEST_ANNOTATION);
        if annotations.is_empty() {
            value["metadata"]
                .as_object_mut()
                .map(|m| m.remove("annotations"));
        }
    }
    value
}

/// The changes of the fields other than endpoints and ports; labels and annotations key by key.
fn other_changes(before: &Value, after: &Value) -> Vec<FieldChange> {
    let mut changes = Vec::new();
    for (field, pointer) in [
        ("addressType", "/addressType"),
        ("metadata.ownerReferences", "/metadata/ownerReferences"),
    ] {
        let (old, new) = (before.pointer(pointer), after.pointer(pointer));
        if old != new {
            changes.push(FieldChange {
                field: field.into(),
                before: old.cloned(),
                after: new.cloned(),
            });
        }
    }
    for (field, pointer) in [
        ("metadata.labels", "/metadata/labels"),
        ("metadata.annotations", "/metadata/annotations"),
    ] {
        let map = |v: &Value| v.pointer(pointer).and_then(Value::as_object).cloned();
        let (old, new) = (
            map(before).unwrap_or_default(),
            map(after).unwrap_or_default(),
        );
        let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for key in keys {
            if old.get(key) != new.get(key) {
                changes.push(FieldChange {
                    field: format!("{field}.{key}"),
                    before: old.get(key).cloned(),
                    after: new.get(key).cloned(),
                });
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, ForZone};
    use kube::api::ObjectMeta;

    use super::*;

    fn endpoint(ip: &str, ready: bool, zone: &str) -> Endpoint {
        Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            zone: Some(zone.into()),
            ..Endpoint::default()
        }
    }

    fn port(name: &str, number: i32) -> EndpointPort {
        EndpointPort {
            name: Some(name.into()),
            port: Some(number),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }
    }

    fn slice(endpoints: Vec<Endpoint>, ports: Vec<EndpointPort>, team: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some("linkerd-external-web-abcde".into()),
                labels: Some([("team".to_string(), team.to_string())].into()),
                annotations: Some(
                    [(
                        LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_string(),
                        team.to_string(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ports: Some(ports),
        }
    }

    #[test]
    fn an_update_shows_each_endpoint_port_and_label_that_changes_and_nothing_else() {
        let live = slice(
            vec![
                endpoint("10.0.0.1", true, "a"),
                endpoint("10.0.0.2", true, "a"),
            ],
            vec![port("http", 8080), port("admin", 9000)],
            "payments",
        );
        let mut hinted = endpoint("10.0.0.1", true, "a");
        hinted.hints = Some(EndpointHints {
            for_zones: Some(vec![ForZone { name: "a".into() }]),
            ..EndpointHints::default()
        });
        let planned = slice(
            vec![hinted, endpoint("10.0.0.3", false, "b")],
            vec![port("http", 8081), port("admin", 9000)],
            "checkout",
        );
        let diff = SliceDiff::between(Some(&live), Some(&planned));
        assert_eq!(
            diff.fields,
            ["endpoints", "ports", "metadata.labels"].map(String::from),
            "the trigger-time annotation differs too, but every write sets it: not compared"
        );
        assert_eq!(
            diff.change_lines(false),
            [
                "-metadata.labels.team: \"payments\"",
                "+metadata.labels.team: \"checkout\"",
                "-port http 8080/TCP",
                "+port http 8081/TCP",
                "-endpoint 10.0.0.2 ready=true serving=true terminating=false zone=a",
                "-endpoint 10.0.0.1 ready=true serving=true terminating=false zone=a",
                "+endpoint 10.0.0.1 ready=true serving=true terminating=false zone=a hints.forZones=a",
                "+endpoint 10.0.0.3 ready=false serving=false terminating=false zone=b",
            ]
            .map(String::from)
        );
        assert_eq!(diff.endpoints.removed.len(), 1);
        assert_eq!(diff.endpoints.changed.len(), 1);
        assert_eq!(diff.endpoints.added.len(), 1);
        assert_eq!(diff.ports.changed[0].after.port, Some(8081));
    }

    #[test]
    fn a_delete_removes_everything_and_a_create_adds_everything() {
        let live = slice(
            vec![endpoint("10.0.0.1", true, "a")],
            vec![port("http", 80)],
            "x",
        );
        let deleted = SliceDiff::between(Some(&live), None);
        assert_eq!(deleted.endpoints.removed.len(), 1);
        assert_eq!(deleted.ports.removed.len(), 1);
        assert!(
            deleted
                .change_lines(true)
                .iter()
                .all(|l| l.starts_with('-'))
        );
        let created = SliceDiff::between(None, Some(&live));
        assert_eq!(created.endpoints.added.len(), 1);
        assert!(
            created
                .change_lines(true)
                .iter()
                .all(|l| l.starts_with('+'))
        );
        assert!(
            !(created.change_lines(true).iter()).any(|l| l.starts_with("+addressType")),
            "the header gives it"
        );
    }
}
