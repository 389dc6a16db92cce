//! Scale benchmark on the testbed (real kube-apiserver + etcd, real controller processes):
//! headless Services with 5 ExternalWorkloads each, in a few namespaces, every replica watching
//! all namespaces.
//!
//! At each point of a scale curve (1k, 10k and 20k Services by default; the cluster is grown
//! from one point to the next): a leader started on the populated cluster (process start →
//! caches synced → lease acquired → every Service checked, its writes), a follower, their
//! resident memory, and hand-overs (acquisition → every Service checked with correct slices in
//! place, the new leader's CPU time and writes). At the 10k point also: the resident memory of a
//! leader that was made to step down, the bytes each cached object costs per kind (this
//! process builds the controller's caches from the API and measures its own RSS), and a
//! sustained load (workload changes at a fixed rate; event → slice-visible latency seen by a
//! separate watch, the leader's CPU, lost changes). Then whether each measure grows linearly.
//!
//! `cargo bench -p external-endpoints --bench scale`. Knobs (environment): `SCALE_POINTS`
//! (1000,10000,20000), `SCALE_PER_SERVICE` (5), `SCALE_NAMESPACES` (4), `SCALE_HANDOVERS` (3),
//! `SCALE_DETAIL_AT` (10000: the point with the step-down, footprint and load measurements),
//! `SCALE_LOAD_RATE` (200 changes/s), `SCALE_LOAD_SECS` (120), `SCALE_LOAD_SERVICES` (1000),
//! `SCALE_HOLD_SECS` (0: keep the populated testbed this long at the end, for profiling).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

#[path = "scale/footprint.rs"]
mod footprint;
#[path = "scale/load.rs"]
mod load;

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use harness::{
    Metrics, Replica, ReplicaSpec,
    fixtures::populate_range,
    poll,
    report::{
        Table, bench_main, env_list, env_usize, load_average, progress, seconds_between, summary,
    },
};
use k8s_openapi::{
    api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tokio::time::Instant;

const MIB: f64 = 1024.0 * 1024.0;

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

fn main() {
    bench_main("scale", run);
}

/// What one point of the curve measured.
#[derive(Default)]
struct Point {
    services: usize,
    workloads: usize,
    leader_synced: f64,
    follower_synced: f64,
    converged: f64,
    leader_rss: f64,
    leader_hwm: f64,
    follower_rss: f64,
    follower_hwm: f64,
    checked: Vec<f64>,
    cpu: Vec<f64>,
    handover_writes: Vec<f64>,
    new_leader_rss: Vec<f64>,
}

/// Settings shared by every point.
struct Setup<'a> {
    client: Client,
    kubeconfig: &'a Path,
    namespaces: Vec<String>,
    per_service: usize,
    handovers: usize,
    detail_at: usize,
    started: Instant,
}

