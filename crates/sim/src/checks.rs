//! The checks that hold at every step of a simulation, fed by the API server's record of every
//! write ([`Checks::applied`]), by the links (which replica wrote, in which term), and by the
//! replicas' published leadership.
//!
//! - **(a) No write from an ended tenure**: when the API applies a slice write, the Lease (as the
//!   API server recorded it) is held by the very process incarnation that sent the write, in the
//!   tenure it held when it sent it. A tenure is one holder incarnation with one
//!   `leaseTransitions` count: it starts when a Lease write by that incarnation names it (so a
//!   restarted process starts a new one, under the same identity), and ends when the record
//!   names anyone else, or no one (released, deleted). Which incarnation sent a request is the
//!   simulation's own record (each start of a process gets a new link), never the controller's
//!   idea of its term. A write landing while no one holds the Lease counts.
//! - **(b) At most one acting leader**: at no instant do two replicas hold a term whose fence
//!   would let a write through; looked at on every leadership change, every Lease write (each
//!   renewal) and every slice write sent.
//! - **(c) Nothing deleted comes back**: once a write left a workload's endpoint out of its
//!   Service's slices because the workload was deleted or stopped matching, no later write puts
//!   it back while that is still so. And every endpoint published in a Service's slices is
//!   selected by the Service and its workload exists, within a bound of the change that made
//!   it unwanted; the bound counts only time when a replica may write (one acts as leader and
//!   reaches the API server).
//! - **(d) No duplicate at rest**: when the leader has been quiet for a lease duration, no two
//!   slices of a Service hold the same endpoint of one address family.
//! - **(f) Ready means caught up**: a replica's `/ready` (asked in-process of the binary's admin
//!   endpoints) never answers 200 while one of its watch streams has been silenced by a fault
//!   for longer than the stall bound and a moment to notice ([`Checks::check_ready`]).
//! - **(e) Convergence**: checked by the world once the faults stop (see `world`): every
//!   Service's slices keep the rules of the independent [`reference`](crate::reference), and
//!   nothing is written at rest.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice};
use leadership::Leadership;
use parking_lot::Mutex;
use slices::SERVICE_NAME_LABEL;
use tokio::time::Instant;

/// Which check a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    /// (a) A slice write landed from a term that had ended.
    EndedTermWrote,
    /// (b) Two replicas acted as leader at once.
    TwoLeaders,
    /// (c) An endpoint whose removal was published came back.
    RemovedCameBack,
    /// (c) An endpoint its Service does not select, or whose workload is gone, stayed
    /// published past the bound.
    UnwantedStayed,
    /// (f) A replica's `/ready` answered 200 while one of its watches had been silenced for
    /// longer than the stall bound (and a moment to notice).
    ReadyWhileStalled,
    /// (d) Two slices of a Service held one endpoint at rest.
    DuplicateAtRest,
    /// (e) The slices did not converge within the bound after the faults stopped.
    NotConverged,
    /// (e) A write happened while everything held still after convergence.
    WroteAtRest,
}

