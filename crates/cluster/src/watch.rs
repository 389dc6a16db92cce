//! Watches: watcher → backoff → project → cache → dispatch.
//!
//! Every replica runs these all the time, so a standby's caches are warm when it takes over.
//! Each object is reduced to its cached form as it arrives (the decoded API object is dropped
//! at once). The cache is updated before the change is dispatched: a term that starts between
//! the two either replays the new object or receives the dispatch (or both; the queue
//! deduplicates), so no change falls between a replay and the handlers.
//!
//! The initial list and every re-list use the API server's streaming list (a watch with
//! `sendInitialEvents`, Kubernetes 1.27+, on by default since 1.32) when it is offered; a server
//! that refuses it gets paged lists instead (see [`run`]).

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
use slices::{CachedService, CachedSlice, CachedWorkload};

use crate::{
    intern::Interner,
    store::{Cached, Change, Store},
};

/// An API kind and its cached form.
pub trait Project:
    Resource + Clone + Debug + Send + Sync + serde::de::DeserializeOwned + 'static
{
    /// The cached form.
    type Cached: Cached;

    /// Reduces `self` to what the controller reads.
    fn project(&self, interner: &Interner) -> Self::Cached;
}

// === impl Project ===

impl Project for Service {
    type Cached = CachedService;

    fn project(&self, interner: &Interner) -> CachedService {
        CachedService::new(self, interner)
    }
}

impl Project for ExternalWorkload {
    type Cached = CachedWorkload;

    fn project(&self, interner: &Interner) -> CachedWorkload {
        CachedWorkload::new(self, interner)
    }
}

impl Project for EndpointSlice {
    type Cached = CachedSlice;

    fn project(&self, interner: &Interner) -> CachedSlice {
        CachedSlice::new(self, interner)
    }
}

/// Whether a failed watch start means the server does not offer streaming lists (so paged
/// lists must be used): it rejects the `sendInitialEvents` watch as invalid (400, 422) or not
/// implemented (501) rather than failing for a passing reason.
fn streaming_list_refused(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => {
            matches!(status.code, 400 | 422 | 501)
        }
        watcher::Error::WatchError(status) => matches!(status.code, 400 | 422 | 501),
        _ => false,
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
/// Lists stream when the server allows (`config` gets the streaming-list strategy); when the
/// server refuses the streaming watch, the watch restarts with paged lists for good.
///
/// A re-list updates the cache in place and removes what the list no longer holds only once it
/// is complete, so a plan never sees an object missing that still exists: a re-list alone never
/// deletes a slice that should stay. Each complete list after the first counts as a re-list.
#[allow(clippy::too_many_arguments)] // one watch's whole wiring, passed once
pub async fn run<K, D>(
    api: Api<K>,
    config: watcher::Config,
    cache: Arc<Store<K::Cached>>,
    interner: Arc<Interner>,
    mut dispatch: D,
    on_synced: impl FnOnce(),
    counters: WatchCounters,
    shutdown: CancellationToken,
) where
    K: Project,
    K::DynamicType: Default,
    D: FnMut(Change<K::Cached>),
{
    let mut on_synced = Some(on_synced);
    let mut streaming = true;
    loop {
        let config = if streaming {
            config.clone().streaming_lists()
        } else {
            config.clone()
        };
        let stream = watcher(api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        let mut listing = None;
        let mut listed_once = false;
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
                    if streaming && !listed_once && streaming_list_refused(&error) {
                        tracing::info!(%error, "streaming list refused; using paged lists");
                        streaming = false;
                        break;
                    }
                    tracing::warn!(%error, "watch failed; retrying with backoff");
                    continue;
                }
            };
            match event {
                watcher::Event::Apply(object) => {
                    dispatch(cache.apply(object.project(&interner)));
                }
                watcher::Event::Delete(object) => {
                    dispatch(cache.delete(object.project(&interner)));
                }
                watcher::Event::Init => listing = Some(cache.relist()),
                watcher::Event::InitApply(object) => {
                    let relist = listing.get_or_insert_with(|| cache.relist());
                    let projected = object.project(&interner);
                    drop(object);
                    if let Some(change) = cache.relist_apply(relist, projected) {
                        dispatch(change);
                    }
                }
                watcher::Event::InitDone => {
                    listed_once = true;
                    let relist = listing.take().unwrap_or_else(|| cache.relist());
                    let count = relist.listed();
                    for change in cache.finish_relist(relist) {
                        dispatch(change);
                    }
                    tracing::debug!(objects = count, streaming, "list complete");
                    match on_synced.take() {
                        Some(on_synced) => {
                            tracing::info!(objects = count, streaming, "cache synced");
                            on_synced();
                        }
                        None => {
                            counters.relists.inc();
                            tracing::info!(objects = count, streaming, "re-listed");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use slices::testing::{Svc, Workload};
    use slices::{Intern, Token};

    use super::*;

    #[test]
    fn projected_workload_keeps_what_the_planner_reads() {
        let workload: ExternalWorkload = Workload::named("vm-1")
            .label("app", "web")
            .zone("z1")
            .ip("10.0.0.1")
            .port("http", 8080)
            .ready()
            .build();
        let interner = Interner::new();
        let cached = workload.project(&interner);
        assert!(cached.ready);
        assert_eq!(cached.zone(), Some("z1"));
        assert_eq!(cached.labels.get("app"), Some("web"));
        assert_eq!(cached.uid, Some(Token::parse("uid-ew-vm-1")));
        assert_eq!(cached.ports.len(), 1);
        assert_eq!(cached, CachedWorkload::from(&workload));
    }

    #[test]
    fn only_a_rejected_streaming_watch_switches_to_paged_lists() {
        let api = |code| {
            watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(
                kube::core::Status::failure("refused", "Invalid").with_code(code),
            )))
        };
        assert!(streaming_list_refused(&api(422)));
        assert!(streaming_list_refused(&api(400)));
        assert!(!streaming_list_refused(&api(500)), "a passing failure");
        assert!(
            !streaming_list_refused(&api(403)),
            "not a question of the list mode"
        );
        assert!(!streaming_list_refused(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn projections_share_equal_strings() {
        let interner = Interner::new();
        let service: Service = Svc::named("web").selector("app", "web").build();
        let workload: ExternalWorkload = Workload::named("vm-1").label("app", "web").build();
        let service = service.project(&interner);
        let workload = workload.project(&interner);
        assert!(Arc::ptr_eq(&service.namespace, &workload.namespace));
        assert!(Arc::ptr_eq(&service.name, &interner.intern("web")));
    }
}
