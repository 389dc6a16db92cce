//! The gate: event handlers run only while leading, with fresh per-term state.
//!
//! The app's watches run on every replica all the time (warm caches) and push every event through
//! [`Gate::dispatch`]; the closure runs only while a term is registered, so a follower enqueues
//! nothing. Registration and deregistration happen under ONE lock and are ordered by term id:
//!
//! - [`Gate::start`] for term t builds fresh per-term state with the user's factory (this is where
//!   an app creates its stale-cache tracker: a tracker that survived a lost term would believe
//!   writes that others have since undone, and the app would stay stuck on "cache out of date"),
//!   scopes the queue to t, and replays every cached object through the handlers, all before any
//!   new event can be dispatched.
//! - [`Gate::stop`] for term t deregisters, and the queue drops t's queued and retrying keys. A
//!   term that was stopped (or is older than one that started) can never be started again, so a
//!   late "started(t)" after "stopped(t)" leaves nothing registered, and a duplicate "started(t)"
//!   registers nothing twice.
//!
//! In-flight work of a stopped term is not interrupted here: its [`Fence`] refuses its next write.
//!
//! Events that race with a replay may enqueue a key twice (once by the replay, once by the event
//! dispatched right after it); the queue deduplicates keys, so this costs at most one extra
//! reconcile.

#[cfg(test)]
mod tests;

use std::sync::Arc;

use parking_lot::RwLock;

use crate::{
    fence::Fence,
    queue::{QueueKey, TermQueue, WorkQueue},
    term::Term,
};

/// Builds the fresh per-term state when a term starts.
pub(crate) type StateFactory<S> = Arc<dyn Fn(&Term) -> S + Send + Sync>;

/// Passes every cached object through the handlers when a term starts (and on resync).
pub(crate) type Replay<K, S> = Arc<dyn Fn(&TermContext<K, S>) + Send + Sync>;

/// Everything work of one term needs: the term, its fence, its fresh state, and a way to queue
/// keys for it. Cheap to clone.
///
/// Handlers get it through [`Dispatcher::dispatch`] (only while leading), the reconciler in
/// [`Reconciler::replay`](crate::Reconciler::replay) and
/// [`Reconciler::reconcile`](crate::Reconciler::reconcile). Keys queued through a context of a
/// term that is over are ignored.
pub struct TermContext<K, S> {
    term: Term,
    fence: Fence,
    state: Arc<S>,
    queue: TermQueue<K>,
}

/// The handle an app's event handlers (watch streams) run through: the closure given to
/// [`dispatch`](Self::dispatch) runs only while this replica leads, with the current term's
/// context, so a handler can queue keys for the current term and nothing else. It cannot start,
/// stop or resync terms. Cheap to clone; made by [`Runtime::dispatcher`](crate::Runtime::dispatcher).
pub struct Dispatcher<K, S> {
    gate: Gate<K, S>,
}

/// Handler registration gated on leadership. Cheap to clone.
pub(crate) struct Gate<K, S> {
    inner: Arc<Inner<K, S>>,
}

struct Inner<K, S> {
    registration: RwLock<Registration<K, S>>,
    queue: WorkQueue<K>,
    factory: StateFactory<S>,
    replay: Replay<K, S>,
    /// `false` only in tests that switch fresh state off ([`Safeguards`](crate::Safeguards)):
    /// a term then reuses the state of the term before it.
    fresh_state: bool,
}

struct Registration<K, S> {
    /// The newest term ever started or stopped: older or equal terms can no longer start.
    newest: u64,
    /// No more intake (shutting down): dispatch and starts are refused.
    closed: bool,
    active: Option<TermContext<K, S>>,
    /// The last term's state, kept only when fresh state is switched off.
    previous_state: Option<Arc<S>>,
}

// === impl TermContext ===

impl<K: QueueKey, S> TermContext<K, S> {
    /// The fence to check immediately before every write.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The per-term state built by the factory.
    pub fn state(&self) -> &Arc<S> {
        &self.state
    }

    /// Queues `key` for this term; `false` if the term is over (or shutting down) and the key
    /// was ignored. A key already queued is not queued twice.
    pub fn enqueue(&self, key: K) -> bool {
        self.queue.add(key)
    }
}

impl<K, S> Clone for TermContext<K, S> {
    fn clone(&self) -> Self {
        Self {
            term: self.term.clone(),
            fence: self.fence.clone(),
            state: self.state.clone(),
            queue: self.queue.clone(),
        }
    }
}

impl<K, S> std::fmt::Debug for TermContext<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermContext")
            .field("term", &self.term)
            .finish_non_exhaustive()
    }
}

// === impl Dispatcher ===

