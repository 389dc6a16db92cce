//! Packing endpoints of one group into slices with as few writes as possible (design.md
//! section 4, steps 1 to 3; steps 4 and 5 are in `plan`).

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::desired::{GroupEndpoints, GroupKey, WORKLOAD_KIND, endpoint_ports};
use crate::labels::LAST_CHANGE_TRIGGER_TIME_ANNOTATION;

/// What every slice of the Service shares.
pub(crate) struct SliceContext {
    pub(crate) namespace: String,
    pub(crate) generate_name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) owner: OwnerReference,
    pub(crate) trigger_time: String,
    pub(crate) max: usize,
}

/// The writes for one group.
#[derive(Default)]
pub(crate) struct Packed {
    pub(crate) creates: Vec<EndpointSlice>,
    pub(crate) updates: Vec<EndpointSlice>,
    pub(crate) deletes: Vec<EndpointSlice>,
}

/// An existing slice and the endpoints it will hold.
struct Kept<'a> {
    base: &'a EndpointSlice,
    endpoints: Vec<Endpoint>,
}

/// The workload an endpoint of our slice stands for, if it is one of ours.
pub(crate) fn endpoint_key<'a>(endpoint: &'a Endpoint, namespace: &str) -> Option<&'a str> {
    let target = endpoint.target_ref.as_ref()?;
    if target.kind.as_deref() != Some(WORKLOAD_KIND)
        || target.namespace.as_deref().unwrap_or_default() != namespace
    {
        return None;
    }
    target.name.as_deref()
}

/// Packs `desired` into `existing` (same group, sorted by name) and new slices.
pub(crate) fn pack(
    group: &GroupKey,
    mut desired: GroupEndpoints,
    existing: &[&EndpointSlice],
    ctx: &SliceContext,
) -> Packed {
    let mut packed = Packed::default();
    let mut updated: Vec<Kept<'_>> = Vec::new();
    let mut unchanged: Vec<Kept<'_>> = Vec::new();

    // Step 1: keep what is still desired, in its desired version.
    for slice in existing {
        let mut endpoints = Vec::new();
        for endpoint in slice.endpoints.iter().flatten() {
            let wanted = endpoint_key(endpoint, &ctx.namespace).and_then(|k| desired.remove(k));
            endpoints.extend(wanted);
        }
        // A slice over the maximum (the flag was lowered) gives its excess back.
        for extra in endpoints.split_off(endpoints.len().min(ctx.max)) {
            if let Some(key) = endpoint_key(&extra, &ctx.namespace) {
                desired.insert(key.to_owned(), extra.clone());
            }
        }
        if endpoints.is_empty() {
            packed.deletes.push((*slice).clone());
            continue;
        }
        let endpoints_changed = slice.endpoints.as_deref().unwrap_or_default() != endpoints;
        let labels_changed = slice.metadata.labels.as_ref() != Some(&ctx.labels);
        let kept = Kept {
            base: slice,
            endpoints,
        };
        if endpoints_changed || labels_changed {
            updated.push(kept);
        } else {
            unchanged.push(kept);
        }
    }

    // Step 2: top up slices already being written, fullest first.
    updated.sort_by(|a, b| {
        b.endpoints
            .len()
            .cmp(&a.endpoints.len())
            .then_with(|| a.base.metadata.name.cmp(&b.base.metadata.name))
    });
    for kept in &mut updated {
        while kept.endpoints.len() < ctx.max {
            let Some((_, endpoint)) = desired.pop_first() else {
                break;
            };
            kept.endpoints.push(endpoint);
        }
    }

    // Step 3: the rest go into the unchanged slice that ends closest to full, or new slices.
    if !desired.is_empty() {
        let fits = desired.len() < ctx.max;
        let target = unchanged
            .iter()
            .enumerate()
            .filter(|(_, k)| fits && k.endpoints.len() + desired.len() <= ctx.max)
            .max_by(|(_, a), (_, b)| {
                a.endpoints
                    .len()
                    .cmp(&b.endpoints.len())
                    .then_with(|| b.base.metadata.name.cmp(&a.base.metadata.name))
            })
            .map(|(index, _)| index);
        if let Some(index) = target {
            let mut kept = unchanged.swap_remove(index);
            kept.endpoints
                .extend(std::mem::take(&mut desired).into_values());
            updated.push(kept);
        } else {
            let rest: Vec<Endpoint> = std::mem::take(&mut desired).into_values().collect();
            for chunk in rest.chunks(ctx.max) {
                packed.creates.push(new_slice(group, chunk.to_vec(), ctx));
            }
        }
    }

    packed.updates = updated
        .into_iter()
        .map(|kept| rewrite(kept.base, group, kept.endpoints, ctx))
        .collect();
    packed
}

/// A new slice of `group` holding `endpoints`.
pub(crate) fn new_slice(
    group: &GroupKey,
    endpoints: Vec<Endpoint>,
    ctx: &SliceContext,
) -> EndpointSlice {
    EndpointSlice {
        address_type: group.family.as_str().to_owned(),
        endpoints: Some(endpoints),
        metadata: ObjectMeta {
            generate_name: Some(ctx.generate_name.clone()),
            namespace: Some(ctx.namespace.clone()),
            labels: Some(ctx.labels.clone()),
            annotations: Some(BTreeMap::from([(
                LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_owned(),
                ctx.trigger_time.clone(),
            )])),
            owner_references: Some(vec![ctx.owner.clone()]),
            ..ObjectMeta::default()
        },
        ports: Some(endpoint_ports(&group.ports)),
    }
}

/// `base` (keeping name, resourceVersion and fields others set) rewritten to hold `endpoints`
/// of `group` with the Service's labels.
pub(crate) fn rewrite(
    base: &EndpointSlice,
    group: &GroupKey,
    endpoints: Vec<Endpoint>,
    ctx: &SliceContext,
) -> EndpointSlice {
    let mut slice = base.clone();
    // Left out so the server keeps its own record; echoing it back could only go wrong.
    slice.metadata.managed_fields = None;
    slice.metadata.labels = Some(ctx.labels.clone());
    slice
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_owned(),
            ctx.trigger_time.clone(),
        );
    slice.ports = Some(endpoint_ports(&group.ports));
    slice.endpoints = Some(endpoints);
    slice
}
