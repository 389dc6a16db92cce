//! Packing endpoints of one group into slices with as few writes as possible (docs/slices.md,
//! "Packing", steps 1 to 3; steps 4 and 5 are in `plan`).

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::Config;
use crate::desired::{GroupKey, WORKLOAD_KIND, Wanted, endpoint_ports, port_keys};
use crate::digest::{IDENTITY_DIGEST_ANNOTATION, identity_digest};
use crate::labels::{
    LAST_CHANGE_TRIGGER_TIME_ANNOTATION, labels_match, owner_reference, slice_labels,
};
use crate::model::{CachedEndpoint, CachedService, CachedSlice};

/// What every slice of the Service shares. Values are built only for slices being written, so
/// a no-op pass allocates little.
pub(crate) struct SliceContext<'a> {
    pub(crate) service: &'a CachedService,
    pub(crate) config: &'a Config,
    pub(crate) namespace: &'a str,
    pub(crate) trigger_time: &'a Time,
    pub(crate) max: usize,
}

/// The writes for one group.
pub(crate) struct Packed<'s> {
    pub(crate) creates: Vec<EndpointSlice>,
    pub(crate) updates: Vec<EndpointSlice>,
    pub(crate) deletes: Vec<&'s CachedSlice>,
}

/// An existing slice and the desired endpoints (indices into the group) it will hold.
struct Kept<'s> {
    base: &'s CachedSlice,
    endpoints: Vec<usize>,
}

// === impl SliceContext ===

impl SliceContext<'_> {
    fn labels_match(&self, slice: &CachedSlice) -> bool {
        labels_match(&slice.labels, self.service, self.config)
    }

    /// Whether `slice` is exactly the placeholder of its family: no endpoints, no ports, our
    /// labels, the digest of no endpoints (docs/slices.md, "Packing", step 4).
    pub(crate) fn is_placeholder(&self, slice: &CachedSlice) -> bool {
        slice.endpoints.is_empty()
            && slice.ports.is_empty()
            && self.labels_match(slice)
            && slice.annotations.get(IDENTITY_DIGEST_ANNOTATION)
                == Some(identity_digest([]).as_str())
    }

    fn trigger_annotation(&self) -> (String, String) {
        (
            LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_owned(),
            self.trigger_time.0.to_string(),
        )
    }
}

/// The workload an endpoint of our slice stands for, if it is one of ours.
pub(crate) fn endpoint_key<'e>(endpoint: &'e CachedEndpoint, namespace: &str) -> Option<&'e str> {
    let target = endpoint.target.as_ref()?;
    if target.kind.as_deref() != Some(WORKLOAD_KIND)
        || target.namespace.as_deref().unwrap_or_default() != namespace
    {
        return None;
    }
    target.name.as_deref()
}

/// Packs `wanted` (sorted by workload name) into `existing` (same group, sorted by name) and
/// new slices.
pub(crate) fn pack<'s>(
    group: &GroupKey,
    wanted: &[Wanted<'_>],
    existing: &[&'s CachedSlice],
    ctx: &SliceContext<'_>,
) -> Packed<'s> {
    let mut packed = Packed {
        creates: Vec::new(),
        updates: Vec::new(),
        deletes: Vec::new(),
    };
    let mut taken = vec![false; wanted.len()];
    let mut updated: Vec<Kept<'_>> = Vec::new();
    let mut unchanged: Vec<Kept<'_>> = Vec::new();

    // Step 1: keep what is still desired, in its desired version. Slices we wrote list their
    // endpoints in name order, so the next wanted endpoint is tried before a binary search.
    let mut hint = 0;
    let find = |key: &str, hint: usize| match wanted.get(hint) {
        Some(w) if w.name == key => Some(hint),
        _ => wanted.binary_search_by(|w| w.name.cmp(key)).ok(),
    };
    for slice in existing {
        let current: &[CachedEndpoint] = &slice.endpoints;
        let mut kept = Vec::with_capacity(current.len());
        let mut changed = false;
        for endpoint in current {
            let index = endpoint_key(endpoint, ctx.namespace)
                .and_then(|key| find(key, hint))
                .filter(|&i| !taken[i]);
            match index {
                Some(i) => {
                    taken[i] = true;
                    hint = i + 1;
                    changed |= !wanted[i].matches(endpoint);
                    kept.push(i);
                }
                // Gone, a duplicate, or not ours: it leaves the slice.
                None => changed = true,
            }
        }
        // A slice over the maximum (the flag was lowered) gives its excess back.
        if kept.len() > ctx.max {
            for i in kept.drain(ctx.max..) {
                taken[i] = false;
            }
            changed = true;
        }
        if kept.is_empty() {
            packed.deletes.push(slice);
            continue;
        }
        let kept = Kept {
            base: slice,
            endpoints: kept,
        };
        if changed || !ctx.labels_match(slice) || !digest_matches(slice, wanted, &kept.endpoints) {
            updated.push(kept);
        } else {
            unchanged.push(kept);
        }
    }
    let mut remaining: VecDeque<usize> = (0..wanted.len()).filter(|&i| !taken[i]).collect();

    // Step 2: top up slices already being written, fullest first.
    updated.sort_by(|a, b| {
        b.endpoints
            .len()
            .cmp(&a.endpoints.len())
            .then_with(|| a.base.name.cmp(&b.base.name))
    });
    for kept in &mut updated {
        while kept.endpoints.len() < ctx.max {
            let Some(i) = remaining.pop_front() else {
                break;
            };
            kept.endpoints.push(i);
        }
    }

    // Step 3: the rest go into the unchanged slice that ends closest to full, or new slices.
    if !remaining.is_empty() {
        let fits = remaining.len() < ctx.max;
        let target = unchanged
            .iter()
            .enumerate()
            .filter(|(_, k)| fits && k.endpoints.len() + remaining.len() <= ctx.max)
            .max_by(|(_, a), (_, b)| {
                a.endpoints
                    .len()
                    .cmp(&b.endpoints.len())
                    .then_with(|| b.base.name.cmp(&a.base.name))
            })
            .map(|(index, _)| index);
        if let Some(index) = target {
            let mut kept = unchanged.swap_remove(index);
            kept.endpoints.extend(remaining.drain(..));
            updated.push(kept);
        } else {
            let rest: Vec<usize> = remaining.drain(..).collect();
            for chunk in rest.chunks(ctx.max) {
                let endpoints = chunk.iter().map(|&i| wanted[i].to_endpoint()).collect();
                let digest = digest_of(wanted, chunk);
                packed
                    .creates
                    .push(new_slice(group, endpoints, digest, ctx));
            }
        }
    }

    packed.updates = updated
        .into_iter()
        .map(|kept| {
            let endpoints = kept
                .endpoints
                .iter()
                .map(|&i| wanted[i].to_endpoint())
                .collect();
            let digest = digest_of(wanted, &kept.endpoints);
            rewrite(kept.base, group, endpoints, digest, ctx)
        })
        .collect();
    packed
}

