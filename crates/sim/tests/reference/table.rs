//! The table: hand-written slice sets, one per rule of docs/slices.md, each judged by the
//! reference as the spec says; a slice over the maximum; slices of another manager or Service.

use std::collections::BTreeSet;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::{Value, json};
use sim::reference::{Rule, Rules, judge};
use slices::{
    DEFAULT_MANAGED_BY,
    testing::{Svc, Workload},
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
