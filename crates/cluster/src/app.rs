//! The controller's part in the leadership runtime: the acquisition barrier, then the slice
//! reconciler's fresh per-term state, replay and reconcile.

use std::sync::Arc;

use leadership::{Action, Reconciler, Term, TermContext};
use slices::ServiceKey;

use crate::{
    metrics::Metrics,
    reconcile::{ReconcileError, SliceReconciler, TermState},
    watch::fresh::Freshness,
    writer::WriteApi,
};

/// [`SliceReconciler`] behind the acquisition barrier: a term replays only once every cache has
/// been shown at least as new as a version read from the API server after the acquisition.
pub struct App<W> {
    slices: SliceReconciler<W>,
    freshness: Arc<Freshness>,
    metrics: Metrics,
    /// `false` only in tests that switch the barrier off ([`crate::Safeguards`]).
    barrier: bool,
}

// === impl App ===

impl<W> App<W> {
    pub fn new(slices: SliceReconciler<W>, freshness: Freshness, metrics: Metrics) -> Self {
        Self {
            slices,
            freshness: Arc::new(freshness),
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

impl<W: WriteApi> Reconciler for App<W> {
    type Key = ServiceKey;
    type TermState = TermState;
    type Error = ReconcileError;

    fn prepare_term(&self, term: &Term) -> impl Future<Output = ()> + Send + 'static {
        let freshness = self.freshness.clone();
        let gauge = self.metrics.acquire_barrier_seconds.clone();
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
            let (took, proofs) = freshness.bring_up_to_date().await;
            gauge.set(took.as_secs_f64());
            tracing::info!(
                term,
                barrier_ms = took.as_millis() as u64,
                proofs = ?proofs,
                "caches up to date with the API server; replaying"
            );
        }
    }

    fn start_term(&self, term: &Term) -> TermState {
        self.slices.start_term(term)
    }

    fn replay(&self, context: &TermContext<ServiceKey, TermState>) {
        self.slices.replay(context);
    }

    fn reconcile(
        &self,
        key: ServiceKey,
        context: TermContext<ServiceKey, TermState>,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        self.slices.reconcile(key, context)
    }
}
