//! What the trace asks of the history once: a paged list continued and a watch started from
//! before a compaction (`410 Gone`), a bookmark's version before a watch's timeout, the
//! acquisition barrier's probe (a bookmark not older than a consistent list read before it), and
//! a watch from a version the server has not reached.

use super::*;

impl Run<'_> {
    /// A paged list begun, the history compacted, the list continued (410); then a watch
    /// from a version before the compaction (410 as its first event).
    pub(super) async fn expire(&mut self, compact: &Compact) {
        for (kind, prefix) in [
            (Kind::Slice, "expiring-slice"),
            (Kind::WorkloadBeta, "expiring-workload"),
        ] {
            for suffix in ["a", "b"] {
                let body = self.body(kind, Some(&format!("{prefix}-{suffix}")), false);
                let _ = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
            }
        }
        let first_page = format!("{}?limit=1", self.collection(Kind::Slice));
        let first = self
            .send(Method::GET, &first_page, None, None)
            .await
            .expect("a first page");
        let token = first
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // Writes after the list, so the compaction passes its version.
        let body = self.body(Kind::Lease, Some("expiring-lease"), false);
        let answer = self
            .send(
                Method::POST,
                &self.collection(Kind::Lease),
                None,
                Some(&body),
            )
            .await;
        self.record(
            "expire: a write after the list".into(),
            Kind::Lease,
            "expiring-lease",
            answer,
        );
        compact().await;
        let next_page = format!("{first_page}&continue={token}");
        let answer = self.send(Method::GET, &next_page, None, None).await;
        self.steps.push((
            "expire: the list continued after a compaction".into(),
            match answer {
                Ok(list) => Observed::List {
                    items: list["items"].as_array().cloned().unwrap_or_default(),
                    more: false,
                },
                Err((code, reason)) => Observed::Error { code, reason },
            },
        ));
        let request = self.watch_request(Kind::Lease, "resourceVersion=1&timeoutSeconds=5");
        let events = match self.client.request_events::<Value>(request).await {
            Ok(stream) => {
                let first = std::pin::pin!(stream).next().await;
                match first {
                    Some(Ok(WatchEvent::Error(status))) => vec![(
                        "ERROR".to_string(),
                        json!({"code": status.code, "reason": status.reason}),
                    )],
                    Some(Ok(other)) => {
                        vec![(format!("{other:?}").chars().take(40).collect(), Value::Null)]
                    }
                    Some(Err(error)) => vec![(format!("failed: {error}"), Value::Null)],
                    None => Vec::new(),
                }
            }
            Err(kube::Error::Api(status)) => vec![(
                "answer".to_string(),
                json!({"code": status.code, "reason": status.reason}),
            )],
            Err(error) => vec![(format!("failed: {error}"), Value::Null)],
        };
        self.steps.push((
            "expire: a watch from version 1".into(),
            Observed::Events(events),
        ));
    }

    /// A watch that asked for bookmarks, with a short timeout (6 s): the bookmark before the
    /// timeout carries a version no older than the newest written.
    pub(super) async fn bookmark(&mut self) {
        let newest = self.newest;
        let observed = self.bookmark_of_lease_watch(newest, 6, newest).await;
        self.steps
            .push(("bookmark before the timeout".into(), observed));
    }

    /// The acquisition barrier's probe of a quiet kind: a write of another kind, the Leases'
    /// version read by a consistent LIST after it, then a watch of Leases from before that write
    /// with the probe's short timeout (3 s). Its bookmark is not older than the list: the barrier
    /// takes only a version read at or past the list's for proof that the cache holds it (an
    /// older bookmark is a watch cache behind the read).
    pub(super) async fn probe(&mut self) {
        let from = self.newest;
        let body = self.body(Kind::Service, Some("zz-probe"), false);
        let answer = self
            .send(
                Method::POST,
                &self.collection(Kind::Service),
                None,
                Some(&body),
            )
            .await;
        self.record(
            "probe: a write of another kind".into(),
            Kind::Service,
            "zz-probe",
            answer,
        );
        let listed = self
            .list_version(Kind::Lease)
            .await
            .parse::<u64>()
            .unwrap_or(0);
        // `listed` newer than `from`: the bookmark has to move past the watch's start.
        let observed = match self.bookmark_of_lease_watch(from, 3, listed).await {
            Observed::Bookmark { not_older } => Observed::Bookmark {
                not_older: not_older && listed > from,
            },
            observed => observed,
        };
        self.steps
            .push(("probe: a bookmark after a consistent list".into(), observed));
    }

    /// A watch of Leases from a version the server has not reached (far past the newest write),
    /// with bookmarks, plain and as a streaming list. kube-apiserver sends a plain watch nothing
    /// below its start, no bookmark either (a client resumes from what a stream sent, so one
    /// below its start would take it back: simulation seed 16478, where a lagging cache's
    /// bookmark did); a streaming list waits for its watch cache to reach the version, then
    /// fails.
    pub(super) async fn ahead(&mut self) {
        let from = self.newest + 1_000;
        for (label, query) in [
            (
                "a watch from a version the cache has not reached",
                format!("allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds=4"),
            ),
            (
                "a streaming list from a version the cache has not reached",
                format!(
                    "allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion={from}&timeoutSeconds=10"
                ),
            ),
        ] {
            let request = self.watch_request(Kind::Lease, &query);
            let observed = match self.client.request_events::<Value>(request).await {
                Err(kube::Error::Api(status)) => Observed::Error {
                    code: status.code,
                    reason: status.reason,
                },
                Err(error) => panic!("{label}: {error}"),
                Ok(stream) => {
                    let mut stream = std::pin::pin!(stream);
                    let mut events = Vec::new();
                    while let Ok(Some(event)) = stream.try_next().await {
                        events.push(match event {
                            WatchEvent::Error(status) => (
                                "ERROR".to_string(),
                                json!({"code": status.code, "reason": status.reason}),
                            ),
                            WatchEvent::Bookmark(bookmark) => (
                                "BOOKMARK".to_string(),
                                json!({"below the start": bookmark
                                    .metadata
                                    .resource_version
                                    .parse::<u64>()
                                    .is_ok_and(|version| version < from)}),
                            ),
                            other => ("OTHER".to_string(), json!(format!("{other:?}"))),
                        });
                    }
                    Observed::Events(events)
                }
            };
            self.steps.push((label.into(), observed));
        }
    }

    /// A watch of Leases from `from`, with bookmarks and a timeout of `timeout` seconds: whether
    /// its first bookmark is at `at_least` or newer, or the (no) events it ended with. Bookmarks
    /// are best effort in kube-apiserver (a stream may end at its timeout without one: CI at
    /// 2f017da), so a stream that ends without one is opened again, up to three times.
    async fn bookmark_of_lease_watch(&self, from: u64, timeout: u32, at_least: u64) -> Observed {
        for _ in 0..3 {
            let query =
                format!("allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds={timeout}");
            let request = self.watch_request(Kind::Lease, &query);
            let stream = self
                .client
                .request_events::<Value>(request)
                .await
                .expect("a watch");
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(event)) = stream.try_next().await {
                if let WatchEvent::Bookmark(bookmark) = event {
                    let version = bookmark
                        .metadata
                        .resource_version
                        .parse::<u64>()
                        .unwrap_or(0);
                    return Observed::Bookmark {
                        not_older: version >= at_least,
                    };
                }
            }
        }
        Observed::Events(Vec::new())
    }
}
