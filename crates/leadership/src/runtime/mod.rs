//! The runtime: elector, gate, queue and workers tied together for an app.
//!
//! ```text
//! ElectorHandle ──leadership──► Runtime ──start(t)/stop(t)──► Gate ──keys──► WorkQueue ──► workers
//!                                  │                                                      │
//!                                  └──────── drain, then release on shutdown ◄────────────┘
//! ```

mod config;
#[cfg(test)]
mod tests;
mod worker;

use std::{fmt::Display, future::Future, sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};
use tokio::{
    task::JoinSet,
    time::{Instant, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use self::config::{RuntimeConfig, RuntimeConfigBuilder, RuntimeConfigError};
use self::worker::Worker;
use crate::{
    elector::{ElectorError, ElectorHandle},
    fence::{Fence, FenceMetrics},
    gate::{Dispatcher, Gate, TermContext},
    queue::{QueueKey, QueueMetrics, WorkQueue},
    term::{Leadership, Term},
};

/// What to do with a key after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the next event.
    Done,
    /// Reconcile the key again after this delay (e.g. the cache is behind what this term wrote).
    RequeueAfter(Duration),
}

/// Why the runtime stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The elector stopped on its own. Not retryable: exit the process so that it restarts.
    #[error("leader election stopped: {0}")]
    ElectorLost(#[from] ElectorError),
    /// A worker ended while the runtime was running (a reconcile panicked). The term was ended
    /// and the Lease released before this is returned. Not retryable: a bug; exit the process
    /// rather than keep running with fewer workers.
    #[error("a worker stopped unexpectedly: {0}")]
    WorkerFailed(String),
}

/// What an app plugs into the [`Runtime`]: the three things it does for a term.
///
/// The runtime calls [`start_term`](Self::start_term) and then [`replay`](Self::replay) under the
/// gate's lock when a term starts (so the replay runs with the term's fresh state and handlers
/// registered), and [`reconcile`](Self::reconcile) on a worker for each queued key of that term.
pub trait Reconciler: Send + Sync + 'static {
    /// What the queue holds (a Service key, for example).
    type Key: QueueKey;
    /// Per-term state, built fresh for every term and dropped with it (a slice tracker, for
    /// example: state carried across terms can be stale, see the crate docs).
    type TermState: Send + Sync + 'static;
    /// Why a reconcile failed; failed keys are retried with backoff.
    type Error: Display + Send + 'static;

    /// Runs when a term is acquired, before its state is built and the caches are replayed:
    /// the app brings what the replay reads up to date (for example, caches at least as new as
    /// a point read from the API server after the acquisition). The term's handlers are not
    /// registered until it completes; if the term ends first, the future is dropped. The
    /// default does nothing.
    fn prepare_term(&self, term: &Term) -> impl Future<Output = ()> + Send + 'static {
        let _ = term;
        std::future::ready(())
    }

    /// Builds the state of a term that is starting.
    fn start_term(&self, term: &Term) -> Self::TermState;

    /// Feeds every cached object through the handlers (from the app's caches, not the API),
    /// enqueueing what they map to; also used for the periodic resync.
    fn replay(&self, context: &TermContext<Self::Key, Self::TermState>);

    /// Reconciles one key in its term's context; every write must pass the context's fence.
    fn reconcile(
        &self,
        key: Self::Key,
        context: TermContext<Self::Key, Self::TermState>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send + 'static;
}

type ReconcileFn<K, S, E> =
    Arc<dyn Fn(K, TermContext<K, S>) -> BoxFuture<'static, Result<Action, E>> + Send + Sync>;

type PrepareFn = Arc<dyn Fn(&Term) -> BoxFuture<'static, ()> + Send + Sync>;

/// A term acquired whose preparation ([`Reconciler::prepare_term`]) has not finished: its
/// handlers are not registered yet.
struct Preparing {
    term: Term,
    ready: BoxFuture<'static, ()>,
    /// When the term is given up if its preparation has not finished.
    deadline: Instant,
}

