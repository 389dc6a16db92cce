//! The streams opened ahead of the one being read, so that a stream whose frames arrive late
//! leaves no gap on the server between its end and the next stream's start.
//!
//! The API server ends each stream at its timeout. When the stream's frames reach us D late (a
//! slow proxy or network path), its end reaches us D late too, and a change made on the server
//! in between is sent only by the next stream, which is also D late: a change could wait 2D.
//! So when a stream reaches the earliest end its timeout allows without its closing bookmark
//! (sent two seconds before the timeout) read, it is late, and the next one is opened from the
//! last version read, and left unread until the stream before it ends; so is the next after
//! that at that one's earliest end, and so on while the one being read is late. Then it
//! takes over: what the stream before it had already given is skipped by resourceVersion, so
//! each event is read once. Every change is then on a stream that was open on the server when
//! it was made, and waits only D.
//!
//! ```text
//!  server:  ├── stream 1 ──┤
//!                       ├── stream 2 ──┤            (opened at stream 1's earliest end)
//!                                   ├── stream 3 ──┤
//!  read:    ·····D·····├── stream 1 ──┤── 2 ──┤── 3 …  (each takes over when the one before ends)
//! ```
//!
//! A stream on time gets none. Without bookmarks (an API server with its watch cache off) each
//! stream is followed a second before its end. With a lag D, about D divided by the timeout
//! streams are open at once. [`AHEAD`] bounds that: a stream
//! whose frames are later than the stall bound is cut anyway, and a server that ignores the
//! timeout is not answered with ever more streams.

use std::{collections::VecDeque, sync::Arc};

use futures::{FutureExt, future::BoxFuture};
use tokio::time::Instant;

use super::{EventStream, WatchApi, WatchConfig, WatchHooks, machine::Open};

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
            let answered = (&mut opening.request).await;
            let Some(opening) = self.opening.take() else {
                return;
            };
            match answered {
                Ok(events) => {
                    self.ahead
                        .push_back(Open::ahead(events, opening.answers, opening.ends_at));
                }
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