/// A violation of a documented, open limitation (see [`Known`]): reported and counted, but
/// not a failure of the run. Each is matched by a precise condition, not by its check alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Known {
    /// (c): a write planned before its Service was deleted landed after the deletion (requests
    /// overtake one another): its slice names an owner that no longer exists, and the garbage
    /// collector removes it.
    OwnerGone,
    /// (b): a replica that started while the Lease was missing (or whose requests failed from
    /// its start until then) created it and led while the holder of the deleted Lease (paused,
    /// cut off) still acted. A missing Lease looks the same
    /// as one never made; the API server's fence refuses the old holder's writes.
    MissingLeaseAtStart,
    /// (a): a write from outside the replicas (a deletion, an overwrite) ended the writer's
    /// tenure, and a write of that replica sent in the tenure before that, or sent within
    /// RenewDeadline after it (before its renewals could show the change), landed after. The
    /// writer's fence is a clock, not a read; the API server's fence (deployed by default)
    /// refuses such a write.
    ForcedLeaseChange,
    /// (a): a write sent while the Lease named its sender's incarnation (the tenure is recorded
    /// when the write is sent) was held in flight (a paused or slow link) past the end of that
    /// tenure, and landed after it; not after a release by its writer (the drain must have
    /// finished it), and not onto a slice someone else rewrote since (its version precondition
    /// must have refused it). A fence checked before sending cannot recall it; the API server's
    /// fence refuses it when the holder's name changed (not a restart under the same name), and
    /// version preconditions refuse an update or delete of a slice the new holder has
    /// rewritten.
    InFlightAcrossChange,
    /// (c): the writing replica had a watch silently stalled, for no longer than the stall
    /// bound, when it sent the write or when the write landed, so it planned on a cache up to
    /// that bound old. (b): a replica created the Lease while its watches were stalled (within
    /// the bound) so, between two of its polls, a record created and deleted again (a short
    /// tenure of another replica, still acting) never reached it.
    StalledWatchWithinBound,
}

/// One broken check.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Simulated time since the start.
    pub at: Duration,
    /// The check.
    pub check: Check,
    /// What happened.
    pub detail: String,
    /// The documented limitation it falls under, if any.
    pub known: Option<Known>,
}

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
    /// Whether the sender had a silently stalled stream open when it sent it (its plan may
    /// come from a cache up to the stall bound old, even if the write lands after the stall).
    stalled: bool,
}

/// How the checks judge leadership: the replicas' published terms, and the timings of a fence.
#[derive(Clone, Copy, Debug)]
pub struct Judge {
    /// RenewDeadline of the Lease.
    pub renew_deadline: Duration,
    /// The bound on a silent watch (`--stall-bound`): a stall excuses nothing beyond it.
    pub stall_bound: Duration,
    /// The fence margin.
    pub margin: Duration,
    /// Whether the fence is on (with it off, every published term acts).
    pub fence: bool,
}

/// The state of every check (see the module docs).
pub struct Checks {
    state: Mutex<State>,
    judge: Judge,
    started: Instant,
}

struct State {
    violations: Vec<Violation>,
    identities: Vec<String>,
    leaderships: Vec<Option<Leadership>>,
    /// The tenure of the Lease as the API server last recorded it (none: no one holds it), and
    /// the number of tenures so far.
    tenant: Option<Tenant>,
    tenures: u64,
    /// Each replica's process incarnation (its start count), and the incarnation of a Lease
    /// write of the replica about to reach the API.
    incarnations: Vec<u64>,
    lease_writer: Vec<Option<u64>>,
    /// When a write from outside the replicas last ended each replica's tenure, and the
    /// incarnation that held it.
    forced_end: Vec<Option<(Instant, u64)>>,
    /// The acting leaders of the last overlap recorded by check (b), so that one overlap is
    /// one violation however often it is looked at.
    overlap: Vec<(usize, u64)>,
    /// When the holder last changed, and to whom (for the server's fence with a lagging view).
    holders: Vec<(Instant, Option<String>)>,
    slices: BTreeMap<(String, String), EndpointSlice>,
    services: BTreeMap<(String, String), Service>,
    /// uid → (namespace, labels) of every workload that exists.
    workloads: BTreeMap<String, (String, BTreeMap<String, String>)>,
    /// (namespace, service, workload uid) whose removal was published → by whom, when.
    removed: BTreeMap<(String, String, String), String>,
    /// (namespace, service) → workload uids in its slices as the last replica's slice write left
    /// them, with what others' edits added since.
    present: BTreeMap<(String, String), BTreeSet<String>>,
    last_slice_write: Instant,
    slice_writes: u64,
    /// The recent writes of each slice: when, and by whom.
    slice_history: BTreeMap<(String, String), Vec<(Instant, String)>>,
    /// When each replica's process last started.
    started_at: Vec<Instant>,
    /// When each replica last created the Lease.
    created_lease_at: Vec<Option<Instant>>,
    /// Whether the replica's process has read a Lease record since it started (a GET answered
    /// 200), and whether it had when it last created the Lease.
    saw_lease: Vec<bool>,
    created_unseen: Vec<bool>,
    /// Since when each replica has had a watch stream open that a fault made silent, and since
    /// when the last stream of a kind it caches (not the elector's Lease) has been one.
    stalled: Vec<Option<Instant>>,
    cache_stalled: Vec<Option<Instant>>,
    /// The tenure each replica last ended by releasing the Lease itself (a graceful stop).
    released: Vec<Option<u64>>,
    /// The slice write of each replica on its way into the API, if any.
    landing: Vec<Option<Sent>>,
    /// (namespace, service, workload uid) published though unwanted → for how long a replica
    /// could have written since, and whether that was reported.
    unwanted: BTreeMap<(String, String, String), (Duration, bool)>,
}

