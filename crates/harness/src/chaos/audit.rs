//! Who wrote what, and who led when: the checks that hold across every fault.
//!
//! - [`WriteAudit`] watches the managed slices and the Lease. etcd numbers every write of every
//!   object with one revision (the resourceVersion), so "the holder at the moment of a slice
//!   write" is the holder of the last Lease write before it. Each slice write is attributed to a
//!   replica from the API server's own record, its audit log ([`testbed::AuditEvent`], the
//!   testbed started with [`testbed::Options::audit_log`]): each replica is a user of its own
//!   (its identity; see [`World::member`](super::world::World::member)), and the record of a
//!   create, update or patch carries the resourceVersion it gave the slice; a delete, the name.
//!   No replica's log text is read. A write that lands within a few seconds of its replica
//!   losing the Lease by force (deleted, or taken by a holder that is not a replica) was in
//!   flight when that happened and is counted apart.
//! - [`LeaderMonitor`] (in `monitor.rs`) samples every replica's `external_endpoints_leader`
//!   gauge: two leaders in one sample, and the longest stretch with none.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, WatchEvent, WatchParams};
use parking_lot::Mutex;
use slices::{Config, MANAGED_BY_LABEL};
use tokio::{task::JoinHandle, time::Instant};

use testbed::{AuditEvent, Testbed};

pub use super::monitor::{LeaderMonitor, MonitorState};
use super::{DELETED, LeaseHistory, LeaseRecord, version_of};
use crate::{Cluster, Replica};

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
pub struct WriteAudit<'a> {
    testbed: &'a Testbed,
    namespace: String,
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
    /// Writes the API server's audit log names a replica for. Zero while the controller wrote
    /// means the audit no longer reads that record (no audit log, or replicas that share a
    /// user).
    pub attributed: usize,
    /// Writes the audit log names no replica for (the test's own, as the admin).
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

impl<'a> WriteAudit<'a> {
    /// Starts watching from now. `testbed` must keep an audit log
    /// ([`testbed::Options::audit_log`]).
    pub async fn start(testbed: &'a Testbed, cluster: &Cluster) -> WriteAudit<'a> {
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
            testbed,
            namespace: cluster.namespace.clone(),
            lease,
            writes,
            gaps,
            task,
        }
    }

    /// Attributes every slice write seen so far to the replicas (from the API server's audit
    /// log) and checks it against the Lease holder at that revision.
    pub fn check(&self, replicas: &[&Replica]) -> AuditReport {
        let events: Vec<AuditEvent> = self
            .testbed
            .audit_events()
            .unwrap()
            .into_iter()
            .filter(|event| event.namespace == self.namespace && event.succeeded())
            .collect();
        let record = Record::of(&events);
        let identities: BTreeSet<&str> = replicas.iter().map(|r| r.identity.as_str()).collect();
        let leases = self.lease.records();
        let writes = self.writes.lock().clone();
        let mut report = AuditReport {
            writes: writes.len(),
            gaps: *self.gaps.lock(),
            ..AuditReport::default()
        };
        for write in &writes {
            let writers: BTreeSet<String> = record
                .writers(write)
                .into_iter()
                .filter(|user| identities.contains(user.as_str()))
                .collect();
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
                    "{} of slice {} at revision {} by {writers:?} while the Lease named {holder:?} \
                     ({:?})",
                    if write.deleted { "delete" } else { "write" },
                    write.name,
                    write.version,
                    record.times(write),
                ));
            }
        }
        report
    }
}

impl Drop for WriteAudit<'_> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Who made which slice write, from the audit log's successful writes of one namespace.
#[derive(Debug, Default)]
struct Record {
    /// (name, resourceVersion it got) → its requests, from creates, updates and patches.
    written: BTreeMap<(String, u64), Vec<AuditEvent>>,
    /// name → its requests, from deletes.
    deleted: BTreeMap<String, Vec<AuditEvent>>,
}

// === impl Record ===

impl Record {
    fn of(events: &[AuditEvent]) -> Record {
        let mut record = Record::default();
        for event in events {
            match event.verb.as_str() {
                "create" | "update" | "patch" => {
                    let version = event
                        .resource_version
                        .as_deref()
                        .and_then(|v| v.parse().ok());
                    if let Some(version) = version {
                        let key = (event.name.clone(), version);
                        record.written.entry(key).or_default().push(event.clone());
                    }
                }
                "delete" => {
                    let requests = record.deleted.entry(event.name.clone()).or_default();
                    requests.push(event.clone());
                }
                _ => {}
            }
        }
        record
    }

    /// The requests that made `write` (empty when the record does not have it).
    fn requests(&self, write: &SliceWrite) -> &[AuditEvent] {
        let found = if write.deleted {
            self.deleted.get(&write.name)
        } else {
            self.written.get(&(write.name.clone(), write.version))
        };
        found.map_or(&[], Vec::as_slice)
    }

    /// The users who made `write` (empty when the record does not have it).
    fn writers(&self, write: &SliceWrite) -> BTreeSet<String> {
        let requests = self.requests(write).iter();
        requests.map(|request| request.user.clone()).collect()
    }

    /// When the API server received and answered the requests that made `write`.
    fn times(&self, write: &SliceWrite) -> Vec<String> {
        let show = |time: Option<k8s_openapi::jiff::Timestamp>| {
            time.map_or_else(|| "?".to_string(), |time| time.to_string())
        };
        self.requests(write)
            .iter()
            .map(|request| {
                let (received, completed) = (show(request.received), show(request.completed));
                format!(
                    "{} by {}: received {received}, answered {completed}",
                    request.verb, request.user
                )
            })
            .collect()
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

    fn event(verb: &str, user: &str, version: Option<&str>) -> AuditEvent {
        AuditEvent {
            verb: verb.into(),
            user: user.into(),
            user_agent: "external-endpoints".into(),
            namespace: "chaos".into(),
            name: "linkerd-external-web-x1".into(),
            code: 200,
            resource_version: version.map(String::from),
            received: None,
            completed: None,
        }
    }

    #[test]
    fn each_write_is_attributed_to_the_user_the_audit_log_names() {
        let record = Record::of(&[
            event("create", "r1", Some("10")),
            event("update", "r2", Some("12")),
            event("patch", "admin", Some("13")),
        ]);
        let one = |user: &str| BTreeSet::from([user.to_string()]);
        assert_eq!(record.writers(&write(10, Instant::now())), one("r1"));
        assert_eq!(record.writers(&write(12, Instant::now())), one("r2"));
        assert_eq!(record.writers(&write(13, Instant::now())), one("admin"));
        // A write the record does not have (a resourceVersion no write of its gave).
        assert!(record.writers(&write(11, Instant::now())).is_empty());
        let mut deleted = write(14, Instant::now());
        deleted.deleted = true;
        assert!(record.writers(&deleted).is_empty());
        let record = Record::of(&[event("delete", "r2", None)]);
        assert_eq!(record.writers(&deleted), one("r2"));
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
