//! The elector's loop.

use std::{future::Future, pin::pin};

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use tokio::{
    sync::mpsc,
    time::{Instant, sleep_until, timeout_at},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    ElectorError, ElectorMetrics,
    config::LeaseConfig,
    coordinated::{self, Decision, Mode, Preferences, Weighed},
    record::{self, Observed},
};
use crate::{
    store::{LeaseStore, StoreError},
    term::{FencingToken, LeadershipSender, Term},
};

/// How many times a release is retried after losing a race with a concurrent write.
const RELEASE_ATTEMPTS: usize = 3;

/// One candidate's state: what it observed of the lease, and its term while leading.
pub(super) struct Candidate<S> {
    config: LeaseConfig,
    store: S,
    sender: LeadershipSender,
    metrics: ElectorMetrics,
    observed: Option<Observed>,
    /// Leading a term or following, with what only that role keeps.
    role: Role,
    /// The resourceVersion of our last successful write (of this process, in any term).
    written_version: Option<String>,
    /// When the lease was deleted while another holder's term ran: when that term would have
    /// expired. Until then we do not re-create the lease (see [`Candidate::observe`]).
    vanished_until: Option<Instant>,
    /// When the API server last showed us the lease (or its absence): a read, a write or a
    /// watched event.
    last_observed_at: Instant,
    /// Whether this candidate takes the lease itself or waits to be named by the API server's
    /// election controller (Coordinated Leader Election).
    mode: Mode,
    /// Coordinated mode: weighs the controller's preference for another holder.
    preferences: Option<Preferences>,
    /// Terms the app gives up ([`ElectorHandle::give_up`](super::ElectorHandle::give_up)).
    give_ups: Option<mpsc::UnboundedReceiver<u64>>,
}

/// What the candidate is doing, with the state that belongs to it.
enum Role {
    /// Not leading.
    Following {
        /// After giving a term up: until when this candidate takes no free lease, so that
        /// another replica can lead.
        holding_off_until: Option<Instant>,
    },
    /// Leading `term`, published on the leadership value.
    Leading {
        term: Term,
        /// Whether the watch has delivered our last write (so later events are newer than it).
        watch_caught_up: bool,
    },
}

/// The watch of the lease; restarted at the next poll when it ends, and at once when it has
/// delivered nothing for [`LeaseTimings::watch_stall_bound`](super::LeaseTimings::watch_stall_bound)
/// (twice LeaseDuration).
struct Watch {
    changes: BoxStream<'static, Result<Option<Lease>, StoreError>>,
    open: bool,
    /// When the stream was opened or last delivered a change.
    last_seen: Instant,
}

/// What a watched change asks the loop to do.
enum Reaction {
    Nothing,
    /// The lease is free (released or deleted): try to take it now.
    AttemptNow,
    /// While leading, the watch showed a record without us that may predate our last write:
    /// confirm with a read, step down if so (or if the read fails).
    ConfirmHolder,
    /// Coordinated mode, while leading: the election controller now prefers another holder;
    /// read that candidate and make way if it is strictly older.
    WeighPreference,
}

/// Why the leader stops leading.
#[derive(Clone, Copy, Debug)]
enum StepDown {
    RenewDeadlinePassed,
    AnotherHolder,
    LeaseCleared,
    /// A record without us was seen (409 or watch) and could not be re-read.
    Unconfirmed,
    Released,
    /// The app gave the term up ([`ElectorHandle::give_up`](super::ElectorHandle::give_up)).
    GaveUp,
    /// Coordinated mode: the election controller prefers another holder.
    Yielded,
}

// === impl Candidate ===

impl<S: LeaseStore> Candidate<S> {
    pub(super) fn new(
        config: LeaseConfig,
        store: S,
        sender: LeadershipSender,
        metrics: ElectorMetrics,
    ) -> Self {
        Self {
            config,
            store,
            sender,
            metrics,
            observed: None,
            role: Role::FOLLOWING,
            written_version: None,
            vanished_until: None,
            last_observed_at: Instant::now(),
            mode: Mode::Compete,
            preferences: None,
            give_ups: None,
        }
    }

