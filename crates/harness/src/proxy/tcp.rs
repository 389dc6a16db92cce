//! A TCP proxy between one client and the API server, to cut that client off the network. It
//! cannot tell one request from another (see [`HttpProxy`](super::HttpProxy) for that); it
//! serves clients that must keep their own TLS to the API server (Linkerd's Go controller in
//! the interop tests: its HTTP/2 and health pings are part of what those tests observe).
//!
//! TLS passes through untouched: the replica still talks to `https://127.0.0.1:<port>`, and the
//! testbed's serving certificate has the SAN 127.0.0.1, so it verifies as usual.
//!
//! ```text
//!  replica ──TCP──► Proxy (127.0.0.1:0) ──TCP──► kube-apiserver
//!                    │ Open:      forward both ways
//!                    │ Cut:       close every live connection; accept new ones and close them
//!                    │ Blackhole: stop forwarding, keep every connection open and silent
//!                    │            (requests hang until the client gives up); closed on restore
//!                    │ Hold(d):   forward, every byte from the replica held for d first (a
//!                    │            slow API server: each request takes d longer, a new
//!                    │            connection's TLS handshake too; in order)
//!                    │ StallWatches: not supported (it cannot see a watch): panics
//!                    │ reset():   close every live connection once, keep forwarding new ones
//! ```

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::Mode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};

/// A running proxy; dropping it closes everything.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    resets: watch::Sender<u64>,
    forwarded: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

// === impl Proxy ===

impl Proxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, _) = watch::channel(Mode::Open);
        let (resets, _) = watch::channel(0);
        let forwarded = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            (mode.clone(), resets.clone()),
            forwarded.clone(),
        ));
        Proxy {
            addr,
            mode,
            resets,
            forwarded,
            accept,
        }
    }

    /// The address replicas connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes all live connections and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    /// Silences all live and new connections until [`Proxy::restore`].
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Applies `mode` (an outage, or [`Mode::Open`]). Panics on [`Mode::StallWatches`].
    pub fn set(&self, mode: Mode) {
        assert!(
            mode != Mode::StallWatches,
            "a TCP proxy cannot tell a watch from another request"
        );
        self.mode.send_replace(mode);
    }

    /// Closes every live connection (as a load balancer or a restarting API server would);
    /// new ones are forwarded as usual.
    pub fn reset(&self) {
        self.resets.send_modify(|resets| *resets += 1);
    }

    /// Forwards again (connections held by a blackhole are closed: their streams lost bytes).
    pub fn restore(&self) {
        self.mode.send_replace(Mode::Open);
    }

    /// How many connections were forwarded so far (a replica that reconnected after a restore
    /// raises it).
    pub fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.mode.send_replace(Mode::Cut);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    (mode, resets): (watch::Sender<Mode>, watch::Sender<u64>),
    forwarded: Arc<AtomicUsize>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let watches = (mode.subscribe(), resets.subscribe());
        let forwarded = forwarded.clone();
        tokio::spawn(serve(inbound, upstream, watches, forwarded));
    }
}

/// One client connection, for as long as the mode allows.
async fn serve(
    inbound: TcpStream,
    upstream: SocketAddr,
    (mut mode, mut resets): (watch::Receiver<Mode>, watch::Receiver<u64>),
    forwarded: Arc<AtomicUsize>,
) {
    resets.mark_unchanged();
    let current = *mode.borrow_and_update();
    match current {
        Mode::Cut => return,
        Mode::Blackhole => return hold_until_open(mode, inbound, None).await,
        Mode::Open | Mode::Hold(_) | Mode::StallWatches => {}
    }
    let Ok(outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    forwarded.fetch_add(1, Ordering::SeqCst);
    let (client_read, client_write) = inbound.into_split();
    let (server_read, server_write) = outbound.into_split();
    let (late, due) = mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(read_requests(client_read, late, mode.clone()));
    tasks.spawn(write_requests(due, server_write, mode.clone()));
    tasks.spawn(copy_answers(server_read, client_write, mode.clone()));
    let outage = tokio::select! {
        _ = tasks.join_next() => return,
        _ = resets.changed() => return,
        outage = mode.wait_for(|mode| !mode.forwards()) => outage.map(|mode| *mode).ok(),
    };
    if outage == Some(Mode::Blackhole) {
        // Keep both sockets open, forwarding nothing: the halves live in the tasks, which
        // stop at their next byte (see `parked`) and are held until the restore.
        let halted = tasks;
        let _ = mode.wait_for(|mode| *mode != Mode::Blackhole).await;
        drop(halted);
    }
    // Dropping the tasks closes both sockets.
}

/// Reads the client's bytes and queues them with the time they may be forwarded.
async fn read_requests(
    mut from: OwnedReadHalf,
    late: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    mode: watch::Receiver<Mode>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                let current = *mode.borrow();
                if parked(current, &mode).await {
                    return;
                }
                let due = Instant::now() + current.hold();
                if late.send((due, buffer[..read].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
}

/// Forwards the queued bytes to the server, each once it is due.
async fn write_requests(
    mut due: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
) {
    while let Some((at, bytes)) = due.recv().await {
        tokio::time::sleep_until(at).await;
        let current = *mode.borrow();
        if parked(current, &mode).await || to.write_all(&bytes).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

/// Forwards the server's answers as they come.
async fn copy_answers(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let current = *mode.borrow();
        if parked(current, &mode).await || to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

/// In a blackhole, waits (holding the socket, forwarding nothing) until the outage ends and
/// returns true: the connection is closed then. False when traffic flows.
async fn parked(current: Mode, mode: &watch::Receiver<Mode>) -> bool {
    if current.forwards() {
        return false;
    }
    let mut mode = mode.clone();
    let _ = mode.wait_for(|mode| mode.forwards()).await;
    true
}

/// Keeps the sockets open, forwarding nothing, until the proxy is restored (or dropped).
async fn hold_until_open(
    mut mode: watch::Receiver<Mode>,
    inbound: TcpStream,
    outbound: Option<TcpStream>,
) {
    let _held = (inbound, outbound);
    let _ = mode.wait_for(|mode| *mode != Mode::Blackhole).await;
}
