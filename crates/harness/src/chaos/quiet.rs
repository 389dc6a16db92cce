//! Quiet faults, through the replicas' [`HttpProxy`]s: nothing fails and nothing is reported,
//! yet a replica stops learning, or learns late.
//!
//! - Watches stalled: the connection stays open, the API server keeps sending, the replica
//!   gets no byte (issue 16: a Lease renewed, `/ready` 200, every change lost for minutes).
//!   The replicas run with a short stall bound ([`stall_bound`], [`stall_args`]): a watch
//!   silent for longer is restarted. On the leader, every change made during the stall lands
//!   within the bound + [`HEAL_SLACK`]; on the followers, the one that takes over when the
//!   leader dies converges in its first term, its watches still stalled.
//! - Requests held: every request of every replica waits before it is forwarded, the longest
//!   hold a term rides out by design (two renewals of two requests each within RenewDeadline):
//!   no step-down, no change lost.
//!
//! [`HttpProxy`]: crate::proxy::HttpProxy

use std::time::Duration;

use tokio::time::Instant;

use crate::{
    CONVERGE, Replica,
    chaos::{
        wait_any_leading,
        world::{BEFORE_FAULT, CHANGES, Member, World, acquisitions_of},
    },
    eventually,
    proxy::Mode,
};

/// The replicas' watch stall bound in these faults (`--watch-stall-timeout`): a watch that
/// delivers nothing (no event, no bookmark) for longer is restarted. 10 s, short so the tests
/// stay quick; `QUIET_STALL_BOUND=<seconds>` sets another (e.g. 30, the controller's default,
/// to measure what an operator gets).
pub fn stall_bound() -> Duration {
    let seconds = std::env::var("QUIET_STALL_BOUND")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(seconds)
}

/// How late after the stall bound a change made during a stall may land: the restarted watch,
/// the reconcile and its writes, on a loaded machine.
pub const HEAL_SLACK: Duration = Duration::from_secs(5);

/// Whose watches stall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whose {
    /// The leader's.
    Leader,
    /// Every follower's.
    Followers,
}

/// The flags that give replicas the stall bound [`stall_bound`] (for [`World::extra`]).
pub fn stall_args() -> Vec<String> {
    vec![
        "--watch-stall-timeout".to_string(),
        format!("{}s", stall_bound().as_secs()),
    ]
}

/// Watch stalls a replica counted (`external_endpoints_watch_stalls_total`, every kind; 0
/// while it has counted none).
pub async fn watch_stalls(replica: &Replica) -> f64 {
    let metrics = replica.metrics().await.unwrap();
    metrics.sum("external_endpoints_watch_stalls_total", "")
}

/// The leader's watch streams freeze (each keeps its connection, none gets another byte) while
/// the client makes its changes. The leader counts a stall, keeps its term, and every change
/// shows in the slices within [`stall_bound`] + [`HEAL_SLACK`] of the freeze (so of being
/// made), with the frozen streams still open.
pub async fn leader_watches_stalled(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let leader = &members[index];
    let proxy = leader.proxy.as_ref().expect("the leader is proxied");
    let metric = |name: &'static str| async move { leader.replica.metric(name, "").await.unwrap() };
    let term = metric("external_endpoints_leader_term").await;
    let stalls = watch_stalls(&leader.replica).await;

    proxy.freeze_watches();
    let frozen = Instant::now();
    let churn = world.churn(CHANGES);
    let (model, last) = churn.finish().await;
    world.model = model;
    let bound = stall_bound();
    let deadline = frozen + bound + HEAL_SLACK;
    let what =
        format!("every change made during the stall to show within {bound:?} + {HEAL_SLACK:?}");
    let timeout = deadline.saturating_duration_since(Instant::now());
    let (cluster, model) = (&world.cluster, &world.model);
    eventually(&what, timeout, || async {
        cluster.converged().await?;
        if let Some(change) = &last {
            model.check_change(cluster, change).await?;
        }
        model.check(cluster).await
    })
    .await;
    eprintln!(
        "leader's watches stalled: every change shows {:?} after the stall began (bound {bound:?})",
        frozen.elapsed()
    );
    assert!(
        watch_stalls(&leader.replica).await > stalls,
        "the leader counted no watch stall"
    );
    assert!(leader.replica.is_leader().await, "the stall cost the term");
    assert_eq!(metric("external_endpoints_leader_term").await, term);
}

