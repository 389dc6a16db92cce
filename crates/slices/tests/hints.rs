//! One named case per topology-hint rule of docs/slices.md ("Topology hints"): which
//! `trafficDistribution` values hint which endpoints, and that changing or removing the field,
//! or a workload's zone or readiness, rewrites the hints with nothing stale left behind.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use common::{Case, converge, plan, run};
use k8s_openapi::api::discovery::v1::{EndpointHints, EndpointSlice, ForNode, ForZone};
use slices::testing::{SliceStore, Svc, vm, web};
use slices::{
    CachedService, CachedSlice, Config, DEPRECATED_TOPOLOGY_HINTS_ANNOTATION, SlicePlan,
    TOPOLOGY_MODE_ANNOTATION, TrafficDistribution,
};

/// (workload, zone, hinted zones, hinted nodes) of every endpoint, in slice order.
type Hinted = (String, Option<String>, Vec<String>, Vec<String>);

fn hints(slices: &[EndpointSlice]) -> Vec<Hinted> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .map(|e| {
            let hints = e.hints.clone().unwrap_or_default();
            (
                e.target_ref.as_ref().and_then(|t| t.name.clone()).unwrap(),
                e.zone.clone(),
                hints
                    .for_zones
                    .iter()
                    .flatten()
                    .map(|z| z.name.clone())
                    .collect(),
                hints
                    .for_nodes
                    .iter()
                    .flatten()
                    .map(|n| n.name.clone())
                    .collect(),
            )
        })
        .collect()
}

fn hinted(name: &str, zone: Option<&str>, zones: &[&str]) -> Hinted {
    (
        name.to_owned(),
        zone.map(str::to_owned),
        zones.iter().map(|z| (*z).to_owned()).collect(),
        Vec::new(),
    )
}

/// [`two_zones`]' endpoints, each hinted for its own zone.
fn each_in_its_own_zone() -> Vec<Hinted> {
    vec![
        hinted("vm-a", Some("zone-a"), &["zone-a"]),
        hinted("vm-b", Some("zone-b"), &["zone-b"]),
    ]
}

/// [`two_zones`]' endpoints, in their zones but hinted for none.
fn neither_hinted() -> Vec<Hinted> {
    vec![
        hinted("vm-a", Some("zone-a"), &[]),
        hinted("vm-b", Some("zone-b"), &[]),
    ]
}

/// Every endpoint of the plan's writes, hinted for what it should be; `hints: null` when none.
fn ensure_hints(written: &[EndpointSlice], expected: &[Hinted]) -> Result<(), String> {
    let actual = hints(written);
    if actual != expected {
        return Err(format!("hints {actual:?}, expected {expected:?}"));
    }
    // No hint object at all rather than an empty one: that is what upstream writes.
    let empty = written
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .any(|e| e.hints.as_ref().is_some_and(|h| h.for_zones.is_none()));
    ensure!(!empty, "an endpoint carries a hints object without zones");
    Ok(())
}

fn two_zones() -> Vec<api::v1beta1::ExternalWorkload> {
    vec![
        vm("vm-a", "10.0.0.1").zone("zone-a").build(),
        vm("vm-b", "10.0.0.2").zone("zone-b").build(),
    ]
}

/// `web` with `trafficDistribution: PreferSameZone`.
fn zoned() -> Svc {
    web().traffic_distribution("PreferSameZone")
}

/// The case `rule`: [`two_zones`] planned from scratch under `service`, each endpoint hinted
/// for its own zone.
fn each_hinted_for_its_zone(rule: &'static str, service: Svc) -> Case {
    Case::new(rule, service, two_zones(), |p, _| {
        ensure_hints(&p.creates, &each_in_its_own_zone())
    })
}

/// The case `rule`: [`two_zones`] planned from scratch under `service`, no endpoint hinted.
fn none_hinted(rule: &'static str, service: Svc) -> Case {
    Case::new(rule, service, two_zones(), |p, _| {
        ensure_hints(&p.creates, &neither_hinted())
    })
}

/// Every slice that existed is updated in place: no create, no delete, one update each.
fn ensure_updated_in_place(p: &SlicePlan, existing: &[&EndpointSlice]) -> Result<(), String> {
    ensure!(
        p.creates.is_empty() && p.deletes.is_empty() && p.updates.len() == existing.len(),
        "every slice updated in place"
    );
    Ok(())
}

/// A foreign hint object for the zone `zone` alone.
fn zone_hint(zone: &str) -> EndpointHints {
    EndpointHints {
        for_zones: Some(vec![ForZone {
            name: zone.to_owned(),
        }]),
        for_nodes: None,
    }
}

