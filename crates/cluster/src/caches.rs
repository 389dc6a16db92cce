//! The three caches and the lookups the handlers and reconciles make on them.

use std::{collections::BTreeMap, sync::Arc};

use slices::{CachedService, CachedSlice, CachedWorkload, SERVICE_NAME_LABEL, ServiceKey, Text};

use crate::{
    intern::Interner,
    store::{LabelPair, Store},
};

/// Warm caches of Services, ExternalWorkloads and managed EndpointSlices, in their cached forms,
/// with the string pool they share.
pub struct Caches {
    /// Services, label-indexed by the first pair of their selector.
    pub services: Arc<Store<CachedService>>,
    /// ExternalWorkloads, label-indexed by every label pair.
    pub workloads: Arc<Store<CachedWorkload>>,
    /// Managed EndpointSlices, grouped by their service-name label.
    pub slices: Arc<Store<CachedSlice>>,
    /// The strings the cached objects share.
    pub interner: Arc<Interner>,
}

// === impl Caches ===

impl Caches {
    /// Empty caches.
    pub fn new() -> Self {
        Self {
            services: Arc::new(Store::new().label_indexed(selector_anchor)),
            workloads: Arc::new(Store::new().label_indexed(workload_labels)),
            // A delete the watch shows is remembered past any answer still on its way to the
            // writer (read your own writes: a late answer must not bring the slice back).
            slices: Arc::new(
                Store::grouped(service_name_of)
                    .remembering_deletes(2 * crate::writer::CALL_TIMEOUT),
            ),
            interner: Arc::new(Interner::new()),
        }
    }

    /// The Services of `workload`'s namespace that may select it (a superset: the caller
    /// matches selectors exactly). Each selecting Service is indexed under its first selector
    /// pair, which the workload must carry.
    pub fn candidate_services(&self, workload: &CachedWorkload) -> Vec<Arc<CachedService>> {
        let mut found = BTreeMap::new();
        for pair in workload_labels(workload) {
            for service in self.services.with_label(&workload.namespace, &pair) {
                found.insert(service.name.clone(), service);
            }
        }
        found.into_values().collect()
    }

    /// The workloads of `service`'s namespace that may be selected by it (a superset: the
    /// planner matches the whole selector).
    pub fn candidate_workloads(&self, service: &CachedService) -> Vec<Arc<CachedWorkload>> {
        match selector_anchor(service).into_iter().next() {
            Some(pair) => self.workloads.with_label(&service.namespace, &pair),
            None => Vec::new(),
        }
    }

    /// The cached managed slices labelled with `key`'s Service name.
    pub fn slices_of(&self, key: &ServiceKey) -> Vec<Arc<CachedSlice>> {
        self.slices.in_group(&key.namespace, &key.name)
    }

    /// Number of cached Services, workloads and slices (for logs).
    pub fn summary(&self) -> (usize, usize, usize) {
        (self.services.len(), self.workloads.len(), self.slices.len())
    }
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

/// A Service is indexed under the first pair of its selector (sorted by key); a workload it
/// selects carries that pair, so the pair finds every candidate. Services that get no slices
/// (no selector, ExternalName) select nothing and are not indexed.
fn selector_anchor(service: &CachedService) -> Vec<LabelPair> {
    service
        .selector
        .iter()
        .flat_map(|selector| selector.iter().next())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn workload_labels(workload: &CachedWorkload) -> Vec<LabelPair> {
    workload
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn service_name_of(slice: &CachedSlice) -> Option<Text> {
    slice
        .labels
        .iter()
        .find(|(k, _)| &***k == SERVICE_NAME_LABEL)
        .map(|(_, v)| v.clone())
}
