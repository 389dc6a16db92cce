//! The Lease as the chaos tests see and change it: its history as a watch delivers it (every
//! write, in order), and a foreign holder taking it over, releasing or deleting it.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use crate::{CONVERGE, Cluster, LEASE, eventually};

/// The Lease records as a watch delivered them (every write, in order).
pub struct LeaseHistory {
    records: watch::Receiver<Vec<LeaseRecord>>,
    task: JoinHandle<()>,
}

/// One write of the Lease.
#[derive(Clone, Debug)]
pub struct LeaseRecord {
    /// The holder (None when released; [`DELETED`] when the Lease was deleted).
    pub holder: Option<String>,
    /// When the test saw it.
    pub seen: Instant,
    /// Its resourceVersion (etcd's revision: comparable with any other object's).
    pub version: u64,
}

/// The holder recorded when the Lease is deleted.
pub const DELETED: &str = "<deleted>";

// === impl LeaseHistory ===

impl LeaseHistory {
    /// Starts recording the e2e Lease: its record now, then every write.
    pub async fn start(cluster: &Cluster) -> LeaseHistory {
        let leases = cluster.leases();
        let by_name = format!("metadata.name={LEASE}");
        let list = leases
            .list(&ListParams::default().fields(&by_name))
            .await
            .unwrap();
        let mut version = list.metadata.resource_version.unwrap_or_default();
        // The record as it is now, then every later write.
        let current = list.items.first().map(|lease| LeaseRecord {
            holder: holder(lease),
            seen: Instant::now(),
            version: version_of(lease),
        });
        let (sender, records) = watch::channel(Vec::from_iter(current));
        let task = tokio::spawn(async move {
            loop {
                let params = WatchParams::default().fields(&by_name);
                let stream = match leases.watch(&params, &version).await {
                    Ok(stream) => stream,
                    Err(kube::Error::Api(status)) if status.code == 410 => {
                        // The history was compacted (or the API server restarted): carry on
                        // from the record as it is now; writes in between are not seen.
                        version = relist(&leases, &by_name, &sender).await;
                        continue;
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let mut stream = stream.boxed();
                while let Ok(Some(event)) = stream.try_next().await {
                    let (lease, deleted) = match event {
                        WatchEvent::Added(lease) | WatchEvent::Modified(lease) => (lease, false),
                        WatchEvent::Deleted(lease) => (lease, true),
                        WatchEvent::Error(status) if status.code == 410 => {
                            version = relist(&leases, &by_name, &sender).await;
                            break;
                        }
                        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => continue,
                    };
                    version = lease.metadata.resource_version.clone().unwrap_or_default();
                    let record = LeaseRecord {
                        holder: if deleted {
                            Some(DELETED.to_string())
                        } else {
                            holder(&lease)
                        },
                        seen: Instant::now(),
                        version: version_of(&lease),
                    };
                    sender.send_modify(|records| records.push(record));
                }
            }
        });
        LeaseHistory { records, task }
    }

    /// The records so far.
    pub fn records(&self) -> Vec<LeaseRecord> {
        self.records.borrow().clone()
    }

    /// The holders in order, consecutive repeats (renewals) collapsed.
    pub fn holders(&self) -> Vec<Option<String>> {
        let mut holders: Vec<Option<String>> = Vec::new();
        for record in self.records() {
            if holders.last() != Some(&record.holder) {
                holders.push(record.holder);
            }
        }
        holders
    }
}

impl Drop for LeaseHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Lists the Lease again after a 410 Gone, records it if it changed, and returns the list's
/// resourceVersion to watch from.
async fn relist(
    leases: &kube::Api<Lease>,
    by_name: &str,
    sender: &watch::Sender<Vec<LeaseRecord>>,
) -> String {
    loop {
        match leases.list(&ListParams::default().fields(by_name)).await {
            Ok(list) => {
                let version = list.metadata.resource_version.unwrap_or_default();
                let record = match list.items.first() {
                    Some(lease) => LeaseRecord {
                        holder: holder(lease),
                        seen: Instant::now(),
                        version: version_of(lease),
                    },
                    None => LeaseRecord {
                        holder: Some(DELETED.to_string()),
                        seen: Instant::now(),
                        version: version.parse().unwrap_or_default(),
                    },
                };
                sender.send_modify(|records| {
                    if records
                        .last()
                        .is_none_or(|last| last.version != record.version)
                    {
                        records.push(record);
                    }
                });
                return version;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// An object's resourceVersion as a number (0 if it has none).
pub fn version_of(object: &impl kube::Resource) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|version| version.parse().ok())
        .unwrap_or_default()
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.clone())
        .filter(|holder| !holder.is_empty())
}

// === Lease take-over ===

/// Makes `holder` the Lease holder for `seconds` through the API, as another controller
/// would (creating the Lease if missing).
pub async fn take_lease(cluster: &Cluster, holder: &str, seconds: i32) {
    update_lease(cluster, |spec| {
        spec.holder_identity = Some(holder.to_string());
        spec.lease_duration_seconds = Some(seconds);
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    })
    .await
}

/// Clears the holder, as a graceful release does.
pub async fn release_lease(cluster: &Cluster) {
    update_lease(cluster, |spec| {
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
    })
    .await
}

async fn update_lease(cluster: &Cluster, change: impl Fn(&mut LeaseSpec)) {
    let leases = cluster.leases();
    eventually("the lease write", CONVERGE, || async {
        let written = match leases.get_opt(LEASE).await.map_err(|e| e.to_string())? {
            Some(mut lease) => {
                change(lease.spec.get_or_insert_with(Default::default));
                leases.replace(LEASE, &PostParams::default(), &lease).await
            }
            None => {
                let mut lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(LEASE.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec::default()),
                };
                change(lease.spec.as_mut().unwrap());
                leases.create(&PostParams::default(), &lease).await
            }
        };
        written.map(|_| ()).map_err(|e| e.to_string())
    })
    .await
}

/// Deletes the Lease, as an operator might by hand.
pub async fn delete_lease(cluster: &Cluster) {
    cluster
        .leases()
        .delete(LEASE, &DeleteParams::default())
        .await
        .unwrap();
}

/// The Lease's acquireTime (None without a Lease).
pub async fn lease_acquire_time(cluster: &Cluster) -> Option<Timestamp> {
    cluster
        .lease()
        .await
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.acquire_time)
        .map(|time| time.0)
}

/// The Lease's renewTime (None without a Lease).
pub async fn lease_renew_time(cluster: &Cluster) -> Option<Timestamp> {
    cluster
        .lease()
        .await
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.renew_time)
        .map(|time| time.0)
}