/// A controller's runtime: handlers gated on leadership, a per-term work queue, workers, and a
/// graceful shutdown (stop intake, drain, release).
#[must_use = "a runtime does nothing until `run` is awaited"]
pub struct Runtime<K, S, E> {
    config: RuntimeConfig,
    gate: Gate<K, S>,
    queue: WorkQueue<K>,
    reconcile: ReconcileFn<K, S, E>,
    prepare: PrepareFn,
    fence_metrics: FenceMetrics,
}

// === impl Runtime ===

impl<K, S, E> Runtime<K, S, E>
where
    K: QueueKey,
    S: Send + Sync + 'static,
    E: Display + Send + 'static,
{
    /// A runtime driving `app`: its per-term state, replay and reconcile (see [`Reconciler`]).
    pub fn new<A>(config: RuntimeConfig, app: A) -> Self
    where
        A: Reconciler<Key = K, TermState = S, Error = E>,
    {
        let app = Arc::new(app);
        let queue = WorkQueue::new(&config.queue);
        let (term_app, replay_app, prepare_app) = (app.clone(), app.clone(), app.clone());
        let gate = Gate::new(
            queue.clone(),
            Arc::new(move |term: &Term| term_app.start_term(term)),
            Arc::new(move |context: &TermContext<K, S>| replay_app.replay(context)),
            config.safeguards.fresh_state,
        );
        Self {
            config,
            gate,
            queue,
            reconcile: Arc::new(move |key, context| app.reconcile(key, context).boxed()),
            prepare: Arc::new(move |term| prepare_app.prepare_term(term).boxed()),
            fence_metrics: FenceMetrics::default(),
        }
    }

    /// The handle the app's watches dispatch events through: handlers run only while leading
    /// and can only queue keys for the current term.
    pub fn dispatcher(&self) -> Dispatcher<K, S> {
        Dispatcher::new(self.gate.clone())
    }

    /// Read-only counters and gauges of the work queue, for a metrics layer.
    pub fn queue_metrics(&self) -> QueueMetrics {
        QueueMetrics::of(self.queue.clone())
    }

    #[cfg(test)]
    pub(crate) fn gate(&self) -> Gate<K, S> {
        self.gate.clone()
    }

    #[cfg(test)]
    pub(crate) fn queue(&self) -> WorkQueue<K> {
        self.queue.clone()
    }

    /// Counts of writes refused by this runtime's fences.
    pub fn fence_metrics(&self) -> FenceMetrics {
        self.fence_metrics.clone()
    }

    /// Runs until `shutdown` is cancelled: registers handlers for each term the elector starts
    /// and deregisters them when it ends. On shutdown: stops intake, drains queued and in-flight
    /// work within the drain timeout (writes still fenced), then releases the lease, then returns
    /// `Ok`. If a reconcile is still running then (the drain timed out, or the term was lost
    /// while draining), the lease is left to expire instead of released, since a write of it may
    /// still be on the wire. A follower returns at once.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::ElectorLost`] if the elector task ends on its own (a panic, a bug): the
    /// handlers are deregistered and the workers stopped first. The caller must stop the process
    /// (exit non-zero, so that it is restarted) rather than keep running without an election.
    /// [`RuntimeError::WorkerFailed`] if a reconcile panicked: the term is ended first (its
    /// queued keys dropped, the other workers' in-flight reconciles given the drain timeout) and
    /// the Lease released, so a standby takes over at once (with a shared elector
    /// ([`ElectorHandle::share`]) the term is given up, so the other runtimes stop too).
    ///
    /// A term whose [`Reconciler::prepare_term`] does not finish within the prepare timeout is
    /// given up ([`ElectorHandle::give_up`]) and `run` carries on as a follower.
    #[must_use = "the result says whether the elector was lost; it must not be ignored"]
    pub async fn run(
        self,
        mut elector: ElectorHandle,
        shutdown: CancellationToken,
    ) -> Result<(), RuntimeError> {
        let mut leadership = elector.leadership();
        let mut workers = self.spawn_workers();
        // `current`: the term whose handlers are registered; `preparing`: a term acquired whose
        // preparation has not finished (at most one of the two is set).
        let mut current: Option<Term> = None;
        let mut preparing: Option<Preparing> = None;
        let mut next_resync = self.next_resync();
        let mut leadership_open = true;
        // Why the run fails, if it does (a worker stopped): it ends with this error after the
        // release.
        let mut failed: Option<RuntimeError> = None;
        let initial = leadership.borrow_and_update().clone();
        self.apply(&mut current, &mut preparing, initial);

        loop {
            let prepare_deadline = preparing.as_ref().map(|p| p.deadline);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                error = elector.lost() => {
                    if let Some(term) = current.take() {
                        self.gate.stop(term.id());
                    }
                    self.queue.close();
                    workers.abort_all();
                    return Err(RuntimeError::ElectorLost(error));
                }
                changed = leadership.changed(), if leadership_open => {
                    let next = if changed.is_ok() {
                        leadership.borrow_and_update().clone()
                    } else {
                        // Nobody can publish leadership any more: follow. If the elector task
                        // ended, `lost` reports it on the next turn.
                        leadership_open = false;
                        None
                    };
                    self.apply(&mut current, &mut preparing, next);
                }
                () = async {
                    match preparing.as_mut() {
                        Some(preparing) => (&mut preparing.ready).await,
                        None => std::future::pending().await,
                    }
                }, if preparing.is_some() => {
                    if let Some(Preparing { term, .. }) = preparing.take() {
                        self.start(&mut current, term, &leadership);
                    }
                }
                Some(ended) = workers.join_next() => {
                    // A bug. End the term as a shutdown would, so a standby takes over at once
                    // instead of a LeaseDuration later: stop the term (its queued keys are
                    // dropped; the panicked key stays in flight forever, so no queue drain),
                    // let the other workers finish what they are writing, release, then fail.
                    let reason = match ended {
                        Ok(()) => "it returned".to_string(),
                        Err(error) => error.to_string(),
                    };
                    warn!(%reason, "a worker stopped; ending the term and releasing the lease");
                    failed = Some(RuntimeError::WorkerFailed(reason));
                    break;
                }
                () = sleep_until(prepare_deadline.unwrap_or_else(Instant::now)),
                    if prepare_deadline.is_some() =>
                {
                    // Its handlers were never registered: nothing queued, nothing to drain. The
                    // elector ends the term, releases the Lease so a standby leads, and competes
                    // again after a hold-off; this runtime follows meanwhile.
                    if let Some(Preparing { term, .. }) = preparing.take() {
                        let waited = self.config.prepare_timeout;
                        warn!(
                            term = term.id(),
                            ?waited,
                            "term preparation timed out; giving the term up"
                        );
                        elector.give_up(&term);
                    }
                }
                () = sleep_until(next_resync.unwrap_or_else(Instant::now)), if next_resync.is_some() => {
                    if let Some(term) = &current {
                        debug!(term = term.id(), "periodic resync");
                        self.gate.resync(term.id());
                    }
                    next_resync = self.next_resync();
                }
            }
        }

        // A term still preparing has registered nothing and queued nothing: release at once.
        drop(preparing);
        self.gate.close_intake();
        let deadline = Instant::now() + self.config.drain_timeout;
        if failed.is_some() {
            if let Some(term) = &current {
                self.gate.stop(term.id());
            }
        } else if current.is_some() && self.config.safeguards.drain {
            self.drain(deadline, &mut current, &mut leadership).await;
        }
        self.queue.close();
        // Wait for in-flight work only while its term lives: a lost term's work can write
        // nothing more (its fence refuses), so a call hanging on a dead connection must not
        // hold the exit until the drain deadline.
        if current.is_some() && self.config.safeguards.drain {
            while let Ok(Some(_)) = tokio::time::timeout_at(deadline, workers.join_next()).await {}
        }
        // A reconcile still running now (its term lost meanwhile, or hanging past the drain
        // deadline) may have a write on the wire that lands whenever it lands. Released, the
        // Lease would let the next leader start at once, before that write; left to expire, it
        // gives the write the same room as a crash does (LeaseDuration after the last renewal,
        // beyond the fence's RenewDeadline). A worker that panicked leaves its key in flight for
        // good and is released as before.
        let abandoned = self.queue.in_flight();
        workers.abort_all();
        if failed.is_some()
            && let Some(term) = &current
            && elector.is_shared()
        {
            // The other runtimes under this Lease must stop too: the release waits for them.
            elector.give_up(term);
        }
        if failed.is_none() && abandoned > 0 && self.config.safeguards.drain {
            warn!(
                in_flight = abandoned,
                "work still in flight after the drain; leaving the lease to expire instead of \
                 releasing it"
            );
            elector.leave_to_expire();
        } else {
            elector.release().await?;
        }
        if let Some(term) = current.take() {
            self.gate.stop(term.id());
        }
        if let Some(error) = failed {
            return Err(error);
        }
        info!("stopped");
        Ok(())
    }

    /// Waits until the queue is idle or the drain timeout passes, following leadership changes
    /// meanwhile (a lost term drops its queue, which ends the drain).
    async fn drain(
        &self,
        deadline: Instant,
        current: &mut Option<Term>,
        leadership: &mut Leadership,
    ) {
        info!(
            queued = self.queue.depth(),
            in_flight = self.queue.in_flight(),
            "draining before releasing the lease"
        );
        loop {
            tokio::select! {
                biased;
                () = self.queue.wait_idle() => {
                    // Delayed keys (retries, Services waiting for the cache to show this term's
                    // writes) are handed over: the next leader replays every cached object.
                    info!(handed_over = self.queue.waiting(), "drained");
                    return;
                }
                () = sleep_until(deadline) => {
                    warn!(
                        queued = self.queue.depth(),
                        in_flight = self.queue.in_flight(),
                        waiting = self.queue.waiting(),
                        "drain timed out"
                    );
                    return;
                }
                changed = leadership.changed() => {
                    // Only losing the term matters now: intake is closed, no new term starts.
                    // A different term (a loss and re-acquisition seen at once) is a loss too.
                    let lost = changed.is_err() || *leadership.borrow_and_update() != *current;
                    if lost {
                        if let Some(term) = current.take() {
                            self.gate.stop(term.id());
                        }
                        return;
                    }
                }
            }
        }
    }

    /// Follows a leadership change: a term that ends is stopped (or its preparation dropped); a
    /// new term is prepared first, and started once its preparation finishes.
    fn apply(
        &self,
        current: &mut Option<Term>,
        preparing: &mut Option<Preparing>,
        next: Option<Term>,
    ) {
        let held = current.as_ref().or(preparing.as_ref().map(|p| &p.term));
        if held == next.as_ref() {
            return;
        }
        if let Some(old) = current.take() {
            self.gate.stop(old.id());
        }
        if let Some(old) = preparing.take() {
            debug!(term = old.term.id(), "term ended while preparing");
        }
        if let Some(term) = next {
            *preparing = Some(Preparing {
                ready: (self.prepare)(&term),
                deadline: Instant::now() + self.config.prepare_timeout,
                term,
            });
        }
    }

    /// Registers the handlers of a prepared term (the gate builds its state and replays).
    fn start(&self, current: &mut Option<Term>, term: Term, leadership: &Leadership) {
        let fence = Fence::new(
            term.clone(),
            leadership.clone(),
            self.config.fence_margin,
            self.fence_metrics.clone(),
        )
        .enforced(self.config.safeguards.fence);
        self.gate.start(term.clone(), fence);
        *current = Some(term);
    }

    fn next_resync(&self) -> Option<Instant> {
        self.config
            .resync_period
            .map(|period| Instant::now() + period)
    }

    fn spawn_workers(&self) -> JoinSet<()> {
        let mut workers = JoinSet::new();
        for _ in 0..self.config.workers.get() {
            let worker = Worker {
                queue: self.queue.clone(),
                gate: self.gate.clone(),
                reconcile: self.reconcile.clone(),
            };
            workers.spawn(worker.run());
        }
        workers
    }
}

impl<K, S, E> std::fmt::Debug for Runtime<K, S, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