/// One tenure of the Lease: a holder incarnation with one `leaseTransitions` count.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tenant {
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
struct Late {
    problem: String,
    known: Option<Known>,
}

// === impl Checks ===

impl Checks {
    /// Checks for replicas named `identities`, judged by `judge`.
    pub fn new(identities: Vec<String>, judge: Judge) -> Self {
        let now = Instant::now();
        let count = identities.len();
        Self {
            state: Mutex::new(State {
                violations: Vec::new(),
                leaderships: vec![None; identities.len()],
                identities,
                tenant: None,
                tenures: 0,
                incarnations: vec![0; count],
                lease_writer: vec![None; count],
                forced_end: vec![None; count],
                overlap: Vec::new(),
                holders: vec![(now, None)],
                slices: BTreeMap::new(),
                services: BTreeMap::new(),
                workloads: BTreeMap::new(),
                removed: BTreeMap::new(),
                present: BTreeMap::new(),
                last_slice_write: now,
                slice_writes: 0,
                slice_history: BTreeMap::new(),
                started_at: vec![now; count],
                created_lease_at: vec![None; count],
                saw_lease: vec![false; count],
                created_unseen: vec![false; count],
                stalled: vec![None; count],
                cache_stalled: vec![None; count],
                released: vec![None; count],
                landing: vec![None; count],
                unwanted: BTreeMap::new(),
            }),
            judge,
            started: now,
        }
    }

    /// Replica `replica`'s process starts: its new incarnation, which the requests of its new
    /// link carry.
    pub fn start(&self, replica: usize) -> u64 {
        let mut state = self.state.lock();
        state.incarnations[replica] += 1;
        state.started_at[replica] = Instant::now();
        state.saw_lease[replica] = false;
        state.incarnations[replica]
    }

    /// Replica `replica`'s process publishes this leadership.
    pub fn attach(&self, replica: usize, leadership: Leadership) {
        self.state.lock().leaderships[replica] = Some(leadership);
    }

    /// A Lease write of replica `replica`'s incarnation `incarnation` is about to reach the API
    /// (the API's record of it, [`Checks::applied`], follows at once if it is applied).
    pub fn lease_landing(&self, replica: usize, incarnation: u64) {
        self.state.lock().lease_writer[replica] = Some(incarnation);
    }

    /// Replica `replica` read a Lease record (a GET of the Lease answered 200).
    pub fn saw_lease(&self, replica: usize) {
        self.state.lock().saw_lease[replica] = true;
    }

    /// Whether replica `replica` has a watch stream open that a fault made silent, and whether
    /// the last stream of a kind it caches is one.
    pub fn set_stalled(&self, replica: usize, stalled: bool, cache_stalled: bool) {
        let mut state = self.state.lock();
        let now = Instant::now();
        let since = |since: Option<Instant>, stalled: bool| match (stalled, since) {
            (true, None) => Some(now),
            (false, _) => None,
            (true, since) => since,
        };
        state.stalled[replica] = since(state.stalled[replica], stalled);
        state.cache_stalled[replica] = since(state.cache_stalled[replica], cache_stalled);
    }

