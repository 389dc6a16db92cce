//! The source of one watch: list, then watch from the list's resourceVersion, resuming from the
//! last version read whenever a stream ends, with a bound on silence.
//!
//! ```text
//!  list (streaming, or paged) ──► watch from version ──► stream ends ──► resume from last version
//!          ▲                            │ silent past the bound: stalled ──► resume (a new
//!          │                            │   connection); stalled again ──► paged LIST, no watch
//!          └──── 410 Gone / asked ──────┘ an error: backoff, resume
//! ```
//!
//! Why not kube-runtime's watcher: it hides bookmarks, starts every restart with a full list and
//! detects a silent connection only after its server timeout plus 5 s (295 s by default). Here a
//! bookmark is a sign of life, a restart resumes from the last version read, and the server is
//! asked for a timeout short enough that a healthy watch is never silent for long: each stream
//! gets a bookmark two seconds before its timeout (from the API server's watch cache) and is then
//! ended by the server at that timeout, and a stream kept open to its timeout counts as a sign of
//! life too (without a watch cache there are no bookmarks). So a watch that hears nothing for
//! twice that timeout is stalled (docs/operations.md, "Quiet faults").

use std::{collections::VecDeque, sync::Arc, time::Duration};

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Api, Resource,
    api::{ListParams, WatchEvent, WatchParams},
    core::Status,
};
use prometheus_client::metrics::counter::Counter;
use tokio::{sync::mpsc, time::Instant};

use super::{
    backoff::Backoff,
    health::{Command, KindHealth, version_number},
};

/// Objects per page of a paged list.
const PAGE_SIZE: u32 = 500;

/// The server timeout of a probe's stream: its bookmark comes about a second after it starts.
const PROBE_TIMEOUT_SECONDS: u32 = 3;

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

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
    /// The list is complete, as of `version`.
    ListDone(Position),
    /// The server's position, with no object (a bookmark).
    Progress(Position),
}

/// Where the server is, and which requests a stream started after shows answered.
#[derive(Clone, Copy, Debug)]
pub struct Position {
    /// The resourceVersion (0 when it is not a number).
    pub version: u64,
    /// The newest request made before the stream or list that read this started.
    pub answers: u64,
}

/// The counters of one watch.
#[derive(Clone, Debug, Default)]
pub struct WatchCounters {
    /// Errors, each retried with backoff.
    pub errors: Counter,
    /// Complete lists after the first (after a 410 Gone, a stall, or a request).
    pub relists: Counter,
    /// Streams that were silent past the stall bound.
    pub stalls: Counter,
}

/// The source of one watch's events (see the module docs).
pub struct Source<K: Resource> {
    api: Api<K>,
    labels: Option<String>,
    health: Arc<KindHealth>,
    /// Taken out while a step runs, so that a command can interrupt any wait.
    commands: Option<mpsc::UnboundedReceiver<Command>>,
    counters: WatchCounters,
    /// Whether the server offers streaming lists.
    streaming: bool,
    /// Where to resume; `None`: list first.
    resume_from: Option<String>,
    /// The next list is a paged LIST (after repeated stalls, or asked for).
    paged: bool,
    /// The next stream is a probe (short server timeout).
    probe: bool,
    stream: Option<Open<K>>,
    paging: Option<Paging>,
    pending: VecDeque<Event<K>>,
    stalls_in_a_row: u32,
    backoff: Backoff,
    /// The last stream ended on an error status: wait the backoff before the next start.
    back_off: bool,
}

struct Open<K> {
    events: BoxStream<'static, kube::Result<WatchEvent<K>>>,
    answers: u64,
    /// A streaming list's initial events are still coming.
    listing: bool,
    /// When the server ends the stream (its timeout), if the connection lives that long.
    ends_at: Instant,
}

struct Paging {
    continue_token: Option<String>,
    answers: u64,
}

/// Why opening a stream or reading a page failed.
type OpenError = kube::Error;

// === impl Source ===

