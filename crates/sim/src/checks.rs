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
//! - **(c) Nothing deleted comes back**: once a replica's pass (the writes that carry one trigger
//!   time) left a workload's endpoint out of its Service's slices because the workload was
//!   deleted or stopped matching, no later write puts it back while that is still so. And every endpoint published in a Service's slices is
//!   selected by the Service and its workload exists, within a bound of the change that made
//!   it unwanted; the bound counts only time when a replica may write (one acts as leader and
//!   reaches the API server) and can know (none of its caches blind within the stall bound).
//! - **(d) No duplicate at rest**: when the leader has been quiet for a lease duration, no two
//!   slices of a Service hold the same endpoint of one address family.
//! - **(f) Ready means caught up**: a replica's `/ready` (asked in-process of the binary's admin
//!   endpoints) never answers 200 while one of its watch streams has been silenced by a fault
//!   for longer than the stall bound and a moment to notice ([`Checks::check_ready`]).
//! - **(e) Convergence**: checked by the world once the faults stop (see `world`): every
//!   Service's slices keep the rules of the independent [`reference`](crate::reference) once
//!   every replica sees the present (no stalled stream, no frame a lag holds, no API server
//!   cache behind the store); once they kept them with every replica seeing the present, no
//!   write breaks them again (a drift: a write from a view older than the slices); and nothing
//!   is written at rest.
//!
//! This module holds the checks' shared state, what they know of each replica and the
//! violations found; `store` keeps the view of the API's store and hands each write to the
//! check it concerns; `tenure` (a), `leaders` (b), `removals` (c), `duplicates` (d) and `ready`
//! (f) each hold one check with the excuses it admits.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use leadership::Leadership;
use parking_lot::Mutex;
use tokio::time::Instant;

pub use self::tenure::Sent;
use self::tenure::Tenant;

mod duplicates;
mod leaders;
mod ready;
mod removals;
mod store;
mod tenure;

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
    /// What the checks know of each replica, by its number.
    replicas: Vec<ReplicaRecord>,
    /// The tenure of the Lease as the API server last recorded it (none: no one holds it), and
    /// the number of tenures so far.
    tenant: Option<Tenant>,
    tenures: u64,
    /// The acting leaders of the last overlap recorded by check (b), so that one overlap is
    /// one violation however often it is looked at.
    overlap: Vec<(usize, u64)>,
    /// The ids of the terms check (b) has named, in the order it first named them: a report
    /// numbers terms within its run, as the process-wide ids depend on what else ran before.
    named_terms: Vec<u64>,
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
    /// (namespace, service) → the removals the writes of a replica's pass left out so far,
    /// published when the pass ends.
    pending: BTreeMap<(String, String), removals::Pending>,
    last_slice_write: Instant,
    slice_writes: u64,
    /// The recent writes of each slice: their place in the order of all slice writes (the
    /// value `slice_writes` took), and by whom.
    slice_history: BTreeMap<(String, String), Vec<(u64, String)>>,
    /// (namespace, service, workload uid) published though unwanted → for how long a replica
    /// could have written since, and whether that was reported.
    unwanted: BTreeMap<(String, String, String), (Duration, bool)>,
}

/// What the checks know of one replica, across the starts of its process.
struct ReplicaRecord {
    /// The name it holds the Lease and writes under.
    identity: String,
    /// The leadership its running process publishes (none while it is down).
    leadership: Option<Leadership>,
    /// Its process incarnation (its start count), and when that process started.
    incarnation: u64,
    started_at: Instant,
    /// The incarnation of its Lease write about to reach the API, if one is.
    lease_writer: Option<u64>,
    /// Whether its process has read a Lease record since it started (a GET answered 200).
    saw_lease: bool,
    /// When it last created the Lease, and whether its process had read no Lease record before
    /// it did.
    created_lease_at: Option<Instant>,
    created_unseen: bool,
    /// When a write from outside the replicas last ended its tenure, and the incarnation that
    /// held it.
    forced_end: Option<(Instant, u64)>,
    /// The tenure it last ended by releasing the Lease itself (a graceful stop).
    released: Option<u64>,
    /// Since when it has had a watch stream open that a fault made silent, and since when the
    /// kind it caches (not the elector's Lease) blind the longest has had its last stream be
    /// one (per kind: two kinds silenced one after the other are not one long silence).
    stalled: Option<Instant>,
    cache_stalled: Option<Instant>,
    /// Its slice write on its way into the API, if any.
    landing: Option<Sent>,
}

