//! Who wrote what, and who led when: the checks that hold across every fault.
//!
//! - [`WriteAudit`] watches the managed slices and the Lease. etcd numbers every write of every
//!   object with one revision (the resourceVersion), so "the holder at the moment of a slice
//!   write" is the holder of the last Lease write before it. Each slice write is attributed to a
//!   replica through the replica's own log (`wrote slice` carries the resourceVersion the API
//!   returned for a create or update; `deleted slice` carries the name). A write that lands
//!   within a few seconds of its replica losing the Lease by force (deleted, or taken by a
//!   holder that is not a replica) was in flight when that happened and is counted apart.
//! - [`LeaderMonitor`] samples every replica's `external_endpoints_leader` gauge: two leaders in
//!   one sample, and the longest stretch with none.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, WatchEvent, WatchParams};
use parking_lot::Mutex;
use slices::{Config, MANAGED_BY_LABEL};
use tokio::{task::JoinHandle, time::Instant};

use super::{DELETED, LeaseHistory, LeaseRecord, version_of};
use crate::{Cluster, Replica, sum_metric};

/// One write of a managed slice, as the watch delivered it.
#[derive(Clone, Debug)]
struct SliceWrite {
    version: u64,
    name: String,
    deleted: bool,
    /// When the audit's watch delivered it.
    seen: Instant,
}

/// How late a write sent while its replica held the Lease may land after the Lease was taken
/// from it by force: the chaos world's RenewDeadline, far above a request's time on the testbed.
const LATE_WRITE_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// Watches slice writes and Lease writes for [`WriteAudit::check`].
pub struct WriteAudit {
    lease: LeaseHistory,
    writes: Arc<Mutex<Vec<SliceWrite>>>,
    /// Times the slice watch lost history (410 Gone) and re-listed: writes in between are not
    /// audited.
    gaps: Arc<Mutex<usize>>,
    task: JoinHandle<()>,
}

/// What [`WriteAudit::check`] found.
#[derive(Clone, Debug, Default)]
pub struct AuditReport {
    /// Slice writes seen.
    pub writes: usize,
    /// Writes a replica's log claims (the rest are the test's own, or from a replica whose
    /// log is gone). Zero while the controller wrote means the audit no longer reads its logs.
    pub attributed: usize,
    /// Writes no replica's log claims (the test's own, or a replica's log that is gone).
    pub unattributed: usize,
    /// Writes by a replica while the Lease named another replica, or nobody (released).
    pub by_non_holder: Vec<String>,
    /// Writes by a replica within 3 s of a foreign holder taking the Lease from it or the Lease
    /// being deleted (a forced deposition: writes already in flight may land, even after
    /// another replica acquired; the fault's own test bounds them).
    pub after_forced: usize,
    /// Re-lists of the slice watch (history not audited).
    pub gaps: usize,
}

// === impl WriteAudit ===

