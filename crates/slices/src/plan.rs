//! `plan_slices`: every rule of docs/slices.md for one Service.

use std::collections::{BTreeMap, BTreeSet};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::desired::{Family, GroupKey, desired, port_keys};
use crate::digest::{IDENTITY_DIGEST_ANNOTATION, identity_digest};
use crate::labels::{SERVICE_NAME_LABEL, active_selector, is_managed, is_owned_by};
use crate::model::{CachedService, CachedSlice, CachedSlicePort, CachedWorkload};
use crate::pack::{SliceContext, pack, rewrite};
use crate::{Config, Diagnostic};

/// The writes that bring one Service's slices to their desired state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlicePlan {
    /// New slices (with `generateName`, no name).
    pub creates: Vec<EndpointSlice>,
    /// Replacements of existing slices (name and resourceVersion of the existing slice).
    pub updates: Vec<EndpointSlice>,
    /// Slices to delete, as found in the cache (the fields it keeps).
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

    /// The writes in the order to send them: creates, then updates (those that add a workload
    /// to their slice first), then deletes, so that endpoints are never missing between two
    /// calls. The writer must stop before the deletes if a create or update failed.
    pub fn writes(&self) -> impl Iterator<Item = Write<'_>> {
        let creates = self.creates.iter().map(Write::Create);
        let updates = self.updates.iter().map(Write::Update);
        let deletes = self.deletes.iter().map(Write::Delete);
        creates.chain(updates).chain(deletes)
    }

    /// Drops the creates when `service` is being deleted: a slice created now would only wait
    /// for the garbage collector. `plan_slices` already applies this.
    #[must_use]
    pub fn without_creates_if_deleting(mut self, service: &CachedService) -> Self {
        if service.deleting {
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

/// Plans the slices of `service` from API objects: projects them as the controller's cache does
/// and calls [`plan_cached`]. For tests and tools that hold full objects.
pub fn plan_slices(
    service: &Service,
    workloads: &[&ExternalWorkload],
    existing: &[&EndpointSlice],
    config: &Config,
    trigger_time: &Time,
) -> SlicePlan {
    let service = CachedService::from(service);
    let workloads: Vec<CachedWorkload> =
        workloads.iter().map(|w| CachedWorkload::from(*w)).collect();
    let existing: Vec<CachedSlice> = existing.iter().map(|s| CachedSlice::from(*s)).collect();
    let workloads: Vec<&CachedWorkload> = workloads.iter().collect();
    let existing: Vec<&CachedSlice> = existing.iter().collect();
    plan_cached(&service, &workloads, &existing, config, trigger_time)
}

/// Plans the slices of `service`, from the controller's cached forms.
///
/// - `workloads`: the workloads of the Service's namespace (others are ignored; selection is
///   done here).
/// - `existing`: cached slices with our managed-by label and this Service's service-name label
///   (anything else is ignored and never touched).
/// - `trigger_time`: time of the change that caused this pass, written to the
///   `endpoints.kubernetes.io/last-change-trigger-time` annotation of written slices only.
pub fn plan_cached(
    service: &CachedService,
    workloads: &[&CachedWorkload],
    existing: &[&CachedSlice],
    config: &Config,
    trigger_time: &Time,
) -> SlicePlan {
    let service_name = &*service.name;
    let mut ours: Vec<&CachedSlice> = existing
        .iter()
        .copied()
        .filter(|s| is_managed(s, config) && s.labels.get(SERVICE_NAME_LABEL) == Some(service_name))
        .filter(|s| s.namespace == service.namespace)
        .collect();
    ours.sort_by(|a, b| a.name.cmp(&b.name));

    let mut plan = SlicePlan::default();
    if active_selector(service).is_none() {
        // Lost its selector or became ExternalName: our slices go.
        plan.deletes = ours.into_iter().map(CachedSlice::to_slice).collect();
        return plan;
    }

    let desired = desired(service, workloads);
    plan.diagnostics = desired.diagnostics;
    let namespace = &*service.namespace;
    let ctx = SliceContext {
        service,
        config,
        namespace,
        trigger_time,
        max: config.max_endpoints_per_slice(),
    };

    // Sort existing slices into groups; foreign-owned and wrong-family slices go.
    let mut existing_groups: BTreeMap<GroupKey, Vec<&CachedSlice>> = BTreeMap::new();
    let mut recyclable: Vec<&CachedSlice> = Vec::new();
    let mut deletes: Vec<&CachedSlice> = Vec::new();
    for slice in ours {
        if !is_owned_by(slice, service) {
            deletes.push(slice);
            continue;
        }
        match Family::parse(&slice.address_type).filter(|f| desired.families.contains(*f)) {
            Some(family) => existing_groups
                .entry(GroupKey {
                    family,
                    ports: port_keys(&slice.ports),
                })
                .or_default()
                .push(slice),
            None => deletes.push(slice),
        }
    }

    // Owned slices per family, before packing: the placeholder rule below asks whether any survive.
    let owned = |family: Family| -> usize {
        existing_groups
            .iter()
            .filter(|(key, _)| key.family == family)
            .map(|(_, slices)| slices.len())
            .sum()
    };
    let owned = [
        (Family::V4, owned(Family::V4)),
        (Family::V6, owned(Family::V6)),
    ];

    // Steps 1 to 4, group by group; a group no longer desired packs nothing and deletes all.
    for (key, wanted) in &desired.groups {
        let slices = existing_groups.remove(key).unwrap_or_default();
        let packed = pack(key, wanted, &slices, &ctx);
        plan.creates.extend(packed.creates);
        plan.updates.extend(packed.updates);
        recyclable.extend(packed.deletes);
    }
    for slices in existing_groups.into_values() {
        recyclable.extend(slices);
    }

    // Step 5: a create and a delete of the same family become one update of the deleted slice.
    recyclable.sort_by(|a, b| a.name.cmp(&b.name));
    let mut creates = Vec::new();
    for create in std::mem::take(&mut plan.creates) {
        let reuse = recyclable
            .iter()
            .position(|d| *d.address_type == *create.address_type);
        match reuse {
            Some(index) => {
                let base = recyclable.remove(index);
                plan.updates.push(recycle(base, create, &ctx));
            }
            None => creates.push(create),
        }
    }
    plan.creates = creates;

    // Step 4's exception: a family whose every slice would go keeps one, empty (issue 37).
    for (family, owned) in owned {
        let left = recyclable.iter().filter(|s| is_family(s, family)).count();
        if owned == 0 || left < owned {
            // Never created from nothing; or some slice of the family stays anyway.
            continue;
        }
        let index = recyclable
            .iter()
            .position(|s| is_family(s, family) && ctx.is_placeholder(s))
            .or_else(|| recyclable.iter().position(|s| is_family(s, family)));
        if let Some(index) = index {
            let base = recyclable.remove(index);
            if !ctx.is_placeholder(base) {
                plan.updates.push(placeholder(base, family, &ctx));
            }
        }
    }
    deletes.extend(recyclable);
    plan.deletes = deletes.into_iter().map(CachedSlice::to_slice).collect();

    sort(&mut plan);
    // Order matters only between two updates or more; most passes have one.
    if plan.updates.len() > 1 {
        gaining_first(&mut plan.updates, &existing_targets(existing, service));
    }
    plan.without_creates_if_deleting(service)
}

/// The workloads each of the Service's cached slices points at, by slice name.
fn existing_targets<'a>(
    existing: &[&'a CachedSlice],
    service: &CachedService,
) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    existing
        .iter()
        .filter(|slice| slice.namespace == service.namespace)
        .map(|slice| {
            let targets = slice
                .endpoints
                .iter()
                .filter_map(|endpoint| endpoint.target.as_ref()?.name.as_deref())
                .collect();
            (&*slice.name, targets)
        })
        .collect()
}

/// Orders a pass's updates so that a workload moving from one slice to another is in both for a
/// moment, never in neither (a consumer never sees it removed and added back): the updates that
/// drop a workload another update of the pass adds go last, and among the rest those that add a
/// workload to their slice go first; each part keeps its order. With the writer stopping at the
/// first failed write, a move whose adding update fails never sends the update that drops it.
fn gaining_first(updates: &mut [EndpointSlice], before: &BTreeMap<&str, BTreeSet<&str>>) {
    let targets = |update: &EndpointSlice| -> BTreeSet<String> {
        update
            .endpoints
            .iter()
            .flatten()
            .filter_map(|endpoint| endpoint.target_ref.as_ref()?.name.clone())
            .collect()
    };
    let had = |update: &EndpointSlice| -> BTreeSet<String> {
        update
            .metadata
            .name
            .as_deref()
            .and_then(|name| before.get(name))
            .map(|had| had.iter().map(|name| (*name).to_string()).collect())
            .unwrap_or_default()
    };
    let gained: BTreeSet<String> = updates
        .iter()
        .flat_map(|update| {
            let had = had(update);
            targets(update)
                .into_iter()
                .filter(move |name| !had.contains(name))
        })
        .collect();
    updates.sort_by_cached_key(|update| {
        let (had, now) = (had(update), targets(update));
        let drops_moved = had
            .iter()
            .any(|name| !now.contains(name) && gained.contains(name));
        let gains = now.iter().any(|name| !had.contains(name));
        // A stable sort: `false` before `true`.
        (drops_moved, !gains)
    });
}

/// `base` rewritten to hold what `create` would have held.
fn recycle(base: &CachedSlice, create: EndpointSlice, ctx: &SliceContext<'_>) -> EndpointSlice {
    let group = GroupKey {
        family: Family::parse(&create.address_type).unwrap_or(Family::V4),
        ports: written_port_keys(&create),
    };
    let digest = create
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(IDENTITY_DIGEST_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| identity_digest([]));
    rewrite(
        base,
        &group,
        create.endpoints.unwrap_or_default(),
        digest,
        ctx,
    )
}

/// `base` rewritten as the placeholder of `family`: no endpoints, no ports (as upstream's
/// placeholder), the digest of no endpoints.
fn placeholder(base: &CachedSlice, family: Family, ctx: &SliceContext<'_>) -> EndpointSlice {
    let group = GroupKey {
        family,
        ports: Vec::new(),
    };
    rewrite(base, &group, Vec::new(), identity_digest([]), ctx)
}

/// Whether `slice` holds addresses of `family`.
fn is_family(slice: &CachedSlice, family: Family) -> bool {
    Family::parse(&slice.address_type) == Some(family)
}

/// Deterministic output: updates and deletes by name, creates by family, ports, first endpoint.
fn sort(plan: &mut SlicePlan) {
    plan.updates
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.deletes
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.creates.sort_by_cached_key(|s| {
        // Created endpoints all target workloads of the Service's namespace.
        let first = s
            .endpoints
            .iter()
            .flatten()
            .find_map(|e| e.target_ref.as_ref()?.name.clone());
        (s.address_type.clone(), written_port_keys(s), first)
    });
    plan.diagnostics.sort();
}

/// The port keys of a slice the planner built.
fn written_port_keys(slice: &EndpointSlice) -> Vec<crate::desired::PortKey> {
    let ports: Vec<CachedSlicePort> = slice
        .ports
        .iter()
        .flatten()
        .map(|p| CachedSlicePort {
            name: p.name.as_deref().map(Into::into),
            port: p.port,
            protocol: p.protocol.as_deref().map(Into::into),
            app_protocol: None,
        })
        .collect();
    port_keys(&ports)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::Endpoint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn update(name: &str, targets: &[&str]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            endpoints: Some(
                targets
                    .iter()
                    .map(|target| Endpoint {
                        target_ref: Some(ObjectReference {
                            name: Some(target.to_string()),
                            ..ObjectReference::default()
                        }),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
            ..EndpointSlice::default()
        }
    }

    fn names(updates: &[EndpointSlice]) -> Vec<&str> {
        updates
            .iter()
            .filter_map(|u| u.metadata.name.as_deref())
            .collect()
    }

    #[test]
    fn updates_that_add_a_workload_go_before_those_that_only_drop_or_change() {
        // (slices before: name → workloads, updates as planned by name, expected order)
        type Case<'a> = (
            &'a [(&'a str, &'a [&'a str])],
            &'a [(&'a str, &'a [&'a str])],
            &'a [&'a str],
        );
        let cases: &[Case] = &[
            // vm-2 moves from a to b: b (gains it) first, then a (drops it).
            (
                &[("a", &["vm-1", "vm-2"]), ("b", &["vm-3"])],
                &[("a", &["vm-1"]), ("b", &["vm-3", "vm-2"])],
                &["b", "a"],
            ),
            // Nothing gained: name order kept.
            (
                &[("a", &["vm-1", "vm-2"]), ("b", &["vm-3"])],
                &[("a", &["vm-1"]), ("b", &["vm-3"])],
                &["a", "b"],
            ),
            // Both gain: name order kept.
            (
                &[("a", &["vm-1"]), ("b", &["vm-3"])],
                &[("a", &["vm-1", "vm-4"]), ("b", &["vm-3", "vm-5"])],
                &["a", "b"],
            ),
            // A slice the map does not know counts as gaining every workload it holds.
            (
                &[("b", &["vm-3"])],
                &[("b", &["vm-3"]), ("c", &["vm-9"])],
                &["c", "b"],
            ),
            // A slice that gains one workload and drops another that moves elsewhere goes after
            // the slice that takes the moved one: vm-2 moves from a to b while a gains vm-4.
            (
                &[("a", &["vm-1", "vm-2"]), ("b", &["vm-3"])],
                &[("a", &["vm-1", "vm-4"]), ("b", &["vm-3", "vm-2"])],
                &["b", "a"],
            ),
            // Three: the two that gain keep their order ahead of the one that drops.
            (
                &[("a", &["vm-1"]), ("b", &["vm-2"]), ("c", &["vm-3"])],
                &[
                    ("a", &[]),
                    ("b", &["vm-2", "vm-1"]),
                    ("c", &["vm-3", "vm-7"]),
                ],
                &["b", "c", "a"],
            ),
        ];
        for (before, planned, expected) in cases {
            let before: BTreeMap<&str, BTreeSet<&str>> = before
                .iter()
                .map(|(name, targets)| (*name, targets.iter().copied().collect()))
                .collect();
            let mut updates: Vec<EndpointSlice> = planned
                .iter()
                .map(|(name, targets)| update(name, targets))
                .collect();
            gaining_first(&mut updates, &before);
            assert_eq!(names(&updates), *expected, "before {before:?}");
        }
    }
}
