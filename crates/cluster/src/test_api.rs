//! The production writer ([`KubeReadWrite`]) over a `kube::Client` of the in-memory API server
//! (`apisim`), behind a tower layer that records every call and puts failures at exact calls:
//! an error status instead of the answer (5xx, RBAC's 403, the fencing policy's 403), a call
//! never answered, or the term ended once a call is answered.
//!
//! ```text
//!  KubeReadWrite ─► kube::Client ─► Faults (record; fail, hang, end the term) ─► in-memory API
//! ```
//!
//! Everything not failed is answered by the in-memory API with the API server's semantics:
//! generated names, resourceVersions, a replace of an older version or a delete whose preconditions no longer
//! hold refused with 409, a missing object 404.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode, request::Parts};
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api,
    api::{PostParams, Preconditions},
    runtime::events::Reporter,
};
use leadership::{
    Fence, Term,
    testing::{self, LeadershipSender},
};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::writer::KubeReadWrite;

/// Errors crossing the layer.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The in-memory API, the writer that talks to it, and the faults between them.
pub struct TestApi {
    /// The API server.
    pub server: apisim::ApiServer,
    /// The production writer, through the faults.
    pub writes: KubeReadWrite,
    faults: Arc<Faults>,
}

/// What the layer records and the failures it puts in.
#[derive(Default)]
struct Faults {
    /// Every call, as `"create <generateName>"`, `"replace <name>"`, `"delete <name>"`,
    /// `"event <reason> <regarding name>"`, or `"<METHOD> <path>"` for anything else.
    calls: Mutex<Vec<String>>,
    /// The preconditions each delete carried, by slice name.
    preconditions: Mutex<Vec<(String, Preconditions)>>,
    /// Calls answered with a status and message instead of being sent on.
    failures: Mutex<HashMap<String, (u16, String)>>,
    /// Calls never answered.
    hanging: Mutex<Vec<String>>,
    /// After this many calls, the term published through the sender ends.
    end_term_after: Mutex<Option<(usize, LeadershipSender)>>,
}

/// The layer (see the module docs).
#[derive(Clone)]
struct FaultService {
    inner: apisim::ApiService,
    faults: Arc<Faults>,
}

/// A term that lasts until the test ends it, and its fence.
pub struct TestTerm {
    /// The fence of the term.
    pub fence: Fence,
    sender: LeadershipSender,
}

// === impl TestApi ===

impl TestApi {
    /// An empty API server and the writer, with no fault yet.
    pub fn new() -> Self {
        let server = apisim::ApiServer::new(apisim::ServerConfig::default());
        let faults = Arc::new(Faults::default());
        let service = FaultService {
            inner: server.service("writer"),
            faults: faults.clone(),
        };
        let client = kube::Client::new(service, "default");
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        Self {
            server,
            writes: KubeReadWrite::new(client, reporter),
            faults,
        }
    }

    /// Gives up on each call after `call_timeout`.
    pub fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.writes = self.writes.with_call_timeout(call_timeout);
        self
    }

    /// Stores `slice` as someone else would (not through the layer) and returns it as stored.
    pub async fn store(&self, slice: &EndpointSlice) -> EndpointSlice {
        let namespace = slice.metadata.namespace.as_deref().expect("a namespace");
        let api: Api<EndpointSlice> = Api::namespaced(self.server.client("other"), namespace);
        api.create(&PostParams::default(), slice).await.unwrap()
    }

    /// Replaces `slice` as someone else would: the same object, a newer resourceVersion.
    pub async fn rewrite(&self, slice: &EndpointSlice) -> EndpointSlice {
        let namespace = slice.metadata.namespace.as_deref().expect("a namespace");
        let name = slice.metadata.name.as_deref().expect("a name");
        let api: Api<EndpointSlice> = Api::namespaced(self.server.client("other"), namespace);
        api.replace(name, &PostParams::default(), slice)
            .await
            .unwrap()
    }

    /// Answers each of `calls` with its status, without sending it on.
    pub fn failing(self, calls: &[(&str, u16)]) -> Self {
        for (call, code) in calls {
            self.fail(call, *code);
        }
        self
    }

    /// From now on, answers `call` with HTTP status `code`, without sending it on.
    pub fn fail(&self, call: &str, code: u16) {
        let failure = (code, "injected".to_string());
        self.faults.failures.lock().insert(call.into(), failure);
    }

    /// From now on, sends `call` on.
    pub fn heal(&self, call: &str) {
        self.faults.failures.lock().remove(call);
    }

    /// From now on, answers `call` as the API server's fencing policy refuses a replica that
    /// does not hold the Lease (403, [`leadership::FENCING_POLICY_DENIAL`]).
    pub fn deny_as_not_holder(&self, call: &str) {
        let message = format!(
            "ValidatingAdmissionPolicy 'fencing' with binding 'fencing' denied request: \
             'replica-a' {} ns/lease",
            leadership::FENCING_POLICY_DENIAL
        );
        self.faults
            .failures
            .lock()
            .insert(call.into(), (403, message));
    }

    /// From now on, never answers `call` (as an API server whose storage is down may not).
    pub fn hang(&self, call: &str) {
        self.faults.hanging.lock().push(call.into());
    }

    /// Ends `term` right after the `calls`-th call from now is answered.
    pub fn end_term_after(&self, calls: usize, term: &TestTerm) {
        let at = self.faults.calls.lock().len() + calls;
        *self.faults.end_term_after.lock() = Some((at, term.sender.clone()));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.faults.calls.lock().clone()
    }

    /// The preconditions each delete of `name` carried, in order.
    pub fn delete_preconditions(&self, name: &str) -> Vec<Preconditions> {
        let sent = self.faults.preconditions.lock();
        sent.iter()
            .filter(|(deleted, _)| deleted == name)
            .map(|(_, preconditions)| preconditions.clone())
            .collect()
    }

    /// The stored slices of namespace `namespace`, by name.
    pub fn slices(&self, namespace: &str) -> Vec<EndpointSlice> {
        let slices = self.server.objects::<EndpointSlice>();
        slices
            .into_iter()
            .filter(|slice| slice.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }
}