impl<K> Source<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    /// A watch of `api` (objects with `labels`, when given) reporting to `health`.
    pub fn new(
        api: Api<K>,
        labels: Option<String>,
        health: Arc<KindHealth>,
        commands: mpsc::UnboundedReceiver<Command>,
        counters: WatchCounters,
    ) -> Self {
        Self {
            api,
            labels,
            health,
            commands: Some(commands),
            counters,
            streaming: true,
            resume_from: None,
            paged: false,
            probe: false,
            stream: None,
            paging: None,
            pending: VecDeque::new(),
            stalls_in_a_row: 0,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
            back_off: false,
        }
    }

    /// The next event; retries, resumes and re-lists on its own, so it never ends. A command
    /// interrupts whatever the source waits for (a stream, a request that gets no answer, a
    /// backoff).
    pub async fn next(&mut self) -> Event<K> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event;
            }
            // The receiver is only missing if a previous call was dropped mid-step, which
            // happens only when the watch itself is dropped.
            let Some(mut commands) = self.commands.take() else {
                return std::future::pending().await;
            };
            let step = tokio::select! {
                biased;
                // The sender lives in `self.health`: `None` cannot come while `self` lives.
                Some(command) = commands.recv() => Err(command),
                event = self.step() => Ok(event),
            };
            self.commands = Some(commands);
            match step {
                Err(command) => self.command(command),
                Ok(Some(event)) => return event,
                Ok(None) => {}
            }
        }
    }

    /// One wait: for a page, a stream to open, or the stream's next item; each bounded by the
    /// stall bound (a proxy that holds a watch's answer, headers included, stalls its start).
    async fn step(&mut self) -> Option<Event<K>> {
        let bound = self.health.stall_bound();
        if self.paging.is_some() || self.stream.is_none() {
            if std::mem::take(&mut self.back_off) {
                tokio::time::sleep(self.backoff.next()).await;
            }
            let started = if self.paging.is_some() {
                tokio::time::timeout(bound, self.next_page()).await
            } else {
                tokio::time::timeout(bound, self.open()).await
            };
            match started {
                Err(_silent) => self.stalled(),
                Ok(Err(error)) => self.failed(&error).await,
                Ok(Ok(())) => {}
            }
            return None;
        }
        let open = self.stream.as_mut()?;
        match tokio::time::timeout(bound, open.events.next()).await {
            Err(_silent) => {
                self.stalled();
                None
            }
            Ok(None) => self.ended(),
            Ok(Some(Err(error))) => {
                self.stream = None;
                self.failed(&error).await;
                None
            }
            Ok(Some(Ok(event))) => self.event(event),
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Probe(_) => {
                tracing::debug!("probing: restarting the stream with a short timeout");
                self.probe = true;
            }
            Command::Relist(_) => {
                tracing::info!("re-listing on request");
                self.paged = true;
                self.resume_from = None;
                self.paging = None;
            }
        }
        // The request is answered by a stream started after it.
        self.stream = None;
    }

    /// Opens the next stream: a list, or a watch from the last version read.
    async fn open(&mut self) -> Result<(), OpenError> {
        let answers = self.health.latest_request();
        let Some(version) = self.resume_from.clone() else {
            self.health.listing();
            self.pending.push_back(Event::ListStart);
            if self.streaming && !self.paged {
                let mut params = self.params(None);
                params.send_initial_events = true;
                let opened = self.api.watch(&params, "").await;
                let events = match opened {
                    Err(error) if refused(&error) => {
                        tracing::info!(%error, "streaming list refused; using paged lists");
                        self.streaming = false;
                        self.pending.clear();
                        return Ok(());
                    }
                    opened => opened?,
                };
                self.stream = Some(Open {
                    events: events.boxed(),
                    answers,
                    listing: true,
                    ends_at: ends_at(&params),
                });
            } else {
                self.paged = false;
                self.paging = Some(Paging {
                    continue_token: None,
                    answers,
                });
            }
            return Ok(());
        };
        let timeout = std::mem::take(&mut self.probe).then_some(PROBE_TIMEOUT_SECONDS);
        let params = self.params(timeout);
        let events = self.api.watch(&params, &version).await?;
        self.stream = Some(Open {
            events: events.boxed(),
            answers,
            listing: false,
            ends_at: ends_at(&params),
        });
        Ok(())
    }

    /// Reads one page of a paged list into `pending`.
    async fn next_page(&mut self) -> Result<(), OpenError> {
        let Some(paging) = self.paging.as_mut() else {
            return Ok(());
        };
        let mut params = ListParams::default().limit(PAGE_SIZE);
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        if let Some(token) = &paging.continue_token {
            params = params.continue_token(token);
        }
        let page = match self.api.list(&params).await {
            Err(error) if gone(&error) => {
                // The continue token expired: list again from the start.
                tracing::info!("paged list expired; listing again");
                self.paging = None;
                self.pending.clear();
                self.resume_from = None;
                self.paged = true;
                return Ok(());
            }
            page => page?,
        };
        self.backoff.reset();
        let version = page.metadata.resource_version.clone().unwrap_or_default();
        self.health.seen(None);
        self.pending
            .extend(page.items.into_iter().map(Event::Listed));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => paging.continue_token = Some(token),
            None => {
                let answers = paging.answers;
                self.paging = None;
                self.pending.push_back(Event::ListDone(Position {
                    version: version_number(&version),
                    answers,
                }));
                self.resume_from = Some(version);
            }
        }
        Ok(())
    }

    /// Turns one read of the stream into an event (or none, for what only moves the source).
    fn event(&mut self, event: WatchEvent<K>) -> Option<Event<K>> {
        let open = self.stream.as_mut()?;
        self.stalls_in_a_row = 0;
        self.backoff.reset();
        let listing = open.listing;
        let answers = open.answers;
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) if listing => {
                Some(Event::Listed(object))
            }
            WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                self.resume_from = object.meta().resource_version.clone();
                Some(Event::Apply(object))
            }
            WatchEvent::Deleted(object) => {
                if !listing {
                    self.resume_from = object.meta().resource_version.clone();
                }
                Some(Event::Delete(object))
            }
            WatchEvent::Bookmark(bookmark) => {
                let version = bookmark.metadata.resource_version;
                let position = Position {
                    version: version_number(&version),
                    answers,
                };
                let ends_list = bookmark
                    .metadata
                    .annotations
                    .get(INITIAL_EVENTS_END)
                    .is_some_and(|value| value == "true");
                if listing && !ends_list {
                    // A bookmark inside the initial events says nothing of the list's end.
                    return None;
                }
                self.resume_from = Some(version);
                open.listing = false;
                Some(if listing {
                    Event::ListDone(position)
                } else {
                    Event::Progress(position)
                })
            }
            WatchEvent::Error(status) => {
                self.stream = None;
                self.status(&status, listing);
                None
            }
        }
    }

    /// An error status inside the stream.
    fn status(&mut self, status: &Status, listing: bool) {
        if status.code == 410 {
            tracing::info!(message = %status.message, "watch expired; re-listing");
            self.resume_from = None;
        } else if listing && self.streaming && matches!(status.code, 400 | 422 | 501) {
            tracing::info!(message = %status.message, "streaming list refused; using paged lists");
            self.streaming = false;
            self.resume_from = None;
        } else {
            self.counters.errors.inc();
            // An API server that keeps answering with an error (etcd down) is not hammered.
            self.back_off = true;
            tracing::warn!(code = status.code, message = %status.message, "watch error; resuming after a backoff");
        }
        if listing || self.resume_from.is_none() {
            self.pending.clear();
            self.resume_from = None;
        }
    }

    /// The stream was silent past the stall bound.
    fn stalled(&mut self) {
        self.counters.stalls.inc();
        self.health.stall();
        self.stalls_in_a_row += 1;
        let listing =
            self.stream.as_ref().is_some_and(|open| open.listing) || self.paging.is_some();
        self.stream = None;
        self.paging = None;
        if self.stalls_in_a_row > 1 || listing {
            // A new watch connection stalled too (a proxy that stalls every watch): read the
            // state with plain LIST requests, which such a proxy passes.
            tracing::warn!(
                stalls = self.stalls_in_a_row,
                bound = ?self.health.stall_bound(),
                "watch silent past the stall bound again; re-listing with paged lists"
            );
            self.pending.clear();
            self.resume_from = None;
            self.paged = true;
        } else {
            tracing::warn!(
                bound = ?self.health.stall_bound(),
                "watch silent past the stall bound; resuming on a new connection"
            );
        }
    }

    /// The stream ended: the server's timeout, or a connection closed early. Resume, or list
    /// again when a list was cut short. A stream the server kept open to its timeout has
    /// delivered everything up to the server's state when it started: a sign of life, and the
    /// answer to the requests made before it (the API server sends no bookmarks when its watch
    /// cache is off, so this is the only sign a quiet kind then gives).
    fn ended(&mut self) -> Option<Event<K>> {
        let open = self.stream.take()?;
        if open.listing {
            tracing::debug!("stream ended inside a list; listing again");
            self.pending.clear();
            self.resume_from = None;
            return None;
        }
        if Instant::now() < open.ends_at {
            tracing::debug!("stream closed before its timeout; resuming");
            return None;
        }
        Some(Event::Progress(Position {
            version: self.resume_from.as_deref().map_or(0, version_number),
            answers: open.answers,
        }))
    }

    async fn failed(&mut self, error: &kube::Error) {
        self.counters.errors.inc();
        self.stream = None;
        if gone(error) {
            tracing::info!(%error, "watch expired; re-listing");
            self.pending.clear();
            self.resume_from = None;
            self.paging = None;
            return;
        }
        let delay = self.backoff.next();
        tracing::warn!(%error, ?delay, "watch failed; retrying");
        tokio::time::sleep(delay).await;
    }

    fn params(&self, timeout: Option<u32>) -> WatchParams {
        let mut params = WatchParams::default()
            .timeout(timeout.unwrap_or_else(|| server_timeout(self.health.stall_bound())));
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        params
    }

    /// Re-lists counted for the metrics (the consumer knows which list is the first).
    pub fn count_relist(&self) {
        self.counters.relists.inc();
    }
}

