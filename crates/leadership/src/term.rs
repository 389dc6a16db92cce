//! Terms: one uninterrupted period of holding the lease.
//!
//! Leadership is a value: a [`Leadership`] receiver holds `Some(term)` while this process leads and
//! `None` while it follows. Every acquisition starts a new [`Term`] with a fresh id, so work that
//! belongs to an older term can always be told apart from work of the current one.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

/// The current leadership of this process: `Some(term)` while leading, `None` while following.
pub type Leadership = watch::Receiver<Option<Term>>;

/// The sending side of [`Leadership`], owned by whatever decides leadership (the elector).
///
/// Public only through `testing` (feature `test-util`), where tests drive terms by hand.
pub type LeadershipSender = watch::Sender<Option<Term>>;

/// Term ids are unique and increasing within the process, whichever elector created them.
static NEXT_TERM_ID: AtomicU64 = AtomicU64::new(1);

/// One uninterrupted period of leadership.
///
/// Cheap to clone. Two terms are equal when their ids are equal.
#[derive(Clone)]
pub struct Term {
    id: u64,
    acquired_at: Instant,
    renewal: Arc<Renewal>,
    token: Option<FencingToken>,
}

/// What the Lease said when this process acquired it for a term: the holder identity it wrote
/// and the Lease's `leaseTransitions` after the acquisition. Any other process's writes to the
/// Lease name another holder or a higher transition count, so the pair identifies the term
/// across processes, as the term id cannot.
///
/// Use it where the API server or another system can compare it with the Lease: a
/// ValidatingAdmissionPolicy comparing `holderIdentity` (see
/// [`FENCING_POLICY_TEMPLATE`](crate::FENCING_POLICY_TEMPLATE)), or an annotation on the objects
/// a term writes, refused by a policy when its transition count is below the Lease's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FencingToken {
    /// The Lease's `spec.holderIdentity`: this process's identity.
    pub holder_identity: String,
    /// The Lease's `spec.leaseTransitions` once this term acquired it.
    pub lease_transitions: i32,
}

/// When the lease behind a term was last renewed, and how long a renewal keeps it safely held.
/// A watch channel, so that a write waiting for the lease to be safely held again wakes at the
/// renewal ([`Term::renewed_after`]).
struct Renewal {
    last_renewed_at: watch::Sender<Instant>,
    /// `None` for a term that never ends (tests, single-replica setups).
    renew_deadline: Option<Duration>,
}

// === impl Term ===

impl Term {
    /// Starts a new term backed by a lease that was (re)newed at `renewed_at` and stays safely held
    /// for `renew_deadline` after each successful renewal.
    pub(crate) fn new(renewed_at: Instant, renew_deadline: Duration) -> Self {
        Self {
            id: NEXT_TERM_ID.fetch_add(1, Ordering::Relaxed),
            acquired_at: renewed_at,
            renewal: Arc::new(Renewal {
                last_renewed_at: watch::Sender::new(renewed_at),
                renew_deadline: Some(renew_deadline),
            }),
            token: None,
        }
    }

    /// This term, with the Lease's holder and transition count as written at its acquisition.
    pub(crate) fn with_token(mut self, token: FencingToken) -> Self {
        self.token = Some(token);
        self
    }

    /// The fencing token of this term: the Lease's holder identity and transition count as
    /// written when the term began. `None` for a term not backed by a Lease (tests, hand-driven
    /// terms, an external elector).
    pub fn fencing_token(&self) -> Option<&FencingToken> {
        self.token.as_ref()
    }

    /// A term that never expires, for tests and for running without an API server (like Linkerd's
    /// claim with expiry MAX). It still ends when its [`Leadership`] stops naming it.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn unbounded() -> Self {
        let now = Instant::now();
        Self {
            id: NEXT_TERM_ID.fetch_add(1, Ordering::Relaxed),
            acquired_at: now,
            renewal: Arc::new(Renewal {
                last_renewed_at: watch::Sender::new(now),
                renew_deadline: None,
            }),
            token: None,
        }
    }

    /// The term's id: unique within the process and larger than every earlier term's.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// When the lease was acquired for this term (local clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// When the lease was last renewed successfully (local clock, taken before the request was
    /// sent, so it never overstates how long the lease is held).
    pub fn last_renewed_at(&self) -> Instant {
        *self.renewal.last_renewed_at.borrow()
    }

    /// Records a successful renewal that was sent at `at`. Renewal times never go backwards.
    pub(crate) fn record_renewal(&self, at: Instant) {
        self.renewal.last_renewed_at.send_if_modified(|last| {
            let newer = at > *last;
            if newer {
                *last = at;
            }
            newer
        });
    }

    /// Completes once a renewal sent after `at` has been recorded (at once if one has). Never
    /// completes for a term whose lease is no longer renewed: race it with the term's end.
    pub(crate) async fn renewed_after(&self, at: Instant) {
        let mut renewals = self.renewal.last_renewed_at.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = renewals.wait_for(|last| *last > at).await;
    }

    /// Until when the lease is safely held, keeping `margin` in reserve: last renewal +
    /// RenewDeadline − margin. `None` for an unbounded term.
    pub(crate) fn safely_held_until(&self, margin: Duration) -> Option<Instant> {
        let deadline = self.renewal.renew_deadline?;
        let until = self.last_renewed_at() + deadline;
        Some(until.checked_sub(margin).unwrap_or(self.acquired_at))
    }
}

impl PartialEq for Term {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Term {}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("id", &self.id)
            .field("acquired_at", &self.acquired_at)
            .field("last_renewed_at", &self.last_renewed_at())
            .field("token", &self.token)
            .finish()
    }
}

impl fmt::Display for FencingToken {
    /// `holder@transitions`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.holder_identity, self.lease_transitions)
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ids_increase_and_renewals_never_go_back() {
        let a = Term::new(Instant::now(), Duration::from_secs(10));
        let b = Term::unbounded();
        assert!(b.id() > a.id());
        let t0 = a.last_renewed_at();
        tokio::time::advance(Duration::from_secs(3)).await;
        a.record_renewal(Instant::now());
        a.record_renewal(t0);
        assert_eq!(a.last_renewed_at(), t0 + Duration::from_secs(3));
        assert_eq!(
            a.safely_held_until(Duration::from_secs(1)),
            Some(t0 + Duration::from_secs(12))
        );
        assert_eq!(b.safely_held_until(Duration::from_secs(1)), None);
    }
}
