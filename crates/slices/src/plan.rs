//! `plan_slices`: the whole of design.md section 4 for one Service.

use std::collections::BTreeMap;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::desired::{Family, GroupKey, desired, port_keys};
use crate::labels::{SERVICE_NAME_LABEL, active_selector, is_managed, is_owned_by, label};
use crate::pack::{SliceContext, endpoint_key, pack, rewrite};
use crate::{Config, Diagnostic};

/// The writes that bring one Service's slices to their desired state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlicePlan {
    /// New slices (with `generateName`, no name).
    pub creates: Vec<EndpointSlice>,
    /// Replacements of existing slices (name and resourceVersion of the existing slice).
    pub updates: Vec<EndpointSlice>,
    /// Slices to delete, as found in the cache.
    pub deletes: Vec<EndpointSlice>,
    /// Workload values left out, for Events and metrics; not writes.
    pub diagnostics: Vec<Diagnostic>,
}

/// One API call of a plan, in write order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Write<'a> {
    /// Create this slice.
    Create(&'a EndpointSlice),
    /// Replace the slice of this name (optimistic on its resourceVersion).
    Update(&'a EndpointSlice),
    /// Delete the slice of this name; NotFound counts as success.
    Delete(&'a EndpointSlice),
}

// === impl SlicePlan ===

impl SlicePlan {
    /// No write to do (diagnostics do not count).
    pub fn is_empty(&self) -> bool {
        self.creates.is_empty() && self.updates.is_empty() && self.deletes.is_empty()
    }

    /// Number of API calls in the plan.
    pub fn write_count(&self) -> usize {
        self.creates.len() + self.updates.len() + self.deletes.len()
    }

    /// The writes in the order to send them: creates, then updates, then deletes, so that
    /// endpoints are never missing between two calls. The writer must stop before the deletes
    /// if a create or update failed.
    pub fn writes(&self) -> impl Iterator<Item = Write<'_>> {
        let creates = self.creates.iter().map(Write::Create);
        let updates = self.updates.iter().map(Write::Update);
        let deletes = self.deletes.iter().map(Write::Delete);
        creates.chain(updates).chain(deletes)
    }

    /// Drops the creates when `service` is being deleted: a slice created now would only wait
    /// for the garbage collector. `plan_slices` already applies this.
    #[must_use]
    pub fn without_creates_if_deleting(mut self, service: &Service) -> Self {
        if service.metadata.deletion_timestamp.is_some() {
            self.creates.clear();
        }
        self
    }
}

impl<'a> Write<'a> {
    /// The slice this call sends or removes.
    pub fn slice(&self) -> &'a EndpointSlice {
        match self {
            Write::Create(s) | Write::Update(s) | Write::Delete(s) => s,
        }
    }
}

/// Plans the slices of `service`.
///
/// - `workloads`: the workloads of the Service's namespace (others are ignored; selection is
///   done here).
/// - `existing`: cached slices with our managed-by label and this Service's service-name label
///   (anything else is ignored and never touched).
/// - `trigger_time`: time of the change that caused this pass, written to the
///   `endpoints.kubernetes.io/last-change-trigger-time` annotation of written slices only.
pub fn plan_slices(
    service: &Service,
    workloads: &[&ExternalWorkload],
    existing: &[&EndpointSlice],
    config: &Config,
    trigger_time: &Time,
) -> SlicePlan {
    let service_name = service.metadata.name.as_deref().unwrap_or_default();
    let mut ours: Vec<&EndpointSlice> = existing
        .iter()
        .copied()
        .filter(|s| is_managed(s, config) && label(s, SERVICE_NAME_LABEL) == Some(service_name))
        .filter(|s| s.metadata.namespace == service.metadata.namespace)
        .collect();
    ours.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut plan = SlicePlan::default();
    if active_selector(service).is_none() {
        // Lost its selector or became ExternalName: our slices go.
        plan.deletes = ours.into_iter().cloned().collect();
        return plan;
    }

    let desired = desired(service, workloads);
    plan.diagnostics = desired.diagnostics;
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    let ctx = SliceContext {
        service,
        config,
        namespace,
        trigger_time,
        max: config.max_endpoints_per_slice(),
    };

    // Sort existing slices into groups; foreign-owned and wrong-family slices go.
    let mut existing_groups: BTreeMap<GroupKey, Vec<&EndpointSlice>> = BTreeMap::new();
    let mut recyclable: Vec<EndpointSlice> = Vec::new();
    for slice in ours {
        if !is_owned_by(slice, service) {
            plan.deletes.push(slice.clone());
            continue;
        }
        match Family::parse(&slice.address_type).filter(|f| desired.families.contains(f)) {
            Some(family) => existing_groups
                .entry(GroupKey {
                    family,
                    ports: port_keys(slice.ports.as_ref()),
                })
                .or_default()
                .push(slice),
            None => plan.deletes.push(slice.clone()),
        }
    }

    // Steps 1 to 4, group by group; a group no longer desired packs nothing and deletes all.
    for (key, wanted) in &desired.groups {
        let slices = existing_groups.remove(key).unwrap_or_default();
        let packed = pack(key, wanted, &slices, &ctx);
        plan.creates.extend(packed.creates);
        plan.updates.extend(packed.updates);
        recyclable.extend(packed.deletes);
    }
    for slices in existing_groups.into_values() {
        recyclable.extend(slices.into_iter().cloned());
    }

    // Step 5: a create and a delete of the same family become one update of the deleted slice.
    recyclable.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut creates = Vec::new();
    for create in std::mem::take(&mut plan.creates) {
        let reuse = recyclable
            .iter()
            .position(|d| d.address_type == create.address_type);
        match reuse {
            Some(index) => {
                let base = recyclable.remove(index);
                plan.updates.push(recycle(&base, create, &ctx));
            }
            None => creates.push(create),
        }
    }
    plan.creates = creates;
    plan.deletes.extend(recyclable);

    sort(&mut plan, namespace);
    plan.without_creates_if_deleting(service)
}

/// `base` rewritten to hold what `create` would have held.
fn recycle(base: &EndpointSlice, create: EndpointSlice, ctx: &SliceContext<'_>) -> EndpointSlice {
    let group = GroupKey {
        family: Family::parse(&create.address_type).unwrap_or(Family::V4),
        ports: port_keys(create.ports.as_ref()),
    };
    rewrite(base, &group, create.endpoints.unwrap_or_default(), ctx)
}

/// Deterministic output: updates and deletes by name, creates by family, ports, first endpoint.
fn sort(plan: &mut SlicePlan, namespace: &str) {
    plan.updates
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.deletes
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.creates.sort_by_cached_key(|s| {
        let first = s
            .endpoints
            .iter()
            .flatten()
            .find_map(|e| endpoint_key(e, namespace))
            .map(str::to_owned);
        (s.address_type.clone(), port_keys(s.ports.as_ref()), first)
    });
    plan.diagnostics.sort();
}
