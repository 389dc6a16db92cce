//! Prometheus metrics of the controller (docs/operations.md). Labels are bounded enums only;
//! object names never become labels.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::ConstGauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use leadership::{ElectorMetrics, FenceMetrics, Leadership, QueueMetrics};
use slices::ProblemKind;

use crate::{
    timing::TimingMetrics,
    view::{Vouched, VouchedLabels, Wait, WaitLabels},
};

/// Counters and histograms the reconcile path updates.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Reconcile durations by outcome.
    pub reconcile_duration: Family<OutcomeLabels, Histogram>,
    /// Slice writes sent and accepted, by operation.
    pub slice_writes: Family<WriteLabels, Counter>,
    /// Slice writes that failed, by operation.
    pub slice_write_errors: Family<WriteLabels, Counter>,
    /// Waits of the fresh-view rule, by reason (docs/architecture.md, "A fresh view").
    pub view_waits: Family<WaitLabels, Counter>,
    /// Passes that added an endpoint, by what vouched for the addition (clause 3 of the
    /// fresh-view rule).
    pub additions: Family<VouchedLabels, Counter>,
    /// Workload values left out of slices, by reason.
    pub invalid_workload_data: Family<ReasonLabels, Counter>,
    /// Warning Events published on Services.
    pub events_published: Counter,
    /// Watch errors (each retried with backoff), by kind.
    pub watch_errors: Family<KindLabels, Counter>,
    /// Complete re-lists after the first list (after a 410 Gone, ...), by kind.
    pub watch_relists: Family<KindLabels, Counter>,
    /// Watches silent past the stall bound, by kind.
    pub watch_stalls: Family<KindLabels, Counter>,
    /// How long the last acquisition barrier took (acquired → caches shown up to date).
    pub acquire_barrier_seconds:
        prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Change seen → write answered, and the time spent in each stage between.
    pub timing: TimingMetrics,
}

/// How a reconcile ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Planned and wrote (or had nothing to write).
    Ok,
    /// The view did not satisfy the fresh-view rule (`view_waits_total` says why); retried
    /// shortly without writing.
    Waited,
    /// A write was refused by the fence: the term is over (not retried; the next term replays)
    /// or the lease is not safely held right now (retried shortly).
    Fenced,
    /// A slice changed since the cache showed it (409 on an update or a delete); planned again
    /// shortly.
    Conflict,
    /// An API call failed; retried with backoff.
    Error,
}

#[cfg(test)]
impl Outcome {
    /// Every outcome, in the order the docs list them.
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Waited,
        Outcome::Fenced,
        Outcome::Conflict,
        Outcome::Error,
    ];
}

/// Label set with an [`Outcome`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// How the reconcile ended.
    pub outcome: Outcome,
}

/// A slice write operation.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Operation {
    /// A create.
    Create,
    /// An update.
    Update,
    /// A delete.
    Delete,
}

/// Label set with an [`Operation`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// The operation.
    pub operation: Operation,
}

/// Label set with a bounded reason (a `slices::ProblemKind`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The reason: a [`ProblemKind`] in snake case.
    pub reason: &'static str,
}

impl From<ProblemKind> for ReasonLabels {
    fn from(kind: ProblemKind) -> Self {
        Self {
            reason: kind.as_str(),
        }
    }
}

/// Label set with a watched kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The watched kind.
    pub kind: &'static str,
}

/// Reads the leadership runtime's own counters on each scrape.
#[derive(Debug)]
pub struct LeadershipCollector {
    /// The elector's counters.
    pub elector: ElectorMetrics,
    /// The fences' refusals.
    pub fence: FenceMetrics,
    /// The work queue (read-only).
    pub queue: QueueMetrics,
    /// Current leadership.
    pub leadership: Leadership,
}

/// The two leader gauges of one process, read at scrape time ([`LeaderGauges::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LeaderGauges {
    /// 1 while this process leads, else 0.
    leader: i64,
    /// The current term's id, 0 while following.
    term: i64,
}

// === impl Metrics ===

impl Metrics {
    /// Counts one wait of the fresh-view rule.
    pub fn count_wait(&self, reason: Wait) {
        self.view_waits.get_or_create(&WaitLabels { reason }).inc();
    }

    /// Counts one pass whose additions were vouched for `by` the caches or by reads.
    pub fn count_addition(&self, by: Vouched) {
        self.additions.get_or_create(&VouchedLabels { by }).inc();
    }

