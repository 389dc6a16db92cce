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

use crate::cache::{Cache, Change};

/// Removes what the controller never reads from a cached object, to keep memory low at scale:
/// managedFields (often the largest part of an object) and the last-applied annotation.
pub fn strip<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Runs one watch until `shutdown`, keeping `cache` current and handing every change to
/// `dispatch` after the cache holds it. `on_synced` runs once, after the first complete list.
pub async fn run<K, D>(
    api: Api<K>,
    config: watcher::Config,
    cache: Arc<Cache<K>>,
    mut dispatch: D,
    on_synced: impl FnOnce(),
    errors: Counter,
    shutdown: CancellationToken,
) where
    K: Resource + Clone + Debug + Send + Sync + serde::de::DeserializeOwned + 'static,
    K::DynamicType: Default,
    D: FnMut(Change<K>),
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, config).default_backoff().modify(strip::<K>);
    futures::pin_mut!(stream);
    let mut on_synced = Some(on_synced);
    let mut listing: Option<Vec<K>> = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => event,
        };
        let event = match event {
            None => return,
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                errors.inc();
                tracing::warn!(%kind, %error, "watch failed; retrying with backoff");
                continue;
            }
        };
        match event {
            watcher::Event::Apply(object) => dispatch(cache.apply(object)),
            watcher::Event::Delete(object) => dispatch(cache.delete(object)),
            watcher::Event::Init => listing = Some(Vec::new()),
            watcher::Event::InitApply(object) => listing.get_or_insert_with(Vec::new).push(object),
            watcher::Event::InitDone => {
                let objects = listing.take().unwrap_or_default();
                let count = objects.len();
                for change in cache.replace(objects) {
                    dispatch(change);
                }
                tracing::debug!(%kind, objects = count, "list complete");
                if let Some(on_synced) = on_synced.take() {
                    tracing::info!(%kind, objects = count, "cache synced");
                    on_synced();
                }
            }
        }
    }
}
