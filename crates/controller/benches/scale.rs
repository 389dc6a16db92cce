//! Scale benchmark on the testbed (real kube-apiserver + etcd, real controller processes):
//! 10k Services and 50k ExternalWorkloads (5 per Service) in a few namespaces, every replica
//! watching all namespaces.
//!
//! Measures the initial convergence of a leader started on the populated cluster (process start
//! → caches synced → lease acquired → every Service's slice written, queue empty), its API
//! writes, the resident memory of the leader and of a follower, and hand-overs at this size
//! (acquisition → every Service checked, writes made).
//!
//! `cargo bench -p external-endpoints --bench scale`. Knobs (environment): `SCALE_SERVICES`
//! (10000), `SCALE_PER_SERVICE` (5), `SCALE_NAMESPACES` (4), `SCALE_HANDOVERS` (3),
//! `SCALE_HOLD_SECS` (0: keep the populated testbed this long at the end, for profiling).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

mod common;

use std::time::{Duration, SystemTime};

use common::{
    Metrics, Replica, ReplicaSpec, Table, bench_main, env_usize, poll, populate, progress,
    seconds_between,
};
use kube::Client;
use tokio::time::Instant;

const MIB: f64 = 1024.0 * 1024.0;

fn main() {
    bench_main("scale", run);
}

