//! Watch events → the Services to plan again (design.md section 5). Pure functions over the
//! event's objects and the cache.

use std::collections::BTreeSet;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::labels::{is_managed, selects};
use crate::tracker::service_key;
use crate::{Config, ServiceKey, Tracker};

/// A Service add, update or delete concerns that Service.
pub fn for_service(service: &Service) -> ServiceKey {
    ServiceKey::from_service(service)
}

/// The Services a workload event concerns, sorted.
///
/// Add or delete: the Services of its namespace that select it. Update: the Services selecting
/// the old or the new version, but only when something the slices show changed (IP set, ports,
/// readiness, deletionTimestamp, labels; a zone-only label change counts); else none.
pub fn for_workload<'a>(
    old: Option<&ExternalWorkload>,
    new: Option<&ExternalWorkload>,
    services_in_namespace: impl IntoIterator<Item = &'a Service>,
) -> Vec<ServiceKey> {
    if let (Some(old), Some(new)) = (old, new)
        && !slice_relevant_change(old, new)
    {
        return Vec::new();
    }
    let versions: Vec<&ExternalWorkload> = old.into_iter().chain(new).collect();
    let keys: BTreeSet<ServiceKey> = services_in_namespace
        .into_iter()
        .filter(|s| versions.iter().any(|w| selects(s, w)))
        .map(ServiceKey::from_service)
        .collect();
    keys.into_iter().collect()
}

/// The Services a managed slice event concerns: its service-name label, old and new, unless
/// the event is our own write or delete coming back through the watch. A managed slice that
/// someone else deleted gives its Service, so the slice is re-created.
pub fn for_slice(
    old: Option<&EndpointSlice>,
    new: Option<&EndpointSlice>,
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
fn slice_relevant_change(old: &ExternalWorkload, new: &ExternalWorkload) -> bool {
    let ips = |w: &ExternalWorkload| -> BTreeSet<String> {
        w.spec.workload_ips.iter().map(|i| i.ip.clone()).collect()
    };
    old.metadata.labels != new.metadata.labels
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.is_ready() != new.is_ready()
        || old.spec.ports != new.spec.ports
        || ips(old) != ips(new)
        || old.metadata.uid != new.metadata.uid
}
