//! Admin HTTP server: `/live`, `/ready` and `/metrics`.
//!
//! `/live` fails (500) only while this replica leads a term whose Lease has not been renewed for
//! RenewDeadline plus [`LEADER_HEALTH_TOLERANCE`] ([`leadership::LeaderHealth`]): the election
//! is stuck, and a restart hands the Lease over.
//!
//! `/ready` is true while every cache is synced, its watch not stalled and not re-listing past
//! the stall bound, on followers as well as on the leader (a warm standby is ready to take over),
//! and false once shutdown starts.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use std::time::Duration;

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::TokioIo;
use leadership::{LeaderHealth, LeaderUnhealthy};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How late past RenewDeadline the leader's renewals may be before `/live` fails (client-go's
/// `HealthzAdaptor` is commonly given the same 20 s).
pub const LEADER_HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// Readiness and liveness as the admin server reports them.
pub struct Health {
    caches: Box<dyn Fn() -> bool + Send + Sync>,
    shutting_down: AtomicBool,
    leader: Option<LeaderHealth>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("ready", &self.is_ready())
            .finish()
    }
}

/// What the server needs to answer requests.
pub struct Admin {
    health: Arc<Health>,
    registry: Registry,
}

// === impl Health ===

impl Health {
    /// Readiness that follows `caches` (synced, not stalled, not re-listing too long).
    pub fn new(caches: cluster::CacheHealth) -> Self {
        Self::following(move || caches.is_ready())
    }

    /// Readiness that follows `caches_ready`.
    pub fn following(caches_ready: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            caches: Box::new(caches_ready),
            shutting_down: AtomicBool::new(false),
            leader: None,
        }
    }

    /// Liveness that also fails while `leader` reports a leader whose renewals stopped.
    #[must_use]
    pub fn with_leader(mut self, leader: LeaderHealth) -> Self {
        self.leader = Some(leader);
        self
    }

    /// Why `/live` fails, if it does.
    pub fn liveness(&self) -> Result<(), LeaderUnhealthy> {
        self.leader.as_ref().map_or(Ok(()), LeaderHealth::check)
    }

    /// Marks the process as shutting down: it stops reporting ready.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether `/ready` answers 200.
    pub fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::SeqCst) && (self.caches)()
    }
}

// === impl Admin ===

impl Admin {
    /// Serves `health` and `registry` (whose collectors read their values at scrape time).
    pub fn new(health: Arc<Health>, registry: Registry) -> Self {
        Self { health, registry }
    }

    /// Binds `addr`, returning the bound address and the serving future (runs until `shutdown`).
    pub async fn bind(
        self,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let admin = Arc::new(self);
        let serve = async move {
            loop {
                let accepted = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else { continue };
                let admin = admin.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let admin = admin.clone();
                        async move { Ok::<_, Infallible>(admin.respond(&req)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    if let Err(error) = conn.await {
                        tracing::debug!(%error, "admin connection ended with an error");
                    }
                });
            }
        };
        Ok((local, serve))
    }

    /// Answers one request as the server answers it over a connection (the simulation asks
    /// its replicas' admin endpoints this way, with no socket).
    pub fn respond<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        if req.method() != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        }
        match req.uri().path() {
            "/live" => match self.health.liveness() {
                Ok(()) => text(StatusCode::OK, "live\n".into()),
                Err(unhealthy) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("not live: {unhealthy}\n"),
                ),
            },
            "/ready" if self.health.is_ready() => text(StatusCode::OK, "ready\n".into()),
            "/ready" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
            "/metrics" => {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &self.registry) {
                    Ok(()) => {
                        let mut response = text(StatusCode::OK, body);
                        response.headers_mut().insert(
                            hyper::header::CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        response
                    }
                    Err(error) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("encoding metrics failed: {error}\n"),
                    ),
                }
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(admin: &Admin, path: &str) -> (StatusCode, String) {
        let req = Request::get(path).body(()).unwrap();
        let response = admin.respond(&req);
        let status = response.status();
        let body = futures_body(response);
        (status, body)
    }

    fn futures_body(response: Response<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let collected = futures_lite_block_on(response.into_body().collect());
        String::from_utf8(collected.unwrap().to_bytes().to_vec()).unwrap()
    }

    fn futures_lite_block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn ready_follows_the_caches_and_shutdown() {
        let caches = Arc::new(AtomicBool::new(false));
        let health = Arc::new(Health::following({
            let caches = caches.clone();
            move || caches.load(Ordering::SeqCst)
        }));
        let admin = Admin::new(health.clone(), Registry::default());
        assert_eq!(get(&admin, "/live").0, StatusCode::OK);
        assert_eq!(get(&admin, "/ready").0, StatusCode::SERVICE_UNAVAILABLE);
        caches.store(true, Ordering::SeqCst);
        assert_eq!(get(&admin, "/ready").0, StatusCode::OK);
        caches.store(false, Ordering::SeqCst);
        assert_eq!(
            get(&admin, "/ready").0,
            StatusCode::SERVICE_UNAVAILABLE,
            "a stalled cache"
        );
        caches.store(true, Ordering::SeqCst);
        health.set_shutting_down();
        assert_eq!(get(&admin, "/ready").0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get(&admin, "/live").0, StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn live_fails_while_leading_with_renewals_stopped_past_the_tolerance() {
        use leadership::testing;
        let renew_deadline = Duration::from_secs(10);
        let term = testing::term(tokio::time::Instant::now(), renew_deadline);
        let (_sender, leadership) = testing::leadership(Some(term));
        let health = Arc::new(
            Health::following(|| true)
                .with_leader(LeaderHealth::new(leadership, LEADER_HEALTH_TOLERANCE)),
        );
        let admin = Admin::new(health.clone(), Registry::default());
        let live = |admin: &Admin| {
            let req = Request::get("/live").body(()).unwrap();
            admin.respond(&req).status()
        };
        assert_eq!(live(&admin), StatusCode::OK);
        tokio::time::advance(renew_deadline + LEADER_HEALTH_TOLERANCE).await;
        assert_eq!(live(&admin), StatusCode::OK);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(live(&admin), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(health.liveness().is_err());
    }

    #[test]
    fn metrics_are_encoded_at_scrape_time() {
        use prometheus_client::metrics::gauge::Gauge;
        let mut registry = Registry::default();
        let gauge = Gauge::<i64>::default();
        registry.register("answer", "A test gauge", gauge.clone());
        let admin = Admin::new(Arc::new(Health::following(|| true)), registry);
        gauge.set(42);
        let (status, body) = get(&admin, "/metrics");
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("answer 42"), "{body}");
        assert_eq!(get(&admin, "/nope").0, StatusCode::NOT_FOUND);
    }
}
