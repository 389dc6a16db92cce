//! Workload data that cannot be used as given: a named port the workload lacks, an address that
//! is not an IP (let in by a looser CRD), a name that cannot be a hostname. What can be used is
//! still published; each problem is reported by one Warning Event on the Service and counted.

use harness::{CONVERGE, Cluster, Replica, eventually};
use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::ListParams};
use slices::testing::{Svc, Workload, vm, web};

use super::BINARY;

/// A workload [`web`] selects that lacks the port `http` its targetPort names.
fn vm_without_http(name: &str, ip: &str) -> Workload {
    Workload::named(name)
        .label("app", "web")
        .ip(ip)
        .port("admin", 9000)
}

/// Warning Events of the namespace about `service` with `reason`.
async fn events(cluster: &Cluster, service: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some(reason)
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(service)
        })
        .collect()
}

async fn counter(replica: &Replica, name: &str, labels: &str) -> f64 {
    replica.metric(name, labels).await.unwrap()
}

const UNRESOLVED: &str = "reason=\"unresolved_port\"";
const INVALID_DATA: &str = "external_endpoints_invalid_workload_data_total";
const EVENTS_PUBLISHED: &str = "external_endpoints_events_published_total";

#[tokio::test(flavor = "multi_thread")]
async fn unresolved_named_port_is_reported_once_and_other_workloads_still_published() {
    // The CRD admits only IP addresses in workloadIPs (CEL isIP), so of the problems the planner
    // reports, an unresolved named port is the one a valid object can carry.
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "unresolved-port").await;
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;
    assert_eq!(counter(&replica, INVALID_DATA, UNRESOLVED).await, 0.0);

    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    cluster
        .apply_workload(vm_without_http("vm-bad", "10.0.0.2").ready())
        .await;
    cluster.wait_converged().await;

    // vm-1 is published with its resolved port; vm-bad never with the port it lacks.
    let slices = cluster.slices_of("web").await;
    let with_http: Vec<_> = slices
        .iter()
        .filter(|s| {
            (s.ports.iter().flatten())
                .any(|p| p.name.as_deref() == Some("http") && p.port == Some(8080))
        })
        .collect();
    assert_eq!(with_http.len(), 1, "{slices:?}");
    let names: Vec<String> = (with_http[0].endpoints.iter().flatten())
        .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
        .collect();
    assert_eq!(names, ["vm-1"]);

    // One Warning Event on the Service, naming the workload.
    let event = eventually("the Warning Event", CONVERGE, || async {
        match events(&cluster, "web", "UnresolvedWorkloadPort")
            .await
            .as_slice()
        {
            [event] => Ok(event.clone()),
            other => Err(format!("{} events", other.len())),
        }
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let related = event.related.as_ref().and_then(|r| r.name.as_deref());
    assert_eq!(related, Some("vm-bad"));
    let note = event.note.clone().unwrap_or_default();
    assert!(
        note.contains("vm-bad") && note.contains("\"http\""),
        "{note}"
    );
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("linkerd-external-workloads-controller")
    );
    let reported = counter(&replica, INVALID_DATA, UNRESOLVED).await;
    assert!(reported >= 1.0, "{reported}");
    assert_eq!(counter(&replica, EVENTS_PUBLISHED, "").await, 1.0);

    // Touching the workload re-plans the Service and counts the problem again, but within the
    // repeat window publishes no second Event and grows no series.
    cluster
        .apply_workload(vm_without_http("vm-bad", "10.0.0.2").not_ready())
        .await;
    eventually("the problem to be counted again", CONVERGE, || async {
        let now = replica.metric(INVALID_DATA, UNRESOLVED).await?;
        if now > reported {
            Ok(())
        } else {
            Err(format!("still {now}"))
        }
    })
    .await;
    cluster.wait_converged().await;
    let events = events(&cluster, "web", "UnresolvedWorkloadPort").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].series, None,
        "no repeat recorded: {:?}",
        events[0]
    );
    assert_eq!(counter(&replica, EVENTS_PUBLISHED, "").await, 1.0);
    assert_eq!(
        counter(&replica, INVALID_DATA, "reason=\"invalid_ip\"").await,
        0.0
    );
}

