//! The cluster core in one process, for scenario tests at its own level: the real [`Caches`],
//! handlers, reconcile, tracker and fenced writer, under the real leadership [`Runtime`], in
//! paused time.
//!
//! ```text
//!  test ──feed──► Caches ─► dispatch(handlers) ─► queue ─► reconcile ─► FakeApi
//!   │                ▲                                                          │
//!   │                └──── slice watch (delay set by the test, or held) ◄── SliceServer
//!   └── leadership sender (lead / follow) ──► Runtime (testing::external_elector)
//! ```
//!
//! The test plays the watches of Services and workloads ([`Feed`]: each change goes into the
//! cache, then through the dispatcher, as the real watches do it) and the elector (it publishes terms
//! by hand). The API server is a [`SliceServer`]: it stores what the writer sends, refuses
//! stale versions with 409, and its slice watch delivers every change back to the caches after
//! a delay the test sets, or holds them back (a watch lagging behind our writes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{sync::Arc, time::Duration};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use leadership::{
    QueueMetrics, Runtime, RuntimeConfig, RuntimeError,
    testing::{self, LeadershipSender},
};
use prometheus_client::registry::Registry;
use slices::{CachedService, CachedSlice, CachedWorkload};
use tokio::{
    task::JoinHandle,
    time::{Instant, sleep},
};
use tokio_util::sync::CancellationToken;

use super::{FakeApi, SliceEvent, SliceServer};
use crate::{
    app::App,
    caches::Caches,
    events::Diagnostics,
    handlers::{self, ServiceDispatcher},
    health::CacheHealth,
    metrics::{Metrics, Outcome, OutcomeLabels},
    reconcile::Shared,
    watch::{fresh::Freshness, health::KindHealth},
    writer::WriteRate,
};

/// How long the slice watch takes to deliver a change, unless a test holds it back.
pub const WATCH_DELAY: Duration = Duration::from_millis(20);

/// How long [`wait_until`] waits (in paused time) before failing the test.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// The cluster core, running: see the module docs.
pub struct Core {
    feed: Feed,
    server: Arc<SliceServer>,
    shared: Arc<Shared<FakeApi>>,
    queue: QueueMetrics,
    leadership: LeadershipSender,
    shutdown: CancellationToken,
    runtime: Option<JoinHandle<Result<(), RuntimeError>>>,
    slice_watch: JoinHandle<()>,
}

/// Plays the watches: each change goes into its cache, then (while leading) through the
/// handlers, in that order, as the real watches do it.
#[derive(Clone)]
pub struct Feed {
    caches: Arc<Caches>,
    dispatcher: ServiceDispatcher,
    config: slices::Config,
}

// === impl Core ===

impl Core {
    /// Starts the core as a follower with empty caches; a Service waits on a cache behind its
    /// writes for at most `stale_limit`. Needs a tokio runtime (paused time).
    pub fn start(stale_limit: Duration) -> Self {
        let server = SliceServer::new(WATCH_DELAY);
        let caches = Arc::new(Caches::new());
        let config = slices::Config::default();
        let shared = Arc::new(Shared {
            caches: caches.clone(),
            config: config.clone(),
            api: FakeApi::backed_by(server.clone()),
            diagnostics: Diagnostics::default(),
            metrics: Metrics::register(&mut Registry::default()),
            write_rate: WriteRate::unlimited(),
            stale_limit,
            // Fed by hand: no watch ever loses its stream.
            health: CacheHealth::new(["Service", "ExternalWorkload", "EndpointSlice"].map(
                |kind| Arc::new(KindHealth::new(kind, Duration::from_secs(30)).0),
            )),
            catch_up: true,
        });
        // The production reconciler; its barrier covers no cache, as the test feeds the caches
        // itself (the barrier is tested in `watch::fresh` and by the simulation).
        let app = App::new(
            shared.clone(),
            Freshness::new(Vec::new()),
            shared.metrics.clone(),
        );
        let runtime = Runtime::new(runtime_config(), app);
        let feed = Feed {
            caches,
            dispatcher: runtime.dispatcher(),
            config,
        };
        let queue = runtime.queue_metrics();
        let (leadership, published) = tokio::sync::watch::channel(None);
        let shutdown = CancellationToken::new();
        let elector = testing::external_elector(published);
        let runtime = tokio::spawn(runtime.run(elector, shutdown.clone()));
        let watch_feed = feed.clone();
        let slice_watch = tokio::spawn(
            server
                .clone()
                .run_watch(move |event| watch_feed.slice(event)),
        );
        Self {
            feed,
            server,
            shared,
            queue,
            leadership,
            shutdown,
            runtime: Some(runtime),
            slice_watch,
        }
    }

    /// The watches of Services and workloads.
    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    /// The API server's slices and the slice watch.
    pub fn server(&self) -> &SliceServer {
        &self.server
    }

    /// The writer's API: its calls, injected failures.
    pub fn api(&self) -> &FakeApi {
        &self.shared.api
    }

    /// The caches.
    pub fn caches(&self) -> &Caches {
        &self.shared.caches
    }

    /// The controller's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The sender the elector would own (to end a term from inside a write).
    pub fn leadership(&self) -> LeadershipSender {
        self.leadership.clone()
    }

