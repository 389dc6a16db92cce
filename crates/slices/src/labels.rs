//! Selection, slice labels and ownership: the metadata rules of design.md section 4.

use std::collections::BTreeMap;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::Config;

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
/// the namespace on a client-side `{}` would be a surprise, not an intent.
pub(crate) fn active_selector(service: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// Whether `service` selects `workload`: same namespace, an active selector, every selector label
/// present on the workload with an equal value.
pub fn selects(service: &Service, workload: &ExternalWorkload) -> bool {
    let Some(selector) = active_selector(service) else {
        return false;
    };
    if workload.metadata.namespace != service.metadata.namespace {
        return false;
    }
    let labels = workload.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Whether a Service is headless (clusterIP `None`).
pub(crate) fn is_headless(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// The exact label set our slices of `service` carry.
pub(crate) fn slice_labels(service: &Service, config: &Config) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = service
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !RESERVED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(
        SERVICE_NAME_LABEL.to_owned(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.to_owned(), config.managed_by().to_owned());
    if is_headless(service) {
        labels.insert(HEADLESS_LABEL.to_owned(), String::new());
    }
    labels
}

/// The controller owner reference our slices of `service` carry.
pub(crate) fn owner_reference(service: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Service".to_owned(),
        name: service.metadata.name.clone().unwrap_or_default(),
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `slice` is controller-owned by this Service (same UID).
pub(crate) fn is_owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "Service" && r.uid == uid)
}

/// Whether `slice` carries our managed-by label.
pub(crate) fn is_managed(slice: &EndpointSlice, config: &Config) -> bool {
    label(slice, MANAGED_BY_LABEL) == Some(config.managed_by())
}

/// A label of a slice.
pub(crate) fn label<'a>(slice: &'a EndpointSlice, key: &str) -> Option<&'a str> {
    slice.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether `actual` is exactly [`slice_labels`], checked without building it (no-op passes
/// compare every slice's labels; see design.md section 10).
pub(crate) fn labels_match(
    actual: Option<&BTreeMap<String, String>>,
    service: &Service,
    config: &Config,
) -> bool {
    let Some(actual) = actual else {
        return false;
    };
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let headless = is_headless(service);
    let mut expected = 2 + usize::from(headless);
    for (key, value) in service.metadata.labels.iter().flatten() {
        if RESERVED_LABELS.contains(&key.as_str()) {
            continue;
        }
        expected += 1;
        if actual.get(key) != Some(value) {
            return false;
        }
    }
    actual.len() == expected
        && actual.get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
        && actual.get(MANAGED_BY_LABEL).map(String::as_str) == Some(config.managed_by())
        && (!headless || actual.get(HEADLESS_LABEL).map(String::as_str) == Some(""))
}
