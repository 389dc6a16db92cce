//! The faults a schedule holds, what each does, and how each is drawn from the seed.

use std::time::Duration;

use super::{APPS, NAMESPACES, SERVICES};
use crate::rng::Rng;

/// Which replica a fault strikes, resolved when it happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The replica leading at that moment (any replica if none leads).
    Leader,
    /// A replica that does not lead at that moment (any if all follow).
    Follower,
}

/// A fault, and how long it lasts.
#[derive(Clone, Debug)]
#[allow(missing_docs)] // the fields name what they hold; each variant's doc says what it does
pub enum Fault {
    /// The replica's open watch streams go silent (the connection stays up, nothing arrives).
    StallWatches { target: Target },
    /// Every watch event reaches the replica `lag` late, in order.
    LagWatches {
        target: Target,
        lag: Duration,
        lasting: Duration,
    },
    /// The replica cannot reach the API server: requests fail, open streams break.
    Cut { target: Target, lasting: Duration },
    /// The replica's requests are held (neither answered nor failed) and its streams deliver
    /// nothing; all of it goes through when the pause ends.
    Pause { target: Target, lasting: Duration },
    /// This percentage of the replica's requests are answered 503.
    Errors {
        target: Target,
        percent: u64,
        lasting: Duration,
    },
    /// Each request reaches the API server up to `delay` late (its own share, so requests
    /// overtake one another), and every answer reaches the replica `delay` late.
    Slow {
        target: Target,
        delay: Duration,
        lasting: Duration,
    },
    /// The process is killed; it starts again, with empty caches, after `restart_after`.
    Crash {
        target: Target,
        restart_after: Duration,
    },
    /// A graceful stop (SIGTERM: drain, release); started again after `restart_after`.
    Stop {
        target: Target,
        restart_after: Duration,
    },
    /// The leader is killed right after its next slice write is applied (between two writes of
    /// one reconcile, when it has several).
    CrashAfterNextWrite { restart_after: Duration },
    /// The leader is asked to stop (SIGTERM) just as its next slice write goes out, and that
    /// write is held on the wire for `hold`: a graceful stop with a write in flight.
    StopDuringNextWrite {
        hold: Duration,
        restart_after: Duration,
    },
    /// The leader's link pauses just as its next slice write goes out, for `lasting`: the write
    /// stays on the wire while the Lease may change hands, then lands.
    PauseDuringNextWrite { lasting: Duration },
    /// The API server compacts its history and the replica's watches reconnect: they are
    /// answered 410 Gone and must list again.
    Expire { target: Target },
    /// The next `count` slice writes are refused with 409, as if another writer got there first.
    Conflicts { count: u32 },
    /// Someone else deletes one of the managed slices.
    ForeignDelete { pick: u64 },
    /// Someone else removes the first endpoint of one of the managed slices.
    ForeignEdit { pick: u64 },
    /// Someone deletes the Lease.
    DeleteLease,
    /// Someone writes another holder into the Lease.
    OverwriteLease,
    /// One kind of the replica's watches (`resource`, a plural name) falls `lag` behind its
    /// other watches, in order, as when one of the API server's per-resource watch caches lags.
    LagKind {
        target: Target,
        resource: &'static str,
        lag: Duration,
        lasting: Duration,
    },
    /// The leader's next `count` applied slice writes lose their answers: stored by the API
    /// server, answered to the replica by a broken connection (the outcome unknown to it).
    LoseAnswers { count: u32 },
    /// A follower's watches fall `lag` behind, then the leader is killed: the new leader's view
    /// lags the store (the stale-view pattern).
    StaleTakeover {
        lag: Duration,
        lasting: Duration,
        restart_after: Duration,
    },
    /// The API server closes the open watches of `resource` (a qualified name), or of every
    /// resource: each watcher must resume from where it was.
    CloseWatches { resource: Option<&'static str> },
    /// One object, a workload (at another address, `ip`) or with `service` a Service, is
    /// deleted and created again under its name; the history is compacted and the kind's
    /// watches closed, so a watcher resuming gets 410 and, listing again, sees the new object (a
    /// new uid) and never the deletion.
    RecreateBehindCompaction { service: bool, pick: u64, ip: u8 },
    /// Right after a replica's next read of the Services of `namespace` is answered (a GET or a
    /// list), before it can act on it, Service `service`'s selector changes to `app`.
    RaceServiceRead {
        namespace: usize,
        service: usize,
        app: usize,
    },
    /// One API server instance's watch cache of `resource` (a qualified name), or with `None`
    /// every instance's (as when etcd's watch feed falls behind), falls `lag` behind the store
    /// for `lasting`: every watch of it on that instance stands still, then follows late,
    /// whoever its client; a new watch stream does not escape it.
    LagCache {
        instance: Option<usize>,
        resource: &'static str,
        lag: Duration,
        lasting: Duration,
    },
    /// The leader's link pauses for `lasting` (its renewals held) and, `after` that, someone
    /// deletes the Lease: the holder is cut off while its term still runs, and the Lease looks
    /// free to everyone else.
    DeleteLeaseUnderPausedLeader { after: Duration, lasting: Duration },
    /// Right after a replica's next read of the workloads of `namespace` is answered, one of
    /// them (`pick`) is relabelled to `app`.
    RaceWorkloadRead {
        namespace: usize,
        pick: u64,
        app: usize,
    },
}

fn target(rng: &mut Rng) -> Target {
    if rng.chance(60) {
        Target::Leader
    } else {
        Target::Follower
    }
}

pub(super) fn fault(rng: &mut Rng) -> Fault {
    let lasting = rng.millis(500, 20_000);
    match rng.below(16) {
        0 => Fault::StallWatches {
            target: target(rng),
        },
        1 => Fault::LagWatches {
            target: target(rng),
            lag: rng.millis(50, 5_000),
            lasting,
        },
        2 => Fault::Cut {
            target: target(rng),
            lasting,
        },
        3 => Fault::Pause {
            target: target(rng),
            lasting,
        },
        4 => Fault::Errors {
            target: target(rng),
            percent: 20 + rng.below(80),
            lasting,
        },
        5 => Fault::Slow {
            target: target(rng),
            delay: rng.millis(10, 3_000),
            lasting,
        },
        6 => Fault::Crash {
            target: target(rng),
            restart_after: rng.millis(0, 10_000),
        },
        7 => Fault::Stop {
            target: target(rng),
            restart_after: rng.millis(0, 10_000),
        },
        8 => Fault::CrashAfterNextWrite {
            restart_after: rng.millis(0, 10_000),
        },
        9 => Fault::Expire {
            target: target(rng),
        },
        10 => Fault::Conflicts {
            count: 1 + u32::try_from(rng.below(3)).unwrap_or(0),
        },
        11 => Fault::ForeignDelete {
            pick: rng.next_u64(),
        },
        12 => Fault::ForeignEdit {
            pick: rng.next_u64(),
        },
        13 => Fault::DeleteLease,
        14 => Fault::OverwriteLease,
        _ => Fault::StaleTakeover {
            lag: rng.millis(500, 5_000),
            lasting,
            restart_after: rng.millis(0, 10_000),
        },
    }
}

/// The resources whose watch [`Fault::LagKind`] lags.
const KINDS: [&str; 3] = ["services", "externalworkloads", "endpointslices"];

pub(super) fn view_fault(rng: &mut Rng) -> Fault {
    if rng.chance(50) {
        Fault::LagKind {
            target: target(rng),
            resource: KINDS[rng.index(KINDS.len())],
            lag: rng.millis(1_000, 25_000),
            lasting: rng.millis(5_000, 40_000),
        }
    } else {
        Fault::LoseAnswers {
            count: 1 + u32::try_from(rng.below(2)).unwrap_or(0),
        }
    }
}

/// The resources whose watches [`Fault::CloseWatches`] closes, when not all.
const SERVED: [&str; 4] = [
    "services",
    "externalworkloads.workload.linkerd.io",
    "endpointslices.discovery.k8s.io",
    "leases.coordination.k8s.io",
];

pub(super) fn server_fault(rng: &mut Rng) -> Fault {
    match rng.below(6) {
        5 => Fault::DeleteLeaseUnderPausedLeader {
            after: rng.millis(0, 3_000),
            lasting: rng.millis(2_000, 20_000),
        },
        0 => Fault::CloseWatches {
            resource: if rng.chance(25) {
                None
            } else {
                Some(SERVED[rng.index(SERVED.len())])
            },
        },
        1 => Fault::RecreateBehindCompaction {
            service: rng.chance(25),
            pick: rng.next_u64(),
            ip: u8::try_from(10 + rng.below(200)).unwrap_or(10),
        },
        4 => Fault::LagCache {
            instance: rng.chance(50).then(|| rng.index(2)),
            resource: SERVED[rng.index(SERVED.len())],
            lag: rng.millis(1_000, 25_000),
            lasting: rng.millis(5_000, 40_000),
        },
        2 => Fault::RaceServiceRead {
            namespace: rng.index(NAMESPACES.len()),
            service: rng.index(SERVICES.len()),
            app: rng.index(APPS.len()),
        },
        _ => Fault::RaceWorkloadRead {
            namespace: rng.index(NAMESPACES.len()),
            pick: rng.next_u64(),
            app: rng.index(APPS.len()),
        },
    }
}
