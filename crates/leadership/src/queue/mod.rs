//! The work queue: deduplicated keys, one worker per key, paced retries, scoped to a term.
//!
//! - A key is queued at most once; adding it again while queued does nothing.
//! - A key is handed to one worker at a time; added again while processing, it is queued again
//!   when that worker is [`done`](WorkQueue::done).
//! - Failures retry with per-key exponential backoff and a global token bucket; a key is never
//!   dropped for failing: past the cap it keeps retrying at the cap, and those retries are
//!   counted ([`WorkQueue::capped_retries`]).
//! - Keys belong to the term that added them. When the term ends, its queued and retrying keys
//!   are dropped (the next term replays everything from the caches), and adds from the old term
//!   are ignored.

mod rate;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    fmt::Debug,
    hash::Hash,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use parking_lot::Mutex;
use tokio::{
    sync::Notify,
    time::{Instant, sleep_until},
};

use self::rate::{Backoff, TokenBucket};

/// What a queue key must be: any cloneable, hashable, debuggable, thread-safe value (a
/// `namespace/name` string, a struct of both, ...). Implemented for every such type.
pub trait QueueKey: Clone + Eq + Hash + Debug + Send + Sync + 'static {}

impl<K: Clone + Eq + Hash + Debug + Send + Sync + 'static> QueueKey for K {}

/// Queue settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QueueConfig {
    /// First retry delay after a failure (doubles per consecutive failure).
    pub(crate) base_delay: Duration,
    /// Longest retry delay; a key failing forever retries at this period.
    pub(crate) max_delay: Duration,
    /// Retries allowed per second across all keys (token bucket refill rate).
    pub(crate) retry_qps: f64,
    /// Retries allowed in a burst across all keys (token bucket size).
    pub(crate) retry_burst: u32,
}

/// A work queue shared by the event handlers (producers) and the workers. Cheap to clone.
pub(crate) struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

/// A key handed to a worker; give it back with [`WorkQueue::done`].
#[derive(Debug)]
#[must_use = "a work item must be given back with `WorkQueue::done`"]
pub(crate) struct WorkItem<K> {
    key: K,
    term: u64,
}

/// The queue as seen by one term: adds through it are ignored once the term is over.
pub(crate) struct TermQueue<K> {
    queue: WorkQueue<K>,
    term: u64,
}

/// A read-only view of the runtime's work queue, for a metrics layer
/// ([`Runtime::queue_metrics`](crate::Runtime::queue_metrics)). Cheap to clone; it can read the
/// queue but neither add nor take keys.
#[derive(Clone)]
pub struct QueueMetrics {
    queue: Arc<dyn Readout>,
}

/// What [`QueueMetrics`] reads, without the key type.
trait Readout: Send + Sync {
    fn depth(&self) -> usize;
    fn waiting(&self) -> usize;
    fn in_flight(&self) -> usize;
    fn adds(&self) -> u64;
    fn retries(&self) -> u64;
    fn capped_retries(&self) -> u64;
    fn dropped(&self) -> u64;
}

struct Inner<K> {
    state: Mutex<State<K>>,
    /// Wakes workers waiting for a key.
    work: Notify,
    /// Wakes drains waiting for the queue to empty.
    progress: Notify,
    backoff: Backoff,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    adds: AtomicU64,
    retries: AtomicU64,
    capped_retries: AtomicU64,
    dropped: AtomicU64,
}

struct State<K> {
    term: Option<u64>,
    closed: bool,
    ready: VecDeque<K>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    /// Keys added while being processed: queued again when done.
    dirty: HashSet<K>,
    delayed: BTreeMap<(Instant, u64), K>,
    delayed_keys: HashMap<K, (Instant, u64)>,
    sequence: u64,
    failures: HashMap<K, u32>,
    bucket: TokenBucket,
}

// === impl QueueConfig ===

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            retry_qps: 10.0,
            retry_burst: 100,
        }
    }
}

// === impl WorkQueue ===

