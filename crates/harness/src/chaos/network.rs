//! Faults of the network between one replica and the API server, through its [`Proxy`]: an
//! outage (cut or blackhole) longer than RenewDeadline, a flap shorter than it, SIGTERM while
//! cut off, and connections reset again and again.
//!
//! [`Proxy`]: crate::proxy::Proxy

use tokio::time::Instant;

use crate::{
    CONVERGE, Replica,
    chaos::{
        LeaseHistory, lease_acquire_time, lease_renew_time, log_time, slice_writes,
        wait_any_leading, wait_gauge,
        world::{
            BEFORE_FAULT, CHANGES, DRAIN_TIMEOUT, FLAP, LEASE_DURATION, Member, RENEW_DEADLINE,
            RESET_EVERY, RETRY_PERIOD, SLACK, World, acquisitions_of,
        },
    },
    eventually,
    proxy::Mode,
};

/// The leader's network is cut (or blackholed) mid-stream: it stops leading within
/// RenewDeadline, before any follower may take over; a follower leads and converges; after the
/// network is back the old leader stays a follower and writes nothing.
pub async fn outage(world: &mut World<'_>, members: &mut [Member], mode: Mode) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let old = &members[index];
    let proxy = old.proxy.as_ref().expect("the leader is proxied");
    let renew_failures = || async {
        old.replica
            .metric("external_endpoints_lease_renew_failures_total", "")
            .await
            .unwrap()
    };
    let failures = renew_failures().await;
    proxy.set(mode);
    let cut = Instant::now();
    let dropped = wait_gauge(&old.replica, false, CONVERGE).await;
    let took = dropped - cut;
    eprintln!("{mode:?}: the leader stopped leading {took:?} after the outage began");
    assert!(
        took <= RENEW_DEADLINE + SLACK,
        "stopped leading {took:?} after the outage (RenewDeadline {RENEW_DEADLINE:?})"
    );
    let writes = slice_writes(&old.replica).await;
    assert!(
        renew_failures().await > failures,
        "a leader that stopped for lack of renewals counts the failed ones"
    );

    let others: Vec<&Replica> = members
        .iter()
        .filter(|m| m.replica.identity != old.replica.identity)
        .map(|m| &m.replica)
        .collect();
    let (_, led) = wait_any_leading(&world.cluster, &others).await;
    // Exact order, on the one wall clock of this machine: the old leader's step-down (its log)
    // came before the new holder's acquisition (acquireTime, written by the new leader).
    let stopped = log_time(&old.replica, "stopped leading").expect("a step-down in the log");
    let acquired = lease_acquire_time(&world.cluster).await.unwrap();
    eprintln!(
        "{mode:?}: the old leader stopped {:?} before the new one acquired",
        stopped.duration_until(acquired)
    );
    assert!(
        stopped < acquired,
        "the old leader stopped at {stopped}, the new one acquired at {acquired}"
    );
    eprintln!(
        "{mode:?}: a follower leads {:?} after the outage began",
        led - cut
    );
    world.settle(churn).await;

    // Back on the network, the old leader reconnects, sees the new holder, and writes nothing
    // while the client keeps changing objects.
    let forwarded = proxy.forwarded();
    proxy.restore();
    let mut churn = world.churn(CHANGES / 2);
    eventually("the old leader to reconnect", CONVERGE, || async {
        if proxy.forwarded() > forwarded {
            Ok(())
        } else {
            Err("no new connection".to_string())
        }
    })
    .await;
    churn.wait_for(CHANGES / 4).await;
    world.settle(churn).await;
    assert!(!old.replica.is_leader().await, "the old leader leads again");
    assert_eq!(
        slice_writes(&old.replica).await,
        writes,
        "the old leader wrote after the outage"
    );
}

