//! A server that pushes back (issue 34): API Priority and Fairness limits the controller's user
//! on the real kube-apiserver, and the controller backs off (its 429s are held until their
//! Retry-After and sent again, through the fence; no failed reconcile, no lost change), then
//! recovers when the limit lifts.
//!
//! The testbed's users are in `system:masters`, which the mandatory `exempt` FlowSchema never
//! limits. The controller here runs as its own user, `apf-controller` (the admin's kubeconfig,
//! impersonating it; APF classifies the impersonated user), bound to `cluster-admin`. A
//! FlowSchema sends its requests for Services, workloads, slices and Events (not its Lease,
//! which this test does not mean to starve) to a PriorityLevelConfiguration of one share (3
//! seats of the server's 600, no borrowing) that rejects what exceeds it with 429.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{path::PathBuf, time::Duration};

use harness::{CONVERGE, Cluster, Replica, eventually, fixtures};
use k8s_openapi::api::{
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    config::Kubeconfig,
};
use slices::testing::Workload;
use tokio::time::Instant;

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// The controller's user.
const USER: &str = "apf-controller";

const SERVICES: usize = 20;
const PER_SERVICE: usize = 3;

/// Publishing under a limit of 3 seats takes longer than [`CONVERGE`] allows a free server.
const THROTTLED: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn apf_throttled_controller_backs_off_and_recovers() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "apf").await;
    let name = format!("apf-{}", cluster.namespace);
    let _cleanup = Cleanup {
        client: cluster.client.clone(),
        name: name.clone(),
    };
    grant_cluster_admin(&cluster.client, &name).await;
    limit_user(&cluster.client, &name, 1).await;
    fixtures::populate(
        &cluster.client,
        &cluster.namespace,
        SERVICES,
        PER_SERVICE,
        Instant::now(),
    )
    .await;
    let folder = tempfile::tempdir().unwrap();
    let kubeconfig = impersonating(testbed.kubeconfig_path(), folder.path().join("kubeconfig"));
    let replica = Replica::start_with(
        BINARY,
        &kubeconfig,
        "apf-a",
        &harness::replica::e2e_args(&cluster.namespace, &[]),
    )
    .await;
    replica.wait_leading(CONVERGE).await;

    // Under the limit: the initial publish, then rounds of a change to every Service (each
    // round's slice updates come as a burst) until the server has pushed back: how many
    // rounds it takes to exceed three seats depends on how fast this machine answers.
    eventually("slices to converge while throttled", THROTTLED, || {
        cluster.converged()
    })
    .await;
    let mut round = 0;
    let throttled = eventually("the API server to push back", THROTTLED, || {
        round += 1;
        let (cluster, replica, round) = (&cluster, &replica, round);
        async move {
            move_every_workload(cluster, round).await;
            eventually(
                "a change to every Service, published while throttled",
                THROTTLED,
                || cluster.converged(),
            )
            .await;
            let metrics = replica.metrics().await?;
            if metrics.sum("external_endpoints_write_throttled_total", "") > 0.0 {
                Ok(metrics)
            } else {
                Err(format!(
                    "no 429 after {round} rounds; log:\n{}",
                    replica.log_tail(40)
                ))
            }
        }
    })
    .await;
    assert!(
        throttled.sum(
            "external_endpoints_write_limit_changes_total",
            "reason=\"throttled\""
        ) > 0.0,
        "a 429 shrank the limit"
    );
    // Backed off, no error storm: no write failed, no reconcile failed.
    assert_eq!(
        throttled.sum("external_endpoints_slice_write_errors_total", ""),
        0.0
    );
    assert_eq!(
        throttled.sum(
            "external_endpoints_reconcile_duration_seconds_count",
            "outcome=\"Error\""
        ),
        0.0,
        "a 429 is waited out, not a failed reconcile"
    );

    // The limit lifts: a round of changes is published with no 429, and the writes in flight
    // are back at least at the limit's starting value (4), grown by steady answers (how far
    // depends on how many calls a round keeps in flight: the rise itself is shown in paused
    // time by `cluster::limit`'s tests). The limit may have grown back already before this
    // point, between the throttled bursts.
    limit_user(&cluster.client, &name, 1000).await;
    eventually(
        "the limit to be back with steady answers",
        THROTTLED,
        || {
            round += 1;
            let (cluster, replica) = (&cluster, &replica);
            async move {
                let before = replica.metrics().await?;
                move_every_workload(cluster, round).await;
                eventually("the change to be published", THROTTLED, || {
                    cluster.converged()
                })
                .await;
                let metrics = replica.metrics().await?;
                let limit = metrics.sum("external_endpoints_write_limit", "");
                let grown = metrics.sum(
                    "external_endpoints_write_limit_changes_total",
                    "reason=\"steady\"",
                );
                let throttled_in_round = metrics.sum("external_endpoints_write_throttled_total", "")
                    - before.sum("external_endpoints_write_throttled_total", "");
                if limit >= 4.0 && grown > 0.0 && throttled_in_round == 0.0 {
                    Ok(())
                } else {
                    Err(format!(
                        "limit {limit}, steady rises {grown}, 429s in the round {throttled_in_round}"
                    ))
                }
            }
        },
    )
    .await;
    let after = replica.metrics().await.unwrap();
    let figure = |metrics: &harness::Metrics, name: &str, labels: &str| metrics.sum(name, labels);
    eprintln!(
        "apf: while limited: {} throttled, limit {} ({} halvings); after the lift: limit {}, {} throttled in all",
        figure(&throttled, "external_endpoints_write_throttled_total", ""),
        figure(&throttled, "external_endpoints_write_limit", ""),
        figure(
            &throttled,
            "external_endpoints_write_limit_changes_total",
            "reason=\"throttled\""
        ),
        figure(&after, "external_endpoints_write_limit", ""),
        figure(&after, "external_endpoints_write_throttled_total", ""),
    );
    assert_eq!(
        after.sum("external_endpoints_slice_write_errors_total", ""),
        0.0
    );
    assert_eq!(
        after.sum(
            "external_endpoints_reconcile_duration_seconds_count",
            "outcome=\"Error\""
        ),
        0.0
    );
}

