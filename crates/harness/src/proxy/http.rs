//! An HTTP-aware proxy between one replica and the API server: it sees each request, so it
//! can tell a watch from a read or a write, and strike the quiet faults a TCP proxy cannot.
//!
//! The replica gets a kubeconfig whose server is plain `http://127.0.0.1:<port>` and holds no
//! credentials ([`HttpProxy::kubeconfig`]); the proxy forwards each HTTP/1.1 request to the
//! API server over TLS as the user of the kubeconfig it was started with (one client
//! certificate per replica: the API server's audit log names the replica), and streams each
//! answer back.
//!
//! ```text
//!  replica ──http──► HttpProxy (127.0.0.1:0) ──https (kube::Client, the replica's user)──► kube-apiserver
//!                     │ Open:          forward
//!                     │ Cut:           close every live connection; close new ones at once
//!                     │ Blackhole:     stop serving every connection (open, silent); closed
//!                     │                when the mode ends
//!                     │ Hold(d):       each request held for d, then forwarded
//!                     │ StallWatches:  watch answers (open and new) get no byte; the rest pass
//!                     │ freeze_watches(): the watch streams open now never get another byte
//!                     │ lag_watches_of(r, d): each frame of a watch of resource r started from
//!                     │                now on reaches the replica d after the API server sent it
//!                     │                (in order; read eagerly, so the server never sees a slow
//!                     │                reader): one kind's watch behind the others, as when
//!                     │                one of kube-apiserver's per-resource watch caches lags
//!                     │ reset():       close every live connection once
//! ```
//!
//! A watch is a request whose query says `watch=true` (or `1`), as every watch of kube-rs and
//! client-go does.

use std::{
    net::SocketAddr,
    path::Path,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, BodyStream, StreamBody, combinators::UnsyncBoxBody};
