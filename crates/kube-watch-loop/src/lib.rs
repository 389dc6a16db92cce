//! One Kubernetes watch loop: list, then watch from the list's resourceVersion, resuming from the
//! last version read whenever a stream ends, with a bound on silence. The `leadership` crate's
//! Lease watch runs on it, and an app can run its own watches on it, so that every watch of a
//! process reconnects by the same rules.
//!
//! ```text
//!  list (streaming, or paged) ──► watch from version ──► stream ends ──► resume from last version
//!          ▲                            │ silent past the bound: stalled ──► resume (a new
//!          │                            │   connection); stalled again ──► paged LIST, no watch
//!          └──── 410 Gone / asked ──────┘ an error: backoff, resume
//! ```
//!
//! A stream that reaches the earliest end its server timeout allows before its closing bookmark
//! is read (its frames come late) gets a successor, opened from the last version read and read
//! once it ends, each event once (the relay, `relay.rs`): a change made on the server between
//! the two is then late by the stream's lag, not twice it.
//!
//! The loop ([`WatchLoop`]) is a state machine over [`WatchApi`], the two requests it needs (list
//! a page, watch from a version), so its every transition can be tested against scripted answers
//! in paused time; `kube::Api<K>` implements it. What the loop observes on its way (a list
//! starting, a stall, an error) goes to [`WatchHooks`], for an app's health and metrics.
//!
//! Why not kube-runtime's watcher: it hides bookmarks, starts every restart with a full list and
//! detects a silent connection only after its server timeout plus 5 s (295 s by default). Here a
//! bookmark is a sign of life, a restart resumes from the last version read, and the server is
//! asked for a timeout short enough that a healthy watch is never silent for long
//! ([`server_timeout`]): each stream gets a bookmark two seconds before its timeout (from the
//! API server's watch cache) and is then ended by the server at that timeout, and a stream kept
//! open to its timeout counts as a sign of life too (without a watch cache there are no
//! bookmarks). So a watch that hears nothing for twice that timeout is stalled.
//!
//! The first list uses the API server's streaming list (a watch with `sendInitialEvents`,
//! Kubernetes 1.27+, on by default since 1.32) when it is offered; a server that refuses it gets
//! paged lists instead.
#![deny(missing_docs)]

mod backoff;
mod machine;
mod relay;
#[cfg(test)]
mod tests;

/// The README's example, compiled by the doc tests so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

use std::{fmt::Debug, time::Duration};

use futures::{FutureExt, StreamExt, future::BoxFuture, stream::BoxStream};
use kube::{
    Api, Resource,
    api::{ListParams, ObjectList, WatchEvent, WatchParams},
};

pub use self::{backoff::Backoff, machine::WatchLoop};

/// The server timeout of a probe's stream: its bookmark comes about a second after it starts.
/// The least that gets one: kube-apiserver schedules a watch's bookmark two seconds before its
/// timeout, and none when less than two seconds are left.
pub const PROBE_TIMEOUT_SECONDS: u32 = 3;

/// The events of one watch request, as the API server streams them.
pub type EventStream<K> = BoxStream<'static, kube::Result<WatchEvent<K>>>;

/// The two requests the watch loop makes: list a page, and watch from a version.
pub trait WatchApi: Send + Sync + 'static {
    /// The watched kind.
    type Object: Resource + Clone + Send + 'static;

    /// One page of a list (`params` carries the selectors, the page size and the continue
    /// token).
    fn list<'a>(
        &'a self,
        params: &'a ListParams,
    ) -> BoxFuture<'a, kube::Result<ObjectList<Self::Object>>>;

    /// A watch from `version` (empty: a streaming list when `params.send_initial_events`).
    fn watch<'a>(
        &'a self,
        params: &'a WatchParams,
        version: &'a str,
    ) -> BoxFuture<'a, kube::Result<EventStream<Self::Object>>>;
}

/// What a watch reads, in order.
#[derive(Debug)]
pub enum Event<K> {
    /// An object added or changed.
    Apply(K),
    /// An object deleted.
    Delete(K),
    /// A (re-)list starts: the objects that follow are the complete list.
    ListStart,
    /// An object of the list.
    Listed(K),
    /// The list is complete, as of the position's version.
    ListDone(Position),
    /// The server's position, with no object (a bookmark, or a stream the server ended).
    Progress(Position),
}

/// Where the server is, and which requests a stream started after shows answered.
#[derive(Clone, Copy, Debug)]
pub struct Position {
    /// The resourceVersion (0 when it is not a number).
    pub version: u64,
    /// The newest request ([`WatchHooks::latest_request`]) made before the stream or list that
    /// read this started.
    pub answers: u64,
}

