//! The independent reference (`sim::reference`): a table of hand-written slice sets, one per
//! rule of docs/slices.md, each judged as the spec says; and property tests comparing the
//! planner's applied output with the reference over random Services, workloads and earlier
//! slices (the simulation's convergence check trusts the reference, not the planner).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeSet;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proptest::prelude::*;
use serde_json::{Value, json};
use sim::reference::{Rule, Rules, judge};
use slices::{
    Config, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, plan_slices,
    testing::{ServiceShape, SliceStore, Svc, Workload, WorkloadShape, time},
};

/// The digest of vm-1 alone, of vm-1 and vm-2, and of vm-2 alone, with the builders' default identities,
/// computed apart from both implementations (a few lines of Python over the spec's definition).
const DIGEST_VM1: &str = "18002da3f7fc62a9";
const DIGEST_VM1_VM2: &str = "8937a9daa557c8a0";
const DIGEST_VM2: &str = "b5fead3936c6e7d4";
/// The digest of nothing (the spec's placeholder value).
const DIGEST_NOTHING: &str = "cbf29ce484222325";

fn web() -> Svc {
    Svc::named("web")
        .selector("app", "web")
        .port("http", 80, "http")
        .families(&["IPv4"])
}

fn vm(name: &str, ip: &str) -> Workload {
    Workload::named(name)
        .label("app", "web")
        .zone("z1")
        .ip(ip)
        .port("http", 8080)
        .ready()
}

/// An endpoint as the spec writes it for a ready workload `name` in zone z1.
fn endpoint(name: &str, address: &str) -> Value {
    json!({
        "addresses": [address],
        "conditions": { "ready": true, "serving": true, "terminating": false },
        "zone": "z1",
        "targetRef": {
            "kind": "ExternalWorkload", "namespace": "default", "name": name,
            "uid": format!("uid-ew-{name}"),
        },
    })
}

/// A slice of `web` named `name`, its ports the `http` 80 → 8080 resolution.
fn slice(name: &str, family: &str, endpoints: Vec<Value>, digest: &str) -> Value {
    let ports = if endpoints.is_empty() {
        json!([])
    } else {
        json!([{ "name": "http", "port": 8080, "protocol": "TCP" }])
    };
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "web",
                "endpointslice.kubernetes.io/managed-by": DEFAULT_MANAGED_BY,
            },
            "annotations": { "external-endpoints.io/identity-digest": digest },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": "web", "uid": "uid-svc-web",
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "addressType": family,
        "endpoints": endpoints,
        "ports": ports,
    })
}

fn one_slice() -> Value {
    slice(
        "linkerd-external-web-a",
        "IPv4",
        vec![endpoint("vm-1", "10.0.0.1")],
        DIGEST_VM1,
    )
}

/// The rules `slices` break for `service` and `workloads`.
fn broken(service: Svc, workloads: &[Workload], slices: &[Value], rules: &Rules) -> BTreeSet<Rule> {
    let service: Service = service.build();
    let workloads: Vec<ExternalWorkload> = workloads.iter().cloned().map(Workload::build).collect();
    let slices: Vec<EndpointSlice> = slices
        .iter()
        .map(|value| serde_json::from_value(value.clone()).unwrap())
        .collect();
    let workloads: Vec<&ExternalWorkload> = workloads.iter().collect();
    let slices: Vec<&EndpointSlice> = slices.iter().collect();
    judge(&service, &workloads, &slices, rules)
        .into_iter()
        .map(|fault| fault.rule)
        .collect()
}

fn rules(list: &[Rule]) -> BTreeSet<Rule> {
    list.iter().copied().collect()
}

/// Edits the first endpoint of a slice.
fn with_endpoint(mut slice: Value, edit: impl FnOnce(&mut Value)) -> Value {
    edit(&mut slice["endpoints"][0]);
    slice
}

/// A case of the table: its name, the Service, the workloads, the slices, the rules broken.
type Case = (
    &'static str,
    Svc,
    Vec<Workload>,
    Vec<Value>,
    &'static [Rule],
);

