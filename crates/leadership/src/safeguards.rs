//! The runtime's and the elector's protections, as one value.
//!
//! Every protection is on, always, in anything built without the `test-util` feature: the only
//! value such a build can make is [`Safeguards::default`]. With the feature (and in this crate's
//! own tests), a test can switch one off to show that something notices its absence (the
//! project's simulation does this for each of them, and records the seed and the check that
//! breaks).

/// The protections of the leadership runtime and elector (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Safeguards {
    /// The fence refuses writes of a term that is over or whose lease is not safely held.
    pub(crate) fence: bool,
    /// Shutdown drains the queue before releasing the Lease.
    pub(crate) drain: bool,
    /// Every term gets fresh state ([`Reconciler::start_term`](crate::Reconciler::start_term)).
    pub(crate) fresh_state: bool,
    /// A follower re-creates a Lease deleted under another holder only once that holder's
    /// RenewDeadline has passed.
    pub(crate) deleted_lease_wait: bool,
}

// === impl Safeguards ===

impl Default for Safeguards {
    fn default() -> Self {
        Self {
            fence: true,
            drain: true,
            fresh_state: true,
            deleted_lease_wait: true,
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
impl Safeguards {
    /// The fence lets every write through (tests only).
    #[must_use]
    pub fn without_fence(mut self) -> Self {
        self.fence = false;
        self
    }

    /// Shutdown releases the Lease without draining (tests only).
    #[must_use]
    pub fn without_drain(mut self) -> Self {
        self.drain = false;
        self
    }

    /// A new term reuses the previous term's state instead of building fresh state (tests only).
    #[must_use]
    pub fn without_fresh_state(mut self) -> Self {
        self.fresh_state = false;
        self
    }

    /// A follower re-creates a deleted Lease at once (tests only).
    #[must_use]
    pub fn without_deleted_lease_wait(mut self) -> Self {
        self.deleted_lease_wait = false;
        self
    }
}
