//! Check (a), no write from an ended tenure: the Lease's tenures as the API server records them,
//! each slice write from its sending to its answer, and the excuses a late write can have
//! ([`Known::ForcedLeaseChange`], [`Known::InFlightAcrossChange`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use super::{Check, Checks, Known, State};

/// A slice write on its way: which process incarnation sent it, and the tenure of the Lease
/// then.
#[derive(Clone, Debug)]
pub struct Sent {
    /// The sender's incarnation (its process's start count).
    incarnation: u64,
    /// The tenure the sender held when it sent the write, if it held the Lease then.
    own: Option<u64>,
    /// Who the Lease named when the write was sent.
    holder_at_send: Option<String>,
    /// Whether a write from outside the replicas ended the sender's tenure less than
    /// RenewDeadline before this one was sent (its fence is a clock, not a read).
    forced_recently: bool,
    /// When it was sent.
    at: Instant,
    /// The slice an update or delete names (guarded by its version).
    guarded: Option<(String, String)>,
    /// How many slice writes the API had applied when it was sent: those after it are the
    /// rewrites its version precondition must refuse it after (order, not time: a write the
    /// replica answers at the same instant came before).
    writes_before: u64,
    /// Whether the sender had a silently stalled stream open when it sent it (its plan may
    /// come from a cache up to the stall bound old, even if the write lands after the stall).
    pub(super) stalled: bool,
}

/// One tenure of the Lease: a holder incarnation with one `leaseTransitions` count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Tenant {
    /// Its number (1, 2, ...).
    id: u64,
    /// The holder identity the record names.
    holder: String,
    /// The replica and incarnation holding it (`None` for a name no replica has, or a record
    /// a write from outside the replicas made).
    replica: Option<(usize, u64)>,
    transitions: i32,
}

/// Why a write landing now is from an ended tenure, and the limitation it falls under, if any.
pub(super) struct Late {
    problem: String,
    pub(super) known: Option<Known>,
}

// === impl Checks ===

impl Checks {
    /// A slice write is being sent by replica `replica`'s incarnation `incarnation`; `guarded`
    /// names the slice of an update or delete. Check (b) looks at this instant too.
    pub fn sending(
        &self,
        replica: usize,
        incarnation: u64,
        guarded: Option<(String, String)>,
    ) -> Sent {
        let mut state = self.state.lock();
        self.leaders(&mut state);
        let now = Instant::now();
        let own = state
            .tenant
            .as_ref()
            .filter(|tenant| tenant.replica == Some((replica, incarnation)))
            .map(|tenant| tenant.id);
        Sent {
            incarnation,
            own,
            holder_at_send: state.tenant.as_ref().map(|tenant| tenant.holder.clone()),
            forced_recently: state.replicas[replica]
                .forced_end
                .is_some_and(|(ended, holder)| {
                    holder == incarnation && now - ended < self.judge.renew_deadline
                }),
            at: now,
            guarded,
            writes_before: state.slice_writes,
            stalled: state.replicas[replica].stalled_within(self.judge.stall_bound),
        }
    }

    /// A slice write of replica `replica` sent as `sent` is about to reach the API: the write
    /// that check (c) judges if the API applies it now.
    pub fn landing(&self, replica: usize, sent: &Sent) {
        self.state.lock().replicas[replica].landing = Some(sent.clone());
    }

    /// The API answered a slice write of replica `replica` sent as `sent`; if it applied it
    /// (`applied`), check (a).
    pub fn slice_answered(&self, replica: usize, sent: Sent, applied: bool) {
        let mut state = self.state.lock();
        state.replicas[replica].landing = None;
        if !applied {
            return;
        }
        if let Some(late) = state.late(replica, &sent) {
            let identity = &state.replicas[replica].identity;
            let detail = format!(
                "slice write of {identity} (incarnation {}, tenure {:?}, sent at {:.3}s) landed: {}",
                sent.incarnation,
                sent.own,
                (sent.at - self.started).as_secs_f64(),
                late.problem
            );
            self.record(&mut state, Check::EndedTermWrote, detail, late.known);
        }
    }

    /// A Lease write of replica `replica`'s incarnation `incarnation` is about to reach the API
    /// (the API's record of it, [`Checks::applied`], follows at once if it is applied).
    pub fn lease_landing(&self, replica: usize, incarnation: u64) {
        self.state.lock().replicas[replica].lease_writer = Some(incarnation);
    }

    /// The holder the API server's fence sees `lag` ago.
    pub fn holder_seen(&self, lag: Duration) -> Option<String> {
        let state = self.state.lock();
        let at = Instant::now().checked_sub(lag).unwrap_or(self.started);
        state
            .holders
            .iter()
            .rev()
            .find(|(changed, _)| *changed <= at)
            .and_then(|(_, holder)| holder.clone())
    }