    /// Replica `replica` is gone (crashed or stopped).
    pub fn detach(&self, replica: usize) {
        self.state.lock().leaderships[replica] = None;
    }

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
            forced_recently: state.forced_end[replica].is_some_and(|(ended, holder)| {
                holder == incarnation && now - ended < self.judge.renew_deadline
            }),
            at: now,
            guarded,
            stalled: self.stalled_within_bound(&state, replica),
        }
    }

    /// Whether replica `replica` has a silently stalled stream open, stalled no longer than the
    /// stall bound: its cache may be up to that old, and no older.
    fn stalled_within_bound(&self, state: &State, replica: usize) -> bool {
        state.stalled[replica].is_some_and(|since| Instant::now() - since <= self.judge.stall_bound)
    }

    /// A slice write of replica `replica` sent as `sent` is about to reach the API: the write
    /// that check (c) judges if the API applies it now.
    pub fn landing(&self, replica: usize, sent: &Sent) {
        self.state.lock().landing[replica] = Some(sent.clone());
    }

    /// The API answered a slice write of replica `replica` sent as `sent`; if it applied it
    /// (`applied`), check (a).
    pub fn slice_answered(&self, replica: usize, sent: Sent, applied: bool) {
        let mut state = self.state.lock();
        state.landing[replica] = None;
        if !applied {
            return;
        }
        if let Some(late) = state.late(replica, &sent) {
            let identity = &state.identities[replica];
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

    /// Check (b) now: at most one replica holds a term whose fence passes.
    pub fn check_leaders(&self) {
        let mut state = self.state.lock();
        self.leaders(&mut state);
    }

    fn leaders(&self, state: &mut State) {
        let now = Instant::now();
        let acting: Vec<(usize, leadership::Term)> = state
            .leaderships
            .iter()
            .enumerate()
            .filter_map(|(replica, leadership)| {
                let term = leadership.as_ref()?.borrow().clone()?;
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
        {
            // The documented gap: one of them began its term by creating a missing Lease soon
            // after its process started, or before it had read any record since it started
            // (its requests failing until then): a missing Lease looks the same as one never
            // made.
            let known = acting.iter().any(|(replica, term)| {
                state.created_lease_at[*replica].is_some_and(|created| {
                    term.acquired_at() <= created
                        && (created - state.started_at[*replica] < self.judge.renew_deadline
                            || state.created_unseen[*replica])
                })
            });
            let names: Vec<String> = acting
                .iter()
                .map(|(replica, term)| {
                    format!("{} (term {})", state.identities[*replica], term.id())
                })
                .collect();
            // Or one created it while its watches (the Lease's among them) were silently
            // stalled: a record created and deleted again between two of its polls never
            // reached it.
            let blind = acting.iter().any(|(replica, term)| {
                self.stalled_within_bound(state, *replica)
                    && state.created_lease_at[*replica]
                        .is_some_and(|created| term.acquired_at() <= created)
            });
            let detail = format!("acting at once: {}", names.join(", "));
            let known = if known {
                Some(Known::MissingLeaseAtStart)
            } else {
                blind.then_some(Known::StalledWatchWithinBound)
            };
            self.record(state, Check::TwoLeaders, detail, known);
        }
    }

    /// The replica acting as leader now (its term's fence passes), if one does.
    pub fn acting_leader(&self) -> Option<usize> {
        let state = self.state.lock();
        let now = Instant::now();
        state.leaderships.iter().position(|leadership| {
            let Some(term) = leadership.as_ref().and_then(|l| l.borrow().clone()) else {
                return false;
            };
            let safe = term.last_renewed_at() + self.judge.renew_deadline;
            !self.judge.fence || safe.checked_sub(self.judge.margin).is_some_and(|s| s > now)
        })
    }

    /// Check (c), the published side: every endpoint in a Service's slices (of the Service as
    /// it exists: others are the garbage collector's) is selected by it and its workload
    /// exists, or has been for no longer than `bound` of the time a replica could write.
    /// `elapsed` is the time since the last look, `may_write` whether a replica could write in
    /// it.
    pub fn check_published(&self, elapsed: Duration, may_write: bool, bound: Duration) {
        let mut state = self.state.lock();
        let mut unwanted = BTreeSet::new();
        for ((namespace, _), slice) in &state.slices {
            let Some(service) = service_of(slice) else {
                continue;
            };
            if !state.owner_exists(namespace, slice) {
                continue;
            }
            for uid in uids(slice) {
                if !state.wanted(namespace, &service, &uid) {
                    unwanted.insert((namespace.clone(), service.clone(), uid));
                }
            }
        }
        state.unwanted.retain(|key, _| unwanted.contains(key));
        let mut overdue = Vec::new();
        for key in unwanted {
            let (waited, reported) = state.unwanted.entry(key.clone()).or_default();
            if may_write {
                *waited += elapsed;
            }
            if *waited > bound && !*reported {
                *reported = true;
                overdue.push(key);
            }
        }
        for (namespace, service, uid) in overdue {
            let now = match state.workloads.get(&uid) {
                Some((_, labels)) => format!("labels {labels:?}"),
                None => "deleted".to_string(),
            };
            let detail = format!(
                "workload {uid} ({now}) still in the slices of {namespace}/{service} after {}s in which a replica could write",
                bound.as_secs()
            );
            self.violate(&mut state, Check::UnwantedStayed, detail);
        }
    }

    /// Check (f): replica `replica`'s `/ready` answered `ready`; it may not be ready while a
    /// stream of its has been silenced for longer than the stall bound plus `notice`.
    pub fn check_ready(&self, replica: usize, ready: bool, notice: Duration) {
        let mut state = self.state.lock();
        let Some(since) = state.cache_stalled[replica] else {
            return;
        };
        let silent = Instant::now() - since;
        if ready && silent > self.judge.stall_bound + notice {
            let detail = format!(
                "{} ready with a watch silenced {:.1}s ago (stall bound {}s)",
                state.identities[replica],
                silent.as_secs_f64(),
                self.judge.stall_bound.as_secs()
            );
            self.violate(&mut state, Check::ReadyWhileStalled, detail);
        }
    }

    /// The replica that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        let state = self.state.lock();
        state.leaderships.iter().position(|leadership| {
            leadership
                .as_ref()
                .is_some_and(|leadership| leadership.borrow().is_some())
        })
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

    /// The API applied a write (any caller): keeps the checks' view of the store, and checks (c).
    pub fn applied(&self, applied: &apisim::Applied) {
        let mut state = self.state.lock();
        match applied.plural.as_str() {
            "leases" => {
                self.lease_applied(&mut state, applied);
                self.leaders(&mut state);
            }
            "services" => {
                let key = key_of(applied);
                let service = decode::<Service>(applied);
                let uid = |service: Option<&Service>| service.and_then(|s| s.metadata.uid.clone());
                // Another incarnation of the Service (deleted, or created again under its name):
                // the workloads its slices held belonged to the one before, whose slices go with
                // it; none of them is a removal this one's writes can publish.
                if uid(service.as_ref()) != uid(state.services.get(&key)) {
                    state.present.remove(&key);
                }
                match service {
                    Some(service) => state.services.insert(key, service),
                    None => state.services.remove(&key),
                };
            }
            "externalworkloads" => {
                let old_uid = applied.old.as_ref().and_then(uid_of);
                if let Some(uid) = old_uid {
                    state.workloads.remove(&uid);
                }
                if let Some(workload) = decode::<ExternalWorkload>(applied) {
                    let uid = workload.metadata.uid.clone().unwrap_or_default();
                    let labels = workload.metadata.labels.clone().unwrap_or_default();
                    state
                        .workloads
                        .insert(uid, (applied_namespace(applied), labels));
                }
            }
            "endpointslices" => self.slice_applied(&mut state, applied),
            _ => {}
        }
        if matches!(applied.plural.as_str(), "services" | "externalworkloads") {
            // A removal stands only while its workload stays unwanted: once the Service selects
            // it again, putting it back is right.
            let wanted: Vec<_> = state
                .removed
                .keys()
                .filter(|(namespace, service, uid)| state.wanted(namespace, service, uid))
                .cloned()
                .collect();
            for entry in wanted {
                state.removed.remove(&entry);
            }
        }
    }

    /// A Lease write was applied: the tenure as the API server now records it (check (a)).
    fn lease_applied(&self, state: &mut State, applied: &apisim::Applied) {
        let now = Instant::now();
        let writer = state
            .identities
            .iter()
            .position(|name| *name == applied.caller);
        let incarnation = writer.and_then(|replica| state.lease_writer[replica].take());
        if applied.verb == apisim::Verb::Create
            && let Some(replica) = writer
        {
            state.created_lease_at[replica] = Some(now);
            state.created_unseen[replica] = !state.saw_lease[replica];
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
            .and_then(|holder| state.identities.iter().position(|name| name == holder));
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
                    state.forced_end[ended_replica] = Some((now, ended_incarnation));
                }
                // A holder that clears its own name has released the Lease: its drain has
                // finished (or given up) every write of that tenure.
                if holder.is_none() && writer == Some(ended_replica) {
                    state.released[ended_replica] = Some(ended.id);
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

    /// Check (d): no two slices of a Service hold one endpoint of one family.
    pub fn check_duplicates(&self, why: &str) {
        let mut state = self.state.lock();
        let mut seen: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
        let mut duplicates = Vec::new();
        for ((namespace, name), slice) in &state.slices {
            let Some(service) = service_of(slice) else {
                continue;
            };
            for uid in uids(slice) {
                let key = (
                    namespace.clone(),
                    service.clone(),
                    slice.address_type.clone(),
                    uid,
                );
                if let Some(other) = seen.insert(key.clone(), name.clone()) {
                    duplicates.push(format!(
                        "{}/{} {} in {other} and {name}",
                        key.0, key.1, key.3
                    ));
                }
            }
        }
        if !duplicates.is_empty() {
            let detail = format!("{why}: {}", duplicates.join("; "));
            self.violate(&mut state, Check::DuplicateAtRest, detail);
        }
    }

    /// Records a violation found outside (convergence).
    pub fn report(&self, check: Check, detail: String) {
        let mut state = self.state.lock();
        self.violate(&mut state, check, detail);
    }

    /// When the last slice write landed, and how many have.
    pub fn slice_writes(&self) -> (Instant, u64) {
        let state = self.state.lock();
        (state.last_slice_write, state.slice_writes)
    }

    /// Every violation so far, in order.
    pub fn violations(&self) -> Vec<Violation> {
        self.state.lock().violations.clone()
    }

    fn violate(&self, state: &mut State, check: Check, detail: String) {
        self.record(state, check, detail, None);
    }

    fn record(&self, state: &mut State, check: Check, detail: String, known: Option<Known>) {
        state.violations.push(Violation {
            at: Instant::now() - self.started,
            check,
            detail,
            known,
        });
    }

    /// A slice was written by anyone: the store view, then check (c) for its Service.
    fn slice_applied(&self, state: &mut State, applied: &apisim::Applied) {
        let key = key_of(applied);
        let old = state.slices.get(&key).cloned();
        match decode::<EndpointSlice>(applied) {
            Some(slice) => state.slices.insert(key.clone(), slice),
            None => state.slices.remove(&key),
        };
        state.last_slice_write = Instant::now();
        state.slice_writes += 1;
        let history = state.slice_history.entry(key.clone()).or_default();
        history.push((Instant::now(), applied.caller.clone()));
        if history.len() > 16 {
            history.remove(0);
        }
        let services: BTreeSet<String> = old
            .iter()
            .chain(state.slices.get(&key))
            .filter_map(service_of)
            .collect();
        let by_replica = state.identities.contains(&applied.caller);
        let orphan = state
            .slices
            .get(&key)
            .is_some_and(|slice| !state.owner_exists(&key.0, slice));
        let writer = format!(
            "{} at {:.3}s (revision {}, slice {})",
            applied.caller,
            (Instant::now() - self.started).as_secs_f64(),
            applied.revision,
            key.1
        );
        for service in services {
            self.check_removals(
                state,
                &key.0,
                &service,
                by_replica.then_some(&writer),
                &writer,
                orphan,
            );
        }
    }

    /// Check (c) for one Service after a write to its slices.
    fn check_removals(
        &self,
        state: &mut State,
        namespace: &str,
        service: &str,
        replica: Option<&String>,
        writer: &str,
        orphan: bool,
    ) {
        let present: BTreeSet<String> = state
            .slices
            .iter()
            .filter(|((ns, _), slice)| {
                ns == namespace && service_of(slice).as_deref() == Some(service)
            })
            .flat_map(|(_, slice)| uids(slice))
            .collect();
        let wanted = |uid: &str| state.wanted(namespace, service, uid);
        let mut came_back = Vec::new();
        let mut newly_removed = Vec::new();
        let mut wanted_again = Vec::new();
        for (entry, published) in state
            .removed
            .iter()
            .filter(|((ns, svc, _), _)| ns == namespace && svc == service)
        {
            match (present.contains(&entry.2), wanted(&entry.2)) {
                (true, false) => came_back.push((entry.clone(), published.clone())),
                (_, true) => wanted_again.push(entry.clone()),
                (false, false) => {}
            }
        }
        // What a replica's write just left out, because its workload is gone or no longer
        // selected (someone else's edit publishes nothing).
        if let Some(replica) = replica {
            for uid in state.candidates(namespace, service) {
                let entry = (namespace.to_string(), service.to_string(), uid);
                if !present.contains(&entry.2)
                    && !wanted(&entry.2)
                    && !state.removed.contains_key(&entry)
                {
                    newly_removed.push((entry, replica.clone()));
                }
            }
        }
        for entry in wanted_again {
            state.removed.remove(&entry);
        }
        state.removed.extend(newly_removed);
        state.seen_in(namespace, service, &present, replica.is_some());
        for (entry, published) in came_back {
            state.removed.remove(&entry);
            let now = match state.workloads.get(&entry.2) {
                Some((_, labels)) => format!("labels {labels:?}"),
                None => "deleted".to_string(),
            };
            let selector = state
                .services
                .get(&(namespace.to_string(), service.to_string()))
                .and_then(|service| service.spec.as_ref()?.selector.clone());
            let detail = format!(
                "workload {} ({now}; selector {selector:?}) came back into the slices of {namespace}/{service} (written by {writer}) after its removal was published by {published}",
                entry.2
            );
            let replica = state
                .identities
                .iter()
                .position(|name| writer.split(' ').next() == Some(name.as_str()));
            // A write from an ended tenure brings back what it brings back for the reason check
            // (a) gives it; a stalled watch within its bound is a limitation of its own.
            let late = replica.and_then(|replica| {
                let sent = state.landing[replica].as_ref()?;
                state.late(replica, sent)?.known
            });
            // Stalled when it lands, or when it was sent (a write held on the way).
            let stalled = replica.is_some_and(|replica| {
                self.stalled_within_bound(state, replica)
                    || state.landing[replica]
                        .as_ref()
                        .is_some_and(|sent| sent.stalled)
            });
            let known = if orphan {
                Some(Known::OwnerGone)
            } else {
                late.or(stalled.then_some(Known::StalledWatchWithinBound))
            };
            self.record(state, Check::RemovedCameBack, detail, known);
        }
    }
}

// === impl State ===

impl State {
    /// Whether a write of `replica` sent as `sent` landing now is from an ended tenure (check
    /// (a)), and if so whether it falls under a documented limitation: only the API server's
    /// fence can refuse those. A write of a tenure its writer ended by releasing the Lease is no
    /// limitation: the drain before the release must have finished it.
    fn late(&self, replica: usize, sent: &Sent) -> Option<Late> {
        let tenant = self.tenant.as_ref();
        let holds = tenant.is_some_and(|tenant| {
            tenant.replica == Some((replica, sent.incarnation)) && Some(tenant.id) == sent.own
        });
        if holds {
            return None;
        }
        let identity = &self.identities[replica];
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
        let released = sent.own.is_some() && self.released[replica] == sent.own;
        // Ended by a write from outside the replicas after it was sent in its tenure, or sent
        // within RenewDeadline after such a write ended its tenure.
        let forced = match sent.own {
            Some(_) => self.forced_end[replica]
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
                .any(|(at, caller)| *at >= sent.at && caller != writer)
        })
    }

    /// Whether the Service a slice names as its owner exists (the same object: name and uid).
    fn owner_exists(&self, namespace: &str, slice: &EndpointSlice) -> bool {
        let Some(service) = service_of(slice) else {
            return true;
        };
        let current = self
            .services
            .get(&(namespace.to_string(), service))
            .and_then(|service| service.metadata.uid.clone());
        slice
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|owners| {
                owners
                    .iter()
                    .filter(|owner| owner.kind == "Service")
                    .all(|owner| Some(&owner.uid) == current.as_ref())
            })
    }

    /// Whether the Service `namespace/service` selects the workload `uid` now.
    fn wanted(&self, namespace: &str, service: &str, uid: &str) -> bool {
        let Some((ns, labels)) = self.workloads.get(uid) else {
            return false;
        };
        let selector = self
            .services
            .get(&(namespace.to_string(), service.to_string()))
            .and_then(|service| service.spec.as_ref()?.selector.as_ref());
        ns == namespace
            && selector.is_some_and(|selector| {
                selector
                    .iter()
                    .all(|(key, value)| labels.get(key) == Some(value))
            })
    }

    /// Workloads ever seen in a Service's slices (the ones whose absence can be a removal).
    /// The workloads in the Service's slices before the write being judged: only a write that
    /// takes one out publishes its removal (a write that leaves alone an endpoint the Service's
    /// slices never held, as the first write of a pass that puts it into another slice, does
    /// not).
    fn candidates(&self, namespace: &str, service: &str) -> Vec<String> {
        self.present
            .get(&(namespace.to_string(), service.to_string()))
            .map(|uids| uids.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records what a slice write left in the Service's slices. Someone else's edit only adds:
    /// an endpoint it took out stays a candidate, so the next replica write that leaves it out
    /// publishes its removal.
    fn seen_in(
        &mut self,
        namespace: &str,
        service: &str,
        present: &BTreeSet<String>,
        by_replica: bool,
    ) {
        let entry = self
            .present
            .entry((namespace.to_string(), service.to_string()))
            .or_default();
        if by_replica {
            entry.clone_from(present);
        } else {
            entry.extend(present.iter().cloned());
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.3}s {:?}: {}",
            self.at.as_secs_f64(),
            self.check,
            self.detail
        )?;
        if let Some(known) = self.known {
            write!(f, " [known: {known:?}]")?;
        }
        Ok(())
    }
}

fn key_of(applied: &apisim::Applied) -> (String, String) {
    (applied_namespace(applied), applied.name.clone())
}

fn applied_namespace(applied: &apisim::Applied) -> String {
    applied.namespace.clone().unwrap_or_default()
}

fn decode<K: serde::de::DeserializeOwned>(applied: &apisim::Applied) -> Option<K> {
    serde_json::from_value(applied.new.clone()?).ok()
}

fn uid_of(value: &serde_json::Value) -> Option<String> {
    value
        .pointer("/metadata/uid")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

fn service_of(slice: &EndpointSlice) -> Option<String> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .cloned()
}

/// The uids of the workloads a slice's endpoints point at.
fn uids(slice: &EndpointSlice) -> Vec<String> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|endpoint| endpoint.target_ref.as_ref()?.uid.clone())
        .collect()
}
