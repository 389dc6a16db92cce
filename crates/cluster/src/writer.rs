//! The fenced writer: sends a plan's writes, checking the fence immediately before each call.
//! Everything the controller writes to the API (slices and Events) goes through [`KubeWrites`].
//!
//! Order: creates, then updates (those that add a workload to their slice first, those that drop
//! one another update adds last), then deletes, so endpoints are never missing between two calls;
//! nothing more is sent once a write of the pass failed; NotFound on delete is success.
//! Pipelined across Services (issue 34): the passes of different Services overlap on the
//! workers, each pass's writes one at a time; how many calls are in flight follows the API
//! server's answers ([`crate::limit`]), and a 429 is sent again after its Retry-After, through
//! the fence.
//!
//! Read your own writes (docs/architecture.md, "A fresh view", clause 2): each accepted write's
//! answer enters the slice cache at once (a create or update with its resourceVersion, a delete
//! as a tombstone of the uid and version the plan saw), so the next pass for the Service plans
//! from it without waiting for the watch to echo it; the echo, and anything older, changes
//! nothing in the cache. Each accepted write is also recorded in the term's tracker, so the echo
//! triggers nothing. A write whose outcome is unknown (no answer: a timeout, a lost connection,
//! a 5xx) or that was refused with 409 marks the Service: it is planned again only after a
//! consistent read of its slices ([`KubeWrites::list_slices`]), never from a view that may lack
//! what the write did (a create applied but unanswered must not lead to a second slice).
//!
//! Every write is guarded by the version the plan was made from: updates by resourceVersion
//! (a replace), deletes by uid and resourceVersion (preconditions). A write that was planned on
//! a version someone has since changed (a late write of an ended term racing the new leader's
//! rewrite, another writer) is refused with 409 and reported as [`WriteError::Conflict`]: the
//! Service is planned again once the cache shows the newer version (issue 16).

use std::{future::Future, sync::Arc, time::Duration};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, ListParams, PostParams, Preconditions},
    runtime::events::{Event, Recorder, Reporter},
};
use leadership::{Fence, Fenced};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use slices::{
    CachedSlice, Intern, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, ServiceKey, SlicePlan, Token,
    Tracker, Write,
};

use tokio::time::Instant;

use crate::{
    caches::Caches,
    limit::WriteLimit,
    metrics::{Metrics, Operation},
    timing::{Stage, Timing},
    watch::health::version_number,
};

/// How long one API write may take before the writer gives up on it and the reconcile is
/// retried with backoff. A write the API server never answers (its storage down, a response lost)
/// would otherwise hold a worker until the client's read timeout (295 s); the server itself gives
/// up on its storage after 60 s (`--request-timeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The API calls the controller writes with (and the reads that confirm a plan's additions,
/// `confirm`), each bounded by the call timeout. Tests run it
/// over the in-memory API server, with faults at exact calls (`test_api`).
#[derive(Clone)]
pub struct KubeWrites {
    client: Client,
    events: Recorder,
    call_timeout: Duration,
    /// `false` only in tests that switch version-fenced deletes off ([`crate::Safeguards`]).
    version_fenced_deletes: bool,
    /// The calls in flight ([`crate::limit`]): each write and each read takes a slot, and every
    /// call waits out a 429's Retry-After.
    limit: Arc<WriteLimit>,
}

/// A write the API server did not answer within the call timeout.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the API server within {0:?}")]
pub struct CallTimedOut(pub Duration);

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

// === impl KubeWrites ===

