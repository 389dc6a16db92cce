//! What happened on the shared Lease: every record the watch delivered, and each side's leading
//! intervals from its own log, with the checks the interop tests make on them.
//!
//! Every process runs on this one machine and stamps its logs with the same system clock (the
//! contender in RFC 3339 with nanoseconds, our replicas with microseconds), and the Lease
//! records' renewTime/acquireTime come from the writers' clocks, i.e. this clock too. So
//! comparing a time from one log with a time from the other (or from the Lease) needs no
//! allowance for clock skew; only the order of events within one process matters, and each
//! process logs "started leading" before its first write and "stopped leading" after its last.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio::{sync::watch, task::JoinHandle};

use super::contender::{Contender, Event, LEASE_NAME, Ours};
use harness::Cluster;

/// One write of the Lease, as the watch delivered it.
#[derive(Clone, Debug)]
pub struct Record {
    /// When the test received it.
    pub seen: Timestamp,
    pub holder: Option<String>,
    pub duration_seconds: Option<i32>,
    pub transitions: Option<i32>,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    /// The Lease was deleted (every other field is empty).
    pub deleted: bool,
}

/// Every record of the shared Lease since the test began.
pub struct LeaseLog {
    records: watch::Receiver<Vec<Record>>,
    task: JoinHandle<()>,
}

/// A stretch of time in which one process could write.
#[derive(Clone, Debug)]
pub struct Interval {
    pub who: String,
    pub from: Timestamp,
    /// `None`: still leading.
    pub to: Option<Timestamp>,
}

// === impl Record ===

impl Record {
    fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            seen: Timestamp::now(),
            holder: spec.holder_identity.filter(|holder| !holder.is_empty()),
            duration_seconds: spec.lease_duration_seconds,
            transitions: spec.lease_transitions,
            acquire_time: spec.acquire_time.map(|time| time.0),
            renew_time: spec.renew_time.map(|time| time.0),
            deleted: false,
        }
    }
}

// === impl LeaseLog ===

impl LeaseLog {
    /// Starts recording [`LEASE_NAME`] in the cluster's namespace: its record now, then every
    /// write.
    pub async fn start(cluster: &Cluster) -> LeaseLog {
        let leases = cluster.leases();
        let by_name = format!("metadata.name={LEASE_NAME}");
        let list = leases
            .list(&ListParams::default().fields(&by_name))
            .await
            .unwrap();
        let mut version = list.metadata.resource_version.unwrap_or_default();
        let (sender, records) =
            watch::channel::<Vec<Record>>(list.items.iter().map(Record::of).collect());
        let task = tokio::spawn(async move {
            loop {
                let params = WatchParams::default().fields(&by_name);
                let Ok(stream) = leases.watch(&params, &version).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut stream = stream.boxed();
                while let Ok(Some(event)) = stream.try_next().await {
                    let (lease, deleted) = match event {
                        WatchEvent::Added(lease) | WatchEvent::Modified(lease) => (lease, false),
                        WatchEvent::Deleted(lease) => (lease, true),
                        _ => continue,
                    };
                    version = lease.metadata.resource_version.clone().unwrap_or_default();
                    let record = if deleted {
                        Record {
                            holder: None,
                            duration_seconds: None,
                            transitions: None,
                            acquire_time: None,
                            renew_time: None,
                            deleted: true,
                            ..Record::of(&lease)
                        }
                    } else {
                        Record::of(&lease)
                    };
                    sender.send_modify(|records| records.push(record));
                }
            }
        });
        LeaseLog { records, task }
    }

    /// The records so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.borrow().clone()
    }

    /// Waits for a record naming `holder` after the first `after` records; returns it.
    pub async fn wait_holder(&self, holder: &str, after: usize, timeout: Duration) -> Record {
        let mut records = self.records.clone();
        let found = tokio::time::timeout(timeout, async {
            loop {
                let hit = records
                    .borrow_and_update()
                    .iter()
                    .skip(after)
                    .find(|record| record.holder.as_deref() == Some(holder))
                    .cloned();
                if let Some(record) = hit {
                    return record;
                }
                records.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "no Lease record naming {holder} within {timeout:?}; holders: {:?}",
                self.holders()
            )
        })
    }

    /// The holders in order, renewals collapsed (None: released).
    pub fn holders(&self) -> Vec<Option<String>> {
        let mut holders: Vec<Option<String>> = Vec::new();
        for record in self.records() {
            if holders.last() != Some(&record.holder) {
                holders.push(record.holder);
            }
        }
        holders
    }

    /// The last record written by `holder` before index `before` (its last renewal).
    pub fn last_of(&self, holder: &str, before: usize) -> Record {
        self.records()[..before]
            .iter()
            .rev()
            .find(|record| record.holder.as_deref() == Some(holder))
            .cloned()
            .unwrap_or_else(|| panic!("no record of {holder}"))
    }

    /// How many records so far.
    pub fn len(&self) -> usize {
        self.records.borrow().len()
    }

    /// `leaseTransitions` is kept by both writers: it grows by exactly one whenever a record
    /// names a holder the previous record did not name, and never changes otherwise. A deleted
    /// Lease (an operator's step) starts a new object and a new count.
    pub fn assert_transitions_kept(&self) {
        let records = self.records();
        for pair in records.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            if before.deleted || after.deleted {
                continue;
            }
            let taken = after.holder.is_some() && after.holder != before.holder;
            let expected = before.transitions.unwrap_or(0) + i32::from(taken);
            assert_eq!(
                after.transitions,
                Some(expected),
                "leaseTransitions from {before:?} to {after:?}"
            );
        }
    }
}

