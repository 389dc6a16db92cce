//! Makes two servers' records of one trace comparable: what each server chooses freely is
//! replaced by its order of appearance (uids, generated names, resourceVersions), and what the
//! in-memory server does not model on purpose (crate docs, "Deliberate simplifications") is
//! taken out: creation times, managed fields, allocated cluster IPs.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::trace::Observed;

/// Stand-ins, by order of first appearance; versions by their rank among the versions seen of
/// the same object (its uid), so one extra write elsewhere does not shift every later version.
#[derive(Default)]
struct Aliases {
    uids: BTreeMap<String, String>,
    names: BTreeMap<String, String>,
    versions: BTreeMap<(String, u64), String>,
}

/// The label of the steps that expire a version.
pub const EXPIRY: &str = "expire: ";

/// What the expiry steps observed, one line each.
pub fn expiry_answers(steps: &[(String, Observed)]) -> Vec<String> {
    let aliases = Aliases::default();
    steps
        .iter()
        .filter(|(label, _)| label.starts_with(EXPIRY) && !label.contains("a write after"))
        .map(|(label, observed)| format!("{label}: {}", render(observed, &aliases)))
        .collect()
}

/// One line per step: its label and what it observed, normalised.
pub fn normalise(steps: &[(String, Observed)]) -> Vec<String> {
    let mut aliases = Aliases::default();
    let mut versions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (_, observed) in steps {
        for object in objects(observed) {
            collect(object, &mut aliases, &mut versions);
        }
    }
    for (uid, mut seen) in versions {
        seen.sort_unstable();
        seen.dedup();
        for (rank, version) in seen.into_iter().enumerate() {
            aliases
                .versions
                .insert((uid.clone(), version), format!("rv#{rank}"));
        }
    }
    steps
        .iter()
        .map(|(label, observed)| {
            if label.starts_with(EXPIRY) {
                // Listed as deliberate (crate docs): kube-apiserver 1.37 serves a continued list
                // and an old watch from its watch cache after etcd is compacted; the in-memory
                // server answers 410 (checked apart, `expiry_answers`).
                return format!("{label}: deliberate difference, not compared");
            }
            format!("{label}: {}", render(observed, &aliases))
        })
        .collect()
}

fn objects(observed: &Observed) -> Vec<&Value> {
    match observed {
        Observed::Object(object) => vec![object],
        Observed::List { items, .. } => items.iter().collect(),
        Observed::Events(events) => events.iter().map(|(_, object)| object).collect(),
        Observed::Error { .. } | Observed::Bookmark { .. } => Vec::new(),
    }
}

fn collect(object: &Value, aliases: &mut Aliases, versions: &mut BTreeMap<String, Vec<u64>>) {
    let mut uids = Vec::new();
    if let Some(uid) = object.pointer("/metadata/uid").and_then(Value::as_str) {
        uids.push(uid.to_string());
    }
    for owner in object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(uid) = owner.get("uid").and_then(Value::as_str) {
            uids.push(uid.to_string());
        }
    }
    // A uid stands for the name it was first seen with and how many uids that name had
    // before, so one object more on one side does not shift every later alias.
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("owner");
    // A generated name's random suffix is left out.
    let name = if is_generated(name) {
        &name[..name.len() - 5]
    } else {
        name
    };
    for uid in uids {
        if aliases.uids.contains_key(&uid) {
            continue;
        }
        let earlier = aliases
            .uids
            .values()
            .filter(|alias| alias.starts_with(&format!("uid:{name}#")))
            .count();
        aliases.uids.insert(uid, format!("uid:{name}#{earlier}"));
    }
    if let Some(name) = object.pointer("/metadata/name").and_then(Value::as_str)
        && is_generated(name)
    {
        let next = format!("gen-#{}", aliases.names.len());
        aliases.names.entry(name.to_string()).or_insert(next);
    }
    if let Some(version) = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|version| version.parse().ok())
    {
        let uid = object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        versions.entry(uid.to_string()).or_default().push(version);
    }
}

fn is_generated(name: &str) -> bool {
    name.starts_with("gen-") && name.len() == "gen-000-".len() + 5
}