impl<K: QueueKey, S: Send + Sync + 'static> Dispatcher<K, S> {
    pub(crate) fn new(gate: Gate<K, S>) -> Self {
        Self { gate }
    }

    /// Runs `handler` with the current term's context while this replica leads and returns its
    /// result; returns `None`, running nothing, on a follower, while a term is being prepared,
    /// or after shutdown began. Handlers run under the runtime's registration lock (so a term
    /// never starts or ends halfway through one): keep them short and synchronous, and never
    /// call `dispatch` from inside one.
    pub fn dispatch<R>(&self, handler: impl FnOnce(&TermContext<K, S>) -> R) -> Option<R> {
        self.gate.dispatch(handler)
    }
}

impl<K, S> Clone for Dispatcher<K, S> {
    fn clone(&self) -> Self {
        Self {
            gate: self.gate.clone(),
        }
    }
}

impl<K, S> std::fmt::Debug for Dispatcher<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").finish_non_exhaustive()
    }
}

// === impl Gate ===

impl<K: QueueKey, S: Send + Sync + 'static> Gate<K, S> {
    /// A gate feeding `queue`, building per-term state with `factory` and replaying caches with
    /// `replay`. Nothing is registered until [`start`](Self::start).
    /// `fresh_state` is `true` outside tests.
    pub fn new(
        queue: WorkQueue<K>,
        factory: StateFactory<S>,
        replay: Replay<K, S>,
        fresh_state: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                registration: RwLock::new(Registration {
                    newest: 0,
                    closed: false,
                    active: None,
                    previous_state: None,
                }),
                queue,
                factory,
                replay,
                fresh_state,
            }),
        }
    }

    /// Runs `handler` with the current term's context if a term is registered; returns `None`
    /// (and runs nothing) on a follower or after intake closed. Handlers run under the gate's
    /// read lock: keep them short and synchronous, and never call the gate from inside one.
    pub fn dispatch<R>(&self, handler: impl FnOnce(&TermContext<K, S>) -> R) -> Option<R> {
        let registration = self.inner.registration.read();
        if registration.closed {
            return None;
        }
        registration.active.as_ref().map(handler)
    }

    /// Registers `term` (guarded by `fence`): fresh state, queue scoped to the term, then replay
    /// of every cached object, all under the lock. Returns `false`, registering nothing, for a
    /// term that is not newer than every term seen, or after intake closed.
    pub fn start(&self, term: Term, fence: Fence) -> bool {
        let mut registration = self.inner.registration.write();
        if registration.closed || term.id() <= registration.newest {
            tracing::debug!(term = term.id(), "ignoring a late or repeated start");
            return false;
        }
        registration.newest = term.id();
        if let Some(previous) = registration.active.take() {
            self.inner.queue.end_term(previous.term.id());
        }
        // A previous state is kept only while fresh state is switched off.
        let state = match registration.previous_state.take() {
            Some(previous) => previous,
            None => Arc::new((self.inner.factory)(&term)),
        };
        if !self.inner.fresh_state {
            registration.previous_state = Some(state.clone());
        }
        let context = TermContext {
            state,
            queue: self.inner.queue.begin_term(term.id()),
            fence,
            term,
        };
        (self.inner.replay)(&context);
        tracing::info!(
            term = context.term.id(),
            queued = self.inner.queue.depth(),
            "handlers registered; caches replayed"
        );
        registration.active = Some(context);
        true
    }

    /// Deregisters `term` (and any older one still registered) and drops its queued and retrying
    /// keys. Idempotent; also makes a later start of `term` a no-op.
    pub fn stop(&self, term: u64) -> bool {
        let mut registration = self.inner.registration.write();
        registration.newest = registration.newest.max(term);
        let stopping = registration
            .active
            .as_ref()
            .is_some_and(|active| active.term.id() <= term);
        if !stopping {
            return false;
        }
        if let Some(active) = registration.active.take() {
            self.inner.queue.end_term(active.term.id());
            tracing::info!(term = active.term.id(), "handlers deregistered");
        }
        true
    }

    /// Replays every cached object through the handlers again (periodic resync), if `term` is
    /// registered and intake is open.
    pub fn resync(&self, term: u64) -> bool {
        let registration = self.inner.registration.read();
        match &registration.active {
            Some(active) if active.term.id() == term && !registration.closed => {
                (self.inner.replay)(active);
                true
            }
            _ => false,
        }
    }

    /// Stops intake for good (shutdown): no handler runs any more and no term starts, but the
    /// registered term's context stays available to workers draining the queue.
    pub fn close_intake(&self) {
        self.inner.registration.write().closed = true;
    }

    /// The registered term's context, if `term` is registered (intake open or not).
    pub fn context(&self, term: u64) -> Option<TermContext<K, S>> {
        let registration = self.inner.registration.read();
        registration
            .active
            .as_ref()
            .filter(|active| active.term.id() == term)
            .cloned()
    }

    /// The id of the registered term, if any.
    #[cfg(test)]
    pub fn registered_term(&self) -> Option<u64> {
        let registration = self.inner.registration.read();
        registration.active.as_ref().map(|active| active.term.id())
    }
}

impl<K, S> Clone for Gate<K, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K, S> std::fmt::Debug for Gate<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}
