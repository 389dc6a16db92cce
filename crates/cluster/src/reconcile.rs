//! One reconcile: caches → stale check → plan → fenced writes → tracker.

use std::{sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use leadership::{Action, Fenced, TermContext};
use slices::{CachedSlice, CachedWorkload, Freshness, ServiceKey, plan_cached};
use tokio::time::Instant;

// `TermState` lives beside the handlers that share it, so handlers never import this module;
// re-exported for the wiring.
pub use crate::handlers::TermState;
use crate::{
    caches::Caches,
    confirm::Confirmation,
    events::Diagnostics,
    health::CacheHealth,
    metrics::{Metrics, Outcome, OutcomeLabels},
    timing::{Began, Stage, Timing, Wait},
    writer::{KubeWrites, Pass, WriteError, WriteRate, write_plan},
};

/// How soon a Service is looked at again when the cache has not caught up with our writes.
pub const STALE_RETRY: Duration = Duration::from_millis(100);

/// How soon a Service is looked at again after a write conflict.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(250);

/// How soon a Service is looked at again when the lease is not safely held right now.
pub const FENCED_RETRY: Duration = Duration::from_secs(1);

/// How long a reconcile waits for a cache whose watch lost its stream to catch up before it
/// gives its worker back; the Service is then looked at again after as long.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(1);

/// What every reconcile shares.
pub struct Shared {
    /// The caches.
    pub caches: Arc<Caches>,
    /// Planner configuration.
    pub config: slices::Config,
    /// The writer.
    pub api: KubeWrites,
    /// Events for unusable workload data.
    pub diagnostics: Diagnostics,
    /// Metrics.
    pub metrics: Metrics,
    /// The client-side limit of slice writes per second.
    pub write_rate: WriteRate,
    /// How long a Service may wait on a cache that never catches up before the tracker's
    /// records for it are dropped (a safety valve; it should never be reached).
    pub stale_limit: Duration,
    /// The caches' watches: nothing is planned while one has not caught up since it lost its
    /// stream.
    pub health: CacheHealth,
    /// `false` only in tests that switch the wait for a lost watch off ([`crate::Safeguards`]).
    pub catch_up: bool,
    /// `false` only in tests that switch the confirmation of additions off
    /// ([`crate::Safeguards`]).
    pub confirm_additions: bool,
}

/// Why a reconcile failed (the queue retries it with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A write failed. Retryable.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A read confirming the plan's additions failed. Retryable.
    #[error("reading to confirm the plan's additions failed: {0}")]
    Confirm(#[source] kube::Error),
}

/// Reconciles the Service `key` within the term of `context`.
pub async fn reconcile(
    key: ServiceKey,
    context: TermContext<ServiceKey, TermState>,
    shared: Arc<Shared>,
) -> Result<Action, ReconcileError> {
    // The runtime runs this inside its `reconcile{key=ns/name term=N}` span.
    let started = Instant::now();
    let timing = &context.state().timing;
    let began = timing.begin(&key);
    let result = reconcile_inner(&key, &context, &shared, &began).await;
    let outcome = match &result {
        Ok(passed) => passed.metric(),
        Err(_) => Outcome::Error,
    };
    timing.end(
        &key,
        began,
        result.as_ref().map_or(Some(Wait::Retry), |p| p.wait()),
    );
    shared
        .metrics
        .reconcile_duration
        .get_or_create(&OutcomeLabels { outcome })
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(passed) => Ok(passed.action()),
        Err(error) => {
            tracing::warn!(%error, "reconcile failed; will retry");
            Err(error)
        }
    }
}

/// How a reconcile that did not fail ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReconcileOutcome {
    /// Planned, and wrote what the plan asked (or nothing was to be written).
    Done,
    /// The cache is behind this term's writes, or the API server did not confirm an addition
    /// (one watch behind another): nothing written, look again shortly.
    Stale,
    /// The term is over: its fence refused a write. Nothing more to do in this term; the next
    /// term replays everything.
    TermEnded,
    /// The lease is not safely held right now: its fence refused a write; look again later.
    NotSafelyHeld,
    /// A slice changed since the cache showed it (409): plan again once the cache catches up.
    Conflict,
    /// A watch lost its stream and its cache has not caught up: nothing planned, look again.
    CatchingUp,
}

