//! The Lease elector: client-go's algorithm, plus faster hand-over and prompt step-down.
//!
//! - Every write is a replace guarded by resourceVersion, so two candidates never both win.
//! - Expiry is judged by the local time at which the record was seen to change.
//! - The leader renews every RetryPeriod and keeps leading through failed renewals until
//!   RenewDeadline has passed without a success (no churn on one failed call); but it steps down
//!   at once when it sees another holder with an unexpired lease (after a 409, or via its watch).
//! - Followers watch the Lease, so a released lease is taken over at once, and poll every
//!   RetryPeriod as a fallback.
//! - Each acquisition publishes a new [`Term`] on the [`Leadership`] channel.

mod config;
mod coordinated;
mod handle;
mod record;
mod run;
#[cfg(test)]
mod tests;

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use kube::Client;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use self::config::{LeaseConfig, LeaseConfigError, LeaseTimings};
pub use self::coordinated::{CandidateConfig, CandidateError};
pub(crate) use self::coordinated::{KubeLeaseCandidateStore, LeaseCandidateStore};
pub use self::handle::ElectorHandle;
use crate::{
    store::{KubeLeaseStore, LeaseStore},
    term::{Leadership, LeadershipSender},
};

/// A candidate for one Lease, not yet running. Its leadership value and metrics exist from the
/// start, so a metrics layer can hold them before the elector is spawned.
#[must_use = "an elector competes for nothing until it is spawned"]
pub struct LeaseElector {
    config: LeaseConfig,
    store: Box<dyn LeaseStore>,
    sender: LeadershipSender,
    leadership: Leadership,
    metrics: ElectorMetrics,
    /// Set for Coordinated Leader Election ([`LeaseElector::coordinated`]).
    coordination: Option<coordinated::Coordination>,
}

/// Counters of the elector, for a metrics layer.
#[derive(Clone, Debug, Default)]
pub struct ElectorMetrics {
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    acquisitions: AtomicU64,
    renew_failures: AtomicU64,
    step_downs: AtomicU64,
    watch_stalls: AtomicU64,
    terms_given_up: AtomicU64,
    preferences_declined: AtomicU64,
}

/// Why the elector stopped on its own.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ElectorError {
    /// The elector task ended without being asked to. Not retryable: exit the process, so that
    /// it is restarted, rather than keep running without an election.
    #[error("the elector task ended unexpectedly")]
    Exited,
    /// The elector task panicked. Not retryable: exit the process.
    #[error("the elector task panicked: {0}")]
    Panicked(String),
    /// Coordinated mode cannot run with this configuration (the identity cannot name a
    /// LeaseCandidate). Not retryable: fix the configuration.
    #[error(transparent)]
    Candidate(#[from] CandidateError),
}

// === impl LeaseElector ===

impl LeaseElector {
    /// A candidate for the Lease named in `config`, through the API server behind `client`.
    pub fn for_client(client: Client, config: LeaseConfig) -> Self {
        let store = KubeLeaseStore::new(
            client,
            config.namespace(),
            config.name(),
            config.timings().watch_stall_bound(),
        );
        Self::new(config, store)
    }

    /// A candidate for the Lease named in `config` under Coordinated Leader Election, through
    /// the API server behind `client`: its LeaseCandidate is named after the identity and lives
    /// in the Lease's namespace. Instead of taking a free or expired Lease, the elector publishes
    /// its LeaseCandidate and leads only when the election controller (KEP-4355) names it
    /// holder; renewals, terms and fencing are unchanged. When the controller prefers another
    /// holder, the leader makes way only if that candidate's versions are strictly older (a
    /// preference among candidates of equal versions is random, and declined).
    pub fn coordinated_for_client(
        client: Client,
        config: LeaseConfig,
        candidate: CandidateConfig,
    ) -> Self {
        let candidates = KubeLeaseCandidateStore::new(
            client.clone(),
            config.namespace(),
            config.identity(),
            config.timings().watch_stall_bound(),
        );
        Self::for_client(client, config).coordinated(candidate, candidates)
    }

    /// A candidate for the Lease behind `store` (`config` was validated when it was built).
    pub(crate) fn new(config: LeaseConfig, store: impl LeaseStore) -> Self {
        let (sender, leadership) = watch::channel(None);
        Self {
            config,
            store: Box::new(store),
            sender,
            leadership,
            metrics: ElectorMetrics::default(),
            coordination: None,
        }
    }