/// The identity digest of the wanted endpoints at `indices` (in any order).
pub(crate) fn digest_of(wanted: &[Wanted<'_>], indices: &[usize]) -> String {
    // `wanted` is in name order, so index order is name order; slices we wrote are usually
    // already in it, and then nothing is allocated.
    if indices.is_sorted() {
        return identity_digest(indices.iter().map(|&i| wanted[i].mesh_digest()));
    }
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    identity_digest(sorted.iter().map(|&i| wanted[i].mesh_digest()))
}

/// Whether `slice` carries the identity digest of the wanted endpoints at `indices`.
fn digest_matches(slice: &CachedSlice, wanted: &[Wanted<'_>], indices: &[usize]) -> bool {
    slice.annotations.get(IDENTITY_DIGEST_ANNOTATION) == Some(digest_of(wanted, indices).as_str())
}

/// A new slice of `group` holding `endpoints`, whose identity digest is `digest`.
pub(crate) fn new_slice(
    group: &GroupKey,
    endpoints: Vec<Endpoint>,
    digest: String,
    ctx: &SliceContext<'_>,
) -> EndpointSlice {
    let service_name = &*ctx.service.name;
    EndpointSlice {
        address_type: group.family.as_str().to_owned(),
        endpoints: Some(endpoints),
        metadata: ObjectMeta {
            generate_name: Some(format!("{}{service_name}-", ctx.config.name_prefix())),
            namespace: Some(ctx.namespace.to_owned()),
            labels: Some(slice_labels(ctx.service, ctx.config)),
            annotations: Some(BTreeMap::from([
                ctx.trigger_annotation(),
                (IDENTITY_DIGEST_ANNOTATION.to_owned(), digest),
            ])),
            owner_references: Some(vec![owner_reference(ctx.service)]),
            ..ObjectMeta::default()
        },
        ports: Some(endpoint_ports(&group.ports)),
    }
}

/// `base` (keeping name, resourceVersion and fields others set) rewritten to hold `endpoints`
/// of `group`, whose identity digest is `digest`, with the Service's labels.
pub(crate) fn rewrite(
    base: &CachedSlice,
    group: &GroupKey,
    endpoints: Vec<Endpoint>,
    digest: String,
    ctx: &SliceContext<'_>,
) -> EndpointSlice {
    // Only the metadata is built: the old endpoints are replaced. managedFields are not cached,
    // so the server keeps its own record.
    let mut metadata = base.metadata();
    metadata.labels = Some(slice_labels(ctx.service, ctx.config));
    let (key, value) = ctx.trigger_annotation();
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(key, value);
    annotations.insert(IDENTITY_DIGEST_ANNOTATION.to_owned(), digest);
    EndpointSlice {
        address_type: base.address_type.to_string(),
        endpoints: Some(endpoints),
        metadata,
        ports: kept_ports(base, group),
    }
}

/// The ports an update of `base` writes: the slice's own list, in its own order, when it is
/// already the group's (as a set, and with nothing we never write, like `appProtocol`); else the
/// group's. A rewrite made for another reason (an identity digest added to a slice Linkerd wrote
/// in the Service's port order, say) then changes nothing a reader of the ports sees; a slice
/// without ports keeps having none (absent, not an empty list, as the API server returns it).
fn kept_ports(base: &CachedSlice, group: &GroupKey) -> Option<Vec<EndpointPort>> {
    let own = base.ports.iter().all(|p| p.app_protocol.is_none())
        && port_keys(&base.ports) == group.ports;
    if !own {
        return Some(endpoint_ports(&group.ports));
    }
    if base.ports.is_empty() {
        return None;
    }
    let ports = base
        .ports
        .iter()
        .map(|p| EndpointPort {
            name: p.name.as_ref().map(|n| n.to_string()),
            port: p.port,
            protocol: p.protocol.as_ref().map(|n| n.to_string()),
            app_protocol: None,
        })
        .collect();
    Some(ports)
}