#[test]
fn which_endpoints_are_hinted() {
    run(vec![
        each_hinted_for_its_zone(
            "prefer_same_zone_hints_each_ready_endpoint_for_its_own_zone",
            zoned(),
        ),
        each_hinted_for_its_zone(
            "prefer_close_hints_like_prefer_same_zone",
            web().traffic_distribution("PreferClose"),
        ),
        each_hinted_for_its_zone(
            "prefer_same_node_hints_zones_only_as_external_workloads_have_no_node",
            web().traffic_distribution("PreferSameNode"),
        ),
        none_hinted(
            "service_without_traffic_distribution_writes_no_hints",
            web(),
        ),
        none_hinted(
            "unknown_traffic_distribution_value_writes_no_hints",
            web().traffic_distribution("PreferSameGalaxy"),
        ),
        Case::new(
            "endpoint_without_zone_gets_no_hint_and_the_others_in_its_slice_keep_theirs",
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").zone("zone-a").build(),
                vm("vm-nowhere", "10.0.0.3").build(),
            ],
            |p, _| {
                ensure!(p.creates.len() == 1, "one slice holds both");
                ensure_hints(
                    &p.creates,
                    &[
                        hinted("vm-a", Some("zone-a"), &["zone-a"]),
                        hinted("vm-nowhere", None, &[]),
                    ],
                )
            },
        ),
        Case::new(
            "not_ready_and_terminating_endpoints_get_no_hint",
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").zone("zone-a").build(),
                vm("vm-down", "10.0.0.2").zone("zone-a").not_ready().build(),
                vm("vm-going", "10.0.0.3")
                    .zone("zone-b")
                    .terminating()
                    .build(),
            ],
            |p, _| {
                ensure_hints(
                    &p.creates,
                    &[
                        hinted("vm-a", Some("zone-a"), &["zone-a"]),
                        hinted("vm-down", Some("zone-a"), &[]),
                        hinted("vm-going", Some("zone-b"), &[]),
                    ],
                )
            },
        ),
        Case::new(
            "publish_not_ready_addresses_hints_every_endpoint_as_it_is_ready",
            zoned().publish_not_ready(),
            vec![vm("vm-down", "10.0.0.2").zone("zone-a").not_ready().build()],
            |p, _| {
                ensure_hints(
                    &p.creates,
                    &[hinted("vm-down", Some("zone-a"), &["zone-a"])],
                )
            },
        ),
        none_hinted(
            "topology_mode_auto_annotation_overrides_traffic_distribution",
            zoned().annotation(TOPOLOGY_MODE_ANNOTATION, "Auto"),
        ),
        none_hinted(
            "deprecated_topology_aware_hints_annotation_overrides_traffic_distribution",
            zoned().annotation(DEPRECATED_TOPOLOGY_HINTS_ANNOTATION, "auto"),
        ),
        each_hinted_for_its_zone(
            "topology_mode_other_than_auto_leaves_traffic_distribution_in_charge",
            zoned().annotation(TOPOLOGY_MODE_ANNOTATION, "Disabled"),
        ),
    ]);
}

#[test]
fn hint_changes_rewrite_the_slices_they_touch() {
    run(vec![
        Case::new(
            "setting_traffic_distribution_updates_existing_slices_in_place",
            zoned(),
            two_zones(),
            |p, existing| {
                ensure_updated_in_place(p, existing)?;
                ensure_hints(&p.updates, &each_in_its_own_zone())
            },
        )
        .after(web(), two_zones()),
        Case::new(
            "removing_traffic_distribution_removes_every_hint",
            web(),
            two_zones(),
            |p, existing| {
                ensure_updated_in_place(p, existing)?;
                ensure_hints(&p.updates, &neither_hinted())
            },
        )
        .after(zoned(), two_zones()),
        Case::new(
            "renaming_prefer_close_to_prefer_same_zone_writes_nothing",
            zoned(),
            two_zones(),
            |p, _| {
                ensure!(p.is_empty(), "same hints, no write");
                Ok(())
            },
        )
        .after(web().traffic_distribution("PreferClose"), two_zones()),
        Case::new(
            "a_workload_moving_zone_takes_its_hint_along",
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").zone("zone-c").build(),
                vm("vm-b", "10.0.0.2").zone("zone-b").build(),
            ],
            |p, _| {
                ensure!(p.creates.is_empty() && p.updates.len() == 1, "one update");
                ensure_hints(
                    &p.updates,
                    &[
                        hinted("vm-a", Some("zone-c"), &["zone-c"]),
                        hinted("vm-b", Some("zone-b"), &["zone-b"]),
                    ],
                )
            },
        )
        .after(zoned(), two_zones()),
        Case::new(
            "a_workload_losing_its_zone_loses_its_hint",
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").build(),
                vm("vm-b", "10.0.0.2").zone("zone-b").build(),
            ],
            |p, _| {
                ensure_hints(
                    &p.updates,
                    &[
                        hinted("vm-a", None, &[]),
                        hinted("vm-b", Some("zone-b"), &["zone-b"]),
                    ],
                )
            },
        )
        .after(zoned(), two_zones()),
        Case::new(
            "a_workload_turning_not_ready_loses_its_hint",
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").zone("zone-a").not_ready().build(),
                vm("vm-b", "10.0.0.2").zone("zone-b").build(),
            ],
            |p, _| {
                ensure_hints(
                    &p.updates,
                    &[
                        hinted("vm-a", Some("zone-a"), &[]),
                        hinted("vm-b", Some("zone-b"), &["zone-b"]),
                    ],
                )
            },
        )
        .after(zoned(), two_zones()),
        Case::new(
            "only_the_slice_whose_endpoint_moved_zone_is_rewritten",
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").zone("zone-a").build(),
                vm("vm-b", "10.0.0.2").zone("zone-b").build(),
                vm("vm-c", "10.0.0.3").zone("zone-a").build(),
                vm("vm-d", "10.0.0.4").zone("zone-c").build(),
            ],
            |p, existing| {
                ensure!(existing.len() == 2, "two slices of two");
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty() && p.updates.len() == 1,
                    "one update, got {}",
                    p.write_count()
                );
                ensure_hints(
                    &p.updates,
                    &[
                        hinted("vm-c", Some("zone-a"), &["zone-a"]),
                        hinted("vm-d", Some("zone-c"), &["zone-c"]),
                    ],
                )
            },
        )
        .after(
            zoned(),
            vec![
                vm("vm-a", "10.0.0.1").zone("zone-a").build(),
                vm("vm-b", "10.0.0.2").zone("zone-b").build(),
                vm("vm-c", "10.0.0.3").zone("zone-a").build(),
                vm("vm-d", "10.0.0.4").zone("zone-b").build(),
            ],
        )
        .config(Config::new(2, slices::DEFAULT_MANAGED_BY, slices::DEFAULT_NAME_PREFIX).unwrap()),
    ]);
}

