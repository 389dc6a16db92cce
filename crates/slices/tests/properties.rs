//! Property tests of the planner's invariants (docs/slices.md): re-planning the applied
//! result is empty; every desired endpoint appears exactly once; no slice over the maximum;
//! the plan does not depend on input order; inputs are never mutated; every endpoint carries
//! exactly the topology hint its Service's `trafficDistribution` asks for (none stale), and no
//! hint names a zone no endpoint of its slice is in; an identity change rewrites exactly the
//! slices holding that workload; the only empty slices are placeholders (issue 37).
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proptest::prelude::*;
use slices::testing::{ServiceShape, SliceStore, Svc, WorkloadShape, time};
use slices::{Config, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, SlicePlan, plan_slices};

const IPS: &[&str] = &[
    "10.0.0.1",
    "10.0.0.2",
    "10.1.0.3",
    "fd00::1",
    "FD00::2",
    "not-an-ip",
    "",
    "10.0.0.256",
];
const PORT_NAMES: &[&str] = &["http", "admin", "grpc"];

fn workload_shape() -> impl Strategy<Value = WorkloadShape> {
    (
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.1),
        prop::collection::vec(prop::sample::select(IPS), 0..3),
        prop::collection::vec((prop::sample::select(PORT_NAMES), 1..4i32), 0..3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::option::of(prop::sample::select(&["z1", "z2"][..])),
        prop::option::weighted(0.2, prop::sample::select(&["rotated-1", "rotated-2"][..])),
    )
        .prop_map(
            |(selected, other_namespace, ips, ports, ready, terminating, zone, identity)| {
                WorkloadShape {
                    app: if selected { "web" } else { "other" },
                    other_namespace,
                    ips,
                    ports: (ports.into_iter())
                        .map(|(name, port)| (name, 8000 + port, None))
                        .collect(),
                    ready,
                    terminating,
                    zone,
                    identity,
                }
            },
        )
}

fn build(index: usize, shape: &WorkloadShape) -> ExternalWorkload {
    shape.build(&format!("vm-{index:03}"))
}

fn service() -> impl Strategy<Value = Service> {
    (
        prop::sample::select(vec![
            vec![],
            vec!["IPv4"],
            vec!["IPv6"],
            vec!["IPv4", "IPv6"],
            vec!["IPv6", "IPv4"],
        ]),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::sample::select(
            &[
                "selector",
                "selector",
                "selector",
                "selector",
                "selector",
                "selector",
                "none",
                "external-name",
            ][..],
        ),
        prop::sample::select(
            &[
                None,
                None,
                Some("PreferSameZone"),
                Some("PreferClose"),
                Some("PreferSameNode"),
            ][..],
        ),
    )
        .prop_map(
            |(families, headless, publish, team_label, selection, distribution)| {
                let options = ServiceShape {
                    families,
                    headless,
                    publish_not_ready: publish,
                    team_label,
                    traffic_distribution: distribution,
                    topology_mode: None,
                    selection,
                };
                let base = Svc::named("web")
                    .selector("app", "web")
                    .port("http", 80, "http")
                    .port("admin", 81, "admin")
                    .port("raw", 82, 9000);
                options.apply(base).build()
            },
        )
}

/// A state, and an earlier state whose slices exist (some deleted by someone else).
fn scenario() -> impl Strategy<Value = (Service, Vec<ExternalWorkload>, Vec<EndpointSlice>, usize)>
{
    (
        service(),
        service(),
        prop::collection::vec(workload_shape(), 0..30),
        prop::collection::vec(workload_shape(), 0..30),
        1..6usize,
        1..6usize,
        prop::collection::vec(any::<bool>(), 0..10),
        any::<bool>(),
    )
        .prop_map(
            |(svc, earlier_svc, now, earlier, max, earlier_max, lost, same)| {
                let workloads: Vec<_> = now.iter().enumerate().map(|(i, s)| build(i, s)).collect();
                // Half the time the workloads are unchanged and only the Service moved on (a new
                // trafficDistribution, say), so the slices differ in that respect alone.
                let earlier: Vec<_> = if same {
                    workloads.clone()
                } else {
                    earlier
                        .iter()
                        .enumerate()
                        .map(|(i, s)| build(i, s))
                        .collect()
                };
                // Someone else deleted some of them.
                let existing = SliceStore::converged_less_lost(
                    &earlier_svc,
                    &earlier,
                    &config(earlier_max),
                    &lost,
                );
                (svc, workloads, existing, max)
            },
        )
}

