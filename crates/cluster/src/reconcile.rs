//! One reconcile: caches → plan → the fresh-view rule ([`crate::view::admit`]) → fenced writes.

use std::{sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use leadership::{Action, Fenced, TermContext};
use slices::{CachedSlice, CachedWorkload, ServiceKey, plan_cached};
use tokio::time::Instant;

// `TermState` lives beside the handlers that share it, so handlers never import this module;
// re-exported for the wiring.
pub use crate::handlers::TermState;
use crate::{
    caches::Caches,
    confirm,
    events::Diagnostics,
    health::CacheHealth,
    metrics::{Metrics, Outcome, OutcomeLabels},
    timing::{Began, Stage, Timing, Wait as Waiting},
    view::{self, Admission, View, Vouched, Wait},
    writer::{KubeReadWrite, Pass, WriteError, WriteRate, write_plan},
};

/// How soon a Service is looked at again when its view did not satisfy the fresh-view rule
/// (an addition the API server did not confirm): the lagging watch has delivered more by then.
pub const VIEW_RETRY: Duration = Duration::from_millis(200);

/// How soon a Service is looked at again after a write conflict (its slices are read back
/// first, not waited for through the watch).
pub const CONFLICT_RETRY: Duration = Duration::from_millis(50);

/// How soon a Service is looked at again when the lease is not safely held right now.
pub const FENCED_RETRY: Duration = Duration::from_secs(1);

/// What every reconcile shares.
pub struct Shared {
    /// The caches.
    pub caches: Arc<Caches>,
    /// Planner configuration.
    pub config: slices::Config,
    /// The writer.
    pub api: KubeReadWrite,
    /// Events for unusable workload data.
    pub diagnostics: Diagnostics,
    /// Metrics.
    pub metrics: Metrics,
    /// The client-side limit of slice writes per second.
    pub write_rate: WriteRate,
    /// The caches' watches: their watermarks, and whether one is catching up after losing its
    /// stream.
    pub health: CacheHealth,
    /// `false` only in tests that switch clause 2 of the fresh-view rule off
    /// ([`crate::Safeguards`]).
    pub own_writes: bool,
    /// `false` only in tests that switch clause 3 of the fresh-view rule off
    /// ([`crate::Safeguards`]).
    pub additions: bool,
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
    /// Reading back the Service's slices after a write of unknown outcome failed. Retryable:
    /// the Service stays held until a read succeeds.
    #[error("reading back the Service's slices failed: {0}")]
    ReadBack(#[source] kube::Error),
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
        result.as_ref().map_or(Some(Waiting::Retry), |p| p.wait()),
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
    /// The view did not satisfy the fresh-view rule, for this reason: nothing written, look
    /// again shortly.
    Waited(Wait),
    /// The term is over: its fence refused a write. Nothing more to do in this term; the next
    /// term replays everything.
    TermEnded,
    /// The lease is not safely held right now: its fence refused a write; look again later.
    NotSafelyHeld,
    /// A slice changed since the cache showed it (409): its slices are read back, then planned
    /// again.
    Conflict,
}

// === impl ReconcileOutcome ===

impl ReconcileOutcome {
    /// The `outcome` label it is counted under.
    fn metric(self) -> Outcome {
        match self {
            ReconcileOutcome::Done => Outcome::Ok,
            ReconcileOutcome::Waited(_) => Outcome::Waited,
            ReconcileOutcome::TermEnded | ReconcileOutcome::NotSafelyHeld => Outcome::Fenced,
            ReconcileOutcome::Conflict => Outcome::Conflict,
        }
    }

    /// Why the key runs again, if it does (None: its changes are published, or the term is
    /// over).
    fn wait(self) -> Option<Waiting> {
        match self {
            ReconcileOutcome::Done | ReconcileOutcome::TermEnded => None,
            ReconcileOutcome::Waited(_) => Some(Waiting::View),
            ReconcileOutcome::NotSafelyHeld | ReconcileOutcome::Conflict => Some(Waiting::Retry),
        }
    }

    /// What the queue does with the key next.
    fn action(self) -> Action {
        match self {
            // A term that is over has no queue left to requeue into.
            ReconcileOutcome::Done | ReconcileOutcome::TermEnded => Action::Done,
            ReconcileOutcome::Waited(_) => Action::RequeueAfter(VIEW_RETRY),
            ReconcileOutcome::NotSafelyHeld => Action::RequeueAfter(FENCED_RETRY),
            ReconcileOutcome::Conflict => Action::RequeueAfter(CONFLICT_RETRY),
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
    // At most twice round: a read-back resolves the Service's writes, and the second plan runs
    // from the view that holds what they did.
    loop {
        let planning = Instant::now();
        // Before the caches are read: each holds at least everything up to its mark.
        let marks = shared.health.marks();
        let Some(service) = shared.caches.services.get(&key.namespace, &key.name) else {
            // Deleted: its slices go by garbage collection (owner reference).
            state.tracker.lock().forget(key);
            state.timing.forget(key);
            tracing::debug!("service gone; forgetting it");
            return Ok(ReconcileOutcome::Done);
        };
        let cached = shared.caches.slices_of(key);
        let existing: Vec<&CachedSlice> = cached.iter().map(Arc::as_ref).collect();
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

        let view = View {
            unresolved_write: shared.own_writes && state.tracker.lock().needs_read_back(key),
            added: if shared.additions {
                confirm::added(&plan, &existing, &workloads)
            } else {
                Vec::new()
            },
            marks,
            service_version: service.resource_version.as_ref(),
            written: state.tracker.lock().has_written(key),
        };
        match view::admit(&view) {
            Admission::Write => {
                if !view.added.is_empty() {
                    shared.metrics.count_addition(Vouched::caches);
                }
            }
            Admission::ReadBack => {
                shared.metrics.count_wait(Wait::own_writes);
                tracing::debug!(
                    wait = ?Wait::own_writes,
                    "a write's outcome is unknown; reading the Service's slices back"
                );
                read_back(shared, key).await?;
                state.tracker.lock().read_back(key);
                continue;
            }
            Admission::Confirm {
                service: read_service,
                workloads: read,
            } => {
                let namespace_workloads = shared.caches.workloads.len_in(&service.namespace);
                let agrees = confirm::confirm(
                    &shared.api,
                    &service,
                    read_service,
                    &read,
                    namespace_workloads,
                )
                .await
                .map_err(ReconcileError::Confirm)?;
                if !agrees {
                    // A watch that lost its stream and has not caught up is the likely laggard.
                    let reason = if shared.health.is_caught_up() {
                        Wait::unconfirmed
                    } else {
                        Wait::lost_watch
                    };
                    shared.metrics.count_wait(reason);
                    tracing::debug!(
                        wait = ?reason,
                        marks = ?view.marks,
                        "the API server no longer has the Service selecting a workload to add; \
                         looking again once the watches have read further"
                    );
                    return Ok(ReconcileOutcome::Waited(reason));
                }
                shared.metrics.count_addition(Vouched::reads);
            }
        }

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
        let pass = Pass {
            api: &shared.api,
            key,
            fence: context.fence(),
            tracker: &state.tracker,
            caches: &shared.caches,
            own_writes: shared.own_writes,
            metrics: &shared.metrics,
            rate: &shared.write_rate,
            timing: &state.timing,
        };
        return written(write_plan(&pass, &plan).await, state, began);
    }
}

/// What a pass's writes amount to.
fn written(
    result: Result<crate::writer::Written, WriteError>,
    state: &TermState,
    began: &Began,
) -> Result<ReconcileOutcome, ReconcileError> {
    match result {
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
            tracing::debug!(%slice, "write conflict; reading the slices back, then planning again");
            Ok(ReconcileOutcome::Conflict)
        }
        Err(error) => Err(error.into()),
    }
}

/// Clause 2's read: `key`'s slices by a consistent LIST, into the cache (what the list holds,
/// and what it no longer holds, as gone), so the next plan sees what a write of unknown outcome
/// did.
async fn read_back(shared: &Shared, key: &ServiceKey) -> Result<(), ReconcileError> {
    let (listed, version) = shared
        .api
        .list_slices(key, shared.config.managed_by())
        .await
        .map_err(ReconcileError::ReadBack)?;
    let caches = &shared.caches;
    let listed = listed
        .iter()
        .map(|slice| CachedSlice::new(slice, &*caches.interner))
        .collect();
    caches
        .slices
        .read_group(&key.namespace, &key.name, listed, version);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_is_counted_under_its_own_label_and_requeued_as_it_needs() {
        let cases = [
            (ReconcileOutcome::Done, Outcome::Ok, Action::Done),
            (
                ReconcileOutcome::Waited(Wait::unconfirmed),
                Outcome::Waited,
                Action::RequeueAfter(VIEW_RETRY),
            ),
            (
                ReconcileOutcome::Waited(Wait::lost_watch),
                Outcome::Waited,
                Action::RequeueAfter(VIEW_RETRY),
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
        ];
        for (outcome, label, action) in cases {
            assert_eq!(outcome.metric(), label, "{outcome:?}");
            assert_eq!(outcome.action(), action, "{outcome:?}");
        }
    }
}
