//! The running elector's handle: leadership, metrics, giving a term up, and stopping, shared by
//! every part of an app that works under the one Lease.

use std::sync::{
    Arc, OnceLock,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use tokio::{
    sync::{Mutex, mpsc},
    task::{AbortHandle, JoinHandle},
};
use tokio_util::sync::CancellationToken;

use super::{ElectorError, ElectorMetrics};
use crate::term::{Leadership, Term};

/// The running elector: its leadership value, its metrics, and the means to give a term up and
/// to stop it.
///
/// Give it to [`Runtime::run`](crate::Runtime::run), which returns
/// [`RuntimeError::ElectorLost`](crate::RuntimeError::ElectorLost) if the elector task ever ends
/// on its own; an app that uses the handle without a runtime must await
/// [`lost`](ElectorHandle::lost) alongside its work and stop when it completes.
///
/// Several controllers can work under one Lease: [`share`](ElectorHandle::share) gives each its
/// own handle on the same elector (one per [`Runtime`](crate::Runtime)). They all see the same
/// terms, so they start and stop together, and the Lease is released once every handle has been
/// released (each runtime drains first), so none of them loses work to the release.
///
/// Dropping the last handle without [`release`](ElectorHandle::release) stops the elector
/// without releasing the lease (it then expires after LeaseDuration).
#[derive(Debug)]
#[must_use = "dropping the handle stops the elector; hand it to `Runtime::run` or watch `lost()`"]
pub struct ElectorHandle {
    leadership: Leadership,
    shared: Arc<Shared>,
    /// Whether this handle already reported the loss of the elector (then `lost` is pending).
    reported: bool,
    /// Whether this handle was released (then dropping it changes nothing).
    released: bool,
}

/// What every handle on one elector shares.
///
/// No task of its own watches the elector task: whichever handle asks first awaits it, under
/// the lock, and records how it ended for the others. (A watcher task would change how tasks
/// interleave, and the simulation replays its seeds by the exact order of tasks.)
#[derive(Debug)]
struct Shared {
    stop: CancellationToken,
    /// The elector task, until it has been seen to end.
    task: Mutex<Option<JoinHandle<Result<(), ElectorError>>>>,
    abort: AbortHandle,
    /// How the elector task ended, once a handle has seen it.
    ended: OnceLock<Result<(), ElectorError>>,
    /// Handles not yet released or dropped.
    handles: AtomicUsize,
    /// A handle stopped with work still running ([`ElectorHandle::leave_to_expire`]): the
    /// Lease is not released when the last handle goes.
    leave_to_expire: AtomicBool,
    /// Terms to give up, read by the elector task.
    give_up: mpsc::UnboundedSender<u64>,
    /// The elector's counters, read by the crate's own tests through the handle (adopters take
    /// them from `LeaseElector::metrics`).
    #[cfg_attr(not(test), allow(dead_code))]
    metrics: ElectorMetrics,
}

// === impl ElectorHandle ===

impl ElectorHandle {
    /// A handle on the elector `task`, which stops when `stop` is cancelled and reads the terms
    /// to give up from the receiver matching `give_up`.
    pub(super) fn new(
        leadership: Leadership,
        stop: CancellationToken,
        task: JoinHandle<Result<(), ElectorError>>,
        give_up: mpsc::UnboundedSender<u64>,
        metrics: ElectorMetrics,
    ) -> Self {
        Self {
            leadership,
            shared: Arc::new(Shared {
                stop,
                abort: task.abort_handle(),
                task: Mutex::new(Some(task)),
                ended: OnceLock::new(),
                handles: AtomicUsize::new(1),
                leave_to_expire: AtomicBool::new(false),
                give_up,
                metrics,
            }),
            reported: false,
            released: false,
        }
    }

    /// A handle on leadership decided elsewhere (another election mechanism, or a test driving
    /// terms by hand through the matching [`LeadershipSender`](crate::term::LeadershipSender)).
    /// Releasing it only stops the handle; the sender's owner publishes `None`; giving a term
    /// up does nothing.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn external(leadership: Leadership) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            stopped.cancelled().await;
            Ok(())
        });
        let (give_up, _) = mpsc::unbounded_channel();
        Self::new(leadership, stop, task, give_up, ElectorMetrics::default())
    }

    /// Another handle on the same elector, for another controller (another
    /// [`Runtime`](crate::Runtime)) working under the same Lease: it sees the same terms, and
    /// the Lease is released only once every handle has been released.
    pub fn share(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::SeqCst);
        Self {
            leadership: self.leadership.clone(),
            shared: self.shared.clone(),
            reported: false,
            released: false,
        }
    }

    /// Whether other handles on this elector are still working (not released or dropped).
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.handles.load(Ordering::SeqCst) > 1
    }

    /// The current leadership: `Some(term)` while leading.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The elector's counters (adopters take them from
    /// [`LeaseElector::metrics`](crate::LeaseElector::metrics) before spawning).
    #[cfg(test)]
    pub(crate) fn metrics(&self) -> ElectorMetrics {
        self.shared.metrics.clone()
    }

    /// Gives `term` up if it is still the current term: the elector ends it (every handle sees
    /// `None`), releases the Lease so that another replica can lead at once, and competes again
    /// only after LeaseDuration, so a replica that cannot do its work does not take the Lease
    /// straight back. Counted in [`ElectorMetrics::terms_given_up`]. Does nothing if the term is
    /// already over; returns at once (the release happens on the elector's task).
    ///
    /// [`Runtime::run`](crate::Runtime::run) does this when a term's preparation times out; an
    /// app with its own controller loop can do it when its term cannot start (caches that do
    /// not sync, say).
    pub fn give_up(&self, term: &Term) {
        // The elector task reads until it ends; after that there is no term to give up.
        let _ = self.shared.give_up.send(term.id());
    }

    /// Completes only if the elector task ends without having been asked to (it never should):
    /// the caller must then stop, visibly. Cancel-safe; pending forever once reported.
    #[must_use = "a lost elector must stop the process: leading without an election is unsafe"]
    pub async fn lost(&mut self) -> ElectorError {
        if self.reported {
            return std::future::pending().await;
        }
        let result = self.shared.ended().await;
        self.reported = true;
        match result {
            Err(error) => error,
            Ok(()) => ElectorError::Exited,
        }
    }

    /// Stops competing once every handle on this elector has been released: the last release
    /// publishes `None`, releases the lease if this replica holds it, so that a follower can take
    /// over at once, and returns when the elector task has ended. An earlier release returns at
    /// once (the others still work under the term).
    pub async fn release(mut self) -> Result<(), ElectorError> {
        self.released = true;
        let reported = self.shared.ended.get().cloned();
        if self.shared.handles.fetch_sub(1, Ordering::SeqCst) > 1 {
            return match reported {
                Some(Err(error)) => Err(error),
                Some(Ok(())) => Err(ElectorError::Exited),
                None => Ok(()),
            };
        }
        if self.shared.leave_to_expire.load(Ordering::SeqCst) {
            // Another handle stopped with work still running: no release.
            self.shared.abort.abort();
            return Ok(());
        }
        self.shared.stop.cancel();
        match (reported, self.shared.ended().await) {
            // Its end was already reported (by `lost`): it ended without being asked to.
            (Some(_), Ok(())) => Err(ElectorError::Exited),
            (_, result) => result,
        }
    }

    /// Stops this handle without releasing the Lease, for a runtime that stops while work of
    /// its term is still running: a write of that work may still be on the wire, and a released
    /// Lease would let the next leader start before it lands. Left to expire, the Lease gives
    /// that write the room a crash gives it. The elector stops (renewing nothing more) once
    /// every handle is released or dropped, and the Lease is not released then either.
    pub(crate) fn leave_to_expire(mut self) {
        self.released = true;
        self.shared.leave_to_expire.store(true, Ordering::SeqCst);
        if self.shared.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.abort.abort();
        }
    }
}

impl Drop for ElectorHandle {
    fn drop(&mut self) {
        if !self.released && self.shared.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.abort.abort();
        }
    }
}

// === impl Shared ===

impl Shared {
    /// How the elector task ended, waiting for it if it runs. Cancel-safe: a wait dropped
    /// midway leaves the task for the next one.
    async fn ended(&self) -> Result<(), ElectorError> {
        let mut task = self.task.lock().await;
        if let Some(ended) = self.ended.get() {
            return ended.clone();
        }
        let Some(running) = task.as_mut() else {
            return Err(ElectorError::Exited);
        };
        let result = match running.await {
            Ok(result) => result,
            Err(join) => Err(ElectorError::Panicked(join.to_string())),
        };
        *task = None;
        self.ended.get_or_init(|| result).clone()
    }
}
