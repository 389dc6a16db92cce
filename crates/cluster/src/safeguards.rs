//! The controller's own protections, beside the leadership runtime's
//! ([`leadership::Safeguards`], in [`ControllerConfig::runtime`](crate::ControllerConfig) and
//! the Lease configuration): the three clauses of the fresh-view rule (docs/architecture.md, "A
//! fresh view"), and version-fenced deletes.
//!
//! Built without the `test-util` feature, the only value is [`Safeguards::default`]: every
//! protection on. With it, the simulation switches one off at a time to show that its checks
//! notice.

/// The controller's protections (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Safeguards {
    /// Clause 1: a new term replays only once every cache is at least as new as a version read
    /// from the API server after the acquisition (the barrier, `watch::fresh`).
    pub(crate) acquisition_point: bool,
    /// Clause 2: each write's answer enters the cache at once, and a write of unknown outcome
    /// holds its Service until its slices are read back (`writer`, `view`).
    pub(crate) own_writes: bool,
    /// Clause 3: an addition is written only from a view at least as new as what it follows
    /// from, shown by the watermarks or by a read (`view`, `confirm`).
    pub(crate) additions: bool,
    /// Deletes carry the uid and resourceVersion the plan saw as preconditions.
    pub(crate) version_fenced_deletes: bool,
    /// How clause 1 shows a kind up to date: re-listed when it holds at most this many objects,
    /// probed by its watch above ([`crate::watch::fresh::RELIST_AT_MOST`]; not a switch, but
    /// the simulation, whose caches are small, lowers it to run the probe).
    pub(crate) barrier_relist_at_most: usize,
}

// === impl Safeguards ===

impl Default for Safeguards {
    fn default() -> Self {
        Self {
            acquisition_point: true,
            own_writes: true,
            additions: true,
            version_fenced_deletes: true,
            barrier_relist_at_most: crate::watch::fresh::RELIST_AT_MOST,
        }
    }
}

#[cfg(feature = "test-util")]
impl Safeguards {
    /// Clause 1 off: a new term replays its caches as they are, without the acquisition
    /// barrier (tests only).
    #[must_use]
    pub fn without_acquisition_point(mut self) -> Self {
        self.acquisition_point = false;
        self
    }

    /// Clause 2 off: answers do not enter the cache, and writes of unknown outcome are not read
    /// back; a pass plans from whatever the watch has shown (tests only).
    #[must_use]
    pub fn without_own_writes(mut self) -> Self {
        self.own_writes = false;
        self
    }

    /// Clause 3 off: a plan's additions are written as planned, whatever the watermarks
    /// (tests only).
    #[must_use]
    pub fn without_additions(mut self) -> Self {
        self.additions = false;
        self
    }

    /// Deletes carry no preconditions (tests only).
    #[must_use]
    pub fn without_version_fenced_deletes(mut self) -> Self {
        self.version_fenced_deletes = false;
        self
    }

    /// Clause 1 shows kinds of more than `objects` objects up to date by a probe of their watch
    /// rather than a re-list (0: every kind is probed; tests only).
    #[must_use]
    pub fn with_barrier_relisting_at_most(mut self, objects: usize) -> Self {
        self.barrier_relist_at_most = objects;
        self
    }
}
