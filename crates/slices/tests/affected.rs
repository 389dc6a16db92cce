//! Watch events → the Services they affect (docs/slices.md, "Events → Service keys"), one named
//! case per rule.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::affected::{for_service, for_slice, for_workload};
use slices::testing::{self, SliceStore, Svc, Workload, time};
use slices::{
    CachedService, CachedSlice, CachedWorkload, Config, DEFAULT_NAME_PREFIX, SERVICE_NAME_LABEL,
    ServiceKey, Tracker, plan_slices,
};

/// The Services of the cases, in the cached form the handlers pass.
fn services() -> Vec<CachedService> {
    let services: Vec<Service> = vec![
        Svc::named("web").selector("app", "web").build(),
        Svc::named("api").selector("app", "api").build(),
        Svc::named("all-web").selector("tier", "front").build(),
        Svc::named("elsewhere")
            .namespace("other")
            .selector("app", "web")
            .build(),
        Svc::named("no-selector").build(),
    ];
    services.iter().map(CachedService::from).collect()
}

fn workload(workload: &ExternalWorkload) -> CachedWorkload {
    CachedWorkload::from(workload)
}

/// `for_slice` on slices in the cached form the handlers pass.
fn slice_keys(
    old: Option<&EndpointSlice>,
    new: Option<&EndpointSlice>,
    config: &Config,
    tracker: &Tracker,
) -> Vec<ServiceKey> {
    let old = old.map(CachedSlice::from);
    let new = new.map(CachedSlice::from);
    for_slice(old.as_ref(), new.as_ref(), config, tracker)
}

/// The workload most cases start from: [`testing::vm`] `vm-1`, also labelled `tier=front`.
fn vm() -> Workload {
    testing::vm("vm-1", "10.0.0.1").label("tier", "front")
}

fn keys(names: &[&str]) -> Vec<ServiceKey> {
    let mut keys: Vec<_> = names
        .iter()
        .map(|n| ServiceKey::new("default", *n))
        .collect();
    keys.sort();
    keys
}

fn on_update(old: Workload, new: Workload) -> Vec<ServiceKey> {
    let (old, new): (ExternalWorkload, ExternalWorkload) = (old.build(), new.build());
    for_workload(Some(&workload(&old)), Some(&workload(&new)), &services())
}

#[test]
fn service_event_gives_that_service() {
    assert_eq!(
        for_service(&CachedService::from(
            &Svc::named("web").namespace("shop").build()
        )),
        ServiceKey::new("shop", "web")
    );
    assert_eq!(ServiceKey::new("shop", "web").to_string(), "shop/web");
}

#[test]
fn service_update_changing_only_traffic_distribution_gives_that_service() {
    // Every Service update names its Service; the projection must see the change too, or the
    // reconcile would plan from the old value.
    let old = CachedService::from(&Svc::named("web").selector("app", "web").build());
    let new = CachedService::from(
        &Svc::named("web")
            .selector("app", "web")
            .traffic_distribution("PreferSameZone")
            .build(),
    );
    assert_ne!(old, new, "the cached Service keeps trafficDistribution");
    assert_eq!(for_service(&new), ServiceKey::new("default", "web"));
    let annotated = CachedService::from(
        &Svc::named("web")
            .selector("app", "web")
            .traffic_distribution("PreferSameZone")
            .annotation(slices::TOPOLOGY_MODE_ANNOTATION, "Auto")
            .build(),
    );
    assert_ne!(new, annotated, "the topology-mode annotation is seen");
}

#[test]
fn workload_add_or_delete_gives_the_selecting_services_of_its_namespace() {
    let w = workload(&vm().build());
    assert_eq!(
        for_workload(None, Some(&w), &services()),
        keys(&["all-web", "web"])
    );
    assert_eq!(
        for_workload(Some(&w), None, &services()),
        keys(&["all-web", "web"])
    );
}

