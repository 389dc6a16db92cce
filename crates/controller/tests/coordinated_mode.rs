//! Coordinated Leader Election (KEP-4355) with real controller processes
//! (`--coordinated-election`) against a kube-apiserver running the election controller, with
//! workloads changing: a crashed leader (SIGKILL), a leader that makes way for an older
//! emulation version, and a rolling upgrade from an older emulation version to a newer one.
//!
//! Each test asserts the behaviour (a take-over happens, no change is lost, one writer at a time:
//! the leader gauges sampled, and every slice write attributed from the API server's audit log to
//! the replica the Lease named at that revision) and prints its timings, measured from the API
//! server's own records where it has them: the Lease as a watch delivers it (the election
//! controller naming a holder, `preferredHolder`, the release), the new holder's `acquireTime`
//! (its first renewal, which starts its term), and the audit log's `requestReceivedTimestamp` of
//! its first slice write. One machine, one clock. Timings are printed, never asserted:
//! `cargo test -p external-endpoints --test coordinated_mode -- --nocapture`.
//!
//! The tests run one at a time on a control plane of their own (Coordinated Leader Election and
//! the audit log on), so that each figure is taken with nothing else of this binary running.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

#[path = "coordinated_mode/client.rs"]
mod client;
#[path = "coordinated_mode/records.rs"]
mod records;

use std::time::Duration;

use k8s_openapi::{api::coordination::v1beta1::LeaseCandidate, jiff::Timestamp};
use kube::Api;

use harness::{
    CONVERGE, Cluster,
    chaos::world::{LeaseTimings, Member, World},
    eventually,
};
use testbed::Testbed;

use self::{
    client::{BRISK, Client, MODEST},
    records::{LeaseLog, Watchers, first_write, ms},
};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// An emulation version older than the binary's own (0.1.0): the replicas "of the old release".
const OLD_VERSION: &str = "0.0.9";

/// How long the election controller may take to name a holder: after a crash it notices the
/// expiry on its 5 s re-checks, pings the candidates and waits up to 5 s for answers.
const ELECTED: Duration = Duration::from_secs(60);

/// Crashes measured in a row.
const CRASH_ROUNDS: usize = 3;

/// Changes the client makes before each step (a replica started or stopped).
const STEP_CHANGES: usize = 10;

/// This binary's control plane: Coordinated Leader Election on, and an audit log of slice
/// writes.
static PLANE: tokio::sync::OnceCell<Result<Testbed, String>> = tokio::sync::OnceCell::const_new();
/// One test at a time, so that each figure is taken alone.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// None (after one line on stderr) when the binaries are missing outside CI.
async fn plane() -> Option<&'static Testbed> {
    if testbed::Binaries::discover().is_err() && !testbed::running_in_ci() {
        eprintln!("coordinated mode tests skipped: run `bash testbed/build.sh`");
        return None;
    }
    let plane = PLANE
        .get_or_init(|| async {
            let options = testbed::Options {
                audit_log: true,
                ..testbed::Options::default()
            };
            let options = options.with_coordinated_leader_election();
            Testbed::start(options).await.map_err(|e| e.to_string())
        })
        .await;
    match plane {
        Ok(testbed) => Some(testbed),
        Err(error) => panic!("testbed: {error}"),
    }
}

// === tests ===

