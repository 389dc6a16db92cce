//! An open stream ([`Open`]), and the streams opened ahead of the one being read ([`Relay`]), so
//! that a stream whose frames arrive late leaves no gap on the server between its end and the
//! next stream's start.
//!
//! The API server ends each stream at its timeout. When the stream's frames reach us D late (a
//! slow proxy or network path), its end reaches us D late too, and a change made on the server
//! in between is sent only by the next stream, which is also D late: a change could wait 2D.
//! So a stream that reaches the earliest end its timeout allows without its closing bookmark
//! (sent two seconds before the timeout) read is late, and the next stream is opened then, from
//! the last version read, and left unread; while the one being read is late, each stream ahead
//! gets its own successor at its earliest end. Each takes over when the stream before it ends,
//! skipping by resourceVersion what that one had already given, so each event is read once.
//! Every change is then on a stream that was open on the server when it was made, and waits
//! only D.
//!
//! ```text
//!  server:  ├── stream 1 ──┤
//!                       ├── stream 2 ──┤            (opened at stream 1's earliest end)
//!                                   ├── stream 3 ──┤
//!  read:    ·····D·····├── stream 1 ──┤── 2 ──┤── 3 …  (each takes over when the one before ends)
//! ```
//!
//! A stream on time gets none. kube-apiserver sends the closing bookmark at the first tick of
//! its bookmark timer (about every second, give or take a quarter) after it is due, so a
//! healthy stream whose tick comes more than a second late gets a successor too: a request
//! more, and under a second in which both are open. Without bookmarks (an API server with its
//! watch cache off) each stream is followed a second before its end. With a lag D, about D
//! divided by the timeout streams are open at once, each sending again what the last version
//! read leaves out. [`AHEAD`] bounds that: a stream whose frames are later than the stall bound
//! is cut anyway, and a server that ignores the timeout is not answered with ever more streams.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};
use tokio::time::Instant;

use super::{EventStream, WatchApi, WatchConfig, WatchHooks, version_number};

/// How long before a stream's earliest end its closing bookmark is read, on a stream that is
/// on time: the server sends it two seconds before the timeout, a second before that end.
const CLOSING_BOOKMARK_EARLY: Duration = Duration::from_secs(2);

/// The most streams opened ahead of the one being read: with the stall bound's default
/// timeout (a sixth of it), enough for a lag of nearly the whole bound.
pub(crate) const AHEAD: usize = 8;

/// The streams opened ahead of the one being read (the oldest first), and one being opened.
pub(crate) struct Relay<K> {
    ahead: VecDeque<Open<K>>,
    opening: Option<Opening<K>>,
    /// A stream ahead failed to open: no more are opened until the one being read ends (its
    /// end resumes as without a relay, with the loop's backoff).
    failed: bool,
}

/// A watch request for a stream ahead, not yet answered.
struct Opening<K> {
    request: BoxFuture<'static, kube::Result<EventStream<K>>>,
    answers: u64,
    ends_at: Instant,
}

/// A stream: the one being read, or one opened ahead of it (in its [`Relay`]).
pub(crate) struct Open<K> {
    pub(crate) events: EventStream<K>,
    pub(crate) answers: u64,
    /// A streaming list's initial events are still coming.
    pub(crate) listing: bool,
    /// Where to resume when the stream ends: the last version read (`None` while a streaming
    /// list's initial events are coming, or after an object without a version).
    pub(crate) resume: Option<String>,
    /// When the server ends the stream (its timeout), if the connection lives that long.
    pub(crate) ends_at: Instant,
    /// The last item read (or, for a stream that took over, the take-over): the stall bound
    /// counts from here.
    pub(crate) heard: Instant,
    /// The last version read on the stream this one took over from (0: none): this stream's
    /// events up to it were read there, and are skipped.
    pub(crate) read_through: u64,
    /// When the last bookmark was read.
    pub(crate) bookmark_read: Option<Instant>,
    /// The streams opened ahead of this one (empty while this one is itself ahead).
    pub(crate) relay: Relay<K>,
}

// === impl Open ===