// === impl Checks ===

impl Checks {
    /// Checks for replicas named `identities`, judged by `judge`.
    pub fn new(identities: Vec<String>, judge: Judge) -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(State {
                violations: Vec::new(),
                replicas: identities
                    .into_iter()
                    .map(|identity| ReplicaRecord::new(identity, now))
                    .collect(),
                tenant: None,
                tenures: 0,
                overlap: Vec::new(),
                named_terms: Vec::new(),
                holders: vec![(now, None)],
                slices: BTreeMap::new(),
                services: BTreeMap::new(),
                workloads: BTreeMap::new(),
                removed: BTreeMap::new(),
                present: BTreeMap::new(),
                pending: BTreeMap::new(),
                last_slice_write: now,
                slice_writes: 0,
                slice_history: BTreeMap::new(),
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
        let record = &mut state.replicas[replica];
        record.incarnation += 1;
        record.started_at = Instant::now();
        record.saw_lease = false;
        record.incarnation
    }

    /// Replica `replica`'s process publishes this leadership.
    pub fn attach(&self, replica: usize, leadership: Leadership) {
        self.state.lock().replicas[replica].leadership = Some(leadership);
    }

    /// Replica `replica` read a Lease record (a GET of the Lease answered 200).
    pub fn saw_lease(&self, replica: usize) {
        self.state.lock().replicas[replica].saw_lease = true;
    }

    /// Whether replica `replica` has a watch stream open that a fault made silent, and since
    /// when the kind it caches that has been blind the longest has been so (its last stream
    /// silenced and still open), if one is.
    pub fn set_stalled(&self, replica: usize, stalled: bool, cache_blind_since: Option<Instant>) {
        let mut state = self.state.lock();
        let now = Instant::now();
        let since = |since: Option<Instant>, stalled: bool| match (stalled, since) {
            (true, None) => Some(now),
            (false, _) => None,
            (true, since) => since,
        };
        let record = &mut state.replicas[replica];
        record.stalled = since(record.stalled, stalled);
        record.cache_stalled = cache_blind_since;
    }

    /// Whether a cache of replica `replica` has been blind (its kind's last stream silenced by a
    /// fault) for no longer than the stall bound: within it the replica cannot know what changed.
    pub fn blind_within_bound(&self, replica: usize) -> bool {
        let state = self.state.lock();
        state.replicas[replica]
            .cache_stalled
            .is_some_and(|since| Instant::now() - since <= self.judge.stall_bound)
    }

    /// Replica `replica` is gone (crashed or stopped).
    pub fn detach(&self, replica: usize) {
        self.state.lock().replicas[replica].leadership = None;
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
}

// === impl State ===

impl State {
    /// The number of the replica named `identity`, if one is.
    fn replica_named(&self, identity: &str) -> Option<usize> {
        self.replicas
            .iter()
            .position(|record| record.identity == identity)
    }
}

// === impl ReplicaRecord ===

impl ReplicaRecord {
    /// A replica named `identity` whose process has not started yet.
    fn new(identity: String, now: Instant) -> Self {
        Self {
            identity,
            leadership: None,
            incarnation: 0,
            started_at: now,
            lease_writer: None,
            saw_lease: false,
            created_lease_at: None,
            created_unseen: false,
            forced_end: None,
            released: None,
            stalled: None,
            cache_stalled: None,
            landing: None,
        }
    }

    /// Whether it has a silently stalled stream open, stalled no longer than `stall_bound`: its
    /// cache may be up to that old, and no older.
    fn stalled_within(&self, stall_bound: Duration) -> bool {
        self.stalled
            .is_some_and(|since| Instant::now() - since <= stall_bound)
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
