//! The watch loop's state machine (see the crate docs).

use std::{collections::VecDeque, sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Resource,
    api::{WatchEvent, WatchParams},
    core::Status,
};
use tokio::{sync::mpsc, time::Instant};

use super::{
    Backoff, Command, Event, PROBE_TIMEOUT_SECONDS, Position, WatchApi, WatchConfig, WatchHooks,
    relay::Open, version_number,
};

/// Objects per page of a paged list.
const PAGE_SIZE: u32 = 500;

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// One watch: call [`WatchLoop::next`] for each event. It retries, resumes and re-lists on its
/// own, so it never ends and never fails; failures and stalls go to its [`WatchHooks`].
pub struct WatchLoop<A: WatchApi, H = ()> {
    /// `None`: nobody sends commands.
    commands: Option<mpsc::UnboundedReceiver<Command>>,
    machine: Machine<A, H>,
}

/// The loop without its commands, so that a command can interrupt any step.
struct Machine<A: WatchApi, H> {
    /// Shared with the requests for streams ahead (`relay.rs`), which outlive a step.
    api: Arc<A>,
    config: WatchConfig,
    hooks: H,
    /// What the loop reads, or opens next; where it resumes from lives here too.
    state: State<A::Object>,
    /// Whether the server offers streaming lists: learned once (a refusal), kept for good.
    streaming: bool,
    /// The next watch from a version is a probe (short server timeout). Asked for by a command
    /// or after a loss, it holds through any list in between, until that watch starts.
    probe: bool,
    /// Events read and not yet returned (a page holds many).
    pending: VecDeque<Event<A::Object>>,
    /// Stalls since the last event: a second one in a row re-lists with paged lists.
    stalls_in_a_row: u32,
    /// The delay before a retry; reset by a page or an event read.
    backoff: Backoff,
}

/// What the loop reads, or what it opens next.
enum State<K> {
    /// Nothing open; the next step lists: a streaming list when the server offers one, a paged
    /// list otherwise or when `paged` (after repeated stalls, or asked for).
    List { paged: bool, back_off: bool },
    /// Nothing open; the next step watches from `version`, the last one read.
    Resume { version: String, back_off: bool },
    /// A paged list, page by page.
    Paging(Paging),
    /// An open stream.
    Reading(Open<K>),
}

struct Paging {
    continue_token: Option<String>,
    answers: u64,
}

// === impl WatchLoop ===

impl<A: WatchApi, H: WatchHooks> WatchLoop<A, H> {
    /// A watch through `api` of what `config` selects, reporting to `hooks`.
    pub fn new(api: A, config: WatchConfig, hooks: H) -> Self {
        Self {
            commands: None,
            machine: Machine {
                api: Arc::new(api),
                config,
                hooks,
                state: State::LIST,
                streaming: true,
                probe: false,
                pending: VecDeque::new(),
                stalls_in_a_row: 0,
                backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
            },
        }
    }

    /// Takes [`Command`]s from `commands`; each interrupts whatever the loop waits for.
    #[must_use]
    pub fn with_commands(mut self, commands: mpsc::UnboundedReceiver<Command>) -> Self {
        self.commands = Some(commands);
        self
    }

    /// The hooks the loop reports to.
    pub fn hooks(&self) -> &H {
        &self.machine.hooks
    }

    /// The next event; never ends. A command interrupts whatever the loop waits for (a stream,
    /// a request that gets no answer, a backoff). Dropping the future between events loses
    /// nothing; dropping it inside a step abandons that step (a stream or request in flight),
    /// which the next call starts again.
    pub async fn next(&mut self) -> Event<A::Object> {
        loop {
            if let Some(event) = self.machine.pending.pop_front() {
                return event;
            }
            let step = tokio::select! {
                biased;
                Some(command) = next_command(&mut self.commands) => Err(command),
                event = self.machine.step() => Ok(event),
            };
            match step {
                Err(command) => self.machine.command(command),
                Ok(Some(event)) => return event,
                Ok(None) => {}
            }
        }
    }
}

