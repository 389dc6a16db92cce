//! Warning Events on a Service for workload data that cannot be used (docs/operations.md).
//!
//! Deduplicated: the same problem of the same workload for the same Service is published at most
//! once per [`REPEAT_AFTER`], so a flapping workload, or a resync every few minutes, does not
//! flood the Service's Events. Publishing is fenced like every other write.
//!
//! The memory of what was published is bounded: past [`MAX_REMEMBERED`] entries, expired ones
//! are dropped, then the oldest published (a tenth of the bound at a time, so the cost of a
//! clean-up is spread over many Events). A forgotten problem may be published once more before
//! its repeat period is over; that is the price of the bound.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use leadership::Fence;
use parking_lot::Mutex;
use slices::{CachedService, Diagnostic, ProblemKind, ServiceKey};
use tokio::time::Instant;

use crate::{metrics::Metrics, writer::KubeReadWrite};

/// How long an identical Event is held back after it was published.
pub const REPEAT_AFTER: Duration = Duration::from_secs(600);

/// Bound on remembered Events; past it, the oldest are forgotten (and may be published again).
///
/// An entry is a Service key and a diagnostic: a few short strings, about 300 bytes with the
/// map's own overhead (an estimate, not a measurement), so the bound keeps this memory to about
/// 15 MB even when 50k distinct problems show up within one repeat period, which only a whole
/// cluster of broken workloads would cause.
pub const MAX_REMEMBERED: usize = 50_000;

/// Publishes deduplicated Warning Events.
pub struct Diagnostics {
    published: Mutex<Published>,
    /// How many entries `published` may hold.
    capacity: usize,
}

/// A problem published, and when.
type Entry = (ServiceKey, Diagnostic);

/// The Events published recently, with the order they were published in.
#[derive(Default)]
struct Published {
    entries: BTreeMap<Entry, PublishedAt>,
    /// Counts publications, to tell the oldest entries apart even at the same instant.
    sequence: u64,
}

#[derive(Clone, Copy)]
struct PublishedAt {
    at: Instant,
    sequence: u64,
}

// === impl Diagnostics ===

impl Diagnostics {
    /// Counts, logs and publishes (through `api`) `diagnostics` of `service`. Event failures are
    /// logged, never returned: an Event is a report, not part of the slices' correctness.
    pub async fn report(
        &self,
        api: &KubeReadWrite,
        service: &CachedService,
        key: &ServiceKey,
        diagnostics: &[Diagnostic],
        fence: &Fence,
        metrics: &Metrics,
    ) {
        for diagnostic in diagnostics {
            let kind = diagnostic.problem.kind();
            metrics
                .invalid_workload_data
                .get_or_create(&kind.into())
                .inc();
            if !self.should_publish(key, diagnostic) {
                continue;
            }
            tracing::warn!(
                workload = %diagnostic.workload,
                reason = kind.as_str(),
                "{}", diagnostic.problem
            );
            if fence.check().is_err() {
                // Not published, so not remembered; the rest is still counted.
                self.forget(key, diagnostic);
                continue;
            }
            let event = Event {
                type_: EventType::Warning,
                reason: event_reason(kind).to_string(),
                note: Some(format!(
                    "ExternalWorkload {}: {}",
                    diagnostic.workload, diagnostic.problem
                )),
                action: "PublishEndpointSlices".into(),
                secondary: Some(workload_reference(key, &diagnostic.workload)),
            };
            match api.publish_event(&event, &service.object_reference()).await {
                Ok(()) => {
                    metrics.events_published.inc();
                }
                Err(error) => {
                    // Forget it, so the next pass tries again.
                    self.forget(key, diagnostic);
                    tracing::warn!(%error, "publishing an Event failed");
                }
            }
        }
    }

    /// Remembers at most `capacity` published Events instead of [`MAX_REMEMBERED`].
    #[cfg(test)]
    fn with_capacity(capacity: usize) -> Self {
        Self {
            published: Mutex::default(),
            capacity,
        }
    }

    fn forget(&self, key: &ServiceKey, diagnostic: &Diagnostic) {
        self.published
            .lock()
            .entries
            .remove(&(key.clone(), diagnostic.clone()));
    }

    /// Whether this problem is due to be published; if so, remembers it as published now.
    fn should_publish(&self, key: &ServiceKey, diagnostic: &Diagnostic) -> bool {
        let now = Instant::now();
        let mut published = self.published.lock();
        let entry = (key.clone(), diagnostic.clone());
        match published.entries.get(&entry) {
            Some(last) if now.duration_since(last.at) < REPEAT_AFTER => return false,
            Some(_) => {}
            None => published.make_room(self.capacity, now),
        }
        published.sequence += 1;
        let sequence = published.sequence;
        published
            .entries
            .insert(entry, PublishedAt { at: now, sequence });
        true
    }
}

impl Default for Diagnostics {
    fn default() -> Self {
        Self {
            published: Mutex::default(),
            capacity: MAX_REMEMBERED,
        }
    }
}

// === impl Published ===

impl Published {
    /// Makes room for one more entry within `capacity`: drops the expired entries, then, if
    /// that is not enough, the oldest published tenth of the bound.
    fn make_room(&mut self, capacity: usize, now: Instant) {
        if self.entries.len() < capacity {
            return;
        }
        self.entries
            .retain(|_, last| now.duration_since(last.at) < REPEAT_AFTER);
        if self.entries.len() < capacity {
            return;
        }
        let keep = capacity.saturating_sub((capacity / 10).max(1));
        let excess = self.entries.len() - keep;
        let mut sequences: Vec<u64> = self.entries.values().map(|last| last.sequence).collect();
        let (_, newest_forgotten, _) = sequences.select_nth_unstable(excess - 1);
        let newest_forgotten = *newest_forgotten;
        self.entries
            .retain(|_, last| last.sequence > newest_forgotten);
    }
}

