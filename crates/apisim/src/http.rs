//! Requests in, answers out: the tower service, the routing of a request to a verb, and the
//! verbs themselves over the [`Store`](crate::store::Store).

use std::{collections::BTreeMap, sync::Arc, task::Poll, time::Duration};

use bytes::Bytes;
use futures::{StreamExt, future::BoxFuture};
use http::{Method, Request, Response, StatusCode, request::Parts};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};

use crate::{
    Applied, Inner, LogEntry, Verb, WriteRequest,
    kinds::{Resource, Target},
    selector::{FieldSelector, LabelSelector},
    store::{Change, Key, Watcher, event_for, line, selects},
};

/// Errors of the service (only a request body that cannot be read).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every answer.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The server as a tower service, attributing requests to one caller.
#[derive(Clone)]
pub struct ApiService {
    inner: Arc<Inner>,
    caller: Arc<str>,
}

/// A failed request, answered as a `Status`.
struct Failure {
    code: u16,
    reason: &'static str,
    message: String,
}

type Answer = Result<Response<Body>, Failure>;

/// The server's default watch timeout when the request gives none.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// The date the simulated clock starts at (2026-01-01T00:00:00Z).
const EPOCH_SECONDS: i64 = 1_767_225_600;

// === impl ApiService ===

impl ApiService {
    pub(crate) fn new(inner: Arc<Inner>, caller: &str) -> Self {
        Self {
            inner,
            caller: Arc::from(caller),
        }
    }
}

impl tower::Service<Request<kube::client::Body>> for ApiService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let inner = self.inner.clone();
        let caller = self.caller.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect_bytes().await?;
            let answer = handle(&inner, &caller, &parts, &body);
            let response = answer.unwrap_or_else(|failure| status(&failure));
            let mut log = inner.log.lock();
            let entry = LogEntry {
                seq: log.len() as u64,
                at_ms: elapsed(&inner).as_millis() as u64,
                caller: caller.to_string(),
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                status: response.status().as_u16(),
                revision: inner.store.lock().revision,
            };
            log.push(entry);
            Ok(response)
        })
    }
}

fn elapsed(inner: &Inner) -> Duration {
    Instant::now() - inner.started
}

/// The simulated wall-clock time, RFC 3339 to the second.
fn timestamp(inner: &Inner) -> String {
    let seconds = EPOCH_SECONDS + elapsed(inner).as_secs() as i64;
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|time| time.to_string())
        .unwrap_or_default()
}

fn handle(inner: &Arc<Inner>, caller: &str, parts: &Parts, body: &[u8]) -> Answer {
    let path = parts.uri.path();
    if path == "/version" {
        return Ok(json_response(
            StatusCode::OK,
            &json!({"major": "1", "minor": "37", "gitVersion": "v1.37.2-apisim"}),
        ));
    }
    let target = Target::parse(path).ok_or_else(|| Failure {
        code: 404,
        reason: "NotFound",
        message: "the server could not find the requested resource".to_string(),
    })?;
    let query = query(parts.uri.query().unwrap_or_default());
    let request = Call {
        inner,
        caller,
        parts,
        target,
        query,
    };
    match (&parts.method, request.target.name.is_some()) {
        (&Method::GET, true) => request.get(),
        (&Method::GET, false) if request.flag("watch") => request.watch(),
        (&Method::GET, false) => request.list(),
        (&Method::POST, false) => request.create(parse(body)?),
        (&Method::PUT, true) => request.update(parse(body)?),
        (&Method::PATCH, true) => request.patch(body),
        (&Method::DELETE, true) => request.delete(body),
        (method, _) => Err(Failure {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!(
                "the server does not allow this method on the requested resource ({method} on {path})"
            ),
        }),
    }
}

/// One request being served.
struct Call<'a> {
    inner: &'a Arc<Inner>,
    caller: &'a str,
    parts: &'a Parts,
    target: Target,
    query: BTreeMap<String, String>,
}

