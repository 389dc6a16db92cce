//! The long sweep: `SWEEP_SEEDS` seeds (default 100,000) as deployed, then prints seeds per
//! second, simulated time per wall second, the worst convergence, the failures, and the load
//! average before and after (a figure taken beside another heavy job is not a figure).
//!
//! `cargo bench -p sim --bench sweep` (`SWEEP_SEEDS=5000` for a short run, `SIM_THREADS` to pin
//! the threads; `SWEEP_FROM` to start elsewhere than seed 1; `SIM_SERVER_FAULTS` and
//! `SIM_INSTANCE_LAG_MS` as `Options::from_env` reads them).

use sim::{
    Options, Setup,
    sweep::{sweep, threads, write_trace},
};

fn number(variable: &str, default: u64) -> u64 {
    std::env::var(variable)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_string())
}

fn main() {
    let count = number("SWEEP_SEEDS", 100_000);
    let from = number("SWEEP_FROM", 1);
    let threads = threads();
    println!("load average before: {}", load_average());
    #[allow(clippy::disallowed_types)] // the wall-clock time of a sweep, outside any runtime
    let started = std::time::Instant::now();
    let result = sweep(
        from..from + count,
        &Options::from_env().0,
        Setup::DEPLOYED,
        threads,
        false,
    );
    let wall = started.elapsed().as_secs_f64();
    println!(
        "| seeds | threads | wall s | seeds/s | simulated s | simulated:wall | worst convergence (seed) | failures |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {} | {threads} | {wall:.1} | {:.1} | {:.0} | {:.0}:1 | {:?} | {} |",
        result.seeds,
        result.seeds as f64 / wall,
        result.simulated.as_secs_f64(),
        result.simulated.as_secs_f64() / wall,
        result.worst_convergence,
        result.failures.len()
    );
    for report in &result.failures {
        let trace = write_trace(report, Setup::DEPLOYED);
        println!(
            "{report}\n  replay: {}\n  trace: {trace:?}",
            report.replay_command(Setup::DEPLOYED)
        );
    }
    println!("load average after: {}", load_average());
}
