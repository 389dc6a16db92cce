//! The write path's API calls in flight follow the API server (issue 34): an additive-increase,
//! multiplicative-decrease (AIMD) limit, between 1 and a cap (`--workers`). Every call of the
//! write path takes a slot: slice writes, the reads that confirm a plan's additions, read-backs,
//! Events. Reads count because they count for the server too: after a 429, a pass's confirming
//! reads must not go out all at once and be refused again.
//!
//! ```text
//!  writer ─► acquire (a free slot, no Retry-After hold) ─► --write-qps ─► fence ─► call ─► answer
//!                 ▲                                                                    │
//!                 └───────── limit: + 1/limit per steady answer, × ½ or × 0.9 ◄────────┘
//! ```
//!
//! - **Grow**: an answer to a call sent while the limit was in use (at least half of it in
//!   flight) adds 1/limit, so one more call in flight per round of answers. A limit nobody
//!   uses does not grow (at 50 changes/s it stays where it started, as the old fixed pool).
//! - **Throttled**: a 429 (API Priority and Fairness, or a max-in-flight limit) halves the limit
//!   and holds every new call of the write path until its `Retry-After` (the
//!   Status' `retryAfterSeconds`; 1 s, what kube-apiserver sends, when absent). The call was not
//!   applied, so it is sent again after the hold, through the fence ([`crate::writer`]).
//! - **Server error**: a 5xx, or a call given up at the call timeout, halves it.
//! - **Latency**: when the writes' recent latency (a short average) rises above twice their
//!   long average and [`LATENCY_SLACK`] above it, the limit loses a tenth. The long average
//!   follows a server that stays slow (a loaded machine is not congestion of ours), so only a
//!   rise shrinks the limit, as in gradient limiters; the hard signals (429, 5xx) do the rest.
//!   Reads are answered faster than writes: their latency is not judged, only their answers.
//! - One decrease per round: an answer to a call sent before the last decrease does not
//!   decrease again (TCP's one reduction per window), so a burst of 429s to calls that were
//!   already in flight halves the limit once, not down to 1.
//!
//! [`Aimd`] is the pure rule (tested by tables over paused time); [`WriteLimit`] shares it
//! between the workers and publishes it as metrics: the current limit, the writes in flight, and
//! each change of the limit by reason.

use std::{pin::pin, time::Duration};

use parking_lot::Mutex;
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::{
    sync::Notify,
    time::{Instant, sleep_until},
};

/// Where the limit starts: the old fixed pool of 4 workers, one write each.
pub const INITIAL_LIMIT: usize = 4;

/// The default cap (`--workers`).
pub const DEFAULT_MAX: usize = 32;

/// How much slower than the baseline the smoothed latency must be, on top of twice the
/// baseline, before the limit shrinks for latency: below it, more writes in flight still buy
/// throughput (at 200 changes/s, 16 writes in flight answered in 42 ms against 16 ms for 4, and
/// published faster).
pub const LATENCY_SLACK: Duration = Duration::from_millis(50);

/// How long the API server is left alone after a 429 without a `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Weight of the newest write's latency in the short average (about the last 4 writes).
const SHORT_WEIGHT: f64 = 0.25;

/// Weight of the newest write's latency in the long average (about the last 50 writes).
const LONG_WEIGHT: f64 = 0.02;

/// The bounds and the start of the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitConfig {
    /// Where the limit starts.
    pub initial: usize,
    /// The cap: never more writes in flight than this.
    pub max: usize,
}

/// How the API server answered one call, as the limit sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An answer to a write (success, or a definite refusal such as 404, 409, 422), after this
    /// long.
    Answered(Duration),
    /// An answer to a read (or an Event): steady, its latency not judged.
    Served,
    /// 429: try again after this long (the server's Retry-After, if it gave one).
    Throttled(Option<Duration>),
    /// A 5xx, or no answer within the call timeout.
    Overloaded,
    /// Anything else (a connection refused, a body that did not parse): says nothing of load.
    Other,
}

/// Why the limit changed (the `reason` label of `write_limit_changes_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the label values operators query, in snake case
pub enum LimitChange {
    /// Steady answers while the limit was in use: one more.
    steady,
    /// The answers slowed down past the latency bound.
    latency,
    /// The API server answered 429.
    throttled,
    /// The API server answered 5xx, or not within the call timeout.
    server_error,
}

/// What was true when a call was sent, for judging its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Decreases made before the call was sent.
    epoch: u64,
    /// At least half the limit was in flight (this call included).
    busy: bool,
}

/// The pure rule: the limit and what it has learned of the server's latency.
#[derive(Clone, Debug)]
pub struct Aimd {
    limit: f64,
    max: f64,
    /// Decreases so far.
    epoch: u64,
    /// Writes' latency: a short and a long moving average.
    short: Option<Duration>,
    long: Option<Duration>,
}

/// Calls in flight, shared by the workers: a slot per call, under an [`Aimd`] limit.
pub struct WriteLimit {
    state: Mutex<State>,
    /// Wakes callers waiting for a slot.
    freed: Notify,
    metrics: LimitMetrics,
}

