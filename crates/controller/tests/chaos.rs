//! Leadership chaos on the real API server: 2–3 replicas of the real binary, a client that keeps
//! changing workloads and Services throughout, and one fault per test, striking mid-stream:
//! graceful exit, crash, deposition by another holder, a network cut or blackhole (through an
//! HTTP-aware proxy in front of one replica), a flap shorter than RenewDeadline, SIGTERM while
//! cut off, a Lease deleted by hand, a foreign holder from the start, the leader's or the
//! followers' watches stalled (quiet: no error anywhere); the soak draws faults at random.
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

use tokio::time::Instant;

use harness::{
    CONVERGE, Replica,
    chaos::{
        fault::Fault,
        faults::{crash, deposition, hand_over, lease_deleted},
        network::{connection_resets, flap, outage, terminate_cut_off},
        quiet::{followers_stalled_then_leader_killed, leader_watches_stalled, stall_args},
        release_lease, slice_writes, take_lease, wait_any_leading,
        world::{CHANGES, RENEW_DEADLINE, RETRY_PERIOD, World},
    },
    proxy::Mode,
};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

// === tests ===

#[tokio::test(flavor = "multi_thread")]
async fn graceful_hand_over_drains_releases_and_a_follower_converges() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-graceful").await;
    let mut members = world.start(&[false; 3]).await;
    hand_over(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashed_leader_is_replaced_once_its_lease_runs_out() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-crash").await;
    let mut members = world.start(&[false; 3]).await;
    crash(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deposed_leader_writes_nothing_after_another_holder_takes_the_lease() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-deposition").await;
    let mut members = world.start(&[false; 3]).await;
    deposition(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_off_leader_steps_down_within_renew_deadline_and_stays_silent_after_restore() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-cut").await;
    let mut members = world.start(&[true, false]).await;
    outage(&mut world, &mut members, Mode::Cut).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blackholed_leader_steps_down_within_renew_deadline_and_stays_silent_after_restore() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-blackhole").await;
    let mut members = world.start(&[true, false]).await;
    outage(&mut world, &mut members, Mode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn outage_shorter_than_renew_deadline_causes_no_step_down() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-flap").await;
    let mut members = world.start(&[true, false]).await;
    flap(&mut world, &mut members, Mode::Cut).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blackhole_shorter_than_renew_deadline_causes_no_step_down() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-flap-blackhole").await;
    let mut members = world.start(&[true, false]).await;
    flap(&mut world, &mut members, Mode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_terminated_while_cut_off_exits_within_drain_deadline_and_is_replaced() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-terminate-cut").await;
    let mut members = world.start(&[true, false]).await;
    terminate_cut_off(&mut world, &mut members, Mode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_lease_ends_the_term_at_once_and_a_new_term_converges() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-lease-deleted").await;
    let mut members = world.start(&[false; 2]).await;
    lease_deleted(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_reset_again_and_again_lose_no_change_on_leader_or_follower() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-resets").await;
    let mut members = world.start(&[true; 2]).await;
    connection_resets(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_with_stalled_watches_applies_every_change_within_the_stall_bound() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-stalled-leader").await;
    world.extra = stall_args();
    let mut members = world.start(&[true, true]).await;
    leader_watches_stalled(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn follower_with_stalled_watches_takes_over_and_converges_in_its_first_term() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-stalled-follower").await;
    world.extra = stall_args();
    let mut members = world.start(&[true, true]).await;
    followers_stalled_then_leader_killed(&mut world, &mut members).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_written_while_a_foreign_holder_keeps_the_lease_then_everything_is() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "chaos-foreign").await;
    take_lease(&world.cluster, "foreign", 3600).await;
    let mut members = Vec::new();
    for _ in 0..2 {
        let member = world.member(false).await;
        member.replica.wait_ready(CONVERGE).await;
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
    let mut world = World::new(BINARY, testbed, "chaos-soak").await;
    let mut members = world.start(&[true; 3]).await;
    let started = Instant::now();
    for round in 0..rounds {
        let fault = Fault::REPLICA[world.rng.below(Fault::REPLICA.len())];
        let began = Instant::now();
        fault.strike(&mut world, &mut members).await;
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
