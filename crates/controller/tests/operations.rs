//! What an operator sees of the real binary on the testbed: Warning Events for workload data
//! that cannot be used, readiness of leader and standby, and the metrics that follow
//! leadership and writes.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod support;

use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::ListParams};
use slices::testing::{Svc, Workload};
use support::{CONVERGE, Cluster, Replica, eventually};

/// A Service whose port targets the workloads' port *named* `http`.
fn web() -> Svc {
    Svc::named("web")
        .selector("app", "web")
        .port("http", 80, "http")
}

fn vm(name: &str, ip: &str) -> Workload {
    Workload::named(name).label("app", "web").ip(ip)
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
    let replica = Replica::start(testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading().await;
    assert_eq!(counter(&replica, INVALID_DATA, UNRESOLVED).await, 0.0);

    cluster.create_service(web()).await;
    cluster
        .apply_workload(vm("vm-1", "10.0.0.1").port("http", 8080).ready())
        .await;
    cluster
        .apply_workload(vm("vm-bad", "10.0.0.2").port("admin", 9000).ready())
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
        .apply_workload(vm("vm-bad", "10.0.0.2").port("admin", 9000).not_ready())
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

#[tokio::test(flavor = "multi_thread")]
async fn leader_and_standby_are_both_ready_once_synced() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "ready").await;
    let a = Replica::start(testbed, &cluster.namespace, "a", &[]).await;
    a.wait_leading().await;
    let b = Replica::start(testbed, &cluster.namespace, "b", &[]).await;

    for replica in [&a, &b] {
        eventually(
            &format!("{} to be ready", replica.identity),
            CONVERGE,
            || async {
                match replica.get("/ready").await? {
                    (200, _) => Ok(()),
                    (status, body) => Err(format!("{status} {body}")),
                }
            },
        )
        .await;
        assert_eq!(replica.get("/live").await.unwrap().0, 200);
    }
    assert!(a.is_leader().await);
    assert!(!b.is_leader().await, "the standby is ready without leading");
    assert_eq!(
        b.metric("external_endpoints_leader_term", "").await,
        Ok(0.0)
    );
    assert_eq!(cluster.lease_holder().await.as_deref(), Some("a"));
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_gauge_moves_to_the_standby_on_graceful_hand_over() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "hand-over").await;
    let mut a = Replica::start(testbed, &cluster.namespace, "a", &[]).await;
    a.wait_leading().await;
    let b = Replica::start(testbed, &cluster.namespace, "b", &[]).await;
    eventually("b to be a ready standby", CONVERGE, || async {
        match b.get("/ready").await?.0 {
            200 => Ok(()),
            status => Err(format!("/ready {status}")),
        }
    })
    .await;
    assert_eq!(b.metric("external_endpoints_leader", "").await, Ok(0.0));
    let acquired = "external_endpoints_leader_acquisitions_total";
    assert_eq!(b.metric(acquired, "").await, Ok(0.0));

    a.terminate();
    assert!(a.wait_exit(CONVERGE).await.success(), "{}", a.log());
    b.wait_leading().await;
    assert_eq!(b.metric(acquired, "").await, Ok(1.0));
    assert!(
        b.metric("external_endpoints_leader_term", "")
            .await
            .unwrap()
            >= 1.0
    );
    assert_eq!(cluster.lease_holder().await.as_deref(), Some("b"));
}

#[tokio::test(flavor = "multi_thread")]
async fn slice_write_counters_follow_creates_updates_and_deletes() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "write-counters").await;
    let replica = Replica::start(testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading().await;
    let writes = "external_endpoints_slice_writes_total";
    let create = "operation=\"Create\"";
    let update = "operation=\"Update\"";
    let delete = "operation=\"Delete\"";
    for operation in [create, update, delete] {
        assert_eq!(
            replica.metric(writes, operation).await,
            Ok(0.0),
            "{operation}"
        );
    }

    cluster.create_service(web()).await;
    cluster
        .apply_workload(vm("vm-1", "10.0.0.1").port("http", 8080).ready())
        .await;
    cluster.wait_converged().await;
    let wait_for = |operation: &'static str, at_least: f64| {
        let replica = &replica;
        async move {
            eventually(&format!("{operation} >= {at_least}"), CONVERGE, || async {
                let value = replica.metric(writes, operation).await?;
                if value >= at_least {
                    Ok(value)
                } else {
                    Err(format!("{operation} {value}"))
                }
            })
            .await
        }
    };
    assert_eq!(wait_for(create, 1.0).await, 1.0);

    // A readiness change updates the slice in place.
    cluster
        .apply_workload(vm("vm-1", "10.0.0.1").port("http", 8080).not_ready())
        .await;
    cluster.wait_converged().await;
    wait_for(update, 1.0).await;

    // A second Service: one more create. Its selector then dropped: its slice is deleted.
    cluster
        .create_service(
            Svc::named("api")
                .selector("app", "web")
                .port("http", 81, 8081),
        )
        .await;
    cluster.wait_converged().await;
    assert_eq!(wait_for(create, 2.0).await, 2.0);
    cluster
        .update_service(Svc::named("api").no_selector().port("http", 81, 8081))
        .await;
    eventually("api's slice to be deleted", CONVERGE, || async {
        match cluster.slices_of("api").await.len() {
            0 => Ok(()),
            n => Err(format!("{n} slices")),
        }
    })
    .await;
    assert_eq!(wait_for(delete, 1.0).await, 1.0);
    assert_eq!(replica.metric(writes, create).await, Ok(2.0));
    let errors = "external_endpoints_slice_write_errors_total";
    assert_eq!(replica.metric(errors, "").await, Ok(0.0));
}
