//! Requests in, answers out: the tower service, the routing of a request to a verb
//! (`reads.rs`, `writes.rs`), the faults armed on requests (`faults.rs`), and the shapes of
//! answers.

use std::{collections::BTreeMap, sync::Arc, task::Poll, time::Duration};

use bytes::Bytes;
use futures::{StreamExt, future::BoxFuture};
use http::{Method, Request, Response, StatusCode, request::Parts};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    Inner, LogEntry,
    kinds::{Resource, Target},
    selector::{FieldSelector, LabelSelector},
    store::Key,
};

mod reads;
mod validate;
mod writes;

pub(crate) use self::writes::commit_and_announce;

/// Errors of the service (only a request body that cannot be read).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every answer.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The server as a tower service, attributing requests to one caller.
#[derive(Clone)]
pub struct ApiService {
    inner: Arc<Inner>,
    caller: Arc<str>,
    /// The instance every request goes to, when pinned.
    instance: Option<usize>,
}

/// A failed request, answered as a `Status`.
pub(crate) struct Failure {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

type Answer = Result<Response<Body>, Failure>;

/// The server's default watch timeout when the request gives none.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// The date the simulated clock starts at (2026-01-01T00:00:00Z).
const EPOCH_SECONDS: i64 = 1_767_225_600;

// === impl ApiService ===

impl ApiService {
    pub(crate) fn new(inner: Arc<Inner>, caller: &str, instance: Option<usize>) -> Self {
        Self {
            inner,
            caller: Arc::from(caller),
            instance,
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
        let instance = self
            .instance
            .unwrap_or_else(|| self.inner.pick_instance())
            .min(self.inner.config.instances.len().saturating_sub(1));
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect_bytes().await?;
            let mut served = Served::default();
            let answer = handle(&inner, &caller, instance, &parts, &body, &mut served);
            let response = answer.unwrap_or_else(|failure| status(&failure));
            if let Some(read) = served.read {
                crate::faults::after_read(&inner, &caller, &read);
            }
            log(&inner, &caller, &parts, &body, response.status().as_u16());
            if served.answer_lost {
                return Err(BoxError::from(
                    "simulated: the connection was reset after the write was applied; its answer is lost",
                ));
            }
            Ok(response)
        })
    }
}

/// What serving a request did that matters after its answer.
#[derive(Default)]
pub(crate) struct Served {
    /// A read: its resource, namespace and name (`None` for a list or watch).
    pub read: Option<(Resource, Option<String>, Option<String>)>,
    /// The write was applied and its answer is to be lost.
    pub answer_lost: bool,
}

fn log(inner: &Inner, caller: &str, parts: &Parts, body: &[u8], status: u16) {
    record(
        inner,
        caller,
        parts.method.as_str(),
        parts.uri.to_string(),
        status,
        crate::log::body_hash(body),
    );
}

/// Appends an entry to the request log: a request served, or an act of the server's own (a
/// fault's write, watches closed), logged under the name it acts as.
pub(crate) fn record(
    inner: &Inner,
    caller: &str,
    method: &str,
    uri: String,
    status: u16,
    body: u64,
) {
    let mut log = inner.log.lock();
    let entry = LogEntry {
        seq: log.len() as u64,
        at_ms: elapsed(inner).as_millis() as u64,
        caller: caller.to_string(),
        method: method.to_string(),
        uri,
        status,
        revision: inner.store.lock().revision,
        body,
    };
    log.push(entry);
}

pub(crate) fn elapsed(inner: &Inner) -> Duration {
    Instant::now() - inner.started
}

/// The simulated wall-clock time, RFC 3339 to the second.
pub(crate) fn timestamp(inner: &Inner) -> String {
    let seconds = EPOCH_SECONDS + elapsed(inner).as_secs() as i64;
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|time| time.to_string())
        .unwrap_or_default()
}

fn handle(
    inner: &Arc<Inner>,
    caller: &str,
    instance: usize,
    parts: &Parts,
    body: &[u8],
    served: &mut Served,
) -> Answer {
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
        instance,
        parts,
        target,
        query,
        lost: std::cell::Cell::new(false),
    };
    if parts.method == Method::GET {
        served.read = Some((
            request.resource(),
            request.target.namespace.clone(),
            request.target.name.clone(),
        ));
    }
    let answer = request.route(body);
    served.answer_lost = request.lost.get();
    answer
}

impl Call<'_> {
    fn route(&self, body: &[u8]) -> Answer {
        let path = self.parts.uri.path();
        let request = self;
        match (&self.parts.method, request.target.name.is_some()) {
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
}

/// One request being served.
pub(crate) struct Call<'a> {
    inner: &'a Arc<Inner>,
    caller: &'a str,
    /// The instance serving it.
    instance: usize,
    parts: &'a Parts,
    target: Target,
    query: BTreeMap<String, String>,
    /// Set when the write was applied and its answer is to be lost.
    lost: std::cell::Cell<bool>,
}

impl Call<'_> {
    pub(crate) fn resource(&self) -> Resource {
        self.target.resource
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        self.query
            .get(name)
            .is_some_and(|value| value == "true" || value == "1")
    }

    pub(crate) fn key(&self, name: &str) -> Key {
        let (group, plural) = self.resource().storage();
        (
            group,
            plural,
            self.target.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }

    pub(crate) fn qualified(&self) -> String {
        let resource = self.resource();
        if resource.group.is_empty() {
            resource.plural.to_string()
        } else {
            format!("{}.{}", resource.plural, resource.group)
        }
    }

    pub(crate) fn not_found(&self, name: &str) -> Failure {
        Failure {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", self.qualified()),
        }
    }

    pub(crate) fn conflict(&self, name: &str, why: &str) -> Failure {
        Failure {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                self.qualified()
            ),
        }
    }

    pub(crate) fn selectors(&self) -> Result<(LabelSelector, FieldSelector), Failure> {
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
}

pub(crate) fn parse(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body).map_err(|error| Failure {
        code: 400,
        reason: "BadRequest",
        message: format!("the body of the request could not be decoded: {error}"),
    })
}

/// Query parameters, percent-decoded.
pub(crate) fn query(text: &str) -> BTreeMap<String, String> {
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

pub(crate) fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
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

pub(crate) fn watch_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) fn stream_body(stream: futures::stream::BoxStream<'static, Bytes>) -> Body {
    StreamBody::new(stream.map(|bytes| Ok::<_, BoxError>(http_body::Frame::data(bytes))))
        .boxed_unsync()
}

pub(crate) fn status(failure: &Failure) -> Response<Body> {
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