/// Drops the CEL checks on `workloadIPs` from the installed CRD, as Linkerd's own CRD has none,
/// and waits until the API server admits a non-IP. Only this test binary's control plane is
/// affected, and no other test here depends on those checks.
async fn loosen_workload_ip_validation(cluster: &Cluster) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{DeleteParams, PostParams};
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let name = "externalworkloads.workload.linkerd.io";
    eventually("the CRD update", CONVERGE, || async {
        let crd = crds.get(name).await.map_err(|e| e.to_string())?;
        let mut value = serde_json::to_value(&crd).map_err(|e| e.to_string())?;
        for version in value["spec"]["versions"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let ips = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["workloadIPs"];
            if let Some(ips) = ips.as_object_mut() {
                ips.remove("x-kubernetes-validations");
            }
            let ip = &mut ips["items"]["properties"]["ip"];
            if let Some(ip) = ip.as_object_mut() {
                ip.remove("x-kubernetes-validations");
            }
        }
        let loose: CustomResourceDefinition =
            serde_json::from_value(value).map_err(|e| e.to_string())?;
        crds.replace(name, &PostParams::default(), &loose)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    // The schema change reaches the serving handlers shortly after; probe until it has.
    eventually("a non-IP to be admitted", CONVERGE, || async {
        let mut probe = vm("probe", "not-an-ip").build();
        probe.metadata.namespace = Some(cluster.namespace.clone());
        probe.metadata.labels = None;
        match cluster
            .workloads()
            .create(&PostParams::default(), &probe)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    cluster
        .workloads()
        .delete("probe", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn non_ip_let_in_by_a_looser_crd_is_skipped_and_reported() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "invalid-ip").await;
    loosen_workload_ip_validation(&cluster).await;
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;

    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    // One usable address and one that is not an IP: the first is published, the second not.
    cluster
        .apply_workload(vm("vm-2", "10.0.0.2").ip("vm-2.example.com"))
        .await;
    cluster.apply_workload(vm("vm-3", "bogus")).await;
    cluster.wait_converged().await;
    let endpoints = cluster.endpoints_of("web").await;
    assert_eq!(endpoints["vm-1"], (vec!["10.0.0.1".to_string()], true));
    assert_eq!(endpoints["vm-2"], (vec!["10.0.0.2".to_string()], true));
    assert!(!endpoints.contains_key("vm-3"), "{endpoints:?}");
    for slice in cluster.slices_of("web").await {
        for endpoint in slice.endpoints.iter().flatten() {
            for address in &endpoint.addresses {
                assert!(address.parse::<std::net::IpAddr>().is_ok(), "{address}");
            }
        }
    }

    let reported = eventually(
        "one InvalidWorkloadIP Event per workload",
        CONVERGE,
        || async {
            let events = events(&cluster, "web", "InvalidWorkloadIP").await;
            let mut related: Vec<String> = events
                .iter()
                .filter_map(|e| e.related.as_ref().and_then(|r| r.name.clone()))
                .collect();
            related.sort();
            if related == ["vm-2", "vm-3"] {
                Ok(events)
            } else {
                Err(format!("related {related:?}"))
            }
        },
    )
    .await;
    for event in &reported {
        assert_eq!(event.type_.as_deref(), Some("Warning"));
    }
    let invalid = counter(&replica, INVALID_DATA, "reason=\"invalid_ip\"").await;
    assert!(invalid >= 2.0, "{invalid}");
    assert_eq!(counter(&replica, EVENTS_PUBLISHED, "").await, 2.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn workload_name_that_cannot_be_a_hostname_is_published_without_one() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "hostname").await;
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;

    // A headless Service names its endpoints after the workloads; `db.vm-2` is a valid object
    // name but not a DNS label.
    cluster
        .create_service(
            Svc::named("db")
                .selector("app", "db")
                .headless()
                .port("sql", 5432, 5432),
        )
        .await;
    let db = |name: &str, ip: &str| Workload::named(name).label("app", "db").ip(ip).ready();
    cluster.apply_workload(db("db-1", "10.0.3.1")).await;
    cluster.apply_workload(db("db.vm-2", "10.0.3.2")).await;
    cluster.wait_converged().await;

    let hostnames: std::collections::BTreeMap<String, Option<String>> = cluster
        .slices_of("db")
        .await
        .into_iter()
        .flat_map(|slice| slice.endpoints.unwrap_or_default())
        .map(|e| {
            let name = e.target_ref.and_then(|r| r.name).unwrap_or_default();
            (name, e.hostname)
        })
        .collect();
    assert_eq!(hostnames["db-1"].as_deref(), Some("db-1"));
    assert_eq!(hostnames["db.vm-2"], None, "published, without a hostname");

    let event = eventually("the InvalidWorkloadHostname Event", CONVERGE, || async {
        match events(&cluster, "db", "InvalidWorkloadHostname")
            .await
            .as_slice()
        {
            [event] => Ok(event.clone()),
            other => Err(format!("{} events", other.len())),
        }
    })
    .await;
    let related = event.related.as_ref().and_then(|r| r.name.as_deref());
    assert_eq!(related, Some("db.vm-2"));
    let reason = "reason=\"invalid_hostname\"";
    assert!(counter(&replica, INVALID_DATA, reason).await >= 1.0);
}
