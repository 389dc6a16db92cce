//! Slice writes, fenced: the create, replace and delete calls, and a pass that sends a plan's
//! writes one at a time, each after a slot of the calls in flight, the write rate and the
//! fence, recording each accepted write (tracker, cache) and each write of unknown outcome.

use std::future::Future;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams, Preconditions};
use leadership::{Fence, Fenced};
use parking_lot::Mutex;
use slices::{CachedSlice, Intern, ServiceKey, SlicePlan, Token, Tracker, Write};
use tokio::time::Instant;

use super::{KubeReadWrite, WriteRate, status_code};
use crate::{
    caches::Caches,
    metrics::{Metrics, Operation},
    timing::{Stage, Timing},
    watch::health::version_number,
};

/// Why a pass of writes stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The fence refused a write: the term is over (not retryable in this term; the next term
    /// replays) or the lease is not safely held right now (retryable shortly).
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The slice changed since the plan saw it (409 on an update, or on a delete whose uid or
    /// resourceVersion precondition failed). Retryable soon: re-plan once the cache catches up.
    #[error("conflict writing slice {slice}: {source}")]
    Conflict {
        /// The slice name (or generateName).
        slice: String,
        /// The API error.
        source: kube::Error,
    },
    /// The API refused or failed a write. Retryable with backoff.
    #[error("writing slice {slice} failed: {source}")]
    Api {
        /// The slice name (or generateName).
        slice: String,
        /// The API error.
        source: kube::Error,
    },
}

/// What a pass wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Slices created.
    pub created: usize,
    /// Slices updated.
    pub updated: usize,
    /// Slices deleted (NotFound included; a conflict is not a delete).
    pub deleted: usize,
}

// === impl KubeReadWrite ===

impl KubeReadWrite {
    /// Creates `slice` (which has a generateName) in `namespace`.
    pub async fn create(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let api = self.api(namespace);
        self.bounded(api.create(&PostParams::default(), slice))
            .await
    }

    /// Replaces the slice of the same name, guarded by its resourceVersion.
    pub async fn replace(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        let api = self.api(namespace);
        self.bounded(api.replace(name, &PostParams::default(), slice))
            .await
    }

    /// Deletes the slice `name`, only while it still matches `preconditions` (its uid and
    /// resourceVersion as the plan saw them); a mismatch is answered 409.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: self.version_fenced_deletes.then(|| preconditions.clone()),
            ..DeleteParams::default()
        };
        let api = self.api(namespace);
        self.bounded(api.delete(name, &params)).await.map(|_| ())
    }
}

// === impl WriteError ===

impl WriteError {
    fn from_api(slice: &EndpointSlice, source: kube::Error) -> Self {
        let slice = slice_name(slice);
        if status_code(&source) == Some(409) {
            WriteError::Conflict { slice, source }
        } else {
            WriteError::Api { slice, source }
        }
    }
}

/// One pass of writes for one Service: where to send them and what to record.
pub struct Pass<'a> {
    /// The API.
    pub api: &'a KubeReadWrite,
    /// The Service.
    pub key: &'a ServiceKey,
    /// Checked immediately before each call.
    pub fence: &'a Fence,
    /// Records each accepted write, and each write of unknown outcome.
    pub tracker: &'a Mutex<Tracker>,
    /// The caches: each accepted write's answer enters the slice cache at once.
    pub caches: &'a Caches,
    /// `false` only in tests that switch clause 2 off ([`crate::Safeguards`]): answers do not
    /// enter the cache, and writes of unknown outcome are not read back.
    pub own_writes: bool,
    /// Counts writes and their errors.
    pub metrics: &'a Metrics,
    /// The client-side write rate limit, waited for before each call.
    pub rate: &'a WriteRate,
    /// Times each call and remembers when it was answered.
    pub timing: &'a Timing,
}

/// Sends `plan`'s writes for the pass's Service, fenced, recording each accepted write in the
/// tracker.
///
/// One at a time, in the plan's order, so that a pass never has two writes on the wire: the
/// scripted scenario `term_ending_mid_pass_sends_nothing_more_and_the_next_term_finishes_the_plan`
/// holds that a term ending after a pass's first write sends nothing more (its creates sent
/// together would both be on the wire). What overlaps is the passes of different Services (issue
/// 34): each write waits for a slot of the calls in flight ([`crate::limit`]), and the fence is
/// checked immediately before each call. Stops at the first write that fails, and returns its
/// error: the writes after it may depend on it (an update that drops a workload another update
/// of the pass adds, a delete after a create or update), and the Service is planned again
/// anyway. A fenced write stops the pass too.
pub async fn write_plan(pass: &Pass<'_>, plan: &SlicePlan) -> Result<Written, WriteError> {
    let mut written = Written::default();
    for write in plan.writes() {
        match write_one(pass, write).await? {
            Operation::Create => written.created += 1,
            Operation::Update => written.updated += 1,
            Operation::Delete => written.deleted += 1,
        }
    }
    Ok(written)
}

