//! Release: give a term up (release, then hold off so that another replica leads), and clear
//! the holder on shutdown, guarded by resourceVersion and best effort.

use tokio::time::{Instant, timeout_at};
use tracing::{debug, info, warn};

use super::{Candidate, Role, observe::StepDown};
use crate::{
    elector::{ElectorMetrics, record},
    store::{LeaseStore, StoreError},
    term::Term,
};

/// How many times a release is retried after losing a race with a concurrent write.
const RELEASE_ATTEMPTS: usize = 3;

// === impl Candidate: release ===

impl<S: LeaseStore> Candidate<S> {
    /// Gives `term` up if it is the current term: ends it, releases the lease, and takes no free
    /// lease for LeaseDuration, so that another replica leads (a replica whose term could not
    /// start would otherwise take the lease straight back).
    pub(super) async fn give_up(&mut self, term: u64) {
        if self.role.term().map(Term::id) != Some(term) {
            debug!(term, "asked to give up a term that is already over");
            return;
        }
        let hold_off = self.config.timings().lease_duration();
        ElectorMetrics::count(&self.metrics.counters.terms_given_up);
        warn!(
            term,
            ?hold_off,
            "giving the term up: releasing the lease, competing again after a hold-off"
        );
        self.step_down(StepDown::GaveUp);
        self.release().await;
        self.role = Role::Following {
            holding_off_until: Some(Instant::now() + hold_off),
        };
    }

    /// Whether this candidate still holds off after giving a term up.
    pub(super) fn holding_off(&self, now: Instant) -> bool {
        matches!(
            self.role,
            Role::Following { holding_off_until: Some(until) } if until > now
        )
    }

    /// Stops leading, then clears the holder if the record still names us, guarded by
    /// resourceVersion. Best effort: on failure the lease simply expires.
    pub(super) async fn release(&mut self) {
        let was_leading = self.role.leading();
        self.step_down(StepDown::Released);
        let named_us = self
            .observed
            .as_ref()
            .is_some_and(|observed| observed.held_by(self.config.identity()));
        if !was_leading && !named_us {
            return;
        }
        let deadline = Instant::now() + self.config.timings().retry_period();
        match timeout_at(deadline, self.release_lease()).await {
            Ok(Ok(true)) => info!("released the lease"),
            Ok(Ok(false)) => debug!("lease no longer ours; nothing to release"),
            Ok(Err(error)) => warn!(%error, "releasing the lease failed; it will expire"),
            Err(_) => warn!("releasing the lease timed out; it will expire"),
        }
    }

    pub(super) async fn release_lease(&mut self) -> Result<bool, StoreError> {
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(lease) = self.store.get().await? else {
                return Ok(false);
            };
            if record::holder(&lease) != Some(self.config.identity()) {
                return Ok(false);
            }
            match self.store.replace(self.mode.release(lease)).await {
                Ok(_) => return Ok(true),
                Err(StoreError::Conflict) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(StoreError::Conflict)
    }
}