    /// A Lease write was applied: the tenure as the API server now records it (check (a)).
    pub(super) fn lease_applied(&self, state: &mut State, applied: &apisim::Applied) {
        let now = Instant::now();
        let writer = state.replica_named(&applied.caller);
        let incarnation = writer.and_then(|replica| state.replicas[replica].lease_writer.take());
        if applied.verb == apisim::Verb::Create
            && let Some(replica) = writer
        {
            let record = &mut state.replicas[replica];
            record.created_lease_at = Some(now);
            record.created_unseen = !record.saw_lease;
        }
        let spec = applied
            .new
            .as_ref()
            .and_then(|value| serde_json::from_value::<Lease>(value.clone()).ok())
            .and_then(|lease| lease.spec);
        let holder = spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.clone())
            .filter(|holder| !holder.is_empty());
        let transitions = spec
            .as_ref()
            .and_then(|spec| spec.lease_transitions)
            .unwrap_or(0);
        let holder_replica = holder
            .as_ref()
            .and_then(|holder| state.replica_named(holder));
        // The incarnation a record names is the one that wrote it naming itself; a write by
        // anyone else naming the same holder keeps the tenure's incarnation.
        let replica = match (writer, holder_replica) {
            (Some(writer), Some(holder)) if writer == holder => incarnation.map(|i| (writer, i)),
            _ => state
                .tenant
                .as_ref()
                .filter(|tenant| Some(&tenant.holder) == holder.as_ref())
                .and_then(|tenant| tenant.replica),
        };
        let same = state.tenant.as_ref().is_some_and(|tenant| {
            Some(&tenant.holder) == holder.as_ref()
                && tenant.replica == replica
                && tenant.transitions == transitions
        });
        if !same {
            if let Some(ended) = state.tenant.take()
                && let Some((ended_replica, ended_incarnation)) = ended.replica
            {
                if writer.is_none() {
                    state.replicas[ended_replica].forced_end = Some((now, ended_incarnation));
                }
                // A holder that clears its own name has released the Lease: its drain has
                // finished (or given up) every write of that tenure.
                if holder.is_none() && writer == Some(ended_replica) {
                    state.replicas[ended_replica].released = Some(ended.id);
                }
            }
            if let Some(holder) = holder.clone() {
                state.tenures += 1;
                state.tenant = Some(Tenant {
                    id: state.tenures,
                    holder,
                    replica,
                    transitions,
                });
            }
        }
        let last = state.holders.last().and_then(|(_, holder)| holder.clone());
        if holder != last {
            state.holders.push((now, holder));
        }
    }
}

// === impl State ===

impl State {
    /// Whether a write of `replica` sent as `sent` landing now is from an ended tenure (check
    /// (a)), and if so whether it falls under a documented limitation: only the API server's
    /// fence can refuse those. A write of a tenure its writer ended by releasing the Lease is no
    /// limitation: the drain before the release must have finished it.
    pub(super) fn late(&self, replica: usize, sent: &Sent) -> Option<Late> {
        let tenant = self.tenant.as_ref();
        let holds = tenant.is_some_and(|tenant| {
            tenant.replica == Some((replica, sent.incarnation)) && Some(tenant.id) == sent.own
        });
        if holds {
            return None;
        }
        let record = &self.replicas[replica];
        let identity = &record.identity;
        let mut problem = match tenant {
            None => "no one holds the Lease when the write lands".to_string(),
            Some(tenant) if tenant.holder != *identity => {
                format!("the Lease names {:?} when the write lands", tenant.holder)
            }
            Some(tenant) if tenant.replica.is_some_and(|(_, i)| i != sent.incarnation) => {
                "a later incarnation of its writer holds the Lease".to_string()
            }
            Some(_) => "the Lease changed hands between sending and landing".to_string(),
        };
        if sent.own.is_none() {
            problem.push_str(&format!(
                ", and it was sent outside any tenure of its writer (the Lease named {:?})",
                sent.holder_at_send
            ));
        }
        let released = sent.own.is_some() && record.released == sent.own;
        // Ended by a write from outside the replicas after it was sent in its tenure, or sent
        // within RenewDeadline after such a write ended its tenure.
        let forced = match sent.own {
            Some(_) => record
                .forced_end
                .is_some_and(|(ended, holder)| holder == sent.incarnation && ended >= sent.at),
            None => sent.forced_recently,
        };
        let known = if forced {
            Some(Known::ForcedLeaseChange)
        } else if sent.own.is_some()
            && !released
            && Instant::now() > sent.at
            && !self.rewritten_since(sent, identity)
        {
            Some(Known::InFlightAcrossChange)
        } else {
            None
        };
        if released {
            problem.push_str(", after its writer released the Lease");
        }
        Some(Late { problem, known })
    }

    /// Whether someone other than `writer` wrote the slice a guarded write names after it was
    /// sent: its version precondition should then have refused it.
    fn rewritten_since(&self, sent: &Sent, writer: &str) -> bool {
        let Some(slice) = &sent.guarded else {
            return false;
        };
        self.slice_history.get(slice).is_some_and(|history| {
            history
                .iter()
                .any(|(order, caller)| *order > sent.writes_before && caller != writer)
        })
    }
}
