//! Proxies between one client and the API server, to strike faults on that client's traffic
//! alone.
//!
//! | proxy | client talks | faults |
//! |---|---|---|
//! | [`HttpProxy`] | plain `http://127.0.0.1:<port>` (the proxy holds the credentials and TLS) | every [`Mode`], and frozen watch streams ([`HttpProxy::freeze_watches`]) |
//! | [`Proxy`] | its own TLS, passed through | every [`Mode`] but [`Mode::StallWatches`] |
//!
//! Both: [`Mode::Open`] forwards; `reset()` closes every live connection once;
//! `forwarded()` counts the connections served.

pub mod http;
pub mod tcp;

use std::time::Duration;

pub use self::{http::HttpProxy, tcp::Proxy};

/// What a proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward.
    Open,
    /// Close live connections; close new ones at once (the client sees a reset/EOF quickly).
    Cut,
    /// Keep live and new connections open but forward nothing (the client's calls hang);
    /// the connections held are closed when the mode ends.
    Blackhole,
    /// Forward, holding each request for this long first (a slow API server: requests are
    /// slow, answers and watch streams are not; order is kept).
    Hold(Duration),
    /// Forward every request, but pass no byte of any watch response, open or new (its
    /// connection kept open, its headers and events held) while the mode lasts: the quiet
    /// failure of a middlebox that stops passing a streamed response. Other requests pass.
    /// When the mode ends the held bytes flow again.
    StallWatches,
}

// === impl Mode ===

impl Mode {
    /// Whether traffic flows (possibly late, or watches excepted).
    fn forwards(self) -> bool {
        matches!(self, Mode::Open | Mode::Hold(_) | Mode::StallWatches)
    }

    /// How long a request is held.
    fn hold(self) -> Duration {
        match self {
            Mode::Hold(hold) => hold,
            _ => Duration::ZERO,
        }
    }
}