    /// Reads the terms to give up from `give_ups`.
    pub(super) fn giving_up(mut self, give_ups: mpsc::UnboundedReceiver<u64>) -> Self {
        self.give_ups = Some(give_ups);
        self
    }

    /// Switches to [`Mode::Coordinated`]: wait to be named holder, and weigh the election
    /// controller's preferences for another holder with `preferences`.
    pub(super) fn coordinated(mut self, preferences: Preferences) -> Self {
        self.mode = Mode::Coordinated;
        self.preferences = Some(preferences);
        self
    }

    /// Competes until `stop` is cancelled, then releases the lease if held.
    pub(super) async fn run(mut self, stop: CancellationToken) -> Result<(), ElectorError> {
        info!("competing for the lease");

        let mut watch = Watch::start(&self.store);
        let stall_bound = self.config.timings().watch_stall_bound();
        let mut next_attempt = Instant::now();
        let mut give_ups = self.give_ups.take();
        loop {
            let step_down_at = self.step_down_at();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                Some(term) = next_give_up(&mut give_ups) => self.give_up(term).await,
                () = sleep_until(step_down_at.unwrap_or(next_attempt)), if step_down_at.is_some() => {
                    self.check_deadline(Instant::now());
                }
                () = sleep_until(next_attempt) => {
                    let started = Instant::now();
                    let seen = self.attempt_watching(&stop, &mut watch, started).await;
                    next_attempt = self.next_attempt_after(started);
                    if let Some(lease) = seen {
                        self.on_change(lease, &stop, &mut next_attempt).await;
                    }
                    if !watch.open {
                        watch = Watch::start(&self.store);
                    }
                }
                () = sleep_until(watch.last_seen + stall_bound), if watch.open => {
                    // A connection that stays open but passes nothing (a proxy or NAT that lost
                    // it) would hide a release or a deletion of the lease for good.
                    ElectorMetrics::count(&self.metrics.counters.watch_stalls);
                    warn!(
                        silent_for = ?stall_bound,
                        "the lease watch delivered nothing for longer than its bound; restarting it",
                    );
                    watch = Watch::start(&self.store);
                }
                change = watch.next(), if watch.open => {
                    if let Some(lease) = change {
                        self.on_change(lease, &stop, &mut next_attempt).await;
                    }
                }
            }
        }
        self.release().await;
        Ok(())
    }

    /// Runs an attempt while still following the watch: a leader that sees a record without it
    /// must not wait for a slow (or hanging) request to finish before it stops acting, so such an
    /// event abandons the attempt. Returns the last change seen meanwhile, to be handled next.
    async fn attempt_watching(
        &mut self,
        stop: &CancellationToken,
        watch: &mut Watch,
        started: Instant,
    ) -> Option<Option<Lease>> {
        let leading = self.role.leading();
        let identity = self.config.identity().to_owned();
        let mut seen = None;
        let attempt = self.bounded(stop, started, |me| me.attempt(started));
        let mut attempt = pin!(attempt);
        loop {
            tokio::select! {
                biased;
                _ = &mut attempt => return seen,
                change = watch.next(), if watch.open => {
                    let Some(lease) = change else { continue };
                    let names_us = lease.as_ref().and_then(record::holder) == Some(identity.as_str());
                    seen = Some(lease);
                    if leading && !names_us {
                        debug!("lease changed away from us during a request; abandoning it");
                        return seen;
                    }
                }
            }
        }
    }

    /// Handles a watched change: take a free lease now; while leading, step down on a record
    /// without us (at once if it is newer than our last write, after a confirming read if not).
    async fn on_change(
        &mut self,
        lease: Option<Lease>,
        stop: &CancellationToken,
        next_attempt: &mut Instant,
    ) {
        match self.react(lease, Instant::now()) {
            Reaction::Nothing => {}
            Reaction::AttemptNow => *next_attempt = Instant::now(),
            Reaction::ConfirmHolder => {
                let started = Instant::now();
                let confirmed = self.bounded(stop, started, |me| me.confirm_holder()).await;
                if !confirmed {
                    // The API server showed a record without us and cannot be asked whether
                    // that is still so: assume it is.
                    self.step_down(StepDown::Unconfirmed);
                }
            }
            Reaction::WeighPreference => {
                let started = Instant::now();
                self.bounded(stop, started, |me| me.weigh_watched()).await;
                if !self.role.leading() {
                    // Yielded (or the write clearing the holder failed): look again now.
                    *next_attempt = Instant::now();
                }
            }
        }
    }

    /// Runs one attempt; returns whether it ran to its end. While leading it may take until the
    /// step-down deadline: a slow API server that answers a renewal within RenewDeadline keeps
    /// the term, while a hanging request never delays the step-down. A renewal still running
    /// after RetryPeriod is counted as a renew failure then (a blackholed network shows only as
    /// slowness). A candidate's attempt may take RenewDeadline: an acquisition slower than
    /// RetryPeriod still completes.
    ///
    /// Cutting every attempt at RetryPeriod instead left a uniformly slow API server (a read and
    /// a write slower than RetryPeriod together, well within RenewDeadline) without any leader:
    /// every renewal and every acquisition was abandoned before its answer arrived.
    async fn bounded<'a, F, Fut>(
        &'a mut self,
        stop: &CancellationToken,
        started: Instant,
        f: F,
    ) -> bool
    where
        F: FnOnce(&'a mut Self) -> Fut,
        Fut: Future<Output = ()> + 'a,
    {
        let slow_at = started + self.config.timings().retry_period();
        let until = self
            .step_down_at()
            .unwrap_or(started + self.config.timings().renew_deadline());
        // Taken now: `f` holds `self` until the end.
        let term = self.role.term().map(Term::id);
        let metrics = self.metrics.clone();
        let count_failure = || ElectorMetrics::count(&metrics.counters.renew_failures);
        let attempt = timeout_at(until, f(self));
        let mut attempt = pin!(attempt);
        let mut counted = false;
        let result = loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return false,
                () = sleep_until(slow_at), if term.is_some() && !counted => {
                    counted = true;
                    count_failure();
                    warn!(term, "renewing the lease takes longer than the retry period");
                }
                result = &mut attempt => break result,
            }
        };
        match (result.is_err(), term) {
            (true, Some(term)) => {
                if !counted {
                    count_failure();
                }
                warn!(term, "renewing the lease timed out");
            }
            (true, None) => debug!("lease request timed out"),
            (false, _) => {}
        }
        result.is_ok()
    }

    /// Reads the lease, then takes it (free or expired), renews it (ours), or leaves it (held by
    /// another, stepping down at once if we were leading).
    async fn attempt(&mut self, started: Instant) {
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
    async fn confirm_holder(&mut self) {
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

    fn react(&mut self, lease: Option<Lease>, now: Instant) -> Reaction {
        if self.older_than_observed(lease.as_ref()) {
            // A watch that lags may deliver a record older than one a poll has shown since
            // (the simulation found a follower that took a stale "released" record for the
            // current one and re-created the deleted Lease beside the new holder).
            debug!("ignoring a watched lease record older than the one last read");
            return Reaction::Nothing;
        }
        let previously_preferred = self
            .observed
            .as_ref()
            .and_then(|observed| coordinated::preferred_holder(&observed.lease))
            .map(str::to_owned);
        let version = lease
            .as_ref()
            .and_then(|lease| lease.metadata.resource_version.clone());
        if version.is_some() && version == self.written_version {
            // Watch events arrive in order: every later event is newer than our last write.
            if let Role::Leading {
                watch_caught_up, ..
            } = &mut self.role
            {
                *watch_caught_up = true;
            }
        }
        self.observe(lease, now);
        let leading = self.role.leading();
        if let Some(reaction) = self.react_coordinated(leading, previously_preferred.as_deref()) {
            return reaction;
        }
        let holder = self.observed.as_ref().and_then(Observed::holder);
        let named = holder == Some(self.config.identity());
        match (leading, holder, named) {
            (false, None, _) if self.vanished_claim_runs(now) => Reaction::Nothing,
            (false, None, _) => Reaction::AttemptNow,
            (false, Some(_), _) | (true, _, true) => Reaction::Nothing,
            // A record without us, newer than our last write: the lease is lost.
            (true, _, false) if self.role.watch_caught_up() => {
                self.step_down_unless_named();
                Reaction::Nothing
            }
            // Maybe an event from before our last write: ask the API server.
            (true, _, false) => Reaction::ConfirmHolder,
        }
    }

    /// Coordinated mode: a candidate never takes a free or expired lease; it renews at once
    /// when the election controller names it (the controller's record is valid for only a few
    /// seconds), and a leader weighs at once a preference for another holder that was not on
    /// the record before (`previously_preferred`); one that stays is weighed again at each
    /// renewal, so that our own renewals do not add reads. `None` leaves the usual checks
    /// (another holder, no holder) to [`react`](Self::react).
    fn react_coordinated(
        &mut self,
        leading: bool,
        previously_preferred: Option<&str>,
    ) -> Option<Reaction> {
        if self.mode != Mode::Coordinated {
            return None;
        }
        let lease = self.observed.as_ref().map(|observed| &observed.lease);
        let decision = lease.map(|lease| self.mode.decide(lease, self.config.identity()));
        let preference_changed =
            lease.and_then(coordinated::preferred_holder) != previously_preferred;
        match (leading, decision) {
            (true, Some(Decision::OtherPreferred)) if preference_changed => {
                Some(Reaction::WeighPreference)
            }
            (true, _) => None,
            (false, Some(Decision::Claim | Decision::OtherPreferred)) => Some(Reaction::AttemptNow),
            (false, _) => Some(Reaction::Nothing),
        }
    }

    /// Coordinated mode: how to answer the preferred holder of `lease` (which names us); a
    /// candidate without [`Preferences`] yields, as the controller asks.
    async fn weigh_preference(&mut self, lease: &Lease) -> Weighed {
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
    async fn weigh_watched(&mut self) {
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
    async fn yield_lease(&mut self, lease: Lease) {
        self.step_down(StepDown::Yielded);
        match self.store.replace(self.mode.release(lease)).await {
            Ok(released) => {
                info!("yielded the lease to the preferred holder");
                self.observe(Some(released), Instant::now());
            }
            Err(error) => debug!(%error, "yielding the lease failed; retrying at the next attempt"),
        }
    }

    /// While leading, a record that does not name us (another holder, no holder, or no lease)
    /// means the lease is not ours any more, whatever our last renewal says: the term ends now.
    /// If the lease is free, a later guarded write may start a new term.
    fn step_down_unless_named(&mut self) {
        if !self.role.leading() {
            return;
        }
        let named = self
            .observed
            .as_ref()
            .is_some_and(|observed| observed.held_by(self.config.identity()));
        if !named {
            let reason = if self.held_by_other(Instant::now()) {
                StepDown::AnotherHolder
            } else {
                StepDown::LeaseCleared
            };
            self.step_down(reason);
        }
    }

    /// Records what the API server showed. A lease deleted while a term may run does not end
    /// that term at once: the holder may not know yet (its watch may lag or be reconnecting)
    /// and keeps acting until RenewDeadline after its last successful renewal, which came
    /// before the deletion. So a candidate that sees the lease gone waits RenewDeadline from
    /// then before re-creating it, unless it leads and the record it last saw named it. The holder
    /// itself, told by its watch or its next poll, steps down and may re-create the lease at
    /// once. A release (holder cleared, written by the holder) is still taken at once. A
    /// candidate that saw nothing for more than two RetryPeriods (its requests failing) and then
    /// finds no lease waits as well: a record may have come and gone unseen.
    fn observe(&mut self, lease: Option<Lease>, now: Instant) {
        // Blind for a while (our reads failing, a cut): someone may have created the lease,
        // held it and had it deleted again without our seeing any of it (seed 1160).
        let blind = now.saturating_duration_since(self.last_observed_at)
            > 2 * self.config.timings().retry_period();
        self.last_observed_at = now;
        match (&lease, &self.observed) {
            (None, None) if self.config.waits_after_a_deleted_lease() && blind => {
                // As after a deletion seen (below): whoever held a record we never saw has
                // renewed it at the latest when it was deleted, before now.
                self.vanished_until = Some(now + self.config.timings().renew_deadline());
            }
            (None, Some(previous))
                if self.config.waits_after_a_deleted_lease()
                    && (!self.role.leading()
                        || record::holder(&previous.lease) != Some(self.config.identity())) =>
            {
                // Someone may hold it whom we did not see (our reads failing, our watch
                // stalled: the record we last saw may be old, released or look expired), and a
                // holder may have renewed after we last looked: only the deletion bounds its
                // last renewal, so its claim runs RenewDeadline from now, when we learn of the
                // deletion. (Counting from our last sight of the record let a follower with a
                // stale view lead beside the holder; found by the simulation, seed 724. A
                // record naming us is no exception once our term has ended: someone may have
                // taken the Lease since; seed 779.)
                self.vanished_until = Some(now + self.config.timings().renew_deadline());
            }
            (Some(_), _) => self.vanished_until = None,
            (None, _) => {}
        }
        self.observed = lease.map(|lease| Observed::update(self.observed.take(), lease, now));
    }

    /// Whether `lease` (from the watch) is older than the record last observed: both carry
    /// resourceVersions the API server gave (numbers from its storage, increasing), and the
    /// watched one is smaller. Unparsable versions are never called older.
    fn older_than_observed(&self, lease: Option<&Lease>) -> bool {
        let version = |lease: &Lease| {
            lease
                .metadata
                .resource_version
                .as_deref()
                .and_then(|version| version.parse::<u64>().ok())
        };
        let (Some(watched), Some(observed)) = (
            lease.and_then(version),
            self.observed
                .as_ref()
                .and_then(|observed| version(&observed.lease)),
        ) else {
            return false;
        };
        watched < observed
    }

    /// Whether a deleted lease's last holder may still be acting (see [`Candidate::observe`]).
    fn vanished_claim_runs(&self, now: Instant) -> bool {
        self.vanished_until.is_some_and(|until| until > now)
    }

    /// Whether someone else holds an unexpired lease. An earlier process of ours counts as
    /// someone else (competing mode): a replica that crashed and was restarted under the same
    /// identity (a container restarted in its pod) finds the Lease naming itself, while writes
    /// the earlier process sent may still be on their way; it waits for the record to expire,
    /// as any other replica would, rather than start a term at once beside them.
    fn held_by_other(&self, now: Instant) -> bool {
        self.observed.as_ref().is_some_and(|observed| {
            observed.held_by_other(&self.config, now)
                || (self.named_by_earlier_process() && now < observed.expires_at(&self.config))
        })
    }

    /// Whether the lease names us although this process has never written it (competing mode;
    /// in coordinated mode the election controller names us, and that is how a term starts).
    fn named_by_earlier_process(&self) -> bool {
        self.mode == Mode::Compete
            && self.written_version.is_none()
            && self
                .observed
                .as_ref()
                .is_some_and(|observed| observed.held_by(self.config.identity()))
    }

    /// A write of ours succeeded: `sent_at` (taken before the request) starts a new term or
    /// extends the current one.
    fn renewed(&mut self, lease: Lease, sent_at: Instant) {
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

    fn failed(&mut self, error: &StoreError) {
        if let Some(term) = self.role.term() {
            ElectorMetrics::count(&self.metrics.counters.renew_failures);
            warn!(term = term.id(), %error, "renewing the lease failed");
        } else {
            debug!(%error, "lease request failed");
        }
    }

    /// While leading: when the term ends unless a renewal succeeds first.
    fn step_down_at(&self) -> Option<Instant> {
        let term = self.role.term()?;
        Some(term.last_renewed_at() + self.config.timings().renew_deadline())
    }

    fn check_deadline(&mut self, now: Instant) {
        if self.step_down_at().is_some_and(|deadline| deadline <= now) {
            self.step_down(StepDown::RenewDeadlinePassed);
        }
    }

    fn step_down(&mut self, reason: StepDown) {
        let Some(term) = self.role.end_term() else {
            return;
        };
        if !matches!(
            reason,
            StepDown::Released | StepDown::Yielded | StepDown::GaveUp
        ) {
            ElectorMetrics::count(&self.metrics.counters.step_downs);
        }
        warn!(term = term.id(), ?reason, "stopped leading");
        self.sender.send_replace(None);
    }

    /// After an attempt started at `started`: the next poll, or the observed expiry if sooner.
    fn next_attempt_after(&mut self, started: Instant) -> Instant {
        self.check_deadline(Instant::now());
        let next = started + self.config.timings().retry_period();
        // A coordinated candidate never takes an expired or vanished lease: nothing to do then.
        if self.mode == Mode::Coordinated {
            return next;
        }
        // Wake early for an expiry still ahead of this attempt; one already behind it was
        // tried just now, and retrying at once would spin while requests fail fast (a refused
        // connection), as the simulation found.
        let sooner = |deadline: Instant| {
            if deadline > started {
                next.min(deadline)
            } else {
                next
            }
        };
        match (&self.observed, self.vanished_until) {
            (Some(observed), _) if !self.role.leading() && observed.holder().is_some() => {
                sooner(observed.expires_at(&self.config))
            }
            (None, Some(until)) if !self.role.leading() && until > Instant::now() => sooner(until),
            _ => next,
        }
    }

    /// Gives `term` up if it is the current term: ends it, releases the lease, and takes no free
    /// lease for LeaseDuration, so that another replica leads (a replica whose term could not
    /// start would otherwise take the lease straight back).
    async fn give_up(&mut self, term: u64) {
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
    fn holding_off(&self, now: Instant) -> bool {
        matches!(
            self.role,
            Role::Following { holding_off_until: Some(until) } if until > now
        )
    }

    /// Stops leading, then clears the holder if the record still names us, guarded by
    /// resourceVersion. Best effort: on failure the lease simply expires.
    async fn release(&mut self) {
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

    async fn release_lease(&mut self) -> Result<bool, StoreError> {
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

/// The next term to give up; pending forever without a receiver or once every sender is gone.
async fn next_give_up(give_ups: &mut Option<mpsc::UnboundedReceiver<u64>>) -> Option<u64> {
    match give_ups {
        Some(receiver) => match receiver.recv().await {
            Some(term) => Some(term),
            None => {
                *give_ups = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

// === impl Role ===

impl Role {
    /// Following, not holding off.
    const FOLLOWING: Self = Self::Following {
        holding_off_until: None,
    };

    fn leading(&self) -> bool {
        matches!(self, Self::Leading { .. })
    }

    /// The term led, if any.
    fn term(&self) -> Option<&Term> {
        match self {
            Self::Leading { term, .. } => Some(term),
            Self::Following { .. } => None,
        }
    }

    /// Leading: follows from now on (not holding off) and returns the term that ended.
    /// Following: stays as it is.
    fn end_term(&mut self) -> Option<Term> {
        match std::mem::replace(self, Self::FOLLOWING) {
            Self::Leading { term, .. } => Some(term),
            following @ Self::Following { .. } => {
                *self = following;
                None
            }
        }
    }

    /// Whether the watch has delivered our last write of the term led (false while following).
    fn watch_caught_up(&self) -> bool {
        matches!(
            self,
            Self::Leading {
                watch_caught_up: true,
                ..
            }
        )
    }
}

// === impl Watch ===

impl Watch {
    fn start<S: LeaseStore>(store: &S) -> Self {
        Self {
            changes: store.changes(),
            open: true,
            last_seen: Instant::now(),
        }
    }

    /// The next change; `None` for an error (logged) or the end of the stream (then closed).
    async fn next(&mut self) -> Option<Option<Lease>> {
        match self.changes.next().await {
            Some(Ok(lease)) => {
                self.last_seen = Instant::now();
                Some(lease)
            }
            Some(Err(error)) => {
                debug!(%error, "lease watch failed; polling continues");
                None
            }
            None => {
                debug!("lease watch ended; restarting it at the next poll");
                self.open = false;
                None
            }
        }
    }
}

impl<S> Drop for Candidate<S> {
    fn drop(&mut self) {
        // However the task ends (even aborted), nobody may go on believing we lead.
        self.sender.send_replace(None);
    }
}
