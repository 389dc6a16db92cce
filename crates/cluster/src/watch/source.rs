//! The source of one watch: the [watch loop](kube_watch_loop) of the `kube-watch-loop` crate (list,
//! then watch from the list's resourceVersion, resuming from the last version read, with a bound
//! on silence; see its docs for the states and why not kube-runtime's watcher), reporting to
//! this kind's [`KindHealth`] and counters, and taking its commands.
//!
//! The stall bound is the kind's: the server is asked for a sixth of it as each stream's timeout,
//! so a watch that hears nothing for the bound is stalled (docs/operations.md, "Quiet faults").

use std::sync::Arc;

use kube::{Api, Resource};
use kube_watch_loop::{WatchConfig, WatchHooks, WatchLoop};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use super::health::{Command, KindHealth};

pub use kube_watch_loop::Event;

/// The counters of one watch.
#[derive(Clone, Debug, Default)]
pub struct WatchCounters {
    /// Errors, each retried with backoff.
    pub errors: Counter,
    /// Complete lists after the first (after a 410 Gone, a stall, or a request).
    pub relists: Counter,
    /// Streams that were silent past the stall bound.
    pub stalls: Counter,
}

/// The source of one watch's events (see the module docs).
pub struct Source<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    watch: WatchLoop<Api<K>, Report>,
}

/// What the loop reports, into the kind's health and counters.
struct Report {
    health: Arc<KindHealth>,
    counters: WatchCounters,
}

// === impl Source ===

impl<K> Source<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    /// A watch of `api` (objects with `labels`, when given) reporting to `health`.
    pub fn new(
        api: Api<K>,
        labels: Option<String>,
        health: Arc<KindHealth>,
        commands: mpsc::UnboundedReceiver<Command>,
        counters: WatchCounters,
    ) -> Self {
        let mut config = WatchConfig::new(health.stall_bound());
        if let Some(labels) = labels {
            config = config.labels(labels);
        }
        let watch =
            WatchLoop::new(api, config, Report { health, counters }).with_commands(commands);
        Self { watch }
    }

    /// The next event; retries, resumes and re-lists on its own, so it never ends. A command
    /// interrupts whatever the source waits for (a stream, a request that gets no answer, a
    /// backoff).
    pub async fn next(&mut self) -> Event<K> {
        self.watch.next().await
    }

    /// Re-lists counted for the metrics (the consumer knows which list is the first).
    pub fn count_relist(&self) {
        self.watch.hooks().counters.relists.inc();
    }
}

// === impl Report ===

impl WatchHooks for Report {
    fn latest_request(&self) -> u64 {
        self.health.latest_request()
    }

    fn listing(&self) {
        self.health.listing();
    }

    fn page_read(&self) {
        self.health.seen(None);
    }

    fn stalled(&self) {
        self.counters.stalls.inc();
        self.health.stall();
    }

    fn failed(&self) {
        self.counters.errors.inc();
    }

    fn lost(&self) {
        self.health.lost();
    }
}
