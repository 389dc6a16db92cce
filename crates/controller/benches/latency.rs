//! Latency bench on the testbed (real kube-apiserver + etcd, real controller processes), issue
//! 20: how close the controller's change → slice latency is to the API server's own limit, and
//! where its milliseconds go.
//!
//! On one testbed with 1,000 headless Services of 5 ExternalWorkloads each (4 namespaces):
//!
//! 1. **Step the raw client up** (`LATENCY_STEP_RATES`, `LATENCY_STEP_SECONDS` each) to find the
//!    highest rate at which the API server keeps up with slice updates written directly (every
//!    change sent on time, none lost, p99 under 1 s).
//! 2. **Interleaved phases** at each rate of `LATENCY_RATES` plus that highest rate, repeated
//!    `LATENCY_REPS` times in alternating order (raw first, then controller first, ...): (a) a
//!    freshly started leader publishes workload changes; (b) with no controller running, the
//!    bench writes the same changes straight into the slices (one update per change, same
//!    objects, same rate). The same separate watch times both from the change's API answer to
//!    the slice event. Per phase: p50/p90/p99/max, the leader's CPU per change, kube-apiserver's
//!    and etcd's CPU (from /proc), the leader's own `external_endpoints_sync_latency_seconds`
//!    and stage histograms; after each controller phase every Service's slices must equal the
//!    plan of the final objects.
//! 3. **Initial publish** of `LATENCY_PUBLISH_SIZES` Services (fresh namespace, no slices): the
//!    raw create rate, then a leader at each `LATENCY_PUBLISH_QPS` (`--write-qps`; the first
//!    one only at the sizes after the first).
//!
//! `cargo bench -p external-endpoints --bench latency`. Knobs (environment): `LATENCY_SECONDS`
//! (30, per phase), `LATENCY_RATES` (50,100,200), `LATENCY_REPS` (2), `LATENCY_STEP_RATES`
//! (400,800,1200,1600), `LATENCY_STEP_SECONDS` (10), `LATENCY_SERVICES` (1000),
//! `LATENCY_WORKERS` (32, the default cap; a list such as 4,32 runs a controller phase per value
//! beside each raw phase, the first value being the baseline and the raw publish's requests in
//! flight), `LATENCY_PUBLISH_SIZES` (1000,10000; 0: none), `LATENCY_PUBLISH_QPS` (2000),
//! `LATENCY_PUBLISH_RUNS` (3). The bench warns when the load average says something else runs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

#[allow(dead_code)] // the scale bench's load generator; this bench uses its change types only
#[path = "scale/load.rs"]
mod load;
#[path = "latency/measure.rs"]
mod measure;
#[path = "latency/phase.rs"]
mod phase;
#[path = "latency/publish.rs"]
mod publish;
#[path = "latency/tables.rs"]
mod tables;

use std::{collections::BTreeMap, time::Duration};

use harness::{
    ReplicaSpec,
    fixtures::populate_range,
    poll,
    report::{Table, bench_main, env_list, env_usize, load_average, progress},
};
use kube::Client;
use tokio::time::Instant;

use measure::Processes;
use phase::{Mode, PhaseResult};
use tables::{rows, stage_table};

/// The controller binary this target was built with.
pub const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

fn main() {
    bench_main("latency", run);
}

/// A controller phase's view from inside: its /metrics before and after.
struct Inside {
    before: String,
    after: String,
    unconverged: usize,
}

/// Everything measured at one rate.
#[derive(Default)]
struct AtRate {
    raw: Vec<PhaseResult>,
    /// The controller phases, by `--workers`.
    ours: BTreeMap<usize, Vec<(PhaseResult, Inside)>>,
}

struct Setup {
    client: Client,
    kubeconfig: std::path::PathBuf,
    namespaces: Vec<String>,
    services: Vec<(String, String)>,
    /// `--workers` of each controller phase: the first is the baseline, any others are run
    /// beside it at every rate and repetition (before/after in the same run).
    workers: Vec<usize>,
    processes: Processes,
    started: Instant,
}