#[test]
fn each_rule_of_the_spec_is_judged_by_the_reference() {
    let default = Rules::default();
    let cases: Vec<Case> = vec![
        (
            "the spec's slice",
            web(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[],
        ),
        (
            "two workloads in one slice, digest over both by name",
            web(),
            vec![vm("vm-2", "10.0.0.2"), vm("vm-1", "10.0.0.1")],
            vec![slice(
                "linkerd-external-web-a",
                "IPv4",
                vec![endpoint("vm-2", "10.0.0.2"), endpoint("vm-1", "10.0.0.1")],
                DIGEST_VM1_VM2,
            )],
            &[],
        ),
        (
            "packing is free: one slice each",
            web(),
            vec![vm("vm-1", "10.0.0.1"), vm("vm-2", "10.0.0.2")],
            vec![
                one_slice(),
                slice(
                    "linkerd-external-web-b",
                    "IPv4",
                    vec![endpoint("vm-2", "10.0.0.2")],
                    DIGEST_VM2,
                ),
            ],
            &[],
        ),
        (
            "nothing published",
            web(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![],
            &[Rule::Missing],
        ),
        (
            "an endpoint twice",
            web(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice(), {
                let mut other = one_slice();
                other["metadata"]["name"] = json!("linkerd-external-web-b");
                other
            }],
            &[Rule::Twice],
        ),
        (
            "a workload no longer selected",
            web(),
            vec![vm("vm-1", "10.0.0.1").label("app", "other")],
            vec![one_slice()],
            &[Rule::Unwanted],
        ),
        (
            "a workload of another namespace is never selected",
            web(),
            vec![vm("vm-1", "10.0.0.1").namespace("elsewhere")],
            vec![one_slice()],
            &[Rule::Unwanted],
        ),
        (
            "an old address",
            web(),
            vec![vm("vm-1", "10.0.0.9")],
            vec![one_slice()],
            &[Rule::Endpoint],
        ),
        (
            "an address not an IP is left out, the others kept",
            web(),
            vec![vm("vm-1", "10.0.0.1").ip("not-an-ip")],
            vec![one_slice()],
            &[],
        ),
        (
            "a workload without an address is not published",
            web(),
            vec![vm("vm-1", "not-an-ip")],
            vec![],
            &[],
        ),
        (
            "a not-ready workload published ready",
            web(),
            vec![vm("vm-1", "10.0.0.1").not_ready()],
            vec![one_slice()],
            &[Rule::Endpoint],
        ),
        (
            "publishNotReadyAddresses: ready, not serving",
            web().publish_not_ready(),
            vec![vm("vm-1", "10.0.0.1").not_ready()],
            vec![with_endpoint(one_slice(), |endpoint| {
                endpoint["conditions"]["serving"] = json!(false);
            })],
            &[],
        ),
        (
            "a terminating workload: serving, terminating, not ready",
            web(),
            vec![vm("vm-1", "10.0.0.1").terminating()],
            vec![with_endpoint(one_slice(), |endpoint| {
                endpoint["conditions"] =
                    json!({ "ready": false, "serving": true, "terminating": true });
            })],
            &[],
        ),
        (
            "a zone changed",
            web(),
            vec![vm("vm-1", "10.0.0.1").zone("z2")],
            vec![one_slice()],
            &[Rule::Endpoint],
        ),
        (
            "trafficDistribution asks for a hint",
            web().traffic_distribution("PreferClose"),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Endpoint],
        ),
        (
            "the hint for its own zone",
            web().traffic_distribution("PreferSameNode"),
            vec![vm("vm-1", "10.0.0.1")],
            vec![with_endpoint(one_slice(), |endpoint| {
                endpoint["hints"] = json!({ "forZones": [{ "name": "z1" }] });
            })],
            &[],
        ),
        (
            "no hint for a not-ready endpoint",
            web().traffic_distribution("PreferSameZone"),
            vec![vm("vm-1", "10.0.0.1").not_ready()],
            vec![with_endpoint(one_slice(), |endpoint| {
                endpoint["conditions"]["ready"] = json!(false);
                endpoint["conditions"]["serving"] = json!(false);
                endpoint["hints"] = json!({ "forZones": [{ "name": "z1" }] });
            })],
            &[Rule::Endpoint],
        ),
        (
            "the topology-mode annotation wins over trafficDistribution",
            web()
                .traffic_distribution("PreferClose")
                .annotation("service.kubernetes.io/topology-mode", "Auto"),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[],
        ),
        (
            "a headless Service: hostname and label",
            web().headless(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Endpoint, Rule::Labels],
        ),
        (
            "a numeric targetPort is used as is",
            Svc::named("web")
                .selector("app", "web")
                .port("http", 80, 9000)
                .families(&["IPv4"]),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Ports],
        ),
        (
            "a Service label is copied to its slices",
            web().label("team", "a"),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Labels],
        ),
        (
            "a slice owned by an earlier Service of the name",
            web().uid("uid-svc-web-2"),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Owner],
        ),
        (
            "a name without the prefix",
            web(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![{
                let mut other = one_slice();
                other["metadata"]["name"] = json!("web-a");
                other
            }],
            &[Rule::Name],
        ),
        (
            "a family the Service does not have",
            web(),
            vec![vm("vm-1", "10.0.0.1").ip("fd00::1")],
            vec![
                one_slice(),
                slice(
                    "linkerd-external-web-b",
                    "IPv6",
                    vec![endpoint("vm-1", "fd00::1")],
                    DIGEST_VM1,
                ),
            ],
            &[Rule::Family],
        ),
        (
            "IPv6 in canonical text, both families by default",
            Svc::named("web")
                .selector("app", "web")
                .port("http", 80, "http"),
            vec![vm("vm-1", "10.0.0.1").ip("FD00:0::1")],
            vec![
                one_slice(),
                slice(
                    "linkerd-external-web-b",
                    "IPv6",
                    vec![endpoint("vm-1", "fd00::1")],
                    DIGEST_VM1,
                ),
            ],
            &[],
        ),
        (
            "a Service without a selector keeps no slice",
            web().no_selector(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Family],
        ),
        (
            "an ExternalName Service keeps no slice",
            web().external_name(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![one_slice()],
            &[Rule::Family],
        ),
        (
            "a placeholder alone in its family",
            web(),
            vec![],
            vec![slice(
                "linkerd-external-web-a",
                "IPv4",
                vec![],
                DIGEST_NOTHING,
            )],
            &[],
        ),
        (
            "an empty slice beside endpoints",
            web(),
            vec![vm("vm-1", "10.0.0.1")],
            vec![
                one_slice(),
                slice("linkerd-external-web-b", "IPv4", vec![], DIGEST_NOTHING),
            ],
            &[Rule::Placeholder],
        ),
        (
            "two placeholders",
            web(),
            vec![],
            vec![
                slice("linkerd-external-web-a", "IPv4", vec![], DIGEST_NOTHING),
                slice("linkerd-external-web-b", "IPv4", vec![], DIGEST_NOTHING),
            ],
            &[Rule::Placeholder],
        ),
        (
            "a stale identity digest",
            web(),
            vec![vm("vm-1", "10.0.0.1").identity("rotated")],
            vec![one_slice()],
            &[Rule::Digest],
        ),
    ];
    for (name, service, workloads, slices, want) in cases {
        assert_eq!(
            broken(service, &workloads, &slices, &default),
            rules(want),
            "{name}"
        );
    }
}

#[test]
fn a_slice_over_the_maximum_is_judged() {
    let small = Rules {
        max_endpoints_per_slice: 1,
        ..Rules::default()
    };
    let two = slice(
        "linkerd-external-web-a",
        "IPv4",
        vec![endpoint("vm-1", "10.0.0.1"), endpoint("vm-2", "10.0.0.2")],
        DIGEST_VM1_VM2,
    );
    let workloads = [vm("vm-1", "10.0.0.1"), vm("vm-2", "10.0.0.2")];
    assert_eq!(
        broken(web(), &workloads, std::slice::from_ref(&two), &small),
        rules(&[Rule::Maximum])
    );
    assert_eq!(
        broken(web(), &workloads, &[two], &Rules::default()),
        rules(&[])
    );
}

#[test]
fn slices_of_another_manager_or_service_are_not_judged() {
    let mut linkerd = one_slice();
    linkerd["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = json!("someone");
    let mut other = one_slice();
    other["metadata"]["labels"]["kubernetes.io/service-name"] = json!("db");
    let workloads = [vm("vm-1", "10.0.0.1")];
    assert_eq!(
        broken(
            web(),
            &workloads,
            &[linkerd, other, one_slice()],
            &Rules::default()
        ),
        rules(&[])
    );
}

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
