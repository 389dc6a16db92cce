//! Leadership chaos on the real API server: 2–3 replicas of the real binary, a client that keeps
//! changing workloads and Services throughout, and one fault per test, striking mid-stream:
//! graceful exit, crash, deposition by another holder, a network cut or blackhole (through a TCP
//! proxy in front of one replica), a flap shorter than RenewDeadline, SIGTERM while cut off, a
//! Lease deleted by hand, a foreign holder from the start; the soak draws faults at random.
//!
//! After each fault the slices must be exactly what the planner computes from the final objects
//! and must show what the client last wrote (so every change was applied or superseded); the
//! fault's own guarantee is checked on the Lease's history, the slices' resourceVersions and
//! managedFields times, and the replicas' metrics. Timing assertions allow [`SLACK`] for
//! scheduling and scraping; none depends on a sleep being long enough.
//!
//! A failing run prints `CHAOS_SEED=<n>`; set it to replay the same client changes and faults.
//! `CHAOS_SOAK_ROUNDS` sets the soak's rounds (default 3).
#![allow(clippy::unwrap_used, clippy::expect_used)] // the faults are test code: a panic is the failure report

mod support;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use support::{
    CONVERGE, Cluster, Replica,
    chaos::{
        Churn, LeaseHistory, Model, Rng, delete_lease, last_slice_write, lease_acquire_time,
        lease_renew_time, log_time, release_lease, slice_versions, slice_writes, take_lease,
        wait_any_leading, wait_gauge,
    },
    eventually,
    proxy::{Mode, Proxy},
};
use tokio::time::Instant;

/// The e2e replicas' lease timings (support::LEASE_ARGS).
const LEASE_DURATION: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// Scheduling and scraping slack on timing assertions.
const SLACK: Duration = Duration::from_millis(700);
/// Client changes per fault, and the mean pause between two.
const CHANGES: usize = 30;
const PAUSE: Duration = Duration::from_millis(80);
/// Changes made before the fault (it strikes mid-stream).
const BEFORE_FAULT: usize = 6;
/// The replicas' reconcile workers (the default).
const WORKERS: f64 = 4.0;
/// The replicas' drain deadline (support's `--drain-timeout`).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// A flap: longer than RetryPeriod (one renewal attempt fails), shorter than RenewDeadline.
const FLAP: Duration = Duration::from_millis(1200);

/// One test's namespace, client model and randomness.
struct World {
    testbed: &'static testbed::Testbed,
    cluster: Cluster,
    model: Model,
    rng: Rng,
    replicas: usize,
}

/// A replica, and its proxy when its API traffic can be cut.
struct Member {
    replica: Replica,
    proxy: Option<Proxy>,
}

/// The faults the soak draws from.
#[derive(Clone, Copy, Debug)]
enum Fault {
    HandOver,
    Crash,
    Deposition,
    Outage(Mode),
    Flap(Mode),
    TerminateCutOff(Mode),
    LeaseDeleted,
}

// === impl World ===

impl World {
    async fn new(testbed: &'static testbed::Testbed, test: &str) -> World {
        let cluster = Cluster::new(testbed, test).await;
        let model = Model::new();
        model.create(&cluster).await;
        World {
            testbed,
            cluster,
            model,
            rng: Rng::seeded(test),
            replicas: 0,
        }
    }

    /// Starts a replica, proxied or not, with a fresh identity.
    async fn member(&mut self, proxied: bool) -> Member {
        let identity = format!("r{}", self.replicas);
        self.replicas += 1;
        let namespace = &self.cluster.namespace;
        if proxied {
            let (replica, proxy) =
                Replica::start_proxied(self.testbed, namespace, &identity, &[]).await;
            Member {
                replica,
                proxy: Some(proxy),
            }
        } else {
            let replica = Replica::start(self.testbed, namespace, &identity, &[]).await;
            Member {
                replica,
                proxy: None,
            }
        }
    }

