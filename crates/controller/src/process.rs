//! Process metrics (resident memory, CPU time, open files, start time), read from `/proc` on
//! each scrape. prometheus-client has no process collector, and the few values needed here do
//! not justify another dependency.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Reports the current process's resource use.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// Resident set size in bytes.
    pub resident_bytes: u64,
    /// User plus system CPU time in seconds.
    pub cpu_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
}

// === impl ProcessStats ===

impl ProcessStats {
    /// Reads `/proc/self`; fields that cannot be read stay zero (non-Linux systems).
    pub fn read() -> Self {
        let page_size = 4096u64;
        let resident_bytes = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * page_size);
        let cpu_seconds = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|stat| parse_cpu_ticks(&stat))
            .map_or(0.0, |ticks| ticks as f64 / 100.0);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .map(|dir| dir.count() as u64)
            .unwrap_or(0);
        Self {
            resident_bytes,
            cpu_seconds,
            open_fds,
        }
    }
}

/// utime + stime, in clock ticks (fields 14 and 15; the command name may hold spaces, so count
/// from the closing parenthesis).
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

// === impl ProcessCollector ===

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read();
        let rss = ConstGauge::new(stats.resident_bytes as i64);
        rss.encode(encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            None,
            rss.metric_type(),
        )?)?;
        let cpu = ConstCounter::new(stats.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let fds = ConstGauge::new(stats.open_fds as i64);
        fds.encode(encoder.encode_descriptor(
            "process_open_fds",
            "Number of open file descriptors",
            None,
            fds.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_a_command_name_with_spaces() {
        let stat = "42 (my (odd) cmd) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(10));
    }

    #[test]
    fn reading_this_process_reports_memory() {
        let stats = ProcessStats::read();
        assert!(stats.resident_bytes > 0);
        assert!(stats.open_fds > 0);
    }
}
