//! The fenced writer: sends a plan's writes, checking the fence immediately before each call.
//! Everything the controller writes to the API (slices and Events) goes through [`KubeReadWrite`].
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
//! consistent read of its slices ([`KubeReadWrite::list_slices`]), never from a view that may lack
//! what the write did (a create applied but unanswered must not lead to a second slice).
//!
//! Every write is guarded by the version the plan was made from: updates by resourceVersion
//! (a replace), deletes by uid and resourceVersion (preconditions). A write that was planned on
//! a version someone has since changed (a late write of an ended term racing the new leader's
//! rewrite, another writer) is refused with 409 and reported as [`WriteError::Conflict`]: the
//! Service is planned again once the cache shows the newer version (issue 16).
//!
//! The writer's parts: `send` (the slice writes, and a pass of them through the fence), `read`
//! (the reads of the write path: the read-back of a Service's slices and the reads that confirm
//! a plan's additions) and `rate` (the client-side write rate). This file holds what every call
//! goes through: the call timeout and a slot of the calls in flight.

use std::{future::Future, sync::Arc, time::Duration};

use k8s_openapi::api::{core::v1::ObjectReference, discovery::v1::EndpointSlice};
use kube::{
    Api, Client,
    runtime::events::{Event, Recorder, Reporter},
};
use tokio::time::Instant;

use crate::limit::WriteLimit;

mod rate;
mod read;
mod send;

pub use self::{
    rate::WriteRate,
    send::{Pass, WriteError, Written, write_plan},
};

/// How long one API write may take before the writer gives up on it and the reconcile is
/// retried with backoff. A write the API server never answers (its storage down, a response lost)
/// would otherwise hold a worker until the client's read timeout (295 s); the server itself gives
/// up on its storage after 60 s (`--request-timeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The API calls of the write path: the slice writes and Events, and the reads that check them
/// (the read-back of a Service's slices, the reads that confirm a plan's additions, `confirm`),
/// each bounded by the call timeout. Tests run it over the in-memory API server, with faults at
/// exact calls (`test_api`).
#[derive(Clone)]
pub struct KubeReadWrite {
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

// === impl KubeReadWrite ===

impl KubeReadWrite {
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

impl KubeReadWrite {
    /// Publishes `event` about the object `regarding`.
    pub async fn publish_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.limited(|| self.events.publish(event, regarding)).await
    }
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
mod read_tests;
#[cfg(test)]
mod tests;
