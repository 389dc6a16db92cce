//! Where a change's milliseconds go (issue 20): the time each Service key spends in each stage
//! between the watch event that triggered it and the answer to the write that published it.
//!
//! ```text
//!  event ─► handler ─► queue ─► reconcile ─► plan ─► [write rate limit] ─► write ─► answer
//!  └event_to_key┘ └queued┘        │                  └rate_limited┘    └write┘      │
//!                  (or coalesced: behind the key's own reconcile; view_wait / retry_wait:
//!                   after a reconcile that did not finish)                           │
//!  └────────────────────────── sync latency (trigger → answer) ──────────────────────┘
//!                                        answer ─► our watch shows the write: own_write_visible
//! ```
//!
//! Per term ([`crate::handlers::TermState`]), each key with a change not yet reconciled keeps
//! its *trigger*: when this replica's watch delivered the earliest such change (or when the
//! term's replay found the key). A reconcile takes the trigger when it starts and gives it back
//! when it does not finish (a wait of the fresh-view rule, conflict, fenced, error), so the latency of a change
//! includes every retry it took. The trigger is also the value of the
//! `endpoints.kubernetes.io/last-change-trigger-time` annotation of the slices written for it.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use parking_lot::Mutex;
use prometheus_client::{encoding::EncodeLabelSet, metrics::histogram::Histogram};
use prometheus_client::{encoding::EncodeLabelValue, metrics::family::Family};
use slices::ServiceKey;
use tokio::time::Instant;

/// A stage of a change's way to the API (the `stage` label of
/// `external_endpoints_stage_seconds`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the label values operators query, in snake case
pub enum Stage {
    /// Watch event received → cache updated and the Service keys queued.
    event_to_key,
    /// Key ready in the queue → a worker starts its reconcile.
    queued,
    /// A change that came while its Service was being reconciled: change → that reconcile's
    /// end (the key is queued again then).
    coalesced,
    /// A reconcile whose view did not satisfy the fresh-view rule → the next reconcile.
    view_wait,
    /// A reconcile that failed, conflicted or was fenced → the next reconcile (backoff, the
    /// queue's retry rate limit).
    retry_wait,
    /// Planning one Service (caches read, plan computed).
    plan,
    /// Waiting before one write for a slot of the calls in flight (`crate::limit`, a 429's
    /// Retry-After) and for the write rate limit (`--write-qps`).
    rate_limited,
    /// Waiting, before one write, for a renewal to make the lease safely held again (at most
    /// the fence's margin; zero while renewals are quick).
    fence_wait,
    /// One slice write: request sent → answer.
    write,
    /// Our write's answer → our own slice watch shows it.
    own_write_visible,
}

/// Label set with a [`Stage`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// The stage.
    pub stage: Stage,
}

/// The stage histograms and the sync latency histogram (registered by [`crate::metrics`]).
#[derive(Clone, Debug)]
pub struct TimingMetrics {
    /// Time spent in each stage.
    pub stages: Family<StageLabels, Histogram>,
    /// Trigger → answer of the write that published it.
    pub sync_latency: Histogram,
}

/// Why a key waits after a reconcile that did not finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The view did not satisfy the fresh-view rule.
    View,
    /// A failure, a conflict or a fenced write.
    Retry,
}

/// The per-term bookkeeping of triggers and stage start times.
#[derive(Debug)]
pub struct Timing {
    metrics: TimingMetrics,
    keys: Mutex<HashMap<ServiceKey, KeyTiming>>,
    /// Our writes not yet seen back through the watch: (namespace, slice name) → answer time.
    echoes: Mutex<HashMap<(String, String), Instant>>,
}

/// What a reconcile took from [`Timing::begin`]: the trigger of the changes it handles.
#[derive(Clone, Copy, Debug)]
pub struct Began {
    trigger: Option<Instant>,
}

