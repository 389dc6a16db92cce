//! The differential trace: a seeded sequence of requests over every kind the controller touches
//! (creates, reads, paged and selected lists, updates current and stale, no-op updates, the three
//! patch types, `/status`, preconditioned deletes, finalizers, invalid bodies), one watch per kind
//! and version open throughout, a `410 Gone` after a compaction, and a watch's bookmark. What each
//! request was answered is recorded raw; [`crate::normalise`] makes the two servers' records
//! comparable.
//!
//! The choice of each request depends only on the seed and on earlier answers (the last object
//! seen), so two servers that answer alike are sent the same trace.

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

    /// A name of `kind` for this step: one of the fixed names, or one the server generated.
    fn name(&mut self, kind: Kind) -> String {
        let generated = self.generated.get(&kind).cloned().unwrap_or_default();
        if !generated.is_empty() && self.rng.below(4) == 0 {
            let index = self.rng.below(generated.len() as u64) as usize;
            return generated[index].clone();
        }
        kind.name(self.rng.below(4))
    }

    fn body(&mut self, kind: Kind, name: Option<&str>, generate: bool) -> Value {
        let variant = self.rng.next() % 1000;
        let owner = format!("svc-{}", variant % 2);
        let owner_uid = self
            .last
            .get(&(Kind::Service, owner))
            .and_then(|service| service.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let finalizer = self.rng.below(5) == 0;
        // Each generated name has its own prefix, in order, so a list orders them alike on both
        // servers whatever random suffix each server picks.
        let prefix = format!("gen-{:03}-", self.generate_count);
        self.generate_count += usize::from(generate);
        kind.body(&BodyOf {
            name,
            generate_name: generate.then_some(prefix.as_str()),
            variant,
            namespace: self.namespace,
            owner_uid: owner_uid.as_deref(),
            finalizer,
        })
    }

    async fn step(&mut self, step: usize) {
        let kind = self.rng.pick(&KINDS);
        let roll = self.rng.below(100);
        let name = self.name(kind);
        // A generated name is shown without the suffix each server picked.
        let shown = if name.starts_with("gen-") && name.len() == "gen-000-".len() + 5 {
            &name[..name.len() - 5]
        } else {
            name.as_str()
        };
        let label = |what: &str| format!("{step} {what} {} {shown}", kind.label());
        match roll {
            0..=19 => {
                let body = self.body(kind, Some(&name), false);
                let answer = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
                if let Ok(created) = &answer
                    && let Some(version) = created
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                {
                    self.first.insert((kind, name.clone()), version.to_string());
                }
                self.record(label("create"), kind, &name, answer);
            }
            20..=24 => {
                let body = self.body(kind, None, true);
                let answer = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
                if let Ok(created) = &answer
                    && let Some(generated) =
                        created.pointer("/metadata/name").and_then(Value::as_str)
                {
                    self.generated
                        .entry(kind)
                        .or_default()
                        .push(generated.to_string());
                }
                self.record(label("create generated"), kind, &name, answer);
            }
            25..=26 => {
                let body = kind.invalid_body(&name);
                let answer = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
                self.record(label("create invalid"), kind, &name, answer);
            }
            27..=39 => {
                self.send_to_object(label("get"), Method::GET, kind, &name, None)
                    .await;
            }
            40..=47 => self.list(kind, step).await,
            48..=57 => {
                if kind.is_event() {
                    // An Event's version may move with no change served (crate docs), so it is
                    // read again before it is updated.
                    self.get_instead(kind, &name, step).await;
                }
                let Some(mut object) = self.last.get(&(kind, name.clone())).cloned() else {
                    return self.get_instead(kind, &name, step).await;
                };
                let variant = self.rng.next();
                let what = match self.rng.below(4) {
                    0 => "update unchanged",
                    1 => {
                        object["metadata"]["labels"]["touched"] =
                            Value::from(format!("t{}", variant % 5));
                        "update labels"
                    }
                    _ => {
                        kind.change(&mut object, variant);
                        "update"
                    }
                };
                self.send_to_object(label(what), Method::PUT, kind, &name, Some(&object))
                    .await;
            }
            58..=60 => {
                let Some(mut object) = self.last.get(&(kind, name.clone())).cloned() else {
                    return self.get_instead(kind, &name, step).await;
                };
                let first = self
                    .first
                    .get(&(kind, name.clone()))
                    .filter(|_| !kind.is_event())
                    .cloned()
                    .unwrap_or_else(|| "1".into());
                object["metadata"]["resourceVersion"] = Value::from(first);
                kind.change(&mut object, self.rng.next());
                let what = label("update from the first version");
                self.send_to_object(what, Method::PUT, kind, &name, Some(&object))
                    .await;
            }
            61..=68 => {
                let variant = self.rng.next();
                let mut change =
                    json!({"metadata": {"labels": {"patched": format!("p{}", variant % 4)}}});
                if self.rng.below(2) == 0 {
                    let mut object = self
                        .last
                        .get(&(kind, name.clone()))
                        .cloned()
                        .unwrap_or_else(|| json!({}));
                    kind.change(&mut object, variant);
                    if let Some(map) = object.as_object_mut() {
                        for (field, value) in map.iter() {
                            if !matches!(
                                field.as_str(),
                                "metadata" | "apiVersion" | "kind" | "status"
                            ) {
                                change[field] = value.clone();
                            }
                        }
                    }
                }
                self.patch_object(label("merge patch"), kind, &name, MERGE_PATCH, &change)
                    .await;
            }
            69..=73 => {
                let variant = self.rng.next();
                let patch = match self.rng.below(4) {
                    0 => json!([{"op": "test", "path": "/metadata/labels/app", "value": "other"}]),
                    1 => json!([{"op": "remove", "path": "/metadata/labels/variant"}]),
                    _ => json!([
                        {"op": "test", "path": "/metadata/labels/app", "value": "trace"},
                        {"op": "add", "path": "/metadata/labels/json", "value": format!("j{}", variant % 3)},
                    ]),
                };
                self.patch_object(label("json patch"), kind, &name, JSON_PATCH, &patch)
                    .await;
            }
            74..=76 => {
                let patch = json!({"metadata": {"annotations": {"strategic": format!("s{}", self.rng.below(3))}}});
                let what = label("strategic merge patch");
                self.patch_object(what, kind, &name, STRATEGIC_MERGE_PATCH, &patch)
                    .await;
            }
            77..=82 if kind.has_status() => {
                let status = kind.status(self.rng.next());
                let path = format!("{}/status", self.object(kind, &name));
                if self.rng.below(2) == 0 {
                    let Some(mut object) = self.last.get(&(kind, name.clone())).cloned() else {
                        return self.get_instead(kind, &name, step).await;
                    };
                    object["status"] = status;
                    // A spec change sent to /status is not applied.
                    kind.change(&mut object, self.rng.next());
                    let answer = self.send(Method::PUT, &path, None, Some(&object)).await;
                    self.record(label("update status"), kind, &name, answer);
                } else {
                    let patch =
                        json!({"status": status, "metadata": {"labels": {"ignored": "yes"}}});
                    let answer = self
                        .send(Method::PATCH, &path, Some(MERGE_PATCH), Some(&patch))
                        .await;
                    self.record(label("merge patch status"), kind, &name, answer);
                }
            }
            77..=82 => {
                let answer = self
                    .send(
                        Method::GET,
                        &format!("{}/status", self.object(kind, &name)),
                        None,
                        None,
                    )
                    .await;
                self.record(label("get status of a kind without"), kind, &name, answer);
            }
            83..=92 => {
                let last = self.last.get(&(kind, name.clone())).cloned();
                let (what, options) = match self.rng.below(4) {
                    0 => (
                        "delete, wrong uid",
                        json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
                    ),
                    1 => (
                        "delete, last version seen",
                        json!({"preconditions": {"resourceVersion": last.as_ref().and_then(|o| o.pointer("/metadata/resourceVersion")).cloned()}}),
                    ),
                    _ => ("delete", json!({})),
                };
                self.send_to_object(label(what), Method::DELETE, kind, &name, Some(&options))
                    .await;
            }
            _ => {
                let patch = json!({"metadata": {"finalizers": null}});
                let what = label("remove finalizers");
                self.patch_object(what, kind, &name, MERGE_PATCH, &patch)
                    .await;
            }
        }
    }

    async fn get_instead(&mut self, kind: Kind, name: &str, step: usize) {
        let label = format!("{step} get first {}", kind.label());
        self.send_to_object(label, Method::GET, kind, name, None)
            .await;
    }

    async fn list(&mut self, kind: Kind, step: usize) {
        let selector = match self.rng.below(4) {
            0 => "",
            1 => "app=trace",
            2 => "variant in (v0,v1)",
            _ => "!patched",
        };
        let limit = self.rng.pick(&[0, 1, 2, 5]);
        // Events are listed whole: the real server writes Events of its own into the namespace
        // (its cluster IP repair), which the comparison leaves out, and a page boundary would
        // move with them.
        let limit = if kind.is_event() { 0 } else { limit };
        let mut token = String::new();
        for page in 0.. {
            let mut query = format!("labelSelector={}", urlencode(selector));
            if limit > 0 {
                query.push_str(&format!("&limit={limit}"));
            }
            if !token.is_empty() {
                query.push_str(&format!("&continue={token}"));
            }
            let answer = self
                .send(
                    Method::GET,
                    &format!("{}?{query}", self.collection(kind)),
                    None,
                    None,
                )
                .await;
            let label = format!(
                "{step} list {} selector={selector:?} limit={limit} page={page}",
                kind.label()
            );
            match answer {
                Ok(list) => {
                    token = list
                        .pointer("/metadata/continue")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let items = list["items"].as_array().cloned().unwrap_or_default();
                    self.steps.push((
                        label,
                        Observed::List {
                            items,
                            more: !token.is_empty(),
                        },
                    ));
                    if token.is_empty() {
                        return;
                    }
                }
                Err((code, reason)) => {
                    self.steps.push((label, Observed::Error { code, reason }));
                    return;
                }
            }
        }
    }

    /// A paged list begun, the history compacted, the list continued (410); then a watch
    /// from a version before the compaction (410 as its first event).
    async fn expire(&mut self, compact: &Compact) {
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

    /// A watch that asked for bookmarks, with a short timeout (6 s): the bookmark before the timeout
    /// carries a version no older than the newest written. Bookmarks are best effort in
    /// kube-apiserver (a stream may end at its timeout without one: CI at 2f017da), so a stream
    /// that ends without one is opened again, up to three times.
    async fn bookmark(&mut self) {
        let mut observed = Observed::Events(Vec::new());
        for _ in 0..3 {
            observed = self.bookmark_once().await;
            if matches!(observed, Observed::Bookmark { .. }) {
                break;
            }
        }
        self.steps
            .push(("bookmark before the timeout".into(), observed));
    }

    /// One watch of [`Self::bookmark`]: its bookmark, or the (no) events it ended with.
    async fn bookmark_once(&mut self) -> Observed {
        let newest = self.newest;
        let query = format!("allowWatchBookmarks=true&resourceVersion={newest}&timeoutSeconds=6");
        let request = self.watch_request(Kind::Lease, &query);
        let stream = self
            .client
            .request_events::<Value>(request)
            .await
            .expect("a watch");
        let mut stream = std::pin::pin!(stream);
        let mut observed = Observed::Events(Vec::new());
        while let Ok(Some(event)) = stream.try_next().await {
            if let WatchEvent::Bookmark(bookmark) = event {
                let version = bookmark
                    .metadata
                    .resource_version
                    .parse::<u64>()
                    .unwrap_or(0);
                observed = Observed::Bookmark {
                    not_older: version >= newest,
                };
                break;
            }
        }
        observed
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
