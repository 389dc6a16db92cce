//! The load's slow changes: each named, with the leader's log lines from while it waited.

use std::time::{Duration, SystemTime};

use harness::{Replica, report::progress};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// Names each change slower than [`SLOW`](super::SLOW) and prints the leader's warnings and errors (and any
/// line naming the workload's namespace) from a second before it was stored to when it showed.
pub fn report(
    slow: &[((String, String), Instant, f64)],
    leader: &Replica,
    begun: Instant,
    started: Instant,
) {
    if slow.is_empty() {
        return;
    }
    let entries = leader.log_entries();
    for ((namespace, name), acked, latency) in slow {
        let stored = SystemTime::now() - acked.elapsed();
        progress(
            started,
            format!(
                "  slow change: {namespace}/{name}, stored {:.1}s into the load, shown {latency:.1}s later; the leader's log meanwhile:",
                acked.duration_since(begun).as_secs_f64()
            ),
        );
        let from = stored - Duration::from_secs(1);
        let to = stored + Duration::from_secs_f64(*latency);
        for entry in &entries {
            let Some(at) = entry["timestamp"]
                .as_str()
                .and_then(|text| text.parse::<Timestamp>().ok())
                .map(SystemTime::from)
            else {
                continue;
            };
            let level = entry["level"].as_str().unwrap_or_default();
            let text = entry.to_string();
            if at >= from && at <= to && (level != "INFO" || text.contains(namespace.as_str())) {
                println!("    {text}");
            }
        }
    }
}