/// What the rest of a process may ask of a watch loop ([`WatchLoop::with_commands`]); the id
/// comes back in [`Position::answers`] once a stream or list started after the request has
/// shown the watch up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Restart the stream from the last resourceVersion, with a short server timeout
    /// ([`PROBE_TIMEOUT_SECONDS`]) so that the server ends it (or sends a bookmark) soon.
    Probe(u64),
    /// Re-list with plain paged LIST requests (no watch connection), then resume watching.
    Relist(u64),
}

/// What the loop reports on its way, for an app's health and metrics. Every method has a
/// default that does nothing; `()` reports nothing.
pub trait WatchHooks: Send + 'static {
    /// The newest request id made so far: a stream or list started now answers up to it.
    fn latest_request(&self) -> u64 {
        0
    }

    /// A list starts.
    fn listing(&self) {}

    /// A page of a paged list was read (a sign of life).
    fn page_read(&self) {}

    /// The watch was silent past its stall bound.
    fn stalled(&self) {}

    /// A request or a stream failed (it is retried: after a backoff, or by a list after 410).
    fn failed(&self) {}

    /// The loop lost its stream (a failure, a stall, a 410): changes made from now on reach it
    /// only once a stream or list started after this call is read, and the cache may lag until
    /// then. Called before that stream or list starts, so a request made here
    /// ([`WatchHooks::latest_request`]) is answered by it. The next watch after a loss is a probe
    /// ([`PROBE_TIMEOUT_SECONDS`]), so that its bookmark comes about a second after it starts.
    fn lost(&self) {}
}

impl WatchHooks for () {}

/// What to watch, and how long it may be silent.
#[derive(Clone, Debug)]
#[must_use]
pub struct WatchConfig {
    labels: Option<String>,
    fields: Option<String>,
    stall_bound: Duration,
}

// === impl WatchConfig ===

impl WatchConfig {
    /// Every object of the kind; a stream silent for `stall_bound` is stalled.
    pub fn new(stall_bound: Duration) -> Self {
        Self {
            labels: None,
            fields: None,
            stall_bound,
        }
    }

    /// Only objects matching the label selector `labels`.
    pub fn labels(mut self, labels: impl Into<String>) -> Self {
        self.labels = Some(labels.into());
        self
    }

    /// Only objects matching the field selector `fields` (e.g. `metadata.name=my-lease`).
    pub fn fields(mut self, fields: impl Into<String>) -> Self {
        self.fields = Some(fields.into());
        self
    }

    /// The stall bound.
    pub fn stall_bound(&self) -> Duration {
        self.stall_bound
    }

    fn list_params(&self, page_size: u32, continue_token: Option<&str>) -> ListParams {
        let mut params = ListParams::default().limit(page_size);
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        if let Some(fields) = &self.fields {
            params = params.fields(fields);
        }
        if let Some(token) = continue_token {
            params = params.continue_token(token);
        }
        params
    }

    fn watch_params(&self, timeout: Option<u32>) -> WatchParams {
        let mut params = WatchParams::default()
            .timeout(timeout.unwrap_or_else(|| server_timeout(self.stall_bound)));
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        if let Some(fields) = &self.fields {
            params = params.fields(fields);
        }
        params
    }
}

// === impl WatchApi for Api ===

impl<K> WatchApi for Api<K>
where
    K: Resource + Clone + Debug + k8s_openapi::serde::de::DeserializeOwned + Send + Sync + 'static,
{
    type Object = K;

    fn list<'a>(&'a self, params: &'a ListParams) -> BoxFuture<'a, kube::Result<ObjectList<K>>> {
        Api::list(self, params).boxed()
    }

    fn watch<'a>(
        &'a self,
        params: &'a WatchParams,
        version: &'a str,
    ) -> BoxFuture<'a, kube::Result<EventStream<K>>> {
        async move { Ok(Api::watch(self, params, version).await?.boxed()) }.boxed()
    }
}

/// The server timeout asked of each stream: a sixth of the stall bound (at least the probe's),
/// so that the bookmark the server sends two seconds before it, and the next stream's, arrive
/// well within the bound, even on a stream whose frames all arrive late. A stream that lags by
/// D but delivers shows a sign of life every sixth of the bound plus D, so it is not cut (and
/// its lag doubled by a resume) unless D is close to the whole bound (issue 32).
pub fn server_timeout(stall_bound: Duration) -> u32 {
    let sixth = stall_bound.as_secs() / 6;
    u32::try_from(sixth)
        .unwrap_or(u32::MAX)
        .max(PROBE_TIMEOUT_SECONDS)
}

/// Parses a resourceVersion as the number etcd gives it (0 when it is not one: such a version
/// is never taken as proof of freshness).
pub fn version_number(version: &str) -> u64 {
    version.parse().unwrap_or(0)
}
