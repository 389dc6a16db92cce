//! Keeps this replica's LeaseCandidate present and fresh, and answers the election
//! controller's pings.
//!
//! The controller asks every candidate whose renewTime is more than a few seconds old to confirm
//! it is alive by setting `spec.pingTime`, and waits (up to 5 s) for `renewTime` to move past it
//! before electing; a candidate that does not answer is left out. So the publisher watches its
//! own object and renews at once when pinged, and otherwise renews every
//! [`RENEW_INTERVAL`] (the controller forces an election when a candidate is older than 15
//! minutes and garbage-collects it after 30).

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::coordination::v1beta1::{LeaseCandidate, LeaseCandidateSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{CandidateConfig, CandidateError, LeaseCandidateStore, OLDEST_EMULATION_VERSION};
use crate::{elector::config::LeaseConfig, store::StoreError};

/// How often the LeaseCandidate is renewed without being pinged (client-go's interval).
pub(super) const RENEW_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// First retry after a failed renewal; doubled per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How many times a renewal is retried at once after losing a race (with a ping, usually).
const CONFLICT_ATTEMPTS: usize = 3;

/// Publishes one replica's LeaseCandidate.
pub(in crate::elector) struct Publisher {
    name: String,
    namespace: String,
    lease_name: String,
    config: CandidateConfig,
    store: Arc<dyn LeaseCandidateStore>,
    /// Bound of the deletion on shutdown.
    delete_timeout: Duration,
}

// === impl Publisher ===

impl Publisher {
    pub(in crate::elector) fn new(
        lease: &LeaseConfig,
        config: CandidateConfig,
        store: Arc<dyn LeaseCandidateStore>,
    ) -> Self {
        Self {
            name: lease.identity().to_owned(),
            namespace: lease.namespace().to_owned(),
            lease_name: lease.name().to_owned(),
            config,
            store,
            delete_timeout: lease.timings().retry_period(),
        }
    }

    /// Checks that the identity can name the LeaseCandidate.
    pub(in crate::elector) fn check_identity(&self) -> Result<(), CandidateError> {
        self.config.check_identity(&self.name)
    }

    /// Creates and renews the LeaseCandidate until `stop`, then deletes it (bounded).
    pub(in crate::elector) async fn run(self, stop: CancellationToken) {
        info!(
            binary_version = %self.config.binary_version(),
            emulation_version = %self.config.emulation_version(),
            "publishing the lease candidate"
        );
        let mut changes = Some(self.store.changes());
        let mut next_renewal = Instant::now();
        let mut failures = 0u32;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = sleep_until(next_renewal) => {
                    next_renewal = match self.renew().await {
                        Ok(()) => {
                            failures = 0;
                            Instant::now() + RENEW_INTERVAL
                        }
                        Err(error) => {
                            failures = failures.saturating_add(1);
                            warn!(%error, failures, "renewing the lease candidate failed");
                            Instant::now() + backoff(failures)
                        }
                    };
                    if changes.is_none() {
                        changes = Some(self.store.changes());
                    }
                }
                change = next_change(&mut changes), if changes.is_some() => match change {
                    Some(Ok(Some(candidate))) if pinged(&candidate) => {
                        debug!("pinged by the election controller; renewing");
                        next_renewal = Instant::now();
                    }
                    Some(Ok(Some(_))) => {}
                    Some(Ok(None)) => {
                        debug!("lease candidate missing; creating it");
                        next_renewal = next_renewal.min(Instant::now());
                    }
                    Some(Err(error)) => debug!(%error, "lease candidate watch failed"),
                    None => {
                        debug!("lease candidate watch ended; restarting it at the next renewal");
                        changes = None;
                    }
                },
            }
        }
        match timeout(self.delete_timeout, self.store.delete()).await {
            Ok(Ok(())) => info!("deleted the lease candidate"),
            Ok(Err(error)) => warn!(%error, "deleting the lease candidate failed"),
            Err(_) => warn!("deleting the lease candidate timed out"),
        }
    }

    /// Creates the candidate, or renews it (our versions, renewTime now), guarded by
    /// resourceVersion; a lost race is retried at once with a fresh read.
    async fn renew(&self) -> Result<(), StoreError> {
        for _ in 0..CONFLICT_ATTEMPTS {
            let result = match self.store.get().await? {
                None => self.store.create(self.new_candidate()).await,
                Some(current) => self.store.replace(self.renewed(current)).await,
            };
            match result {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(StoreError::Conflict)
    }

    fn new_candidate(&self) -> LeaseCandidate {
        LeaseCandidate {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: self.spec(None),
        }
    }

    /// `current` with our versions and a new renewTime; the ping time is kept (the controller
    /// compares it with renewTime).
    fn renewed(&self, mut current: LeaseCandidate) -> LeaseCandidate {
        let ping_time = current.spec.ping_time.clone();
        current.spec = self.spec(ping_time);
        current
    }

    fn spec(&self, ping_time: Option<MicroTime>) -> LeaseCandidateSpec {
        LeaseCandidateSpec {
            lease_name: self.lease_name.clone(),
            binary_version: self.config.binary_version().to_owned(),
            emulation_version: Some(self.config.emulation_version().to_owned()),
            strategy: OLDEST_EMULATION_VERSION.to_owned(),
            ping_time,
            renew_time: Some(MicroTime(Timestamp::now())),
        }
    }
}

/// Whether the election controller asked the candidate to confirm it is alive and it has not
/// answered yet (pingTime later than renewTime).
pub(super) fn pinged(candidate: &LeaseCandidate) -> bool {
    let spec = &candidate.spec;
    match (&spec.ping_time, &spec.renew_time) {
        (Some(ping), Some(renew)) => ping.0 > renew.0,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

fn backoff(failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(8);
    (FIRST_BACKOFF * factor).min(MAX_BACKOFF)
}

async fn next_change(
    changes: &mut Option<BoxStream<'static, Result<Option<LeaseCandidate>, StoreError>>>,
) -> Option<Result<Option<LeaseCandidate>, StoreError>> {
    match changes {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
