//! A TCP proxy between one replica and the API server, to cut that replica off the network.
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
//!                    │ reset():   close every live connection once, keep forwarding new ones
//! ```

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::{
    io::copy_bidirectional,
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward.
    Open,
    /// Close live connections; close new ones at once (the client sees a reset/EOF quickly).
    Cut,
    /// Keep live and new connections open but forward nothing (the client's calls hang).
    Blackhole,
}

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

    /// Applies `mode` (an outage, or [`Mode::Open`]).
    pub fn set(&self, mode: Mode) {
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
    mut inbound: TcpStream,
    upstream: SocketAddr,
    (mut mode, mut resets): (watch::Receiver<Mode>, watch::Receiver<u64>),
    forwarded: Arc<AtomicUsize>,
) {
    resets.mark_unchanged();
    let current = *mode.borrow_and_update();
    match current {
        Mode::Cut => return,
        Mode::Blackhole => return hold_until_open(mode, inbound, None).await,
        Mode::Open => {}
    }
    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    forwarded.fetch_add(1, Ordering::SeqCst);
    let outage = tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => return,
        _ = resets.changed() => return,
        outage = mode.wait_for(|mode| *mode != Mode::Open) => outage.map(|mode| *mode).ok(),
    };
    if outage == Some(Mode::Blackhole) {
        hold_until_open(mode, inbound, Some(outbound)).await;
    }
    // Dropping both sockets closes the connection.
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
