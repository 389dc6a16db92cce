//! Fencing the API server enforces (deploy/fencing.yaml) on a real kube-apiserver: the policy
//! refuses EndpointSlice writes of every replica but the Lease's holder, lets other users
//! through, follows the Lease when it moves, and what it costs per write.
//!
//! The testbed's users are client certificates (no bound ServiceAccount token, so no pod-name
//! extra): the policy compares their user names with the holder, the path a client without a
//! bound token takes. The policy is the one in `deploy/`, with its match condition pointed at
//! this test's users and its binding at this test's namespace and Lease.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::time::Duration;

use harness::{CONVERGE, Cluster, eventually, fencing};
use k8s_openapi::{
    api::{coordination::v1::Lease, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams},
};
use leadership::is_fencing_policy_denial;
use tokio::time::Instant;

/// The replicas' user names, which are also their Lease identities.
const REPLICA_A: &str = "fencing-a";
const REPLICA_B: &str = "fencing-b";
const LEASE: &str = "fencing-lease";

async fn install_policy(client: &Client, namespace: &str) {
    fencing::install_policy(client, namespace, LEASE, &[REPLICA_A, REPLICA_B]).await;
}

async fn client_as(testbed: &testbed::Testbed, user: &str) -> Client {
    fencing::client_as(testbed, user).await
}

async fn set_holder(cluster: &Cluster, holder: &str) {
    let leases = cluster.leases();
    let mut lease = match leases.get_opt(LEASE).await.unwrap() {
        Some(lease) => lease,
        None => Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.into()),
                ..ObjectMeta::default()
            },
            ..Lease::default()
        },
    };
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some(holder.into());
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    if lease.metadata.resource_version.is_some() {
        leases
            .replace(LEASE, &PostParams::default(), &lease)
            .await
            .unwrap();
    } else {
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
}

fn slice(name: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        ..EndpointSlice::default()
    }
}

/// Creates slice `name` as `client`, or the refusal.
async fn create(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<EndpointSlice, kube::Error> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    slices.create(&PostParams::default(), &slice(name)).await
}

/// Replaces slice `name` as `client` with its current version plus a label change.
async fn update(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<EndpointSlice, kube::Error> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let mut current = slices.get(name).await?;
    let round = current
        .labels()
        .get("round")
        .and_then(|r| r.parse::<u64>().ok())
        .unwrap_or(0);
    current
        .labels_mut()
        .insert("round".into(), (round + 1).to_string());
    slices.replace(name, &PostParams::default(), &current).await
}

async fn delete(client: &Client, namespace: &str, name: &str) -> Result<(), kube::Error> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    slices
        .delete(name, &DeleteParams::default())
        .await
        .map(|_| ())
}

/// Replica A's and replica B's clients, with A holding the Lease and the fencing policy
/// installed for `cluster`'s namespace (the API server may not enforce it yet: see
/// [`wait_until_in_force`]).
async fn clients_with_a_holding(testbed: &testbed::Testbed, cluster: &Cluster) -> (Client, Client) {
    let (a, b) = (
        client_as(testbed, REPLICA_A).await,
        client_as(testbed, REPLICA_B).await,
    );
    set_holder(cluster, REPLICA_A).await;
    install_policy(&cluster.client, &cluster.namespace).await;
    (a, b)
}

/// Waits until the API server enforces the policy in `cluster`'s namespace: it refuses a probe
/// slice created by the non-holder `b` (a probe it lets through is deleted again). `what`
/// names the wait.
async fn wait_until_in_force(cluster: &Cluster, b: &Client, what: &str) {
    let ns = &cluster.namespace;
    eventually(what, CONVERGE, || async {
        match create(b, ns, "probe").await {
            Err(error) if is_fencing_policy_denial(&error) => Ok(()),
            other => {
                let _ = delete(&cluster.client, ns, "probe").await;
                Err(format!("{other:?}"))
            }
        }
    })
    .await;
}

fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    match result {
        Err(error) => is_fencing_policy_denial(&error),
        Ok(accepted) => panic!("accepted: {accepted:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_refuses_every_writer_but_the_lease_holder_and_follows_the_lease() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "fencing-policy").await;
    let ns = cluster.namespace.clone();
    let (a, b) = clients_with_a_holding(testbed, &cluster).await;

    // The API server loads a new policy asynchronously: wait until it refuses B.
    wait_until_in_force(&cluster, &b, "the policy refuses a non-holder").await;

    // The holder writes; the non-holder's create, update and delete are all refused.
    create(&a, &ns, "web-1").await.unwrap();
    update(&a, &ns, "web-1").await.unwrap();
    assert!(refused(create(&b, &ns, "web-2").await));
    assert!(refused(update(&b, &ns, "web-1").await));
    assert!(refused(delete(&b, &ns, "web-1").await));
    // Users the policy does not match pass untouched.
    update(&cluster.client, &ns, "web-1").await.unwrap();

    // The Lease moves to B: A is refused once the API server's cache has the new holder.
    set_holder(&cluster, REPLICA_B).await;
    let moved = Instant::now();
    eventually("the old holder is refused", CONVERGE, || async {
        match update(&a, &ns, "web-1").await {
            Err(error) if is_fencing_policy_denial(&error) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!(
        "old holder refused {} ms after the Lease moved (the API server's Lease cache lag, \
         bounded by the 100 ms poll)",
        moved.elapsed().as_millis()
    );
    update(&b, &ns, "web-1").await.unwrap();
    delete(&b, &ns, "web-1").await.unwrap();

    // A released Lease (no holder) refuses every matched writer.
    let leases: Api<Lease> = cluster.leases();
    let mut lease = leases.get(LEASE).await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = None;
    leases
        .replace(LEASE, &PostParams::default(), &lease)
        .await
        .unwrap();
    eventually("a released Lease refuses everyone", CONVERGE, || async {
        match create(&b, &ns, "web-3").await {
            Err(error) if is_fencing_policy_denial(&error) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

/// Times `count` replaces of slice `name` in each of `namespaces`, alternating between them
/// request by request so both see the same load; returns each namespace's times, sorted.
async fn time_updates(
    client: &Client,
    namespaces: [&str; 2],
    name: &str,
    count: usize,
) -> [Vec<Duration>; 2] {
    let apis = namespaces.map(|ns| Api::<EndpointSlice>::namespaced(client.clone(), ns));
    let mut current = [
        apis[0].get(name).await.unwrap(),
        apis[1].get(name).await.unwrap(),
    ];
    let mut took = [Vec::with_capacity(count), Vec::with_capacity(count)];
    for round in 0..count {
        for side in 0..2 {
            current[side]
                .labels_mut()
                .insert("round".into(), round.to_string());
            let started = Instant::now();
            current[side] = apis[side]
                .replace(name, &PostParams::default(), &current[side])
                .await
                .unwrap();
            took[side].push(started.elapsed());
        }
    }
    for times in &mut took {
        times.sort();
    }
    took
}

/// The policy's cost per write: the same replace by the same (holding) user, alternating
/// between a namespace the binding covers and one it does not, in one run. Prints the figures
/// (docs/benchmarks.md); asserts no time limit.
#[tokio::test(flavor = "multi_thread")]
async fn policy_cost_per_slice_update() {
    const UPDATES: usize = 500;
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "fencing-cost").await;
    let ns = cluster.namespace.clone();
    let unbound = testbed
        .fresh_namespace("fencing-cost-unbound")
        .await
        .unwrap();
    let (a, b) = clients_with_a_holding(testbed, &cluster).await;
    create(&a, &ns, "web-1").await.unwrap();
    create(&a, &unbound, "web-1").await.unwrap();
    wait_until_in_force(&cluster, &b, "the policy is in force").await;
    // Outside the binding's namespace the policy refuses nothing.
    create(&b, &unbound, "probe").await.unwrap();

    // Warm the connection and the server's caches, then measure.
    time_updates(&a, [&ns, &unbound], "web-1", 20).await;
    let [with, without] = time_updates(&a, [&ns, &unbound], "web-1", UPDATES).await;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "slice update ({UPDATES} each, alternating): with the policy p50 {:.2} ms p99 {:.2} ms; \
         without p50 {:.2} ms p99 {:.2} ms",
        ms(percentile(&with, 0.5)),
        ms(percentile(&with, 0.99)),
        ms(percentile(&without, 0.5)),
        ms(percentile(&without, 0.99)),
    );
}