// === impl Faults ===

impl Faults {
    /// Records `call`; its injected failure, if any.
    fn record(&self, call: &str, body: &Value) -> Option<(u16, String)> {
        if call.starts_with("delete ") {
            let name = call.trim_start_matches("delete ").to_string();
            let sent = &body["preconditions"];
            let field = |name: &str| sent[name].as_str().map(ToString::to_string);
            let preconditions = Preconditions {
                uid: field("uid"),
                resource_version: field("resourceVersion"),
            };
            self.preconditions.lock().push((name, preconditions));
        }
        self.calls.lock().push(call.to_string());
        self.failures.lock().get(call).cloned()
    }

    /// Ends the term if the call just answered is the one it was to end after.
    fn answered(&self) {
        let count = self.calls.lock().len();
        let mut end_term_after = self.end_term_after.lock();
        if end_term_after.as_ref().is_some_and(|(at, _)| count == *at)
            && let Some((_, sender)) = end_term_after.take()
        {
            sender.send_replace(None);
        }
    }
}

// === impl FaultService ===

impl tower::Service<Request<kube::client::Body>> for FaultService {
    type Response = Response<apisim::Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let inner = self.inner.clone();
        let faults = self.faults.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let call = describe(&parts, &json);
            if let Some((code, message)) = faults.record(&call, &json) {
                faults.answered();
                return Ok(status(code, &message));
            }
            if faults.hanging.lock().contains(&call) {
                return std::future::pending().await;
            }
            let request = Request::from_parts(parts, kube::client::Body::from(bytes));
            let answer = inner.oneshot(request).await;
            faults.answered();
            answer
        })
    }
}

/// A call as [`TestApi::calls`] lists it.
fn describe(parts: &Parts, body: &Value) -> String {
    let path = parts.uri.path();
    let last = path.rsplit('/').next().unwrap_or_default();
    let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
    match (&parts.method, path.contains("/endpointslices"), last) {
        (&Method::POST, true, _) => format!("create {}", text(&body["metadata"]["generateName"])),
        (&Method::PUT, true, name) => format!("replace {name}"),
        (&Method::DELETE, true, name) => format!("delete {name}"),
        (&Method::POST | &Method::PATCH, false, _) if path.contains("/events") => format!(
            "event {} {}",
            text(&body["reason"]),
            text(&body["regarding"]["name"])
        ),
        (method, _, _) => format!("{method} {path}"),
    }
}

/// An answer with HTTP status `code` and a `Status` body carrying `message`.
fn status(code: u16, message: &str) -> Response<apisim::Body> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Injected",
        "code": code,
    });
    let body = Full::new(Bytes::from(status.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(code).unwrap();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

// === impl TestTerm ===

impl TestTerm {
    /// A term of an hour whose fence allows writes until [`TestTerm::end`].
    pub fn new() -> Self {
        let term = testing::term(Instant::now(), Duration::from_secs(3600));
        let (sender, leadership) = testing::leadership(Some(term.clone()));
        let fence = testing::fence(term, leadership, Duration::ZERO);
        Self { fence, sender }
    }

    /// A term of RenewDeadline `renew_deadline` whose lease was last renewed at `renewed_at`,
    /// fenced with `margin` (its [`Term`] returned too, to renew it by hand).
    pub fn renewed_at(
        renewed_at: Instant,
        renew_deadline: Duration,
        margin: Duration,
    ) -> (Self, Term) {
        let term = testing::term(renewed_at, renew_deadline);
        let (sender, leadership) = testing::leadership(Some(term.clone()));
        let fence = testing::fence(term.clone(), leadership, margin);
        (Self { fence, sender }, term)
    }

    /// Ends the term, as a lost lease does.
    pub fn end(&self) {
        self.sender.send_replace(None);
    }
}