use hyper::{
    Request, Response,
    body::{Bytes, Frame, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

use super::Mode;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of an answer as the proxy streams it back.
type Answer = UnsyncBoxBody<Bytes, BoxError>;

/// Headers of one hop, never forwarded.
const HOP_BY_HOP: [header::HeaderName; 6] = [
    header::CONNECTION,
    header::HOST,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// A running proxy; dropping it closes everything.
pub struct HttpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

/// What the proxy's connections share.
struct Shared {
    mode: watch::Sender<Mode>,
    resets: watch::Sender<u64>,
    /// Raised by [`HttpProxy::freeze_watches`]: a watch answer that began before the raise
    /// never gets another byte.
    freezes: watch::Sender<u64>,
    upstream: kube::Client,
    /// The resource (plural name) whose watches lag, and by how much.
    lagging: parking_lot::Mutex<Option<(String, Duration)>>,
    connections: AtomicUsize,
    requests: AtomicUsize,
}

/// Whether one watch answer may pass bytes now.
struct Gate {
    mode: watch::Receiver<Mode>,
    freezes: watch::Receiver<u64>,
    /// The freeze count when the answer began.
    began: u64,
}

// === impl HttpProxy ===

impl HttpProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards to the server of `kubeconfig`
    /// (a file of the testbed's: [`testbed::Testbed::kubeconfig_for`]) as its user.
    pub async fn start(kubeconfig: &Path) -> HttpProxy {
        let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
        // A proxy passes answers on as they come: no retry of its own, no read timeout (a
        // watch may be quiet for minutes).
        config.default_retry = false;
        config.read_timeout = None;
        let upstream = kube::Client::try_from(config).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            mode: watch::channel(Mode::Open).0,
            resets: watch::channel(0).0,
            freezes: watch::channel(0).0,
            upstream,
            lagging: parking_lot::Mutex::new(None),
            connections: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        HttpProxy {
            addr,
            shared,
            accept,
        }
    }

    /// The address replicas connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig whose server is this proxy (`http://`, no credentials), for the replica.
    pub fn kubeconfig(&self) -> tempfile::NamedTempFile {
        let server = serde_json::Value::String(format!("http://{}", self.addr));
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: proxy
  cluster:
    server: {server}
users:
- name: through-the-proxy
  user: {{}}
contexts:
- name: proxy
  context:
    cluster: proxy
    user: through-the-proxy
    namespace: default
current-context: proxy
"
        );
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    /// Closes all live connections and refuses new ones until [`HttpProxy::restore`].
    pub fn cut(&self) {
        self.set(Mode::Cut);
    }

    /// Silences all live and new connections until [`HttpProxy::restore`].
    pub fn blackhole(&self) {
        self.set(Mode::Blackhole);
    }

    /// Applies `mode` (a fault, or [`Mode::Open`]).
    pub fn set(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Forwards again (connections held by a blackhole are closed; stalled watch answers flow
    /// again; frozen ones stay frozen).
    pub fn restore(&self) {
        self.set(Mode::Open);
    }

    /// Closes every live connection (as a load balancer or a restarting API server would);
    /// new ones are forwarded as usual.
    pub fn reset(&self) {
        self.shared.resets.send_modify(|resets| *resets += 1);
    }

    /// Every watch answer being streamed now never gets another byte, its connection kept
    /// open (a connection stuck in a middlebox); watches started later pass.
    pub fn freeze_watches(&self) {
        self.shared.freezes.send_modify(|freezes| *freezes += 1);
    }

    /// Watches of `resource` (a plural name, `endpointslices`) started from now on deliver each
    /// frame `lag` after the API server sent it; [`Duration::ZERO`] ends it for new watches.
    pub fn lag_watches_of(&self, resource: &str, lag: Duration) {
        *self.shared.lagging.lock() = (!lag.is_zero()).then(|| (resource.to_string(), lag));
    }

    /// How many connections were served so far (a replica that reconnected after a restore
    /// raises it).
    pub fn forwarded(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many requests the API server answered through the proxy so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.mode.send_replace(Mode::Cut);
    }
}

// === impl Gate ===

impl Gate {
    fn new(shared: &Shared) -> Gate {
        let freezes = shared.freezes.subscribe();
        let began = *freezes.borrow();
        Gate {
            mode: shared.mode.subscribe(),
            freezes,
            began,
        }
    }

    /// Waits until the answer may pass bytes (for ever when it is frozen, or the proxy gone).
    async fn open(&mut self) {
        loop {
            let stalled = *self.mode.borrow_and_update() == Mode::StallWatches;
            let frozen = *self.freezes.borrow_and_update() > self.began;
            if !stalled && !frozen {
                return;
            }
            tokio::select! {
                changed = self.mode.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
                changed = self.freezes.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
    }
}

// === connections ===

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve(inbound, shared.clone()));
    }
}

/// One client connection, for as long as the mode allows.
async fn serve(inbound: TcpStream, shared: Arc<Shared>) {
    let mut mode = shared.mode.subscribe();
    let mut resets = shared.resets.subscribe();
    let current = *mode.borrow_and_update();
    match current {
        Mode::Cut => return,
        Mode::Blackhole => {
            let _held = inbound;
            let _ = mode.wait_for(|mode| *mode != Mode::Blackhole).await;
            return;
        }
        Mode::Open | Mode::Hold(_) | Mode::StallWatches => {}
    }
    shared.connections.fetch_add(1, Ordering::SeqCst);
    let service = {
        let shared = shared.clone();
        service_fn(move |request| forward(shared.clone(), request))
    };
    let connection = http1::Builder::new().serve_connection(TokioIo::new(inbound), service);
    let mut connection = pin!(connection);
    loop {
        tokio::select! {
            _ = &mut connection => return,
            _ = resets.changed() => return,
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *mode.borrow_and_update();
                match now {
                    Mode::Cut => return,
                    Mode::Blackhole => {
                        // The connection is kept, and not polled: nothing is read or written
                        // until the mode ends, then it is closed (its answers lost bytes).
                        let _ = mode.wait_for(|mode| *mode != Mode::Blackhole).await;
                        return;
                    }
                    Mode::Open | Mode::Hold(_) | Mode::StallWatches => {}
                }
            }
        }
    }
}

/// Forwards one request (after its hold) and streams the answer back, through a [`Gate`]
/// when it is a watch. An upstream failure closes the client's connection, as a TCP proxy
/// whose upstream failed would.
async fn forward(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Answer>, BoxError> {
    let hold = shared.mode.borrow().hold();
    let is_watch = is_watch(request.uri().query());
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    let gate = is_watch.then(|| Gate::new(&shared));
    let lag = is_watch
        .then(|| {
            let lagging = shared.lagging.lock();
            lagging
                .as_ref()
                .filter(|(resource, _)| names_resource(parts.uri.path(), resource))
                .map(|(_, lag)| *lag)
        })
        .flatten();
    let answer = shared
        .upstream
        .send(Request::from_parts(parts, kube::client::Body::from(body)))
        .await?;
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let (mut parts, body) = answer.into_parts();
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    let body = match gate {
        None => body.map_err(BoxError::from).boxed_unsync(),
        Some(mut gate) => {
            gate.open().await;
            match lag {
                None => StreamBody::new(gated(BodyStream::new(body), gate)).boxed_unsync(),
                Some(lag) => {
                    StreamBody::new(lagged(gated(BodyStream::new(body), gate), lag)).boxed_unsync()
                }
            }
        }
    };
    Ok(Response::from_parts(parts, body))
}

/// The frames of a watch answer, each passed on only once its gate is open.
fn gated(
    frames: BodyStream<kube::client::Body>,
    gate: Gate,
) -> impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Send {
    futures::stream::unfold((frames, gate), |(mut frames, mut gate)| async move {
        let frame = frames.next().await?;
        gate.open().await;
        Some((frame.map_err(BoxError::from), (frames, gate)))
    })
}

/// `frames`, each passed on `lag` after it arrived, in order. A task reads them as they come,
/// so the API server's side of the stream never waits on the lag.
fn lagged(
    frames: impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static,
    lag: Duration,
) -> impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Send {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut frames = pin!(frames);
        while let Some(frame) = frames.next().await {
            if sender
                .send((tokio::time::Instant::now() + lag, frame))
                .is_err()
            {
                return;
            }
        }
    });
    futures::stream::unfold(receiver, |mut receiver| async move {
        let (due, frame) = receiver.recv().await?;
        tokio::time::sleep_until(due).await;
        Some((frame, receiver))
    })
}

/// Whether the request path names `resource` (`.../<resource>` or `.../<resource>/<name>`).
fn names_resource(path: &str, resource: &str) -> bool {
    path.trim_matches('/')
        .split('/')
        .rev()
        .take(2)
        .any(|segment| segment == resource)
}

/// Whether a query asks for a watch (`watch=true` or `watch=1`).
fn is_watch(query: Option<&str>) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, value)| key == "watch" && matches!(value, "true" | "1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_from_other_requests_by_their_query() {
        assert!(is_watch(Some("watch=true&resourceVersion=12")));
        assert!(is_watch(Some("labelSelector=a%3Db&watch=1")));
        assert!(!is_watch(Some("watch=false")));
        assert!(!is_watch(Some("limit=500")));
        assert!(!is_watch(None));
    }

    #[test]
    fn a_lag_names_its_resource_by_the_path() {
        assert!(names_resource(
            "/apis/discovery.k8s.io/v1/endpointslices",
            "endpointslices"
        ));
        assert!(names_resource(
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices",
            "endpointslices"
        ));
        assert!(!names_resource(
            "/api/v1/namespaces/ns/services",
            "endpointslices"
        ));
    }
}
