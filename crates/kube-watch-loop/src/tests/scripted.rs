//! A [`WatchApi`] that answers from a script, for the table tests of the watch loop, and
//! hooks that count what the loop reports.

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use k8s_openapi::{
    api::core::v1::ConfigMap,
    apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta},
};
use kube::{
    api::{ListParams, ObjectList, WatchEvent, WatchParams},
    core::{
        Status, TypeMeta,
        watch::{Bookmark, BookmarkMeta},
    },
};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::{Event, EventStream, WatchApi, WatchHooks};

/// One answer of the scripted API, to the next request (list or watch).
#[derive(Clone, Copy, Debug)]
pub(super) enum Answer {
    /// A page of a list: objects (name, version), the list's version, a continue token.
    Page(&'static [(&'static str, u64)], u64, Option<&'static str>),
    /// A stream of these lines; it ends after the last one unless that is [`Line::Hang`].
    Stream(&'static [Line]),
    /// The request fails with this HTTP status code.
    Fail(u16),
    /// The request is never answered.
    Silent,
}

/// One item of a scripted stream.
#[derive(Clone, Copy, Debug)]
pub(super) enum Line {
    Added(&'static str, u64),
    Modified(&'static str, u64),
    Deleted(&'static str, u64),
    Bookmark(u64),
    /// The bookmark that ends a streaming list's initial events.
    ListEnd(u64),
    /// An error status inside the stream.
    Status(u16),
    /// Nothing for this many seconds.
    After(u64),
    /// Nothing, ever (the connection stays open).
    Hang,
}

/// A [`WatchApi`] answering from a script and logging each request with its time.
#[derive(Clone)]
pub(super) struct ScriptedApi {
    script: Arc<Mutex<VecDeque<Answer>>>,
    pub(super) requests: Arc<Mutex<Vec<String>>>,
    start: Instant,
}

impl ScriptedApi {
    pub(super) fn new(script: &[Answer]) -> Self {
        Self {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            requests: Arc::default(),
            start: Instant::now(),
        }
    }

    fn answer(&self, request: String) -> Answer {
        let at = self.start.elapsed().as_secs_f64();
        self.requests.lock().push(format!("{at:.1} {request}"));
        self.script.lock().pop_front().unwrap_or(Answer::Silent)
    }
}

fn object(name: &str, version: u64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: Some(version.to_string()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn bookmark(version: u64, ends_list: bool) -> WatchEvent<ConfigMap> {
    let mut annotations = std::collections::BTreeMap::new();
    if ends_list {
        annotations.insert("k8s.io/initial-events-end".to_string(), "true".to_string());
    }
    WatchEvent::Bookmark(Bookmark {
        types: TypeMeta::default(),
        metadata: BookmarkMeta {
            resource_version: version.to_string(),
            annotations,
        },
    })
}

fn status(code: u16) -> Status {
    Status::failure("scripted", "Scripted").with_code(code)
}

pub(super) fn failure(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(status(code)))
}

impl WatchApi for ScriptedApi {
    type Object = ConfigMap;

    fn list<'a>(
        &'a self,
        params: &'a ListParams,
    ) -> BoxFuture<'a, kube::Result<ObjectList<ConfigMap>>> {
        let mut request = format!("list limit={}", params.limit.unwrap_or(0));
        if let Some(token) = &params.continue_token {
            request += &format!(" continue={token}");
        }
        let answer = self.answer(request);
        async move {
            match answer {
                Answer::Page(items, version, token) => Ok(ObjectList {
                    types: TypeMeta::default(),
                    metadata: ListMeta {
                        resource_version: Some(version.to_string()),
                        continue_: token.map(str::to_string),
                        ..ListMeta::default()
                    },
                    items: items.iter().map(|(name, v)| object(name, *v)).collect(),
                }),
                Answer::Fail(code) => Err(failure(code)),
                Answer::Silent => std::future::pending().await,
                Answer::Stream(_) => panic!("the script has a stream where a list was asked"),
            }
        }
        .boxed()
    }

    fn watch<'a>(
        &'a self,
        params: &'a WatchParams,
        version: &'a str,
    ) -> BoxFuture<'a, kube::Result<EventStream<ConfigMap>>> {
        let timeout = params.timeout.unwrap_or(0);
        let request = if params.send_initial_events {
            format!("stream-list timeout={timeout}")
        } else {
            format!("watch from={version} timeout={timeout}")
        };
        let answer = self.answer(request);
        async move {
            match answer {
                Answer::Stream(lines) => Ok(stream(lines)),
                Answer::Fail(code) => Err(failure(code)),
                Answer::Silent => std::future::pending().await,
                Answer::Page(..) => panic!("the script has a page where a watch was asked"),
            }
        }
        .boxed()
    }
}

fn stream(lines: &'static [Line]) -> EventStream<ConfigMap> {
    futures::stream::iter(lines)
        .then(|line| async move {
            match *line {
                Line::Added(name, version) => Some(WatchEvent::Added(object(name, version))),
                Line::Modified(name, version) => Some(WatchEvent::Modified(object(name, version))),
                Line::Deleted(name, version) => Some(WatchEvent::Deleted(object(name, version))),
                Line::Bookmark(version) => Some(bookmark(version, false)),
                Line::ListEnd(version) => Some(bookmark(version, true)),
                Line::Status(code) => Some(WatchEvent::Error(Box::new(status(code)))),
                Line::After(seconds) => {
                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                    None
                }
                Line::Hang => std::future::pending().await,
            }
        })
        .filter_map(|event| async move { event.map(Ok) })
        .boxed()
}

/// Counts of what the loop reported.
#[derive(Clone, Default)]
pub(super) struct Counts {
    pub(super) listings: Arc<AtomicU32>,
    pub(super) pages: Arc<AtomicU32>,
    pub(super) stalls: Arc<AtomicU32>,
    pub(super) failures: Arc<AtomicU32>,
    pub(super) losses: Arc<AtomicU32>,
    pub(super) latest_request: Arc<AtomicU64>,
}

impl WatchHooks for Counts {
    fn latest_request(&self) -> u64 {
        self.latest_request.load(Ordering::SeqCst)
    }

    fn listing(&self) {
        self.listings.fetch_add(1, Ordering::SeqCst);
    }

    fn page_read(&self) {
        self.pages.fetch_add(1, Ordering::SeqCst);
    }

    fn stalled(&self) {
        self.stalls.fetch_add(1, Ordering::SeqCst);
    }

    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::SeqCst);
    }

    /// Makes a request, as an app waiting for its cache to catch up does: the stream or list
    /// that answers it shows in the events' `answers`.
    fn lost(&self) {
        self.losses.fetch_add(1, Ordering::SeqCst);
        self.latest_request.fetch_add(1, Ordering::SeqCst);
    }
}

pub(super) fn describe(event: &Event<ConfigMap>) -> String {
    let name = |object: &ConfigMap| {
        format!(
            "{}@{}",
            object.metadata.name.as_deref().unwrap_or_default(),
            object
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default()
        )
    };
    match event {
        Event::Apply(object) => format!("apply {}", name(object)),
        Event::Delete(object) => format!("delete {}", name(object)),
        Event::ListStart => "list start".to_string(),
        Event::Listed(object) => format!("listed {}", name(object)),
        Event::ListDone(position) => {
            format!(
                "list done at {} answers {}",
                position.version, position.answers
            )
        }
        Event::Progress(position) => {
            format!(
                "progress at {} answers {}",
                position.version, position.answers
            )
        }
    }
}