impl<K> Open<K> {
    pub(crate) fn new(
        events: EventStream<K>,
        answers: u64,
        listing: bool,
        resume: Option<String>,
        ends_at: Instant,
    ) -> Self {
        Self {
            events,
            answers,
            listing,
            resume,
            ends_at,
            heard: Instant::now(),
            read_through: 0,
            bookmark_read: None,
            relay: Relay::new(),
        }
    }

    /// A stream opened ahead of the one being read, answering the requests up to `answers`.
    pub(crate) fn ahead(events: EventStream<K>, answers: u64, ends_at: Instant) -> Self {
        Self::new(events, answers, false, None, ends_at)
    }

    /// This stream, opened ahead, takes over from one that ended after reading up to `resume`
    /// (`version`), with the streams opened ahead of it.
    pub(crate) fn take_over(mut self, resume: String, version: u64, relay: Relay<K>) -> Self {
        self.resume = Some(resume);
        self.read_through = version;
        self.heard = Instant::now();
        self.relay = relay;
        self
    }

    /// Whether the stream is on time: the bookmark the server sends two seconds before the
    /// stream's timeout (a second before its earliest end) has been read.
    pub(crate) fn on_time(&self) -> bool {
        self.bookmark_read
            .is_some_and(|read| read + CLOSING_BOOKMARK_EARLY >= self.ends_at)
    }

    /// An object at `version` read from the stream: whether it is new (not read already on the
    /// stream this one took over from), and then the version to resume from.
    pub(crate) fn read(&mut self, version: Option<&str>) -> bool {
        if self.read_before(version) {
            return false;
        }
        self.resume = version.map(str::to_string);
        true
    }

    /// Whether an item at `version` was read already, on the stream this one took over from.
    pub(crate) fn read_before(&self, version: Option<&str>) -> bool {
        let version = version.map_or(0, version_number);
        version != 0 && version <= self.read_through
    }
}

// === impl Relay ===

impl<K> Relay<K> {
    pub(crate) fn new() -> Self {
        Self {
            ahead: VecDeque::new(),
            opening: None,
            failed: false,
        }
    }

    /// The oldest stream ahead, to take over from the one that ended, with the rest of the
    /// relay.
    pub(crate) fn take_next(mut self) -> Option<(Open<K>, Self)> {
        let next = self.ahead.pop_front()?;
        self.failed = false;
        Some((next, self))
    }

    /// One move of the relay, for as long as it takes: the answer to a stream ahead being
    /// opened; or, once the newest stream (the one being read, ending at `ends_at`, or the
    /// newest ahead) reaches its earliest end, the request for the next, from `from`, the last
    /// version read. Never returns when there is nothing to do: the stream being read is
    /// `on_time` (its closing bookmark read) with none ahead, no version to resume from (a
    /// streaming list's initial events), [`AHEAD`] streams ahead, or a failed opening.
    pub(crate) async fn advance<A, H>(
        &mut self,
        api: &Arc<A>,
        config: &WatchConfig,
        hooks: &H,
        from: Option<&str>,
        (ends_at, on_time): (Instant, bool),
    ) where
        A: WatchApi<Object = K>,
        H: WatchHooks,
        K: Send + 'static,
    {
        if let Some(opening) = &mut self.opening {
            let (answers, ends_at) = (opening.answers, opening.ends_at);
            let answered = (&mut opening.request).await;
            self.opening = None;
            match answered {
                Ok(events) => self.ahead.push_back(Open::ahead(events, answers, ends_at)),
                Err(error) => {
                    tracing::debug!(%error, "a stream ahead failed to open; none more until this one ends");
                    self.failed = true;
                }
            }
            return;
        }
        let due = self.ahead.back().map_or(ends_at, |newest| newest.ends_at);
        let from = match from {
            Some(from)
                if !self.failed
                    && self.ahead.len() < AHEAD
                    && !(on_time && self.ahead.is_empty()) =>
            {
                from.to_string()
            }
            _ => return std::future::pending().await,
        };
        tokio::time::sleep_until(due).await;
        let params = config.watch_params(None);
        let ends_at = super::machine::ends_at(&params);
        let answers = hooks.latest_request();
        let api = Arc::clone(api);
        tracing::trace!(%from, "opening the next stream ahead of the one being read");
        self.opening = Some(Opening {
            request: async move { api.watch(&params, &from).await }.boxed(),
            answers,
            ends_at,
        });
    }
}