    /// Switches to Coordinated Leader Election (KEP-4355; the API server runs the election
    /// controller when its `CoordinatedLeaderElection` feature gate and the
    /// `coordination.k8s.io/v1beta1` API are on): the elector publishes its LeaseCandidate
    /// through `candidates` and leads only when the election controller names it holder, instead
    /// of taking a free or expired Lease; it makes way when another holder of strictly older
    /// versions is preferred.
    /// Renewals, terms and fencing are unchanged.
    ///
    /// The identity names the LeaseCandidate, so it must be a valid name
    /// ([`CandidateConfig::check_identity`]); if it is not, the spawned elector ends at once
    /// with [`ElectorError::Candidate`] (reported by [`ElectorHandle::lost`]).
    pub(crate) fn coordinated(
        mut self,
        candidate: CandidateConfig,
        candidates: impl LeaseCandidateStore,
    ) -> Self {
        self.coordination = Some(coordinated::Coordination {
            config: candidate,
            store: Box::new(candidates),
        });
        self
    }

    /// The leadership value this elector will publish: `None` until it acquires the lease.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The counters this elector will update.
    pub fn metrics(&self) -> ElectorMetrics {
        self.metrics.clone()
    }

    /// Starts competing for the lease on a new task.
    pub fn spawn(self) -> ElectorHandle {
        let stop = CancellationToken::new();
        let span = tracing::info_span!(
            "elector",
            lease = %self.config.name(),
            identity = %self.config.identity(),
        );
        let coordination = self.coordination.map(|coordination| {
            // The publisher writes our LeaseCandidate; the elector reads the preferred one's.
            let candidates: Arc<dyn LeaseCandidateStore> = Arc::from(coordination.store);
            let versions = coordination.config.versions().clone();
            let preferences =
                coordinated::Preferences::new(versions, self.config.name(), candidates.clone());
            let publisher =
                coordinated::Publisher::new(&self.config, coordination.config, candidates);
            (publisher, preferences)
        });
        let (give_up, terms_to_give_up) = mpsc::unbounded_channel();
        let candidate =
            run::Candidate::new(self.config, self.store, self.sender, self.metrics.clone())
                .giving_up(terms_to_give_up);
        let task = match coordination {
            Some((publisher, preferences)) => {
                let candidate = candidate.coordinated(preferences);
                tokio::spawn(coordinated::run(candidate, publisher, stop.clone()).instrument(span))
            }
            None => tokio::spawn(candidate.run(stop.clone()).instrument(span)),
        };
        ElectorHandle::new(self.leadership, stop, task, give_up, self.metrics)
    }
}

impl std::fmt::Debug for LeaseElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// === impl ElectorMetrics ===

impl ElectorMetrics {
    /// How many terms were started (lease acquisitions).
    pub fn acquisitions(&self) -> u64 {
        self.counters.acquisitions.load(Ordering::Relaxed)
    }

    /// How many renewal or acquisition attempts failed while leading.
    pub fn renew_failures(&self) -> u64 {
        self.counters.renew_failures.load(Ordering::Relaxed)
    }

    /// How many terms ended other than by release (deadline passed or another holder seen).
    pub fn step_downs(&self) -> u64 {
        self.counters.step_downs.load(Ordering::Relaxed)
    }

    /// How many times the lease watch was restarted for delivering nothing for longer than its
    /// stall bound (twice LeaseDuration: a healthy watch of a renewed Lease is never silent
    /// that long).
    pub fn watch_stalls(&self) -> u64 {
        self.counters.watch_stalls.load(Ordering::Relaxed)
    }

    /// How many terms were given up ([`ElectorHandle::give_up`]: a runtime whose term's
    /// preparation timed out, say): each released the Lease and waited LeaseDuration before
    /// competing again.
    pub fn terms_given_up(&self) -> u64 {
        self.counters.terms_given_up.load(Ordering::Relaxed)
    }

    /// Coordinated mode: how many times the holder kept the Lease although the election
    /// controller preferred another candidate that is not strictly older (the same versions, a
    /// newer one, or one whose LeaseCandidate is gone); counted once per term and preferred
    /// candidate.
    pub fn preferences_declined(&self) -> u64 {
        self.counters.preferences_declined.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
