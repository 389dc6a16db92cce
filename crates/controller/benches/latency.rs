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

use std::{collections::BTreeMap, time::Duration};

use harness::{
    ReplicaSpec,
    fixtures::populate_range,
    poll,
    report::{Table, bench_main, env_list, env_usize, load_average, progress},
};
use kube::Client;
use tokio::time::Instant;

use measure::{Processes, buckets, delta, histogram_quantile, total};
use phase::{Mode, PhaseResult};

/// The controller binary this target was built with.
pub const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

const SYNC: &str = "external_endpoints_sync_latency_seconds";
const STAGES: &str = "external_endpoints_stage_seconds";
const STAGE_NAMES: [&str; 9] = [
    "event_to_key",
    "queued",
    "coalesced",
    "view_wait",
    "retry_wait",
    "plan",
    "rate_limited",
    "write",
    "own_write_visible",
];

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

fn ms(seconds: f64) -> f64 {
    seconds * 1e3
}

/// Adds the rows of one rate and one `--workers` (named in the label when several are
/// compared): each row's samples are the repetitions.
fn rows(
    table: &mut Table,
    rate: usize,
    raw: &[PhaseResult],
    controller: &[(PhaseResult, Inside)],
    compared: Option<usize>,
    highest: bool,
) {
    let mut label = if highest {
        format!("{rate}/s (highest the raw client keeps)")
    } else {
        format!("{rate}/s")
    };
    if let Some(workers) = compared {
        label.push_str(&format!(", --workers {workers}"));
    }
    let q = |results: &[&PhaseResult], q: f64| -> Vec<f64> {
        results
            .iter()
            .map(|r| ms(load::quantile(&r.latencies, q)))
            .collect()
    };
    let raw: Vec<&PhaseResult> = raw.iter().collect();
    let ours: Vec<&PhaseResult> = controller.iter().map(|(r, _)| r).collect();
    for (name, quantile) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)] {
        table.row(
            &format!(
                "{label}: raw client (workload PATCH, then its slice update; no controller), workload answer → slice event, {name}"
            ),
            "ms",
            &q(&raw, quantile),
            "",
        );
        table.row(
            &format!("{label}: controller, workload answer → slice event, {name}"),
            "ms",
            &q(&ours, quantile),
            "",
        );
        // Paired by repetition.
        let added: Vec<f64> = q(&ours, quantile)
            .iter()
            .zip(q(&raw, quantile))
            .map(|(o, r)| o - r)
            .collect();
        let target = if name == "p99" && rate == 100 {
            "≤ 25 ms"
        } else {
            ""
        };
        table.row(
            &format!("{label}: our added latency (controller − raw), {name}"),
            "ms",
            &added,
            target,
        );
    }
    for (name, quantile) in [("p50", 0.5), ("p99", 0.99)] {
        // Both latencies hold one slice update's round trip: the raw client's own, shown here,
        // and ours (the `write` stage).
        let updates: Vec<f64> = raw
            .iter()
            .map(|r| ms(load::quantile(&r.updates, quantile)))
            .collect();
        table.row(
            &format!(
                "{label}: raw client's slice update, request → answer, {name} (ours: the write stage)"
            ),
            "ms",
            &updates,
            "",
        );
        let patches = |results: &[&PhaseResult]| -> Vec<f64> {
            results
                .iter()
                .map(|r| ms(load::quantile(&r.requests, quantile)))
                .collect()
        };
        table.row(
            &format!("{label}: workload PATCH, request → answer, {name}: raw phase"),
            "ms",
            &patches(&raw),
            "",
        );
        table.row(
            &format!("{label}: workload PATCH, request → answer, {name}: controller phase"),
            "ms",
            &patches(&ours),
            "",
        );
        let inside: Vec<f64> = controller
            .iter()
            .map(|(_, inside)| {
                let d = delta(
                    &buckets(&inside.after, SYNC, ""),
                    &buckets(&inside.before, SYNC, ""),
                );
                ms(histogram_quantile(quantile, &d))
            })
            .collect();
        table.row(
            &format!(
                "{label}: controller's own {SYNC} (change seen → write answered), {name} (from buckets)"
            ),
            "ms",
            &inside,
            "",
        );
    }
    let observations: Vec<f64> = controller
        .iter()
        .map(|(_, inside)| {
            total(&delta(
                &buckets(&inside.after, SYNC, ""),
                &buckets(&inside.before, SYNC, ""),
            ))
        })
        .collect();
    table.row(
        &format!("{label}: {SYNC} observations (changes timed outside: see sent)"),
        "",
        &observations,
        "",
    );
    let per_change = |results: &[&PhaseResult], cpu: fn(&PhaseResult) -> f64| -> Vec<f64> {
        results
            .iter()
            .map(|r| ms(cpu(r)) / r.sent.max(1) as f64)
            .collect()
    };
    table.row(
        &format!("{label}: leader CPU per change"),
        "ms",
        &per_change(&ours, |r| r.cpu.leader),
        "",
    );
    for (who, cpu) in [
        (
            "kube-apiserver",
            (|r: &PhaseResult| r.cpu.apiserver) as fn(&PhaseResult) -> f64,
        ),
        ("etcd", |r: &PhaseResult| r.cpu.etcd),
    ] {
        table.row(
            &format!("{label}: {who} CPU per change, raw phase"),
            "ms",
            &per_change(&raw, cpu),
            "",
        );
        table.row(
            &format!("{label}: {who} CPU per change, controller phase"),
            "ms",
            &per_change(&ours, cpu),
            "",
        );
    }
    let others: Vec<f64> = ours
        .iter()
        .chain(&raw)
        .map(|r| r.cpu.others() / r.issued.max(1.0))
        .collect();
    table.row(
        &format!("{label}: CPU of other processes on the machine, every phase"),
        "cores",
        &others,
        "≈ 0",
    );
    if others.iter().any(|cores| *cores > 0.2) {
        println!(
            "WARNING: at {label} other processes used up to {:.2} cores during a phase: these figures are not from a quiet machine",
            others.iter().copied().fold(0.0, f64::max)
        );
    }
    let sent: Vec<f64> = ours.iter().chain(&raw).map(|r| r.sent as f64).collect();
    table.row(&format!("{label}: changes sent per phase"), "", &sent, "");
    let lost: Vec<f64> = ours
        .iter()
        .chain(&raw)
        .map(|r| (r.lost + r.failed) as f64)
        .collect();
    table.row(
        &format!("{label}: changes lost or failed (every phase)"),
        "",
        &lost,
        "0",
    );
    let unconverged: Vec<f64> = controller
        .iter()
        .map(|(_, inside)| inside.unconverged as f64)
        .collect();
    table.row(
        &format!("{label}: Services whose slices differ from the plan of the final objects"),
        "",
        &unconverged,
        "0",
    );
    let loads: Vec<String> = ours
        .iter()
        .chain(&raw)
        .map(|r| format!("{} → {}", r.load_before, r.load_after))
        .collect();
    println!("load average over the {label} phases: {}", loads.join("; "));
}