#[tokio::test(flavor = "multi_thread")]
async fn crashed_leader_is_replaced_and_a_change_made_after_the_kill_is_published() {
    let _serial = SERIAL.lock().await;
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    crash_rounds(plane, "cm-crash", LeaseTimings::E2E, CRASH_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashed_leader_with_the_default_lease_timings_is_replaced_and_no_change_is_lost() {
    let _serial = SERIAL.lock().await;
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    crash_rounds(plane, "cm-crash-default", LeaseTimings::DEFAULT, 2).await;
}

/// Kills the leader of three replicas `rounds` times (a fresh replica joins after each), each
/// time making a change right after the kill: the change is published by a replica the election
/// controller named since the kill, and no replica writes while the Lease names another.
async fn crash_rounds(plane: &'static Testbed, test: &str, timings: LeaseTimings, rounds: usize) {
    let (mut world, mut members) =
        start(plane, test, timings, &["--coordinated-election"], 3).await;
    let watchers = Watchers::start(&world, &members).await;
    let lease = LeaseLog::start(&world.cluster).await;
    let begun = Timestamp::now();

    for round in 1..=rounds {
        let index = wait_leader(&world.cluster, &members).await;
        // Crashes strike at any moment of the election controller's 5 s re-checks: each round
        // lets the leader renew a different number of times first.
        let renewals = 2 * round - 1;
        lease
            .renewed(&members[index].replica.identity, renewals)
            .await;
        let mut crashed = members.remove(index);
        crashed.replica.kill();
        let killed = Timestamp::now();
        // A change nobody has published yet: only the next leader can.
        let change = world.model.visible_change();
        world.changes += 1;
        world.model.apply(&world.cluster, &change).await;
        assert!(!crashed.replica.wait_exit(CONVERGE).await.success());

        wait_leader(&world.cluster, &members).await;
        world
            .model
            .wait_reflected(&world.cluster, Some(&change))
            .await;
        let survivors = identities(&members);
        let named = lease
            .first(killed, |seen| {
                seen.holder.as_ref().is_some_and(|h| survivors.contains(h))
            })
            .await;
        let write = first_write(plane, &world.cluster, &survivors, killed).await;
        // The election controller may move the Lease on among candidates of one version
        // (docs/leader-election.md): the first writer is one it named since the kill (the audit
        // checks that it held the Lease at that revision).
        let holders = lease.holders(killed);
        assert!(
            holders.contains(&write.user),
            "the first slice write after the crash, by {}, holders since {holders:?}",
            write.user
        );
        let term = lease.acquired_by(&write.user, killed).await;
        eprintln!(
            "crash round {round} (lease {:?}): {} killed after {renewals} renewal(s); the \
             election controller named {} after {}, {}'s term began after {}, its first slice \
             write after {}; holders since: {}",
            timings.duration,
            crashed.replica.identity,
            named.holder.unwrap(),
            ms(killed, named.at),
            write.user,
            ms(killed, term),
            ms(killed, write.received),
            holders.join(" → "),
        );
        world.retire(crashed);
        // Back to three candidates for the next round.
        let fresh = world.member(false).await;
        watchers.monitor.add(&fresh.replica);
        members.push(fresh);
    }
    eprintln!("holders over the run: {}", lease.holders(begun).join(" → "));
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn newer_leader_makes_way_for_an_older_version_that_joins_and_no_change_is_lost() {
    let _serial = SERIAL.lock().await;
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let (mut world, mut members) = start(
        plane,
        "cm-handover",
        LeaseTimings::E2E,
        &["--coordinated-election"],
        2,
    )
    .await;
    let watchers = Watchers::start(&world, &members).await;
    let lease = LeaseLog::start(&world.cluster).await;
    // Brisk, so that some changes are made while the Lease moves (about 100 ms).
    let mut client = Client::start(&mut world, BRISK);
    client.wait_more(STEP_CHANGES).await;

    world.extra = OLD_RELEASE.map(String::from).into();
    let joined = Timestamp::now();
    let older = world.member(false).await;
    watchers.monitor.add(&older.replica);
    let older_identity = older.replica.identity.clone();
    members.push(older);
    let preferred = lease
        .first(joined, |seen| {
            seen.preferred.as_deref() == Some(older_identity.as_str())
        })
        .await;
    let named = lease
        .first(preferred.at, |seen| {
            seen.holder.as_deref() == Some(older_identity.as_str())
        })
        .await;
    wait_leader(&world.cluster, &members[members.len() - 1..]).await;
    client.wait_more(STEP_CHANGES).await;
    let finished = client.stop().await;
    finished.published(&mut world).await;

    // The leader is the holder the controller asked to make way (read from the record rather
    // than assumed: either replica of the newer version may have been named first).
    let leader = preferred.holder.clone().unwrap();
    // It cleared the holder itself (the controller would have waited for it to expire).
    let released = lease
        .first(preferred.at, |seen| seen.holder.is_none())
        .await;
    assert!(
        released.at <= named.at,
        "{leader} cleared the holder before {older_identity} was named"
    );
    let yielded = members
        .iter()
        .find(|m| m.replica.identity == leader)
        .unwrap();
    assert!(
        yielded
            .replica
            .log()
            .contains("yielded the lease to the preferred holder"),
        "{leader} logs its yield"
    );
    let term = lease.acquired_by(&older_identity, joined).await;
    let write = first_write(
        plane,
        &world.cluster,
        std::slice::from_ref(&older_identity),
        joined,
    )
    .await;
    let during = finished.made_between(preferred.at, write.received);
    assert!(during > 0, "no change was made during the hand-over");
    eprintln!(
        "hand-over to an older version: preferredHolder set {} after it started; from then, \
         {leader} cleared the holder after {}, {older_identity} was named after {}, its term \
         began after {}, its first slice write after {} ({during} changes made in between, {} in \
         all, all published)",
        ms(joined, preferred.at),
        ms(preferred.at, released.at),
        ms(preferred.at, named.at),
        ms(preferred.at, term),
        ms(preferred.at, write.received),
        finished.times.len(),
    );
    watchers.check(&world, &members);
}

#[tokio::test(flavor = "multi_thread")]
async fn rolling_upgrade_under_churn_publishes_every_change_with_one_writer_at_a_time() {
    let _serial = SERIAL.lock().await;
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let (mut world, mut members) =
        start(plane, "cm-upgrade", LeaseTimings::E2E, &OLD_RELEASE, 2).await;
    let watchers = Watchers::start(&world, &members).await;
    let lease = LeaseLog::start(&world.cluster).await;
    let old = identities(&members);
    let mut client = Client::start(&mut world, MODEST);

    // The new release joins; the old one keeps leading while any of its replicas is left.
    world.extra = vec!["--coordinated-election".to_string()];
    for _ in 0..2 {
        client.wait_more(STEP_CHANGES).await;
        let member = world.member(false).await;
        watchers.monitor.add(&member.replica);
        wait_candidate(&world.cluster, &member.replica.identity).await;
        members.push(member);
    }
    // The old replicas stop one by one, the leader first.
    for _ in 0..old.len() {
        client.wait_more(STEP_CHANGES).await;
        let index = wait_leader(&world.cluster, &members).await;
        assert!(
            old.contains(&members[index].replica.identity),
            "a replica of the old version leads while one is left"
        );
        let mut stopping = members.remove(index);
        stopping.replica.terminate();
        let signalled = Timestamp::now();
        assert!(stopping.replica.wait_exit(CONVERGE).await.success());
        wait_leader(&world.cluster, &members).await;
        let remaining = identities(&members);
        let released = lease.first(signalled, |seen| seen.holder.is_none()).await;
        let named = lease
            .first(signalled, |seen| {
                seen.holder.as_ref().is_some_and(|h| remaining.contains(h))
            })
            .await;
        let write = first_write(plane, &world.cluster, &remaining, signalled).await;
        let holders = lease.holders(signalled);
        assert!(
            holders.contains(&write.user),
            "the first slice write after the hand-over, by {}, holders since {holders:?}",
            write.user
        );
        let term = lease.acquired_by(&write.user, signalled).await;
        eprintln!(
            "rolling upgrade: {} stopped (SIGTERM); it released the Lease after {}, {} was \
             named after {}, {}'s term began after {}, its first slice write (the next client \
             change) after {}; holders since: {}",
            stopping.replica.identity,
            ms(signalled, released.at),
            named.holder.unwrap(),
            ms(signalled, named.at),
            write.user,
            ms(signalled, term),
            ms(signalled, write.received),
            holders.join(" → "),
        );
        world.retire(stopping);
    }
    client.wait_more(STEP_CHANGES).await;
    let index = wait_leader(&world.cluster, &members).await;
    assert!(!old.contains(&members[index].replica.identity));

    let finished = client.stop().await;
    finished.published(&mut world).await;
    eprintln!(
        "rolling upgrade: {} client changes during the upgrade, all published",
        finished.times.len()
    );
    watchers.check(&world, &members);
}

// === helpers ===

/// The flags of a replica of the old release.
const OLD_RELEASE: [&str; 3] = ["--coordinated-election", "--emulation-version", OLD_VERSION];

/// A world of `count` replicas started with `timings` and `extra` flags, once one leads and
/// the slices show the initial objects.
async fn start(
    plane: &'static Testbed,
    test: &str,
    timings: LeaseTimings,
    extra: &[&str],
    count: usize,
) -> (World<'static>, Vec<Member>) {
    let mut world = World::new(BINARY, plane, test).await;
    world.lease = timings;
    world.extra = extra.iter().map(|flag| flag.to_string()).collect();
    let mut members = Vec::new();
    for _ in 0..count {
        members.push(world.member(false).await);
    }
    wait_leader(&world.cluster, &members).await;
    let model = world.model.clone();
    model.wait_reflected(&world.cluster, None).await;
    (world, members)
}

fn identities(members: &[Member]) -> Vec<String> {
    members.iter().map(|m| m.replica.identity.clone()).collect()
}

/// Waits until one member leads and the Lease names it; returns its index.
async fn wait_leader(cluster: &Cluster, members: &[Member]) -> usize {
    eventually("a replica to lead", ELECTED, || async {
        for (index, member) in members.iter().enumerate() {
            let replica = &member.replica;
            if replica.is_leader().await
                && cluster.lease_holder().await.as_ref() == Some(&replica.identity)
            {
                return Ok(index);
            }
        }
        Err(format!("holder {:?}", cluster.lease_holder().await))
    })
    .await
}

async fn wait_candidate(cluster: &Cluster, identity: &str) {
    let api = Api::<LeaseCandidate>::namespaced(cluster.client.clone(), &cluster.namespace);
    eventually(&format!("LeaseCandidate {identity}"), CONVERGE, || async {
        match api.get_opt(identity).await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}
