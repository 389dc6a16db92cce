//! Watches: watcher → backoff → strip → cache → dispatch.
//!
//! Every replica runs these all the time, so a standby's caches are warm when it takes over.
//! The cache is updated before the change is dispatched: a term that starts between the two
//! either replays the new object or receives the dispatch (or both; the queue deduplicates), so
//! no change falls between a replay and the handlers.

use std::{fmt::Debug, sync::Arc};

use futures::StreamExt;
use kube::{
    Api, Resource,
    runtime::{WatchStreamExt, watcher},
};
use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::cache::{Cache, Change};

/// What a cached object can shed: the fields the controller never reads. Memory at scale is
/// dominated by the cached objects themselves (docs/benchmarks.md, "Scale and memory"), so each
/// kind drops what neither the planner nor the event mapping looks at.
pub trait Strip: Resource {
    /// Drops unread fields in place.
    fn strip(&mut self) {
        strip_meta(self);
    }
}

/// Every kind: managedFields (often the largest part of an object) and the last-applied
/// annotation.
fn strip_meta<K: Resource + ?Sized>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

// === impl Strip ===

impl Strip for Service {
    /// Status and annotations are never read (slices copy the Service's labels only).
    fn strip(&mut self) {
        strip_meta(self);
        self.metadata.annotations = None;
        self.status = None;
    }
}

impl Strip for ExternalWorkload {
    /// The mesh identity is not used for slices; of the status only the Ready condition's
    /// status is read.
    fn strip(&mut self) {
        strip_meta(self);
        self.metadata.annotations = None;
        self.spec.mesh_tls = Default::default();
        if let Some(status) = self.status.as_mut() {
            status
                .conditions
                .retain(|c| c.type_ == api::READY_CONDITION);
            for condition in &mut status.conditions {
                *condition = api::v1beta1::Condition {
                    type_: std::mem::take(&mut condition.type_),
                    status: std::mem::take(&mut condition.status),
                    ..Default::default()
                };
            }
            status.conditions.shrink_to_fit();
        }
    }
}

impl Strip for EndpointSlice {
    /// Annotations stay (an update carries them over); the endpoint list gives back the spare
    /// capacity left by decoding.
    fn strip(&mut self) {
        strip_meta(self);
        if let Some(endpoints) = self.endpoints.as_mut() {
            endpoints.shrink_to_fit();
        }
    }
}

/// The counters of one watch.
#[derive(Clone, Debug, Default)]
pub struct WatchCounters {
    /// Errors, each retried with backoff.
    pub errors: Counter,
    /// Complete lists after the first (after a 410 Gone, or a watch that could not resume).
    pub relists: Counter,
}

/// Runs one watch until `shutdown`, keeping `cache` current and handing every change to
/// `dispatch` after the cache holds it. `on_synced` runs once, after the first complete list.
///
/// A re-list fills a new cache beside the current one, which keeps serving (and planning) until
/// the list is complete; then the two are swapped and the differences dispatched. A plan never
/// sees a half-listed cache, so a re-list alone never deletes a slice that should stay.
pub async fn run<K, D>(
    api: Api<K>,
    config: watcher::Config,
    cache: Arc<Cache<K>>,
    mut dispatch: D,
    on_synced: impl FnOnce(),
    counters: WatchCounters,
    shutdown: CancellationToken,
) where
    K: Strip + Clone + Debug + Send + Sync + serde::de::DeserializeOwned + 'static,
    K::DynamicType: Default,
    D: FnMut(Change<K>),
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, config).default_backoff().modify(Strip::strip);
    futures::pin_mut!(stream);
    let mut on_synced = Some(on_synced);
    let mut listing = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => event,
        };
        let event = match event {
            None => return,
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                counters.errors.inc();
                tracing::warn!(%kind, %error, "watch failed; retrying with backoff");
                continue;
            }
        };
        match event {
            watcher::Event::Apply(object) => dispatch(cache.apply(object)),
            watcher::Event::Delete(object) => dispatch(cache.delete(object)),
            watcher::Event::Init => listing = Some(cache.relist()),
            watcher::Event::InitApply(object) => {
                let relist = listing.get_or_insert_with(|| cache.relist());
                cache.relist_insert(relist, object);
            }
            watcher::Event::InitDone => {
                let relist = listing.take().unwrap_or_else(|| cache.relist());
                let count = relist.len();
                for change in cache.finish_relist(relist) {
                    dispatch(change);
                }
                tracing::debug!(%kind, objects = count, "list complete");
                match on_synced.take() {
                    Some(on_synced) => {
                        tracing::info!(%kind, objects = count, "cache synced");
                        on_synced();
                    }
                    None => {
                        counters.relists.inc();
                        tracing::info!(%kind, objects = count, "re-listed");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use slices::testing::{Svc, Workload};

    use super::*;

    #[test]
    fn stripped_workload_keeps_what_the_planner_reads() {
        let mut workload: ExternalWorkload = Workload::named("vm-1")
            .label("app", "web")
            .ip("10.0.0.1")
            .port("http", 8080)
            .ready()
            .build();
        let before = workload.clone();
        workload.strip();
        assert!(workload.is_ready());
        assert_eq!(workload.spec.workload_ips, before.spec.workload_ips);
        assert_eq!(workload.spec.ports, before.spec.ports);
        assert_eq!(workload.metadata.labels, before.metadata.labels);
        assert!(workload.spec.mesh_tls.identity.is_empty());
        let plan_inputs_equal = |a: &ExternalWorkload, b: &ExternalWorkload| {
            a.is_ready() == b.is_ready() && a.zone() == b.zone() && a.metadata.uid == b.metadata.uid
        };
        assert!(plan_inputs_equal(&workload, &before));
    }

    #[test]
    fn stripped_service_keeps_spec_and_labels() {
        let mut service: Service = Svc::named("web")
            .selector("app", "web")
            .label("team", "x")
            .port("http", 80, "http")
            .build();
        service.metadata.annotations = Some([("note".to_string(), "x".to_string())].into());
        let before = service.clone();
        service.strip();
        assert_eq!(service.spec, before.spec);
        assert_eq!(service.metadata.labels, before.metadata.labels);
        assert!(service.metadata.annotations.is_none());
    }
}
