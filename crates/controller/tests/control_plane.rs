//! Control-plane chaos on the real testbed: kube-apiserver killed (SIGKILL) or stopped (SIGTERM)
//! and restarted, etcd killed and restarted with its data, watches expired by etcd compaction
//! (410 Gone), a slow API server on the leader's connection, and one of two API servers on one
//! etcd cut off from its replicas, every request held 1–2 s. Replicas are the real binary, 2–3 per test, with a client
//! changing objects throughout (see `tests/chaos.rs` for the world these faults share).
//!
//! These faults take the control plane down, so this test binary has a control plane of its
//! own (not the one the other tests share) and runs its tests one at a time. Its API servers
//! run without the watch cache (`--watch-cache=false`): every watch is served by etcd, so a
//! compaction reaches open watches as 410 Gone, as it does behind a watch cache whose window
//! was outrun.
//!
//! Every test also checks, over its whole run, that no two replicas led at once (sampled
//! gauges) and that no slice write landed while the Lease named another replica or nobody
//! (revision order of slice writes and Lease writes, writes attributed from the API servers'
//! audit log: each replica is a user of its own). A failing run prints `CHAOS_SEED=<n>`; set it to replay the same client changes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use testbed::{Server, Testbed};

use harness::{
    CONVERGE,
    chaos::{
        audit::{LeaderMonitor, WriteAudit},
        control::{
            Stop, apiserver_partition, restart, slow_api, slow_within_deadline, watch_expiry,
        },
        quiet::{held_requests, stall_args},
        world::{LeaseTimings, Member, World},
    },
};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// This binary's control plane (started on first use, stopped when the binary exits).
static PLANE: tokio::sync::OnceCell<Result<Testbed, String>> = tokio::sync::OnceCell::const_new();
/// One test at a time: each takes the control plane down.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The control plane, with every server running (a test that failed half-way may have left one
/// down); None (after one line on stderr) when the binaries are missing outside CI.
async fn plane() -> Option<&'static Testbed> {
    if testbed::Binaries::discover().is_err() && !testbed::running_in_ci() {
        eprintln!("control-plane tests skipped: run `bash testbed/build.sh`");
        return None;
    }
    let plane = PLANE
        .get_or_init(|| async {
            let options = testbed::Options {
                apiserver_args: vec!["--watch-cache=false".to_string()],
                audit_log: true,
                ..testbed::Options::default()
            };
            Testbed::start(options).await.map_err(|e| e.to_string())
        })
        .await;
    let testbed = match plane {
        Ok(testbed) => testbed,
        Err(error) => panic!("testbed: {error}"),
    };
    testbed.restart(Server::Etcd).await.unwrap();
    for index in 0.. {
        if testbed.apiserver_url(index).is_none() {
            break;
        }
        testbed.restart(Server::ApiServer(index)).await.unwrap();
    }
    Some(testbed)
}

/// Checks a test's whole run: never two leaders, no write by a non-holder.
struct Watchers {
    monitor: LeaderMonitor,
    audit: WriteAudit<'static>,
}

impl Watchers {
    async fn start(world: &World<'static>, members: &[Member]) -> Watchers {
        let watchers = Watchers {
            monitor: LeaderMonitor::start(),
            audit: WriteAudit::start(world.testbed, &world.cluster).await,
        };
        watchers.add(members);
        watchers
    }

    fn add(&self, members: &[Member]) {
        for member in members {
            self.monitor.add(&member.replica);
        }
    }

    fn check(&self, world: &World<'_>, members: &[Member]) {
        let state = self.monitor.state();
        assert!(
            state.overlaps.is_empty(),
            "two replicas led at once: {:?}",
            state.overlaps
        );
        let mut replicas: Vec<&harness::Replica> = members.iter().map(|m| &m.replica).collect();
        replicas.extend(world.retired.iter().map(|m| &m.replica));
        let report = self.audit.check(&replicas);
        eprintln!(
            "audit: {} slice writes, {} attributed, {} by a non-holder, {} unattributed, \
             {} samples, longest without a leader {:?}",
            report.writes,
            report.attributed,
            report.by_non_holder.len(),
            report.unattributed,
            state.samples,
            state.longest_leaderless
        );
        assert!(
            report.attributed > 0,
            "the audit attributed none of {} slice writes to a replica (does the API server \
             keep its audit log, and is each replica a user of its own?)",
            report.writes
        );
        assert!(
            report.by_non_holder.is_empty(),
            "writes by a replica that did not hold the Lease: {:#?}",
            report.by_non_holder
        );
    }
}

