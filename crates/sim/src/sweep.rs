//! Many seeds at once: the CI sweep, the safeguard searches and the long bench share this.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use parking_lot::Mutex;

use crate::{Known, Options, Report, Setup};

/// What a sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Seeds run.
    pub seeds: u64,
    /// The reports of the seeds that failed, by seed.
    pub failures: Vec<Report>,
    /// Simulated time, summed over the seeds.
    pub simulated: Duration,
    /// The slowest convergence after the faults stopped, and its seed.
    pub worst_convergence: Option<(Duration, u64)>,
    /// Findings of documented limitations: how many seeds showed each, and the first seed.
    pub known: std::collections::BTreeMap<Known, (u64, u64)>,
    /// Excused events: how many violations each documented limitation excused, over every
    /// seed (runs are deterministic, so a fixed sample gives fixed counts).
    pub excused: std::collections::BTreeMap<Known, u64>,
}

/// Runs `seeds` with `setup` on `threads` threads, each seed alone on its own runtime. With
/// `stop_at_first`, stops soon after a seed fails (searching for a violation).
pub fn sweep(
    seeds: impl Iterator<Item = u64> + Send,
    options: &Options,
    setup: Setup,
    threads: usize,
    stop_at_first: bool,
) -> Sweep {
    let seeds = Mutex::new(seeds);
    let result = Mutex::new(Sweep::default());
    let stop = AtomicBool::new(false);
    let simulated_ms = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Some(seed) = seeds.lock().next() else {
                        return;
                    };
                    let report = crate::run(seed, options, setup);
                    simulated_ms.fetch_add(report.simulated.as_millis() as u64, Ordering::Relaxed);
                    let mut result = result.lock();
                    result.seeds += 1;
                    if let Some(converged) = report.converged_after
                        && result
                            .worst_convergence
                            .is_none_or(|(worst, _)| converged > worst)
                    {
                        result.worst_convergence = Some((converged, seed));
                    }
                    let mut kinds: Vec<Known> = report.known().filter_map(|v| v.known).collect();
                    for kind in &kinds {
                        *result.excused.entry(*kind).or_default() += 1;
                    }
                    kinds.sort();
                    kinds.dedup();
                    for kind in kinds {
                        let entry = result.known.entry(kind).or_insert((0, seed));
                        entry.0 += 1;
                        entry.1 = entry.1.min(seed);
                    }
                    if !report.passed() {
                        if stop_at_first {
                            stop.store(true, Ordering::Relaxed);
                        }
                        result.failures.push(report);
                    }
                }
            });
        }
    });
    let mut result = result.into_inner();
    result.simulated = Duration::from_millis(simulated_ms.load(Ordering::Relaxed));
    result.failures.sort_by_key(|report| report.seed);
    result
}

/// Writes `report`'s trace to `target/sim-traces/` (or `$SIM_TRACE_DIR`) and returns the path.
pub fn write_trace(report: &Report, setup: Setup) -> Option<PathBuf> {
    let dir = std::env::var_os("SIM_TRACE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/sim-traces")
        });
    std::fs::create_dir_all(&dir).ok()?;
    let fence = if setup.server_fence {
        ""
    } else {
        "-no-server-fence"
    };
    let name = match setup.off {
        Some(off) => format!("seed-{}-without-{off:?}{fence}.txt", report.seed),
        None => format!("seed-{}{fence}.txt", report.seed),
    };
    let path = dir.join(name);
    std::fs::write(&path, report.trace()).ok()?;
    Some(path)
}

/// Threads for a sweep: `SIM_THREADS`, or the machine's cores.
pub fn threads() -> usize {
    std::env::var("SIM_THREADS")
        .ok()
        .and_then(|threads| threads.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
}
