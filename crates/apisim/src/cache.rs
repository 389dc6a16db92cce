//! Watch caches: what each API server instance serves watches, and reads that allow a cached
//! answer (`resourceVersion=0`, `NotOlderThan`), from.
//!
//! ```text
//!  write ─► Store (etcd: objects, history) ─► feed (change + commit instant)
//!                                                 │   one cache per instance and resource,
//!                                                 ▼   each `lag` behind the feed
//!                              instance i, resource r: version = newest revision committed
//!                              at or before now − lag(i, r) ─► every watch of r on i
//! ```
//!
//! A cache is not a copy: its version at an instant is computed from the feed, so every client
//! of one instance sees one cache (shared, as on kube-apiserver), the caches of two instances
//! lag apart, and a lag of zero is the store itself. Bookmarks carry the cache's version, as the
//! real watch cache's do (which may be newer than the newest event of its resource).

use std::{collections::VecDeque, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;
use tokio::{sync::watch, time::Instant};

use crate::{
    Inner,
    kinds::Resource,
    store::{Selection, event_for, line},
};

/// An open watch, from its first event on: the changes it selects as its cache reaches them, a
/// bookmark every bookmark interval and two seconds before the timeout (when it asked for
/// bookmarks, and its cache has reached its start), and its end at the timeout or when the
/// server closes it.
pub struct WatchStream {
    pub inner: Arc<Inner>,
    /// The instance serving it.
    pub instance: usize,
    /// Its id: [`crate::ApiServer::close_watches`] ends those opened before a given id.
    pub id: u64,
    pub selection: Selection,
    /// The revision up to which its cache's changes were looked at.
    pub position: u64,
    /// Lines read and not yet sent.
    pub pending: VecDeque<Bytes>,
    /// Wakes it when the store has a new revision.
    pub revisions: watch::Receiver<u64>,
    /// Wakes it when the server closes watches.
    pub closures: watch::Receiver<u64>,
    pub deadline: Instant,
    /// The next periodic bookmark, when bookmarks were asked for.
    pub next_bookmark: Option<Instant>,
    /// Whether the bookmark before the timeout is still to come.
    pub closing_bookmark: bool,
    /// Until when a streaming list whose start its cache has not reached waits for the cache (as
    /// kube-apiserver's cacher does, three seconds), before it answers "Too large resource
    /// version" and ends; `None` once the cache has reached it (or for a plain watch, which
    /// waits without an end: it sends nothing, bookmarks included, below its start).
    pub fresh_by: Option<Instant>,
    /// What the stream sends first once its cache has reached its start (a streaming list's
    /// state and its closing bookmark), held while it waits.
    pub held: Vec<Bytes>,
    /// The stream has sent its last line.
    pub ended: bool,
}

/// How long a streaming list whose start its cache has not reached waits for it before it fails
/// (kube-apiserver's `waitUntilFreshAndBlock`).
pub const FRESH_WAIT: Duration = Duration::from_secs(3);

/// What a step of a watch stream does next.
#[derive(Debug)]
enum Next {
    Send(Bytes),
    End,
    Look,
}

// === impl WatchStream ===

impl WatchStream {
    fn bookmark_at(&self) -> Option<Instant> {
        let periodic = self.next_bookmark?;
        let closing = self
            .closing_bookmark
            .then(|| self.deadline.checked_sub(Duration::from_secs(2)))
            .flatten();
        Some(closing.map_or(periodic, |closing| closing.min(periodic)))
    }

    /// The stream of lines: first `first` (once the cache has reached the stream's start),
    /// then what the cache brings.
    pub fn run(mut self, mut first: Vec<Bytes>) -> futures::stream::BoxStream<'static, Bytes> {
        if self.fresh_by.is_some() {
            self.held = std::mem::take(&mut first);
        }
        let first = futures::stream::iter(first);
        let rest = futures::stream::unfold(self, |mut stream| async move {
            loop {
                match stream.step().await {
                    Next::Send(line) => return Some((line, stream)),
                    Next::End => return None,
                    Next::Look => {}
                }
            }
        });
        first.chain(rest).boxed()
    }

    async fn step(&mut self) -> Next {
        if let Some(line) = self.pending.pop_front() {
            return Next::Send(line);
        }
        if self.ended {
            return Next::End;
        }
        // Marked seen before looking, so a change after the look wakes the wait below.
        self.revisions.borrow_and_update();
        self.closures.borrow_and_update();
        if self.inner.watch_closed(self.id, self.selection.resource) {
            return Next::End;
        }
        let storage = self.selection.resource.storage();
        let (version, next_due) = self.inner.cache_version(self.instance, storage);
        if let Some(by) = self.fresh_by {
            if version >= self.position {
                self.fresh_by = None;
                self.pending.extend(self.held.drain(..));
                return Next::Look;
            }
            if Instant::now() >= by {
                // One ERROR, then the end.
                self.ended = true;
                return Next::Send(too_large(self.position, version));
            }
            let lag_over =
                next_due.map(|committed| committed + self.inner.lag(self.instance, storage));
            return tokio::select! {
                biased;
                _ = self.revisions.changed() => Next::Look,
                _ = self.closures.changed() => Next::Look,
                () = tokio::time::sleep_until(lag_over.unwrap_or(by)), if lag_over.is_some() => Next::Look,
                () = tokio::time::sleep_until(by) => Next::Look,
            };
        }
        if version > self.position {
            let changes = self.inner.store.lock().fed(storage, self.position, version);
            let Some(changes) = changes else {
                // Fell behind what the cache keeps: the server ends the watch (the client
                // resumes from its last version, or re-lists).
                return Next::End;
            };
            self.pending.extend(
                changes
                    .iter()
                    .filter_map(|change| event_for(&self.selection, change)),
            );
            self.position = version;
            return Next::Look;
        }
        let bookmark_at = self.bookmark_at();
        let lag_over = next_due.map(|committed| committed + self.inner.lag(self.instance, storage));
        tokio::select! {
            biased;
            _ = self.revisions.changed() => Next::Look,
            _ = self.closures.changed() => Next::Look,
            () = tokio::time::sleep_until(lag_over.unwrap_or(self.deadline)), if lag_over.is_some() => Next::Look,
            () = tokio::time::sleep_until(self.deadline) => Next::End,
            () = tokio::time::sleep_until(bookmark_at.unwrap_or(self.deadline)), if bookmark_at.is_some() => {
                let now = Instant::now();
                if self.closing_bookmark && now + Duration::from_secs(2) >= self.deadline {
                    self.closing_bookmark = false;
                }
                if let Some(next) = self.next_bookmark.filter(|next| *next <= now) {
                    self.next_bookmark = Some(next + self.inner.config.bookmark_interval);
                }
                // Never below the stream's start (kube-apiserver's watcher sends only what is
                // newer than what it has sent): a client resumes from the last version it read.
                if version < self.position {
                    return Next::Look;
                }
                Next::Send(bookmark(self.selection.resource, version, false))
            }
        }
    }
}

/// The error that ends a streaming list whose cache did not reach `from` in [`FRESH_WAIT`] (an ERROR
/// event, as kube-apiserver's cacher sends it: 504, reason Timeout, cause
/// ResourceVersionTooLarge).
fn too_large(from: u64, current: u64) -> Bytes {
    line(
        "ERROR",
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("Too large resource version: {from}, current: {current}"),
            "reason": "Timeout",
            "details": {
                "causes": [{
                    "reason": "ResourceVersionTooLarge",
                    "message": "Too large resource version",
                }],
                "retryAfterSeconds": 1,
            },
            "code": 504,
        }),
    )
}

/// A bookmark line at `revision`.
pub fn bookmark(resource: Resource, revision: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata}),
    )
}