/// Starts a world with one replica per entry (`true`: proxied).
async fn world_with(
    testbed: &'static Testbed,
    test: &str,
    proxied: &[bool],
) -> (World<'static>, Vec<Member>) {
    let mut world = World::new(BINARY, testbed, test).await;
    let members = world.start(proxied).await;
    (world, members)
}

// === tests ===

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_killed_leader_steps_down_one_leads_after_restart_and_changes_converge() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let (mut world, mut members) = world_with(testbed, "cp-apiserver-kill", &[false; 3]).await;
    let watchers = Watchers::start(&world, &members).await;
    restart(&mut world, &mut members, Server::ApiServer(0), Stop::Kill).await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_stopped_gracefully_leader_steps_down_one_leads_after_restart_and_changes_converge()
 {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let (mut world, mut members) = world_with(testbed, "cp-apiserver-stop", &[false; 2]).await;
    let watchers = Watchers::start(&world, &members).await;
    restart(
        &mut world,
        &mut members,
        Server::ApiServer(0),
        Stop::Graceful,
    )
    .await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_killed_leader_steps_down_one_leads_after_restart_and_changes_converge() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let (mut world, mut members) = world_with(testbed, "cp-etcd-kill", &[false; 2]).await;
    let watchers = Watchers::start(&world, &members).await;
    restart(&mut world, &mut members, Server::Etcd, Stop::Kill).await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn compacted_watches_get_410_every_replica_relists_and_no_slice_is_deleted() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let (mut world, mut members) = world_with(testbed, "cp-watch-expiry", &[true; 2]).await;
    let watchers = Watchers::start(&world, &members).await;
    watch_expiry(&mut world, &mut members).await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_api_server_ends_the_term_cleanly_and_nothing_is_written_past_the_fence() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let (mut world, mut members) = world_with(testbed, "cp-slow", &[true, false]).await;
    let watchers = Watchers::start(&world, &members).await;
    slow_api(&mut world, &mut members).await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_of_two_apiservers_cut_off_exactly_one_leader_and_convergence() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    if testbed.apiserver_url(1).is_none() {
        testbed.add_apiserver().await.unwrap();
    }
    let mut world = World::new(BINARY, testbed, "cp-ha").await;
    // Spread over both API servers: the first (leader) on API server 0, then alternating.
    let mut members = Vec::new();
    for index in 0..4 {
        world.apiserver = index % 2;
        members.push(world.member(true).await);
        if index == 0 {
            members[0].replica.wait_leading(CONVERGE).await;
        }
    }
    let model = world.model.clone();
    model.wait_reflected(&world.cluster, None).await;
    let watchers = Watchers::start(&world, &members).await;
    apiserver_partition(&mut world, &mut members).await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_renewals_within_renew_deadline_never_leave_the_cluster_without_a_leader() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let (mut world, mut members) = world_with(testbed, "cp-slow-within", &[true, true]).await;
    let watchers = Watchers::start(&world, &members).await;
    slow_within_deadline(&mut world, &mut members).await;
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_held_one_then_two_seconds_are_ridden_out_without_a_step_down() {
    let _serial = SERIAL.lock().await;
    let Some(testbed) = plane().await else { return };
    let _logs = testbed.log_guard();
    let mut world = World::new(BINARY, testbed, "cp-held").await;
    // The controller's own timings: a renewal (two requests held 2 s each) twice in a row
    // still fits in RenewDeadline (10 s).
    world.lease = LeaseTimings::DEFAULT;
    world.extra = stall_args();
    let mut members = world.start(&[true, true]).await;
    let watchers = Watchers::start(&world, &members).await;
    held_requests(&mut world, &mut members).await;
    watchers.check(&world, &members);
}
