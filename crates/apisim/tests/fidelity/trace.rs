//! The differential trace: a seeded sequence of requests over every kind the controller touches
//! (creates, reads, paged and selected lists, updates current and stale, no-op updates, the three
//! patch types, `/status`, preconditioned deletes, finalizers, invalid bodies), one watch per kind
//! and version open throughout, a `410 Gone` after a compaction, a watch's bookmark, and a watch
//! from a version the server has not reached. What each
//! request was answered is recorded raw; [`crate::normalise`] makes the two servers' records
//! comparable.
//!
//! The choice of each request depends only on the seed and on earlier answers (the last object
//! seen), so two servers that answer alike are sent the same trace.

mod history;
mod operations;

use std::{collections::BTreeMap, future::Future, pin::Pin, sync::Arc, time::Duration};

use futures::{StreamExt, TryStreamExt};
use http::{Method, Request};
use kube::{Client, core::WatchEvent};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::kinds::{BodyOf, KINDS, Kind};

/// What one step observed.
#[derive(Clone, Debug)]
pub enum Observed {
    /// An object answered.
    Object(Value),
    /// A list answered: its items, and whether it continues.
    List { items: Vec<Value>, more: bool },
    /// An error answered.
    Error { code: u16, reason: String },
    /// A watch's events (type, object or status).
    Events(Vec<(String, Value)>),
    /// A bookmark's version compared with the newest version written before it.
    Bookmark { not_older: bool },
}

/// A compaction of the server's history (etcd's for the testbed).
pub type Compact = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A small seeded generator (splitmix64).
struct Rng(u64);

/// One run of the trace against one server.
struct Run<'a> {
    client: Client,
    namespace: &'a str,
    rng: Rng,
    steps: Vec<(String, Observed)>,
    /// The last object each name was answered with, per kind and version.
    last: BTreeMap<(Kind, String), Value>,
    /// The first version each name was created at (for stale updates).
    first: BTreeMap<(Kind, String), String>,
    /// Names the server generated, per kind, in order.
    generated: BTreeMap<Kind, Vec<String>>,
    /// The newest resourceVersion answered for a write.
    newest: u64,
    /// generateName prefixes handed out.
    generate_count: usize,
}

/// The events of one open watch.
type Collected = Arc<Mutex<Vec<(String, Value)>>>;

/// The content type of a JSON merge patch.
const MERGE_PATCH: &str = "application/merge-patch+json";
/// The content type of a JSON patch.
const JSON_PATCH: &str = "application/json-patch+json";
/// The content type of a strategic merge patch.
const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";

