//! Test support (feature `test-util`): leadership without an API server, for an app's own
//! paused-time tests.
//!
//! [`leadership`], [`term`] and [`unbounded_term`] let a test publish terms by hand;
//! [`external_elector`] hands such a leadership value to [`Runtime::run`](crate::Runtime::run) in
//! place of an elector; [`fence`] guards writes of a hand-made term. The elector itself is tested
//! by this crate, in memory and against a real API server; an app's tests need not run it.
//!
//! Never enable this feature in a production build: nothing here elects anyone.

use std::time::Duration;

use tokio::time::Instant;

pub use crate::term::LeadershipSender;
use crate::{ElectorHandle, Fence, FenceMetrics, Leadership, Term};

/// A leadership value driven by hand: publish `Some(term)` to lead, `None` to follow.
pub fn leadership(initial: Option<Term>) -> (LeadershipSender, Leadership) {
    tokio::sync::watch::channel(initial)
}

/// A new term whose lease was renewed at `renewed_at` and stays safely held for
/// `renew_deadline` after each renewal (its fence refuses writes after that).
pub fn term(renewed_at: Instant, renew_deadline: Duration) -> Term {
    Term::new(renewed_at, renew_deadline)
}

/// Records a successful renewal of `term`'s lease, sent at `at`, as the elector does: its fence
/// allows writes again until `at` + RenewDeadline − margin, and writes waiting for a renewal
/// ([`Fence::wait_until_safe`]) go on.
pub fn renew(term: &Term, at: Instant) {
    term.record_renewal(at);
}

/// A new term that never expires; it ends only when its leadership value stops naming it
/// (Linkerd's claim with expiry MAX).
pub fn unbounded_term() -> Term {
    Term::unbounded()
}

/// A fence for `term`, valid while `leadership` names it and, for a bounded term, until its last
/// renewal plus RenewDeadline minus `margin`; it counts its refusals in metrics of its own.
pub fn fence(term: Term, leadership: Leadership, margin: Duration) -> Fence {
    Fence::new(term, leadership, margin, FenceMetrics::default())
}

/// An elector handle that only forwards `leadership` (driven by the test through the matching
/// [`LeadershipSender`]); releasing it only stops the handle.
pub fn external_elector(leadership: Leadership) -> ElectorHandle {
    ElectorHandle::external(leadership)
}