    /// Publishes a new term (as an acquisition does) without waiting for the runtime to see it.
    pub fn publish_term(&self) -> u64 {
        let term = testing::unbounded_term();
        let id = term.id();
        self.leadership.send_replace(Some(term));
        id
    }

    /// Acquires a new term and waits until its handlers are registered and the caches replayed.
    pub async fn lead(&self) -> u64 {
        let id = self.publish_term();
        let dispatcher = self.feed.dispatcher.clone();
        wait_until("the term's handlers registered", || {
            dispatcher.dispatch(|context| context.term().id()) == Some(id)
        })
        .await;
        id
    }

    /// Loses the term and waits until its handlers are deregistered.
    pub async fn follow(&self) {
        self.leadership.send_replace(None);
        let dispatcher = self.feed.dispatcher.clone();
        wait_until("the handlers deregistered", || {
            dispatcher.dispatch(|_| ()).is_none()
        })
        .await;
    }

    /// Reconciles that ended with `outcome`, so far.
    pub fn outcomes(&self, outcome: Outcome) -> u64 {
        let labels = OutcomeLabels { outcome };
        self.metrics()
            .reconcile_duration
            .get_or_create(&labels)
            .count()
    }

    /// Calls of the writer starting with `prefix` (`"create"`, `"replace web-"`, ...), so far.
    pub fn calls_to(&self, prefix: &str) -> usize {
        let calls = self.api().calls();
        calls.iter().filter(|call| call.starts_with(prefix)).count()
    }

    /// Every address the stored slices of Service `name` publish, each as often as published.
    pub fn published(&self, name: &str) -> Vec<String> {
        let mut addresses: Vec<String> = self
            .server
            .slices_of(slices::testing::NAMESPACE, name)
            .into_iter()
            .flat_map(|slice| slice.endpoints.unwrap_or_default())
            .flat_map(|endpoint| endpoint.addresses)
            .collect();
        addresses.sort();
        addresses
    }

    /// Waits until the stored slices of Service `name` publish exactly `addresses`, each once.
    pub async fn wait_published(&self, name: &str, addresses: &[&str]) {
        let mut expected: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        expected.sort();
        wait_until(&format!("{name} publishes {addresses:?}"), || {
            self.published(name) == expected
        })
        .await;
    }

    /// Whether nothing is left to do: queue empty, nothing in flight or waiting for a retry,
    /// every change delivered by the slice watch.
    pub fn is_idle(&self) -> bool {
        let queue = &self.queue;
        queue.depth() + queue.waiting() + queue.in_flight() == 0 && self.server.undelivered() == 0
    }

    /// Waits until [`is_idle`](Self::is_idle).
    pub async fn settle(&self) {
        wait_until("the core to be idle", || self.is_idle()).await;
    }

    /// Shuts down as on SIGTERM and checks that the runtime stopped cleanly.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let runtime = self.runtime.take().expect("running");
        runtime
            .await
            .expect("the runtime task")
            .expect("a clean stop");
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.slice_watch.abort();
        if let Some(runtime) = &self.runtime {
            runtime.abort();
        }
    }
}

/// Two workers (so that two Services can be in flight at once), no periodic resync (a test
/// sees only what events and replays cause), the default queue pacing.
fn runtime_config() -> RuntimeConfig {
    RuntimeConfig::builder()
        .workers(2)
        .drain_timeout(Duration::from_secs(1))
        .fence_margin(Duration::from_secs(1))
        .resync_period(None)
        .build()
        .expect("a valid runtime config")
}

// === impl Feed ===

impl Feed {
    /// A Service added or updated.
    pub fn apply_service(&self, service: &Service) {
        let cached = CachedService::new(service, &*self.caches.interner);
        let change = self.caches.services.apply(cached);
        self.dispatcher
            .dispatch(|context| handlers::on_service(context, &change));
    }

    /// A workload added or updated.
    pub fn apply_workload(&self, workload: &ExternalWorkload) {
        let cached = CachedWorkload::new(workload, &*self.caches.interner);
        let change = self.caches.workloads.apply(cached);
        self.dispatcher
            .dispatch(|context| handlers::on_workload(context, &self.caches, &change));
    }

    /// A workload deleted.
    pub fn delete_workload(&self, workload: &ExternalWorkload) {
        let cached = CachedWorkload::new(workload, &*self.caches.interner);
        let change = self.caches.workloads.delete(cached);
        self.dispatcher
            .dispatch(|context| handlers::on_workload(context, &self.caches, &change));
    }

    /// A slice change delivered by the slice watch.
    fn slice(&self, event: SliceEvent) {
        let change = match event {
            SliceEvent::Applied(slice) => {
                let cached = CachedSlice::new(&slice, &*self.caches.interner);
                self.caches.slices.apply(cached)
            }
            SliceEvent::Deleted(slice) => {
                let cached = CachedSlice::new(&slice, &*self.caches.interner);
                self.caches.slices.delete(cached)
            }
        };
        self.dispatcher
            .dispatch(|context| handlers::on_slice(context, &self.config, &change));
    }
}

/// Waits (in paused time, polling every 10 ms) until `condition` holds; fails the test after
/// [`WAIT_LIMIT`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_LIMIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(10)).await;
    }
}