/// The Event reason (CamelCase, as Kubernetes spells them) of each kind of problem.
fn event_reason(kind: ProblemKind) -> &'static str {
    match kind {
        ProblemKind::InvalidIp => "InvalidWorkloadIP",
        ProblemKind::UnresolvedPort => "UnresolvedWorkloadPort",
        ProblemKind::InvalidPort => "InvalidWorkloadPort",
        ProblemKind::InvalidHostname => "InvalidWorkloadHostname",
    }
}

fn workload_reference(key: &ServiceKey, workload: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("workload.linkerd.io/v1beta1".into()),
        kind: Some("ExternalWorkload".into()),
        namespace: Some(key.namespace.clone()),
        name: Some(workload.to_string()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    //! Publishing through the writer to the in-memory API server: fenced like
    //! writes, deduplicated, retried after a failure ([`crate::test_api`]).
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use prometheus_client::registry::Registry;
    use slices::{Problem, testing::Svc};

    use super::*;
    use crate::test_api::{TestApi, TestTerm};

    /// One Service whose two workloads lack its named port, reported through `diagnostics`.
    struct Reporting {
        service: CachedService,
        key: ServiceKey,
        problems: Vec<Diagnostic>,
        metrics: Metrics,
        diagnostics: Diagnostics,
    }

    const PUBLISHED: &str = "event UnresolvedWorkloadPort web";

    impl Reporting {
        fn new() -> Self {
            let service = Svc::named("web")
                .namespace("ns")
                .selector("app", "web")
                .build();
            Self {
                service: CachedService::from(&service),
                key: ServiceKey::new("ns", "web"),
                problems: ["vm-1", "vm-2"]
                    .map(|workload| Diagnostic {
                        workload: workload.into(),
                        problem: Problem::UnresolvedPort {
                            port_name: "http".into(),
                            protocol: "TCP".into(),
                        },
                    })
                    .into(),
                metrics: Metrics::register(&mut Registry::default()),
                diagnostics: Diagnostics::default(),
            }
        }

        async fn report(&self, api: &TestApi, term: &TestTerm) {
            let (service, key) = (&self.service, &self.key);
            self.diagnostics
                .report(
                    &api.writes,
                    service,
                    key,
                    &self.problems,
                    &term.fence,
                    &self.metrics,
                )
                .await;
        }

        fn counted(&self) -> u64 {
            let labels = ProblemKind::UnresolvedPort.into();
            self.metrics
                .invalid_workload_data
                .get_or_create(&labels)
                .get()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_are_fenced_like_writes() {
        let reporting = Reporting::new();
        let ended = TestTerm::new();
        ended.end();
        let api = TestApi::new();
        reporting.report(&api, &ended).await;
        assert!(api.calls().is_empty(), "no Event after the term ended");
        assert_eq!(reporting.counted(), 2, "both problems are still counted");

        // Not remembered as published: the next term publishes them.
        reporting.report(&api, &TestTerm::new()).await;
        assert_eq!(api.calls(), [PUBLISHED, PUBLISHED]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_problem_is_published_once_per_repeat_period() {
        let reporting = Reporting::new();
        let term = TestTerm::new();
        let api = TestApi::new();
        reporting.report(&api, &term).await;
        reporting.report(&api, &term).await;
        assert_eq!(api.calls(), [PUBLISHED; 2], "one per workload");
        assert_eq!(reporting.counted(), 4, "every occurrence is counted");

        tokio::time::advance(REPEAT_AFTER).await;
        reporting.report(&api, &term).await;
        assert_eq!(api.calls(), [PUBLISHED; 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_bound_the_oldest_published_are_forgotten_first() {
        let mut reporting = Reporting::new();
        reporting.diagnostics = Diagnostics::with_capacity(10);
        let term = TestTerm::new();
        let api = TestApi::new();
        let problem = |workload: usize| Diagnostic {
            workload: format!("vm-{workload}"),
            problem: Problem::UnresolvedPort {
                port_name: "http".into(),
                protocol: "TCP".into(),
            },
        };
        // 0..10 fill the memory (all within their repeat period); 10 forgets the oldest, 0.
        reporting.problems = (0..=10).map(problem).collect();
        reporting.report(&api, &term).await;
        assert_eq!(api.calls().len(), 11);
        assert!(reporting.diagnostics.published.lock().entries.len() <= 10);

        // Still remembered: 1..=10 are held back. Forgotten: 0 is published again.
        reporting.problems = (0..=10).rev().map(problem).collect();
        reporting.report(&api, &term).await;
        assert_eq!(api.calls().len(), 12, "only the forgotten problem again");
        assert!(reporting.diagnostics.published.lock().entries.len() <= 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_event_is_published_again_on_the_next_pass() {
        let reporting = Reporting::new();
        let term = TestTerm::new();
        let api = TestApi::new().failing(&[(PUBLISHED, 500)]);
        reporting.report(&api, &term).await;
        assert_eq!(api.calls(), [PUBLISHED; 2], "both tried, both failed");
        api.heal(PUBLISHED);
        reporting.report(&api, &term).await;
        assert_eq!(
            api.calls(),
            [PUBLISHED; 4],
            "both published on the next pass"
        );
        assert_eq!(api.server.objects::<K8sEvent>().len(), 2);
    }
}
