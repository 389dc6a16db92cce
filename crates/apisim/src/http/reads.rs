//! GET, LIST and WATCH. A read with no resourceVersion is consistent (the store now); one with
//! `resourceVersion=0`, or `NotOlderThan` a version, is answered from the serving instance's
//! watch cache, as lagging as that cache is; `Exact` and continued lists read the history (410
//! when compacted). Watches are served from the cache ([`crate::cache`]).

use std::{collections::BTreeMap, time::Duration};

use futures::StreamExt;
use http::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    Answer, Call, DEFAULT_WATCH_TIMEOUT, Failure, json_response, stream_body, watch_response,
};
use crate::{
    cache::{WatchStream, bookmark},
    store::{Key, Selection, line},
};

/// Where a read is answered from.
enum ReadFrom {
    /// The store now (a consistent read).
    Store,
    /// The instance's watch cache, at a version no older than this one.
    Cache(u64),
    /// The history at exactly this version.
    Exact(u64),
}

impl Call<'_> {
    /// How the request's `resourceVersion` and `resourceVersionMatch` say to read.
    fn read_from(&self) -> Result<ReadFrom, Failure> {
        let version = self.query.get("resourceVersion").map(String::as_str);
        let matching = self.query.get("resourceVersionMatch").map(String::as_str);
        let number = |version: &str| {
            version
                .parse::<u64>()
                .map_err(|_| validate::invalid_version(version))
        };
        match (version, matching) {
            (None | Some(""), _) => Ok(ReadFrom::Store),
            (Some(version), Some("Exact")) => Ok(ReadFrom::Exact(number(version)?)),
            (Some(version), _) => Ok(ReadFrom::Cache(number(version)?)),
        }
    }

    /// The objects of this resource as `from` says, and the version they are at.
    fn state(&self, from: &ReadFrom) -> Result<(u64, BTreeMap<Key, Value>), Failure> {
        let storage = self.resource().storage();
        match *from {
            ReadFrom::Store => {
                let store = self.inner.store.lock();
                let revision = store.revision;
                Ok((revision, store.at(storage, revision).unwrap_or_default()))
            }
            ReadFrom::Cache(not_older) => {
                let (cached, _) = self.inner.cache_version(self.instance, storage);
                // A cache behind the version asked for is waited for on the real server; here
                // it is answered at that version at once.
                let revision = cached.max(not_older);
                let store = self.inner.store.lock();
                Ok((revision, store.cached_at(storage, revision)))
            }
            ReadFrom::Exact(revision) => {
                let store = self.inner.store.lock();
                let objects = store
                    .at(storage, revision)
                    .ok_or_else(|| expired(revision, store.compacted))?;
                Ok((revision, objects))
            }
        }
    }

    pub(super) fn get(&self) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        let key = self.key(&name);
        let object = match self.read_from()? {
            ReadFrom::Store => self.inner.store.lock().objects.get(&key).cloned(),
            from => self.state(&from)?.1.remove(&key),
        }
        .ok_or_else(|| self.not_found(&name))?;
        Ok(json_response(
            StatusCode::OK,
            &self.resource().served(object),
        ))
    }

    fn selection(&self) -> Result<Selection, Failure> {
        let (labels, fields) = self.selectors()?;
        Ok(Selection {
            resource: self.resource(),
            namespace: self.target.namespace.clone(),
            labels,
            fields,
        })
    }

    pub(super) fn list(&self) -> Answer {
        let selection = self.selection()?;
        let (revision, objects, after) =
            match self.query.get("continue").filter(|token| !token.is_empty()) {
                Some(token) => {
                    let (revision, after) = token
                        .split_once('/')
                        .and_then(|(revision, after)| {
                            Some((revision.parse::<u64>().ok()?, after.to_string()))
                        })
                        .ok_or_else(|| Failure {
                            code: 400,
                            reason: "BadRequest",
                            message: "continue key is not valid".to_string(),
                        })?;
                    let (revision, objects) = self.state(&ReadFrom::Exact(revision))?;
                    (revision, objects, Some(after))
                }
                None => {
                    let (revision, objects) = self.state(&self.read_from()?)?;
                    (revision, objects, None)
                }
            };
        let limit = self
            .query
            .get("limit")
            .and_then(|limit| limit.parse::<usize>().ok())
            .filter(|limit| *limit > 0);
        // The page walks the keys of the namespace (or all), as etcd's range does; the
        // selectors filter what it walks. It continues when keys are left after the last item
        // taken, whether or not they match (the real server's paging does the same).
        let mut walked = objects
            .into_iter()
            .filter(|(key, _)| {
                selection
                    .namespace
                    .as_ref()
                    .is_none_or(|namespace| *namespace == key.2)
            })
            .filter(|(key, _)| after.as_ref().is_none_or(|after| cursor(key) > *after))
            .peekable();
        let mut items = Vec::new();
        let mut last = None;
        for (key, object) in walked.by_ref() {
            if selection.selects(&key, &object) {
                last = Some(cursor(&key));
                items.push(object);
            }
            if limit.is_some_and(|limit| items.len() >= limit) {
                break;
            }
        }
        let more = limit.is_some() && walked.peek().is_some();
        let metadata_only = self
            .parts
            .headers
            .get(http::header::ACCEPT)
            .and_then(|accept| accept.to_str().ok())
            .is_some_and(|accept| accept.contains("as=PartialObjectMetadataList"));
        let resource = self.resource();
        let items: Vec<Value> = items
            .into_iter()
            .map(|object| {
                if metadata_only {
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": object["metadata"]})
                } else if resource.custom() {
                    resource.served(object)
                } else {
                    // Built-in kinds' list items carry no apiVersion and kind.
                    let mut item = resource.served(object);
                    if let Some(item) = item.as_object_mut() {
                        item.remove("apiVersion");
                        item.remove("kind");
                    }
                    item
                }
            })
            .collect();
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if more && let Some(last) = last {
            metadata["continue"] = Value::from(format!("{revision}/{last}"));
        }
        let (api_version, kind) = if metadata_only {
            (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadataList".to_string(),
            )
        } else {
            (resource.api_version(), format!("{}List", resource.kind))
        };
        Ok(json_response(
            StatusCode::OK,
            &json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items}),
        ))
    }

    pub(super) fn watch(&self) -> Answer {
        let selection = self.selection()?;
        let initial_events = self.flag("sendInitialEvents");
        let bookmarks = self.flag("allowWatchBookmarks");
        if initial_events
            && (!bookmarks
                || self.query.get("resourceVersionMatch").map(String::as_str)
                    != Some("NotOlderThan"))
        {
            return Err(Failure {
                code: 422,
                reason: "Invalid",
                message: "sendInitialEvents requires allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan".to_string(),
            });
        }
        let timeout = self
            .query
            .get("timeoutSeconds")
            .and_then(|seconds| seconds.parse::<u64>().ok())
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
        let version = self
            .query
            .get("resourceVersion")
            .cloned()
            .unwrap_or_default();
        let resource = self.resource();
        let storage = resource.storage();
        let mut first = Vec::new();
        let position = if initial_events || version.is_empty() || version == "0" {
            // The state first: consistent with no version, the cache's with "0" (or a version
            // it is not older than).
            let from = if version.is_empty() {
                ReadFrom::Store
            } else {
                ReadFrom::Cache(version.parse().unwrap_or(0))
            };
            let (revision, objects) = self.state(&from)?;
            for (key, object) in objects {
                if selection.selects(&key, &object) {
                    first.push(line("ADDED", resource.served(object)));
                }
            }
            if initial_events {
                first.push(bookmark(resource, revision, true));
            }
            revision
        } else {
            let from = version
                .parse::<u64>()
                .map_err(|_| validate::invalid_version(&version))?;
            let store = self.inner.store.lock();
            if !store.holds(from) || store.fed(storage, from, from).is_none() {
                let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("too old resource version: {from} ({})", store.compacted), "reason": "Expired", "code": 410});
                let body = stream_body(futures::stream::iter(vec![line("ERROR", gone)]).boxed());
                return Ok(watch_response(body));
            }
            from
        };
        // A streaming list whose start its instance's cache has not reached waits for the cache,
        // then fails, as kube-apiserver's does; a plain watch from such a version sends nothing
        // until the cache passes it ([`WatchStream`]).
        let (cached, _) = self.inner.cache_version(self.instance, storage);
        let fresh_by = (initial_events && position > cached)
            .then(|| Instant::now() + crate::cache::FRESH_WAIT);
        let stream = WatchStream {
            inner: self.inner.clone(),
            instance: self.instance,
            id: self
                .inner
                .next_watch
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            selection,
            position,
            pending: std::collections::VecDeque::new(),
            revisions: self.inner.revisions.subscribe(),
            closures: self.inner.closures.subscribe(),
            deadline: Instant::now() + timeout,
            next_bookmark: bookmarks.then(|| Instant::now() + self.inner.config.bookmark_interval),
            closing_bookmark: bookmarks,
            fresh_by,
            held: Vec::new(),
            ended: false,
        };
        Ok(watch_response(stream_body(stream.run(first))))
    }
}

fn expired(revision: u64, compacted: u64) -> Failure {
    Failure {
        code: 410,
        reason: "Expired",
        message: format!("too old resource version: {revision} ({compacted})"),
    }
}

/// The key's position for continue tokens: namespace and name.
fn cursor(key: &Key) -> String {
    format!("{}/{}", key.2, key.3)
}

use super::validate;