struct State {
    aimd: Aimd,
    in_flight: usize,
    /// No call of the write path before this (a 429's Retry-After).
    hold_until: Option<Instant>,
}

/// A write's slot; give the answer back with [`Permit::answered`] (dropping it frees the slot
/// and teaches the limit nothing).
#[must_use = "a permit holds a slot until it is answered or dropped"]
pub struct Permit<'a> {
    limit: &'a WriteLimit,
    sent: Sent,
    sent_at: Instant,
}

/// The limit's metrics (docs/operations.md).
#[derive(Clone, Debug, Default)]
pub struct LimitMetrics {
    /// The current limit.
    pub limit: Gauge,
    /// Calls in flight now.
    pub in_flight: Gauge,
    /// Changes of the limit, by reason.
    pub changes: Family<ChangeLabels, Counter>,
    /// 429 answers to calls of the write path (writes and the reads that confirm them).
    pub throttled: Counter,
}

/// Label set with a [`LimitChange`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    /// Why the limit changed.
    pub reason: LimitChange,
}

// === impl LimitConfig ===

impl LimitConfig {
    /// Starts at [`INITIAL_LIMIT`] (or `max`, if lower), capped at `max` (at least 1).
    pub fn capped_at(max: usize) -> Self {
        let max = max.max(1);
        Self {
            initial: INITIAL_LIMIT.min(max),
            max,
        }
    }
}

impl Default for LimitConfig {
    fn default() -> Self {
        Self::capped_at(DEFAULT_MAX)
    }
}

// === impl Answer ===

impl Answer {
    /// How `result`, answered `latency` after it was sent, reads to the limit.
    pub fn of<T>(result: &Result<T, kube::Error>, latency: Duration) -> Self {
        match result {
            Ok(_) => Answer::Answered(latency),
            Err(kube::Error::Api(status)) if status.code == 429 => Answer::Throttled(
                status
                    .details
                    .as_ref()
                    .map(|details| details.retry_after_seconds)
                    .filter(|seconds| *seconds > 0)
                    .map(|seconds| Duration::from_secs(u64::from(seconds))),
            ),
            Err(kube::Error::Api(status)) if status.code >= 500 => Answer::Overloaded,
            Err(kube::Error::Api(_)) => Answer::Answered(latency),
            Err(kube::Error::Service(error)) if error.is::<crate::writer::CallTimedOut>() => {
                Answer::Overloaded
            }
            Err(_) => Answer::Other,
        }
    }
}

// === impl Aimd ===

impl Aimd {
    /// A limit at `config.initial`, knowing nothing of the server yet.
    pub fn new(config: LimitConfig) -> Self {
        let max = config.max.max(1);
        Self {
            limit: config.initial.clamp(1, max) as f64,
            max: max as f64,
            epoch: 0,
            short: None,
            long: None,
        }
    }

    /// Writes allowed in flight now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// Records a call sent with `in_flight` calls in flight (itself included).
    pub fn sent(&self, in_flight: usize) -> Sent {
        Sent {
            epoch: self.epoch,
            busy: in_flight * 2 >= self.limit(),
        }
    }

    /// Learns from `answer` to a call `sent`; returns why the limit changed, if its whole
    /// number did.
    pub fn answered(&mut self, sent: Sent, answer: Answer) -> Option<LimitChange> {
        let before = self.limit();
        let reason = match answer {
            Answer::Answered(_) | Answer::Served => {
                let slow = match answer {
                    Answer::Answered(latency) => self.observe_latency(latency),
                    _ => false,
                };
                if slow {
                    self.decrease(sent, 0.9).then_some(LimitChange::latency)
                } else if sent.busy {
                    self.limit = (self.limit + 1.0 / self.limit).min(self.max);
                    Some(LimitChange::steady)
                } else {
                    None
                }
            }
            Answer::Throttled(_) => self.decrease(sent, 0.5).then_some(LimitChange::throttled),
            Answer::Overloaded => self
                .decrease(sent, 0.5)
                .then_some(LimitChange::server_error),
            Answer::Other => None,
        };
        reason.filter(|_| self.limit() != before)
    }

    /// The latency the writes are judged against: their long average.
    #[cfg(test)]
    pub fn baseline(&self) -> Option<Duration> {
        self.long
    }

    /// Takes a write's `latency` in; whether the recent writes are slower than the bound.
    fn observe_latency(&mut self, latency: Duration) -> bool {
        let average = |average: Option<Duration>, weight: f64| {
            average.map_or(latency, |average| {
                average.mul_f64(1.0 - weight) + latency.mul_f64(weight)
            })
        };
        let short = average(self.short, SHORT_WEIGHT);
        let long = average(self.long, LONG_WEIGHT);
        (self.short, self.long) = (Some(short), Some(long));
        short > (long * 2).max(long + LATENCY_SLACK)
    }

    /// Multiplies the limit by `factor`, once per round: not for a call sent before the last
    /// decrease. Whether it decreased.
    fn decrease(&mut self, sent: Sent, factor: f64) -> bool {
        if sent.epoch != self.epoch {
            return false;
        }
        self.epoch += 1;
        self.limit = (self.limit * factor).max(1.0);
        true
    }
}