/// The next command; never, when there is no channel or it is closed.
async fn next_command(commands: &mut Option<mpsc::UnboundedReceiver<Command>>) -> Option<Command> {
    match commands {
        Some(receiver) => match receiver.recv().await {
            Some(command) => Some(command),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

// === impl Machine ===

impl<A: WatchApi, H: WatchHooks> Machine<A, H> {
    /// One wait: for a page, a stream to open, or the stream's next item; each bounded by the
    /// stall bound (a proxy that holds a watch's answer, headers included, stalls its start).
    async fn step(&mut self) -> Option<Event<A::Object>> {
        let bound = self.config.stall_bound();
        if let State::Reading(open) = &mut self.state {
            let read = tokio::select! {
                biased;
                () = open.relay.advance(
                    &self.api,
                    &self.config,
                    &self.hooks,
                    open.resume.as_deref(),
                    (open.ends_at, open.on_time()),
                ) => return None,
                read = tokio::time::timeout_at(open.heard + bound, open.events.next()) => read,
            };
            return match read {
                Err(_silent) => {
                    self.stalled();
                    None
                }
                Ok(None) => self.ended(),
                Ok(Some(Err(error))) => {
                    self.state = self.state.closed();
                    self.failed(&error).await;
                    None
                }
                Ok(Some(Ok(event))) => self.event(event),
            };
        }
        if self.state.take_back_off() {
            tokio::time::sleep(self.backoff.next_delay()).await;
        }
        let started = if matches!(self.state, State::Paging(_)) {
            tokio::time::timeout(bound, self.next_page()).await
        } else {
            tokio::time::timeout(bound, self.open()).await
        };
        match started {
            Err(_silent) => self.stalled(),
            Ok(Err(error)) => self.failed(&error).await,
            Ok(Ok(())) => {}
        }
        None
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Probe(_) => {
                tracing::debug!("probing: restarting the stream with a short timeout");
                self.probe = true;
                // A paged list goes on; the probe applies to the watch after it.
                if matches!(self.state, State::Reading(_)) {
                    self.state = self.state.closed();
                }
            }
            Command::Relist(_) => {
                tracing::info!("re-listing on request");
                // A backoff still owed is waited before the list.
                self.state = State::List {
                    paged: true,
                    back_off: self.state.backing_off(),
                };
            }
        }
    }

    /// Opens the next stream (a list, or a watch from the last version read), or starts a paged
    /// list.
    async fn open(&mut self) -> kube::Result<()> {
        let answers = self.hooks.latest_request();
        let version = match &self.state {
            State::List { paged, .. } => {
                let paged = *paged;
                return self.list(answers, paged).await;
            }
            State::Resume { version, .. } => version.clone(),
            State::Paging(_) | State::Reading(_) => return Ok(()),
        };
        let timeout = std::mem::take(&mut self.probe).then_some(PROBE_TIMEOUT_SECONDS);
        let params = self.config.watch_params(timeout);
        let events = self.api.watch(&params, &version).await?;
        self.state = State::Reading(Open::new(
            events,
            answers,
            false,
            Some(version),
            ends_at(&params),
        ));
        Ok(())
    }

    /// Starts a list: a streaming one when the server offers it and `paged` is not asked for,
    /// else the first page of a paged list (read by the next step).
    async fn list(&mut self, answers: u64, paged: bool) -> kube::Result<()> {
        self.hooks.listing();
        self.pending.push_back(Event::ListStart);
        if !self.streaming || paged {
            self.state = State::Paging(Paging {
                continue_token: None,
                answers,
            });
            return Ok(());
        }
        let mut params = self.config.watch_params(None);
        params.send_initial_events = true;
        let events = match self.api.watch(&params, "").await {
            Err(error) if refused(&error) => {
                tracing::info!(%error, "streaming list refused; using paged lists");
                self.streaming = false;
                self.pending.clear();
                return Ok(());
            }
            opened => opened?,
        };
        self.state = State::Reading(Open::new(events, answers, true, None, ends_at(&params)));
        Ok(())
    }

    /// Reads one page of a paged list into `pending`.
    async fn next_page(&mut self) -> kube::Result<()> {
        let State::Paging(paging) = &self.state else {
            return Ok(());
        };
        let answers = paging.answers;
        let params = self
            .config
            .list_params(PAGE_SIZE, paging.continue_token.as_deref());
        let page = match self.api.list(&params).await {
            Err(error) if gone(&error) => {
                // The continue token expired: list again from the start.
                tracing::info!("paged list expired; listing again");
                self.state = State::List {
                    paged: true,
                    back_off: false,
                };
                self.pending.clear();
                return Ok(());
            }
            page => page?,
        };
        self.backoff.reset();
        let version = page.metadata.resource_version.clone().unwrap_or_default();
        self.hooks.page_read();
        self.pending
            .extend(page.items.into_iter().map(Event::Listed));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => {
                self.state = State::Paging(Paging {
                    continue_token: Some(token),
                    answers,
                });
            }
            None => {
                self.pending.push_back(Event::ListDone(Position {
                    version: version_number(&version),
                    answers,
                }));
                self.state = State::Resume {
                    version,
                    back_off: false,
                };
            }
        }
        Ok(())
    }

    /// Turns one read of the stream into an event (or none, for what only moves the loop).
    fn event(&mut self, event: WatchEvent<A::Object>) -> Option<Event<A::Object>> {
        let State::Reading(open) = &mut self.state else {
            return None;
        };
        self.stalls_in_a_row = 0;
        self.backoff.reset();
        open.heard = Instant::now();
        let listing = open.listing;
        let answers = open.answers;
        if matches!(event, WatchEvent::Bookmark(_)) && !listing {
            open.bookmark_read = Some(open.heard);
        }
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) if listing => {
                Some(Event::Listed(object))
            }
            WatchEvent::Added(object) | WatchEvent::Modified(object) => open
                .read(object.meta().resource_version.as_deref())
                .then_some(Event::Apply(object)),
            WatchEvent::Deleted(object) if listing => Some(Event::Delete(object)),
            WatchEvent::Deleted(object) => open
                .read(object.meta().resource_version.as_deref())
                .then_some(Event::Delete(object)),
            WatchEvent::Bookmark(bookmark)
                if !listing
                    && open.read_before(Some(bookmark.metadata.resource_version.as_str())) =>
            {
                // A stream that took over, still at what the one before it gave: it was open on
                // the server since it started, so it answers the requests made before that.
                Some(Event::Progress(Position {
                    version: open.read_through,
                    answers,
                }))
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
                open.resume = Some(version);
                open.listing = false;
                Some(if listing {
                    Event::ListDone(position)
                } else {
                    Event::Progress(position)
                })
            }
            WatchEvent::Error(status) => {
                let resume = open.resume.take();
                self.status(&status, listing, resume);
                None
            }
        }
    }

    /// An error status inside the stream, which was resuming from `resume`.
    fn status(&mut self, status: &Status, listing: bool, mut resume: Option<String>) {
        let mut back_off = false;
        if status.code == 410 {
            tracing::info!(message = %status.message, "watch expired; re-listing");
            self.lost();
            resume = None;
        } else if listing && self.streaming && matches!(status.code, 400 | 422 | 501) {
            tracing::info!(message = %status.message, "streaming list refused; using paged lists");
            self.streaming = false;
            resume = None;
        } else {
            self.hooks.failed();
            self.lost();
            // An API server that keeps answering with an error (etcd down) is not hammered.
            back_off = true;
            tracing::warn!(code = status.code, message = %status.message, "watch error; resuming after a backoff");
        }
        if listing || resume.is_none() {
            self.pending.clear();
            resume = None;
        }
        self.state = match resume {
            Some(version) => State::Resume { version, back_off },
            None => State::List {
                paged: false,
                back_off,
            },
        };
    }

    /// The stream (or the start of one, or a page) was silent past the stall bound.
    fn stalled(&mut self) {
        self.hooks.stalled();
        self.lost();
        self.stalls_in_a_row += 1;
        let listing = match &self.state {
            State::Reading(open) => open.listing,
            State::Paging(_) => true,
            State::List { .. } | State::Resume { .. } => false,
        };
        let bound = self.config.stall_bound();
        if self.stalls_in_a_row > 1 || listing {
            // A new watch connection stalled too (a proxy that stalls every watch): read the
            // state with plain LIST requests, which such a proxy passes.
            tracing::warn!(
                stalls = self.stalls_in_a_row,
                ?bound,
                "watch silent past the stall bound again; re-listing with paged lists"
            );
            self.pending.clear();
            self.state = State::List {
                paged: true,
                back_off: false,
            };
        } else {
            tracing::warn!(
                ?bound,
                "watch silent past the stall bound; resuming on a new connection"
            );
            self.state = self.state.closed();
        }
    }

    /// The stream ended: the server's timeout, or a connection closed early. The oldest stream
    /// opened ahead of it takes over (`relay.rs`); with none, resume, or list again when a list
    /// was cut short. A stream the server kept open to its timeout has
    /// delivered everything up to the server's state when it started: a sign of life, and the
    /// answer to the requests made before it (the API server sends no bookmarks when its watch
    /// cache is off, so this is the only sign a quiet kind then gives).
    fn ended(&mut self) -> Option<Event<A::Object>> {
        let State::Reading(open) = std::mem::replace(&mut self.state, State::LIST) else {
            return None;
        };
        if open.listing {
            tracing::debug!("stream ended inside a list; listing again");
            self.pending.clear();
            return None;
        }
        let version = open.resume.as_deref().map_or(0, version_number);
        let progress = (Instant::now() >= open.ends_at).then_some(Event::Progress(Position {
            version,
            answers: open.answers,
        }));
        self.state = match (open.resume, open.relay.take_next()) {
            (Some(resume), Some((next, relay))) => {
                State::Reading(next.take_over(resume, version, relay))
            }
            (resume, _) => State::after(resume),
        };
        if progress.is_none() {
            tracing::debug!("stream closed before its timeout; resuming");
        }
        progress
    }

    /// The stream is lost: reported before the next stream or list starts, and the next watch is
    /// a probe, so that whoever waits for the cache to catch up hears a bookmark soon.
    fn lost(&mut self) {
        self.hooks.lost();
        self.probe = true;
    }

    /// A request failed, or a stream with an error: list again after 410, else wait the
    /// backoff. A paged list goes on from the page that failed.
    async fn failed(&mut self, error: &kube::Error) {
        self.hooks.failed();
        self.lost();
        if gone(error) {
            tracing::info!(%error, "watch expired; re-listing");
            self.pending.clear();
            self.state = State::LIST;
            return;
        }
        let delay = self.backoff.next_delay();
        tracing::warn!(%error, ?delay, "watch failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

// === impl State ===

impl<K> State<K> {
    /// A list from scratch, streaming when offered, with no backoff owed.
    const LIST: Self = Self::List {
        paged: false,
        back_off: false,
    };

    /// Nothing open, next resuming from `resume` (listing when there is none).
    fn after(resume: Option<String>) -> Self {
        match resume {
            Some(version) => Self::Resume {
                version,
                back_off: false,
            },
            None => Self::LIST,
        }
    }

    /// What follows when a stream is closed (an error, a stall, a probe): resume from the last
    /// version it read. A state with nothing open stays as it is.
    fn closed(&mut self) -> Self {
        match std::mem::replace(self, Self::LIST) {
            Self::Reading(open) => Self::after(open.resume),
            other => other,
        }
    }

    /// Whether a backoff is owed before the next start.
    fn backing_off(&self) -> bool {
        matches!(
            self,
            Self::List { back_off: true, .. } | Self::Resume { back_off: true, .. }
        )
    }

    /// Takes the backoff owed before the next start, if any.
    fn take_back_off(&mut self) -> bool {
        match self {
            Self::List { back_off, .. } | Self::Resume { back_off, .. } => std::mem::take(back_off),
            Self::Paging(_) | Self::Reading(_) => false,
        }
    }
}

/// The earliest time the server can end a stream opened now with `params` by its timeout (a
/// second of slack for clocks and the request's own time).
pub(crate) fn ends_at(params: &WatchParams) -> Instant {
    let timeout = Duration::from_secs(params.timeout.map_or(290, u64::from));
    Instant::now() + timeout.saturating_sub(Duration::from_secs(1))
}

/// Whether a failed start means the server does not offer streaming lists (so paged lists must
/// be used): it rejects the `sendInitialEvents` watch as invalid (400, 422) or not implemented
/// (501) rather than failing for a passing reason.
pub(super) fn refused(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if matches!(status.code, 400 | 422 | 501))
}

/// Whether the version asked for is gone (410): only a list can continue.
pub(super) fn gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 410)
}
