//! What an operator sees of the real binary on the testbed: Warning Events for workload data
//! that cannot be used, readiness of leader and standby, and the metrics that follow
//! leadership and writes.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

#[path = "operations/workload_data.rs"]
mod workload_data;

use harness::{CONVERGE, Cluster, Replica, eventually};
use slices::testing::{Svc, vm, web};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

#[tokio::test(flavor = "multi_thread")]
async fn leader_and_standby_are_both_ready_once_synced() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "ready").await;
    let a = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    a.wait_leading(CONVERGE).await;
    let b = Replica::start(BINARY, testbed, &cluster.namespace, "b", &[]).await;

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
    let mut a = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    a.wait_leading(CONVERGE).await;
    let b = Replica::start(BINARY, testbed, &cluster.namespace, "b", &[]).await;
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
    b.wait_leading(CONVERGE).await;
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
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;
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
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
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
        .apply_workload(vm("vm-1", "10.0.0.1").not_ready())
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

/// The cumulative buckets of the sync latency histogram: (upper bound as served, count).
fn sync_buckets(body: &str) -> Vec<(String, f64)> {
    let prefix = "external_endpoints_sync_latency_seconds_bucket{le=\"";
    body.lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .filter_map(|rest| {
            let (bound, value) = rest.split_once("\"} ")?;
            Some((bound.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// One workload change is one observation of `external_endpoints_sync_latency_seconds`, in a
/// bucket no later than the time the test itself saw pass from sending the change to seeing
/// the slice converged (the controller's trigger comes after the change was sent, its write's
/// answer before the test sees the slice); the slice's trigger-time annotation lies in the same
/// window.
#[tokio::test(flavor = "multi_thread")]
async fn one_change_is_one_sync_latency_observation_in_a_bucket_the_test_can_vouch_for() {
    use k8s_openapi::jiff::Timestamp;
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "sync-latency").await;
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;
    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    cluster.wait_converged().await;
    let count = "external_endpoints_sync_latency_seconds_count";
    // Every write of the set-up has been answered once the cache shows it: wait until the count
    // is steady at the one create.
    let before = eventually("the create observed", CONVERGE, || async {
        let (_, body) = replica.get("/metrics").await?;
        match harness::sum_metric(&body, count, "") {
            Some(n) if n >= 1.0 => Ok(body),
            other => Err(format!("{count}: {other:?}")),
        }
    })
    .await;

    let sent_at = Timestamp::now();
    let sent = tokio::time::Instant::now();
    cluster
        .apply_workload(vm("vm-1", "10.0.0.1").not_ready())
        .await;
    cluster.wait_converged().await;
    let window = sent.elapsed().as_secs_f64();
    let seen_at = Timestamp::now();
    let after = eventually("one more observation", CONVERGE, || async {
        let (_, body) = replica.get("/metrics").await?;
        let n = harness::sum_metric(&body, count, "").unwrap_or(0.0);
        let was = harness::sum_metric(&before, count, "").unwrap_or(0.0);
        if n > was {
            Ok(body)
        } else {
            Err(format!("{count} still {n}"))
        }
    })
    .await;
    let was = harness::sum_metric(&before, count, "").unwrap();
    assert_eq!(
        harness::sum_metric(&after, count, "").unwrap() - was,
        1.0,
        "one change, one reconcile that wrote, one observation"
    );
    // The bucket the new observation fell in: the first whose count grew.
    let (old, new) = (sync_buckets(&before), sync_buckets(&after));
    assert_eq!(old.len(), new.len());
    assert!(new.len() >= 16, "buckets resolving 5 ms to 60 s: {new:?}");
    let (bound, _) = old
        .iter()
        .zip(&new)
        .find(|((_, a), (_, b))| b > a)
        .map(|(_, n)| n.clone())
        .expect("a bucket grew");
    let lower = new
        .iter()
        .take_while(|(b, _)| *b != bound)
        .last()
        .map_or(0.0, |(b, _)| b.parse::<f64>().unwrap());
    assert!(
        bound != "+Inf" && lower <= window,
        "observed in the bucket ({lower}, {bound}] s; the test saw the change published within {window:.3} s"
    );
    let slices = cluster.slices_of("web").await;
    let annotation = slices[0]
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(slices::LAST_CHANGE_TRIGGER_TIME_ANNOTATION))
        .expect("a trigger time on the written slice");
    let trigger: Timestamp = annotation.parse().unwrap();
    assert!(
        sent_at <= trigger && trigger <= seen_at,
        "trigger time {trigger} outside the change's window {sent_at} .. {seen_at}"
    );
}

/// docs/operations.md lists every metric a replica serves, by the name a query uses
/// (`_total` for counters), and no metric that does not exist.
#[tokio::test(flavor = "multi_thread")]
async fn operations_guide_lists_every_metric_served() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "metric-docs").await;
    let replica = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    replica.wait_leading(CONVERGE).await;
    // The reconcile histogram has no series (and no TYPE line) before the first reconcile.
    cluster.create_service(web()).await;
    let reconciled = "external_endpoints_reconcile_duration_seconds_count";
    let body = eventually("a reconcile", CONVERGE, || async {
        let (_, body) = replica.get("/metrics").await?;
        match harness::sum_metric(&body, reconciled, "") {
            Some(count) if count >= 1.0 => Ok(body),
            other => Err(format!("{reconciled}: {other:?}")),
        }
    })
    .await;
    let served: std::collections::BTreeSet<String> = body
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| {
            let (family, kind) = line.split_once(' ')?;
            Some(match kind {
                "counter" => format!("{family}_total"),
                _ => family.to_string(),
            })
        })
        .collect();
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
    )
    .unwrap();
    let documented: std::collections::BTreeSet<String> = guide
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|code| {
            (code.starts_with("external_endpoints_") || code.starts_with("process_"))
                && code.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(str::to_string)
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&served).collect();
    assert!(missing.is_empty(), "served but not documented: {missing:?}");
    assert!(unknown.is_empty(), "documented but not served: {unknown:?}");
}

/// The contrast to `leader_and_standby_are_both_ready_once_synced`: a replica whose caches cannot
/// sync (its API server is a closed port) is live but not ready, and does not lead.
#[tokio::test(flavor = "multi_thread")]
async fn replica_that_cannot_sync_is_live_but_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = harness::closed_port_kubeconfig(dir.path());
    let replica = Replica::start_with(BINARY, &kubeconfig, "unsynced", &[]).await;
    // Several scrapes over the watches' first retries: never ready, always live.
    for _ in 0..5 {
        assert_eq!(replica.get("/live").await.unwrap().0, 200);
        assert_eq!(replica.get("/ready").await.unwrap().0, 503);
        assert_eq!(
            replica.metric("external_endpoints_leader", "").await,
            Ok(0.0)
        );
    }
    eventually("watch errors to be counted", CONVERGE, || async {
        match replica
            .metric("external_endpoints_watch_errors_total", "")
            .await?
        {
            errors if errors >= 1.0 => Ok(()),
            errors => Err(format!("{errors}")),
        }
    })
    .await;
    assert_eq!(replica.get("/ready").await.unwrap().0, 503);
}
