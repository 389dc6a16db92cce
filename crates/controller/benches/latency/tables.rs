//! What the latency bench prints from its phases: per rate, the rows comparing the controller
//! with the raw client (latency quantiles, added latency, the controller's own histograms, CPU
//! per change, changes lost, Services unconverged), and where the milliseconds go, stage by
//! stage.

use std::collections::BTreeMap;

use harness::report::Table;

use super::{
    AtRate, Inside, load,
    measure::{buckets, delta, histogram_quantile, total},
    phase::PhaseResult,
};

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

fn ms(seconds: f64) -> f64 {
    seconds * 1e3
}

/// Adds the rows of one rate and one `--workers` (named in the label when several are
/// compared): each row's samples are the repetitions.
pub fn rows(
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
pub fn stage_table(results: &BTreeMap<usize, AtRate>) {
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
