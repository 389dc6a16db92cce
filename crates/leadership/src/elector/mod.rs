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
mod record;
mod run;
#[cfg(test)]
mod tests;

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use kube::Client;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use self::config::{LeaseConfig, LeaseConfigError, LeaseTimings};
pub use self::coordinated::{CandidateConfig, CandidateError};
pub(crate) use self::coordinated::{KubeLeaseCandidateStore, LeaseCandidateStore};
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

/// The running elector: its leadership value, its metrics, and the means to stop it.
///
/// Give it to [`Runtime::run`](crate::Runtime::run), which returns
/// [`RuntimeError::ElectorLost`](crate::RuntimeError::ElectorLost) if the elector task ever ends
/// on its own; an app that uses the handle without a runtime must await
/// [`lost`](ElectorHandle::lost) alongside its work and stop when it completes.
///
/// Dropping the handle without [`release`](ElectorHandle::release) stops the elector without
/// releasing the lease (it then expires after LeaseDuration).
#[derive(Debug)]
#[must_use = "dropping the handle stops the elector; hand it to `Runtime::run` or watch `lost()`"]
pub struct ElectorHandle {
    leadership: Leadership,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), ElectorError>>>,
    metrics: ElectorMetrics,
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
}

/// Why the elector stopped on its own.
#[derive(Debug, thiserror::Error)]
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
    /// holder; renewals, terms and fencing are unchanged.
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
    /// of taking a free or expired Lease; it makes way when another holder is preferred.
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

    /// The configuration in use.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
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
            coordinated::Publisher::new(&self.config, coordination.config, coordination.store)
        });
        let mode = match coordination {
            Some(_) => coordinated::Mode::Coordinated,
            None => coordinated::Mode::Compete,
        };
        let candidate =
            run::Candidate::new(self.config, self.store, self.sender, self.metrics.clone())
                .with_mode(mode);
        let task = match coordination {
            Some(publisher) => {
                tokio::spawn(coordinated::run(candidate, publisher, stop.clone()).instrument(span))
            }
            None => tokio::spawn(candidate.run(stop.clone()).instrument(span)),
        };
        ElectorHandle {
            leadership: self.leadership,
            stop,
            task: Some(task),
            metrics: self.metrics,
        }
    }
}

impl std::fmt::Debug for LeaseElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// === impl ElectorHandle ===

impl ElectorHandle {
    /// A handle on leadership decided elsewhere (another election mechanism, or a test driving
    /// terms by hand through the matching [`LeadershipSender`]).
    /// Releasing it only stops the handle; the sender's owner publishes `None`.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn external(leadership: Leadership) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            stopped.cancelled().await;
            Ok(())
        });
        Self {
            leadership,
            stop,
            task: Some(task),
            metrics: ElectorMetrics::default(),
        }
    }

    /// The current leadership: `Some(term)` while leading.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The elector's counters.
    pub fn metrics(&self) -> ElectorMetrics {
        self.metrics.clone()
    }

    /// Completes only if the elector task ends without having been asked to (it never should):
    /// the caller must then stop, visibly. Cancel-safe; pending forever once the task is gone.
    #[must_use = "a lost elector must stop the process: leading without an election is unsafe"]
    pub async fn lost(&mut self) -> ElectorError {
        let Some(task) = self.task.as_mut() else {
            return std::future::pending().await;
        };
        let result = task.await;
        self.task = None;
        match result {
            Ok(Ok(())) => ElectorError::Exited,
            Ok(Err(error)) => error,
            Err(join) => ElectorError::Panicked(join.to_string()),
        }
    }

    /// Stops competing: publishes `None`, then releases the lease if this replica holds it, so
    /// that a follower can take over at once. Returns when the elector task has ended.
    pub async fn release(mut self) -> Result<(), ElectorError> {
        self.stop.cancel();
        let Some(task) = self.task.take() else {
            return Err(ElectorError::Exited);
        };
        match task.await {
            Ok(result) => result,
            Err(join) => Err(ElectorError::Panicked(join.to_string())),
        }
    }
}

impl Drop for ElectorHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
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

    /// How many times the lease watch was restarted for delivering nothing for longer than
    /// [`LeaseTimings::watch_stall_bound`].
    pub fn watch_stalls(&self) -> u64 {
        self.counters.watch_stalls.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