impl<K: QueueKey> WorkQueue<K> {
    /// An empty queue with no term (adds are ignored until [`begin_term`](Self::begin_term)).
    pub fn new(config: &QueueConfig) -> Self {
        let state = State {
            term: None,
            closed: false,
            ready: VecDeque::new(),
            queued: HashSet::new(),
            processing: HashSet::new(),
            dirty: HashSet::new(),
            delayed: BTreeMap::new(),
            delayed_keys: HashMap::new(),
            sequence: 0,
            failures: HashMap::new(),
            bucket: TokenBucket::new(config.retry_qps, config.retry_burst, Instant::now()),
        };
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                work: Notify::new(),
                progress: Notify::new(),
                backoff: Backoff {
                    base: config.base_delay,
                    max: config.max_delay,
                },
                counters: Counters::default(),
            }),
        }
    }

    /// Scopes the queue to `term`: whatever an earlier term left queued or retrying is dropped.
    /// Keys still being processed stay exclusive until their worker is done.
    pub fn begin_term(&self, term: u64) -> TermQueue<K> {
        let mut state = self.inner.state.lock();
        self.drop_pending(&mut state);
        state.term = Some(term);
        drop(state);
        TermQueue {
            queue: self.clone(),
            term,
        }
    }

    /// Ends `term` if it is the queue's term: its queued and retrying keys are dropped and later
    /// adds for it are ignored.
    pub fn end_term(&self, term: u64) {
        let mut state = self.inner.state.lock();
        if state.term == Some(term) {
            self.drop_pending(&mut state);
            state.term = None;
        }
        drop(state);
        self.inner.progress.notify_waiters();
    }

    /// Queues `key` for `term` now. Ignored if `term` is not the queue's term.
    pub fn add(&self, term: u64, key: K) -> bool {
        self.add_after(term, key, Duration::ZERO)
    }

    /// Queues `key` for `term` after `delay` (e.g. "the cache is behind, retry shortly"); an
    /// earlier pending time for the key wins. Ignored if `term` is not the queue's term.
    pub fn add_after(&self, term: u64, key: K, delay: Duration) -> bool {
        let mut state = self.inner.state.lock();
        if state.term != Some(term) || state.closed {
            return false;
        }
        self.inner.counters.adds.fetch_add(1, Ordering::Relaxed);
        if delay.is_zero() {
            state.make_ready(key);
        } else {
            state.delay(key, Instant::now() + delay);
        }
        drop(state);
        self.inner.work.notify_waiters();
        true
    }

    /// Queues `key` again after a failure, after its backoff or the global rate limit, whichever
    /// is later. Ignored if `term` is not the queue's term.
    pub fn add_rate_limited(&self, term: u64, key: K) -> bool {
        let delay = {
            let mut state = self.inner.state.lock();
            if state.term != Some(term) || state.closed {
                return false;
            }
            let failures = state.failures.entry(key.clone()).or_insert(0);
            *failures = failures.saturating_add(1);
            let (backoff, capped) = self.inner.backoff.delay(*failures);
            if capped {
                self.inner
                    .counters
                    .capped_retries
                    .fetch_add(1, Ordering::Relaxed);
            }
            let paced = state.bucket.reserve(Instant::now());
            backoff.max(paced)
        };
        self.inner.counters.retries.fetch_add(1, Ordering::Relaxed);
        self.add_after(term, key, delay)
    }

    /// Forgets the failures of `key` (after a success), so its next failure starts at the base
    /// delay.
    pub fn forget(&self, key: &K) {
        self.inner.state.lock().failures.remove(key);
    }

    /// Waits for a key to process. `None` once the queue is closed.
    pub async fn next(&self) -> Option<WorkItem<K>> {
        loop {
            let mut notified = pin!(self.inner.work.notified());
            notified.as_mut().enable();
            let wake_at = {
                let mut state = self.inner.state.lock();
                if state.closed {
                    return None;
                }
                state.promote_due(Instant::now());
                if let (Some(key), Some(term)) = (state.ready.pop_front(), state.term) {
                    state.queued.remove(&key);
                    state.processing.insert(key.clone());
                    return Some(WorkItem { key, term });
                }
                state.delayed.keys().next().map(|(at, _)| *at)
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        biased;
                        () = notified => {}
                        () = sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Gives a processed key back; if it was added meanwhile, it is queued again.
    pub fn done(&self, item: WorkItem<K>) {
        let mut state = self.inner.state.lock();
        state.processing.remove(&item.key);
        if state.dirty.remove(&item.key) && state.term.is_some() {
            state.make_ready(item.key);
        }
        drop(state);
        self.inner.work.notify_waiters();
        self.inner.progress.notify_waiters();
    }

    /// Stops the queue: workers waiting in [`next`](Self::next) get `None`, adds are ignored.
    pub fn close(&self) {
        self.inner.state.lock().closed = true;
        self.inner.work.notify_waiters();
        self.inner.progress.notify_waiters();
    }

    /// Waits until nothing is queued or being processed. Keys waiting for a delayed add or a
    /// retry are not waited for: a drain hands them over (the next leader replays every cached
    /// object), so a Service waiting on a cache that has not yet seen this term's writes, or a
    /// retry in backoff, never holds the Lease past the in-flight work.
    pub async fn wait_idle(&self) {
        loop {
            let mut progress = pin!(self.inner.progress.notified());
            progress.as_mut().enable();
            {
                let state = self.inner.state.lock();
                if state.closed || (state.ready.is_empty() && state.processing.is_empty()) {
                    return;
                }
            }
            progress.await;
        }
    }

    /// Keys queued and ready to process.
    pub fn depth(&self) -> usize {
        self.inner.state.lock().ready.len()
    }

    /// Keys waiting for a delayed add or a retry.
    pub fn waiting(&self) -> usize {
        self.inner.state.lock().delayed.len()
    }

    /// Keys being processed now.
    pub fn in_flight(&self) -> usize {
        self.inner.state.lock().processing.len()
    }

    /// Accepted adds so far (immediate, delayed and retries).
    pub fn adds(&self) -> u64 {
        self.inner.counters.adds.load(Ordering::Relaxed)
    }

    /// Retries after failures so far.
    pub fn retries(&self) -> u64 {
        self.inner.counters.retries.load(Ordering::Relaxed)
    }

    /// Retries scheduled at the maximum delay (keys failing again and again; never dropped).
    pub fn capped_retries(&self) -> u64 {
        self.inner.counters.capped_retries.load(Ordering::Relaxed)
    }

    /// Keys dropped because their term ended.
    pub fn dropped(&self) -> u64 {
        self.inner.counters.dropped.load(Ordering::Relaxed)
    }

    /// Consecutive failures recorded for `key`.
    #[cfg(test)]
    pub fn failures(&self, key: &K) -> u32 {
        self.inner
            .state
            .lock()
            .failures
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    fn drop_pending(&self, state: &mut State<K>) {
        let dropped = state.ready.len() + state.delayed.len() + state.dirty.len();
        self.inner
            .counters
            .dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        state.ready.clear();
        state.queued.clear();
        state.dirty.clear();
        state.delayed.clear();
        state.delayed_keys.clear();
        state.failures.clear();
    }
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> std::fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue").finish_non_exhaustive()
    }
}

impl<K: QueueKey> Readout for WorkQueue<K> {
    fn depth(&self) -> usize {
        WorkQueue::depth(self)
    }

    fn waiting(&self) -> usize {
        WorkQueue::waiting(self)
    }

    fn in_flight(&self) -> usize {
        WorkQueue::in_flight(self)
    }

    fn adds(&self) -> u64 {
        WorkQueue::adds(self)
    }

    fn retries(&self) -> u64 {
        WorkQueue::retries(self)
    }

    fn capped_retries(&self) -> u64 {
        WorkQueue::capped_retries(self)
    }

    fn dropped(&self) -> u64 {
        WorkQueue::dropped(self)
    }
}

// === impl QueueMetrics ===

impl QueueMetrics {
    pub(crate) fn of<K: QueueKey>(queue: WorkQueue<K>) -> Self {
        Self {
            queue: Arc::new(queue),
        }
    }

    /// Keys queued and ready to process.
    pub fn depth(&self) -> usize {
        self.queue.depth()
    }

    /// Keys waiting for a delayed add ([`Action::RequeueAfter`](crate::Action::RequeueAfter))
    /// or a retry after a failure.
    pub fn waiting(&self) -> usize {
        self.queue.waiting()
    }

    /// Keys being reconciled now.
    pub fn in_flight(&self) -> usize {
        self.queue.in_flight()
    }

    /// Accepted adds so far (immediate, delayed and retries).
    pub fn adds(&self) -> u64 {
        self.queue.adds()
    }

    /// Retries after failures so far.
    pub fn retries(&self) -> u64 {
        self.queue.retries()
    }

    /// Retries scheduled at the maximum delay (keys failing again and again; never dropped).
    pub fn capped_retries(&self) -> u64 {
        self.queue.capped_retries()
    }

    /// Keys dropped because their term ended (the next term replays everything).
    pub fn dropped(&self) -> u64 {
        self.queue.dropped()
    }
}

impl std::fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueMetrics")
            .field("depth", &self.depth())
            .field("waiting", &self.waiting())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

// === impl State ===

impl<K: QueueKey> State<K> {
    fn make_ready(&mut self, key: K) {
        if self.processing.contains(&key) {
            self.dirty.insert(key);
        } else if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    fn delay(&mut self, key: K, at: Instant) {
        if let Some(existing) = self.delayed_keys.get(&key) {
            if existing.0 <= at {
                return;
            }
            self.delayed.remove(existing);
        }
        self.sequence += 1;
        let slot = (at, self.sequence);
        self.delayed.insert(slot, key.clone());
        self.delayed_keys.insert(key, slot);
    }

    fn promote_due(&mut self, now: Instant) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.delayed_keys.remove(&key);
            self.make_ready(key);
        }
    }
}

// === impl WorkItem ===

impl<K> WorkItem<K> {
    /// The key to process.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The term that queued it.
    pub fn term(&self) -> u64 {
        self.term
    }
}

// === impl TermQueue ===

impl<K: QueueKey> TermQueue<K> {
    /// Queues `key` now (ignored once the term is over).
    pub fn add(&self, key: K) -> bool {
        self.queue.add(self.term, key)
    }
}

impl<K> Clone for TermQueue<K> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            term: self.term,
        }
    }
}

impl<K> std::fmt::Debug for TermQueue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermQueue")
            .field("term", &self.term)
            .finish_non_exhaustive()
    }
}