impl WriteAudit {
    /// Starts watching from now.
    pub async fn start(cluster: &Cluster) -> WriteAudit {
        let lease = LeaseHistory::start(cluster).await;
        let api = cluster.slices_api();
        let selector = format!("{MANAGED_BY_LABEL}={}", Config::default().managed_by());
        let writes = Arc::new(Mutex::new(Vec::new()));
        let gaps = Arc::new(Mutex::new(0));
        let list_params = ListParams::default().labels(&selector);
        let mut version = api
            .list(&list_params)
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap_or_default();
        let task = {
            let (writes, gaps) = (writes.clone(), gaps.clone());
            tokio::spawn(async move {
                loop {
                    let params = WatchParams::default().labels(&selector);
                    let mut gone = false;
                    match api.watch(&params, &version).await {
                        Ok(stream) => {
                            let mut stream = stream.boxed();
                            while let Ok(Some(event)) = stream.try_next().await {
                                let (slice, deleted): (EndpointSlice, bool) = match event {
                                    WatchEvent::Added(slice) | WatchEvent::Modified(slice) => {
                                        (slice, false)
                                    }
                                    WatchEvent::Deleted(slice) => (slice, true),
                                    WatchEvent::Bookmark(bookmark) => {
                                        version = bookmark.metadata.resource_version;
                                        continue;
                                    }
                                    WatchEvent::Error(status) => {
                                        gone = status.code == 410;
                                        break;
                                    }
                                };
                                version =
                                    slice.metadata.resource_version.clone().unwrap_or_default();
                                writes.lock().push(SliceWrite {
                                    version: version_of(&slice),
                                    name: slice.metadata.name.clone().unwrap_or_default(),
                                    deleted,
                                    seen: Instant::now(),
                                });
                            }
                        }
                        Err(kube::Error::Api(status)) if status.code == 410 => gone = true,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                    if gone {
                        *gaps.lock() += 1;
                        if let Ok(list) = api.list(&list_params).await {
                            version = list.metadata.resource_version.unwrap_or_default();
                        }
                    }
                }
            })
        };
        WriteAudit {
            lease,
            writes,
            gaps,
            task,
        }
    }

    /// Attributes every slice write seen so far to the replicas (from their logs) and checks
    /// it against the Lease holder at that revision.
    pub fn check(&self, replicas: &[&Replica]) -> AuditReport {
        let mut written: BTreeMap<(String, u64), String> = BTreeMap::new();
        let mut deleted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for replica in replicas {
            for line in replica.log().lines() {
                let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                let Some(slice) = entry["slice"].as_str() else {
                    continue;
                };
                match entry["message"].as_str() {
                    // The writer's debug lines: creates and updates, then deletes.
                    Some("wrote slice") => {
                        if let Some(version) =
                            entry["version"].as_str().and_then(|v| v.parse().ok())
                        {
                            written.insert((slice.to_string(), version), replica.identity.clone());
                        }
                    }
                    Some("deleted slice") => {
                        deleted
                            .entry(slice.to_string())
                            .or_default()
                            .insert(replica.identity.clone());
                    }
                    _ => {}
                }
            }
        }
        let identities: BTreeSet<&str> = replicas.iter().map(|r| r.identity.as_str()).collect();
        let leases = self.lease.records();
        let writes = self.writes.lock().clone();
        let mut report = AuditReport {
            writes: writes.len(),
            gaps: *self.gaps.lock(),
            ..AuditReport::default()
        };
        for write in &writes {
            let writers: BTreeSet<String> = if write.deleted {
                deleted.get(&write.name).cloned().unwrap_or_default()
            } else {
                written
                    .get(&(write.name.clone(), write.version))
                    .cloned()
                    .into_iter()
                    .collect()
            };
            if writers.is_empty() {
                report.unattributed += 1;
                continue;
            }
            report.attributed += 1;
            let Some(holder) = holder_before(&leases, write.version) else {
                // Before the first Lease record the audit saw: nothing to compare with.
                continue;
            };
            if holder.as_deref().is_some_and(|h| writers.contains(h)) {
                continue;
            }
            let forced = holder
                .as_deref()
                .is_some_and(|h| h == DELETED || !identities.contains(h))
                || lost_by_force(&leases, &writers, &identities, write);
            if forced {
                report.after_forced += 1;
            } else {
                report.by_non_holder.push(format!(
                    "{} of slice {} at revision {} by {writers:?} while the Lease named {holder:?}",
                    if write.deleted { "delete" } else { "write" },
                    write.name,
                    write.version,
                ));
            }
        }
        report
    }
}

impl Drop for WriteAudit {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The holder named by the last Lease write before `version` (None inside: released); None
/// outside when the audit saw no Lease write before it.
fn holder_before(leases: &[LeaseRecord], version: u64) -> Option<Option<String>> {
    leases
        .iter()
        .filter(|record| record.version < version)
        .max_by_key(|record| record.version)
        .map(|record| record.holder.clone())
}

/// Whether `write` landed within [`LATE_WRITE_BUDGET`] of its writers losing the Lease by force:
/// between the last Lease write naming one of them and the write, the Lease was deleted or taken
/// by a holder that is not a replica. A write sent while the writer held the Lease may land after
/// that, even once the next replica has acquired it (found by the soak: a Lease deleted by hand
/// and taken by the next replica 5 ms later, 13 ms before the old leader's two in-flight updates
/// landed); the fault's own test bounds those writes.
fn lost_by_force(
    leases: &[LeaseRecord],
    writers: &BTreeSet<String>,
    identities: &BTreeSet<&str>,
    write: &SliceWrite,
) -> bool {
    let version = write.version;
    let held = leases
        .iter()
        .filter(|r| r.version < version)
        .filter(|r| r.holder.as_ref().is_some_and(|h| writers.contains(h)))
        .map(|r| r.version)
        .max();
    let Some(held) = held else {
        return false;
    };
    leases
        .iter()
        .filter(|r| r.version > held && r.version < version)
        .filter(|r| write.seen.saturating_duration_since(r.seen) <= LATE_WRITE_BUDGET)
        .any(|r| {
            r.holder
                .as_deref()
                .is_some_and(|h| h == DELETED || !identities.contains(h))
        })
}

// === LeaderMonitor ===

/// Samples the leader gauge of every replica it was given, every 100 ms.
pub struct LeaderMonitor {
    replicas: Arc<Mutex<Vec<(String, SocketAddr)>>>,
    state: Arc<Mutex<MonitorState>>,
    task: JoinHandle<()>,
}

/// What the monitor saw.
#[derive(Clone, Debug, Default)]
pub struct MonitorState {
    /// Samples taken.
    pub samples: usize,
    /// Samples in which two or more replicas led, with who.
    pub overlaps: Vec<Vec<String>>,
    /// The longest stretch without a leader.
    pub longest_leaderless: Duration,
    /// Since when nobody leads (None while someone does).
    leaderless_since: Option<Instant>,
}

impl LeaderMonitor {
    /// Starts sampling (no replicas yet: see [`LeaderMonitor::add`]).
    pub fn start() -> LeaderMonitor {
        let replicas: Arc<Mutex<Vec<(String, SocketAddr)>>> = Arc::default();
        let state: Arc<Mutex<MonitorState>> = Arc::default();
        let task = {
            let (replicas, state) = (replicas.clone(), state.clone());
            tokio::spawn(async move {
                loop {
                    let targets = replicas.lock().clone();
                    let mut leading = Vec::new();
                    for (identity, admin) in targets {
                        if is_leader(admin).await {
                            leading.push(identity);
                        }
                    }
                    let now = Instant::now();
                    {
                        let mut state = state.lock();
                        state.samples += 1;
                        if leading.len() > 1 {
                            state.overlaps.push(leading.clone());
                        }
                        if leading.is_empty() {
                            let since = *state.leaderless_since.get_or_insert(now);
                            state.longest_leaderless = state.longest_leaderless.max(now - since);
                        } else {
                            state.leaderless_since = None;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        LeaderMonitor {
            replicas,
            state,
            task,
        }
    }

    /// Samples `replica` too, from now on (a replica that exits counts as not leading).
    pub fn add(&self, replica: &Replica) {
        let mut replicas = self.replicas.lock();
        if replicas
            .iter()
            .all(|(identity, _)| *identity != replica.identity)
        {
            replicas.push((replica.identity.clone(), replica.admin()));
        }
    }

    /// Stops sampling every replica but `replicas`. Call it once the others have exited and
    /// before new replicas start: a new admin server may get the port of one that exited, and
    /// would then be sampled under two names.
    pub fn retain(&self, replicas: &[&Replica]) {
        self.replicas
            .lock()
            .retain(|(identity, _)| replicas.iter().any(|r| r.identity == *identity));
    }

    /// What it saw so far.
    pub fn state(&self) -> MonitorState {
        self.state.lock().clone()
    }

    /// Forgets the longest leaderless stretch (a new round starts).
    pub fn reset_longest(&self) {
        self.state.lock().longest_leaderless = Duration::ZERO;
    }
}

impl Drop for LeaderMonitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn is_leader(admin: SocketAddr) -> bool {
    let scrape = tokio::time::timeout(Duration::from_secs(2), crate::http_get(admin, "/metrics"));
    match scrape.await {
        Ok(Ok((_, body))) => sum_metric(&body, "external_endpoints_leader", "") == Some(1.0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(version: u64, seen: Instant) -> SliceWrite {
        SliceWrite {
            version,
            name: "linkerd-external-web-x1".into(),
            deleted: false,
            seen,
        }
    }

    fn history(records: &[(&str, u64)]) -> Vec<LeaseRecord> {
        records
            .iter()
            .map(|&(holder, version)| LeaseRecord {
                holder: Some(holder.to_string()),
                seen: Instant::now(),
                version,
            })
            .collect()
    }

    #[test]
    fn a_write_landing_after_a_forced_loss_is_not_a_non_holder_write() {
        let writers = BTreeSet::from(["r6".to_string()]);
        let identities = BTreeSet::from(["r6", "r7"]);
        // r6 held it, the Lease was deleted by hand, r7 took it; r6's write lands after.
        let deleted = history(&[("r6", 990), (DELETED, 1003), ("r7", 1004)]);
        let landed = write(1005, Instant::now());
        assert!(lost_by_force(&deleted, &writers, &identities, &landed));
        // Taken by a holder that is not a replica (a deposition), then by r7.
        let deposed = history(&[("r6", 990), ("intruder", 1003), ("r7", 1004)]);
        assert!(lost_by_force(&deposed, &writers, &identities, &landed));
        // Not when it lands later than a request can take.
        let late = write(1005, Instant::now() + LATE_WRITE_BUDGET * 2);
        assert!(!lost_by_force(&deleted, &writers, &identities, &late));
    }

    #[test]
    fn a_write_after_a_plain_hand_over_is_a_non_holder_write() {
        let writers = BTreeSet::from(["r6".to_string()]);
        let identities = BTreeSet::from(["r6", "r7"]);
        let handed_over = history(&[("r6", 990), ("r7", 1004)]);
        let landed = write(1005, Instant::now());
        assert!(!lost_by_force(&handed_over, &writers, &identities, &landed));
        // A forced loss long before r6 held it again does not excuse a later write.
        let earlier = history(&[(DELETED, 900), ("r6", 990), ("r7", 1004)]);
        assert!(!lost_by_force(&earlier, &writers, &identities, &landed));
    }
}
