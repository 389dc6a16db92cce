//! Adoption: slices exactly as Linkerd's controller writes them (`linkerd.rs`) for several
//! Services; our replica takes over with Linkerd's managed-by value. Slices that already say what
//! ours would get one write each, adding only the identity digest annotation (Linkerd writes
//! none; without it ours could not tell when a workload's identity changes, issue 37); the
//! others change only what differs, one Service per difference named in docs/operations.md,
//! the digest added in the same write.

use std::collections::BTreeMap;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{
    core::v1::Service,
    discovery::v1::{EndpointHints, EndpointSlice, ForZone},
};
use kube::{
    ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use slices::testing::{self, Svc, Workload};

use super::{
    contender::{Ours, SHORT},
    linkerd,
};
use harness::{CONVERGE, Cluster, eventually};

/// A finalizer that holds a deleted workload in its terminating state.
const HOLD: &str = "external-endpoints.test/hold";

/// Services whose Linkerd slices are exactly what ours would write.
pub const SAME: [&str; 5] = ["web", "dual", "headless", "multi", "big"];

/// One Service per difference: what Linkerd wrote differs from ours.
pub const DIFFERENT: [&str; 7] = [
    "numeric",
    "draining",
    "published",
    "relabelled",
    "unselected",
    "zoned",
    "rezoned",
];

/// Service `web` (labelled, one named port) with `web-1` (ready, zoned) and `web-2` (not ready).
pub async fn create_web(cluster: &Cluster) {
    cluster
        .create_service(testing::web().label("team", "payments"))
        .await;
    cluster
        .apply_workload(
            vm("web-1", "app", "web")
                .ip("10.1.0.1")
                .zone("zone-a")
                .ready(),
        )
        .await;
    cluster
        .apply_workload(vm("web-2", "app", "web").ip("10.1.0.2").not_ready())
        .await;
}

/// The Services of [`SAME`] and their workloads.
pub async fn create_same(cluster: &Cluster) {
    create_web(cluster).await;
    cluster
        .apply_workload(
            vm("web-3", "app", "web")
                .ip("10.1.0.3")
                .ip("fd00::3")
                .ready(),
        )
        .await;

    let mut dual: Service = http_service("dual", "dual")
        .families(&["IPv4", "IPv6"])
        .build();
    dual.spec.as_mut().unwrap().ip_family_policy = Some("RequireDualStack".into());
    cluster.create_service(dual).await;
    for (name, v4, v6) in [
        ("dual-1", "10.2.0.1", "fd00::21"),
        ("dual-2", "10.2.0.2", "fd00::22"),
    ] {
        cluster
            .apply_workload(vm(name, "app", "dual").ip(v4).ip(v6).ready())
            .await;
    }

    cluster
        .create_service(Svc::named("headless").selector("app", "db").headless())
        .await;
    for (name, ip) in [("db-1", "10.3.0.1"), ("db-2", "10.3.0.2")] {
        cluster
            .apply_workload(vm(name, "app", "db").ip(ip).ready())
            .await;
    }

    // Service ports in an order that is not sorted: Linkerd keeps the Service's order.
    cluster
        .create_service(
            Svc::named("multi")
                .selector("app", "multi")
                .port("metrics", 9100, 9100)
                .port("grpc", 9000, "grpc"),
        )
        .await;
    cluster
        .apply_workload(
            Workload::named("multi-1")
                .label("app", "multi")
                .ip("10.4.0.1")
                .port("grpc", 7000)
                .port("metrics", 9100)
                .ready(),
        )
        .await;

    // More than one slice's worth (100 + 5).
    cluster.create_service(http_service("big", "big")).await;
    for i in 0..105 {
        cluster
            .apply_workload(
                vm(&format!("big-{i:03}"), "app", "big")
                    .ip(&format!("10.5.{}.{}", i / 200, i % 200 + 1))
                    .ready(),
            )
            .await;
    }
}

/// Service `name` selecting `app: <app>`, with the port `http` 80 to the workloads' `http`.
fn http_service(name: &str, app: &str) -> Svc {
    Svc::named(name)
        .selector("app", app)
        .port("http", 80, "http")
}

/// A workload with one label, the port `http` 8080.
pub fn vm(name: &str, key: &str, value: &str) -> Workload {
    Workload::named(name).label(key, value).port("http", 8080)
}

/// The workloads `service` selects, as stored.
pub async fn selected(cluster: &Cluster, service: &Service) -> Vec<ExternalWorkload> {
    let selector = service
        .spec
        .as_ref()
        .and_then(|spec| spec.selector.clone())
        .unwrap_or_default();
    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut workloads = cluster
        .workloads()
        .list(&ListParams::default().labels(&labels.join(",")))
        .await
        .unwrap()
        .items;
    workloads.sort_by_key(|w| w.name_any());
    workloads
}

/// Creates Linkerd's slices for each of `services` from the objects now in the API.
pub async fn create_linkerd_slices(cluster: &Cluster, services: &[&str]) {
    for name in services {
        let service = cluster.services().get(name).await.unwrap();
        let workloads = selected(cluster, &service).await;
        linkerd::create(cluster, &linkerd::slices_for(&service, &workloads)).await;
    }
}

/// Name → slice, for the managed slices of the namespace.
pub async fn slices_by_name(cluster: &Cluster) -> BTreeMap<String, EndpointSlice> {
    cluster
        .slices()
        .await
        .into_iter()
        .map(|slice| (slice.name_any(), slice))
        .collect()
}

/// The resourceVersions of one Service's slices.
pub fn versions_of(
    slices: &BTreeMap<String, EndpointSlice>,
    service: &str,
) -> BTreeMap<String, String> {
    slices
        .iter()
        .filter(|(_, slice)| {
            slice
                .labels()
                .get("kubernetes.io/service-name")
                .map(String::as_str)
                == Some(service)
        })
        .map(|(name, slice)| (name.clone(), slice.resource_version().unwrap_or_default()))
        .collect()
}

/// (ready, serving, terminating) of an endpoint.
type Conditions = (Option<bool>, Option<bool>, Option<bool>);

/// Workload name → conditions, for a slice's endpoints.
fn conditions(slice: &EndpointSlice) -> BTreeMap<String, Conditions> {
    slice
        .endpoints
        .iter()
        .flatten()
        .map(|endpoint| {
            let c = endpoint.conditions.clone().unwrap_or_default();
            let name = endpoint.target_ref.as_ref().unwrap().name.clone().unwrap();
            (name, (c.ready, c.serving, c.terminating))
        })
        .collect()
}

/// Lets the terminating workload go.
pub async fn release_held(cluster: &Cluster) {
    let patch = json!({"metadata": {"finalizers": null}});
    let _ = cluster
        .workloads()
        .patch("drain-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
}

/// The test: see the module docs.
pub async fn run(testbed: &'static testbed::Testbed) {
    let cluster = Cluster::new(testbed, "interop-adoption").await;
    create_same(&cluster).await;

    // numeric: a numeric targetPort the workload does not declare. Linkerd leaves the port
    // out (slices without ports); ours publishes it, as for pods.
    cluster
        .create_service(
            Svc::named("numeric")
                .selector("app", "numeric")
                .port("", 80, 8080),
        )
        .await;
    cluster
        .apply_workload(
            Workload::named("numeric-1")
                .label("app", "numeric")
                .ip("10.6.0.1")
                .port("admin", 9090)
                .ready(),
        )
        .await;
    // draining: a workload being deleted. Linkerd keeps it ready, never terminating.
    cluster
        .create_service(http_service("draining", "drain"))
        .await;
    let mut held: ExternalWorkload = vm("drain-1", "app", "drain").ip("10.7.0.1").ready().build();
    held.metadata.finalizers = Some(vec![HOLD.into()]);
    cluster.apply_workload(held).await;
    cluster
        .apply_workload(vm("drain-2", "app", "drain").ip("10.7.0.2").ready())
        .await;
    cluster
        .workloads()
        .delete("drain-1", &DeleteParams::default())
        .await
        .unwrap();
    // published: publishNotReadyAddresses, which Linkerd ignores.
    cluster
        .create_service(http_service("published", "pub").publish_not_ready())
        .await;
    cluster
        .apply_workload(vm("pub-1", "app", "pub").ip("10.8.0.1").not_ready())
        .await;
    // relabelled: a label since removed from the Service stays on Linkerd's slice.
    cluster
        .create_service(http_service("relabelled", "relabel").label("team", "a"))
        .await;
    cluster
        .apply_workload(vm("relabel-1", "app", "relabel").ip("10.9.0.1").ready())
        .await;
    // unselected: the Service lost its selector after Linkerd wrote its slice; Linkerd leaves
    // the slice, ours deletes it.
    cluster
        .create_service(http_service("unselected", "gone"))
        .await;
    cluster
        .apply_workload(vm("gone-1", "app", "gone").ip("10.10.0.1").ready())
        .await;

    // zoned: trafficDistribution PreferSameZone. Linkerd writes no hints; ours hints each
    // ready endpoint for its zone.
    cluster
        .create_service(http_service("zoned", "zoned").traffic_distribution("PreferSameZone"))
        .await;
    for (name, ip, zone) in [
        ("zoned-1", "10.11.0.1", "zone-a"),
        ("zoned-2", "10.11.0.2", "zone-b"),
    ] {
        cluster
            .apply_workload(vm(name, "app", "zoned").ip(ip).zone(zone).ready())
            .await;
    }
    // rezoned: the workload's zone label changed after Linkerd wrote the slice. A label-only
    // change makes Linkerd re-check only the Services that start or stop selecting the
    // workload, so its slice keeps the old zone; ours updates the endpoint's zone.
    cluster
        .create_service(http_service("rezoned", "rezone"))
        .await;
    cluster
        .apply_workload(
            vm("rezone-1", "app", "rezone")
                .ip("10.12.0.1")
                .zone("zone-a")
                .ready(),
        )
        .await;

    let mut all: Vec<&str> = SAME.to_vec();
    all.extend(DIFFERENT);
    create_linkerd_slices(&cluster, &all).await;
    // Linkerd wrote this slice while the Service had the label `tier: legacy`.
    let relabelled = cluster.slices_of("relabelled").await;
    let patch = json!({"metadata": {"labels": {"tier": "legacy"}}});
    cluster
        .slices_api()
        .patch(
            &relabelled[0].name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    cluster
        .update_service(
            Svc::named("unselected")
                .no_selector()
                .port("http", 80, "http"),
        )
        .await;
    cluster
        .apply_workload(
            vm("rezone-1", "app", "rezone")
                .ip("10.12.0.1")
                .zone("zone-b")
                .ready(),
        )
        .await;
    let before = slices_by_name(&cluster).await;
    assert_eq!(before.len(), 14, "Linkerd's slices: {:?}", before.keys());

    // `external-endpoints diff` with Linkerd's managed-by value (the default) shows exactly the
    // writes the take-over below makes: one per differing Service, naming what differs.
    let diff = diff(testbed, &cluster.namespace).await;
    let digest = || "identity-digest".to_string();
    let expected: BTreeMap<String, (Vec<String>, Vec<usize>)> = [
        ("numeric", vec!["ports"]),
        ("draining", vec!["endpoints"]),
        ("published", vec!["endpoints"]),
        ("relabelled", vec!["metadata.labels"]),
        ("zoned", vec!["endpoints"]),
        ("rezoned", vec!["endpoints"]),
    ]
    .into_iter()
    .map(|(service, fields)| {
        let mut fields: Vec<String> = fields.into_iter().map(String::from).collect();
        fields.push(digest());
        (
            format!("{}/{service}", cluster.namespace),
            (fields, vec![0, 1, 0]),
        )
    })
    .chain(SAME.iter().map(|service| {
        // Only the digest, once per slice.
        let slices = versions_of(&before, service).len();
        (
            format!("{}/{service}", cluster.namespace),
            (vec![digest(); slices], vec![0, slices, 0]),
        )
    }))
    .chain([(
        format!("{}/unselected", cluster.namespace),
        (Vec::new(), vec![0, 0, 1]),
    )])
    .collect();
    assert_eq!(diff, expected, "diff before the take-over");

    let ours = Ours::start(testbed, &cluster.namespace, "ours-adopt", SHORT, false).await;
    ours.replica.wait_leading(CONVERGE).await;
    cluster.wait_converged().await;
    // Every Service has been reconciled by now (the queue is empty and each had its turn).
    eventually("every Service reconciled", CONVERGE, || async {
        let reconciled = ours
            .replica
            .metric(
                "external_endpoints_reconcile_duration_seconds_count",
                "outcome=\"Ok\"",
            )
            .await?;
        let depth = ours
            .replica
            .metric("external_endpoints_queue_depth", "")
            .await?;
        let busy = ours
            .replica
            .metric("external_endpoints_queue_in_flight", "")
            .await?;
        if reconciled >= all.len() as f64 && depth == 0.0 && busy == 0.0 {
            Ok(())
        } else {
            Err(format!(
                "{reconciled} reconciled, depth {depth}, in flight {busy}"
            ))
        }
    })
    .await;
    let after = slices_by_name(&cluster).await;

    let mut same_slices = 0.0;
    for service in SAME {
        for name in versions_of(&before, service).into_keys() {
            same_slices += 1.0;
            let (was, now) = (&before[&name], &after[&name]);
            assert_eq!(
                (
                    &now.endpoints,
                    &now.ports,
                    now.labels(),
                    now.owner_references()
                ),
                (
                    &was.endpoints,
                    &was.ports,
                    was.labels(),
                    was.owner_references()
                ),
                "{service}: Linkerd's slice {name} is what ours would write"
            );
            let mut added = now.annotations().clone();
            for key in was.annotations().keys() {
                added.remove(key);
            }
            let added: Vec<&str> = added.keys().map(String::as_str).collect();
            assert_eq!(
                added,
                [
                    slices::LAST_CHANGE_TRIGGER_TIME_ANNOTATION,
                    slices::IDENTITY_DIGEST_ANNOTATION
                ],
                "{service}: only the digest (and the trigger time of the write) added to {name}"
            );
        }
    }
    let writes = |operation: &'static str| {
        let replica = &ours.replica;
        async move {
            replica
                .metric(
                    "external_endpoints_slice_writes_total",
                    &format!("operation=\"{operation}\""),
                )
                .await
                .unwrap()
        }
    };
    assert_eq!(writes("Create").await, 0.0, "no slice created");
    assert_eq!(
        writes("Update").await,
        6.0 + same_slices,
        "one update per differing Service, and one per correct slice (the digest)"
    );
    assert_eq!(
        writes("Delete").await,
        1.0,
        "the unselected Service's slice deleted"
    );

    // Each differing slice is updated in place (same name) and only where it differed.
    let only = |service: &str| {
        let name = versions_of(&before, service).into_keys().next().unwrap();
        (before[&name].clone(), after.get(&name).cloned())
    };
    let (was, now) = only("numeric");
    let now = now.expect("numeric's slice updated in place");
    assert_eq!(now.endpoints, was.endpoints, "numeric: endpoints unchanged");
    let ports: Vec<(Option<i32>, Option<String>)> = now
        .ports
        .iter()
        .flatten()
        .map(|p| (p.port, p.protocol.clone()))
        .collect();
    assert_eq!(
        ports,
        vec![(Some(8080), Some("TCP".into()))],
        "numeric: the port published"
    );

    let (was, now) = only("draining");
    let now = now.expect("draining's slice updated in place");
    let mut expected = conditions(&was);
    expected.insert("drain-1".into(), (Some(false), Some(true), Some(true)));
    assert_eq!(
        conditions(&now),
        expected,
        "draining: only drain-1 is terminating"
    );
    assert_eq!(now.ports, was.ports);

    let (was, now) = only("published");
    let now = now.expect("published's slice updated in place");
    let mut expected = conditions(&was);
    expected.insert("pub-1".into(), (Some(true), Some(false), Some(false)));
    assert_eq!(
        conditions(&now),
        expected,
        "published: the not-ready workload is ready"
    );

    let (was, now) = only("relabelled");
    let now = now.expect("relabelled's slice updated in place");
    let mut labels = was.labels().clone();
    labels.remove("tier");
    assert_eq!(
        now.labels(),
        &labels,
        "relabelled: only the stale label removed"
    );
    assert_eq!(now.endpoints, was.endpoints);

    let (_, now) = only("unselected");
    assert!(now.is_none(), "unselected: the slice is deleted");

    let (was, now) = only("zoned");
    let now = now.expect("zoned's slice updated in place");
    let mut expected = was.endpoints.clone().unwrap_or_default();
    for endpoint in &mut expected {
        assert_eq!(endpoint.hints, None, "Linkerd writes no hints");
        endpoint.hints = Some(EndpointHints {
            for_zones: Some(vec![ForZone {
                name: endpoint.zone.clone().unwrap(),
            }]),
            for_nodes: None,
        });
    }
    assert_eq!(
        now.endpoints.unwrap_or_default(),
        expected,
        "zoned: only the hints added"
    );
    let (was, now) = only("rezoned");
    let now = now.expect("rezoned's slice updated in place");
    let zones = |slice: &EndpointSlice| -> Vec<Option<String>> {
        slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.zone.clone())
            .collect()
    };
    assert_eq!(
        zones(&was),
        vec![Some("zone-a".to_string())],
        "Linkerd's stale zone"
    );
    assert_eq!(
        zones(&now),
        vec![Some("zone-b".to_string())],
        "rezoned: the zone follows"
    );
    assert_eq!(conditions(&now), conditions(&was));
    assert_eq!(now.ports, was.ports);

    release_held(&cluster).await;
}

/// `external-endpoints diff --output json` for `namespace`: per Service, the fields its one
/// update changes, and its numbers of creates, updates and deletes. Asserts exit code 1.
async fn diff(
    testbed: &testbed::Testbed,
    namespace: &str,
) -> BTreeMap<String, (Vec<String>, Vec<usize>)> {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_external-endpoints"));
    command
        .arg("diff")
        .arg("--kubeconfig")
        .arg(testbed.kubeconfig_path())
        .args(["--watch-namespace", namespace, "--output", "json"]);
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "diff: {stderr}");
    let diffs: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    diffs
        .into_iter()
        .map(|d| {
            let count = |key: &str| d[key].as_array().unwrap().len();
            let fields = (d["updates"].as_array().unwrap().iter())
                .flat_map(|u| u["fields"].as_array().unwrap().clone())
                .map(|f| f.as_str().unwrap().to_string())
                .collect();
            let counts = vec![count("creates"), count("updates"), count("deletes")];
            (d["service"].as_str().unwrap().to_string(), (fields, counts))
        })
        .collect()
}