fn config(max: usize) -> Config {
    Config::new(max, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX).unwrap()
}

fn run_plan(
    service: &Service,
    workloads: &[ExternalWorkload],
    existing: &[EndpointSlice],
    config: &Config,
) -> SlicePlan {
    let refs: Vec<_> = workloads.iter().collect();
    let existing: Vec<_> = existing.iter().collect();
    plan_slices(service, &refs, &existing, config, &time(50))
}

/// Oracle: (workload, addressType) pairs that must appear exactly once.
fn expected_endpoints(
    service: &Service,
    workloads: &[ExternalWorkload],
) -> BTreeMap<(String, String), usize> {
    let families: Vec<String> = match service.spec.as_ref().and_then(|s| s.ip_families.clone()) {
        Some(f) if !f.is_empty() => f,
        _ => vec!["IPv4".into(), "IPv6".into()],
    };
    let mut expected = BTreeMap::new();
    let spec = service.spec.as_ref();
    if spec.and_then(|s| s.selector.as_ref()).is_none()
        || spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName")
    {
        return expected;
    }
    for w in workloads {
        let selected = w.metadata.namespace.as_deref() == Some("default")
            && w.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str)
                == Some("web");
        if !selected {
            continue;
        }
        for ip in &w.spec.workload_ips {
            if let Ok(ip) = ip.ip.parse::<IpAddr>() {
                let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
                if families.iter().any(|f| f == family) {
                    expected.insert((w.metadata.name.clone().unwrap(), family.to_owned()), 1);
                }
            }
        }
    }
    expected
}

fn actual_endpoints(slices: &[&EndpointSlice]) -> BTreeMap<(String, String), usize> {
    let mut actual = BTreeMap::new();
    for slice in slices {
        for endpoint in slice.endpoints.iter().flatten() {
            let name = endpoint
                .target_ref
                .as_ref()
                .and_then(|t| t.name.clone())
                .unwrap_or_default();
            *actual
                .entry((name, slice.address_type.clone()))
                .or_insert(0) += 1;
        }
    }
    actual
}