/// Sends one write, fenced; records an accepted one (tracker, cache, metrics).
async fn write_one(pass: &Pass<'_>, write: Write<'_>) -> Result<Operation, WriteError> {
    let Pass {
        api,
        key,
        fence,
        tracker,
        metrics,
        timing,
        ..
    } = pass;
    let namespace = key.namespace.as_str();
    let (operation, slice, sent) = match write {
        Write::Create(slice) => (
            Operation::Create,
            slice,
            send(pass, || api.create(namespace, slice)).await?,
        ),
        Write::Update(slice) => (
            Operation::Update,
            slice,
            send(pass, || api.replace(namespace, slice)).await?,
        ),
        Write::Delete(slice) => {
            delete(pass, slice).await?;
            return Ok(Operation::Delete);
        }
    };
    match sent {
        Ok(stored) => {
            tracker.lock().record_write(key, &stored);
            if pass.own_writes {
                let caches = pass.caches;
                // Read your own write: the cache holds the answer from now on.
                drop(
                    caches
                        .slices
                        .apply(CachedSlice::new(&stored, &*caches.interner)),
                );
            }
            if let Some(name) = stored.metadata.name.as_deref() {
                timing.wrote(namespace, name);
            }
            metrics.count_write(operation);
            tracing::debug!(
                slice = %slice_name(&stored),
                version = stored.metadata.resource_version.as_deref(),
                ?operation,
                "wrote slice"
            );
            Ok(operation)
        }
        // The API server's fencing policy (deploy/fencing.yaml): this replica is not the
        // Lease's holder as the server sees it. A fenced write: counted, the pass stops.
        Err(error) if leadership::is_fencing_policy_denial(&error) => {
            metrics.count_write_error(operation);
            Err(WriteError::Fenced(fence.refused_by_api_server()))
        }
        Err(error) => {
            metrics.count_write_error(operation);
            pass.unknown_outcome(&error);
            Err(WriteError::from_api(slice, error))
        }
    }
}

/// Sends one call of a write: after a slot of the writes-in-flight limit and the write rate
/// limit, with the fence checked immediately before the call. A 429 was not applied: the call is
/// sent again after the server's Retry-After (every write waits it out), through the fence
/// again, until the call timeout has passed since the first try; its answer is returned.
async fn send<T, F, Fut>(pass: &Pass<'_>, call: F) -> Result<Result<T, kube::Error>, WriteError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let Pass {
        api,
        fence,
        metrics,
        rate,
        ..
    } = pass;
    let deadline = Instant::now() + api.call_timeout;
    loop {
        let waiting = Instant::now();
        let permit = api.limit.acquire().await;
        rate.acquire().await;
        metrics
            .timing
            .observe(Stage::rate_limited, waiting.elapsed());
        // Immediately before the call: a deposed leader writes nothing. A lease that is not
        // safely held right now (a renewal slower than RetryPeriod) is waited for, up to the
        // fence's margin, rather than refused: a pass retried after a fixed delay can fall
        // into step with slow renewals and miss every window in which the lease is safe.
        metrics
            .timing
            .observe(Stage::fence_wait, fence.wait_until_safe().await?);
        let sending = Instant::now();
        let sent = call().await;
        metrics.timing.observe(Stage::write, sending.elapsed());
        if permit.answered(&sent) && Instant::now() < deadline {
            tracing::debug!("throttled (429); sending again after the server's Retry-After");
            continue;
        }
        return Ok(sent);
    }
}

/// Deletes `slice`, only that object in the version the plan saw (uid and resourceVersion
/// preconditions); gone already counts as deleted.
///
/// The resourceVersion precondition is what fences a late delete: a delete planned in an ended
/// term, arriving after the new leader rewrote the slice (same uid, newer version), is refused
/// with 409 instead of removing the new leader's endpoints. A 409 is a [`WriteError::Conflict`]
/// (re-plan), never a success: the slice is still there, perhaps with endpoints to keep.
async fn delete(pass: &Pass<'_>, slice: &EndpointSlice) -> Result<(), WriteError> {
    let Pass {
        api,
        key,
        fence,
        tracker,
        metrics,
        caches,
        ..
    } = pass;
    let name = slice_name(slice);
    let preconditions = Preconditions {
        uid: slice.metadata.uid.clone(),
        resource_version: slice.metadata.resource_version.clone(),
    };
    match send(pass, || api.delete(&key.namespace, &name, &preconditions)).await? {
        Ok(()) => {}
        // Already gone: success.
        Err(error) if status_code(&error) == Some(404) => {}
        Err(error) if leadership::is_fencing_policy_denial(&error) => {
            metrics.count_write_error(Operation::Delete);
            return Err(WriteError::Fenced(fence.refused_by_api_server()));
        }
        Err(error) => {
            metrics.count_write_error(Operation::Delete);
            pass.unknown_outcome(&error);
            return Err(WriteError::from_api(slice, error));
        }
    }
    tracker.lock().record_delete(key, slice);
    if pass.own_writes {
        // Read your own delete: gone from the cache now, and the watch's reports of it up to
        // the version the plan saw change nothing.
        let version = slice
            .metadata
            .resource_version
            .as_deref()
            .map_or(0, version_number);
        caches.slices.remove_known_gone(
            &caches.interner.intern(&key.namespace),
            &caches.interner.intern(&name),
            slice.metadata.uid.as_deref().map(Token::parse),
            version,
        );
    }
    metrics.count_write(Operation::Delete);
    tracing::debug!(slice = %name, "deleted slice");
    Ok(())
}

// === impl Pass ===

impl Pass<'_> {
    /// A write failed with `error`: if its outcome is unknown (no answer, or a 5xx: it may have
    /// been applied) or the slice was not what the plan saw (409, or 404 on an update: someone
    /// changed or deleted it), the Service's slices are read back before it is planned again. A
    /// definite refusal of a write planned on the right view (another 4xx) changed nothing.
    fn unknown_outcome(&self, error: &kube::Error) {
        let definite =
            matches!(status_code(error), Some(code) if code < 500 && code != 409 && code != 404);
        if !definite && self.own_writes {
            self.tracker.lock().record_unknown_outcome(self.key);
        }
    }
}

fn slice_name(slice: &EndpointSlice) -> String {
    slice
        .metadata
        .name
        .clone()
        .or_else(|| slice.metadata.generate_name.clone())
        .unwrap_or_default()
}