impl Call<'_> {
    fn resource(&self) -> Resource {
        self.target.resource
    }

    fn flag(&self, name: &str) -> bool {
        self.query
            .get(name)
            .is_some_and(|value| value == "true" || value == "1")
    }

    fn key(&self, name: &str) -> Key {
        let (group, plural) = self.resource().storage();
        (
            group,
            plural,
            self.target.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }

    fn qualified(&self) -> String {
        let resource = self.resource();
        if resource.group.is_empty() {
            resource.plural.to_string()
        } else {
            format!("{}.{}", resource.plural, resource.group)
        }
    }

    fn not_found(&self, name: &str) -> Failure {
        Failure {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", self.qualified()),
        }
    }

    fn conflict(&self, name: &str, why: &str) -> Failure {
        Failure {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                self.qualified()
            ),
        }
    }

    fn selectors(&self) -> Result<(LabelSelector, FieldSelector), Failure> {
        let bad = |message: String| Failure {
            code: 400,
            reason: "BadRequest",
            message,
        };
        let labels =
            LabelSelector::parse(self.query.get("labelSelector").map_or("", String::as_str))
                .map_err(bad)?;
        let fields =
            FieldSelector::parse(self.query.get("fieldSelector").map_or("", String::as_str))
                .map_err(|message| Failure {
                    code: 400,
                    reason: "BadRequest",
                    message,
                })?;
        Ok((labels, fields))
    }

    fn get(&self) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        let store = self.inner.store.lock();
        let object = store
            .objects
            .get(&self.key(&name))
            .cloned()
            .ok_or_else(|| self.not_found(&name))?;
        let object = self.shape(object);
        Ok(json_response(StatusCode::OK, &object))
    }

    /// An object as this request sees it: its version, and only `status` for `/status`.
    fn shape(&self, object: Value) -> Value {
        self.resource().served(object)
    }

    fn list(&self) -> Answer {
        let (labels, fields) = self.selectors()?;
        let store = self.inner.store.lock();
        let storage = self.resource().storage();
        let (revision, after) = match self.query.get("continue").filter(|token| !token.is_empty()) {
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
                (revision, Some(after))
            }
            None => match (
                self.query.get("resourceVersionMatch").map(String::as_str),
                self.query.get("resourceVersion"),
            ) {
                (Some("Exact"), Some(version)) => (
                    version
                        .parse::<u64>()
                        .map_err(|_| invalid_version(version))?,
                    None,
                ),
                _ => (store.revision, None),
            },
        };
        let objects = store.at(storage, revision).ok_or_else(|| Failure {
            code: 410,
            reason: "Expired",
            message: format!("too old resource version: {revision} ({})", store.compacted),
        })?;
        let watcher = Watcher {
            resource: self.resource(),
            namespace: self.target.namespace.clone(),
            labels,
            fields,
            sender: mpsc::unbounded_channel().0,
        };
        let limit = self
            .query
            .get("limit")
            .and_then(|limit| limit.parse::<usize>().ok())
            .filter(|limit| *limit > 0);
        let mut selected = objects
            .into_iter()
            .filter(|(key, object)| selects(&watcher, key, object))
            .filter(|(key, _)| after.as_ref().is_none_or(|after| cursor(key) > *after));
        let mut items = Vec::new();
        let mut last = None;
        let mut more = false;
        for (key, object) in selected.by_ref() {
            if limit.is_some_and(|limit| items.len() >= limit) {
                // One more than the page holds: the list continues.
                more = true;
                break;
            }
            last = Some(cursor(&key));
            items.push(object);
        }
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
                } else {
                    resource.served(object)
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

    fn watch(&self) -> Answer {
        let (labels, fields) = self.selectors()?;
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
        let (sender, receiver) = mpsc::unbounded_channel();
        let watcher = Watcher {
            resource: self.resource(),
            namespace: self.target.namespace.clone(),
            labels,
            fields,
            sender,
        };
        let mut store = self.inner.store.lock();
        let storage = self.resource().storage();
        let mut first = Vec::new();
        let replay_state = initial_events || version.is_empty() || version == "0";
        if replay_state {
            for (key, object) in store
                .objects
                .iter()
                .filter(|(key, _)| (key.0, key.1) == storage)
            {
                if selects(&watcher, key, object) {
                    first.push(line("ADDED", self.resource().served(object.clone())));
                }
            }
            if initial_events {
                first.push(bookmark(self.resource(), store.revision, true));
            }
        } else {
            let from = version
                .parse::<u64>()
                .map_err(|_| invalid_version(&version))?;
            match store.since(storage, from) {
                Some(changes) => first.extend(
                    changes
                        .iter()
                        .filter_map(|change: &Change| event_for(&watcher, change)),
                ),
                None => {
                    let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("too old resource version: {from} ({})", store.compacted), "reason": "Expired", "code": 410});
                    let body =
                        stream_body(futures::stream::iter(vec![line("ERROR", gone)]).boxed());
                    return Ok(watch_response(body));
                }
            }
        }
        store.watch(watcher);
        drop(store);
        let stream = WatchStream {
            inner: self.inner.clone(),
            receiver,
            resource: self.resource(),
            deadline: Instant::now() + timeout,
            next_bookmark: bookmarks.then(|| Instant::now() + self.inner.config.bookmark_interval),
            closing_bookmark: bookmarks,
        };
        let body = futures::stream::iter(first).chain(stream.run()).boxed();
        Ok(watch_response(stream_body(body)))
    }

    fn create(&self, mut object: Value) -> Answer {
        let resource = self.resource();
        object = resource.stored(object);
        let namespace = self.target.namespace.clone();
        if let Some(sent) = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            && namespace.as_deref() != Some(sent)
            && resource.namespaced
        {
            return Err(Failure { code: 400, reason: "BadRequest", message: "the namespace of the provided object does not match the namespace sent on the request".to_string() });
        }
        if object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|version| !version.is_empty())
        {
            return Err(Failure {
                code: 400,
                reason: "BadRequest",
                message: "resourceVersion should not be set on objects to be created".to_string(),
            });
        }
        let mut store = self.inner.store.lock();
        let name = match object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
        {
            Some(name) => name.to_string(),
            None => match object
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .filter(|prefix| !prefix.is_empty())
            {
                Some(prefix) => format!("{prefix}{}", store.name_suffix()),
                None => {
                    return Err(invalid(
                        resource,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        let key = self.key(&name);
        if store.objects.contains_key(&key) {
            return Err(Failure {
                code: 409,
                reason: "AlreadyExists",
                message: format!("{} \"{name}\" already exists", self.qualified()),
            });
        }
        if resource.status
            && resource.plural != "namespaces"
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
        let metadata = object
            .as_object_mut()
            .map(|map| map.entry("metadata").or_insert_with(|| json!({})));
        if let Some(metadata) = metadata {
            metadata["name"] = Value::from(name.clone());
            if let Some(namespace) = &namespace {
                metadata["namespace"] = Value::from(namespace.clone());
            }
            metadata["uid"] = Value::from(store.next_uid());
            metadata["creationTimestamp"] = Value::from(timestamp(self.inner));
            if resource.generation {
                metadata["generation"] = Value::from(1);
            }
        }
        validate(resource, &name, &object)?;
        drop(store);
        self.apply(Verb::Create, key, Some(object), StatusCode::CREATED)
    }

    fn update(&self, sent: Value) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        if let Some(body_name) = sent.pointer("/metadata/name").and_then(Value::as_str)
            && body_name != name
        {
            return Err(Failure {
                code: 400,
                reason: "BadRequest",
                message: "the name of the object does not match the name on the URL".to_string(),
            });
        }
        let sent = self.resource().stored(sent);
        self.replace(&name, sent)
    }

    fn patch(&self, body: &[u8]) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        let content_type = self
            .parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if !matches!(
            content_type,
            "application/merge-patch+json" | "application/strategic-merge-patch+json"
        ) {
            return Err(Failure {
                code: 415,
                reason: "UnsupportedMediaType",
                message: format!(
                    "the body of the request was in an unknown format ({content_type}); only merge patches are served here"
                ),
            });
        }
        let patch = parse(body)?;
        let current = {
            let store = self.inner.store.lock();
            store
                .objects
                .get(&self.key(&name))
                .cloned()
                .ok_or_else(|| self.not_found(&name))?
        };
        let mut served = self.resource().served(current);
        merge(&mut served, &patch);
        self.replace(&name, self.resource().stored(served))
    }

    /// An update of `name` to `sent` (stored form), guarded by the sent resourceVersion and uid.
    fn replace(&self, name: &str, mut sent: Value) -> Answer {
        let resource = self.resource();
        let key = self.key(name);
        let store = self.inner.store.lock();
        let current = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(name))?;
        let current_version = current
            .pointer("/metadata/resourceVersion")
            .cloned()
            .unwrap_or_default();
        if let Some(version) = sent
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|version| !version.is_empty())
            && Some(version) != current_version.as_str()
        {
            return Err(self.conflict(name, "the object has been modified; please apply your changes to the latest version and try again"));
        }
        let current_uid = current
            .pointer("/metadata/uid")
            .cloned()
            .unwrap_or_default();
        if let Some(uid) = sent
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .filter(|uid| !uid.is_empty())
            && Some(uid) != current_uid.as_str()
        {
            return Err(self.conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current_uid.as_str().unwrap_or_default()
                ),
            ));
        }
        drop(store);
        if self.target.status {
            // Only the status changes through /status.
            let status = sent.get("status").cloned();
            sent = current.clone();
            match status {
                Some(status) => sent["status"] = status,
                None => {
                    if let Some(map) = sent.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
        } else if resource.status {
            // The main resource keeps its status.
            match current.get("status") {
                Some(status) => sent["status"] = status.clone(),
                None => {
                    if let Some(map) = sent.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
        }
        for field in [
            "uid",
            "creationTimestamp",
            "name",
            "namespace",
            "generation",
        ] {
            match current["metadata"].get(field) {
                Some(value) => sent["metadata"][field] = value.clone(),
                None => {
                    if let Some(metadata) = sent.get_mut("metadata").and_then(Value::as_object_mut)
                    {
                        metadata.remove(field);
                    }
                }
            }
        }
        if resource.generation && changed_beyond_metadata(resource, &current, &sent) {
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            sent["metadata"]["generation"] = Value::from(generation + 1);
        }
        validate(resource, name, &sent)?;
        let verb = if self.parts.method == Method::PATCH {
            Verb::Patch
        } else {
            Verb::Update
        };
        self.apply(verb, key, Some(sent), StatusCode::OK)
    }

    fn delete(&self, body: &[u8]) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        let key = self.key(&name);
        let options = if body.is_empty() {
            json!({})
        } else {
            parse(body)?
        };
        let store = self.inner.store.lock();
        let current = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(&name))?;
        drop(store);
        for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let wanted = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str);
            let actual = current["metadata"][field].as_str().unwrap_or_default();
            if let Some(wanted) = wanted
                && wanted != actual
            {
                return Err(self.conflict(&name, &format!("Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}")));
            }
        }
        self.apply(Verb::Delete, key, None, StatusCode::OK)
            .map(|response| {
                if response.status().is_success() {
                    json_response(StatusCode::OK, &self.resource().served(current))
                } else {
                    response
                }
            })
    }

    /// Admission, the write, then the observers; the answer is the stored object.
    fn apply(&self, verb: Verb, key: Key, object: Option<Value>, code: StatusCode) -> Answer {
        let resource = self.resource();
        let request = WriteRequest {
            caller: self.caller.to_string(),
            verb,
            group: resource.group.to_string(),
            plural: resource.plural.to_string(),
            namespace: self.target.namespace.clone(),
            name: key.3.clone(),
            object: object.clone(),
        };
        let admission = self.inner.admission.lock().clone();
        if let Some(admission) = admission
            && let Err(refused) = admission(&request)
        {
            return Ok(json_response(
                StatusCode::from_u16(refused.code).unwrap_or(StatusCode::FORBIDDEN),
                &serde_json::to_value(&refused).unwrap_or_default(),
            ));
        }
        let (revision, old, new) = self.inner.store.lock().commit(key.clone(), object);
        let applied = Applied {
            revision,
            caller: self.caller.to_string(),
            verb,
            group: resource.group.to_string(),
            plural: resource.plural.to_string(),
            namespace: self.target.namespace.clone(),
            name: key.3,
            old,
            new: new.clone(),
        };
        let observers = self.inner.observers.lock().clone();
        for observer in observers {
            observer(&applied);
        }
        Ok(json_response(
            code,
            &new.map(|new| resource.served(new)).unwrap_or_default(),
        ))
    }
}