/// Moves every workload to a new address (one slice update per Service), all at once.
async fn move_every_workload(cluster: &Cluster, round: usize) {
    let moves = (0..SERVICES).flat_map(|i| (0..PER_SERVICE).map(move |j| (i, j)));
    futures::future::join_all(moves.map(|(i, j)| {
        let n = i * PER_SERVICE + j;
        let ip = format!("10.{}.{}.{}", 100 + round % 100, n / 256, n % 256);
        let workload = Workload::named(&format!("svc-{i}-vm-{j}"))
            .label("app", &format!("svc-{i}"))
            .ip(&ip)
            .port("http", 8080);
        cluster.apply_workload(workload)
    }))
    .await;
}

/// Binds `cluster-admin` to [`USER`].
async fn grant_cluster_admin(client: &Client, name: &str) {
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER }],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Sends [`USER`]'s requests for everything but its Lease to a priority level of `shares`
/// (1: 3 seats of 600, rejecting what exceeds them), created or updated.
async fn limit_user(client: &Client, name: &str, shares: i32) {
    let level: PriorityLevelConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": { "name": name },
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": shares,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": { "type": "Reject" },
            },
        },
    }))
    .unwrap();
    let schema: FlowSchema = serde_json::from_value(serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": { "name": name },
        "spec": {
            "priorityLevelConfiguration": { "name": name },
            "matchingPrecedence": 500,
            "distinguisherMethod": { "type": "ByUser" },
            "rules": [{
                "subjects": [{ "kind": "User", "user": { "name": USER } }],
                "resourceRules": [{
                    "verbs": ["*"],
                    "apiGroups": ["", "discovery.k8s.io", "workload.linkerd.io", "events.k8s.io"],
                    "resources": ["*"],
                    "namespaces": ["*"],
                }],
            }],
        },
    }))
    .unwrap();
    let apply = PatchParams::apply("apf-test").force();
    Api::<PriorityLevelConfiguration>::all(client.clone())
        .patch(name, &apply, &Patch::Apply(&level))
        .await
        .unwrap();
    Api::<FlowSchema>::all(client.clone())
        .patch(name, &apply, &Patch::Apply(&schema))
        .await
        .unwrap();
}

/// The admin's kubeconfig at `admin`, acting as [`USER`], written to `path`.
fn impersonating(admin: &std::path::Path, path: PathBuf) -> PathBuf {
    let mut kubeconfig = Kubeconfig::read_from(admin).unwrap();
    for user in &mut kubeconfig.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.impersonate = Some(USER.into());
        }
    }
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

/// Removes the cluster-scoped objects of the test (the namespace goes with the testbed).
struct Cleanup {
    client: Client,
    name: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        // Best effort, on the test's runtime: the testbed may be shared by other tests, whose
        // requests these objects do not match anyway (they name this test's user only).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let params = DeleteParams::default();
                let _ = Api::<FlowSchema>::all(client.clone())
                    .delete(&name, &params)
                    .await;
                let _ = Api::<PriorityLevelConfiguration>::all(client.clone())
                    .delete(&name, &params)
                    .await;
                let _ = Api::<ClusterRoleBinding>::all(client)
                    .delete(&name, &params)
                    .await;
            });
        }
    }
}
