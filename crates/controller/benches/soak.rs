//! The long chaos soak, as a benchmark (too long for CI): rounds of faults drawn at random from
//! every fault of the chaos tests (replica, Lease and network faults of `tests/chaos.rs`; control
//! plane faults of `tests/control_plane.rs`; the quiet faults: watches stalled on the leader or
//! the followers, requests held) against one control plane of two kube-apiservers on one etcd,
//! three replicas spread over both (each behind its own HTTP-aware proxy, with a 10 s watch
//! stall bound), and a client changing objects throughout.
//!
//! Each round ends only when the slices show every change the client made (a lost change fails
//! the round, and so the run). Throughout, every replica's leader gauge is sampled (two leaders
//! at once are counted) and every slice write is checked against the Lease holder at its
//! revision, attributed from the API servers' audit log (each replica is a user of its own).
//! At the end it prints the rounds run, the changes made, the changes lost, the writes by a
//! replica that was not the holder at that moment, and the longest time without a leader.
//!
//! `cargo bench -p external-endpoints --bench soak`. Knobs (environment): `SOAK_ROUNDS` (200),
//! `CHAOS_SEED` (replays a run: the same faults and client changes; printed at the start).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

use harness::{
    CONVERGE, Replica,
    chaos::{
        audit::{AuditReport, LeaderMonitor, WriteAudit},
        fault::Fault,
        quiet::stall_args,
        world::{Member, World},
    },
    report::{bench_main, env_usize},
};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// Replicas kept running.
const REPLICAS: usize = 3;
/// Rounds between two audits (each reads the API servers' whole audit log).
const AUDIT_EVERY: usize = 10;

fn main() {
    bench_main("soak", run);
}

async fn run() {
    let rounds = env_usize("SOAK_ROUNDS", 200);
    let started = Instant::now();
    let options = testbed::Options {
        apiserver_args: vec!["--watch-cache=false".to_string()],
        audit_log: true,
        ..testbed::Options::default()
    };
    let testbed = testbed::Testbed::start(options).await.unwrap();
    testbed.add_apiserver().await.unwrap();
    let _logs = testbed.log_guard();
    eprintln!("soak: two API servers up after {:?}", started.elapsed());

    let mut world = World::new(BINARY, &testbed, "soak").await;
    world.extra = stall_args();
    let monitor = LeaderMonitor::start();
    let mut members: Vec<Member> = Vec::new();
    refill(&mut world, &mut members, &monitor).await;
    let model = world.model.clone();
    model.wait_reflected(&world.cluster, None).await;
    let audit = WriteAudit::start(&testbed, &world.cluster).await;

    let mut by_fault: BTreeMap<String, (usize, Duration, Duration)> = BTreeMap::new();
    let mut longest = (Duration::ZERO, None);
    let faults = [
        Fault::REPLICA.as_slice(),
        &Fault::CONTROL_PLANE,
        &Fault::QUIET,
    ]
    .concat();
    for round in 0..rounds {
        let fault = faults[world.rng.below(faults.len())];
        monitor.reset_longest();
        let began = Instant::now();
        fault.strike(&mut world, &mut members).await;
        // Replicas that left are not sampled any more: a new one may reuse an admin port.
        let remaining: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
        monitor.retain(&remaining);
        refill(&mut world, &mut members, &monitor).await;
        let took = began.elapsed();
        let state = monitor.state();
        assert!(
            state.overlaps.is_empty(),
            "round {round} ({fault:?}): two replicas led at once: {:?}",
            state.overlaps
        );
        if state.longest_leaderless > longest.0 {
            longest = (state.longest_leaderless, Some(fault));
        }
        let entry = by_fault.entry(format!("{fault:?}")).or_default();
        entry.0 += 1;
        entry.1 += took;
        entry.2 = entry.2.max(state.longest_leaderless);
        eprintln!(
            "soak round {round}: {fault:?} passed in {took:?} (no leader for at most {:?}; {} changes so far)",
            state.longest_leaderless, world.changes
        );
        if (round + 1) % AUDIT_EVERY == 0 || round + 1 == rounds {
            let report = audit_now(&audit, &world, &members);
            assert!(
                report.attributed > 0,
                "round {round}: the audit log attributed none of {} slice writes to a replica",
                report.writes
            );
            assert!(
                report.by_non_holder.is_empty(),
                "round {round}: writes by a replica that did not hold the Lease: {:#?}",
                report.by_non_holder
            );
            // The figures so far, so that a run stopped early still reports.
            summary(
                round + 1,
                started,
                &by_fault,
                &world,
                &report,
                &monitor,
                longest,
            );
        }
    }
}

/// Prints the figures after `rounds` rounds.
fn summary(
    rounds: usize,
    started: Instant,
    by_fault: &BTreeMap<String, (usize, Duration, Duration)>,
    world: &World<'_>,
    report: &AuditReport,
    monitor: &LeaderMonitor,
    longest: (Duration, Option<Fault>),
) {
    let state = monitor.state();
    println!("soak: {rounds} rounds in {:?}", started.elapsed());
    println!("| fault | rounds | mean round | longest without a leader |");
    println!("| --- | ---: | ---: | ---: |");
    for (fault, (count, total, leaderless)) in by_fault {
        println!(
            "| {fault} | {count} | {:.1} s | {:.1} s |",
            total.as_secs_f64() / *count as f64,
            leaderless.as_secs_f64()
        );
    }
    println!("rounds run: {rounds}");
    println!("changes made: {}", world.changes);
    println!("changes lost: 0 (every round ended with the slices showing every change)");
    println!(
        "slice writes audited: {} ({} attributed to a replica; {} unattributed: the faults' own writes; {} after a forced \
         deposition or Lease deletion; {} watch gaps)",
        report.writes, report.attributed, report.unattributed, report.after_forced, report.gaps
    );
    println!(
        "writes by a replica that was not the holder: {}",
        report.by_non_holder.len()
    );
    println!(
        "two leaders at once: {} of {} samples",
        state.overlaps.len(),
        state.samples
    );
    println!(
        "longest time without a leader: {:.1} s ({:?})",
        longest.0.as_secs_f64(),
        longest.1
    );
}

/// Starts replicas until there are [`REPLICAS`], each on the API server with fewer of them.
async fn refill(world: &mut World<'_>, members: &mut Vec<Member>, monitor: &LeaderMonitor) {
    while members.len() < REPLICAS {
        let on_first = members.iter().filter(|m| m.apiserver == 0).count();
        world.apiserver = usize::from(on_first * 2 > members.len());
        let member = world.member(true).await;
        monitor.add(&member.replica);
        members.push(member);
        if members.len() == 1 {
            members[0].replica.wait_leading(CONVERGE).await;
        }
    }
}

fn audit_now(audit: &WriteAudit, world: &World<'_>, members: &[Member]) -> AuditReport {
    let mut replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    replicas.extend(world.retired.iter().map(|m| &m.replica));
    audit.check(&replicas)
}
