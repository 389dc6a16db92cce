//! Latency faults of the control plane: a slow API server on the leader's connection (ridden
//! out, then too slow for any renewal), and a slow API server for every replica that must still
//! leave someone leading.

use std::time::Duration;

use tokio::time::Instant;

use super::control::{metric, wait_idle, wait_leading};
use crate::{
    CONVERGE, Replica,
    chaos::{
        lease_acquire_time, lease_renew_time, log_time, slice_writes, wait_any_leading, wait_gauge,
        world::{
            BEFORE_FAULT, CHANGES, LEASE_DURATION, Member, RENEW_DEADLINE, RETRY_PERIOD, SLACK,
            WORKERS, World,
        },
    },
    eventually,
    proxy::Mode,
};

/// A latency a term rides out (each request held this long by the replica's proxy): a renewal
/// (a read and a write) takes 1.1 s, longer than RetryPeriod; the next one starts when one ends
/// and must end within RenewDeadline of the previous one's start, which holds with 0.8 s to
/// spare (2.2 s of 3 s).
pub const SLOW_RIDDEN_OUT: Duration = Duration::from_millis(550);
/// A latency with which a renewal (1.4 s) outlasts RetryPeriod but not RenewDeadline; two slow
/// renewals in a row (2.8 s) may end a term on a loaded machine, but someone must lead.
pub const SLOW_WITHIN: Duration = Duration::from_millis(700);
/// A latency no renewal survives (3.6 s a renewal). The step from [`SLOW_RIDDEN_OUT`] (1.25 s)
/// stays within LeaseDuration − RenewDeadline + the fence margin (1.5 s): a write fenced just
/// in time may be that much slower than the renewal before it and still land before any other
/// replica may acquire (docs/leader-election.md).
pub const SLOWER: Duration = Duration::from_millis(1800);

/// The leader's API connection slows down: first by [`SLOW_RIDDEN_OUT`], which the term rides out
/// (same term, no step-down, renewals go on), then by [`SLOWER`], which makes every renewal
/// overrun RenewDeadline. The term ends cleanly within RenewDeadline (counted step-down, no
/// exit); the writes it had in flight are at most one per worker, none landed while another
/// replica held the Lease (the write audit); a follower leads only after the old leader
/// stopped; with the latency gone the old leader stays a follower and writes nothing.
pub async fn slow_api(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let old = &members[index];
    let proxy = old.proxy.as_ref().expect("the leader is proxied");
    let step_downs = metric(&old.replica, "external_endpoints_leader_step_downs_total").await;
    let term = metric(&old.replica, "external_endpoints_leader_term").await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    proxy.set(Mode::Hold(SLOW_RIDDEN_OUT));
    for _ in 0..3 {
        let renewed = lease_renew_time(&world.cluster).await;
        eventually(
            "a renewal through the slow connection",
            CONVERGE,
            || async {
                let now = lease_renew_time(&world.cluster).await;
                if now > renewed {
                    Ok(())
                } else {
                    Err(format!("renewTime {now:?}"))
                }
            },
        )
        .await;
    }
    assert!(
        old.replica.is_leader().await,
        "the term rides out {SLOW_RIDDEN_OUT:?}"
    );
    assert_eq!(
        metric(&old.replica, "external_endpoints_leader_term").await,
        term
    );
    assert_eq!(
        metric(&old.replica, "external_endpoints_leader_step_downs_total").await,
        step_downs
    );

    proxy.set(Mode::Hold(SLOWER));
    let slowed = Instant::now();
    let stepped = wait_gauge(&old.replica, false, CONVERGE).await;
    let took = stepped - slowed;
    eprintln!("slow API ({SLOWER:?}): the leader stopped leading {took:?} after the slow-down");
    assert!(
        took <= RENEW_DEADLINE + SLACK,
        "stopped leading {took:?} after renewals began to overrun RenewDeadline"
    );
    assert!(
        metric(&old.replica, "external_endpoints_leader_step_downs_total").await > step_downs,
        "the term ended cleanly (a counted step-down)"
    );
    let at_step_down = slice_writes(&old.replica).await;
    wait_idle(&old.replica).await;
    let in_flight = slice_writes(&old.replica).await - at_step_down;
    assert!(
        in_flight <= WORKERS,
        "{in_flight} writes landed after the step-down"
    );
    eprintln!(
        "slow API: {in_flight} writes in flight at the step-down landed; the fence refused {}",
        metric(&old.replica, "external_endpoints_fenced_writes_total").await
    );

    let others: Vec<&Replica> = members
        .iter()
        .filter(|m| m.replica.identity != old.replica.identity)
        .map(|m| &m.replica)
        .collect();
    wait_leading(&world.cluster, &others).await;
    let stopped = log_time(&old.replica, "stopped leading").expect("a step-down in the log");
    let acquired = lease_acquire_time(&world.cluster).await.unwrap();
    assert!(
        stopped < acquired,
        "the old leader stopped at {stopped}, the new one acquired at {acquired}"
    );
    world.settle(churn).await;

    let writes = slice_writes(&old.replica).await;
    proxy.restore();
    let churn = world.churn(CHANGES / 2);
    world.settle(churn).await;
    assert!(!old.replica.is_leader().await, "the old leader leads again");
    assert_eq!(
        slice_writes(&old.replica).await,
        writes,
        "the old leader wrote after the slow-down"
    );
}

/// The API server slows down for every replica by [`SLOW_WITHIN`]: a renewal or an acquisition
/// (a read, then a write) takes longer than RetryPeriod, yet within RenewDeadline. A slow but
/// working API server must not leave the cluster without a leader: a replica leads at the end
/// (the same term, or a new one after two slow renewals in a row), and the changes converge.
pub async fn slow_within_deadline(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let leader = replicas[index].identity.clone();
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    for member in members.iter() {
        member
            .proxy
            .as_ref()
            .expect("proxied")
            .set(Mode::Hold(SLOW_WITHIN));
    }
    // Several LeaseDurations with the slow API: a leader must be there at the end.
    let since = Instant::now();
    while since.elapsed() < LEASE_DURATION * 4 {
        tokio::time::sleep(RETRY_PERIOD).await;
    }
    let (now, _) = wait_any_leading(&world.cluster, &replicas).await;
    eprintln!(
        "slow API for all ({SLOW_WITHIN:?}): {} leads ({leader} led before)",
        replicas[now].identity
    );
    world.settle(churn).await;
    for member in members.iter() {
        member.proxy.as_ref().expect("proxied").restore();
    }
    let churn = world.churn(CHANGES / 2);
    world.settle(churn).await;
}
