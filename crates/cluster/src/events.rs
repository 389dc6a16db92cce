//! Warning Events on a Service for workload data that cannot be used (docs/operations.md).
//!
//! Deduplicated: the same problem of the same workload for the same Service is published at most
//! once per [`REPEAT_AFTER`], so a flapping workload, or a resync every few minutes, does not
//! flood the Service's Events. Publishing is fenced like every other write.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use leadership::Fence;
use parking_lot::Mutex;
use slices::{CachedService, Diagnostic, ProblemKind, ServiceKey};
use tokio::time::Instant;

use crate::{metrics::Metrics, writer::WriteApi};

/// How long an identical Event is held back after it was published.
pub const REPEAT_AFTER: Duration = Duration::from_secs(600);

/// Bound on remembered Events; past it, the oldest are forgotten (and may be published again).
const MAX_REMEMBERED: usize = 50_000;

/// Publishes deduplicated Warning Events.
#[derive(Default)]
pub struct Diagnostics {
    published: Mutex<BTreeMap<(ServiceKey, Diagnostic), Instant>>,
}

// === impl Diagnostics ===

impl Diagnostics {
    /// Counts, logs and publishes (through `api`) `diagnostics` of `service`. Event failures are
    /// logged, never returned: an Event is a report, not part of the slices' correctness.
    pub async fn report<W: WriteApi>(
        &self,
        api: &W,
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

    fn forget(&self, key: &ServiceKey, diagnostic: &Diagnostic) {
        self.published
            .lock()
            .remove(&(key.clone(), diagnostic.clone()));
    }

    fn should_publish(&self, key: &ServiceKey, diagnostic: &Diagnostic) -> bool {
        let now = Instant::now();
        let mut published = self.published.lock();
        if published.len() >= MAX_REMEMBERED {
            published.retain(|_, at| now.duration_since(*at) < REPEAT_AFTER);
        }
        let entry = (key.clone(), diagnostic.clone());
        match published.get(&entry) {
            Some(at) if now.duration_since(*at) < REPEAT_AFTER => false,
            _ => {
                published.insert(entry, now);
                true
            }
        }
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
    //! Publishing through a fake [`WriteApi`]: fenced like writes, deduplicated, retried after
    //! a failure.
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use prometheus_client::registry::Registry;
    use slices::{Problem, testing::Svc};

    use super::*;
    use crate::fake::{FakeApi, TestTerm};

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

        async fn report(&self, api: &FakeApi, term: &TestTerm) {
            let (service, key) = (&self.service, &self.key);
            self.diagnostics
                .report(
                    api,
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
        let api = FakeApi::default();
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
        let api = FakeApi::default();
        reporting.report(&api, &term).await;
        reporting.report(&api, &term).await;
        assert_eq!(api.calls(), [PUBLISHED; 2], "one per workload");
        assert_eq!(reporting.counted(), 4, "every occurrence is counted");

        tokio::time::advance(REPEAT_AFTER).await;
        reporting.report(&api, &term).await;
        assert_eq!(api.calls(), [PUBLISHED; 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_event_is_published_again_on_the_next_pass() {
        let reporting = Reporting::new();
        let term = TestTerm::new();
        let api = FakeApi::failing(&[(PUBLISHED, 500)]);
        reporting.report(&api, &term).await;
        let api = FakeApi::default();
        reporting.report(&api, &term).await;
        assert_eq!(api.calls(), [PUBLISHED; 2]);
    }
}
