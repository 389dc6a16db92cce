//! The deterministic simulation of external-endpoints: several replicas of the real controller
//! (the production `cluster::Controller`, built as the binary builds it, given a `kube::Client`)
//! against the in-memory API server of `apisim`, in one process, on a current-thread runtime in
//! paused time, under a schedule of changes and faults drawn from a seed, with the checks of
//! [`checks`] after every step.
//!
//! ```text
//!  seed ─► Schedule (changes, faults) ─► World ─► replicas 0..n ─► Link (faults) ─► in-memory API
//!                                          │                                             │
//!                                          └──────────── Checks ◄── every write, every term
//! ```
//!
//! The same seed gives the same run: every random choice comes from the seed (the schedule,
//! the faults' picks, the API's generated names, the jitter of retries), the runtime is
//! single-threaded with paused time, the controller polls its `select!`s in a fixed order and
//! its caches iterate in a fixed order. A run's fingerprint is the hash of the API's request log
//! ([`Report::trace_hash`]).
//!
//! tokio's own free choices (the order in which a watch channel wakes its waiters) come from a
//! per-runtime generator that only a `--cfg tokio_unstable` build can seed: the simulation is
//! built with that flag (scripts/test.sh), and without it runs are equal in outcome but not
//! always in the order of same-instant requests.
//!
//! The scripted scenarios (`tests/scenarios`) run the same replica and link with a fixed script
//! instead of a seed: terms from a competing holder of the Lease, faults from the link's
//! scripted switches (a held or lagging slice watch, a held answer).
//!
//! Replay one seed:
//! `RUSTFLAGS="--cfg tokio_unstable" SIM_SEED=<seed> cargo test --release -p sim --test seeds -- replay --nocapture`
//! (add `SIM_LOG=debug` for the controller's logs).
#![deny(missing_docs)]

pub mod checks;
pub mod link;
pub mod reference;
pub mod replica;
pub mod rng;
pub mod schedule;
pub mod sweep;
pub mod world;

use std::{fmt, time::Duration};

pub use crate::{
    checks::{Check, Known, Violation},
    schedule::{Options, Schedule},
};

/// A protection that a safeguard test switches off, to show the simulation notices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Safeguard {
    /// The writer's fence (term current and lease safely held, before every write).
    Fence,
    /// Clause 1 of the fresh-view rule: the acquisition barrier (caches at least as new as a
    /// read after acquiring).
    Barrier,
    /// The drain before releasing the Lease on shutdown.
    Drain,
    /// The bound on a silent watch.
    StallBound,
    /// The wait before re-creating a Lease deleted under another holder.
    DeletedLeaseWait,
    /// A fresh slice tracker every term.
    FreshTracker,
    /// uid and resourceVersion preconditions on slice deletes.
    VersionFencedDeletes,
    /// Clause 2 of the fresh-view rule: our own answers in the cache at once, and a write of
    /// unknown outcome read back before the Service is planned again.
    OwnWrites,
    /// Clause 3 of the fresh-view rule: an addition written only from a view at least as new as
    /// what it follows from (the watermarks, or a read).
    Additions,
}

/// Which protections a run has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    /// The controller's protection switched off, if any.
    pub off: Option<Safeguard>,
    /// Whether the API server refuses slice writes from anyone but the Lease's holder (the
    /// admission policy of `deploy/`), reading the Lease as its informer does, a moment late.
    pub server_fence: bool,
}

/// What one seed's run found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Every broken check, in order.
    pub violations: Vec<Violation>,
    /// How long after the faults stopped the slices equalled the plan (`None`: not within the
    /// bound).
    pub converged_after: Option<Duration>,
    /// The hash of every request the API server saw, in order, bodies included (timestamps
    /// masked: the replicas write the wall clock): equal for equal runs.
    pub trace_hash: u64,
    /// Slice writes the API applied.
    pub slice_writes: u64,
    /// Simulated time of the whole run.
    pub simulated: Duration,
    /// The schedule that ran.
    pub schedule: Schedule,
    /// Every request the API server saw, one line each.
    pub requests: Vec<String>,
}

// === impl Safeguard ===

impl Safeguard {
    /// Every safeguard, in table order.
    pub const ALL: [Safeguard; 9] = [
        Safeguard::Fence,
        Safeguard::Barrier,
        Safeguard::Drain,
        Safeguard::StallBound,
        Safeguard::DeletedLeaseWait,
        Safeguard::FreshTracker,
        Safeguard::VersionFencedDeletes,
        Safeguard::OwnWrites,
        Safeguard::Additions,
    ];
}

