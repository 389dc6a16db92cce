//! The Services a watch event affects (docs/slices.md, "Events → Service keys"). Pure
//! functions over the event's objects and the cache.

use std::collections::BTreeSet;

use crate::labels::{is_managed, selects};
use crate::model::{CachedService, CachedSlice, CachedWorkload, WorkloadAddress};
use crate::tracker::service_key;
use crate::{Config, ServiceKey, Tracker};

/// A Service add, update or delete concerns that Service.
pub fn for_service(service: &CachedService) -> ServiceKey {
    ServiceKey::new(&*service.namespace, &*service.name)
}

/// The Services a workload event concerns, sorted.
///
/// Add or delete: the Services of its namespace that select it. Update: the Services selecting
/// the old or the new version, but only when something the slices show changed (IP set, ports,
/// readiness, deletionTimestamp, labels, mesh identity or server name; a zone-only label change
/// counts); else none.
pub fn for_workload<'a>(
    old: Option<&CachedWorkload>,
    new: Option<&CachedWorkload>,
    services_in_namespace: impl IntoIterator<Item = &'a CachedService>,
) -> Vec<ServiceKey> {
    if let (Some(old), Some(new)) = (old, new)
        && !slice_relevant_change(old, new)
    {
        return Vec::new();
    }
    let versions: Vec<&CachedWorkload> = old.into_iter().chain(new).collect();
    let keys: BTreeSet<ServiceKey> = services_in_namespace
        .into_iter()
        .filter(|s| versions.iter().any(|w| selects(s, w)))
        .map(for_service)
        .collect();
    keys.into_iter().collect()
}

/// The Services a managed slice event concerns: its service-name label, old and new, unless
/// the event is our own write or delete coming back through the watch. A managed slice that
/// someone else deleted gives its Service, so the slice is re-created.
pub fn for_slice(
    old: Option<&CachedSlice>,
    new: Option<&CachedSlice>,
    config: &Config,
    tracker: &Tracker,
) -> Vec<ServiceKey> {
    let own = match (old, new) {
        (_, Some(new)) => tracker.is_own_write(new),
        (Some(old), None) => tracker.is_expected_delete(old),
        (None, None) => true,
    };
    if own {
        return Vec::new();
    }
    let keys: BTreeSet<ServiceKey> = old
        .into_iter()
        .chain(new)
        .filter(|s| is_managed(s, config))
        .filter_map(service_key)
        .collect();
    keys.into_iter().collect()
}

/// Whether an update changes anything our slices show (or which Services select it).
fn slice_relevant_change(old: &CachedWorkload, new: &CachedWorkload) -> bool {
    let ips = |w: &CachedWorkload| -> BTreeSet<String> {
        w.addresses
            .iter()
            .map(|a| match a {
                WorkloadAddress::Ip(ip) => ip.to_string(),
                WorkloadAddress::Invalid(text) => text.to_string(),
            })
            .collect()
    };
    old.labels != new.labels
        || old.deleting != new.deleting
        || old.ready != new.ready
        || old.ports != new.ports
        || ips(old) != ips(new)
        || old.uid != new.uid
        // The mesh identity and server name, copied by consumers at slice time: the slices'
        // identity digest covers them (issue 37), and this is their hash.
        || old.mesh_digest() != new.mesh_digest()
}
