//! Elector tests against the in-memory store, in paused time.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

mod acquire;
mod faults;
mod record;
mod release;
mod step_down;

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::*;
use crate::{store::MemoryLeaseStore, term::Term};

const RETRY: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const LEASE_DURATION: Duration = Duration::from_secs(15);

fn candidate(store: &MemoryLeaseStore, identity: &str) -> ElectorHandle {
    let config = LeaseConfig::new("lease", "ns", identity, LeaseTimings::default());
    LeaseElector::new(config.expect("valid config"), store.clone()).spawn()
}

fn current(handle: &ElectorHandle) -> Option<Term> {
    handle.leadership().borrow().clone()
}

fn spec(store: &MemoryLeaseStore) -> LeaseSpec {
    store
        .current()
        .and_then(|lease| lease.spec)
        .expect("lease exists")
}

fn holder_lease(holder: &str, renewed: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("lease".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            acquire_time: Some(MicroTime(renewed)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// Waits (in paused time) until `handle` leads or not, failing after `within`.
async fn wait_leading(handle: &ElectorHandle, leading: bool, within: Duration) -> Instant {
    let mut leadership = handle.leadership();
    timeout(
        within,
        leadership.wait_for(|term| term.is_some() == leading),
    )
    .await
    .unwrap_or_else(|_| panic!("leading={leading} not reached within {within:?}"))
    .expect("elector alive");
    Instant::now()
}

/// A candidate `identity` on `store`, once it leads: alone, it does within 10 ms.
async fn leading_candidate(store: &MemoryLeaseStore, identity: &str) -> ElectorHandle {
    let handle = candidate(store, identity);
    wait_leading(&handle, true, Duration::from_millis(10)).await;
    handle
}

/// "a" leading on a connection of its own to `store`, then "b" on another, given a RetryPeriod
/// to see a's Lease: (a's connection, b's connection, a, b).
async fn a_leads_b_follows(
    store: &MemoryLeaseStore,
) -> (
    MemoryLeaseStore,
    MemoryLeaseStore,
    ElectorHandle,
    ElectorHandle,
) {
    let (a_conn, b_conn) = (store.connect(), store.connect());
    let a = leading_candidate(&a_conn, "a").await;
    let b = candidate(&b_conn, "b");
    sleep(RETRY).await;
    (a_conn, b_conn, a, b)
}

/// Deletes the lease; `a`, following, waits RenewDeadline from the deletion (the last holder may
/// act until then), then leads within `within`.
async fn deletion_waited_out(store: &MemoryLeaseStore, a: &ElectorHandle, within: Duration) {
    store.put(None);
    let deleted = Instant::now();
    sleep_until(deleted + RENEW_DEADLINE - Duration::from_millis(10)).await;
    assert!(
        current(a).is_none(),
        "a waited out the deleted record's claim"
    );
    let led = wait_leading(a, true, within).await;
    assert!(led >= deleted + RENEW_DEADLINE);
}

/// Waits until `store` has been written once more (in paused time, polling every 10 ms), failing
/// after a LeaseDuration: a leader renews every RetryPeriod.
async fn next_write(store: &MemoryLeaseStore) {
    let writes = store.writes().len();
    timeout(LEASE_DURATION, async {
        while store.writes().len() == writes {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a write within a LeaseDuration");
}