    /// Creates the metrics and registers them in `registry` (which should carry the
    /// `external_endpoints` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconcile_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.5, 14))
            }),
            slice_writes: Family::default(),
            slice_write_errors: Family::default(),
            view_waits: Family::default(),
            additions: Family::default(),
            invalid_workload_data: Family::default(),
            events_published: Counter::default(),
            watch_errors: Family::default(),
            watch_relists: Family::default(),
            watch_stalls: Family::default(),
            acquire_barrier_seconds: Default::default(),
            timing: TimingMetrics::new(),
        };
        // Every bounded label value starts at zero, so a rate() or an absence check works
        // before the first event.
        for operation in [Operation::Create, Operation::Update, Operation::Delete] {
            let labels = WriteLabels { operation };
            metrics.slice_writes.get_or_create(&labels).inc_by(0);
            metrics.slice_write_errors.get_or_create(&labels).inc_by(0);
        }
        for reason in Wait::ALL {
            metrics
                .view_waits
                .get_or_create(&WaitLabels { reason })
                .inc_by(0);
        }
        for by in [Vouched::caches, Vouched::reads] {
            metrics
                .additions
                .get_or_create(&VouchedLabels { by })
                .inc_by(0);
        }
        for kind in ProblemKind::ALL {
            metrics
                .invalid_workload_data
                .get_or_create(&ReasonLabels::from(kind))
                .inc_by(0);
        }
        registry.register(
            "reconcile_duration_seconds",
            "Time to reconcile one Service, by outcome",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "slice_writes",
            "EndpointSlice writes accepted by the API, by operation",
            metrics.slice_writes.clone(),
        );
        registry.register(
            "slice_write_errors",
            "EndpointSlice writes that failed, by operation",
            metrics.slice_write_errors.clone(),
        );
        registry.register(
            "view_waits",
            "Waits of the fresh-view rule, by reason: a new term brought up to its acquisition \
             point (acquiring), a Service's slices read back after a write of unknown outcome \
             (own_writes), an addition the API server did not confirm (unconfirmed, or \
             lost_watch while a watch catches up)",
            metrics.view_waits.clone(),
        );
        registry.register(
            "additions",
            "Passes that added an endpoint to a Service's slices, by what showed the addition \
             as the API server had it (clause 3 of the fresh-view rule): the caches (the Service \
             and the added workloads unchanged since both watches' marks) or reads from the API \
             server after the plan",
            metrics.additions.clone(),
        );
        registry.register(
            "invalid_workload_data",
            "Workload values left out of slices (non-IP address, unresolved named port), by reason",
            metrics.invalid_workload_data.clone(),
        );
        registry.register(
            "events_published",
            "Warning Events published on Services",
            metrics.events_published.clone(),
        );
        registry.register(
            "watch_errors",
            "Watch errors, each retried with backoff, by kind",
            metrics.watch_errors.clone(),
        );
        registry.register(
            "watch_relists",
            "Complete re-lists of a watched kind after its first list (410 Gone, a watch that \
             could not resume), by kind",
            metrics.watch_relists.clone(),
        );
        registry.register(
            "watch_stalls",
            "Watches that delivered nothing (no event, no bookmark) past the stall bound and were \
             restarted, by kind",
            metrics.watch_stalls.clone(),
        );
        registry.register(
            "acquire_barrier_seconds",
            "Time the last acquired term waited for every cache to be shown up to date with the \
             API server before its replay",
            metrics.acquire_barrier_seconds.clone(),
        );
        registry.register(
            "sync_latency_seconds",
            "Time from a change seen by this replica's watch (the trigger time written to the \
             endpoints.kubernetes.io/last-change-trigger-time annotation) to the API's answer to \
             the last write that published it",
            metrics.timing.sync_latency.clone(),
        );
        registry.register(
            "stage_seconds",
            "Time a change spends in each stage between the watch event and the write's answer, \
             by stage (diagnostics)",
            metrics.timing.stages.clone(),
        );
        metrics
    }

    /// Counts one accepted write.
    pub fn count_write(&self, operation: Operation) {
        self.slice_writes
            .get_or_create(&WriteLabels { operation })
            .inc();
    }

    /// Counts one failed write.
    pub fn count_write_error(&self, operation: Operation) {
        self.slice_write_errors
            .get_or_create(&WriteLabels { operation })
            .inc();
    }
}

// === impl LeaderGauges ===

impl LeaderGauges {
    /// The gauges of `leadership` now.
    fn of(leadership: &Leadership) -> Self {
        let term = leadership.borrow().as_ref().map(|term| term.id());
        Self {
            leader: i64::from(term.is_some()),
            term: term.map_or(0, |id| i64::try_from(id).unwrap_or(i64::MAX)),
        }
    }
}

// === impl LeadershipCollector ===

