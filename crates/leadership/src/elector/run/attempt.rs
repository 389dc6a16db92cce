//! Acquire and renew: one attempt reads the Lease, then takes it (free or expired), renews it
//! (ours) or leaves it (another's), each write a replace guarded by resourceVersion; and, in
//! coordinated mode, makes way for a preferred holder.

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Candidate, Role, observe::StepDown};
use crate::{
    elector::{
        ElectorMetrics,
        coordinated::{self, Decision, Mode, Weighed},
        record,
    },
    store::{LeaseStore, StoreError},
    term::{FencingToken, Term},
};

// === impl Candidate: acquire and renew ===

impl<S: LeaseStore> Candidate<S> {
    /// Reads the lease, then takes it (free or expired), renews it (ours), or leaves it (held by
    /// another, stepping down at once if we were leading).
    pub(super) async fn attempt(&mut self, started: Instant) {
        let current = match self.store.get().await {
            Ok(current) => current,
            Err(error) => return self.failed(&error),
        };
        self.observe(current.clone(), Instant::now());
        self.step_down_unless_named();
        if !self.role.leading() && self.holding_off(Instant::now()) {
            return;
        }
        let Some(lease) = current else {
            // In coordinated mode the election controller creates the lease.
            if self.mode == Mode::Coordinated || self.vanished_claim_runs(Instant::now()) {
                return;
            }
            let lease = record::new_lease(&self.config);
            return match self.store.create(lease).await {
                Ok(created) => self.renewed(created, started),
                Err(StoreError::Conflict) => self.confirm_holder().await,
                Err(error) => self.failed(&error),
            };
        };
        if self.held_by_other(Instant::now()) {
            return;
        }
        let claimed = match self.mode.decide(&lease, self.config.identity()) {
            Decision::Claim if self.mode == Mode::Coordinated => {
                coordinated::claim_named(lease, &self.config, !self.role.leading())
            }
            Decision::Claim if self.named_by_earlier_process() => {
                record::claim_from_earlier_process(lease, &self.config)
            }
            Decision::Claim => record::claim(lease, &self.config),
            Decision::Wait => return,
            Decision::OtherPreferred => match self.weigh_preference(&lease).await {
                Weighed::Yield => return self.yield_lease(lease).await,
                Weighed::Keep => {
                    coordinated::claim_named(lease, &self.config, !self.role.leading())
                }
                // Neither renew nor yield: a failed renewal, retried at the next attempt. Safe
                // both ways: while our record is valid the controller names nobody else, and if
                // reads keep failing our term ends at RenewDeadline and the controller elects.
                Weighed::Unread(error) => return self.failed(&error),
            },
        };
        match self.store.replace(claimed).await {
            Ok(replaced) => self.renewed(replaced, started),
            Err(StoreError::Conflict) => self.confirm_holder().await,
            Err(error) => self.failed(&error),
        }
    }

    /// Re-reads the lease after a lost race or a watched change naming another holder (or none),
    /// and steps down at once if the record no longer names us.
    pub(super) async fn confirm_holder(&mut self) {
        match self.store.get().await {
            Ok(current) => {
                self.observe(current, Instant::now());
                self.step_down_unless_named();
            }
            Err(error) => {
                // Someone else wrote the lease (a 409, or a watched record without us) and we
                // cannot read what they wrote: the grace for unreachable APIs does not apply to a
                // possible definite loss, so stop acting.
                self.failed(&error);
                self.step_down(StepDown::Unconfirmed);
            }
        }
    }

    /// A write of ours succeeded: `sent_at` (taken before the request) starts a new term or
    /// extends the current one.
    pub(super) fn renewed(&mut self, lease: Lease, sent_at: Instant) {
        let token = lease.spec.as_ref().map(|spec| FencingToken {
            holder_identity: spec.holder_identity.clone().unwrap_or_default(),
            lease_transitions: spec.lease_transitions.unwrap_or(0),
        });
        self.written_version = lease.metadata.resource_version.clone();
        self.observe(Some(lease), Instant::now());
        match &mut self.role {
            Role::Leading {
                term,
                watch_caught_up,
            } => {
                *watch_caught_up = false;
                term.record_renewal(sent_at);
                debug!(term = term.id(), "renewed the lease");
            }
            Role::Following { .. } => {
                let mut term = Term::new(sent_at, self.config.timings().renew_deadline());
                if let Some(token) = token {
                    term = term.with_token(token);
                }
                ElectorMetrics::count(&self.metrics.counters.acquisitions);
                info!(term = term.id(), "acquired the lease; leading");
                self.role = Role::Leading {
                    term: term.clone(),
                    watch_caught_up: false,
                };
                self.sender.send_replace(Some(term));
            }
        }
    }

    pub(super) fn failed(&mut self, error: &StoreError) {
        if let Some(term) = self.role.term() {
            ElectorMetrics::count(&self.metrics.counters.renew_failures);
            warn!(term = term.id(), %error, "renewing the lease failed");
        } else {
            debug!(%error, "lease request failed");
        }
    }

    /// Coordinated mode: how to answer the preferred holder of `lease` (which names us); a
    /// candidate without [`Preferences`] yields, as the controller asks.
    pub(super) async fn weigh_preference(&mut self, lease: &Lease) -> Weighed {
        let Some(preferred) = coordinated::preferred_holder(lease) else {
            return Weighed::Keep;
        };
        let term = self.role.term().map(Term::id);
        match self.preferences.as_mut() {
            Some(preferences) => {
                preferences
                    .weigh(lease, preferred, term, &self.metrics)
                    .await
            }
            None => Weighed::Yield,
        }
    }

    /// Coordinated mode, leading: the watch showed a new preferred holder. Make way now if the
    /// preference follows from the versions; otherwise keep leading (the next renewal weighs it
    /// again).
    pub(super) async fn weigh_watched(&mut self) {
        let Some(lease) = self
            .observed
            .as_ref()
            .map(|observed| observed.lease.clone())
        else {
            return;
        };
        match self.weigh_preference(&lease).await {
            Weighed::Yield => self.yield_lease(lease).await,
            Weighed::Keep => {}
            Weighed::Unread(error) => {
                debug!(%error, "reading the preferred candidate failed; weighing it at the next renewal");
            }
        }
    }

    /// Coordinated mode: we make way for the preferred holder ([`Weighed::Yield`]), so stop
    /// leading, then clear the holder (guarded by resourceVersion) so that the controller names
    /// the preferred one at once instead of waiting for our record to expire. The term ends
    /// before the write.
    pub(super) async fn yield_lease(&mut self, lease: Lease) {
        self.step_down(StepDown::Yielded);
        match self.store.replace(self.mode.release(lease)).await {
            Ok(released) => {
                info!("yielded the lease to the preferred holder");
                self.observe(Some(released), Instant::now());
            }
            Err(error) => debug!(%error, "yielding the lease failed; retrying at the next attempt"),
        }
    }
}