/// Prints, per rate, each stage's observations, mean and p99 over the controller phases (from
/// the leader's stage histograms).
fn stage_table(results: &BTreeMap<usize, AtRate>) {
    println!("\n### where our milliseconds go: {STAGES} over the controller phases\n");
    println!("| rate | --workers | stage | observations | mean | p99 (from buckets) |");
    println!("|---|---|---|---|---|---|");
    for (rate, workers, controller) in results
        .iter()
        .flat_map(|(rate, at)| at.ours.iter().map(move |(w, c)| (rate, w, c)))
    {
        for stage in STAGE_NAMES {
            let labels = format!("stage=\"{stage}\"");
            let (mut count, mut sum) = (0.0, 0.0);
            let mut merged: Vec<(f64, f64)> = Vec::new();
            for (_, inside) in controller {
                let d = delta(
                    &buckets(&inside.after, STAGES, &labels),
                    &buckets(&inside.before, STAGES, &labels),
                );
                let sums = |body: &str| {
                    harness::sum_metric(body, &format!("{STAGES}_sum"), &labels).unwrap_or(0.0)
                };
                sum += sums(&inside.after) - sums(&inside.before);
                count += total(&d);
                if merged.is_empty() {
                    merged = d;
                } else {
                    for (slot, (_, add)) in merged.iter_mut().zip(d) {
                        slot.1 += add;
                    }
                }
            }
            if count == 0.0 {
                continue;
            }
            println!(
                "| {rate}/s | {workers} | {stage} | {count:.0} | {:.3} ms | {:.3} ms |",
                ms(sum / count),
                ms(histogram_quantile(0.99, &merged)),
            );
        }
    }
    println!();
}
