//! Check (b), at most one acting leader: the replicas' published terms whose fence would let a
//! write through, and the excuses an overlap can have ([`Known::MissingLeaseAtStart`], a Lease
//! changed from outside under one of them within RenewDeadline ([`Known::ForcedLeaseChange`]),
//! a Lease created blind within the stall bound).

use tokio::time::Instant;

use super::{Check, Checks, Known, State};

// === impl State ===

impl State {
    /// The run's own number of the term with process-wide id `id`: 1 for the first term a
    /// report names, and so on.
    fn term_number(&mut self, id: u64) -> usize {
        let index = match self.named_terms.iter().position(|named| *named == id) {
            Some(index) => index,
            None => {
                self.named_terms.push(id);
                self.named_terms.len() - 1
            }
        };
        index + 1
    }
}

// === impl Checks ===

impl Checks {
    /// Check (b) now: at most one replica holds a term whose fence passes.
    pub fn check_leaders(&self) {
        let mut state = self.state.lock();
        self.leaders(&mut state);
    }

    /// Check (b) with the state at hand; an overlap is recorded once, however often it is
    /// looked at.
    pub(super) fn leaders(&self, state: &mut State) {
        let now = Instant::now();
        let acting: Vec<(usize, leadership::Term)> = state
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(replica, record)| {
                let term = record.leadership.as_ref()?.borrow().clone()?;
                let safe = term.last_renewed_at() + self.judge.renew_deadline;
                let acts = !self.judge.fence || safe.checked_sub(self.judge.margin)? > now;
                acts.then_some((replica, term))
            })
            .collect();
        let overlap: Vec<(usize, u64)> = acting
            .iter()
            .map(|(replica, term)| (*replica, term.id()))
            .collect();
        if acting.len() < 2 || overlap == state.overlap {
            state.overlap = if acting.len() < 2 {
                Vec::new()
            } else {
                overlap
            };
            return;
        }
        state.overlap = overlap;
        // The documented gap: one of them began its term by creating a missing Lease soon
        // after its process started, or before it had read any record since it started
        // (its requests failing until then): a missing Lease looks the same as one never
        // made.
        let known = acting.iter().any(|(replica, term)| {
            let record = &state.replicas[*replica];
            record.created_lease_at.is_some_and(|created| {
                term.acquired_at() <= created
                    && (created - record.started_at < self.judge.renew_deadline
                        || record.created_unseen)
            })
        });
        let names: Vec<String> = acting
            .iter()
            .map(|(replica, term)| {
                let number = state.term_number(term.id());
                format!("{} (term {number})", state.replicas[*replica].identity)
            })
            .collect();
        // Or one created it while its watches (the Lease's among them) were silently
        // stalled: a record created and deleted again between two of its polls never
        // reached it.
        let blind = acting.iter().any(|(replica, term)| {
            let record = &state.replicas[*replica];
            record.stalled_within(self.judge.stall_bound)
                && record
                    .created_lease_at
                    .is_some_and(|created| term.acquired_at() <= created)
        });
        // Or someone outside the replicas deleted or overwrote the Lease under one of them
        // less than RenewDeadline ago: that holder learns it only when a renewal fails (or its
        // watch shows the record), and until then the API server's fence refuses its writes
        // (check (a) judges any that land, with the same excuse).
        let forced = acting.iter().any(|(replica, _)| {
            let record = &state.replicas[*replica];
            record.forced_end.is_some_and(|(ended, incarnation)| {
                incarnation == record.incarnation && now - ended < self.judge.renew_deadline
            })
        });
        let detail = format!("acting at once: {}", names.join(", "));
        let known = if known {
            Some(Known::MissingLeaseAtStart)
        } else if forced {
            Some(Known::ForcedLeaseChange)
        } else {
            blind.then_some(Known::StalledWatchWithinBound)
        };
        self.record(state, Check::TwoLeaders, detail, known);
    }

    /// The replica acting as leader now (its term's fence passes), if one does.
    pub fn acting_leader(&self) -> Option<usize> {
        let state = self.state.lock();
        let now = Instant::now();
        state.replicas.iter().position(|record| {
            let Some(term) = record.leadership.as_ref().and_then(|l| l.borrow().clone()) else {
                return false;
            };
            let safe = term.last_renewed_at() + self.judge.renew_deadline;
            !self.judge.fence || safe.checked_sub(self.judge.margin).is_some_and(|s| s > now)
        })
    }

    /// The replica that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        let state = self.state.lock();
        state.replicas.iter().position(|record| {
            record
                .leadership
                .as_ref()
                .is_some_and(|leadership| leadership.borrow().is_some())
        })
    }
}
