//! The elector's loop: one candidate waits for its next attempt, a watched change of the Lease,
//! its term's deadline or a give-up, and hands each to the part that owns it:
//! `attempt` (acquire and renew: one guarded write), `release` (give a term up, release the
//! Lease), and `observe` (the bookkeeping: what the Lease showed, what a change asks for, when a
//! term ends).

mod attempt;
mod observe;
mod release;

use std::{future::Future, pin::pin};

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use tokio::{
    sync::mpsc,
    time::{Instant, sleep_until, timeout_at},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use self::observe::{Reaction, StepDown};
use super::{
    ElectorError, ElectorMetrics,
    config::LeaseConfig,
    coordinated::{Mode, Preferences},
    record::{self, Observed},
};
use crate::{
    store::{LeaseStore, StoreError},
    term::{LeadershipSender, Term},
};

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