#[test]
fn workload_update_table() {
    let cases: Vec<(&str, Workload, Workload, Vec<ServiceKey>)> = vec![
        (
            "label_change_gives_services_of_old_and_new_labels",
            vm(),
            vm().label("app", "api"),
            keys(&["all-web", "api", "web"]),
        ),
        (
            "ip_set_change",
            vm(),
            vm().ip("fd00::1"),
            keys(&["all-web", "web"]),
        ),
        (
            "port_change",
            vm(),
            vm().port("admin", 9000),
            keys(&["all-web", "web"]),
        ),
        (
            "readiness_change",
            vm(),
            vm().not_ready(),
            keys(&["all-web", "web"]),
        ),
        (
            "deletion_timestamp_change",
            vm(),
            vm().terminating(),
            keys(&["all-web", "web"]),
        ),
        (
            "zone_only_label_change_counts",
            vm(),
            vm().zone("z1"),
            keys(&["all-web", "web"]),
        ),
        (
            "zone_moved_to_another_zone_counts",
            vm().zone("z1"),
            vm().zone("z2"),
            keys(&["all-web", "web"]),
        ),
        (
            "same_ips_in_another_order_is_no_change",
            vm().ip("fd00::1"),
            Workload::named("vm-1")
                .label("app", "web")
                .label("tier", "front")
                .ip("fd00::1")
                .ip("10.0.0.1")
                .port("http", 8080)
                .ready(),
            vec![],
        ),
        (
            "nothing_slices_show_changed_gives_nothing",
            vm(),
            vm(),
            vec![],
        ),
    ];
    let mut failures = Vec::new();
    for (rule, old, new, expected) in cases {
        let got = on_update(old, new);
        if got != expected {
            failures.push(format!("{rule}: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn workload_update_of_mesh_identity_or_server_name_gives_the_selecting_services() {
    // Consumers copy both at slice time; the slices' identity digest covers them (issue 37).
    let old = vm().build();
    let mut identity = old.clone();
    identity.spec.mesh_tls.identity = "other".into();
    identity.metadata.resource_version = Some("2".into());
    let mut server_name = old.clone();
    server_name.spec.mesh_tls.server_name = "other".into();
    server_name.metadata.resource_version = Some("2".into());
    for new in [identity, server_name] {
        assert_eq!(
            for_workload(Some(&workload(&old)), Some(&workload(&new)), &services()),
            keys(&["all-web", "web"]),
            "{:?}",
            new.spec.mesh_tls
        );
    }
}

#[test]
fn workload_update_of_resource_version_only_gives_nothing() {
    let old = vm().build();
    let mut new = old.clone();
    new.metadata.resource_version = Some("2".into());
    assert!(for_workload(Some(&workload(&old)), Some(&workload(&new)), &services()).is_empty());
}

fn managed_slice() -> EndpointSlice {
    let service = Svc::named("web").selector("app", "web").build();
    let workload = vm().build();
    let plan = plan_slices(&service, &[&workload], &[], &Config::default(), &time(1));
    SliceStore::default().write(slices::Write::Create(&plan.creates[0]))
}

#[test]
fn managed_slice_event_gives_the_service_in_its_label() {
    let slice = managed_slice();
    let tracker = Tracker::new();
    let config = Config::default();
    assert_eq!(
        slice_keys(None, Some(&slice), &config, &tracker),
        keys(&["web"])
    );
    assert_eq!(
        slice_keys(Some(&slice), Some(&slice), &config, &tracker),
        keys(&["web"])
    );
}

#[test]
fn managed_slice_whose_service_label_changed_gives_old_and_new_services() {
    let old = managed_slice();
    let mut new = old.clone();
    new.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.into(), "api".into());
    assert_eq!(
        slice_keys(Some(&old), Some(&new), &Config::default(), &Tracker::new()),
        keys(&["api", "web"])
    );
}

#[test]
fn slice_managed_by_someone_else_gives_nothing() {
    let slice = managed_slice();
    let other = Config::new(100, "endpointslice-controller.k8s.io", DEFAULT_NAME_PREFIX).unwrap();
    assert!(slice_keys(None, Some(&slice), &other, &Tracker::new()).is_empty());
}

#[test]
fn our_own_write_seen_through_the_watch_gives_nothing() {
    let slice = managed_slice();
    let mut tracker = Tracker::new();
    tracker.record_write(&ServiceKey::new("default", "web"), &slice);
    assert!(slice_keys(None, Some(&slice), &Config::default(), &tracker).is_empty());
}

#[test]
fn our_own_delete_seen_through_the_watch_gives_nothing() {
    let slice = managed_slice();
    let mut tracker = Tracker::new();
    tracker.record_delete(&ServiceKey::new("default", "web"), &slice);
    assert!(slice_keys(Some(&slice), None, &Config::default(), &tracker).is_empty());
}

#[test]
fn managed_slice_deleted_by_someone_else_gives_its_service_even_if_this_term_never_wrote_it() {
    let slice = managed_slice();
    assert_eq!(
        slice_keys(Some(&slice), None, &Config::default(), &Tracker::new()),
        keys(&["web"])
    );
}
