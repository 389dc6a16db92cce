//! Chaos: the world the chaos tests (`tests/chaos.rs`, `tests/control_plane.rs`) and the soak
//! bench share, the faults they strike, and the checks that hold across every fault.
//!
//! | module | what |
//! |---|---|
//! | [`world`] | one namespace, the client's model, the replicas ([`world::Member`]), the timings |
//! | [`churn`] | the client that keeps changing objects, and its model to check slices against |
//! | [`fault`] | the faults a soak draws from, and how each is struck |
//! | [`faults`] | graceful exit, crash, deposition, Lease deleted |
//! | [`network`] | outage, flap, SIGTERM while cut off, connection resets (through an [`HttpProxy`]) |
//! | [`quiet`] | quiet faults: watches stalled (leader, follower), requests held |
//! | [`control`] | API server or etcd restarted, watch expiry, one of two API servers cut off |
//! | [`latency`] | a slow API server |
//! | [`lease`] | the Lease's history, a foreign holder taking it, releasing or deleting it |
//! | [`audit`] | who wrote what (the API server's audit log) while who led |
//! | [`monitor`] | two leaders at once, the longest stretch without one |
//!
//! Here: snapshots of slice writes, and waits on the leader gauge.
//!
//! ```text
//!  Churn (model + random changes) ──► API ◄── replicas (some through an HttpProxy each)
//!  LeaseHistory ◄── watch of the Lease         slices ──► Model::check / SliceVersions
//! ```
//!
//! [`HttpProxy`]: crate::proxy::HttpProxy

pub mod audit;
pub mod churn;
pub mod control;
pub mod fault;
pub mod faults;
pub mod latency;
pub mod lease;
pub mod monitor;
pub mod network;
pub mod quiet;
pub mod world;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

pub use lease::{
    DELETED, LeaseHistory, LeaseRecord, delete_lease, lease_acquire_time, lease_renew_time,
    release_lease, take_lease, version_of,
};

use crate::{CONVERGE, Cluster, Replica, eventually};

/// Name → resourceVersion of the managed slices: any write changes it.
pub type SliceVersions = BTreeMap<String, String>;

// === slice snapshots ===

/// The managed slices' resourceVersions.
pub async fn slice_versions(cluster: &Cluster) -> SliceVersions {
    cluster
        .slices()
        .await
        .into_iter()
        .map(|slice| {
            let name = slice.metadata.name.unwrap_or_default();
            (name, slice.metadata.resource_version.unwrap_or_default())
        })
        .collect()
}

/// The latest `time` of any managedFields entry of the managed slices (second precision,
/// rounded down by the API server).
pub async fn last_slice_write(cluster: &Cluster) -> Option<Timestamp> {
    cluster
        .slices()
        .await
        .into_iter()
        .flat_map(|slice| slice.metadata.managed_fields.unwrap_or_default())
        .filter_map(|entry| entry.time.map(|time| time.0))
        .max()
}

// === replicas ===

/// When the replica last logged `message` (its JSON log's `timestamp`, this machine's clock).
pub fn log_time(replica: &Replica, message: &str) -> Option<Timestamp> {
    replica
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["message"] == message)
        .filter_map(|entry| entry["timestamp"].as_str()?.parse().ok())
        .next_back()
}

/// Successful slice writes of a replica (every operation).
pub async fn slice_writes(replica: &Replica) -> f64 {
    replica
        .metric("external_endpoints_slice_writes_total", "")
        .await
        .unwrap()
}

/// Waits until the replica's `external_endpoints_leader` is `leading`; returns when it was
/// first seen so.
pub async fn wait_gauge(replica: &Replica, leading: bool, timeout: Duration) -> Instant {
    let what = format!("{} leading={leading}", replica.identity);
    eventually(&what, timeout, || async {
        let gauge = replica.metric("external_endpoints_leader", "").await?;
        if (gauge == 1.0) == leading {
            Ok(Instant::now())
        } else {
            Err(format!("gauge {gauge}"))
        }
    })
    .await
}

/// Waits until one of `replicas` leads and the Lease names it; returns its index and when it
/// was first seen leading.
pub async fn wait_any_leading(cluster: &Cluster, replicas: &[&Replica]) -> (usize, Instant) {
    let (index, seen) = eventually("a replica to lead", CONVERGE, || async {
        for (index, replica) in replicas.iter().enumerate() {
            if replica.is_leader().await {
                return Ok((index, Instant::now()));
            }
        }
        Err("nobody leads".to_string())
    })
    .await;
    let identity = &replicas[index].identity;
    assert_eq!(
        cluster.lease_holder().await.as_ref(),
        Some(identity),
        "the Lease names the leading replica"
    );
    (index, seen)
}