fn render(observed: &Observed, aliases: &Aliases) -> String {
    match observed {
        Observed::Object(object) => canonical(&object_form(object, aliases)),
        Observed::List { items, more } => {
            let items: Vec<String> = items
                .iter()
                .filter(|item| !from_the_server(item))
                .map(|item| canonical(&object_form(item, aliases)))
                .collect();
            format!("list more={more} [{}]", items.join(", "))
        }
        Observed::Error { code, reason } => format!("error {code} {reason}"),
        Observed::Events(events) => {
            // A MODIFIED that repeats the object's last event is a write that changed only the
            // bytes the real server stored (see `object_form`): left out.
            let mut last: BTreeMap<String, String> = BTreeMap::new();
            let events: Vec<String> = events
                .iter()
                .filter(|(_, object)| !from_the_server(object))
                .filter_map(|(kind, object)| {
                    let form = canonical(&object_form(object, aliases));
                    let uid = object
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let repeated = kind == "MODIFIED" && last.get(uid) == Some(&form);
                    last.insert(uid.to_string(), form.clone());
                    (!repeated).then(|| format!("{kind} {form}"))
                })
                .collect();
            format!("events [{}]", events.join(", "))
        }
        Observed::Bookmark { not_older } => {
            format!("bookmark not older than the newest write: {not_older}")
        }
    }
}

/// An Event the real server wrote itself (its cluster IP repair reports on the trace's
/// Services): left out, as the in-memory server has no such loops (crate docs).
fn from_the_server(object: &Value) -> bool {
    let event = object.get("involvedObject").is_some() || object.get("regarding").is_some();
    event && object.get("reason").and_then(Value::as_str) != Some("Traced")
}

fn object_form(object: &Value, aliases: &Aliases) -> Value {
    let mut object = object.clone();
    if let Some(uid) = object.pointer("/details/uid").and_then(Value::as_str) {
        let alias = aliases
            .uids
            .get(uid)
            .cloned()
            .unwrap_or_else(|| "uid?".into());
        object["details"]["uid"] = Value::from(alias);
    }
    if let Some(name) = object.pointer("/details/name").and_then(Value::as_str)
        && let Some(alias) = aliases.names.get(name)
    {
        object["details"]["name"] = Value::from(alias.clone());
    }
    let event = object.get("involvedObject").is_some() || object.get("regarding").is_some();
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return object;
    };
    metadata.remove("creationTimestamp");
    metadata.remove("managedFields");
    if metadata.contains_key("deletionTimestamp") {
        metadata.insert("deletionTimestamp".into(), Value::from("set"));
    }
    if let Some(name) = metadata.get("name").and_then(Value::as_str)
        && let Some(alias) = aliases.names.get(name)
    {
        metadata.insert("name".into(), Value::from(alias.clone()));
    }
    let uid = metadata
        .get("uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if event {
        // Listed as deliberate (crate docs): whether an Event write that changes nothing served
        // makes a new version depends on which group wrote it last on the real server.
        metadata.insert("resourceVersion".into(), Value::from("not compared"));
    } else if let Some(version) = metadata.get("resourceVersion").and_then(Value::as_str) {
        let alias = version
            .parse::<u64>()
            .ok()
            .and_then(|version| aliases.versions.get(&(uid.clone(), version)).cloned())
            .unwrap_or_else(|| "rv?".into());
        metadata.insert("resourceVersion".into(), Value::from(alias));
    }
    if !uid.is_empty() {
        let alias = aliases
            .uids
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| "uid?".into());
        metadata.insert("uid".into(), Value::from(alias));
    }
    if let Some(owners) = metadata
        .get_mut("ownerReferences")
        .and_then(Value::as_array_mut)
    {
        for owner in owners {
            if let Some(uid) = owner.get("uid").and_then(Value::as_str) {
                let alias = aliases
                    .uids
                    .get(uid)
                    .cloned()
                    .unwrap_or_else(|| "uid?".into());
                owner["uid"] = Value::from(alias);
            }
        }
    }
    // Cluster IPs are allocated from a range by the real server, at random.
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        for field in ["clusterIP", "clusterIPs"] {
            if spec.contains_key(field) {
                spec.insert(field.into(), Value::from("allocated"));
            }
        }
    }
    object
}

/// JSON with keys sorted, whatever order the map kept.
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, String> = map
                .iter()
                .map(|(key, value)| (key, canonical(value)))
                .collect();
            let fields: Vec<String> = sorted
                .into_iter()
                .map(|(key, value)| format!("{}:{value}", Value::from(key.as_str())))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}