/// An open watch's stream after its first events: the changes it selects as they are
/// committed, a bookmark every bookmark interval and two seconds before the timeout (when it
/// asked for bookmarks), and its end at the timeout.
struct WatchStream {
    inner: Arc<Inner>,
    receiver: mpsc::UnboundedReceiver<Bytes>,
    resource: Resource,
    deadline: Instant,
    /// The next periodic bookmark, when bookmarks were asked for.
    next_bookmark: Option<Instant>,
    /// Whether the bookmark before the timeout is still to come.
    closing_bookmark: bool,
}

impl WatchStream {
    fn bookmark_at(&self) -> Option<Instant> {
        let periodic = self.next_bookmark?;
        let closing = self
            .closing_bookmark
            .then(|| self.deadline.checked_sub(Duration::from_secs(2)))
            .flatten();
        Some(closing.map_or(periodic, |closing| closing.min(periodic)))
    }

    fn run(self) -> futures::stream::BoxStream<'static, Bytes> {
        futures::stream::unfold(self, |mut stream| async move {
            let bookmark_at = stream.bookmark_at();
            tokio::select! {
                biased;
                line = stream.receiver.recv() => line.map(|line| (line, stream)),
                () = tokio::time::sleep_until(stream.deadline) => None,
                () = tokio::time::sleep_until(bookmark_at.unwrap_or(stream.deadline)), if bookmark_at.is_some() => {
                    let now = Instant::now();
                    if stream.closing_bookmark && now + Duration::from_secs(2) >= stream.deadline {
                        stream.closing_bookmark = false;
                    }
                    if let Some(next) = stream.next_bookmark.filter(|next| *next <= now) {
                        stream.next_bookmark = Some(next + stream.inner.config.bookmark_interval);
                    }
                    let revision = stream.inner.store.lock().revision;
                    Some((bookmark(stream.resource, revision, false), stream))
                }
            }
        })
        .boxed()
    }
}

