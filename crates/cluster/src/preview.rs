//! What the controller would write now, from one list of each kind, without writing: the
//! caches a term plans on, filled from the lists, and the same planner call per Service.

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use slices::{CachedSlice, CachedWorkload, ServiceKey, SlicePlan, plan_cached};

use crate::{caches::Caches, watch::Project};

/// The plan of every listed Service that has something to write, sorted by Service, as a
/// replica that just took the Lease would make it from caches holding exactly these objects.
/// `slices` are the managed slices (the controller's watch selects them by managed-by label);
/// others are ignored by the planner anyway.
pub fn plan_all(
    services: &[Service],
    workloads: &[ExternalWorkload],
    slices: &[EndpointSlice],
    config: &slices::Config,
    trigger_time: &Time,
) -> Vec<(ServiceKey, SlicePlan)> {
    let caches = Caches::new();
    for service in services {
        caches.services.apply(service.project(&caches.interner));
    }
    for workload in workloads {
        caches.workloads.apply(workload.project(&caches.interner));
    }
    for slice in slices {
        caches.slices.apply(slice.project(&caches.interner));
    }
    let mut plans = Vec::new();
    for service in caches.services.all() {
        let key = ServiceKey {
            namespace: service.namespace.to_string(),
            name: service.name.to_string(),
        };
        let cached = caches.slices_of(&key);
        let existing: Vec<&CachedSlice> = cached.iter().map(AsRef::as_ref).collect();
        let candidates = caches.candidate_workloads(&service);
        let workloads: Vec<&CachedWorkload> = candidates.iter().map(AsRef::as_ref).collect();
        let plan = plan_cached(&service, &workloads, &existing, config, trigger_time);
        if !plan.is_empty() {
            plans.push((key, plan));
        }
    }
    plans.sort_by(|a, b| a.0.cmp(&b.0));
    plans
}
