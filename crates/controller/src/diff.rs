//! `external-endpoints diff`: what the controller would write now, without writing.
//!
//! One LIST of each kind (each a consistent read), the planner of a replica that just took the
//! Lease ([`cluster::plan_all`]) with the settings of the installed controller (its Deployment's
//! flags, for those the operator did not give), and per Service the slices it would create,
//! update or delete, with their content (`diff/content.rs`): endpoints and ports added, removed or
//! changed, and the other fields that change. Only reads.

mod content;

use std::collections::{BTreeMap, BTreeSet};

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
use slices::MANAGED_BY_LABEL;

pub use self::content::{
    Change, Changes, FieldChange, ServiceDiff, SliceDiff, describe_endpoint, describe_port,
};
use crate::{
    cli::{Settings, Source},
    installed::{self, SearchError},
};

/// The planner's settings and where they came from.
struct Planner {
    config: slices::Config,
    watch_namespace: Option<String>,
    /// The Deployment whose flags were used, and how it was (or was not) found.
    note: Option<String>,
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