async fn run() {
    let started = Instant::now();
    let load_at_start = load_average();
    warn_if_busy(&load_at_start).await;
    let seconds = env_usize("LATENCY_SECONDS", 30);
    let rates = env_list("LATENCY_RATES", &[50, 100, 200]);
    let reps = env_usize("LATENCY_REPS", 2).max(1);
    let step_rates = env_list("LATENCY_STEP_RATES", &[400, 800, 1200, 1600]);
    let step_seconds = env_usize("LATENCY_STEP_SECONDS", 10);
    let service_count = env_usize("LATENCY_SERVICES", 1000);
    // The controller's default cap (issue 34); the raw publish gets the same allowance.
    let workers = env_list("LATENCY_WORKERS", &[32]);
    let publish_sizes: Vec<usize> = env_list("LATENCY_PUBLISH_SIZES", &[1000, 10000])
        .into_iter()
        .filter(|size| *size > 0)
        .collect();
    let publish_qps = env_list("LATENCY_PUBLISH_QPS", &[2000]);
    let publish_runs = env_usize("LATENCY_PUBLISH_RUNS", 3).max(1);

    let testbed = testbed::Testbed::start(testbed::Options::default())
        .await
        .unwrap();
    let client: Client = testbed.client().await.unwrap();
    progress(started, "testbed up");
    let mut namespaces = Vec::new();
    for n in 0..4 {
        namespaces.push(
            testbed
                .fresh_namespace(&format!("bench-latency-{n}"))
                .await
                .unwrap(),
        );
    }
    let mut services = Vec::new();
    for (n, namespace) in namespaces.iter().enumerate() {
        let count = service_count / 4 + usize::from(n < service_count % 4);
        populate_range(&client, namespace, 0..count, 5, started).await;
        services.extend((0..count).map(|i| (namespace.clone(), format!("svc-{i}"))));
    }
    let setup = Setup {
        client: client.clone(),
        kubeconfig: testbed.kubeconfig_path().to_path_buf(),
        namespaces,
        services,
        workers,
        processes: Processes {
            leader: None,
            apiserver: testbed.pid(testbed::Server::ApiServer(0)),
            etcd: testbed.pid(testbed::Server::Etcd),
        },
        started,
    };
    // The first leader publishes every slice; the phases change them.
    controller_phase(&setup, setup.workers[0], None).await;

    // 1. The highest rate the raw client keeps.
    let mut highest = None;
    for &rate in &step_rates {
        let result = phase::run(
            &setup.client,
            &setup.services,
            Mode::Raw,
            rate,
            step_seconds,
            setup.processes,
            started,
        )
        .await;
        let kept = keeps_up(&result, step_seconds);
        progress(
            started,
            format!(
                "step {rate}/s: raw p99 {:.1} ms, sent in {:.1}s: {}",
                load::quantile(&result.latencies, 0.99) * 1e3,
                result.issued,
                if kept { "kept up" } else { "fell behind" }
            ),
        );
        if !kept {
            break;
        }
        highest = Some(rate);
    }
    let mut all_rates = rates.clone();
    if let Some(rate) = highest
        && !all_rates.contains(&rate)
    {
        all_rates.push(rate);
    }

    // 2. Interleaved phases.
    let mut results: BTreeMap<usize, AtRate> = BTreeMap::new();
    for rep in 0..reps {
        for &rate in &all_rates {
            let mut order: Vec<Option<usize>> = std::iter::once(None)
                .chain(setup.workers.iter().copied().map(Some))
                .collect();
            if rep % 2 == 1 {
                order.reverse();
            }
            for phase in order {
                let name = match phase {
                    None => "raw".to_string(),
                    Some(workers) => format!("controller (--workers {workers})"),
                };
                progress(started, format!("rep {}: {name} at {rate}/s", rep + 1));
                let at = results.entry(rate).or_default();
                match phase {
                    None => at.raw.push(
                        phase::run(
                            &setup.client,
                            &setup.services,
                            Mode::Raw,
                            rate,
                            seconds,
                            setup.processes,
                            started,
                        )
                        .await,
                    ),
                    Some(workers) => {
                        let measured =
                            controller_phase(&setup, workers, Some((rate, seconds))).await;
                        at.ours.entry(workers).or_default().extend(measured);
                    }
                }
            }
        }
    }
    let mut table = Table::default();
    for (rate, at) in &results {
        for (workers, ours) in &at.ours {
            let compared = (setup.workers.len() > 1).then_some(*workers);
            rows(
                &mut table,
                *rate,
                &at.raw,
                ours,
                compared,
                highest == Some(*rate),
            );
        }
    }
    table.print(&format!(
        "change → slice latency, {} Services × 5 workloads, {seconds} s phases, {reps} alternating repetitions, --workers {:?}, load average at start {load_at_start}",
        setup.services.len(),
        setup.workers
    ));
    stage_table(&results);

    // 3. Initial publish.
    if !publish_sizes.is_empty() {
        let mut table = Table::default();
        for (n, &size) in publish_sizes.iter().enumerate() {
            // Every --write-qps at the first size; the default only at the larger ones (a low
            // setting there would only take longer to show the same cap).
            let qps_list = if n == 0 {
                &publish_qps[..]
            } else {
                &publish_qps[..1]
            };
            let namespace = testbed
                .fresh_namespace(&format!("bench-publish-{size}"))
                .await
                .unwrap();
            populate_range(&client, &namespace, 0..size, 5, started).await;
            let settings = publish::Settings {
                client: &client,
                kubeconfig: &setup.kubeconfig,
                namespace: &namespace,
                services: size,
                workers: setup.workers[0],
                runs: publish_runs,
                started,
            };
            publish::measure(&settings, qps_list, &mut table).await;
        }
        table.print("initial publish on an empty namespace (slices created from nothing)");
    }
    let load_at_end = load_average();
    println!("load average: start {load_at_start}, end {load_at_end}");
    progress(started, "done");
}

