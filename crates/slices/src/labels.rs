//! Selection, slice labels and ownership: the metadata rules of docs/slices.md.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::Config;
use crate::model::{CachedService, CachedSlice, CachedWorkload};
use crate::text::{Labels, Token};

/// Label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Label marking slices of a headless Service.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Annotation with the time of the change that caused the write.
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

/// Labels the controller owns on a slice; a Service's own copy of them is never copied.
const RESERVED_LABELS: [&str; 3] = [SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL];

/// The selector of a Service that gets slices from us, or `None`.
///
/// `None` for ExternalName Services and for a missing selector. An empty selector is also `None`:
/// the API server drops an empty map when it stores a Service, and matching every workload of
/// the namespace on a client-side `{}` would be a surprise, not an intent. (The cached form
/// keeps only such a selector; see [`CachedService::new`].)
pub(crate) fn active_selector(service: &CachedService) -> Option<&Labels> {
    service.selector.as_ref()
}

/// Whether `service` selects `workload`: same namespace, an active selector, every selector label
/// present on the workload with an equal value.
pub fn selects(service: &CachedService, workload: &CachedWorkload) -> bool {
    let Some(selector) = active_selector(service) else {
        return false;
    };
    if workload.namespace != service.namespace {
        return false;
    }
    selector
        .iter()
        .all(|(k, v)| workload.labels.get(k) == Some(&**v))
}

/// The exact label set our slices of `service` carry.
pub(crate) fn slice_labels(service: &CachedService, config: &Config) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = service
        .labels
        .iter()
        .filter(|(k, _)| !RESERVED_LABELS.contains(&&***k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), service.name.to_string());
    labels.insert(MANAGED_BY_LABEL.to_owned(), config.managed_by().to_owned());
    if service.headless {
        labels.insert(HEADLESS_LABEL.to_owned(), String::new());
    }
    labels
}

/// The controller owner reference our slices of `service` carry.
pub(crate) fn owner_reference(service: &CachedService) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Service".to_owned(),
        name: service.name.to_string(),
        uid: service
            .uid
            .as_ref()
            .map(Token::to_string)
            .unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `slice` is controller-owned by this Service (same UID).
pub(crate) fn is_owned_by(slice: &CachedSlice, service: &CachedService) -> bool {
    let empty = Token::parse("");
    let uid = service.uid.as_ref().unwrap_or(&empty);
    slice
        .owner_references
        .iter()
        .any(|r| r.controller == Some(true) && &*r.kind == "Service" && r.uid == *uid)
}

/// Whether `slice` carries our managed-by label.
pub(crate) fn is_managed(slice: &CachedSlice, config: &Config) -> bool {
    slice.labels.get(MANAGED_BY_LABEL) == Some(config.managed_by())
}

/// Whether `actual` is exactly [`slice_labels`], checked without building it (no-op passes
/// compare every slice's labels; see docs/benchmarks-journal.md, 2026-12-02, "what made it fast").
pub(crate) fn labels_match(actual: &Labels, service: &CachedService, config: &Config) -> bool {
    let mut expected = 2 + usize::from(service.headless);
    for (key, value) in service.labels.iter() {
        if RESERVED_LABELS.contains(&&**key) {
            continue;
        }
        expected += 1;
        if actual.get(key) != Some(&**value) {
            return false;
        }
    }
    actual.len() == expected
        && actual.get(SERVICE_NAME_LABEL) == Some(&*service.name)
        && actual.get(MANAGED_BY_LABEL) == Some(config.managed_by())
        && (!service.headless || actual.get(HEADLESS_LABEL) == Some(""))
}