impl Collector for LeadershipCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauges = LeaderGauges::of(&self.leadership);
        gauge(
            &mut encoder,
            "leader",
            "1 while this replica holds the Lease and writes, else 0",
            gauges.leader,
        )?;
        gauge(
            &mut encoder,
            "leader_term",
            "Id of the current leadership term of this process (0 while following)",
            gauges.term,
        )?;
        counter(
            &mut encoder,
            "leader_acquisitions",
            "Leadership terms started (Lease acquired)",
            self.elector.acquisitions(),
        )?;
        counter(
            &mut encoder,
            "leader_step_downs",
            "Leadership terms ended (renew deadline passed, another holder seen, or released)",
            self.elector.step_downs(),
        )?;
        counter(
            &mut encoder,
            "leader_terms_given_up",
            "Leadership terms given up because their acquisition barrier outlasted the prepare timeout (Lease released, competing again after the lease duration)",
            self.elector.terms_given_up(),
        )?;
        counter(
            &mut encoder,
            "leader_preferences_declined",
            "Coordinated election: times the holder kept the Lease although the election controller preferred a candidate that is not older (same versions, newer, or gone); once per term and preferred candidate",
            self.elector.preferences_declined(),
        )?;
        counter(
            &mut encoder,
            "lease_renew_failures",
            "Lease renewals that failed",
            self.elector.renew_failures(),
        )?;
        counter(
            &mut encoder,
            "lease_watch_stalls",
            "Lease watches that delivered nothing for twice the lease duration and were restarted",
            self.elector.watch_stalls(),
        )?;
        counter(
            &mut encoder,
            "fenced_writes",
            "Writes refused because the term was over or the lease not safely held",
            self.fence.fenced(),
        )?;
        gauge(
            &mut encoder,
            "queue_depth",
            "Service keys queued or waiting for a retry",
            (self.queue.depth() + self.queue.waiting()) as i64,
        )?;
        gauge(
            &mut encoder,
            "queue_in_flight",
            "Service keys being reconciled",
            self.queue.in_flight() as i64,
        )?;
        counter(
            &mut encoder,
            "queue_adds",
            "Service keys added to the queue",
            self.queue.adds(),
        )?;
        counter(
            &mut encoder,
            "queue_retries",
            "Service keys requeued after a failure",
            self.queue.retries(),
        )?;
        counter(
            &mut encoder,
            "queue_capped_retries",
            "Retries made at the maximum backoff (a key failing again and again, still retried)",
            self.queue.capped_retries(),
        )?;
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_kind_is_pre_registered() {
        let mut registry = Registry::default();
        Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for kind in ProblemKind::ALL {
            let line = format!(
                "invalid_workload_data_total{{reason=\"{}\"}} 0",
                kind.as_str()
            );
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
    }

    /// docs/operations.md lists exactly the outcomes a reconcile is counted under.
    #[test]
    fn reconcile_outcomes_are_the_ones_the_operations_guide_lists() {
        let guide = include_str!("../../../docs/operations.md");
        let row = guide
            .lines()
            .find(|line| line.starts_with("| `external_endpoints_reconcile_duration_seconds`"))
            .expect("the guide has a row for the reconcile histogram");
        let listed = row.split('|').nth(3).expect("a labels column");
        let documented: Vec<&str> = listed
            .trim()
            .trim_start_matches("`outcome`:")
            .split(',')
            .map(|label| label.trim().trim_matches('`'))
            .collect();
        let served: Vec<String> = Outcome::ALL
            .iter()
            .map(|outcome| {
                let mut text = String::new();
                let labels = OutcomeLabels { outcome: *outcome };
                let family = Family::<OutcomeLabels, Counter>::default();
                family.get_or_create(&labels).inc();
                let mut registry = Registry::default();
                registry.register("r", "", family);
                prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
                let start = text.find("outcome=\"").unwrap() + "outcome=\"".len();
                let end = start + text[start..].find('"').unwrap();
                text[start..end].to_string()
            })
            .collect();
        assert_eq!(documented, served);
    }

    #[test]
    fn leader_gauges_name_the_current_term_while_leading_and_zero_while_following() {
        let term = leadership::testing::unbounded_term();
        let (sender, leadership) = leadership::testing::leadership(Some(term.clone()));
        assert_eq!(
            LeaderGauges::of(&leadership),
            LeaderGauges {
                leader: 1,
                term: term.id() as i64
            }
        );
        sender.send_replace(None);
        assert_eq!(
            LeaderGauges::of(&leadership),
            LeaderGauges { leader: 0, term: 0 }
        );
    }

    #[test]
    fn write_counters_start_at_zero() {
        let mut registry = Registry::default();
        Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("slice_writes_total{operation=\"Create\"} 0"),
            "{text}"
        );
        assert!(text.contains("invalid_workload_data_total{reason=\"invalid_ip\"} 0"));
    }
}