impl KubeWrites {
    /// Writes through `client`; Events name `reporter` as their source.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            events: Recorder::new(client.clone(), reporter),
            client,
            call_timeout: CALL_TIMEOUT,
            version_fenced_deletes: true,
            limit: Arc::default(),
        }
    }

    /// Writes under `limit` (the controller's, whose metrics are registered).
    pub fn with_limit(mut self, limit: Arc<WriteLimit>) -> Self {
        self.limit = limit;
        self
    }

    /// Sends each delete's preconditions only if `fenced`.
    pub fn version_fenced_deletes(mut self, fenced: bool) -> Self {
        self.version_fenced_deletes = fenced;
        self
    }

    /// Gives up on each call after `call_timeout` instead of [`CALL_TIMEOUT`].
    #[cfg(test)]
    pub(crate) fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.call_timeout = call_timeout;
        self
    }

    /// Runs `call`, or fails with [`CallTimedOut`] when it takes longer than the call timeout
    /// (the call is dropped; the server may still apply it, which the next pass sees).
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(Box::new(CallTimedOut(
                self.call_timeout,
            )))),
        }
    }

    /// A read of the write path (or an Event): `call` bounded by the call timeout, in a slot of
    /// the limit, as a write is; a 429 (not served) is read again after its Retry-After, until
    /// the call timeout has passed since the first try. Reads take slots too: after a 429, a
    /// pass's confirming reads must not go out all at once and be refused again.
    async fn limited<T, F, Fut>(&self, call: F) -> Result<T, kube::Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let deadline = Instant::now() + self.call_timeout;
        loop {
            let permit = self.limit.acquire().await;
            let result = self.bounded(call()).await;
            if permit.served(&result) && Instant::now() < deadline {
                continue;
            }
            return result;
        }
    }

    fn api(&self, namespace: &str) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl KubeWrites {
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

    /// The object `name` of kind `K` (a Service or a workload) as the API server has it now (a
    /// GET without a resourceVersion: read from etcd, not the API server's cache); `None` if it
    /// does not exist.
    pub async fn read<K>(&self, namespace: &str, name: &str) -> Result<Option<K>, kube::Error>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        self.limited(|| api.get_opt(name)).await
    }

    /// The slices of Service `key` managed by `managed_by`, by a consistent LIST (no
    /// resourceVersion: served once the API server's cache has caught up with etcd), and the
    /// version the list was read at (0 when it is not a number).
    pub async fn list_slices(
        &self,
        key: &ServiceKey,
        managed_by: &str,
    ) -> Result<(Vec<EndpointSlice>, u64), kube::Error> {
        let labels = format!(
            "{SERVICE_NAME_LABEL}={},{MANAGED_BY_LABEL}={managed_by}",
            key.name
        );
        let api = self.api(&key.namespace);
        let params = ListParams::default().labels(&labels);
        let list = self.limited(|| api.list(&params)).await?;
        let version = list
            .metadata
            .resource_version
            .as_deref()
            .map_or(0, version_number);
        Ok((list.items, version))
    }

    /// The workloads of `namespace` matching `labels`, by a consistent LIST (no
    /// resourceVersion: the API server answers once its cache has caught up with etcd).
    pub async fn list_workloads(
        &self,
        namespace: &str,
        labels: &str,
    ) -> Result<Vec<ExternalWorkload>, kube::Error> {
        let api: Api<ExternalWorkload> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().labels(labels);
        let list = self.limited(|| api.list(&params)).await?;
        Ok(list.items)
    }

    /// Publishes `event` about the object `regarding`.
    pub async fn publish_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.limited(|| self.events.publish(event, regarding)).await
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
    pub api: &'a KubeWrites,
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

/// The client-side limit of slice writes per second, shared by every worker (a token bucket
/// holding one second of writes: a burst of `qps`, then `qps` per second). Unlimited when
/// built with 0.
#[derive(Debug)]
pub struct WriteRate {
    qps: f64,
    bucket: Mutex<(f64, Instant)>,
}

// === impl WriteRate ===

impl WriteRate {
    /// At most `qps` writes per second (0: no limit).
    pub fn new(qps: u32) -> Self {
        let qps = f64::from(qps);
        Self {
            qps,
            bucket: Mutex::new((qps, Instant::now())),
        }
    }

    /// No limit.
    #[cfg(test)]
    pub fn unlimited() -> Self {
        Self::new(0)
    }

    /// Waits until one more write is allowed; returns how long it waited.
    pub async fn acquire(&self) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let debt = {
            let now = Instant::now();
            let mut bucket = self.bucket.lock();
            let (tokens, updated_at) = &mut *bucket;
            let refill = now.saturating_duration_since(*updated_at).as_secs_f64() * self.qps;
            *tokens = (*tokens + refill).min(self.qps.max(1.0)) - 1.0;
            *updated_at = now;
            *tokens
        };
        if debt >= 0.0 {
            return Duration::ZERO;
        }
        let wait = Duration::from_secs_f64(-debt / self.qps);
        tokio::time::sleep(wait).await;
        wait
    }
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

/// The HTTP status of an API error, if it is one.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod tests;