    /// Starts the client on a copy of the model.
    fn churn(&mut self, changes: usize) -> Churn {
        let rng = self.rng.fork();
        Churn::start(&self.cluster, self.model.clone(), rng, changes, PAUSE)
    }

    /// Waits for the client's last change, then for the slices to converge and match it.
    async fn settle(&mut self, churn: Churn) {
        let (model, last) = churn.finish().await;
        self.model = model;
        self.model
            .wait_reflected(&self.cluster, last.as_ref())
            .await;
    }

    /// Makes a change certain to change a slice, and checks that it is not applied yet.
    async fn unapplied_change(&mut self) {
        let change = self.model.visible_change();
        self.model.apply(&self.cluster, &change).await;
        assert!(
            self.model
                .check_change(&self.cluster, &change)
                .await
                .is_err(),
            "{change:?} must not be applied while nobody leads"
        );
    }

    /// Holds for `period`, failing at once if a slice is written or anyone leads.
    async fn nothing_written(&self, members: &[Member], period: Duration) {
        let versions = slice_versions(&self.cluster).await;
        let until = Instant::now() + period;
        while Instant::now() < until {
            assert_eq!(
                slice_versions(&self.cluster).await,
                versions,
                "a slice was written while nobody may lead"
            );
            for member in members {
                assert!(
                    !member.replica.is_leader().await,
                    "{} leads while a foreign holder keeps the Lease",
                    member.replica.identity
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

// === faults ===

/// SIGTERM to the leader mid-stream: it drains, releases the Lease (holder cleared in the
/// record), exits 0; a follower leads at once and converges.
async fn hand_over(world: &mut World, members: &mut Vec<Member>) {
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
    eprintln!("hand-over: a follower leads {took:?} after the old leader exited");
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
}

/// SIGKILL to the leader mid-stream: a follower leads once the lease runs out, not before, and
/// converges.
async fn crash(world: &mut World, members: &mut Vec<Member>) {
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
}

/// Another holder takes the Lease mid-stream: the old leader steps down and, while the intruder
/// holds the Lease and the client keeps changing objects, no slice is written at all; after the
/// release a replica leads and converges.
async fn deposition(world: &mut World, members: &mut [Member]) {
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

/// The leader's network is cut (or blackholed) mid-stream: it stops leading within
/// RenewDeadline, before any follower may take over; a follower leads and converges; after the
/// network is back the old leader stays a follower and writes nothing.
async fn outage(world: &mut World, members: &mut [Member], mode: Mode) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let old = &members[index];
    let proxy = old.proxy.as_ref().expect("the leader is proxied");
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
    let failures = old
        .replica
        .metric("external_endpoints_lease_renew_failures_total", "")
        .await
        .unwrap();
    assert!(
        failures >= 1.0,
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
async fn flap(world: &mut World, members: &mut [Member], mode: Mode) {
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
async fn terminate_cut_off(world: &mut World, members: &mut Vec<Member>, mode: Mode) {
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
    assert!(
        took <= DRAIN_TIMEOUT + RETRY_PERIOD + SLACK,
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
}

/// The Lease is deleted by hand mid-stream: the leader stops at once (a definite loss), a
/// replica re-creates the Lease and leads in a new term, and the slices converge.
async fn lease_deleted(world: &mut World, members: &mut [Member]) {
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

async fn acquisitions_of(replica: &Replica) -> f64 {
    replica
        .metric("external_endpoints_leader_acquisitions_total", "")
        .await
        .unwrap()
}

// === tests ===

#[tokio::test(flavor = "multi_thread")]
async fn graceful_hand_over_drains_releases_and_a_follower_converges() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-graceful").await;
    let mut members = vec![world.member(false).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    hand_over(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashed_leader_is_replaced_once_its_lease_runs_out() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-crash").await;
    let mut members = vec![world.member(false).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    crash(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deposed_leader_writes_nothing_after_another_holder_takes_the_lease() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-deposition").await;
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(world.member(false).await);
    }
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    deposition(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_off_leader_steps_down_within_renew_deadline_and_stays_silent_after_restore() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-cut").await;
    let mut members = vec![world.member(true).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    outage(&mut world, &mut members, Mode::Cut).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blackholed_leader_steps_down_within_renew_deadline_and_stays_silent_after_restore() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-blackhole").await;
    let mut members = vec![world.member(true).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    outage(&mut world, &mut members, Mode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn outage_shorter_than_renew_deadline_causes_no_step_down() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-flap").await;
    let mut members = vec![world.member(true).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    flap(&mut world, &mut members, Mode::Cut).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blackhole_shorter_than_renew_deadline_causes_no_step_down() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-flap-blackhole").await;
    let mut members = vec![world.member(true).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    flap(&mut world, &mut members, Mode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_terminated_while_cut_off_exits_within_drain_deadline_and_is_replaced() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-terminate-cut").await;
    let mut members = vec![world.member(true).await];
    members[0].replica.wait_leading().await;
    members.push(world.member(false).await);
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    terminate_cut_off(&mut world, &mut members, Mode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_lease_ends_the_term_at_once_and_a_new_term_converges() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-lease-deleted").await;
    let mut members = Vec::new();
    for _ in 0..2 {
        members.push(world.member(false).await);
    }
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    lease_deleted(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_written_while_a_foreign_holder_keeps_the_lease_then_everything_is() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(testbed, "chaos-foreign").await;
    take_lease(&world.cluster, "foreign", 3600).await;
    let mut members = Vec::new();
    for _ in 0..2 {
        let member = world.member(false).await;
        member.replica.wait_ready().await;
        members.push(member);
    }
    let churn = world.churn(CHANGES / 2);
    let (model, _) = churn.finish().await;
    world.model = model;
    world.unapplied_change().await;
    world
        .nothing_written(&members, RENEW_DEADLINE + RETRY_PERIOD)
        .await;
    assert!(world.cluster.slices().await.is_empty(), "no slice written");
    assert!(world.cluster.converged().await.is_err());
    for member in &members {
        assert_eq!(slice_writes(&member.replica).await, 0.0);
    }

    release_lease(&world.cluster).await;
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    wait_any_leading(&world.cluster, &replicas).await;
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn soak_random_faults_converge_every_round() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let rounds: usize = std::env::var("CHAOS_SOAK_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.trim().parse().ok())
        .unwrap_or(3);
    let mut world = World::new(testbed, "chaos-soak").await;
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(world.member(true).await);
    }
    world
        .model
        .clone()
        .wait_reflected(&world.cluster, None)
        .await;
    let faults = [
        Fault::HandOver,
        Fault::Crash,
        Fault::Deposition,
        Fault::Outage(Mode::Cut),
        Fault::Outage(Mode::Blackhole),
        Fault::Flap(Mode::Cut),
        Fault::Flap(Mode::Blackhole),
        Fault::TerminateCutOff(Mode::Cut),
        Fault::TerminateCutOff(Mode::Blackhole),
        Fault::LeaseDeleted,
    ];
    let started = Instant::now();
    for round in 0..rounds {
        let fault = faults[world.rng.below(faults.len())];
        let began = Instant::now();
        match fault {
            Fault::HandOver => hand_over(&mut world, &mut members).await,
            Fault::Crash => crash(&mut world, &mut members).await,
            Fault::Deposition => deposition(&mut world, &mut members).await,
            Fault::Outage(mode) => outage(&mut world, &mut members, mode).await,
            Fault::Flap(mode) => flap(&mut world, &mut members, mode).await,
            Fault::TerminateCutOff(mode) => terminate_cut_off(&mut world, &mut members, mode).await,
            Fault::LeaseDeleted => lease_deleted(&mut world, &mut members).await,
        }
        while members.len() < 3 {
            members.push(world.member(true).await);
        }
        eprintln!(
            "soak round {round}: {fault:?} passed in {:?}",
            began.elapsed()
        );
    }
    eprintln!("soak: {rounds} rounds in {:?}", started.elapsed());
}
