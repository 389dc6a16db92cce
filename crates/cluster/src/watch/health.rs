//! What one watch tells the rest of the process: synced, stalled, re-listing, how old its cache
//! is, how far it has read, and whether it has shown itself up to date since a request.
//!
//! A watch can fail quietly: a connection kept open by a proxy or NAT that passes no more bytes
//! freezes the cache without any error. The watch therefore reports every sign of life (an
//! event, a bookmark, a list, a clean end of a stream), and readiness and the acquisition
//! barrier ([`super::fresh`]) read them here.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

// What the rest of the process may ask of a watch (a probe: restart the stream with a short
// server timeout, which proves the cache up to date; or a re-list with plain paged LISTs), and
// the reading of resourceVersions (a version that is not a number is never taken as proof of
// freshness, so the barrier probes instead): the watch loop's, in the `kube-watch-loop` crate.
pub use kube_watch_loop::{Command, version_number};

/// The state of one watched kind, shared by its watch task, readiness, metrics and the
/// acquisition barrier.
#[derive(Debug)]
pub struct KindHealth {
    kind: &'static str,
    /// Silence longer than this is a stall.
    stall_bound: Duration,
    synced: watch::Sender<bool>,
    stalled: AtomicBool,
    inner: Mutex<Timing>,
    /// The newest resourceVersion the watch has read (0: none, or not a number).
    read_version: watch::Sender<u64>,
    /// Requests made (see [`KindHealth::request`]) and the newest one the watch has answered.
    requested: AtomicU64,
    answered: watch::Sender<u64>,
    /// The request made when the watch last lost its stream: until it is answered, the cache
    /// may lag behind changes made since (see [`KindHealth::is_caught_up`]).
    lost_at: AtomicU64,
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Debug)]
struct Timing {
    /// The last sign of life: an event, a bookmark, a completed list, a stream ended by the
    /// server.
    last_seen: Instant,
    /// Since when a list has been running, if one is.
    listing_since: Option<Instant>,
}

// === impl KindHealth ===

impl KindHealth {
    /// The health of a watch of `kind`, and the receiver of its commands.
    pub fn new(
        kind: &'static str,
        stall_bound: Duration,
    ) -> (Self, mpsc::UnboundedReceiver<Command>) {
        let (commands, receiver) = mpsc::unbounded_channel();
        let health = Self {
            kind,
            stall_bound,
            synced: watch::Sender::new(false),
            stalled: AtomicBool::new(false),
            inner: Mutex::new(Timing {
                last_seen: Instant::now(),
                listing_since: None,
            }),
            read_version: watch::Sender::new(0),
            requested: AtomicU64::new(0),
            answered: watch::Sender::new(0),
            lost_at: AtomicU64::new(0),
            commands,
        };
        (health, receiver)
    }

    /// The watched kind.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The stall bound.
    pub fn stall_bound(&self) -> Duration {
        self.stall_bound
    }

    /// Whether the first complete list is in the cache.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the first complete list is in the cache.
    pub async fn synced(&self) {
        let mut synced = self.synced.subscribe();
        // The sender lives in `self`: the wait ends only by the value.
        let _ = synced.wait_for(|synced| *synced).await;
    }

    /// Whether the cache can be trusted now: synced, not stalled, and not re-listing for longer
    /// than the stall bound.
    pub fn is_ready(&self) -> bool {
        let listing_too_long = self
            .inner
            .lock()
            .listing_since
            .is_some_and(|since| since.elapsed() > self.stall_bound);
        self.is_synced() && !self.stalled.load(Ordering::SeqCst) && !listing_too_long
    }

    /// Time since the last sign of life of the watch.
    pub fn age(&self) -> Duration {
        self.inner.lock().last_seen.elapsed()
    }

    /// The newest resourceVersion the watch has read (0 when unknown).
    pub fn read_version(&self) -> u64 {
        *self.read_version.borrow()
    }

    /// Asks the watch for `command(id)`; returns `id`, which [`KindHealth::answered`] reaches once
    /// the watch has shown itself up to date by a stream or list started after this call.
    pub fn request(&self, command: fn(u64) -> Command) -> u64 {
        let id = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        // The receiver lives as long as the watch task; if it is gone, the supervisor ends the
        // process and nobody waits for this answer.
        let _ = self.commands.send(command(id));
        id
    }

    /// Waits until the request `id` is answered: a stream or list started after it has shown the
    /// cache up to date with the API server instance that served it.
    pub async fn answered(&self, id: u64) {
        let mut answered = self.answered.subscribe();
        // The sender lives as long as `self`.
        let _ = answered.wait_for(|answered| *answered >= id).await;
    }

    /// Waits until the watch has read `version` or newer (an event or a bookmark at or past it).
    /// Only this proves the cache holds everything up to a version read elsewhere: a stream
    /// started after that read may come from another API server instance whose watch cache
    /// lags (two servers behind one address; simulation seed 13843).
    pub async fn reached(&self, version: u64) {
        let mut read = self.read_version.subscribe();
        let _ = read.wait_for(|read| *read >= version).await;
    }