#[derive(Debug, Default)]
struct KeyTiming {
    /// The earliest change not yet taken by a reconcile.
    trigger: Option<Instant>,
    /// When the key last became ready to run (queued while idle, or its reconcile ended with
    /// changes pending).
    ready_at: Option<Instant>,
    /// A reconcile of the key is running.
    running: bool,
    /// After a reconcile that did not finish: why, and since when.
    waiting: Option<(Wait, Instant)>,
}

// === impl TimingMetrics ===

impl TimingMetrics {
    /// Buckets of the sync latency: 1 ms to 60 s, resolving 5 ms, 10 ms, 25 ms, ... 60 s.
    pub const SYNC_BUCKETS: [f64; 16] = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
        60.0,
    ];

    /// Empty histograms.
    pub fn new() -> Self {
        Self {
            // 50 µs to ~26 s, ×2 per bucket.
            stages: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.00005, 2.0, 20,
                ))
            }),
            sync_latency: Histogram::new(Self::SYNC_BUCKETS),
        }
    }

    /// Records `took` in `stage`.
    pub fn observe(&self, stage: Stage, took: Duration) {
        self.stages
            .get_or_create(&StageLabels { stage })
            .observe(took.as_secs_f64());
    }
}

impl Default for TimingMetrics {
    fn default() -> Self {
        Self::new()
    }
}

// === impl Timing ===

impl Timing {
    /// Empty bookkeeping for a new term.
    pub fn new(metrics: TimingMetrics) -> Self {
        Self {
            metrics,
            keys: Mutex::default(),
            echoes: Mutex::default(),
        }
    }

    /// The histograms.
    pub fn metrics(&self) -> &TimingMetrics {
        &self.metrics
    }

    /// A change for `key` seen at `at` (its Service key is about to be queued).
    pub fn triggered(&self, key: &ServiceKey, at: Instant) {
        let mut keys = self.keys.lock();
        let timing = keys.entry(key.clone()).or_default();
        timing.trigger = Some(timing.trigger.map_or(at, |t| t.min(at)));
        if !timing.running && timing.ready_at.is_none() {
            timing.ready_at = Some(at);
        }
    }

    /// A reconcile of `key` starts: records how long it was queued or waiting, and takes the
    /// trigger of the changes it handles.
    pub fn begin(&self, key: &ServiceKey) -> Began {
        let now = Instant::now();
        let mut keys = self.keys.lock();
        let timing = keys.entry(key.clone()).or_default();
        timing.running = true;
        match (timing.waiting.take(), timing.ready_at.take()) {
            (Some((Wait::View, since)), _) => self.metrics.observe(Stage::view_wait, now - since),
            (Some((Wait::Retry, since)), _) => self.metrics.observe(Stage::retry_wait, now - since),
            (None, Some(ready)) => self.metrics.observe(Stage::queued, now - ready),
            (None, None) => {}
        }
        Began {
            trigger: timing.trigger.take(),
        }
    }

    /// The reconcile of `key` that took `began` ended; `waiting` says why it will run again
    /// (None: it finished).
    pub fn end(&self, key: &ServiceKey, began: Began, waiting: Option<Wait>) {
        let now = Instant::now();
        let mut keys = self.keys.lock();
        let Some(timing) = keys.get_mut(key) else {
            return;
        };
        timing.running = false;
        if let Some(arrived) = timing.trigger {
            // Changes came while it ran: they waited for this end, and the key runs again.
            self.metrics.observe(Stage::coalesced, now - arrived);
            timing.ready_at = Some(now);
        }
        if let Some(wait) = waiting {
            // Not finished: its changes are still to publish, from their first trigger.
            if let Some(trigger) = began.trigger {
                timing.trigger = Some(timing.trigger.map_or(trigger, |t| t.min(trigger)));
            }
            timing.waiting = Some((wait, now));
            timing.ready_at = None;
        }
        if timing.trigger.is_none() && timing.waiting.is_none() {
            keys.remove(key);
        }
    }