/// Every follower's watches stall (open and new: [`Mode::StallWatches`]), then the client starts
/// its changes and the leader is killed mid-stream: most changes are made after the leader
/// died, before another may acquire, and no follower's cache sees them. The follower that
/// takes over acquires once and converges in that first term on the final objects, its
/// watches still stalled: it did not plan from the caches it had when it acquired. (Its stale
/// caches agree with each other, so planning from them alone writes nothing: the slices would
/// stay as the dead leader left them.)
pub async fn followers_stalled_then_leader_killed(
    world: &mut World<'_>,
    members: &mut Vec<Member>,
) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    assert!(members.len() > 1, "a follower to take over");
    let mut acquisitions = Vec::new();
    for (at, member) in members.iter().enumerate() {
        if at != index {
            let proxy = member.proxy.as_ref().expect("the followers are proxied");
            proxy.set(Mode::StallWatches);
        }
        acquisitions.push(acquisitions_of(&member.replica).await);
    }
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let mut old = members.remove(index);
    acquisitions.remove(index);
    old.replica.kill();
    let killed = Instant::now();
    assert!(!old.replica.wait_exit(CONVERGE).await.success());
    world.retire(old);
    let (model, last) = churn.finish().await;
    world.model = model;
    eprintln!(
        "followers' watches stalled: the client's last change {:?} after the kill",
        killed.elapsed()
    );
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (new, _) = wait_any_leading(&world.cluster, &replicas).await;
    let new_leader = &members[new].replica;
    let first = acquisitions[new] + 1.0;
    assert_eq!(acquisitions_of(new_leader).await, first, "one acquisition");
    let model = world.model.clone();
    model.wait_reflected(&world.cluster, last.as_ref()).await;
    eprintln!(
        "followers' watches stalled: {} converged {:?} after the leader was killed",
        new_leader.identity,
        killed.elapsed()
    );
    assert_eq!(
        acquisitions_of(new_leader).await,
        first,
        "{} converged in its first term",
        new_leader.identity
    );
    assert!(new_leader.is_leader().await, "still leading");
    for member in members.iter() {
        member.proxy.as_ref().expect("proxied").restore();
    }
}

/// Every replica's requests are held before they are forwarded, first RenewDeadline / 10, then
/// RenewDeadline / 5 (1 s, then 2 s with the controller's default timings), while the client
/// makes changes: a renewal (a read and a write) takes twice the hold, and two in a row still
/// fit in RenewDeadline. The leader keeps its term, nobody else acquires, every change
/// converges.
pub async fn held_requests(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let leader = &members[index].replica;
    let metric = |name: &'static str| async move { leader.metric(name, "").await.unwrap() };
    let term = metric("external_endpoints_leader_term").await;
    let step_downs = metric("external_endpoints_leader_step_downs_total").await;
    let mut acquisitions = Vec::new();
    let mut stalls = Vec::new();
    for member in members.iter() {
        acquisitions.push(acquisitions_of(&member.replica).await);
        stalls.push(watch_stalls(&member.replica).await);
    }

    let deadline = world.lease.renew_deadline;
    for hold in [deadline / 10, deadline / 5] {
        for member in members.iter() {
            let proxy = member.proxy.as_ref().expect("every replica is proxied");
            proxy.set(Mode::Hold(hold));
        }
        let began = Instant::now();
        let churn = world.churn(CHANGES);
        world.settle(churn).await;
        eprintln!(
            "requests held {hold:?}: {CHANGES} changes converged in {:?}",
            began.elapsed()
        );
    }
    for member in members.iter() {
        member.proxy.as_ref().expect("proxied").restore();
    }
    assert!(leader.is_leader().await, "the leader rides the holds out");
    assert_eq!(metric("external_endpoints_leader_term").await, term);
    assert_eq!(
        metric("external_endpoints_leader_step_downs_total").await,
        step_downs
    );
    for ((member, acquired), stalled) in members.iter().zip(&acquisitions).zip(&stalls) {
        assert_eq!(
            acquisitions_of(&member.replica).await,
            *acquired,
            "{} acquired the lease",
            member.replica.identity
        );
        eprintln!(
            "requests held: {} counted {} watch stalls",
            member.replica.identity,
            watch_stalls(&member.replica).await - stalled
        );
    }
}
