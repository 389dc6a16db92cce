//! `external-endpoints diff`: what the controller would write now, without writing.
//!
//! One LIST of each kind (each a consistent read), the planner of a replica that just took the
//! Lease ([`cluster::plan_all`]) with the controller's own settings, and per Service the slices
//! it would create, update (with the fields that change) or delete. Only reads.

use std::collections::BTreeMap;

use anyhow::Context as _;
use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt, api::ListParams};
use serde::Serialize;
use serde_json::Value;
use slices::{IDENTITY_DIGEST_ANNOTATION, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, MANAGED_BY_LABEL};

use crate::cli::Settings;

/// The writes planned for one Service.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServiceDiff {
    /// `namespace/name` of the Service.
    pub service: String,
    /// Slices that would be created: their `generateName` and number of endpoints.
    pub creates: Vec<Created>,
    /// Slices that would be replaced, with the fields that change.
    pub updates: Vec<Updated>,
    /// Names of the slices that would be deleted.
    pub deletes: Vec<String>,
}

/// A slice that would be created.
#[derive(Clone, Debug, Serialize)]
pub struct Created {
    /// Its `generateName`.
    pub generate_name: String,
    /// Its address type.
    pub address_type: String,
    /// Number of endpoints in it.
    pub endpoints: usize,
}

/// A slice that would be replaced.
#[derive(Clone, Debug, Serialize)]
pub struct Updated {
    /// Its name.
    pub name: String,
    /// The fields whose value changes (`endpoints`, `ports`, `metadata.labels`, ...;
    /// `identity-digest` for the identity digest annotation, docs/slices.md).
    pub fields: Vec<String>,
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
    /// `namespace/name: 1 create, 2 updates, 0 deletes`.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} create(s), {} update(s), {} delete(s)",
            self.service,
            self.creates.len(),
            self.updates.len(),
            self.deletes.len()
        )
    }

    /// The summary, then one indented line per write.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![self.summary()];
        for create in &self.creates {
            lines.push(format!(
                "  + create {}… ({}, {} endpoints)",
                create.generate_name, create.address_type, create.endpoints
            ));
        }
        for update in &self.updates {
            lines.push(format!(
                "  ~ update {}: {}",
                update.name,
                update.fields.join(", ")
            ));
        }
        for delete in &self.deletes {
            lines.push(format!("  - delete {delete}"));
        }
        lines
    }
}

/// Lists each kind once and plans every Service; the Services with something to write.
pub async fn run(client: &Client, settings: &Settings) -> anyhow::Result<Vec<ServiceDiff>> {
    let namespace = settings.args.watch_namespace.as_deref();
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
    let workloads: Vec<ExternalWorkload> = list(client, namespace, None).await?;
    let selector = format!("{MANAGED_BY_LABEL}={}", settings.slices.managed_by());
    let slices: Vec<EndpointSlice> = list(client, namespace, Some(&selector)).await?;

    let now = Time(Timestamp::now());
    let plans = cluster::plan_all(&services, &workloads, &slices, &settings.slices, &now);
    let current: BTreeMap<(String, String), &EndpointSlice> = (slices.iter())
        .map(|s| ((s.namespace().unwrap_or_default(), s.name_any()), s))
        .collect();
    let diffs = plans
        .into_iter()
        .map(|(key, plan)| ServiceDiff {
            service: format!("{}/{}", key.namespace, key.name),
            creates: (plan.creates.iter()).map(created).collect(),
            updates: (plan.updates.iter())
                .map(|slice| {
                    let at = (key.namespace.clone(), slice.name_any());
                    updated(current.get(&at).copied(), slice)
                })
                .collect(),
            deletes: plan.deletes.iter().map(ResourceExt::name_any).collect(),
        })
        .collect();
    Ok(diffs)
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

fn created(slice: &EndpointSlice) -> Created {
    Created {
        generate_name: slice.metadata.generate_name.clone().unwrap_or_default(),
        address_type: slice.address_type.clone(),
        endpoints: slice.endpoints.as_ref().map_or(0, Vec::len),
    }
}

/// The fields of `planned` that differ from the slice as listed (the trigger-time annotation,
/// which every write sets, aside). The identity digest annotation is named on its own,
/// `identity-digest`, not as `metadata.annotations`: it changes with the endpoints' workloads or
/// identities, and is added once to slices written without it (Linkerd's).
fn updated(current: Option<&EndpointSlice>, planned: &EndpointSlice) -> Updated {
    let name = planned.name_any();
    let Some(current) = current else {
        return Updated {
            name,
            fields: vec!["(not in the list)".into()],
        };
    };
    let comparable = |slice: &EndpointSlice| {
        let mut value = serde_json::to_value(slice).unwrap_or(Value::Null);
        if let Some(annotations) = value
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            annotations.remove(LAST_CHANGE_TRIGGER_TIME_ANNOTATION);
            annotations.remove(IDENTITY_DIGEST_ANNOTATION);
            if annotations.is_empty() {
                value["metadata"]
                    .as_object_mut()
                    .map(|m| m.remove("annotations"));
            }
        }
        value
    };
    let (before, after) = (comparable(current), comparable(planned));
    let mut fields: Vec<String> = FIELDS
        .iter()
        .filter(|(_, pointer)| before.pointer(pointer) != after.pointer(pointer))
        .map(|(field, _)| (*field).to_string())
        .collect();
    let digest = |slice: &EndpointSlice| {
        slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(IDENTITY_DIGEST_ANNOTATION))
            .cloned()
    };
    if digest(current) != digest(planned) {
        fields.push("identity-digest".into());
    }
    if fields.is_empty() {
        fields.push("(no compared field: only server-kept fields differ)".into());
    }
    Updated { name, fields }
}