impl Drop for LeaseLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === intervals ===

/// Leading intervals from a log: from each `start` event to the next `stop` event; one still
/// open ends at `ended` (the process's exit, seen by the test) or stays open.
pub fn intervals(
    who: &str,
    events: &[Event],
    (start, stop): (&str, &str),
    ended: Option<Timestamp>,
) -> Vec<Interval> {
    let mut out: Vec<Interval> = Vec::new();
    for event in events {
        if event.name == start {
            out.push(Interval {
                who: who.to_string(),
                from: event.time,
                to: None,
            });
        } else if event.name == stop
            && let Some(open) = out.last_mut().filter(|interval| interval.to.is_none())
        {
            open.to = Some(event.time);
        }
    }
    if let Some(open) = out.last_mut().filter(|interval| interval.to.is_none()) {
        open.to = ended;
    }
    out
}

/// The contender's intervals: from "started leading" to "stopped leading" (its marker writer
/// has stopped), or to its exit when it was killed.
pub fn contender_intervals(contender: &Contender, ended: Option<Timestamp>) -> Vec<Interval> {
    intervals(
        &contender.identity,
        &contender.events(),
        ("started leading", "stopped leading"),
        ended,
    )
}

/// A replica's intervals: from "acquired the lease; leading" to "stopped leading", or to its
/// exit when it was killed.
pub fn our_intervals(ours: &Ours, ended: Option<Timestamp>) -> Vec<Interval> {
    intervals(
        &ours.replica.identity,
        &ours.events(),
        ("acquired the lease; leading", "stopped leading"),
        ended,
    )
}

/// No two intervals overlap, and their owners, in order, are the Lease's holders in order.
/// Returns the gaps between consecutive intervals (the time nobody could write).
pub fn assert_never_together(
    all: &[Interval],
    lease: &LeaseLog,
) -> Vec<(String, String, Duration)> {
    let mut sorted = all.to_vec();
    sorted.sort_by_key(|interval| interval.from);
    let mut gaps = Vec::new();
    for pair in sorted.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let Some(end) = before.to else {
            panic!("{before:?} is still open while {after:?} began: {sorted:#?}");
        };
        assert!(
            end < after.from,
            "{} led until {end} and {} from {}: overlap; all intervals: {sorted:#?}",
            before.who,
            after.who,
            after.from
        );
        let gap = Duration::try_from(end.duration_until(after.from)).unwrap();
        gaps.push((before.who.clone(), after.who.clone(), gap));
    }
    // A holder that leads twice in a row (its own release in between) counts once on both sides.
    let mut leaders: Vec<String> = sorted.iter().map(|i| i.who.clone()).collect();
    leaders.dedup();
    let mut holders: Vec<String> = lease.holders().into_iter().flatten().collect();
    holders.dedup();
    assert_eq!(
        leaders,
        holders,
        "the leading intervals follow the Lease's holders ({:?})",
        lease.holders()
    );
    gaps
}

/// Every marker the contender wrote was sent and acknowledged within one of its intervals.
pub fn assert_markers_within(contender: &Contender, intervals: &[Interval]) -> usize {
    let markers: Vec<Event> = contender
        .events()
        .into_iter()
        .filter(|event| event.name == "marker written")
        .collect();
    for marker in &markers {
        let sent: Timestamp = marker.fields["sent"].as_str().unwrap().parse().unwrap();
        let inside = intervals.iter().any(|interval| {
            interval.from <= sent && interval.to.is_none_or(|to| marker.time <= to)
        });
        assert!(
            inside,
            "marker {} of {} at {sent}..{} outside its intervals {intervals:#?}",
            marker.fields["seq"], contender.identity, marker.time
        );
    }
    markers.len()
}

/// Time from `a` to `b` (zero if `b` is earlier).
pub fn between(a: Timestamp, b: Timestamp) -> Duration {
    Duration::try_from(a.duration_until(b)).unwrap_or_default()
}