// === impl Setup ===

impl Setup {
    /// As deployed: every protection, the API server's fence included.
    pub const DEPLOYED: Setup = Setup {
        off: None,
        server_fence: true,
    };

    /// The controller alone: every protection of its own, no help from the API server.
    pub const CONTROLLER_ALONE: Setup = Setup {
        off: None,
        server_fence: false,
    };

    /// The controller without `safeguard`, and without the API server's fence behind it.
    pub fn without(safeguard: Safeguard) -> Setup {
        Setup {
            off: Some(safeguard),
            server_fence: false,
        }
    }

    /// The setup named by `SIM_OFF` (a safeguard's name) and `SIM_SERVER_FENCE` (0 or 1),
    /// as a replay command gives them; [`Setup::DEPLOYED`] when neither is set.
    pub fn from_env() -> Setup {
        let off = std::env::var("SIM_OFF").ok().and_then(|name| {
            Safeguard::ALL
                .into_iter()
                .find(|safeguard| format!("{safeguard:?}") == name)
        });
        let server_fence =
            std::env::var("SIM_SERVER_FENCE").map_or(off.is_none(), |value| value != "0");
        Setup { off, server_fence }
    }

    /// The environment that [`Setup::from_env`] reads back as this setup.
    pub fn env(&self) -> String {
        let off = self
            .off
            .map_or(String::new(), |off| format!("SIM_OFF={off:?} "));
        format!("{off}SIM_SERVER_FENCE={} ", u8::from(self.server_fence))
    }
}

// === impl Report ===

impl Report {
    /// Whether every check held (findings of documented limitations aside).
    pub fn passed(&self) -> bool {
        self.violations
            .iter()
            .all(|violation| violation.known.is_some())
    }

    /// The findings of documented limitations ([`checks::Known`]).
    pub fn known(&self) -> impl Iterator<Item = &Violation> {
        self.violations
            .iter()
            .filter(|violation| violation.known.is_some())
    }

    /// The command that replays this seed.
    pub fn replay_command(&self, setup: Setup) -> String {
        format!(
            "{}SIM_SEED={} RUSTFLAGS=\"--cfg tokio_unstable\" cargo test --release -p sim --test seeds -- replay --nocapture",
            setup.env(),
            self.seed
        )
    }

    /// The run as text: schedule, violations, fingerprint (the trace file's content).
    pub fn trace(&self) -> String {
        let mut text = format!(
            "seed {}\nsimulated {:.3}s, {} slice writes, trace hash {:016x}, converged after {:?}\n\nschedule:\n",
            self.seed,
            self.simulated.as_secs_f64(),
            self.slice_writes,
            self.trace_hash,
            self.converged_after
        );
        for timed in &self.schedule.steps {
            text.push_str(&format!("{timed}\n"));
        }
        text.push_str("\nviolations:\n");
        for violation in &self.violations {
            text.push_str(&format!("{violation}\n"));
        }
        text.push_str("\nrequests:\n");
        for request in &self.requests {
            text.push_str(request);
            text.push('\n');
        }
        text
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self
            .violations
            .iter()
            .find(|violation| violation.known.is_none())
        {
            None => write!(f, "seed {}: passed", self.seed),
            Some(first) => write!(
                f,
                "seed {}: {} violation(s), first: {first}",
                self.seed,
                self.violations.len()
            ),
        }
    }
}

/// Runs one seed with `setup`'s protections, on a fresh current-thread runtime in paused time.
pub fn run(seed: u64, options: &Options, setup: Setup) -> Report {
    // The jitter of kube's retry backoff comes from fastrand's per-thread generator.
    fastrand::seed(seed);
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // tokio draws from a per-runtime generator where a choice is free (which of a watch
    // channel's waiters wakes first, a `select!` without `biased;` in a dependency); seeded
    // here, so the order of same-instant wake-ups is the seed's too. The seed is settable only
    // in builds with `--cfg tokio_unstable` (scripts/test.sh builds the simulation so).
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    #[allow(clippy::expect_used)] // without a runtime nothing can run
    let runtime = builder.build().expect("a current-thread runtime");
    runtime.block_on(async { world::World::new(seed, options.clone(), setup).run().await })
}
