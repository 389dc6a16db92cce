//! End-to-end: the real `external-endpoints` binary, as separate processes, against a real
//! kube-apiserver + etcd (the testbed). Slices are checked against the planner's view of the
//! objects in the API, waiting on conditions with a timeout.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{CONVERGE, Cluster, Replica, eventually};
use k8s_openapi::{
    api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use kube::api::{DeleteParams, PostParams};
use slices::testing::{self, Svc, Workload, vm};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// [`testing::web`], labelled `team=payments` (the labels the slices copy).
fn web() -> Svc {
    testing::web().label("team", "payments")
}

#[tokio::test(flavor = "multi_thread")]
async fn slices_follow_services_and_workloads() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let (cluster, _replica) = led_by_a(testbed, "lifecycle").await;

    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    cluster
        .apply_workload(vm("vm-2", "10.0.0.2").not_ready())
        .await;
    cluster.wait_converged().await;
    let endpoints = cluster.endpoints_of("web").await;
    assert_eq!(endpoints["vm-1"], (vec!["10.0.0.1".to_string()], true));
    assert_eq!(endpoints["vm-2"], (vec!["10.0.0.2".to_string()], false));
    let slice = &cluster.slices_of("web").await[0];
    assert_eq!(slice.labels_ref("team"), Some("payments"));
    let port = &slice.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port),
        (Some("http"), Some(8080))
    );

    // Readiness, IP and label changes.
    cluster.apply_workload(vm("vm-2", "10.0.0.22")).await;
    cluster.wait_converged().await;
    assert_eq!(
        cluster.endpoints_of("web").await["vm-2"],
        (vec!["10.0.0.22".to_string()], true)
    );
    cluster
        .update_service(web().label("team", "checkout"))
        .await;
    cluster.wait_converged().await;
    assert_eq!(
        cluster.slices_of("web").await[0].labels_ref("team"),
        Some("checkout")
    );

    // A deleted workload leaves the slice; a workload whose labels stop matching too.
    cluster.delete_workload("vm-1").await;
    cluster.wait_converged().await;
    assert!(!cluster.endpoints_of("web").await.contains_key("vm-1"));

    // A Service that loses its selector loses its slices.
    cluster.update_service(web().no_selector()).await;
    wait_no_slices(&cluster, "web's slices to be deleted").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_last_workload_leaves_one_empty_placeholder_slice() {
    // Issue 37: deleting the last slice made Linkerd's destination service look the deleted
    // workload up, fail, and keep sending its address. The Service keeps its slice, emptied.
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let (cluster, replica) = led_by_a(testbed, "placeholder").await;
    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    cluster.wait_converged().await;
    let before = cluster.slices_of("web").await;
    assert_eq!(before.len(), 1, "one slice for vm-1");

    cluster.delete_workload("vm-1").await;
    let placeholder = eventually("web's slice to be emptied", CONVERGE, || async {
        match cluster.slices_of("web").await.as_slice() {
            [slice] if slice.endpoints.as_deref().unwrap_or_default().is_empty() => {
                Ok(slice.clone())
            }
            other => Err(format!("{other:#?}")),
        }
    })
    .await;
    cluster.wait_converged().await;
    wait_idle(&replica).await;

    assert_eq!(
        placeholder.metadata.name, before[0].metadata.name,
        "the same slice, updated in place"
    );
    assert_eq!(placeholder.ports.as_deref().unwrap_or_default(), []);
    assert!(
        placeholder
            .annotations()
            .contains_key(slices::IDENTITY_DIGEST_ANNOTATION)
    );
    let metrics = replica.metrics().await.unwrap();
    assert_eq!(metrics.writes_of("Delete"), 0.0, "nothing deleted");
    assert_eq!(
        cluster.slices_of("web").await,
        [placeholder],
        "the placeholder stays"
    );

    // The Service stops being ours: the placeholder goes.
    cluster.update_service(web().no_selector()).await;
    wait_no_slices(&cluster, "the placeholder to be deleted").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_identity_change_rewrites_the_slice_digest_once() {
    // Issue 37: Linkerd's destination service copies a workload's identity when it reads a
    // slice; only a rewritten slice makes it read the new one.
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let (cluster, replica) = led_by_a(testbed, "identity").await;
    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    cluster.apply_workload(vm("vm-2", "10.0.0.2")).await;
    cluster.wait_converged().await;
    wait_idle(&replica).await;
    let digest = |slice: &k8s_openapi::api::discovery::v1::EndpointSlice| {
        slice
            .annotations()
            .get(slices::IDENTITY_DIGEST_ANNOTATION)
            .cloned()
    };
    let before = cluster.slices_of("web").await;
    assert_eq!(before.len(), 1);
    let metrics = replica.metrics().await.unwrap();
    let (writes_before, updates_before) = (metrics.writes(), metrics.writes_of("Update"));

    cluster
        .apply_workload(vm("vm-1", "10.0.0.1").identity("vm-1.rotated.identity.linkerd.local"))
        .await;
    let after = eventually("the digest to change", CONVERGE, || async {
        let slices = cluster.slices_of("web").await;
        match slices.as_slice() {
            [slice] if digest(slice) != digest(&before[0]) => Ok(slice.clone()),
            other => Err(format!("{other:#?}")),
        }
    })
    .await;
    cluster.wait_converged().await;
    wait_idle(&replica).await;

    assert!(digest(&after).is_some());
    assert_eq!(
        after.endpoints, before[0].endpoints,
        "the endpoints did not change"
    );
    let metrics = replica.metrics().await.unwrap();
    assert_eq!(metrics.writes() - writes_before, 1.0, "exactly one write");
    assert_eq!(
        metrics.writes_of("Update") - updates_before,
        1.0,
        "an update"
    );

    // A pass with nothing a consumer copies changed writes nothing: every workload is ready, so
    // publishNotReadyAddresses changes the cached Service (a new pass) but no endpoint.
    let reconciles = metrics.reconciles();
    cluster.update_service(web().publish_not_ready()).await;
    eventually("the Service to be reconciled again", CONVERGE, || async {
        let now = replica.metrics().await?;
        if now.reconciles() > reconciles && now.queue_depth() == 0.0 && now.in_flight() == 0.0 {
            Ok(())
        } else {
            Err(format!("{} reconciles", now.reconciles()))
        }
    })
    .await;
    assert_eq!(
        replica.metrics().await.unwrap().writes() - writes_before,
        1.0,
        "no further write"
    );
    assert_eq!(cluster.slices_of("web").await, [after]);
}

/// A fresh namespace for the test `test`, and replica "a" watching it, once "a" leads.
async fn led_by_a(testbed: &testbed::Testbed, test: &str) -> (Cluster, Replica) {
    let cluster = Cluster::new(testbed, test).await;
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;
    (cluster, replica)
}

/// Waits until `web` has no slice left; `what` names the wait.
async fn wait_no_slices(cluster: &Cluster, what: &str) {
    eventually(what, CONVERGE, || async {
        match cluster.slices_of("web").await.len() {
            0 => Ok(()),
            n => Err(format!("{n} slices left")),
        }
    })
    .await;
}

/// Another client deletes every slice of `web`.
async fn delete_web_slices(cluster: &Cluster) {
    for slice in cluster.slices_of("web").await {
        cluster
            .slices_api()
            .delete(&slice.name_any(), &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// Starts replica `identity`, which finds the slices correct: once it leads and has checked
/// every Service, asserts that it wrote nothing.
async fn start_finding_nothing_to_write(
    testbed: &testbed::Testbed,
    cluster: &Cluster,
    identity: &str,
) -> Replica {
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, identity, &[]).await;
    replica.wait_leading(CONVERGE).await;
    let what = format!("{identity} to check every Service");
    eventually(&what, CONVERGE, || async {
        let adds = replica
            .metric("external_endpoints_queue_adds_total", "")
            .await?;
        let depth = replica.metric("external_endpoints_queue_depth", "").await?;
        if adds >= 1.0 && depth == 0.0 {
            Ok(())
        } else {
            Err(format!("adds {adds}, depth {depth}"))
        }
    })
    .await;
    assert_eq!(
        replica
            .metric("external_endpoints_slice_writes_total", "")
            .await
            .unwrap(),
        0.0,
        "{identity} wrote nothing"
    );
    replica
}

/// Waits until `replica` has nothing queued or in flight.
async fn wait_idle(replica: &Replica) {
    eventually("the queue to be idle", CONVERGE, || async {
        let metrics = replica.metrics().await?;
        if metrics.queue_depth() == 0.0 && metrics.in_flight() == 0.0 {
            Ok(())
        } else {
            Err(format!(
                "depth {}, in flight {}",
                metrics.queue_depth(),
                metrics.in_flight()
            ))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reacquired_leader_recreates_slices_deleted_while_following() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "stale-tracker").await;
    cluster.create_service(web()).await;
    cluster
        .create_service(
            Svc::named("api")
                .selector("app", "api")
                .port("http", 80, 8080),
        )
        .await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    cluster.apply_workload(vm("vm-2", "10.0.0.2")).await;
    cluster
        .apply_workload(
            Workload::named("api-1")
                .label("app", "api")
                .ip("10.0.1.1")
                .ready(),
        )
        .await;

    // A leads and writes the slices (term 1 records them in its tracker).
    let a = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    a.wait_leading(CONVERGE).await;
    cluster.wait_converged().await;

    // A loses the lease: another identity takes it through the API.
    take_lease(&cluster, "intruder").await;
    eventually("a to step down", CONVERGE, || async {
        if a.is_leader().await {
            Err("still leading".to_string())
        } else {
            Ok(())
        }
    })
    .await;

    // Meanwhile a third client deletes web's slice and edits api's.
    delete_web_slices(&cluster).await;
    let slices = cluster.slices_api();
    let mut edited = cluster.slices_of("api").await.remove(0);
    edited.endpoints = Some(Vec::new());
    slices
        .replace(&edited.name_any(), &PostParams::default(), &edited)
        .await
        .unwrap();
    assert!(
        cluster.converged().await.is_err(),
        "the edits must be visible"
    );
    assert!(
        cluster.slices_of("web").await.is_empty(),
        "a follower must not write"
    );

    // A leads again: the replayed adds must rewrite both Services' slices.
    release_lease(&cluster).await;
    a.wait_leading(CONVERGE).await;
    cluster.wait_converged().await;
    assert_eq!(cluster.endpoints_of("web").await.len(), 2);
    assert_eq!(cluster.endpoints_of("api").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn managed_slice_deleted_by_another_client_is_recreated_by_a_new_term() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "recreate").await;
    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;

    let mut a = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    a.wait_leading(CONVERGE).await;
    cluster.wait_converged().await;

    // Graceful exit: drains, releases the Lease, exits 0.
    a.terminate();
    assert!(a.wait_exit(CONVERGE).await.success(), "{}", a.log());
    assert_eq!(cluster.lease_holder().await, None, "the lease is released");

    // B's first term never wrote these slices; they are correct, so it writes nothing.
    let b = start_finding_nothing_to_write(testbed, &cluster, "b").await;

    // Someone else deletes the slice: B re-creates it.
    delete_web_slices(&cluster).await;
    cluster.wait_converged().await;
    assert_eq!(cluster.slices_of("web").await.len(), 1);
    let creates = b
        .metric(
            "external_endpoints_slice_writes_total",
            "operation=\"Create\"",
        )
        .await
        .unwrap();
    assert_eq!(creates, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn zone_hints_follow_traffic_distribution_and_workload_zones() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let (cluster, replica) = led_by_a(testbed, "zone-hints").await;

    // The API server (1.37, the field is GA) keeps trafficDistribution as sent.
    let created = cluster
        .create_service(web().traffic_distribution("PreferSameZone"))
        .await;
    assert_eq!(
        created.spec.and_then(|s| s.traffic_distribution).as_deref(),
        Some("PreferSameZone")
    );
    cluster
        .apply_workload(vm("vm-a", "10.0.0.1").zone("zone-a"))
        .await;
    cluster
        .apply_workload(vm("vm-b", "10.0.0.2").zone("zone-b"))
        .await;
    // No zone label: no hint for it, and the others keep theirs (docs/slices.md).
    cluster.apply_workload(vm("vm-nowhere", "10.0.0.3")).await;
    wait_hints(
        &cluster,
        &[
            ("vm-a", Some("zone-a")),
            ("vm-b", Some("zone-b")),
            ("vm-nowhere", None),
        ],
    )
    .await;
    cluster.wait_converged().await;

    // A workload moves zone: its hint follows.
    cluster
        .apply_workload(vm("vm-a", "10.0.0.1").zone("zone-b"))
        .await;
    wait_hints(
        &cluster,
        &[
            ("vm-a", Some("zone-b")),
            ("vm-b", Some("zone-b")),
            ("vm-nowhere", None),
        ],
    )
    .await;

    cluster.wait_converged().await;

    // A new leader finds the hinted slices correct and writes nothing (its cache keeps hints).
    let mut replica = replica;
    replica.terminate();
    assert!(
        replica.wait_exit(CONVERGE).await.success(),
        "{}",
        replica.log()
    );
    let _b = start_finding_nothing_to_write(testbed, &cluster, "b").await;

    // The field removed: every hint goes.
    cluster.update_service(web()).await;
    wait_hints(
        &cluster,
        &[("vm-a", None), ("vm-b", None), ("vm-nowhere", None)],
    )
    .await;
    cluster.wait_converged().await;
}

/// Waits until the endpoints of `web`'s slices carry exactly these zone hints (`None`: no
/// hints object at all), read from the API.
async fn wait_hints(cluster: &Cluster, expected: &[(&str, Option<&str>)]) {
    let expected: BTreeMap<String, Option<Vec<String>>> = expected
        .iter()
        .map(|(name, zone)| (name.to_string(), zone.map(|z| vec![z.to_string()])))
        .collect();
    eventually("zone hints", CONVERGE, || async {
        let mut actual = BTreeMap::new();
        for slice in cluster.slices_of("web").await {
            for endpoint in slice.endpoints.unwrap_or_default() {
                let name = endpoint.target_ref.and_then(|r| r.name).unwrap_or_default();
                let hints = endpoint.hints.map(|h| {
                    assert!(h.for_nodes.is_none(), "no node hints: {h:?}");
                    h.for_zones
                        .unwrap_or_default()
                        .into_iter()
                        .map(|z| z.name)
                        .collect::<Vec<_>>()
                });
                actual.insert(name, hints);
            }
        }
        if actual == expected {
            Ok(())
        } else {
            Err(format!("hints {actual:?}"))
        }
    })
    .await;
}

/// Takes the e2e Lease for `holder` through the API, as another controller would.
async fn take_lease(cluster: &Cluster, holder: &str) {
    update_lease(cluster, |lease| {
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.to_string());
        spec.lease_duration_seconds = Some(3600);
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    })
    .await;
}

/// Clears the holder, as a graceful release does.
async fn release_lease(cluster: &Cluster) {
    update_lease(cluster, |lease| {
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
    })
    .await;
}

async fn update_lease(cluster: &Cluster, change: impl Fn(&mut Lease)) {
    let leases = cluster.leases();
    eventually("the lease update", Duration::from_secs(10), || async {
        let mut lease = leases
            .get(harness::LEASE)
            .await
            .map_err(|e| e.to_string())?;
        change(&mut lease);
        leases
            .replace(harness::LEASE, &PostParams::default(), &lease)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
}

trait LabelsRef {
    fn labels_ref(&self, key: &str) -> Option<&str>;
}

impl LabelsRef for k8s_openapi::api::discovery::v1::EndpointSlice {
    fn labels_ref(&self, key: &str) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
    }
}

use kube::ResourceExt;