/// Whether the Service asks for zone hints (any of the three values; no annotation is generated).
fn wants_zone_hints(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.traffic_distribution.as_deref())
        .is_some()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn replanning_the_applied_result_is_empty((service, workloads, existing, max) in scenario()) {
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        let mut store = SliceStore::with(existing);
        store.apply(&plan);
        let current: Vec<EndpointSlice> = store.slices().into_iter().cloned().collect();
        let again = run_plan(&service, &workloads, &current, &config);
        prop_assert!(again.is_empty(), "second plan: {:#?}", again);
    }

    #[test]
    fn every_desired_endpoint_appears_exactly_once((service, workloads, existing, max) in scenario()) {
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        let mut store = SliceStore::with(existing);
        store.apply(&plan);
        prop_assert_eq!(actual_endpoints(&store.slices()), expected_endpoints(&service, &workloads));
    }

    #[test]
    fn no_slice_holds_more_than_the_maximum((service, workloads, existing, max) in scenario()) {
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        for slice in plan.creates.iter().chain(&plan.updates) {
            let len = slice.endpoints.as_ref().map_or(0, Vec::len);
            prop_assert!(len <= max, "slice with {} endpoints, max {}", len, max);
        }
    }

    #[test]
    fn an_identity_change_rewrites_exactly_the_slices_holding_that_workload(
        (service, workloads, _, max) in scenario(),
        rotated in prop::collection::vec(any::<bool>(), 0..30),
    ) {
        let config = config(max);
        let mut store = SliceStore::default();
        store.apply(&run_plan(&service, &workloads, &[], &config));
        let current: Vec<EndpointSlice> = store.slices().into_iter().cloned().collect();
        let mut changed = BTreeSet::new();
        let mut now = workloads.clone();
        for (workload, rotate) in now.iter_mut().zip(rotated) {
            if rotate {
                workload.spec.mesh_tls.identity.push_str(".next");
                changed.insert(workload.metadata.name.clone().unwrap());
            }
        }
        let plan = run_plan(&service, &now, &current, &config);
        let holding: BTreeSet<String> = current
            .iter()
            .filter(|s| {
                s.endpoints.iter().flatten().any(|e| {
                    e.target_ref.as_ref().and_then(|t| t.name.as_ref()).is_some_and(|n| changed.contains(n))
                })
            })
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        let updated: BTreeSet<String> =
            plan.updates.iter().filter_map(|s| s.metadata.name.clone()).collect();
        prop_assert!(plan.creates.is_empty() && plan.deletes.is_empty(), "{:#?}", plan);
        prop_assert_eq!(updated, holding);
        for update in &plan.updates {
            let before = current.iter().find(|s| s.metadata.name == update.metadata.name).unwrap();
            prop_assert_eq!(&update.endpoints, &before.endpoints, "endpoints unchanged");
        }
    }

    #[test]
    fn the_only_empty_slices_are_placeholders_kept_from_existing_ones((service, workloads, existing, max) in scenario()) {
        // docs/slices.md, "Packing", step 4: never created from nothing, at most one per family,
        // and only in a family with no endpoint.
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        let empty = |slice: &EndpointSlice| slice.endpoints.as_deref().unwrap_or_default().is_empty();
        prop_assert!(!plan.creates.iter().any(empty), "an empty slice created: {:#?}", plan.creates);
        let mut store = SliceStore::with(existing);
        store.apply(&plan);
        let ours: Vec<&EndpointSlice> = store
            .slices()
            .into_iter()
            .filter(|s| s.metadata.owner_references.iter().flatten().any(|o| o.uid == "uid-svc-web"))
            .collect();
        for slice in ours.iter().copied().filter(|s| empty(s)) {
            let family: Vec<&&EndpointSlice> =
                ours.iter().filter(|s| s.address_type == slice.address_type).collect();
            prop_assert_eq!(family.len(), 1, "an empty slice beside others of its family");
            prop_assert!(slice.ports.as_deref().unwrap_or_default().is_empty(), "placeholder with ports");
        }
    }

    #[test]
    fn plan_does_not_depend_on_input_order((service, workloads, existing, max) in scenario(), rotate in 0..30usize) {
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        let mut shuffled = workloads.clone();
        shuffled.reverse();
        if !shuffled.is_empty() {
            let by = rotate % shuffled.len();
            shuffled.rotate_left(by);
        }
        let mut existing_shuffled = existing.clone();
        existing_shuffled.reverse();
        prop_assert_eq!(plan, run_plan(&service, &shuffled, &existing_shuffled, &config));
    }

    #[test]
    fn inputs_are_never_mutated((service, workloads, existing, max) in scenario()) {
        let config = config(max);
        let before = (service.clone(), workloads.clone(), existing.clone(), config.clone());
        let _ = run_plan(&service, &workloads, &existing, &config);
        prop_assert_eq!((service, workloads, existing, config), before);
    }

    #[test]
    fn every_endpoint_carries_exactly_the_hint_its_service_asks_for((service, workloads, existing, max) in scenario()) {
        // The earlier state's Service had its own trafficDistribution: hints it left must go.
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        let mut store = SliceStore::with(existing);
        store.apply(&plan);
        let hinting = wants_zone_hints(&service);
        for slice in store.slices() {
            for endpoint in slice.endpoints.iter().flatten() {
                let ready = endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                let expected = endpoint.zone.clone().filter(|_| hinting && ready).map(|zone| vec![zone]);
                let hints = endpoint.hints.clone();
                prop_assert!(
                    hints.as_ref().is_none_or(|h| h.for_nodes.is_none()),
                    "a node hint on {:?}", endpoint
                );
                let zones: Option<Vec<String>> = hints
                    .and_then(|h| h.for_zones)
                    .map(|z| z.into_iter().map(|z| z.name).collect());
                prop_assert_eq!(zones, expected, "endpoint {:?}", endpoint);
            }
        }
    }

    #[test]
    fn hints_never_name_a_zone_no_endpoint_of_the_slice_is_in((service, workloads, existing, max) in scenario()) {
        let config = config(max);
        let plan = run_plan(&service, &workloads, &existing, &config);
        for slice in plan.creates.iter().chain(&plan.updates) {
            let endpoints = slice.endpoints.iter().flatten();
            let zones: BTreeSet<&str> = endpoints.clone().filter_map(|e| e.zone.as_deref()).collect();
            for hint in endpoints.filter_map(|e| e.hints.as_ref()).flat_map(|h| h.for_zones.iter().flatten()) {
                prop_assert!(zones.contains(hint.name.as_str()), "hint {} not among {:?}", hint.name, zones);
            }
        }
    }
}
