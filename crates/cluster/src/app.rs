//! The controller's part in the leadership runtime: the acquisition barrier, then a fresh
//! per-term state, the replay of the caches, and the reconcile of one Service. The binary and
//! the simulation (crates/sim, which builds the controller with [`crate::Controller::new`]) both
//! run this one implementation.

use std::sync::Arc;

use leadership::{Action, Reconciler, Term, TermContext};
use slices::ServiceKey;

use crate::{
    handlers,
    metrics::Metrics,
    reconcile::{ReconcileError, Shared, TermState, reconcile},
    view::Wait,
    watch::fresh::Barrier,
};

/// The slice reconciler behind the acquisition barrier: a term replays only once every cache
/// has been shown at least as new as a version read from the API server after the acquisition.
pub struct App {
    shared: Arc<Shared>,
    barrier_kinds: Arc<Barrier>,
    metrics: Metrics,
    /// `false` only in tests that switch clause 1 off ([`crate::Safeguards`]).
    barrier: bool,
}

// === impl App ===

impl App {
    /// Reconciles with `shared`; `barrier` brings the caches it reads up to each term's
    /// acquisition point.
    pub fn new(shared: Arc<Shared>, barrier: Barrier, metrics: Metrics) -> Self {
        Self {
            shared,
            barrier_kinds: Arc::new(barrier),
            metrics,
            barrier: true,
        }
    }

    /// Runs the acquisition barrier before each replay only if `barrier`.
    pub fn with_barrier(mut self, barrier: bool) -> Self {
        self.barrier = barrier;
        self
    }
}

impl Reconciler for App {
    type Key = ServiceKey;
    type TermState = TermState;
    type Error = ReconcileError;

    fn prepare_term(&self, term: &Term) -> impl Future<Output = ()> + Send + 'static {
        let kinds = self.barrier_kinds.clone();
        let metrics = self.metrics.clone();
        let term = term.id();
        let barrier = self.barrier;
        async move {
            if !barrier {
                tracing::warn!(
                    term,
                    "acquisition barrier switched off (tests only); replaying"
                );
                return;
            }
            metrics.count_wait(Wait::acquiring);
            let (took, proofs) = kinds.bring_up_to_date().await;
            metrics.acquire_barrier_seconds.set(took.as_secs_f64());
            tracing::info!(
                term,
                barrier_ms = took.as_millis() as u64,
                proofs = ?proofs,
                "caches up to date with the API server; replaying"
            );
        }
    }

    fn start_term(&self, _term: &Term) -> TermState {
        TermState::new(self.shared.metrics.timing.clone())
    }

    fn replay(&self, context: &TermContext<ServiceKey, TermState>) {
        handlers::replay(context, &self.shared.caches, &self.shared.config);
    }

    fn reconcile(
        &self,
        key: ServiceKey,
        context: TermContext<ServiceKey, TermState>,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        reconcile(key, context, self.shared.clone())
    }
}