/// Converges `service`, then lets `edit` change the first endpoint of the only slice as
/// another writer would, and plans again.
fn plan_after_foreign_edit(
    service: &k8s_openapi::api::core::v1::Service,
    edit: impl FnOnce(&mut k8s_openapi::api::discovery::v1::Endpoint),
) -> slices::SlicePlan {
    let workloads = two_zones();
    let config = Config::default();
    let store = converge(service, &workloads, &config);
    let mut slices: Vec<EndpointSlice> = store.slices().into_iter().cloned().collect();
    assert_eq!(slices.len(), 1, "one slice");
    edit(&mut slices[0].endpoints.as_mut().unwrap()[0]);
    let store = SliceStore::with(slices);
    plan(service, &workloads, &store.slices(), &config)
}

#[test]
fn hints_written_by_someone_else_are_replaced() {
    let service = zoned().build();
    let other_zone = plan_after_foreign_edit(&service, |e| e.hints = Some(zone_hint("zone-b")));
    let with_node = plan_after_foreign_edit(&service, |e| {
        e.hints.as_mut().unwrap().for_nodes = Some(vec![ForNode {
            name: "node-1".to_owned(),
        }]);
    });
    let two_zones_hinted = plan_after_foreign_edit(&service, |e| {
        e.hints
            .as_mut()
            .unwrap()
            .for_zones
            .as_mut()
            .unwrap()
            .push(ForZone {
                name: "zone-b".to_owned(),
            });
    });
    let dropped = plan_after_foreign_edit(&service, |e| e.hints = None);
    let stale = plan_after_foreign_edit(&web().build(), |e| e.hints = Some(zone_hint("zone-a")));
    for (case, plan) in [
        ("hint_for_another_zone", &other_zone),
        ("node_hint", &with_node),
        ("two_zone_hints", &two_zones_hinted),
        ("hint_removed", &dropped),
    ] {
        assert_eq!(plan.updates.len(), 1, "{case}: one update");
        assert_eq!(hints(&plan.updates), each_in_its_own_zone(), "{case}");
    }
    assert_eq!(stale.updates.len(), 1, "stale hint: one update");
    assert_eq!(
        hints(&stale.updates),
        neither_hinted(),
        "a Service without trafficDistribution keeps no hint"
    );
}

#[test]
fn cached_slice_keeps_own_zone_hints_and_gives_them_back() {
    let service = zoned().build();
    let store = converge(&service, &two_zones(), &Config::default());
    let slice = store.slices()[0].clone();
    let cached = CachedSlice::from(&slice);
    assert!(cached.endpoints.iter().all(|e| e.zone_hint && !e.foreign));
    assert_eq!(
        hints(&[cached.to_slice()]),
        hints(&[slice]),
        "the projection gives back the hints it read"
    );
}

#[test]
fn cached_service_reads_traffic_distribution() {
    let cases = [
        (web(), TrafficDistribution::Any),
        (
            web().traffic_distribution("PreferClose"),
            TrafficDistribution::PreferSameZone,
        ),
        (
            web().traffic_distribution("PreferSameZone"),
            TrafficDistribution::PreferSameZone,
        ),
        (
            web().traffic_distribution("PreferSameNode"),
            TrafficDistribution::PreferSameNode,
        ),
        (
            web().traffic_distribution("preferclose"),
            TrafficDistribution::Any,
        ),
        (
            web()
                .traffic_distribution("PreferSameNode")
                .annotation(TOPOLOGY_MODE_ANNOTATION, "auto"),
            TrafficDistribution::Any,
        ),
    ];
    for (service, expected) in cases {
        let service = service.build();
        assert_eq!(
            CachedService::from(&service).traffic_distribution,
            expected,
            "{:?}",
            service.spec.and_then(|s| s.traffic_distribution)
        );
    }
}
