//! What the coordinated mode tests record: the Lease as a watch delivers it, the slice writes
//! of the API server's audit log, and the checks of a whole run (one leader, one writer).

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio::{sync::watch, task::JoinHandle};

use harness::{
    CONVERGE, Cluster, Replica,
    chaos::{
        audit::{LeaderMonitor, WriteAudit},
        world::{Member, World},
    },
    eventually, poll,
};
use testbed::Testbed;

/// The first successful slice write by one of `users` the API server received after `after`
/// (waited for).
pub async fn first_write(
    plane: &Testbed,
    cluster: &Cluster,
    users: &[String],
    after: Timestamp,
) -> Written {
    eventually("a slice write in the audit log", CONVERGE, || async {
        plane
            .audit_events()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|event| event.namespace == cluster.namespace && event.succeeded())
            .filter(|event| users.contains(&event.user))
            .filter_map(|event| {
                let received = event.received.filter(|time| *time > after)?;
                Some(Written {
                    user: event.user,
                    received,
                })
            })
            .min_by_key(|written| written.received)
            .ok_or_else(|| format!("none by {users:?} since {after}"))
    })
    .await
}

/// A slice write: who, and when the API server received it.
pub struct Written {
    /// The replica (its identity is its user name on the testbed).
    pub user: String,
    /// The audit log's `requestReceivedTimestamp`.
    pub received: Timestamp,
}

/// `to - from` in milliseconds (0 if `to` is earlier).
pub fn ms(from: Timestamp, to: Timestamp) -> String {
    let elapsed = Duration::try_from(from.duration_until(to)).unwrap_or_default();
    format!("{} ms", elapsed.as_millis())
}

/// Checks a test's whole run: never two leaders in one sample of the gauges, every slice write
/// made by the replica the Lease named at that revision.
pub struct Watchers {
    pub monitor: LeaderMonitor,
    audit: WriteAudit<'static>,
}

// === impl Watchers ===

impl Watchers {
    pub async fn start(world: &World<'static>, members: &[Member]) -> Watchers {
        let monitor = LeaderMonitor::start();
        for member in members {
            monitor.add(&member.replica);
        }
        let audit = WriteAudit::start(world.testbed, &world.cluster).await;
        Watchers { monitor, audit }
    }

    pub fn check(&self, world: &World<'_>, members: &[Member]) {
        let state = self.monitor.state();
        assert!(
            state.overlaps.is_empty(),
            "two replicas led at once: {:?}",
            state.overlaps
        );
        let mut replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
        replicas.extend(world.retired.iter().map(|m| &m.replica));
        let report = self.audit.check(&replicas);
        eprintln!(
            "audit: {} slice writes, {} attributed to a replica, {} by a non-holder; {} gauge \
             samples, longest without a leader {:?}",
            report.writes,
            report.attributed,
            report.by_non_holder.len(),
            state.samples,
            state.longest_leaderless,
        );
        assert!(
            report.attributed > 0 && report.unattributed == 0,
            "every slice write is a replica's: {report:?}"
        );
        assert!(
            report.by_non_holder.is_empty() && report.after_forced == 0,
            "writes by a replica the Lease did not name: {report:#?}"
        );
    }
}

/// The Lease as a watch delivers it, each record with the time the test saw it.
pub struct LeaseLog {
    records: watch::Receiver<Vec<Seen>>,
    task: JoinHandle<()>,
}

/// One record of the Lease.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When the watch delivered it.
    pub at: Timestamp,
    /// `holderIdentity` (None when empty: released or yielded).
    pub holder: Option<String>,
    /// `preferredHolder`: the election controller asks the holder to make way.
    pub preferred: Option<String>,
    /// `acquireTime`: written by a replica when its term begins.
    pub acquired: Option<Timestamp>,
}

// === impl LeaseLog ===

impl LeaseLog {
    /// Records every write of the e2e Lease from now on.
    pub async fn start(cluster: &Cluster) -> LeaseLog {
        let leases = cluster.leases();
        let (sender, records) = watch::channel(Vec::new());
        let task = tokio::spawn(async move {
            let by_name = format!("metadata.name={}", harness::LEASE);
            loop {
                // From now (a fresh list), again after any error: the tests are short, a 410
                // is not expected, and a record missed would only fail a wait below.
                let Ok(list) = leases.list(&ListParams::default().fields(&by_name)).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let version = list.metadata.resource_version.unwrap_or_default();
                let params = WatchParams::default().fields(&by_name);
                let Ok(stream) = leases.watch(&params, &version).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut stream = stream.boxed();
                while let Ok(Some(event)) = stream.try_next().await {
                    match event {
                        WatchEvent::Added(lease) | WatchEvent::Modified(lease) => {
                            sender.send_modify(|records| records.push(Seen::of(&lease)));
                        }
                        WatchEvent::Deleted(_) | WatchEvent::Bookmark(_) => {}
                        WatchEvent::Error(_) => break,
                    }
                }
            }
        });
        LeaseLog { records, task }
    }

    /// The first record seen after `after` that matches (waited for).
    pub async fn first(&self, after: Timestamp, matches: impl Fn(&Seen) -> bool) -> Seen {
        let records = self.records.clone();
        poll(
            "a Lease record",
            CONVERGE,
            Duration::from_millis(20),
            || {
                let found = records
                    .borrow()
                    .iter()
                    .find(|seen| seen.at > after && matches(seen))
                    .cloned();
                async move { found }
            },
        )
        .await
    }

    /// The `acquireTime` that `identity` wrote after `after`: the start of its term.
    pub async fn acquired_by(&self, identity: &str, after: Timestamp) -> Timestamp {
        let seen = self
            .first(after, |seen| {
                seen.holder.as_deref() == Some(identity)
                    && seen.acquired.is_some_and(|time| time > after)
            })
            .await;
        seen.acquired.unwrap()
    }

    /// Waits until `holder` has written the Lease `count` more times (renewals).
    pub async fn renewed(&self, holder: &str, count: usize) {
        let from = self.records.borrow().len();
        let records = self.records.clone();
        let what = format!("{count} renewals by {holder}");
        poll(&what, CONVERGE, Duration::from_millis(20), || {
            let by_holder = records.borrow()[from..]
                .iter()
                .filter(|seen| seen.holder.as_deref() == Some(holder))
                .count();
            async move { (by_holder >= count).then_some(()) }
        })
        .await
    }

    /// The holders named since `after`, in order (`-` for none), each move once.
    pub fn holders(&self, after: Timestamp) -> Vec<String> {
        let mut holders: Vec<String> = Vec::new();
        let records = self.records.borrow();
        for seen in records.iter().filter(|seen| seen.at > after) {
            let holder = seen.holder.as_deref().unwrap_or("-");
            if holders.last().map(String::as_str) != Some(holder) {
                holders.push(holder.to_string());
            }
        }
        holders
    }
}

impl Drop for LeaseLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === impl Seen ===

impl Seen {
    fn of(lease: &Lease) -> Seen {
        let spec = lease.spec.clone().unwrap_or_default();
        Seen {
            at: Timestamp::now(),
            holder: spec.holder_identity.filter(|holder| !holder.is_empty()),
            preferred: spec.preferred_holder.filter(|holder| !holder.is_empty()),
            acquired: spec.acquire_time.map(|time| time.0),
        }
    }
}