fn bookmark(resource: Resource, revision: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata}),
    )
}

/// The key's position for continue tokens: namespace and name.
fn cursor(key: &Key) -> String {
    format!("{}/{}", key.2, key.3)
}

fn changed_beyond_metadata(resource: Resource, old: &Value, new: &Value) -> bool {
    let strip = |object: &Value| {
        let mut object = object.clone();
        if let Some(map) = object.as_object_mut() {
            map.remove("metadata");
            map.remove("status");
            map.remove("apiVersion");
            map.remove("kind");
        }
        object
    };
    // Slices count their labels too (the API server's rule for EndpointSlices).
    let labels_changed = resource.plural == "endpointslices"
        && old.pointer("/metadata/labels") != new.pointer("/metadata/labels");
    strip(old) != strip(new) || labels_changed
}

fn validate(resource: Resource, name: &str, object: &Value) -> Result<(), Failure> {
    let valid_name = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_name {
        return Err(invalid(
            resource,
            name,
            &format!(
                "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
            ),
        ));
    }
    match resource.plural {
        "endpointslices" => {
            let family = object.get("addressType").and_then(Value::as_str);
            let Some(family) = family.filter(|family| matches!(*family, "IPv4" | "IPv6" | "FQDN"))
            else {
                return Err(invalid(resource, name, "addressType: Required value"));
            };
            for endpoint in object
                .get("endpoints")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let addresses = endpoint
                    .get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if addresses.is_empty() {
                    return Err(invalid(
                        resource,
                        name,
                        "endpoints[].addresses: Required value: must contain at least 1 address",
                    ));
                }
                for address in addresses {
                    let text = address.as_str().unwrap_or_default();
                    let ok = match family {
                        "IPv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
                        "IPv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
                        _ => true,
                    };
                    if !ok {
                        return Err(invalid(
                            resource,
                            name,
                            &format!(
                                "endpoints[].addresses: Invalid value: \"{text}\": must be a valid {family} address"
                            ),
                        ));
                    }
                }
            }
        }
        "externalworkloads" => {
            let tls = object.pointer("/spec/meshTLS");
            let present = |field: &str| {
                tls.and_then(|tls| tls.get(field))
                    .and_then(Value::as_str)
                    .is_some_and(|value| !value.is_empty())
            };
            if !present("identity") || !present("serverName") {
                return Err(invalid(resource, name, "spec.meshTLS: Required value"));
            }
            for ip in object
                .pointer("/spec/workloadIPs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let text = ip.get("ip").and_then(Value::as_str).unwrap_or_default();
                if text.parse::<std::net::IpAddr>().is_err() {
                    return Err(invalid(
                        resource,
                        name,
                        &format!("spec.workloadIPs[].ip: Invalid value: \"{text}\""),
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn invalid(resource: Resource, name: &str, detail: &str) -> Failure {
    Failure {
        code: 422,
        reason: "Invalid",
        message: format!("{} \"{name}\" is invalid: {detail}", resource.kind),
    }
}

fn invalid_version(version: &str) -> Failure {
    Failure {
        code: 400,
        reason: "BadRequest",
        message: format!("invalid resource version \"{version}\""),
    }
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(target), Some(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (None, Some(_)) => {
            *target = Value::Object(serde_json::Map::new());
            merge(target, patch);
        }
        _ => *target = patch.clone(),
    }
}

fn parse(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body).map_err(|error| Failure {
        code: 400,
        reason: "BadRequest",
        message: format!("the body of the request could not be decoded: {error}"),
    })
}

/// Query parameters, percent-decoded.
fn query(text: &str) -> BTreeMap<String, String> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3])
                    .ok()
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        index += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(value.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn watch_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn stream_body(stream: futures::stream::BoxStream<'static, Bytes>) -> Body {
    StreamBody::new(stream.map(|bytes| Ok::<_, BoxError>(http_body::Frame::data(bytes))))
        .boxed_unsync()
}

fn status(failure: &Failure) -> Response<Body> {
    let value = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": failure.message,
        "reason": failure.reason,
        "code": failure.code,
    });
    json_response(
        StatusCode::from_u16(failure.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &value,
    )
}