async fn run() {
    let started = Instant::now();
    let services = env_usize("SCALE_SERVICES", 10_000);
    let per_service = env_usize("SCALE_PER_SERVICE", 5);
    let namespaces = env_usize("SCALE_NAMESPACES", 4).max(1);
    let handovers = env_usize("SCALE_HANDOVERS", 3);

    let testbed = testbed::Testbed::start(testbed::Options::default())
        .await
        .unwrap();
    let client: Client = testbed.client().await.unwrap();
    progress(started, "testbed up");

    let mut names = Vec::new();
    for n in 0..namespaces {
        let namespace = testbed
            .fresh_namespace(&format!("bench-scale-{n}"))
            .await
            .unwrap();
        let count = services / namespaces + usize::from(n < services % namespaces);
        progress(
            started,
            format!(
                "creating {count} Services and {} workloads in {namespace}",
                count * per_service
            ),
        );
        populate(&client, &namespace, count, per_service, started).await;
        names.push(namespace);
    }

    let spec = ReplicaSpec {
        watch_namespace: None,
        lease_namespace: names[0].clone(),
        lease_name: "bench-scale".to_string(),
        extra: Vec::new(),
    };
    let kubeconfig = testbed.kubeconfig_path();
    let mut table = Table::default();

    // A leader started on the populated cluster, no slices yet.
    let mut leader = Replica::start(kubeconfig, &spec, "s1").await;
    leader.wait_ready(Duration::from_secs(600)).await;
    let ready = SystemTime::now();
    leader.wait_leading(Duration::from_secs(120)).await;
    let acquired = leader.logged_at("acquired the lease").unwrap();
    let metrics = wait_checked(&leader, services, Duration::from_secs(3600), started).await;
    let converged = SystemTime::now();
    let (rss, hwm) = leader.rss();
    progress(
        started,
        format!(
            "leader: ready {:.1}s after start, converged {:.1}s after acquiring; writes: {} creates, {} updates, {} deletes; RSS {:.1} MiB (peak {:.1} MiB)",
            seconds_between(leader.spawned_at, ready),
            seconds_between(acquired, converged),
            metrics.writes_of("Create"),
            metrics.writes_of("Update"),
            metrics.writes_of("Delete"),
            rss as f64 / MIB,
            hwm as f64 / MIB,
        ),
    );
    table.row(
        "leader: process start → caches synced (/ready)",
        "s",
        &[seconds_between(leader.spawned_at, ready)],
        "",
    );
    table.row(
        "leader: acquired → all Services converged (slices created), queue empty",
        "s",
        &[seconds_between(acquired, converged)],
        "",
    );
    table.row(
        "leader: process start → all converged",
        "s",
        &[seconds_between(leader.spawned_at, converged)],
        "",
    );
    table.row(
        "leader: slice creates",
        "",
        &[metrics.writes_of("Create")],
        &format!("{services} (one slice per Service)"),
    );
    table.row(
        "leader: slice updates + deletes",
        "",
        &[metrics.writes_of("Update") + metrics.writes_of("Delete")],
        "0",
    );
    table.row("leader: reconciles", "", &[metrics.reconciles()], "");

    // A follower with the same caches.
    let follower_spawned = Replica::start(kubeconfig, &spec, "s2").await;
    follower_spawned.wait_ready(Duration::from_secs(600)).await;
    progress(
        started,
        format!(
            "follower: ready {:.1}s after start",
            seconds_between(follower_spawned.spawned_at, SystemTime::now())
        ),
    );
    let mut follower = follower_spawned;
    // Let allocations settle (the watch bookmarks, the follower's list buffers freed).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (leader_rss, leader_hwm) = leader.rss();
    let (follower_rss, follower_hwm) = follower.rss();
    let (leader_self, follower_self) = (
        leader.metrics().await.map_or(0.0, |m| m.rss()),
        follower.metrics().await.map_or(0.0, |m| m.rss()),
    );
    progress(
        started,
        format!(
            "RSS: leader {:.1} MiB (peak {:.1}, self-reported {:.1}), follower {:.1} MiB (peak {:.1}, self-reported {:.1})",
            leader_rss as f64 / MIB,
            leader_hwm as f64 / MIB,
            leader_self / MIB,
            follower_rss as f64 / MIB,
            follower_hwm as f64 / MIB,
            follower_self / MIB,
        ),
    );
    table.row(
        "leader RSS (VmRSS), converged",
        "MiB",
        &[leader_rss as f64 / MIB],
        "≤ 150 MB",
    );
    table.row(
        "leader peak RSS (VmHWM)",
        "MiB",
        &[leader_hwm as f64 / MIB],
        "",
    );
    table.row(
        "follower RSS (VmRSS), synced",
        "MiB",
        &[follower_rss as f64 / MIB],
        "≤ 150 MB",
    );
    table.row(
        "follower peak RSS (VmHWM)",
        "MiB",
        &[follower_hwm as f64 / MIB],
        "",
    );

    // Hand-overs at this size: acquisition with correct slices in place.
    let mut checked = Vec::new();
    let mut writes = Vec::new();
    let mut cpu_used = Vec::new();
    let mut new_leader_rss = Vec::new();
    for round in 0..handovers {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_before = follower.metrics().await.map_or(0.0, |m| m.cpu_seconds());
        leader.terminate();
        let metrics = wait_checked(&follower, services, Duration::from_secs(300), started).await;
        let cpu = metrics.cpu_seconds() - cpu_before;
        let done = SystemTime::now();
        let acquired = follower.logged_at("acquired the lease").unwrap();
        let (rss, _) = follower.rss();
        progress(
            started,
            format!(
                "hand-over {}: all {services} checked {:.3}s after acquiring ({cpu:.2}s CPU), {} reconciles, {} writes, RSS {:.1} MiB",
                round + 1,
                seconds_between(acquired, done),
                metrics.reconciles(),
                metrics.writes(),
                rss as f64 / MIB,
            ),
        );
        checked.push(seconds_between(acquired, done));
        cpu_used.push(cpu);
        writes.push(metrics.writes());
        new_leader_rss.push(rss as f64 / MIB);
        leader.wait_exit(Duration::from_secs(60)).await;
        std::mem::swap(&mut leader, &mut follower);
        follower = Replica::start(kubeconfig, &spec, &format!("s{}", round + 3)).await;
        follower.wait_ready(Duration::from_secs(600)).await;
    }
    if handovers > 0 {
        table.row(
            "hand-over: acquired → all Services checked, queue empty",
            "s",
            &checked,
            "≤ 2 s",
        );
        table.row(
            "hand-over: new leader's CPU time, SIGTERM → all checked",
            "s",
            &cpu_used,
            "",
        );
        table.row("hand-over: writes by the new leader", "", &writes, "0");
        table.row(
            "hand-over: new leader RSS after checking all",
            "MiB",
            &new_leader_rss,
            "≤ 150 MB",
        );
    }
    leader.kill();
    follower.kill();

    table.print(&format!(
        "scale: {services} Services, {} workloads, {namespaces} namespaces, {} CPUs",
        services * per_service,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ));
    let hold = env_usize("SCALE_HOLD_SECS", 0);
    if hold > 0 {
        // Keep the populated control plane for manual profiling (heaptrack, perf, allocator
        // settings) of a controller started by hand with this kubeconfig.
        progress(
            started,
            format!(
                "holding the testbed for {hold}s: --kubeconfig {}",
                kubeconfig.display()
            ),
        );
        tokio::time::sleep(Duration::from_secs(hold as u64)).await;
    }
    progress(started, "done");
}

/// Polls until `replica` leads and has reconciled at least `services` keys with nothing queued
/// or in flight; prints progress every 10 s.
async fn wait_checked(
    replica: &Replica,
    services: usize,
    timeout: Duration,
    started: Instant,
) -> Metrics {
    let mut last_report = Instant::now();
    poll(
        &format!("{} to check {services} Services", replica.identity),
        timeout,
        Duration::from_millis(10),
        || {
            let report = last_report.elapsed() > Duration::from_secs(10);
            if report {
                last_report = Instant::now();
            }
            async move {
                let metrics = replica.metrics().await?;
                if report {
                    progress(
                        started,
                        format!(
                            "  {}: {} reconciles, {} creates, queue {}",
                            replica.identity,
                            metrics.reconciles(),
                            metrics.writes_of("Create"),
                            metrics.queue_depth()
                        ),
                    );
                }
                let leading = metrics.sum("external_endpoints_leader", "") == 1.0;
                (leading
                    && metrics.reconciles() >= services as f64
                    && metrics.queue_depth() == 0.0
                    && metrics.in_flight() == 0.0)
                    .then_some(metrics)
            }
        },
    )
    .await
}
