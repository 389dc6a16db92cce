//! Faults that strike a replica process or the Lease: graceful exit, crash, deposition by
//! another holder, a Lease deleted by hand.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use tokio::time::Instant;

use crate::{
    CONVERGE, Cluster, Replica,
    chaos::{
        LeaseHistory, delete_lease, last_slice_write, lease_acquire_time, log_time, release_lease,
        slice_versions, slice_writes, take_lease, wait_any_leading, wait_gauge,
        world::{
            BEFORE_FAULT, CHANGES, LEASE_DURATION, Member, RENEW_DEADLINE, RETRY_PERIOD, SLACK,
            WORKERS, World,
        },
    },
    eventually,
};

/// SIGTERM to the leader mid-stream: it drains, releases the Lease (holder cleared in the
/// record), exits 0; a follower leads at once and converges.
pub async fn hand_over(world: &mut World<'_>, members: &mut Vec<Member>) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let history = LeaseHistory::start(&world.cluster).await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let mut old = members.remove(index);
    old.replica.terminate();
    let status = old.replica.wait_exit(CONVERGE).await;
    let exited = Instant::now();
    assert!(status.success(), "{status}; log:\n{}", old.replica.log());
    let log = old.replica.log();
    let drained = log.find(r#""message":"drained""#);
    let released = log.find(r#""message":"released the lease""#);
    assert!(
        drained.is_some() && released.is_some() && drained < released,
        "drained, then released the lease:\n{log}"
    );

    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (new, led) = wait_any_leading(&world.cluster, &replicas).await;
    let took = led.saturating_duration_since(exited);
    let signalled = log_time(
        &old.replica,
        "shutting down: draining, then releasing the lease",
    );
    let acquired = lease_acquire_time(&world.cluster).await;
    eprintln!(
        "hand-over: a follower leads {took:?} after the old leader exited, {:?} after SIGTERM",
        signalled
            .zip(acquired)
            .map(|(from, to)| from.duration_until(to))
    );
    assert!(
        took < LEASE_DURATION,
        "a released lease is taken without waiting for it to expire ({took:?})"
    );
    let old_identity = Some(old.replica.identity.clone());
    let new_identity = Some(members[new].replica.identity.clone());
    eventually("the release in the Lease history", CONVERGE, || async {
        let holders = history.holders();
        let released = [old_identity.clone(), None, new_identity.clone()];
        if holders.windows(3).any(|window| window == released) {
            Ok(())
        } else {
            Err(format!("holders {holders:?}"))
        }
    })
    .await;
    world.settle(churn).await;
    world.retire(old);
}

/// SIGKILL to the leader mid-stream: a follower leads once the lease runs out, not before, and
/// converges.
pub async fn crash(world: &mut World<'_>, members: &mut Vec<Member>) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let mut old = members.remove(index);
    old.replica.kill();
    let killed = Instant::now();
    let killed_at = Timestamp::now();
    let status = old.replica.wait_exit(CONVERGE).await;
    assert!(!status.success(), "killed: {status}");

    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (_, led) = wait_any_leading(&world.cluster, &replicas).await;
    let took = led.saturating_duration_since(killed);
    eprintln!("crash: a follower leads {took:?} after SIGKILL");
    // The last renewal was at most a RetryPeriod before the kill, and a follower waits a full
    // LeaseDuration from its own observation of it (acquireTime: the new leader's wall clock,
    // which is this machine's).
    let acquired = lease_acquire_time(&world.cluster).await.unwrap();
    // Negative (taken before the kill) counts as zero.
    let expired_after = Duration::try_from(killed_at.duration_until(acquired)).unwrap_or_default();
    assert!(
        expired_after + RETRY_PERIOD >= LEASE_DURATION,
        "taken over {expired_after:?} after the kill, before the lease ran out"
    );
    assert!(
        took <= LEASE_DURATION + RETRY_PERIOD + 2 * SLACK,
        "fail-over took {took:?}"
    );
    world.settle(churn).await;
    world.retire(old);
}

/// Another holder takes the Lease mid-stream: the old leader steps down and, while the intruder
/// holds the Lease and the client keeps changing objects, no slice is written at all; after the
/// release a replica leads and converges.
pub async fn deposition(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let old = &members[index].replica;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    take_lease(&world.cluster, "intruder", 3600).await;
    wait_gauge(old, false, RENEW_DEADLINE).await;
    // A write already sent when the deposition was seen cannot be recalled; one fenced before
    // the call may still land after it. Wait for the old term's work to end: at most one such
    // write per worker, and from then on nothing at all.
    let at_step_down = slice_writes(old).await;
    eventually(
        "the old leader's in-flight work to end",
        CONVERGE,
        || async {
            match old.metric("external_endpoints_queue_in_flight", "").await? {
                0.0 => Ok(()),
                n => Err(format!("{n} in flight")),
            }
        },
    )
    .await;
    let in_flight_writes = slice_writes(old).await - at_step_down;
    assert!(
        in_flight_writes <= WORKERS,
        "{in_flight_writes} writes after the step-down"
    );
    eprintln!("deposition: {in_flight_writes} writes in flight at the step-down landed");
    let deposed = Timestamp::now();
    let versions = slice_versions(&world.cluster).await;
    let mut writes = Vec::new();
    for member in members.iter() {
        writes.push(slice_writes(&member.replica).await);
    }

    // The rest of the client's changes, and one certain to change a slice, land meanwhile.
    let (model, _) = churn.finish().await;
    world.model = model;
    world.unapplied_change().await;
    world
        .nothing_written(members, RENEW_DEADLINE + RETRY_PERIOD)
        .await;
    assert_eq!(slice_versions(&world.cluster).await, versions);
    if let Some(last) = last_slice_write(&world.cluster).await {
        assert!(
            last <= deposed,
            "a slice written at {last}, deposed at {deposed}"
        );
    }
    for (member, before) in members.iter().zip(writes) {
        let after = slice_writes(&member.replica).await;
        assert_eq!(after, before, "{} wrote slices", member.replica.identity);
    }
    let fenced = old
        .metric("external_endpoints_fenced_writes_total", "")
        .await
        .unwrap();
    eprintln!("deposition: the old leader's fence refused {fenced} writes");

    // The intruder also deletes one managed slice and empties another (the stale-tracker
    // scenario): whoever leads next must rewrite them, not wait for its cache forever.
    tamper_with_slices(&world.cluster).await;

    release_lease(&world.cluster).await;
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    wait_any_leading(&world.cluster, &replicas).await;
    let model = world.model.clone();
    model.wait_reflected(&world.cluster, None).await;
}

/// Deletes the first managed slice and empties the endpoints of the last, if there are two.
async fn tamper_with_slices(cluster: &Cluster) {
    let mut slices = cluster.slices().await;
    let api = cluster.slices_api();
    if let Some(first) = slices.first() {
        let name = first.metadata.name.clone().unwrap();
        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    if slices.len() > 1
        && let Some(mut last) = slices.pop()
    {
        last.endpoints = Some(Vec::new());
        let name = last.metadata.name.clone().unwrap();
        api.replace(&name, &PostParams::default(), &last)
            .await
            .unwrap();
    }
}

/// The Lease is deleted by hand mid-stream: the leader stops at once (a definite loss), a
/// replica re-creates the Lease and leads in a new term, and the slices converge.
pub async fn lease_deleted(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let old = &members[index].replica;
    let step_downs = old
        .metric("external_endpoints_leader_step_downs_total", "")
        .await
        .unwrap();
    let term = old
        .metric("external_endpoints_leader_term", "")
        .await
        .unwrap();
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    delete_lease(&world.cluster).await;
    eventually("the old leader to count a step-down", CONVERGE, || async {
        let now = old
            .metric("external_endpoints_leader_step_downs_total", "")
            .await?;
        if now > step_downs {
            Ok(())
        } else {
            Err(format!("{now} step-downs"))
        }
    })
    .await;
    let (new, _) = wait_any_leading(&world.cluster, &replicas).await;
    if new == index {
        let now = old
            .metric("external_endpoints_leader_term", "")
            .await
            .unwrap();
        assert!(now > term, "re-acquired in a new term ({term} → {now})");
    }
    world.settle(churn).await;
}