// === impl ReconcileOutcome ===

impl ReconcileOutcome {
    /// The `outcome` label it is counted under.
    fn metric(self) -> Outcome {
        match self {
            ReconcileOutcome::Done => Outcome::Ok,
            ReconcileOutcome::Stale => Outcome::Stale,
            ReconcileOutcome::TermEnded | ReconcileOutcome::NotSafelyHeld => Outcome::Fenced,
            ReconcileOutcome::Conflict => Outcome::Conflict,
            ReconcileOutcome::CatchingUp => Outcome::CatchingUp,
        }
    }

    /// Why the key runs again, if it does (None: its changes are published, or the term is
    /// over).
    fn wait(self) -> Option<Wait> {
        match self {
            ReconcileOutcome::Done | ReconcileOutcome::TermEnded => None,
            ReconcileOutcome::Stale | ReconcileOutcome::CatchingUp => Some(Wait::Stale),
            ReconcileOutcome::NotSafelyHeld | ReconcileOutcome::Conflict => Some(Wait::Retry),
        }
    }

    /// What the queue does with the key next.
    fn action(self) -> Action {
        match self {
            // A term that is over has no queue left to requeue into.
            ReconcileOutcome::Done | ReconcileOutcome::TermEnded => Action::Done,
            ReconcileOutcome::Stale => Action::RequeueAfter(STALE_RETRY),
            ReconcileOutcome::NotSafelyHeld => Action::RequeueAfter(FENCED_RETRY),
            ReconcileOutcome::Conflict => Action::RequeueAfter(CONFLICT_RETRY),
            ReconcileOutcome::CatchingUp => Action::RequeueAfter(CATCH_UP_WAIT),
        }
    }
}