/// Prints a warning when something else is running: the machine's CPUs busy over 3 s before
/// anything of the bench starts (the load average still counts the build `cargo bench` just
/// finished, so it is printed but not judged). Each phase also reports the CPU of the other
/// processes (see [`rows`]).
async fn warn_if_busy(load: &str) {
    let before = Processes::default().cpu();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let busy = Processes::default().cpu().since(&before).others() / 3.0;
    if busy > 0.2 {
        println!(
            "WARNING: other processes keep {busy:.2} cores busy before the bench starts (load average {load}): these figures are not from a quiet machine"
        );
    }
}

/// Whether a raw phase kept its rate: every change sent within 5% of the phase length, none
/// lost, p99 under a second.
fn keeps_up(result: &PhaseResult, seconds: usize) -> bool {
    result.lost == 0
        && result.failed == 0
        && result.issued <= seconds as f64 * 1.05 + 0.5
        && load::quantile(&result.latencies, 0.99) < 1.0
}

/// A fresh leader: waits until it has checked every Service (repairing what a raw phase
/// changed), runs the phase if asked, checks the slices against the plan, stops it.
async fn controller_phase(
    setup: &Setup,
    workers: usize,
    load_at: Option<(usize, usize)>,
) -> Option<(PhaseResult, Inside)> {
    let spec = ReplicaSpec {
        watch_namespace: None,
        lease_namespace: setup.namespaces[0].clone(),
        lease_name: "bench-latency".to_string(),
        extra: vec!["--workers".to_string(), workers.to_string()],
    };
    let mut leader = spec
        .start(BINARY, &setup.kubeconfig, "latency-leader")
        .await;
    leader.wait_ready(Duration::from_secs(600)).await;
    leader.wait_leading(Duration::from_secs(120)).await;
    let services = setup.services.len();
    poll(
        "the leader to check every Service",
        Duration::from_secs(600),
        Duration::from_millis(50),
        || async {
            let metrics = leader.metrics().await.ok()?;
            metrics.all_checked(services).then_some(())
        },
    )
    .await;
    let measured = match load_at {
        Some((rate, seconds)) => {
            let before = leader.metrics().await.unwrap().0;
            let processes = Processes {
                leader: Some(leader.pid()),
                ..setup.processes
            };
            let result = phase::run(
                &setup.client,
                &setup.services,
                Mode::Controller,
                rate,
                seconds,
                processes,
                setup.started,
            )
            .await;
            let after = leader.metrics().await.unwrap().0;
            let unconverged = load::unconverged(&setup.client).await;
            if let Some(first) = unconverged.first() {
                eprintln!(
                    "{} Services differ from the plan of the final objects, e.g. {first}",
                    unconverged.len()
                );
            }
            Some((
                result,
                Inside {
                    before,
                    after,
                    unconverged: unconverged.len(),
                },
            ))
        }
        None => None,
    };
    leader.terminate();
    leader.wait_exit(Duration::from_secs(60)).await;
    measured
}