/// An outage shorter than RenewDeadline causes no step-down: same term, no new step-down, no
/// acquisition anywhere. It strikes right after a renewal, so it covers the next attempt (which
/// fails, or hangs until the restore) and ends well before the one after.
pub async fn flap(world: &mut World<'_>, members: &mut [Member], mode: Mode) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let leader = &members[index];
    let proxy = leader.proxy.as_ref().expect("the leader is proxied");
    let metric = |name: &'static str| async move { leader.replica.metric(name, "").await.unwrap() };
    let step_downs = metric("external_endpoints_leader_step_downs_total").await;
    let term = metric("external_endpoints_leader_term").await;
    let failures = metric("external_endpoints_lease_renew_failures_total").await;
    let mut acquisitions = Vec::new();
    for member in members.iter() {
        acquisitions.push(acquisitions_of(&member.replica).await);
    }
    let history = LeaseHistory::start(&world.cluster).await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let seen = history.records().len();
    eventually("a renewal", CONVERGE, || async {
        match history.records().len() {
            now if now > seen => Ok(()),
            _ => Err("no renewal".to_string()),
        }
    })
    .await;
    proxy.set(mode);
    tokio::time::sleep(FLAP).await;
    proxy.restore();
    eventually("the failed renewal to be counted", CONVERGE, || async {
        match metric("external_endpoints_lease_renew_failures_total").await {
            now if now > failures => Ok(()),
            now => Err(format!("{now} failures")),
        }
    })
    .await;
    let renewed_before = lease_renew_time(&world.cluster).await;
    eventually("a renewal after the outage", CONVERGE, || async {
        let renewed = lease_renew_time(&world.cluster).await;
        if renewed > renewed_before {
            Ok(())
        } else {
            Err(format!("renewTime {renewed:?}"))
        }
    })
    .await;
    assert_eq!(
        world.cluster.lease_holder().await.as_deref(),
        Some(leader.replica.identity.as_str())
    );
    assert!(leader.replica.is_leader().await, "still leading");
    assert_eq!(
        metric("external_endpoints_leader_step_downs_total").await,
        step_downs
    );
    assert_eq!(metric("external_endpoints_leader_term").await, term);
    for (member, before) in members.iter().zip(&acquisitions) {
        let after = acquisitions_of(&member.replica).await;
        assert_eq!(
            after, *before,
            "{} acquired the lease",
            member.replica.identity
        );
    }
    world.settle(churn).await;
}

/// SIGTERM to a leader that is cut off: it cannot drain or release, yet exits 0 within the drain
/// deadline (plus one bounded release attempt); a follower leads once the lease runs out.
pub async fn terminate_cut_off(world: &mut World<'_>, members: &mut Vec<Member>, mode: Mode) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let mut old = members.remove(index);
    let proxy = old.proxy.as_ref().expect("the leader is proxied");
    proxy.set(mode);
    let cut = Instant::now();
    old.replica.terminate();
    let status = old.replica.wait_exit(CONVERGE).await;
    let took = cut.elapsed();
    eprintln!("{mode:?}, then SIGTERM: exited {status} after {took:?}");
    assert!(status.success(), "{status}; log:\n{}", old.replica.log());
    // A worker blocked in a blackholed write holds the drain to its deadline; the release
    // attempt is bounded by RetryPeriod.
    assert!(
        took <= DRAIN_TIMEOUT + RETRY_PERIOD + 2 * SLACK,
        "exited {took:?} after SIGTERM"
    );

    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (_, led) = wait_any_leading(&world.cluster, &replicas).await;
    assert!(
        led - cut + RETRY_PERIOD + SLACK >= LEASE_DURATION,
        "taken over before the unreleased lease ran out ({:?})",
        led - cut
    );
    world.settle(churn).await;
    world.retire(old);
}

/// Every replica's connections are reset again and again mid-stream (as by a load balancer or
/// an API server restart): the leader converges; then it hands over, and the follower, whose
/// watches were reset as often, converges from its own cache (a lost event there would show as
/// a wrong slice written from the replay).
///
/// A reset kills the requests in flight, renewals included; two in a row end the term with these
/// timings (RenewDeadline = 3 × RetryPeriod), which the design allows, so a step-down is
/// reported, not failed.
pub async fn connection_resets(world: &mut World<'_>, members: &mut Vec<Member>) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let leader = &members[index].replica;
    let step_downs = leader
        .metric("external_endpoints_leader_step_downs_total", "")
        .await
        .unwrap();
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let mut resets = 0;
    while churn.done() < CHANGES {
        for member in members.iter() {
            member.proxy.as_ref().expect("proxied").reset();
        }
        resets += 1;
        // Jittered: resets at a period dividing RetryPeriod would phase-lock with the renewals
        // and kill every one of them in flight.
        let jitter = world.rng.below(1000) as u32 + 500;
        tokio::time::sleep(RESET_EVERY * jitter / 1000).await;
    }
    world.settle(churn).await;
    let now = leader
        .metric("external_endpoints_leader_step_downs_total", "")
        .await
        .unwrap();
    eprintln!("resets: {resets} rounds; the leader's step-downs {step_downs} → {now}");

    world.stop_leader(members).await;
    let model = world.model.clone();
    model.wait_reflected(&world.cluster, None).await;
}
