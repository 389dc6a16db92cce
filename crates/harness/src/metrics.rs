//! Prometheus text as the admin server's `/metrics` serves it: sums of samples by name and
//! label substring.

/// Sums the samples of `name` (counters end in `_total`) in Prometheus text, filtered by a
/// label substring. A declared family with no sample yet sums to 0; an undeclared name is None,
/// so a misspelt metric can never pass as zero.
pub fn sum_metric(body: &str, name: &str, labels: &str) -> Option<f64> {
    let family = name.strip_suffix("_total").unwrap_or(name);
    let declared = body
        .lines()
        .any(|line| line.starts_with(&format!("# TYPE {family} ")));
    let samples: Vec<f64> = body
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name && series.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .collect();
    (declared || !samples.is_empty()).then(|| samples.iter().sum::<f64>() + 0.0)
}

/// One scrape of /metrics (Prometheus text).
#[derive(Clone, Debug)]
pub struct Metrics(pub String);

// === impl Metrics ===

impl Metrics {
    /// The sum of the samples named exactly `name` whose series contains `labels` (see
    /// [`sum_metric`]); None when the name is neither declared nor sampled.
    pub fn get(&self, name: &str, labels: &str) -> Option<f64> {
        sum_metric(&self.0, name, labels)
    }

    /// [`Metrics::get`], 0 for a name not there.
    pub fn sum(&self, name: &str, labels: &str) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Slice writes accepted by the API (creates + updates + deletes).
    pub fn writes(&self) -> f64 {
        self.sum("external_endpoints_slice_writes_total", "")
    }

    /// Slice writes of one operation (`Create`, `Update`, `Delete`).
    pub fn writes_of(&self, operation: &str) -> f64 {
        self.sum(
            "external_endpoints_slice_writes_total",
            &format!("operation=\"{operation}\""),
        )
    }

    /// Reconciles finished (any outcome).
    pub fn reconciles(&self) -> f64 {
        self.sum("external_endpoints_reconcile_duration_seconds_count", "")
    }

    /// Queued or retrying keys.
    pub fn queue_depth(&self) -> f64 {
        self.sum("external_endpoints_queue_depth", "")
    }

    /// Keys being reconciled.
    pub fn in_flight(&self) -> f64 {
        self.sum("external_endpoints_queue_in_flight", "")
    }

    /// Whether this replica leads, has reconciled at least `services` keys, and has nothing
    /// queued or in flight: every Service checked.
    pub fn all_checked(&self, services: usize) -> bool {
        self.sum("external_endpoints_leader", "") == 1.0
            && self.reconciles() >= services as f64
            && self.queue_depth() == 0.0
            && self.in_flight() == 0.0
    }

    /// Keys added to the queue.
    pub fn queue_adds(&self) -> f64 {
        self.sum("external_endpoints_queue_adds_total", "")
    }

    /// User + system CPU time of the process so far, in seconds (10 ms resolution).
    pub fn cpu_seconds(&self) -> f64 {
        self.sum("process_cpu_seconds_total", "")
    }

    /// Resident memory reported by the process itself.
    pub fn rss(&self) -> f64 {
        self.sum("process_resident_memory_bytes", "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "# TYPE external_endpoints_slice_writes counter\n\
        external_endpoints_slice_writes_total{operation=\"Create\"} 2\n\
        external_endpoints_slice_writes_total{operation=\"Update\"} 3\n\
        # TYPE external_endpoints_queue_depth gauge\n";

    #[test]
    fn sums_by_name_and_label() {
        let metrics = Metrics(BODY.to_string());
        assert_eq!(metrics.writes(), 5.0);
        assert_eq!(metrics.writes_of("Update"), 3.0);
        assert_eq!(metrics.get("external_endpoints_queue_depth", ""), Some(0.0));
        assert_eq!(metrics.get("external_endpoints_no_such", ""), None);
        assert_eq!(metrics.sum("external_endpoints_no_such", ""), 0.0);
    }
}
