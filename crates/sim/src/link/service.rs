//! The path of one request through a replica's link: the tower service that applies the
//! link's faults to it, reports its slice and Lease writes to the checks, and hands its answer
//! on through a [`FaultBody`].

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tower::{Service, ServiceExt};

use super::{Armed, AtWrite, BoxError, FaultBody, Link, LinkState};
use crate::checks::Checks;

/// The tower service of one replica's link (see the module docs).
#[derive(Clone)]
pub struct LinkService<S> {
    inner: S,
    link: Arc<Link>,
    checks: Arc<Checks>,
    /// The incarnation of the replica's process whose client this is.
    incarnation: u64,
}

// === impl LinkService ===

impl<S> LinkService<S> {
    /// `inner` (the API), reached through `link` by the process incarnation `incarnation`,
    /// reporting writes to `checks`.
    pub fn new(inner: S, link: Arc<Link>, checks: Arc<Checks>, incarnation: u64) -> Self {
        Self {
            inner,
            link,
            checks,
            incarnation,
        }
    }
}

impl<S, B> Service<Request<kube::client::Body>> for LinkService<S>
where
    S: Service<Request<kube::client::Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<FaultBody<B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let inner = self.inner.clone();
        let link = self.link.clone();
        let checks = self.checks.clone();
        let incarnation = self.incarnation;
        // Attributed when handed to the link, right after the writer's fence check: a pause
        // holds it afterwards, as a request on the wire.
        let kind = Kind::of(&request);
        let resource = (kind == Kind::Watch).then(|| resource_of(&request));
        let sent = (kind == Kind::SliceWrite)
            .then(|| checks.sending(link.replica, incarnation, guarded_slice(&request)));
        let write = request.method() != Method::GET;
        let exchange = async move {
            let answering = (kind != Kind::Watch).then(|| Counted::exchanges(&link));
            let on_the_wire = write.then(|| Counted::writes(&link));
            let armed = (kind == Kind::SliceWrite)
                .then(|| link.state.lock().armed.take())
                .flatten();
            match armed {
                Some(Armed::Stop(hold)) => {
                    let _ = link.exits.send((link.replica, AtWrite::Stop));
                    tokio::time::sleep(hold).await;
                }
                Some(Armed::Pause) => {
                    link.pause();
                    let _ = link.exits.send((link.replica, AtWrite::Pause));
                }
                None => {}
            }
            link.unpaused().await;
            if link.state.lock().cut {
                return Err("connection refused (simulated network cut)".into());
            }
            if link.roll_error() {
                return Ok(unavailable());
            }
            let late = link.roll_delay();
            if !late.is_zero() {
                tokio::time::sleep(late).await;
            }
            if let Some(sent) = &sent {
                checks.landing(link.replica, sent);
            }
            if kind == Kind::LeaseWrite {
                checks.lease_landing(link.replica, incarnation);
            }
            let response = inner.oneshot(request).await.map_err(Into::<BoxError>::into);
            drop(on_the_wire);
            let applied = response
                .as_ref()
                .is_ok_and(|response| response.status().is_success());
            if let Some(sent) = sent {
                checks.slice_answered(link.replica, sent, applied);
            }
            let response = response?;
            if kind == Kind::LeaseRead && response.status() == StatusCode::OK {
                checks.saw_lease(link.replica);
            }
            if applied && kind == Kind::SliceWrite {
                let crash = std::mem::take(&mut link.state.lock().crash_after_write);
                if crash {
                    let _ = link.exits.send((link.replica, AtWrite::Crash));
                    // The process is gone: nobody reads this answer, nor waits for it.
                    drop(answering);
                    return std::future::pending().await;
                }
                let lost = {
                    let mut state = link.state.lock();
                    let lost = state.lose_answers > 0;
                    state.lose_answers = state.lose_answers.saturating_sub(1);
                    lost
                };
                if lost {
                    return Err(
                        "connection reset (simulated: the write was applied, its answer \
                         lost)"
                            .into(),
                    );
                }
                let hold = std::mem::take(&mut link.state.lock().hold_answer);
                if hold {
                    link.update(|state| state.answer_held = true);
                    link.answer_released().await;
                }
            }
            let slow = link.state.lock().slow;
            if !slow.is_zero() {
                tokio::time::sleep(slow).await;
            }
            let stream = resource.map(|resource| (link.open_stream(&resource), resource));
            drop(answering);
            Ok(response.map(|body| FaultBody::new(body, link, stream)))
        };
        if !write {
            return Box::pin(exchange);
        }
        // A write on the wire is delivered even if its sender stops waiting (a worker aborted,
        // a process stopped): only the answer is lost.
        let delivery = tokio::spawn(exchange);
        Box::pin(async move {
            delivery
                .await
                .map_err(|error| BoxError::from(format!("simulated delivery failed: {error}")))?
        })
    }
}

/// One of the link's in-flight counts, held while a request is in its span: a write on the wire
/// (from when the link takes it until the API answers it), or any request but a watch until its
/// answer reaches the replica (after any delay a fault puts on it).
struct Counted {
    link: Arc<Link>,
    count: fn(&mut LinkState) -> &mut usize,
}

// === impl Counted ===

impl Counted {
    fn writes(link: &Arc<Link>) -> Self {
        Self::new(link, |state| &mut state.writes_in_flight)
    }

    fn exchanges(link: &Arc<Link>) -> Self {
        Self::new(link, |state| &mut state.exchanges_in_flight)
    }

    fn new(link: &Arc<Link>, count: fn(&mut LinkState) -> &mut usize) -> Self {
        *count(&mut link.state.lock()) += 1;
        Self {
            link: link.clone(),
            count,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        *(self.count)(&mut self.link.state.lock()) -= 1;
    }
}

/// What a request is, as far as faults and checks care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Watch,
    SliceWrite,
    LeaseRead,
    LeaseWrite,
    Other,
}

// === impl Kind ===

impl Kind {
    fn of<T>(request: &Request<T>) -> Self {
        let uri = request.uri();
        let watch = uri.query().is_some_and(|query| {
            query
                .split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });
        if watch {
            return Kind::Watch;
        }
        let write = matches!(
            *request.method(),
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        if write && uri.path().contains("/endpointslices") {
            Kind::SliceWrite
        } else if write && uri.path().contains("/leases") {
            Kind::LeaseWrite
        } else if *request.method() == Method::GET && uri.path().contains("/leases/") {
            Kind::LeaseRead
        } else {
            Kind::Other
        }
    }
}

/// The slice an update or delete names (`namespace`, `name`): the writes a version
/// precondition guards. `None` for a create.
fn guarded_slice<T>(request: &Request<T>) -> Option<(String, String)> {
    if !matches!(
        *request.method(),
        Method::PUT | Method::DELETE | Method::PATCH
    ) {
        return None;
    }
    let parts: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    match parts.as_slice() {
        [.., "namespaces", namespace, "endpointslices", name] => {
            Some((namespace.to_string(), name.to_string()))
        }
        _ => None,
    }
}

/// The resource a request is about: the plural name in its path (`endpointslices`, `leases`).
fn resource_of<T>(request: &Request<T>) -> String {
    let parts: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    let plural = match parts.as_slice() {
        [.., "namespaces", _, plural] | [.., "namespaces", _, plural, _] => plural,
        [.., plural] => plural,
        [] => "",
    };
    (*plural).to_string()
}

fn unavailable<B>() -> Response<FaultBody<B>> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "simulated: the server is currently unable to handle the request",
        "reason": "ServiceUnavailable",
        "code": 503,
    });
    let mut response = Response::new(FaultBody::full(Bytes::from(status.to_string())));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