/// The server timeout asked of each stream: half the stall bound, so that the bookmark the
/// server sends two seconds before it (and the next stream's) arrive well within the bound.
pub fn server_timeout(stall_bound: Duration) -> u32 {
    let half = stall_bound.as_secs() / 2;
    u32::try_from(half)
        .unwrap_or(u32::MAX)
        .max(PROBE_TIMEOUT_SECONDS)
}

/// The earliest time the server can end a stream opened now with `params` by its timeout (a
/// second of slack for clocks and the request's own time).
fn ends_at(params: &WatchParams) -> Instant {
    let timeout = Duration::from_secs(params.timeout.map_or(290, u64::from));
    Instant::now() + timeout.saturating_sub(Duration::from_secs(1))
}

/// Whether a failed start means the server does not offer streaming lists (so paged lists must
/// be used): it rejects the `sendInitialEvents` watch as invalid (400, 422) or not implemented
/// (501) rather than failing for a passing reason.
fn refused(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if matches!(status.code, 400 | 422 | 501))
}

/// Whether the version asked for is gone (410): only a list can continue.
fn gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Invalid").with_code(code),
        ))
    }

    #[test]
    fn only_a_rejected_streaming_watch_switches_to_paged_lists() {
        assert!(refused(&api_error(422)));
        assert!(refused(&api_error(400)));
        assert!(refused(&api_error(501)));
        assert!(!refused(&api_error(500)), "a passing failure");
        assert!(!refused(&api_error(403)), "not a question of the list mode");
    }

    #[test]
    fn the_server_timeout_is_half_the_stall_bound_and_at_least_the_probe_timeout() {
        assert_eq!(server_timeout(Duration::from_secs(30)), 15);
        assert_eq!(server_timeout(Duration::from_secs(10)), 5);
        assert_eq!(
            server_timeout(Duration::from_secs(2)),
            PROBE_TIMEOUT_SECONDS
        );
    }
}
