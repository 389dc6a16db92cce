//! The independent reference (`sim::reference`): a table of hand-written slice sets, one per
//! rule of docs/slices.md, each judged as the spec says; and property tests comparing the
//! planner's applied output with the reference over random Services, workloads and earlier
//! slices (the simulation's convergence check trusts the reference, not the planner).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

#[path = "reference/table.rs"]
mod table;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proptest::prelude::*;
use sim::reference::{Rules, judge};
use slices::{
    Config, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, plan_slices,
    testing::{ServiceShape, SliceStore, Svc, WorkloadShape, time},
};

// === the planner against the reference ===

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

fn shape() -> impl Strategy<Value = WorkloadShape> {
    (
        prop::sample::select(&["web", "web", "web", "other"][..]),
        prop::bool::weighted(0.1),
        prop::collection::vec(prop::sample::select(IPS), 0..3),
        prop::collection::vec(
            (
                prop::sample::select(&["http", "admin", "dns"][..]),
                0..4i32,
                prop::sample::select(&[None, Some("TCP"), Some("UDP")][..]),
            ),
            0..3,
        ),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::option::of(prop::sample::select(&["z1", "z2"][..])),
        prop::option::weighted(0.2, prop::sample::select(&["rotated-1", "rotated-2"][..])),
    )
        .prop_map(
            |(app, other_namespace, ips, ports, ready, terminating, zone, identity)| {
                WorkloadShape {
                    app,
                    other_namespace,
                    ips,
                    // Port 0 is out of range: a named targetPort resolving to it is left out.
                    ports: (ports.into_iter())
                        .map(|(name, offset, protocol)| {
                            (name, if offset == 0 { 0 } else { 8000 + offset }, protocol)
                        })
                        .collect(),
                    ready,
                    terminating,
                    zone,
                    identity,
                }
            },
        )
}

fn workload(index: usize, shape: &WorkloadShape) -> ExternalWorkload {
    // Some names are not DNS labels (a headless Service leaves their hostname out).
    let name = if index % 7 == 6 {
        format!("VM.{index}")
    } else {
        format!("vm-{index:02}")
    };
    shape.build(&name)
}

fn service() -> impl Strategy<Value = Service> {
    (
        prop::sample::select(vec![
            vec![],
            vec!["IPv4"],
            vec!["IPv6"],
            vec!["IPv4", "IPv6"],
        ]),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
        prop::sample::select(&["selector", "selector", "selector", "none", "external-name"][..]),
        prop::sample::select(
            &[
                None,
                Some("PreferSameZone"),
                Some("PreferClose"),
                Some("PreferSameNode"),
                Some("Other"),
            ][..],
        ),
        prop::sample::select(&[None, None, Some("Auto"), Some("Disabled")][..]),
        prop::bool::weighted(0.3),
        prop::sample::select(&["web", "web-2"][..]),
    )
        .prop_map(
            |(families, headless, publish, team, selection, distribution, mode, udp, uid)| {
                let options = ServiceShape {
                    families,
                    headless,
                    publish_not_ready: publish,
                    team_label: team,
                    traffic_distribution: distribution,
                    topology_mode: mode,
                    selection,
                };
                let mut base = Svc::named("web")
                    .uid(&format!("uid-svc-{uid}"))
                    .selector("app", "web")
                    .port("http", 80, "http")
                    .port("raw", 82, 9000);
                if udp {
                    base = base.port("dns", 53, "dns").protocol("UDP");
                }
                options.apply(base).build()
            },
        )
}

/// A Service and its workloads now, the slices an earlier Service (perhaps another uid) and
/// earlier workloads left (some deleted by someone else), and the maximum.
fn scenario() -> impl Strategy<Value = (Service, Vec<ExternalWorkload>, Vec<EndpointSlice>, usize)>
{
    (
        service(),
        service(),
        prop::collection::vec(shape(), 0..24),
        prop::collection::vec(shape(), 0..24),
        1..5usize,
        1..5usize,
        prop::collection::vec(any::<bool>(), 0..8),
        any::<bool>(),
        prop::collection::vec(prop::bool::weighted(0.1), 0..24),
    )
        .prop_map(
            |(now, earlier, shapes, earlier_shapes, max, earlier_max, lost, same, rotated)| {
                let workloads: Vec<_> = shapes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| workload(i, s))
                    .collect();
                // Half the time nothing changed since the earlier plan but the maximum and perhaps
                // a few mesh identities: the slices may already be what the spec asks, or differ
                // only in a digest.
                let (earlier, earlier_shapes) = if same {
                    let before = shapes
                        .iter()
                        .zip(rotated.iter().chain(std::iter::repeat(&false)))
                        .map(|(shape, rotated)| WorkloadShape {
                            identity: if *rotated {
                                Some("earlier")
                            } else {
                                shape.identity
                            },
                            ..shape.clone()
                        })
                        .collect();
                    (now.clone(), before)
                } else {
                    (earlier, earlier_shapes)
                };
                let before: Vec<_> = earlier_shapes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| workload(i, s))
                    .collect();
                let existing =
                    SliceStore::converged_less_lost(&earlier, &before, &config(earlier_max), &lost);
                (now, workloads, existing, max)
            },
        )
}

fn config(max: usize) -> Config {
    Config::new(max, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The planner's applied plan keeps every rule of the reference.
    #[test]
    fn the_planners_result_keeps_every_rule_of_the_reference(
        (service, workloads, existing, max) in scenario()
    ) {
        let refs: Vec<_> = workloads.iter().collect();
        let existing_refs: Vec<_> = existing.iter().collect();
        let plan = plan_slices(&service, &refs, &existing_refs, &config(max), &time(50));
        let mut store = SliceStore::with(existing);
        store.apply(&plan);
        let rules = Rules { max_endpoints_per_slice: max, ..Rules::default() };
        let faults = judge(&service, &refs, &store.slices(), &rules);
        prop_assert!(faults.is_empty(), "{:#?}\nplan: {:#?}", faults, plan);
    }

    /// Slices the reference accepts are slices the planner leaves alone: the two agree on
    /// what is converged (otherwise the simulation would see writes at rest, or no convergence).
    #[test]
    fn slices_the_reference_accepts_the_planner_leaves_alone(
        (service, workloads, existing, max) in scenario()
    ) {
        let refs: Vec<_> = workloads.iter().collect();
        let existing_refs: Vec<_> = existing.iter().collect();
        let rules = Rules { max_endpoints_per_slice: max, ..Rules::default() };
        if judge(&service, &refs, &existing_refs, &rules).is_empty() {
            let plan = plan_slices(&service, &refs, &existing_refs, &config(max), &time(50));
            prop_assert!(plan.is_empty(), "{:#?}", plan);
        }
    }
}
