//! An in-memory [`LeaseStore`] with the API server's concurrency rules and injectable faults.
//!
//! Several handles ([`MemoryLeaseStore::connect`]) share one lease, as several replicas share the
//! API server; each handle has its own faults, so one replica can be cut off while others are not.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
};

use futures::{FutureExt, StreamExt, future::BoxFuture, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use super::{LeaseStore, StoreError};

/// One replica's connection to an in-memory lease shared with other connections.
#[derive(Clone, Debug)]
pub struct MemoryLeaseStore {
    shared: Arc<Shared>,
    faults: Arc<Faults>,
}

#[derive(Debug)]
struct Shared {
    lease: watch::Sender<Option<Lease>>,
    next_version: AtomicU64,
    writes: Mutex<Vec<Lease>>,
    /// Every state the lease has had, in order (`None` when deleted), pushed while the channel
    /// is locked for writing: an ordered watch reads its events from here.
    history: Mutex<Vec<Option<Lease>>>,
}

#[derive(Debug, Default)]
struct Faults {
    fail_next: AtomicUsize,
    hang: AtomicBool,
    unhang: Notify,
    latency_ms: AtomicU64,
    calls: AtomicU64,
    blind: AtomicBool,
    ordered: AtomicBool,
    /// Bumped by [`MemoryLeaseStore::freeze_watches`]: streams opened before stop yielding.
    watch_epoch: AtomicU64,
    panic_next: AtomicBool,
    intrusion: Mutex<Option<Lease>>,
    /// The instant of the last call or watch, and how many came at that instant.
    same_instant: Mutex<Option<(tokio::time::Instant, u32)>>,
}

/// This many calls and watches through one connection at one instant is a caller that spins:
/// in paused time its task never lets the clock move, so a test would hang instead of failing.
/// Retries and watch restarts always wait between tries.
const SPIN_LIMIT: u32 = 1_000;

// === impl MemoryLeaseStore ===

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLeaseStore {
    /// An empty store (the lease does not exist yet).
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                lease: watch::channel(None).0,
                next_version: AtomicU64::new(1),
                writes: Mutex::new(Vec::new()),
                history: Mutex::new(Vec::new()),
            }),
            faults: Arc::default(),
        }
    }

    /// Another connection to the same lease, with its own (initially no) faults.
    pub fn connect(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            faults: Arc::default(),
        }
    }

    /// The stored lease, as the API server would return it.
    pub fn current(&self) -> Option<Lease> {
        self.shared.lease.borrow().clone()
    }

    /// Every lease successfully written through any connection, in order (not `put`s).
    pub fn writes(&self) -> Vec<Lease> {
        self.shared.writes.lock().clone()
    }

    /// Writes the lease as another party would, ignoring resourceVersion (`None` deletes it).
    /// Returns the stored object with its new resourceVersion.
    pub fn put(&self, lease: Option<Lease>) -> Option<Lease> {
        let stored = lease.map(|lease| self.stamp(lease));
        self.shared.lease.send_modify(|current| {
            self.shared.history.lock().push(stored.clone());
            current.clone_from(&stored);
        });
        stored
    }

    /// Makes the next `n` get/create/replace calls of this connection fail with
    /// an injected error (the elector retries it like any failed request).
    pub fn fail_next(&self, n: usize) {
        self.faults.fail_next.store(n, Ordering::SeqCst);
    }

    /// While `true`, get/create/replace calls of this connection hang (a network cut that neither
    /// answers nor errors); setting it back to `false` lets hanging calls proceed.
    pub fn hang(&self, hang: bool) {
        self.faults.hang.store(hang, Ordering::SeqCst);
        if !hang {
            self.faults.unhang.notify_waiters();
        }
    }

    /// Makes every get/create/replace call of this connection take `latency` before it is
    /// served (a slow API server); zero turns it off.
    pub fn latency(&self, latency: std::time::Duration) {
        let millis = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.faults.latency_ms.store(millis, Ordering::SeqCst);
    }

    /// While `true`, new watches of the lease through this connection never yield
    /// (a watch that is down), so only polling sees changes.
    pub fn blind(&self, blind: bool) {
        self.faults.blind.store(blind, Ordering::SeqCst);
    }

    /// While `true`, watches opened through this connection deliver every change in order, as
    /// an API server's watch does, instead of only the newest state: an event from before one of
    /// this connection's own writes (a deletion before its create, say) arrives after that write
    /// returned. Streams opened before keep their mode.
    pub fn ordered_watches(&self, ordered: bool) {
        self.faults.ordered.store(ordered, Ordering::SeqCst);
    }

    /// Freezes every `changes` stream of this connection opened so far: it
    /// stays open but never yields again (a connection a proxy stopped passing bytes on, without
    /// closing it). Streams opened afterwards work.
    pub fn freeze_watches(&self) {
        self.faults.watch_epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Makes the next get/create/replace call of this connection panic (a bug in the elector's
    /// task, to test that a lost elector is reported).
    pub fn panic_next(&self) {
        self.faults.panic_next.store(true, Ordering::SeqCst);
    }

    /// Right before the next replace of this connection, another party writes `lease` (as with
    /// [`put`](Self::put)), so that replace loses the race with a conflict.
    pub fn intrude_before_next_replace(&self, lease: Lease) {
        *self.faults.intrusion.lock() = Some(lease);
    }

    /// How many get/create/replace calls this connection received.
    pub fn calls(&self) -> u64 {
        self.faults.calls.load(Ordering::SeqCst)
    }

    fn stamp(&self, mut lease: Lease) -> Lease {
        let version = self.shared.next_version.fetch_add(1, Ordering::SeqCst);
        lease.metadata.resource_version = Some(version.to_string());
        lease
    }

    /// Stores a successful write of a connection; called with the channel locked for writing.
    fn record(&self, current: &mut Option<Lease>, lease: &Lease) {
        self.shared.writes.lock().push(lease.clone());
        self.shared.history.lock().push(Some(lease.clone()));
        *current = Some(lease.clone());
    }

    /// A watch delivering the state at its start, then every later state in order.
    fn ordered_changes(&self, epoch: u64) -> BoxStream<'static, Result<Option<Lease>, StoreError>> {
        let mut receiver = self.shared.lease.subscribe();
        // Read together: writers push to the history while holding the channel's write lock.
        let (first, next) = {
            let current = receiver.borrow_and_update();
            (current.clone(), self.shared.history.lock().len())
        };
        let shared = self.shared.clone();
        let faults = self.faults.clone();
        let state = (receiver, next, Some(first));
        futures::stream::unfold(state, move |(mut receiver, mut next, mut first)| {
            let (shared, faults) = (shared.clone(), faults.clone());
            async move {
                loop {
                    if faults.watch_epoch.load(Ordering::SeqCst) != epoch {
                        return futures::future::pending().await;
                    }
                    if let Some(first) = first.take() {
                        return Some((Ok(first), (receiver, next, None)));
                    }
                    let event = shared.history.lock().get(next).cloned();
                    if let Some(event) = event {
                        next += 1;
                        return Some((Ok(event), (receiver, next, None)));
                    }
                    receiver.changed().await.ok()?;
                    receiver.borrow_and_update();
                }
            }
        })
        .boxed()
    }

    /// Panics on the [`SPIN_LIMIT`]th call or watch at one instant (the caller's task ends, as
    /// with [`panic_next`](Self::panic_next), and the test fails).
    fn not_spinning(&self) {
        let now = tokio::time::Instant::now();
        let mut same_instant = self.faults.same_instant.lock();
        let count = match *same_instant {
            Some((at, count)) if at == now => count + 1,
            _ => 1,
        };
        *same_instant = Some((now, count));
        assert!(
            count < SPIN_LIMIT,
            "{count} lease store calls and watches at one instant: the caller spins"
        );
    }

    async fn enter(&self) -> Result<(), StoreError> {
        self.faults.calls.fetch_add(1, Ordering::SeqCst);
        self.not_spinning();
        if self.faults.panic_next.swap(false, Ordering::SeqCst) {
            panic!("injected panic in the lease store");
        }
        loop {
            let unhang = self.faults.unhang.notified();
            if !self.faults.hang.load(Ordering::SeqCst) {
                break;
            }
            unhang.await;
        }
        let latency = self.faults.latency_ms.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(latency)).await;
        }
        let injected =
            self.faults
                .fail_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if injected.is_ok() {
            return Err(StoreError::Injected);
        }
        Ok(())
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        async move {
            self.enter().await?;
            Ok(self.current())
        }
        .boxed()
    }

    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        async move {
            self.enter().await?;
            // Check and write under the channel's lock so two creates cannot both succeed.
            let mut created = None;
            self.shared.lease.send_if_modified(|current| {
                if current.is_some() {
                    return false;
                }
                let version = self.shared.next_version.fetch_add(1, Ordering::SeqCst);
                let mut lease = lease.clone();
                lease.metadata.resource_version = Some(version.to_string());
                self.record(current, &lease);
                created = Some(lease);
                true
            });
            created.ok_or(StoreError::Conflict)
        }
        .boxed()
    }

    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        async move {
            self.enter().await?;
            let intrusion = self.faults.intrusion.lock().take();
            if let Some(intrusion) = intrusion {
                self.put(Some(intrusion));
            }
            let mut replaced = None;
            self.shared.lease.send_if_modified(|current| {
                let Some(stored) = current else {
                    return false;
                };
                if stored.metadata.resource_version != lease.metadata.resource_version {
                    return false;
                }
                let version = self.shared.next_version.fetch_add(1, Ordering::SeqCst);
                let mut lease = lease.clone();
                lease.metadata.resource_version = Some(version.to_string());
                self.record(current, &lease);
                replaced = Some(lease);
                true
            });
            // A replace of a missing object is a 404 in the real API; the elector treats both as
            // "re-read", so a conflict is close enough here.
            replaced.ok_or(StoreError::Conflict)
        }
        .boxed()
    }

    fn changes(&self) -> BoxStream<'static, Result<Option<Lease>, StoreError>> {
        self.not_spinning();
        if self.faults.blind.load(Ordering::SeqCst) {
            return futures::stream::pending().boxed();
        }
        let epoch = self.faults.watch_epoch.load(Ordering::SeqCst);
        if self.faults.ordered.load(Ordering::SeqCst) {
            return self.ordered_changes(epoch);
        }
        let mut receiver = self.shared.lease.subscribe();
        // Like a watch: the current state first, then changes; intermediate states may be
        // coalesced (which a real watch can also do after a reconnect) unless the connection
        // asked for ordered watches.
        receiver.mark_changed();
        let faults = self.faults.clone();
        futures::stream::unfold(receiver, move |mut receiver| {
            let faults = faults.clone();
            async move {
                receiver.changed().await.ok()?;
                if faults.watch_epoch.load(Ordering::SeqCst) != epoch {
                    return futures::future::pending().await;
                }
                let lease = receiver.borrow_and_update().clone();
                Some((Ok(lease), receiver))
            }
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)] // tests fail loudly by design

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn named(name: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    fn names(events: &[Option<Lease>]) -> Vec<Option<String>> {
        events
            .iter()
            .map(|lease| lease.as_ref().and_then(|lease| lease.metadata.name.clone()))
            .collect()
    }

    #[tokio::test]
    async fn an_ordered_watch_delivers_every_state_and_a_plain_one_the_newest() {
        let store = MemoryLeaseStore::new();
        store.put(Some(named("first")));
        let plain = store.changes();
        store.ordered_watches(true);
        let ordered = store.changes();
        store.put(None);
        store.put(Some(named("second")));

        let ordered: Vec<_> = ordered
            .take(3)
            .map(|event| event.expect("ok"))
            .collect()
            .await;
        assert_eq!(
            names(&ordered),
            [Some("first".into()), None, Some("second".into())]
        );
        let plain: Vec<_> = plain
            .take(1)
            .map(|event| event.expect("ok"))
            .collect()
            .await;
        assert_eq!(names(&plain), [Some("second".into())], "coalesced");
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_ordered_watch_delivers_nothing_more() {
        let store = MemoryLeaseStore::new();
        store.ordered_watches(true);
        let mut ordered = store.changes();
        assert!(ordered.next().await.is_some(), "the state at the start");
        store.freeze_watches();
        store.put(Some(named("after")));
        let next = tokio::time::timeout(std::time::Duration::from_millis(10), ordered.next());
        assert!(next.await.is_err(), "frozen");
    }

    #[tokio::test(start_paused = true)]
    async fn calls_at_one_instant_are_served_up_to_the_spin_limit_and_again_once_time_moves() {
        let store = MemoryLeaseStore::new();
        for _ in 1..SPIN_LIMIT {
            store.get().await.expect("served");
        }
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        store.get().await.expect("served: time moved");
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the caller spins")]
    async fn a_caller_that_spins_at_one_instant_is_stopped() {
        let store = MemoryLeaseStore::new();
        for _ in 1..SPIN_LIMIT {
            let _ = store.changes();
        }
        let _ = store.get().await;
    }
}