    /// Whether the cache has caught up since the watch last lost its stream (an error, a
    /// stall, a 410): a stream or list started after the loss has shown it up to date. Until
    /// then its watermark stays where it was, so the fresh-view rule reads the API server for
    /// what this kind cannot vouch for; a pass that waits then is counted as `lost_watch`.
    pub fn is_caught_up(&self) -> bool {
        *self.answered.borrow() >= self.lost_at.load(Ordering::SeqCst)
    }

    // --- reported by the watch task ---

    /// The watch lost its stream: a request, answered by the next stream or list to show the
    /// cache up to date (it starts after this call).
    pub(super) fn lost(&self) {
        let id = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.lost_at.fetch_max(id, Ordering::SeqCst);
        tracing::debug!(
            kind = self.kind,
            "watch lost; planning waits until it catches up"
        );
    }

    /// The watch read something: an event, a bookmark, a list, a stream the server ended.
    pub(super) fn seen(&self, version: Option<u64>) {
        self.inner.lock().last_seen = Instant::now();
        if self.stalled.swap(false, Ordering::SeqCst) {
            tracing::info!(kind = self.kind, "watch alive again");
        }
        if let Some(version) = version {
            self.read_version.send_if_modified(|read| {
                let newer = version > *read;
                if newer {
                    *read = version;
                }
                newer
            });
        }
    }

    /// The watch heard nothing for the stall bound.
    pub(super) fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// A list starts.
    pub(super) fn listing(&self) {
        self.inner.lock().listing_since = Some(Instant::now());
    }

    /// A list is complete: the cache is synced.
    pub(super) fn listed(&self) {
        self.inner.lock().listing_since = None;
        self.synced.send_replace(true);
    }

    /// A stream or list started after request `id` has shown the cache up to date.
    pub(super) fn answer(&self, id: u64) {
        self.answered.send_if_modified(|answered| {
            let newer = id > *answered;
            if newer {
                *answered = id;
            }
            newer
        });
    }

    /// The newest request made so far (a stream started now answers up to it).
    pub(super) fn latest_request(&self) -> u64 {
        self.requested.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ready_needs_a_sync_and_no_stall_and_no_long_list() {
        let (health, _commands) = KindHealth::new("Service", Duration::from_secs(30));
        assert!(!health.is_ready(), "not synced yet");
        health.listing();
        health.listed();
        assert!(health.is_ready());
        health.stall();
        assert!(!health.is_ready(), "stalled");
        health.seen(None);
        assert!(health.is_ready(), "alive again");
        health.listing();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(health.is_ready(), "a re-list within the bound");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!health.is_ready(), "a re-list past the bound");
        health.listed();
        assert!(health.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn age_counts_from_the_last_sign_of_life() {
        let (health, _commands) = KindHealth::new("Service", Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(health.age(), Duration::from_secs(7));
        health.seen(Some(5));
        assert_eq!(health.age(), Duration::ZERO);
        health.seen(Some(3));
        assert_eq!(health.read_version(), 5, "versions only move forward");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_answered_by_its_id_and_a_version_by_reading_it() {
        let (health, mut commands) = KindHealth::new("Service", Duration::from_secs(30));
        let id = health.request(Command::Probe);
        assert_eq!(commands.recv().await, Some(Command::Probe(id)));
        let reaching = async { health.reached(100).await };
        tokio::pin!(reaching);
        health.answer(id);
        health.seen(Some(99));
        assert!(
            tokio::time::timeout(Duration::from_millis(1), &mut reaching)
                .await
                .is_err(),
            "an answer below the version does not reach it"
        );
        health.seen(Some(100));
        tokio::time::timeout(Duration::from_millis(1), &mut reaching)
            .await
            .expect("the version was read");

        let id = health.request(Command::Relist);
        let answering = async { health.answered(id).await };
        tokio::pin!(answering);
        assert!(
            tokio::time::timeout(Duration::from_millis(1), &mut answering)
                .await
                .is_err(),
            "not answered yet"
        );
        health.answer(id);
        tokio::time::timeout(Duration::from_millis(1), answering)
            .await
            .expect("answered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_watch_is_caught_up_only_once_a_later_stream_answers() {
        let (health, _commands) = KindHealth::new("Service", Duration::from_secs(30));
        assert!(health.is_caught_up(), "never lost");
        let barrier = health.request(Command::Probe);
        health.lost();
        health.answer(barrier);
        assert!(
            !health.is_caught_up(),
            "a stream started before the loss does not answer it"
        );
        health.seen(Some(u64::MAX));
        assert!(!health.is_caught_up(), "nor does a version read");
        health.answer(health.latest_request());
        assert!(
            health.is_caught_up(),
            "a stream started after the loss answered it"
        );
    }

    #[test]
    fn only_numeric_versions_count() {
        assert_eq!(version_number("12345"), 12345);
        assert_eq!(version_number("opaque"), 0);
    }
}
