//! The three caches and the lookups the handlers and reconciles make on them.

use std::{collections::BTreeMap, sync::Arc};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::ResourceExt;
use slices::{SERVICE_NAME_LABEL, ServiceKey};

use crate::cache::{Cache, LabelPair};

/// Warm caches of Services, ExternalWorkloads and managed EndpointSlices.
pub struct Caches {
    /// Services, label-indexed by the first pair of their selector.
    pub services: Arc<Cache<Service>>,
    /// ExternalWorkloads, label-indexed by every label pair.
    pub workloads: Arc<Cache<ExternalWorkload>>,
    /// Managed EndpointSlices, grouped by their service-name label.
    pub slices: Arc<Cache<EndpointSlice>>,
}

// === impl Caches ===

impl Caches {
    /// Empty caches.
    pub fn new() -> Self {
        Self {
            services: Arc::new(Cache::new().label_indexed(selector_anchor)),
            workloads: Arc::new(Cache::new().label_indexed(workload_labels)),
            slices: Arc::new(Cache::grouped(service_name_of)),
        }
    }

    /// The Services of `workload`'s namespace that may select it (a superset: the caller
    /// matches selectors exactly). Each selecting Service is indexed under its first selector
    /// pair, which the workload must carry.
    pub fn candidate_services(&self, workload: &ExternalWorkload) -> Vec<Arc<Service>> {
        let namespace = workload.namespace().unwrap_or_default();
        let mut found = BTreeMap::new();
        for pair in workload_labels(workload) {
            for service in self.services.with_label(&namespace, &pair) {
                found.insert(service.name_any(), service);
            }
        }
        found.into_values().collect()
    }

    /// The workloads of `service`'s namespace that may be selected by it (a superset: the
    /// planner matches the whole selector).
    pub fn candidate_workloads(&self, service: &Service) -> Vec<Arc<ExternalWorkload>> {
        let namespace = service.namespace().unwrap_or_default();
        match selector_anchor(service).into_iter().next() {
            Some(pair) => self.workloads.with_label(&namespace, &pair),
            None => Vec::new(),
        }
    }

    /// The cached managed slices labelled with `key`'s Service name.
    pub fn slices_of(&self, key: &ServiceKey) -> Vec<Arc<EndpointSlice>> {
        self.slices.in_group(&key.namespace, &key.name)
    }

    /// Whether every cache holds something (for logs).
    pub fn summary(&self) -> (usize, usize, usize) {
        (self.services.len(), self.workloads.len(), self.slices.len())
    }
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

/// A Service is indexed under the first pair of its selector (BTreeMap order); a workload it
/// selects carries that pair, so the pair finds every candidate.
fn selector_anchor(service: &Service) -> Vec<LabelPair> {
    service
        .spec
        .as_ref()
        .and_then(|spec| spec.selector.as_ref())
        .and_then(|selector| selector.iter().next())
        .map(|(k, v)| (k.clone(), v.clone()))
        .into_iter()
        .collect()
}

fn workload_labels(workload: &ExternalWorkload) -> Vec<LabelPair> {
    workload.labels().clone().into_iter().collect()
}

fn service_name_of(slice: &EndpointSlice) -> String {
    slice
        .labels()
        .get(SERVICE_NAME_LABEL)
        .cloned()
        .unwrap_or_default()
}