async fn run() {
    let started = Instant::now();
    let points = env_list("SCALE_POINTS", &[1_000, 10_000, 20_000]);
    let per_service = env_usize("SCALE_PER_SERVICE", 5);
    let namespace_count = env_usize("SCALE_NAMESPACES", 4).max(1);

    let testbed = testbed::Testbed::start(testbed::Options::default())
        .await
        .unwrap();
    let client: Client = testbed.client().await.unwrap();
    progress(started, "testbed up");
    let mut namespaces = Vec::new();
    for n in 0..namespace_count {
        namespaces.push(
            testbed
                .fresh_namespace(&format!("bench-scale-{n}"))
                .await
                .unwrap(),
        );
    }
    let setup = Setup {
        client: client.clone(),
        kubeconfig: testbed.kubeconfig_path(),
        namespaces,
        per_service,
        handovers: env_usize("SCALE_HANDOVERS", 3),
        detail_at: env_usize("SCALE_DETAIL_AT", 10_000),
        started,
    };

    let mut results = Vec::new();
    let mut populated = 0;
    for &services in &points {
        grow(&setup, populated, services).await;
        populated = populated.max(services);
        results.push(measure_point(&setup, services).await);
    }

    let mut curve = Table::default();
    for point in &results {
        point_rows(&mut curve, point);
    }
    curve.print(&format!(
        "scale curve: {per_service} workloads per Service, {namespace_count} namespaces, {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    ));
    linearity(&results);

    let hold = env_usize("SCALE_HOLD_SECS", 0);
    if hold > 0 {
        // Keep the populated control plane for manual profiling (heaptrack, perf, allocator
        // settings) of a controller started by hand with this kubeconfig.
        progress(
            started,
            format!(
                "holding the testbed for {hold}s: --kubeconfig {}",
                setup.kubeconfig.display()
            ),
        );
        tokio::time::sleep(Duration::from_secs(hold as u64)).await;
    }
    progress(started, "done");
}

/// Services per namespace at a total of `services`.
fn share(services: usize, namespaces: usize, n: usize) -> usize {
    services / namespaces + usize::from(n < services % namespaces)
}

/// Creates the Services (and workloads) that take the cluster from `from` to `to` Services.
async fn grow(setup: &Setup<'_>, from: usize, to: usize) {
    let count = setup.namespaces.len();
    for (n, namespace) in setup.namespaces.iter().enumerate() {
        let range = share(from, count, n)..share(to, count, n);
        if range.is_empty() {
            continue;
        }
        progress(
            setup.started,
            format!("creating Services {range:?} and their workloads in {namespace}",),
        );
        populate_range(
            &setup.client,
            namespace,
            range,
            setup.per_service,
            setup.started,
        )
        .await;
    }
}

async fn measure_point(setup: &Setup<'_>, services: usize) -> Point {
    let started = setup.started;
    let spec = ReplicaSpec {
        watch_namespace: None,
        lease_namespace: setup.namespaces[0].clone(),
        lease_name: format!("bench-scale-{services}"),
        extra: Vec::new(),
    };
    let mut point = Point {
        services,
        workloads: services * setup.per_service,
        ..Point::default()
    };

    // A leader started on the populated cluster (slices of earlier points in place).
    let mut leader = spec
        .start(BINARY, setup.kubeconfig, &format!("p{services}-a"))
        .await;
    leader.wait_ready(Duration::from_secs(900)).await;
    point.leader_synced = seconds_between(leader.spawned_at, SystemTime::now());
    leader.wait_leading(Duration::from_secs(120)).await;
    let acquired = leader.logged_at("acquired the lease").unwrap();
    let metrics = wait_checked(&leader, services, Duration::from_secs(3600), started).await;
    point.converged = seconds_between(acquired, SystemTime::now());
    progress(
        started,
        format!(
            "{services}: leader synced {:.1}s after start ({}), converged {:.1}s after acquiring; writes: {} creates, {} updates, {} deletes",
            point.leader_synced,
            list_mode(&leader),
            point.converged,
            metrics.writes_of("Create"),
            metrics.writes_of("Update"),
            metrics.writes_of("Delete"),
        ),
    );

    // A follower with the same caches.
    let mut follower = spec
        .start(BINARY, setup.kubeconfig, &format!("p{services}-b"))
        .await;
    follower.wait_ready(Duration::from_secs(900)).await;
    point.follower_synced = seconds_between(follower.spawned_at, SystemTime::now());
    // Let allocations settle (the watch bookmarks, the follower's list buffers freed).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (leader_rss, leader_hwm) = leader.rss();
    let (follower_rss, follower_hwm) = follower.rss();
    point.leader_rss = leader_rss as f64 / MIB;
    point.leader_hwm = leader_hwm as f64 / MIB;
    point.follower_rss = follower_rss as f64 / MIB;
    point.follower_hwm = follower_hwm as f64 / MIB;
    progress(
        started,
        format!(
            "{services}: RSS leader {:.1} MiB (peak {:.1}), follower {:.1} MiB (peak {:.1}), follower synced {:.1}s after start",
            point.leader_rss,
            point.leader_hwm,
            point.follower_rss,
            point.follower_hwm,
            point.follower_synced,
        ),
    );

    // Hand-overs at this size: acquisition with correct slices in place.
    for round in 0..setup.handovers {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_before = follower.metrics().await.map_or(0.0, |m| m.cpu_seconds());
        leader.terminate();
        let metrics = wait_checked(&follower, services, Duration::from_secs(300), started).await;
        let done = SystemTime::now();
        let acquired = follower.logged_at("acquired the lease").unwrap();
        let (rss, _) = follower.rss();
        point.checked.push(seconds_between(acquired, done));
        point.cpu.push(metrics.cpu_seconds() - cpu_before);
        point.handover_writes.push(metrics.writes());
        point.new_leader_rss.push(rss as f64 / MIB);
        progress(
            started,
            format!(
                "{services}: hand-over {}: all checked {:.3}s after acquiring ({:.2}s CPU), {} writes, RSS {:.1} MiB",
                round + 1,
                seconds_between(acquired, done),
                metrics.cpu_seconds() - cpu_before,
                metrics.writes(),
                rss as f64 / MIB,
            ),
        );
        leader.wait_exit(Duration::from_secs(60)).await;
        std::mem::swap(&mut leader, &mut follower);
        follower = spec
            .start(
                BINARY,
                setup.kubeconfig,
                &format!("p{services}-r{}", round + 1),
            )
            .await;
        follower.wait_ready(Duration::from_secs(900)).await;
    }

    let details = if services == setup.detail_at {
        Some(details(setup, &spec, &leader, &follower, &point).await)
    } else {
        None
    };
    leader.terminate();
    follower.terminate();
    leader.wait_exit(Duration::from_secs(60)).await;
    follower.wait_exit(Duration::from_secs(60)).await;
    if let Some(mut table) = details {
        loads(setup, &spec, services, &mut table).await;
        table.print(&format!(
            "scale details at {services} Services, {} workloads, load average {}",
            services * setup.per_service,
            load_average()
        ));
    }
    point
}

/// The measurements made at one point only: step-down, bytes per object, sustained load.
async fn details(
    setup: &Setup<'_>,
    spec: &ReplicaSpec,
    leader: &Replica,
    follower: &Replica,
    point: &Point,
) -> Table {
    let started = setup.started;
    let mut table = Table::default();
    point_rows(&mut table, point);

    // A leader that loses its lease steps down and keeps running as a follower.
    let leases: Api<Lease> = Api::namespaced(setup.client.clone(), &spec.lease_namespace);
    let before = leader.rss().0 as f64 / MIB;
    update_lease(&leases, &spec.lease_name, |spec| {
        spec.holder_identity = Some("bench-other-holder".to_string());
        spec.lease_duration_seconds = Some(3600);
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    })
    .await;
    poll(
        "the leader to step down",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async { (!leader.is_leader().await).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (stepped, stepped_hwm) = leader.rss();
    let follower_now = follower.rss().0 as f64 / MIB;
    progress(
        started,
        format!(
            "stepped down: RSS {before:.1} MiB while leading → {:.1} MiB (peak {:.1}) as a follower; the other follower {follower_now:.1} MiB",
            stepped as f64 / MIB,
            stepped_hwm as f64 / MIB
        ),
    );
    table.row("leader RSS before stepping down", "MiB", &[before], "");
    table.row(
        "same replica 10 s after stepping down (lease taken by another holder)",
        "MiB",
        &[stepped as f64 / MIB],
        "≈ follower",
    );
    table.row("a follower at the same time", "MiB", &[follower_now], "");
    update_lease(&leases, &spec.lease_name, |spec| {
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
    })
    .await;
    poll(
        "a replica to lead again",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async { (leader.is_leader().await || follower.is_leader().await).then_some(()) },
    )
    .await;

    // Bytes per cached object, by kind (this process builds the same caches).
    let footprint = footprint::measure(&setup.client, setup.started).await;
    footprint.rows(&mut table);

    table
}

/// Sustained load on a fresh leader, once per worker count.
async fn loads(setup: &Setup<'_>, spec: &ReplicaSpec, services: usize, table: &mut Table) {
    let started = setup.started;
    // Sustained load on the leader, once per worker count (each a fresh leader).
    let settings = load::Settings {
        rate: env_usize("SCALE_LOAD_RATE", 200),
        seconds: env_usize("SCALE_LOAD_SECS", 120),
        services: env_usize("SCALE_LOAD_SERVICES", 1_000),
        per_service: setup.per_service,
    };
    for workers in env_list("SCALE_LOAD_WORKERS", &[4, 16]) {
        let spec = ReplicaSpec {
            lease_name: format!("bench-scale-load-{workers}"),
            extra: vec!["--workers".to_string(), workers.to_string()],
            ..spec.clone()
        };
        let mut replica = spec
            .start(BINARY, setup.kubeconfig, &format!("load-w{workers}"))
            .await;
        replica.wait_ready(Duration::from_secs(900)).await;
        replica.wait_leading(Duration::from_secs(120)).await;
        wait_checked(&replica, services, Duration::from_secs(300), started).await;
        let result = load::run(
            &setup.client,
            &setup.namespaces,
            &replica,
            &settings,
            started,
        )
        .await;
        result.rows(table, &settings, workers);
        replica.terminate();
        replica.wait_exit(Duration::from_secs(60)).await;
    }
}

fn point_rows(table: &mut Table, point: &Point) {
    let at = format!("{} Svc / {} EW", point.services, point.workloads);
    table.row(
        &format!("{at}: leader, process start → caches synced"),
        "s",
        &[point.leader_synced],
        "",
    );
    table.row(
        &format!("{at}: follower, process start → caches synced"),
        "s",
        &[point.follower_synced],
        "",
    );
    table.row(
        &format!("{at}: leader, acquired → all checked (new Services' slices created)"),
        "s",
        &[point.converged],
        "",
    );
    table.row(
        &format!("{at}: leader RSS, converged (peak)"),
        "MiB",
        &[point.leader_rss, point.leader_hwm],
        "≤ 150 MB (143 MiB)",
    );
    table.row(
        &format!("{at}: follower RSS, synced (peak)"),
        "MiB",
        &[point.follower_rss, point.follower_hwm],
        "≤ 150 MB (143 MiB)",
    );
    if !point.checked.is_empty() {
        table.row(
            &format!("{at}: hand-over, acquired → all checked, queue empty"),
            "s",
            &point.checked,
            "≤ 2 s at 10k",
        );
        table.row(
            &format!("{at}: hand-over, new leader's CPU time"),
            "s",
            &point.cpu,
            "",
        );
        table.row(
            &format!("{at}: hand-over, writes by the new leader"),
            "",
            &point.handover_writes,
            "0",
        );
        table.row(
            &format!("{at}: hand-over, new leader RSS after checking all"),
            "MiB",
            &point.new_leader_rss,
            "≤ 150 MB (143 MiB)",
        );
    }
}

/// Reads one measure of a point.
type Measure = fn(&Point) -> f64;

/// Prints, for each measure, its growth per 1,000 Services between consecutive points and
/// whether the growth is linear (the later slope within 0.75–1.33 of the earlier one).
fn linearity(points: &[Point]) {
    if points.len() < 3 {
        return;
    }
    let measures: [(&str, Measure); 6] = [
        ("leader RSS (MiB)", |p| p.leader_rss),
        ("follower RSS (MiB)", |p| p.follower_rss),
        ("follower peak RSS (MiB)", |p| p.follower_hwm),
        ("follower start → synced (s)", |p| p.follower_synced),
        ("hand-over acquired → all checked, median (s)", |p| {
            summary(&p.checked).1
        }),
        ("hand-over CPU, median (s)", |p| summary(&p.cpu).1),
    ];
    println!("### growth per 1,000 Services (+5,000 workloads, +1,000 slices)\n");
    let mut header = "| measure |".to_string();
    for pair in points.windows(2) {
        header.push_str(&format!(" {} → {} |", pair[0].services, pair[1].services));
    }
    println!("{header} linear? |");
    println!("|---{}|---|", "|---".repeat(points.len() - 1));
    for (name, measure) in measures {
        let slopes: Vec<f64> = points
            .windows(2)
            .map(|pair| {
                (measure(&pair[1]) - measure(&pair[0]))
                    / ((pair[1].services - pair[0].services) as f64 / 1000.0)
            })
            .collect();
        let ratios: Vec<f64> = slopes.windows(2).map(|s| s[1] / s[0]).collect();
        let linear = ratios.iter().all(|r| (0.75..=1.33).contains(r));
        let cells: Vec<String> = slopes.iter().map(|s| format!("{s:.3}")).collect();
        let ratio_text: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {name} | {} | {} (slope ratio {}) |",
            cells.join(" | "),
            if linear { "yes" } else { "no" },
            ratio_text.join(", ")
        );
    }
    println!();
}

/// How the replica's caches were listed, from its "cache synced" log lines.
fn list_mode(replica: &Replica) -> &'static str {
    let log = replica.log();
    let synced: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("cache synced"))
        .collect();
    if synced.is_empty() {
        "list mode unknown"
    } else if synced.iter().all(|l| l.contains("\"streaming\":true")) {
        "streaming lists"
    } else {
        "paged lists"
    }
}

async fn update_lease(
    leases: &Api<Lease>,
    name: &str,
    change: impl Fn(&mut k8s_openapi::api::coordination::v1::LeaseSpec),
) {
    poll(
        "the lease update",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let mut lease = leases.get(name).await.ok()?;
            change(lease.spec.get_or_insert_with(Default::default));
            leases
                .replace(name, &PostParams::default(), &lease)
                .await
                .ok()
                .map(drop)
        },
    )
    .await
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
                let metrics = replica.metrics().await.ok()?;
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
                metrics.all_checked(services).then_some(metrics)
            }
        },
    )
    .await
}
