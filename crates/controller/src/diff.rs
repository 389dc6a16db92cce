//! `external-endpoints diff`: what the controller would write now, without writing.
//!
//! One LIST of each kind (each a consistent read), the planner of a replica that just took the
//! Lease ([`cluster::plan_all`]) with the settings of the installed controller (its Deployment's
//! flags, for those the operator did not give), and per Service the slices it would create,
//! update or delete, with their content: endpoints and ports added, removed or changed, and the
//! other fields that change. Only reads.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;
use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Service},
        discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt, api::ListParams};
use serde::Serialize;
use serde_json::Value;
use slices::{LAST_CHANGE_TRIGGER_TIME_ANNOTATION, MANAGED_BY_LABEL};

use crate::{
    cli::{Settings, Source},
    installed::{self, SearchError},
};

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

/// The planner's settings and where they came from.
struct Planner {
    config: slices::Config,
    watch_namespace: Option<String>,
    /// The Deployment whose flags were used, and how it was (or was not) found.
    note: Option<String>,
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
    fn between(live: Option<&EndpointSlice>, planned: Option<&EndpointSlice>) -> Self {
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
            other: other_changes(&before, &after),
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

/// Lists each kind once and plans every Service (or those `filter` names, `namespace/name` or
/// a name in the kubeconfig's namespace); the Services with something to write. Notes (the
/// flags planned with) go to stderr, so stdout holds only the diff.
pub async fn run(
    client: &Client,
    settings: &Settings,
    filter: &[String],
) -> anyhow::Result<Vec<ServiceDiff>> {
    let planner = planner(client, settings).await?;
    if let Some(note) = &planner.note {
        eprintln!("{note}");
    }
    let wanted: BTreeSet<(String, String)> = (filter.iter())
        .map(|service| match service.split_once('/') {
            Some((namespace, name)) => (namespace.to_string(), name.to_string()),
            None => (client.default_namespace().to_string(), service.clone()),
        })
        .collect();
    let scope: BTreeSet<&str> = wanted.iter().map(|(ns, _)| ns.as_str()).collect();
    if let Some(watched) = &planner.watch_namespace
        && let Some(outside) = scope.iter().find(|ns| **ns != watched.as_str())
    {
        anyhow::bail!(
            "the controller watches only namespace {watched} (--watch-namespace): it writes nothing in {outside}"
        );
    }
    // One namespace named by the filter: list only that one.
    let namespace = match (&planner.watch_namespace, scope.len()) {
        (Some(watched), _) => Some(watched.clone()),
        (None, 1) => scope.first().map(|ns| ns.to_string()),
        _ => None,
    };
    let namespace = namespace.as_deref();
    if let Some(namespace) = namespace {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let found = (namespaces.get_opt(namespace).await)
            .with_context(|| format!("reading namespace {namespace}"))?;
        anyhow::ensure!(
            found.is_some(),
            "--watch-namespace: namespace {namespace} does not exist"
        );
    }
    let services: Vec<Service> = list(client, namespace, None).await?;
    let known: BTreeSet<(String, String)> = (services.iter())
        .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    if let Some((namespace, name)) = wanted.difference(&known).next() {
        anyhow::bail!("Service {namespace}/{name} not found");
    }
    let workloads: Vec<ExternalWorkload> = list(client, namespace, None).await?;
    let selector = format!("{MANAGED_BY_LABEL}={}", planner.config.managed_by());
    let slices: Vec<EndpointSlice> = list(client, namespace, Some(&selector)).await?;

    let now = Time(Timestamp::now());
    let plans = cluster::plan_all(&services, &workloads, &slices, &planner.config, &now);
    let current: BTreeMap<(String, String), &EndpointSlice> = (slices.iter())
        .map(|s| ((s.namespace().unwrap_or_default(), s.name_any()), s))
        .collect();
    let live = |namespace: &str, slice: &EndpointSlice| {
        current
            .get(&(namespace.to_string(), slice.name_any()))
            .copied()
    };
    let diffs = (plans.into_iter())
        .filter(|(key, _)| {
            wanted.is_empty() || wanted.contains(&(key.namespace.clone(), key.name.clone()))
        })
        .map(|(key, plan)| ServiceDiff {
            service: format!("{}/{}", key.namespace, key.name),
            creates: (plan.creates.iter())
                .map(|slice| SliceDiff::between(None, Some(slice)))
                .collect(),
            updates: (plan.updates.iter())
                .map(|slice| SliceDiff::between(live(&key.namespace, slice), Some(slice)))
                .collect(),
            deletes: (plan.deletes.iter())
                .map(|slice| SliceDiff::between(live(&key.namespace, slice).or(Some(slice)), None))
                .collect(),
        })
        .collect();
    Ok(diffs)
}

/// The planner's settings: each flag the operator gave, else the installed controller's (when
/// every controller Deployment found agrees), else the default.
async fn planner(client: &Client, settings: &Settings) -> anyhow::Result<Planner> {
    let args = &settings.args;
    let sources = args.sources;
    let given = Planner {
        config: settings.slices.clone(),
        watch_namespace: args.watch_namespace.clone(),
        note: None,
    };
    let all_given = [
        sources.max_endpoints_per_slice,
        sources.managed_by,
        sources.slice_prefix,
        sources.watch_namespace,
    ]
    .iter()
    .all(|source| *source != Source::Default);
    if all_given {
        return Ok(given);
    }
    let found = match installed::find(client).await {
        Ok(found) => found,
        Err(error @ SearchError::Forbidden(_)) => {
            return Ok(Planner {
                note: Some(format!(
                    "note: cannot look for the installed controller ({error}); planning with the flags given and the defaults"
                )),
                ..given
            });
        }
        Err(SearchError::Failed(error)) => {
            return Err(error).context("listing the controller's Deployments");
        }
    };
    let mut plans: BTreeMap<(usize, String, String, Option<String>), Vec<String>> = BTreeMap::new();
    for installed in &found {
        let theirs = installed.args.as_ref().map_err(|error| {
            anyhow::anyhow!(
                "cannot read the flags of Deployment {}: {error}",
                installed.key()
            )
        })?;
        let pick = |source: Source, ours: String, theirs: String| match source {
            Source::Default => theirs,
            _ => ours,
        };
        let key = (
            match sources.max_endpoints_per_slice {
                Source::Default => theirs.max_endpoints_per_slice,
                _ => args.max_endpoints_per_slice,
            },
            pick(
                sources.managed_by,
                args.managed_by.clone(),
                theirs.managed_by.clone(),
            ),
            pick(
                sources.slice_prefix,
                args.slice_prefix.clone(),
                theirs.slice_prefix.clone(),
            ),
            match sources.watch_namespace {
                Source::Default => theirs.watch_namespace.clone(),
                _ => args.watch_namespace.clone(),
            },
        );
        plans.entry(key).or_default().push(installed.key());
    }
    let mut plans = plans.into_iter();
    let (Some(((max, managed_by, prefix, watch_namespace), deployments)), None) =
        (plans.next(), plans.next())
    else {
        return match found.is_empty() {
            // Nothing installed: the flags given and the defaults, silently (as before).
            true => Ok(given),
            false => {
                let all: Vec<String> = found.iter().map(installed::Installed::key).collect();
                anyhow::bail!(
                    "the installed controllers ({}) plan with different flags: give --max-endpoints-per-slice, --managed-by, --slice-prefix and --watch-namespace",
                    all.join(", ")
                )
            }
        };
    };
    let config = slices::Config::new(max, managed_by.clone(), prefix.clone())
        .map_err(|error| anyhow::anyhow!("the flags of {}: {error}", deployments.join(", ")))?;
    let note = format!(
        "note: planning with the flags of Deployment {}: --max-endpoints-per-slice={max} --managed-by={managed_by} --slice-prefix={prefix}{}",
        deployments.join(", "),
        watch_namespace
            .as_ref()
            .map_or(String::new(), |ns| format!(" --watch-namespace={ns}"))
    );
    Ok(Planner {
        config,
        watch_namespace,
        note: Some(note),
    })
}

/// One LIST of `K` (a consistent read: no resourceVersion, no paging).
async fn list<K>(
    client: &Client,
    namespace: Option<&str>,
    labels: Option<&str>,
) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let mut params = ListParams::default();
    if let Some(labels) = labels {
        params = params.labels(labels);
    }
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let list = api
        .list(&params)
        .await
        .with_context(|| format!("listing {kind}s"))?;
    Ok(list.items)
}
