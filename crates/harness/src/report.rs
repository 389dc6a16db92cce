//! What a bench binary prints and how it is run: `bench_main`, knobs from the environment,
//! progress lines, and the results table.

use std::time::SystemTime;

use tokio::time::Instant;

/// Whether the binary was started by `cargo bench` (which passes `--bench`). `cargo test
/// --all-targets` also runs bench targets; there they only say they were skipped.
pub fn invoked_by_cargo_bench() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// The main of a bench binary: runs `bench` on a multi-threaded runtime when started by
/// `cargo bench`, and only prints how to run it otherwise (`cargo test --all-targets`).
pub fn bench_main<F: Future<Output = ()>>(name: &str, bench: impl FnOnce() -> F) {
    if !invoked_by_cargo_bench() {
        eprintln!(
            "{name}: a benchmark; run it with `cargo bench -p external-endpoints --bench {name}`"
        );
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

/// A number from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A list of numbers from the environment (`1000,10000`), or `default`.
pub fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

/// Prints a progress line to stderr, prefixed with the bench's elapsed time.
pub fn progress(started: Instant, message: impl std::fmt::Display) {
    eprintln!("[{:7.1}s] {message}", started.elapsed().as_secs_f64());
}

/// min / median / max of samples, in the unit they were given.
pub fn summary(samples: &[f64]) -> (f64, f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (sorted[0], median, sorted[n - 1])
}

/// The machine's 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Seconds from `from` to `to` (negative when `to` is earlier).
pub fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A results table, printed to stdout.
#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 6]>,
}

// === impl Table ===

impl Table {
    /// Adds a row: what, n, min, median, max, target/verdict.
    pub fn row(&mut self, what: &str, unit: &str, samples: &[f64], target: &str) {
        let (min, median, max) = summary(samples);
        let fmt = |v: f64| {
            if unit.is_empty() {
                format!("{v:.0}")
            } else {
                format!("{v:.3} {unit}")
            }
        };
        self.rows.push([
            what.to_string(),
            samples.len().to_string(),
            fmt(min),
            fmt(median),
            fmt(max),
            target.to_string(),
        ]);
    }

    /// Prints the table as Markdown.
    pub fn print(&self, title: &str) {
        println!("\n### {title}\n");
        println!("| measurement | n | min | median | max | target |");
        println!("|---|---|---|---|---|---|");
        for row in &self.rows {
            println!("| {} |", row.join(" | "));
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_min_median_max() {
        assert_eq!(summary(&[3.0, 1.0, 2.0]), (1.0, 2.0, 3.0));
        assert_eq!(summary(&[4.0, 1.0, 2.0, 3.0]), (1.0, 2.5, 4.0));
        assert!(summary(&[]).1.is_nan());
    }
}
