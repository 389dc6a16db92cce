//! The controller's own protections, beside the leadership runtime's
//! ([`leadership::Safeguards`], in [`ControllerConfig::runtime`](crate::ControllerConfig) and
//! the Lease configuration).
//!
//! Built without the `test-util` feature, the only value is [`Safeguards::default`]: every
//! protection on. With it, the simulation switches one off at a time to show that its checks
//! notice.

/// The controller's protections (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Safeguards {
    /// A new term replays only once every cache is at least as new as a version read from the
    /// API server after the acquisition (`watch::fresh`).
    pub(crate) barrier: bool,
    /// Deletes carry the uid and resourceVersion the plan saw as preconditions.
    pub(crate) version_fenced_deletes: bool,
    /// Nothing is planned while a watch that lost its stream has not caught up
    /// (`watch::health::KindHealth::is_caught_up`).
    pub(crate) catch_up: bool,
    /// A plan's additions are confirmed by reads from the API server when the caches may
    /// disagree about them (`confirm`).
    pub(crate) confirm_additions: bool,
}

// === impl Safeguards ===

impl Default for Safeguards {
    fn default() -> Self {
        Self {
            barrier: true,
            version_fenced_deletes: true,
            catch_up: true,
            confirm_additions: true,
        }
    }
}

#[cfg(feature = "test-util")]
impl Safeguards {
    /// A new term replays its caches as they are, without the acquisition barrier (tests only).
    #[must_use]
    pub fn without_barrier(mut self) -> Self {
        self.barrier = false;
        self
    }

    /// Deletes carry no preconditions (tests only).
    #[must_use]
    pub fn without_version_fenced_deletes(mut self) -> Self {
        self.version_fenced_deletes = false;
        self
    }

    /// Reconciles plan while a watch that lost its stream catches up (tests only).
    #[must_use]
    pub fn without_catch_up(mut self) -> Self {
        self.catch_up = false;
        self
    }

    /// A plan's additions are written as planned, without reading the API server (tests only).
    #[must_use]
    pub fn without_confirmed_additions(mut self) -> Self {
        self.confirm_additions = false;
        self
    }
}