// === impl Rng ===

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Runs `operations` seeded requests against `client` in `namespace` (plus the watches, the
/// compaction and the closing sentinels), and returns every step's raw observation.
pub async fn run(
    client: Client,
    namespace: &str,
    seed: u64,
    operations: usize,
    compact: Compact,
) -> Vec<(String, Observed)> {
    let mut run = Run {
        client,
        namespace,
        rng: Rng(seed),
        steps: Vec::new(),
        last: BTreeMap::new(),
        first: BTreeMap::new(),
        generated: BTreeMap::new(),
        newest: 0,
        generate_count: 0,
    };
    let start = run.list_version(Kind::Lease).await;
    let mut watches = Vec::new();
    for kind in KINDS {
        watches.push((kind, run.open_watch(kind, &start).await));
    }
    for step in 0..operations {
        if step == operations / 2 {
            run.expire(&compact).await;
        }
        run.step(step).await;
    }
    run.bookmark().await;
    run.probe().await;
    run.ahead().await;
    // A sentinel per storage: once its ADDED arrives, every earlier event of that kind has.
    for kind in [
        Kind::Lease,
        Kind::Service,
        Kind::WorkloadBeta,
        Kind::Slice,
        Kind::CoreEvent,
        Kind::Event,
    ] {
        let body = kind.body(&BodyOf {
            name: Some("zz-sentinel"),
            generate_name: None,
            variant: 0,
            namespace,
            owner_uid: None,
            finalizer: false,
        });
        let answer = run
            .send(Method::POST, &run.collection(kind), None, Some(&body))
            .await;
        run.record(
            format!("sentinel {}", kind.label()),
            kind,
            "zz-sentinel",
            answer,
        );
    }
    for (kind, events) in watches {
        let sentinel_seen = || {
            events.lock().iter().any(|(kind, object)| {
                kind == "ADDED" && object.pointer("/metadata/name") == Some(&json!("zz-sentinel"))
            })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !sentinel_seen() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let events = events.lock().clone();
        run.steps
            .push((format!("watch {}", kind.label()), Observed::Events(events)));
    }
    run.steps
}

// === impl Run ===

impl Run<'_> {
    fn collection(&self, kind: Kind) -> String {
        let resource = kind.resource();
        let base = if resource.group.is_empty() {
            format!("/api/{}", resource.version)
        } else {
            format!("/apis/{}/{}", resource.group, resource.version)
        };
        format!("{base}/namespaces/{}/{}", self.namespace, resource.plural)
    }

    fn object(&self, kind: Kind, name: &str) -> String {
        format!("{}/{name}", self.collection(kind))
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Value, (u16, String)> {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(content_type) = content_type.or(body.map(|_| "application/json")) {
            request = request.header(http::header::CONTENT_TYPE, content_type);
        }
        let body = body
            .map(|body| body.to_string().into_bytes())
            .unwrap_or_default();
        let request = request.body(body).expect("a request");
        match self.client.request::<Value>(request).await {
            Ok(value) => Ok(value),
            Err(kube::Error::Api(status)) => {
                if std::env::var_os("FIDELITY_VERBOSE").is_some() {
                    eprintln!("{path}: {} {}", status.code, status.message);
                }
                Err((status.code, status.reason.clone()))
            }
            Err(error) => Err((0, format!("transport: {error}"))),
        }
    }

    /// Records an answer about `name`, remembering the object for later steps.
    fn record(
        &mut self,
        label: String,
        kind: Kind,
        name: &str,
        answer: Result<Value, (u16, String)>,
    ) {
        let observed = match answer {
            Ok(object) => {
                if let Some(version) = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .and_then(|version| version.parse::<u64>().ok())
                {
                    self.newest = self.newest.max(version);
                }
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or(name)
                    .to_string();
                self.last.insert((kind, name), object.clone());
                Observed::Object(object)
            }
            Err((code, reason)) => Observed::Error { code, reason },
        };
        self.steps.push((label, observed));
    }

    /// Sends `method` with `body`, if any (as JSON), to the object `name` of `kind`, and records
    /// the answer as `label`.
    async fn send_to_object(
        &mut self,
        label: String,
        method: Method,
        kind: Kind,
        name: &str,
        body: Option<&Value>,
    ) {
        let answer = self
            .send(method, &self.object(kind, name), None, body)
            .await;
        self.record(label, kind, name, answer);
    }

    /// Sends `patch` as `content_type` to the object `name` of `kind`, and records the answer
    /// as `label`.
    async fn patch_object(
        &mut self,
        label: String,
        kind: Kind,
        name: &str,
        content_type: &str,
        patch: &Value,
    ) {
        let path = self.object(kind, name);
        let answer = self
            .send(Method::PATCH, &path, Some(content_type), Some(patch))
            .await;
        self.record(label, kind, name, answer);
    }

    async fn list_version(&self, kind: Kind) -> String {
        let list = self
            .send(Method::GET, &self.collection(kind), None, None)
            .await
            .expect("a list");
        list.pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }

    /// A watch of `kind`'s collection, with `query` after `watch=true&`.
    fn watch_request(&self, kind: Kind, query: &str) -> Request<Vec<u8>> {
        let path = format!("{}?watch=true&{query}", self.collection(kind));
        Request::builder()
            .uri(path)
            .body(Vec::new())
            .expect("a request")
    }

    async fn open_watch(&self, kind: Kind, version: &str) -> Collected {
        let query = format!("resourceVersion={version}&timeoutSeconds=600");
        let request = self.watch_request(kind, &query);
        let stream = self
            .client
            .request_events::<Value>(request)
            .await
            .expect("a watch");
        let collected: Collected = Arc::default();
        let into = collected.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(event)) = stream.try_next().await {
                let entry = match event {
                    WatchEvent::Added(object) => ("ADDED".to_string(), object),
                    WatchEvent::Modified(object) => ("MODIFIED".to_string(), object),
                    WatchEvent::Deleted(object) => ("DELETED".to_string(), object),
                    WatchEvent::Bookmark(_) => continue,
                    WatchEvent::Error(status) => (
                        "ERROR".to_string(),
                        json!({"code": status.code, "reason": status.reason}),
                    ),
                };
                into.lock().push(entry);
            }
        });
        collected
    }
}