    /// The key was deleted (or the term forgets it).
    pub fn forget(&self, key: &ServiceKey) {
        let mut keys = self.keys.lock();
        if keys.get(key).is_some_and(|t| !t.running) {
            keys.remove(key);
        }
    }

    /// The wall-clock time of `began`'s trigger (now when it has none), for the trigger-time
    /// annotation.
    pub fn trigger_time(began: &Began) -> Timestamp {
        let now = Timestamp::now();
        let Some(trigger) = began.trigger else {
            return now;
        };
        let ago = SignedDuration::try_from(trigger.elapsed()).unwrap_or(SignedDuration::ZERO);
        now.checked_sub(ago).unwrap_or(now)
    }

    /// Every write of a pass for `began` was answered: observes the sync latency.
    pub fn published(&self, began: &Began) {
        if let Some(trigger) = began.trigger {
            self.metrics
                .sync_latency
                .observe(trigger.elapsed().as_secs_f64());
        }
    }

    /// Our write of slice `namespace/name` was answered now.
    pub fn wrote(&self, namespace: &str, name: &str) {
        self.echoes
            .lock()
            .insert((namespace.to_string(), name.to_string()), Instant::now());
    }

    /// Our own write of `namespace/name` came back through the watch.
    pub fn echoed(&self, namespace: &str, name: &str) {
        let answered = self
            .echoes
            .lock()
            .remove(&(namespace.to_string(), name.to_string()));
        if let Some(answered) = answered {
            self.metrics
                .observe(Stage::own_write_visible, answered.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ServiceKey {
        ServiceKey::new("ns", "web")
    }

    fn count(metrics: &TimingMetrics, stage: Stage) -> u64 {
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("s", "", metrics.stages.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let prefix = format!("s_count{{stage=\"{stage:?}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |n| n.parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_is_retried_keeps_its_first_trigger() {
        let timing = Timing::new(TimingMetrics::new());
        let first = Instant::now();
        timing.triggered(&key(), first);
        tokio::time::advance(Duration::from_millis(3)).await;
        let began = timing.begin(&key());
        assert_eq!(began.trigger, Some(first));
        timing.end(&key(), began, Some(Wait::View));
        tokio::time::advance(Duration::from_millis(7)).await;
        let again = timing.begin(&key());
        assert_eq!(
            again.trigger,
            Some(first),
            "the retry publishes the first change"
        );
        assert_eq!(count(timing.metrics(), Stage::queued), 1);
        assert_eq!(count(timing.metrics(), Stage::view_wait), 1);
        timing.published(&again);
        timing.end(&key(), again, None);
        assert!(
            timing.keys.lock().is_empty(),
            "nothing left for a finished key"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_a_reconcile_is_coalesced_into_the_next() {
        let timing = Timing::new(TimingMetrics::new());
        timing.triggered(&key(), Instant::now());
        let began = timing.begin(&key());
        tokio::time::advance(Duration::from_millis(2)).await;
        let during = Instant::now();
        timing.triggered(&key(), during);
        tokio::time::advance(Duration::from_millis(2)).await;
        timing.end(&key(), began, None);
        assert_eq!(count(timing.metrics(), Stage::coalesced), 1);
        let next = timing.begin(&key());
        assert_eq!(next.trigger, Some(during));
    }

    #[tokio::test(start_paused = true)]
    async fn trigger_time_is_the_wall_clock_of_the_change() {
        let timing = Timing::new(TimingMetrics::new());
        timing.triggered(&key(), Instant::now());
        let began = timing.begin(&key());
        tokio::time::advance(Duration::from_secs(2)).await;
        let at = Timing::trigger_time(&began);
        let ago = Timestamp::now().duration_since(at);
        assert!(
            ago >= SignedDuration::from_secs(2) && ago < SignedDuration::from_secs(3),
            "{ago:?}"
        );
    }
}