async fn reconcile_inner(
    key: &ServiceKey,
    context: &TermContext<ServiceKey, TermState>,
    shared: &Shared,
    began: &Began,
) -> Result<ReconcileOutcome, ReconcileError> {
    let state = context.state();
    // A watch that lost its stream (an error, a stall, a 410) may have missed changes that
    // another kind's watch already shows (a Service re-created after a workload's deletion
    // the workload watch has not delivered): a plan from both could put back what is gone.
    // So nothing is planned until every cache has caught up since its loss; the watch's next
    // stream is a probe, whose bookmark comes about a second after it connects.
    if shared.catch_up && !shared.health.is_caught_up() {
        let caught_up = tokio::time::timeout(CATCH_UP_WAIT, shared.health.caught_up()).await;
        if caught_up.is_err() {
            tracing::debug!("a watch has not caught up since it lost its stream; looking again");
            return Ok(ReconcileOutcome::CatchingUp);
        }
    }
    let planning = Instant::now();
    // Read before the caches: the workload cache holds at least everything up to it.
    let workloads_read = shared.health.workloads_read();
    let Some(service) = shared.caches.services.get(&key.namespace, &key.name) else {
        // Deleted: its slices go by garbage collection (owner reference).
        state.tracker.lock().forget(key);
        state.stale_since.lock().remove(key);
        state.timing.forget(key);
        tracing::debug!("service gone; forgetting it");
        return Ok(ReconcileOutcome::Done);
    };
    let cached = shared.caches.slices_of(key);
    let existing: Vec<&CachedSlice> = cached.iter().map(Arc::as_ref).collect();

    let freshness = state.tracker.lock().check(key, &existing);
    if let Freshness::Stale(reason) = freshness {
        let now = Instant::now();
        let since = *state.stale_since.lock().entry(key.clone()).or_insert(now);
        if now.duration_since(since) < shared.stale_limit {
            shared.metrics.stale_cache_retries.inc();
            tracing::debug!(
                reason = reason.reason(),
                "cache behind our writes; retrying shortly"
            );
            return Ok(ReconcileOutcome::Stale);
        }
        tracing::warn!(
            reason = reason.reason(),
            "cache still behind after {:?}; dropping this Service's write records",
            shared.stale_limit
        );
        state.tracker.lock().forget(key);
    }
    state.stale_since.lock().remove(key);

    let candidates = shared.caches.candidate_workloads(&service);
    let workloads: Vec<&CachedWorkload> = candidates.iter().map(Arc::as_ref).collect();
    // The annotation carries when the change was seen, not when it was planned.
    let trigger_time = Time(Timing::trigger_time(began));
    let plan = plan_cached(
        &service,
        &workloads,
        &existing,
        &shared.config,
        &trigger_time,
    );
    shared
        .metrics
        .timing
        .observe(Stage::plan, planning.elapsed());

    shared
        .diagnostics
        .report(
            &shared.api,
            &service,
            key,
            &plan.diagnostics,
            context.fence(),
            &shared.metrics,
        )
        .await;
    if plan.is_empty() {
        tracing::debug!("slices up to date");
        return Ok(ReconcileOutcome::Done);
    }
    if shared.confirm_additions
        && let Some(confirmation) =
            Confirmation::needed(&service, &plan, &existing, &workloads, workloads_read)
    {
        let confirmed = confirmation
            .confirm(&shared.api, &service)
            .await
            .map_err(ReconcileError::Confirm)?;
        if !confirmed {
            shared.metrics.unconfirmed_additions.inc();
            tracing::debug!(
                "the API server no longer has a workload to add, or the Service no longer \
                 selects it; looking again once the caches catch up"
            );
            return Ok(ReconcileOutcome::Stale);
        }
    }
    let fence = context.fence();
    let pass = Pass {
        api: &shared.api,
        key,
        fence,
        tracker: &state.tracker,
        metrics: &shared.metrics,
        rate: &shared.write_rate,
        timing: &state.timing,
    };
    match write_plan(&pass, &plan).await {
        Ok(written) => {
            state.timing.published(began);
            tracing::info!(
                created = written.created,
                updated = written.updated,
                deleted = written.deleted,
                "slices written"
            );
            Ok(ReconcileOutcome::Done)
        }
        Err(WriteError::Fenced(Fenced::TermEnded { .. })) => {
            tracing::info!("term over; write refused (the next term replays)");
            Ok(ReconcileOutcome::TermEnded)
        }
        Err(WriteError::Fenced(Fenced::LeaseNotSafelyHeld { .. })) => {
            tracing::info!("lease not safely held; write refused, retrying shortly");
            Ok(ReconcileOutcome::NotSafelyHeld)
        }
        // The API server's fencing policy refused a write while this term is still current
        // here: its cache of the Lease has not yet seen this term's acquisition, or this replica
        // was deposed and has not seen it yet. Not retried at once: after FENCED_RETRY, and only
        // through the fence, which refuses before sending once the term is over.
        Err(WriteError::Fenced(Fenced::RefusedByApiServer { .. })) => {
            tracing::warn!(
                "the API server refused a write: not the Lease's holder as it sees it; \
                 looking again shortly"
            );
            Ok(ReconcileOutcome::NotSafelyHeld)
        }
        Err(WriteError::Conflict { slice, .. }) => {
            tracing::debug!(%slice, "write conflict; planning again once the cache catches up");
            Ok(ReconcileOutcome::Conflict)
        }
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_is_counted_under_its_own_label_and_requeued_as_it_needs() {
        let cases = [
            (ReconcileOutcome::Done, Outcome::Ok, Action::Done),
            (
                ReconcileOutcome::Stale,
                Outcome::Stale,
                Action::RequeueAfter(STALE_RETRY),
            ),
            // The term is over: its queue is gone, the next term replays.
            (ReconcileOutcome::TermEnded, Outcome::Fenced, Action::Done),
            (
                ReconcileOutcome::NotSafelyHeld,
                Outcome::Fenced,
                Action::RequeueAfter(FENCED_RETRY),
            ),
            (
                ReconcileOutcome::Conflict,
                Outcome::Conflict,
                Action::RequeueAfter(CONFLICT_RETRY),
            ),
            (
                ReconcileOutcome::CatchingUp,
                Outcome::CatchingUp,
                Action::RequeueAfter(CATCH_UP_WAIT),
            ),
        ];
        for (outcome, label, action) in cases {
            assert_eq!(outcome.metric(), label, "{outcome:?}");
            assert_eq!(outcome.action(), action, "{outcome:?}");
        }
    }
}
