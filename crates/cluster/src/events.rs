//! Warning Events on a Service for workload data that cannot be used (docs/operations.md).
//!
//! Deduplicated: the same problem of the same workload for the same Service is published at most
//! once per [`REPEAT_AFTER`], so a flapping workload, or a resync every few minutes, does not
//! flood the Service's Events. Publishing is fenced like every other write.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use leadership::Fence;
use parking_lot::Mutex;
use slices::{CachedService, Diagnostic, ProblemKind, ServiceKey};
use tokio::time::Instant;

use crate::metrics::Metrics;

/// How long an identical Event is held back after it was published.
pub const REPEAT_AFTER: Duration = Duration::from_secs(600);

/// Bound on remembered Events; past it, the oldest are forgotten (and may be published again).
const MAX_REMEMBERED: usize = 50_000;

/// Publishes deduplicated Warning Events.
pub struct Diagnostics {
    recorder: Recorder,
    published: Mutex<BTreeMap<(ServiceKey, Diagnostic), Instant>>,
}

// === impl Diagnostics ===

impl Diagnostics {
    /// Publishes as `controller` (the managed-by value) from `instance` (this replica).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: Some(instance.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            published: Mutex::new(BTreeMap::new()),
        }
    }

    /// Counts, logs and publishes `diagnostics` of `service`. Event failures are logged, never
    /// returned: an Event is a report, not part of the slices' correctness.
    pub async fn report(
        &self,
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
                self.forget(key, diagnostic);
                return;
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
            match self
                .recorder
                .publish(&event, &service.object_reference())
                .await
            {
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
