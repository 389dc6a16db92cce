//! Watches: source (list, watch, resume, stall bound) → project → cache → sink (dispatch) → health.
//!
//! Every replica runs these all the time, so a standby's caches are warm when it takes over.
//! Each object is reduced to its cached form as it arrives (the decoded API object is dropped
//! at once). The cache is updated before the change is dispatched: a term that starts between
//! the two either replays the new object or receives the dispatch (or both; the queue
//! deduplicates), so no change falls between a replay and the handlers.
//!
//! The initial list uses the API server's streaming list (a watch with `sendInitialEvents`,
//! Kubernetes 1.27+, on by default since 1.32) when it is offered; a server that refuses it gets
//! paged lists instead. A re-list updates the cache in place and removes what the list no longer
//! holds only once it is complete, so a plan never sees an object missing that still exists.

pub mod fresh;
pub mod health;
pub mod source;
#[cfg(test)]
mod stall_tests;

use std::{fmt::Debug, sync::Arc};

use kube::Resource;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use slices::{CachedService, CachedSlice, CachedWorkload};

use crate::{
    intern::Interner,
    store::{Cached, Change, Store},
};

use self::{
    health::{KindHealth, version_number},
    source::{Event, Source},
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

/// Where a watch sends each change once it is in the cache.
pub trait ChangeSink<C>: Send + 'static {
    /// Takes `change`, whose event the watch read at `received`.
    fn send(&mut self, change: Change<C>, received: Instant);
}

/// Runs one watch until `shutdown`: each event from `source` goes into `cache`, then to `sink`,
/// then its position is reported to `health` (so that whoever waits on `health` finds the cache
/// holding what was reported).
pub async fn run<K: Project>(
    mut source: Source<K>,
    cache: Arc<Store<K::Cached>>,
    interner: Arc<Interner>,
    health: Arc<KindHealth>,
    mut sink: impl ChangeSink<K::Cached>,
    shutdown: CancellationToken,
) {
    let mut listing = None;
    loop {
        let event = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            event = source.next() => event,
        };
        let received = Instant::now();
        match event {
            Event::Apply(object) => {
                let version = version_of(&object);
                if let Some(change) = cache.apply(object.project(&interner)) {
                    sink.send(change, received);
                }
                health.seen(Some(version));
            }
            Event::Delete(object) => {
                let version = version_of(&object);
                if let Some(change) = cache.delete(object.project(&interner)) {
                    sink.send(change, received);
                }
                health.seen(Some(version));
            }
            Event::ListStart => listing = Some(cache.relist()),
            Event::Listed(object) => {
                let relist = listing.get_or_insert_with(|| cache.relist());
                let projected = object.project(&interner);
                drop(object);
                if let Some(change) = cache.relist_apply(relist, projected) {
                    sink.send(change, received);
                }
            }
            Event::ListDone(position) => {
                let relist = listing.take().unwrap_or_else(|| cache.relist());
                let count = relist.listed();
                for change in cache.finish_relist(relist, position.version) {
                    sink.send(change, received);
                }
                if health.is_synced() {
                    source.count_relist();
                    tracing::info!(objects = count, "re-listed");
                } else {
                    tracing::info!(objects = count, "cache synced");
                }
                health.seen(Some(position.version));
                health.listed();
                health.answer(position.answers);
            }
            Event::Progress(position) => {
                health.seen(Some(position.version));
                health.answer(position.answers);
            }
        }
    }
}

fn version_of<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .map_or(0, version_number)
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