// === impl WriteLimit ===

impl WriteLimit {
    /// A limit under `config`, publishing into `metrics`.
    pub fn new(config: LimitConfig, metrics: LimitMetrics) -> Self {
        let aimd = Aimd::new(config);
        metrics.limit.set(aimd.limit() as i64);
        Self {
            state: Mutex::new(State {
                aimd,
                in_flight: 0,
                hold_until: None,
            }),
            freed: Notify::new(),
            metrics,
        }
    }

    /// Waits for a slot (after any Retry-After hold).
    pub async fn acquire(&self) -> Permit<'_> {
        loop {
            let mut freed = pin!(self.freed.notified());
            freed.as_mut().enable();
            let held = {
                let mut state = self.state.lock();
                match state.hold_until.filter(|at| *at > Instant::now()) {
                    Some(at) => Some(at),
                    None if state.in_flight < state.aimd.limit() => {
                        state.in_flight += 1;
                        self.metrics.in_flight.set(state.in_flight as i64);
                        return Permit {
                            limit: self,
                            sent: state.aimd.sent(state.in_flight),
                            sent_at: Instant::now(),
                        };
                    }
                    None => None,
                }
            };
            match held {
                Some(at) => sleep_until(at).await,
                None => freed.await,
            }
        }
    }

    /// The limit now.
    #[cfg(test)]
    pub fn limit(&self) -> usize {
        self.state.lock().aimd.limit()
    }

    /// Learns `answer` to a call `sent`; whether it was a 429.
    fn learn(&self, state: &mut State, sent: Sent, answer: Answer) -> bool {
        let now = Instant::now();
        let change = state.aimd.answered(sent, answer);
        let throttled = if let Answer::Throttled(after) = answer {
            let until = now + after.unwrap_or(DEFAULT_RETRY_AFTER);
            state.hold_until = Some(state.hold_until.map_or(until, |held| held.max(until)));
            self.metrics.throttled.inc();
            true
        } else {
            false
        };
        if let Some(reason) = change {
            let limit = state.aimd.limit();
            self.metrics.limit.set(limit as i64);
            self.metrics
                .changes
                .get_or_create(&ChangeLabels { reason })
                .inc();
            tracing::debug!(limit, ?reason, "writes in flight limit changed");
            if reason == LimitChange::steady {
                self.freed.notify_waiters();
            }
        }
        throttled
    }

    fn release(&self) {
        let mut state = self.state.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        self.metrics.in_flight.set(state.in_flight as i64);
        drop(state);
        self.freed.notify_waiters();
    }
}

impl Default for WriteLimit {
    fn default() -> Self {
        Self::new(LimitConfig::default(), LimitMetrics::default())
    }
}

impl std::fmt::Debug for WriteLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("WriteLimit")
            .field("limit", &state.aimd.limit())
            .field("in_flight", &state.in_flight)
            .finish_non_exhaustive()
    }
}

// === impl Permit ===

impl Permit<'_> {
    /// Frees the slot and teaches the limit how the write was answered (`result`); whether it
    /// was a 429 (the call was not applied: send it again, through the fence, after the hold).
    pub fn answered<T>(self, result: &Result<T, kube::Error>) -> bool {
        let answer = Answer::of(result, self.sent_at.elapsed());
        self.learn(answer)
    }

    /// [`Permit::answered`] for a read: its latency is not judged.
    pub fn served<T>(self, result: &Result<T, kube::Error>) -> bool {
        let answer = match Answer::of(result, self.sent_at.elapsed()) {
            Answer::Answered(_) => Answer::Served,
            other => other,
        };
        self.learn(answer)
    }

    fn learn(self, answer: Answer) -> bool {
        let mut state = self.limit.state.lock();
        self.limit.learn(&mut state, self.sent, answer)
        // The slot is freed as `self` drops.
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limit.release();
    }
}

// === impl LimitMetrics ===

impl LimitMetrics {
    /// Creates the metrics and registers them in `registry` (every reason starts at zero).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for reason in [
            LimitChange::steady,
            LimitChange::latency,
            LimitChange::throttled,
            LimitChange::server_error,
        ] {
            metrics
                .changes
                .get_or_create(&ChangeLabels { reason })
                .inc_by(0);
        }
        registry.register(
            "write_limit",
            "API calls of the write path allowed in flight now (adapts to the API server, capped by --workers)",
            metrics.limit.clone(),
        );
        registry.register(
            "write_in_flight",
            "API calls of the write path in flight now",
            metrics.in_flight.clone(),
        );
        registry.register(
            "write_limit_changes",
            "Changes of the write path's limit of calls in flight, by reason",
            metrics.changes.clone(),
        );
        registry.register(
            "write_throttled",
            "429 answers to the write path's calls (each held until its Retry-After, then sent again)",
            metrics.throttled.clone(),
        );
        metrics
    }
}

#[cfg(test)]
mod tests;
