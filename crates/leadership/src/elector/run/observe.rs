//! The candidate's bookkeeping, no I/O: what the API server showed of the Lease (and when), what
//! a watched change asks the loop to do, whether another holder's claim still runs, and when
//! (and why) a term ends.

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Candidate, Role};
use crate::{
    elector::{
        ElectorMetrics,
        coordinated::{self, Decision, Mode},
        record::{self, Observed},
    },
    store::LeaseStore,
};

/// What a watched change asks the loop to do.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reaction {
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
pub(super) enum StepDown {
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

// === impl Candidate: bookkeeping ===

impl<S: LeaseStore> Candidate<S> {
    pub(super) fn react(&mut self, lease: Option<Lease>, now: Instant) -> Reaction {
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
    pub(super) fn react_coordinated(
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

    /// While leading, a record that does not name us (another holder, no holder, or no lease)
    /// means the lease is not ours any more, whatever our last renewal says: the term ends now.
    /// If the lease is free, a later guarded write may start a new term.
    pub(super) fn step_down_unless_named(&mut self) {
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
    pub(super) fn observe(&mut self, lease: Option<Lease>, now: Instant) {
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
    pub(super) fn older_than_observed(&self, lease: Option<&Lease>) -> bool {
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
    pub(super) fn vanished_claim_runs(&self, now: Instant) -> bool {
        self.vanished_until.is_some_and(|until| until > now)
    }

    /// Whether someone else holds an unexpired lease. An earlier process of ours counts as
    /// someone else (competing mode): a replica that crashed and was restarted under the same
    /// identity (a container restarted in its pod) finds the Lease naming itself, while writes
    /// the earlier process sent may still be on their way; it waits for the record to expire,
    /// as any other replica would, rather than start a term at once beside them.
    pub(super) fn held_by_other(&self, now: Instant) -> bool {
        self.observed.as_ref().is_some_and(|observed| {
            observed.held_by_other(&self.config, now)
                || (self.named_by_earlier_process() && now < observed.expires_at(&self.config))
        })
    }

    /// Whether the lease names us although this process has never written it (competing mode;
    /// in coordinated mode the election controller names us, and that is how a term starts).
    pub(super) fn named_by_earlier_process(&self) -> bool {
        self.mode == Mode::Compete
            && self.written_version.is_none()
            && self
                .observed
                .as_ref()
                .is_some_and(|observed| observed.held_by(self.config.identity()))
    }

    /// While leading: when the term ends unless a renewal succeeds first.
    pub(super) fn step_down_at(&self) -> Option<Instant> {
        let term = self.role.term()?;
        Some(term.last_renewed_at() + self.config.timings().renew_deadline())
    }

    pub(super) fn check_deadline(&mut self, now: Instant) {
        if self.step_down_at().is_some_and(|deadline| deadline <= now) {
            self.step_down(StepDown::RenewDeadlinePassed);
        }
    }

    pub(super) fn step_down(&mut self, reason: StepDown) {
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
    pub(super) fn next_attempt_after(&mut self, started: Instant) -> Instant {
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
}

#[cfg(test)]
mod tests {
    //! A competing candidate's reaction to a watched Lease record, by table: its role, what it
    //! last saw, and the record the watch delivers decide what the loop does next and whether
    //! the term goes on. No I/O: the bookkeeping alone.
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use std::time::Duration;

    use k8s_openapi::api::coordination::v1::LeaseSpec;

    use super::*;
    use crate::{
        elector::{LeaseConfig, LeaseTimings},
        store::MemoryLeaseStore,
        term::Term,
    };

    const US: &str = "us";

    /// Who holds a record the table names.
    #[derive(Clone, Copy)]
    enum Holder {
        Us,
        Other,
        Nobody,
    }

    struct Case {
        name: &'static str,
        /// Leading, and whether the watch has delivered our last write (version 5).
        leading: Option<bool>,
        /// The record last seen (version, holder), if any.
        seen: Option<(u64, Holder)>,
        /// The watched record (version, holder); `None`: the Lease was deleted.
        watched: Option<(u64, Holder)>,
        reaction: Reaction,
        leading_after: bool,
    }

    fn record(version: u64, holder: Holder) -> Lease {
        let holder = match holder {
            Holder::Us => US,
            Holder::Other => "other",
            Holder::Nobody => "",
        };
        let mut lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        lease.metadata.resource_version = Some(version.to_string());
        lease
    }

    fn new_candidate() -> Candidate<MemoryLeaseStore> {
        let config = LeaseConfig::new("lease", "ns", US, LeaseTimings::default()).unwrap();
        let (sender, _) = tokio::sync::watch::channel(None);
        Candidate::new(
            config,
            MemoryLeaseStore::new(),
            sender,
            ElectorMetrics::default(),
        )
    }

    fn candidate(case: &Case) -> Candidate<MemoryLeaseStore> {
        let mut candidate = new_candidate();
        let now = Instant::now();
        candidate.observed = case
            .seen
            .map(|(version, holder)| Observed::update(None, record(version, holder), now));
        if let Some(watch_caught_up) = case.leading {
            candidate.written_version = Some("5".to_owned());
            candidate.role = Role::Leading {
                term: Term::new(now, Duration::from_secs(10)),
                watch_caught_up,
            };
        }
        candidate
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_record_moves_the_candidate_as_its_table_says() {
        use Holder::{Nobody, Other, Us};
        let cases = [
            Case {
                name: "a follower takes a released Lease at once",
                leading: None,
                seen: Some((4, Other)),
                watched: Some((6, Nobody)),
                reaction: Reaction::AttemptNow,
                leading_after: false,
            },
            Case {
                name: "a follower leaves a Lease another holds",
                leading: None,
                seen: None,
                watched: Some((6, Other)),
                reaction: Reaction::Nothing,
                leading_after: false,
            },
            Case {
                name: "a follower waits out a deleted Lease's holder before re-creating it",
                leading: None,
                seen: Some((4, Other)),
                watched: None,
                reaction: Reaction::Nothing,
                leading_after: false,
            },
            Case {
                name: "a follower that saw no Lease and sees none takes it at once",
                leading: None,
                seen: None,
                watched: None,
                reaction: Reaction::AttemptNow,
                leading_after: false,
            },
            Case {
                name: "a lagging watch's older release is ignored",
                leading: None,
                seen: Some((7, Other)),
                watched: Some((6, Nobody)),
                reaction: Reaction::Nothing,
                leading_after: false,
            },
            Case {
                name: "a leader named by the record leads on",
                leading: Some(false),
                seen: Some((5, Us)),
                watched: Some((5, Us)),
                reaction: Reaction::Nothing,
                leading_after: true,
            },
            Case {
                name: "a leader whose watch delivered its last write steps down on another holder",
                leading: Some(true),
                seen: Some((5, Us)),
                watched: Some((6, Other)),
                reaction: Reaction::Nothing,
                leading_after: false,
            },
            Case {
                name: "a leader whose watch may lag confirms another holder with a read",
                leading: Some(false),
                seen: Some((5, Us)),
                watched: Some((6, Other)),
                reaction: Reaction::ConfirmHolder,
                leading_after: true,
            },
            Case {
                name: "a leader whose watch delivered its last write steps down on a release",
                leading: Some(true),
                seen: Some((5, Us)),
                watched: Some((6, Nobody)),
                reaction: Reaction::Nothing,
                leading_after: false,
            },
        ];
        for case in cases {
            let mut candidate = candidate(&case);
            let watched = case
                .watched
                .map(|(version, holder)| record(version, holder));
            let reaction = candidate.react(watched, Instant::now());
            assert_eq!(reaction, case.reaction, "{}", case.name);
            assert_eq!(
                candidate.role.leading(),
                case.leading_after,
                "{}: leading after",
                case.name
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_lease_found_after_more_than_two_retry_periods_unseen_is_waited_out() {
        // More than two RetryPeriods without a sighting (requests failing, say): a Lease may have
        // come and gone unseen. One failed poll alone (two RetryPeriods between sightings) is not
        // blindness.
        let retry = LeaseTimings::default().retry_period();
        let renew_deadline = LeaseTimings::default().renew_deadline();
        for (unseen, waits) in [
            (retry * 2, false),
            (retry * 2 + Duration::from_millis(1), true),
        ] {
            let mut candidate = new_candidate();
            let now = Instant::now() + unseen;
            candidate.observe(None, now);
            assert_eq!(
                candidate.vanished_until,
                waits.then_some(now + renew_deadline),
                "unseen for {unseen:?}"
            );
        }
    }

    /// An attempt by a competing candidate, for
    /// [`next_attempt_after`](Candidate::next_attempt_after). Times count from when the case's
    /// record was seen (its duration: 15 s).
    struct Attempt {
        name: &'static str,
        /// Leading, renewed at the attempt's start.
        leading: bool,
        /// The holder of the record last seen, if any.
        seen: Option<Holder>,
        /// A deleted record's claim runs until then.
        vanished: Option<Duration>,
        /// When the attempt started; it took 10 ms.
        started: Duration,
        /// When the next attempt is due.
        next: Duration,
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_attempt_is_the_next_poll_or_an_expiry_ahead_of_the_attempt() {
        use Holder::{Nobody, Other, Us};
        let s = Duration::from_secs;
        let after = |started: u64, millis: u64| s(started) + Duration::from_millis(millis);
        let follower = |name, seen, started, next| Attempt {
            name,
            leading: false,
            seen: Some(seen),
            vanished: None,
            started,
            next,
        };
        let deleted = |name, vanished, next| Attempt {
            name,
            leading: false,
            seen: None,
            vanished: Some(vanished),
            started: s(14),
            next,
        };
        let cases = [
            follower("another holder's expiry ahead: then", Other, s(14), s(15)),
            follower(
                "an expiry at the attempt's start was tried: the next poll",
                Other,
                s(15),
                s(17),
            ),
            follower(
                "an expiry behind the attempt: the next poll",
                Other,
                s(16),
                s(18),
            ),
            follower("a release has no holder to wait for", Nobody, s(14), s(16)),
            Attempt {
                name: "a leader renews at the next poll",
                leading: true,
                ..follower("", Us, s(14), s(16))
            },
            deleted("a deleted record's claim ending ahead: then", s(15), s(15)),
            deleted(
                "a claim that ended during the attempt: the next poll",
                after(14, 5),
                s(16),
            ),
            deleted(
                "a claim ending as the attempt ends: the next poll",
                after(14, 10),
                s(16),
            ),
        ];
        for case in cases {
            let seen_at = Instant::now();
            let mut candidate = new_candidate();
            candidate.observed = case
                .seen
                .map(|holder| Observed::update(None, record(1, holder), seen_at));
            candidate.vanished_until = case.vanished.map(|vanished| seen_at + vanished);
            let started = seen_at + case.started;
            tokio::time::advance(case.started).await;
            if case.leading {
                candidate.written_version = Some("1".to_owned());
                candidate.role = Role::Leading {
                    term: Term::new(started, Duration::from_secs(10)),
                    watch_caught_up: true,
                };
            }
            tokio::time::advance(Duration::from_millis(10)).await;
            let next = candidate.next_attempt_after(started);
            assert_eq!(next - seen_at, case.next, "{}", case.name);
            assert_eq!(candidate.role.leading(), case.leading, "{}", case.name);
        }
    }
}
