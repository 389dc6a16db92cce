//! Faults of the control plane itself: kube-apiserver or etcd killed (or stopped) and restarted
//! on the same port and data, a watch history compacted away under open watches (410 Gone), a
//! slow API server on the leader's connection ([`latency`](super::latency)), and one of two API
//! servers cut off from its replicas.
//!
//! Every fault strikes while the client keeps changing objects (it retries while the API is
//! down), and ends with the slices converged on everything the client wrote.

use std::time::Duration;

use kube::api::{Api, ListParams, Patch, PatchParams};
use testbed::Server;
use tokio::time::Instant;

use crate::{
    CONVERGE, Cluster, Replica,
    chaos::{
        lease_acquire_time, log_time, slice_versions, slice_writes, wait_any_leading, wait_gauge,
        world::{BEFORE_FAULT, CHANGES, Member, RENEW_DEADLINE, RETRY_PERIOD, SLACK, World},
    },
    eventually,
};

pub use super::latency::{SLOW_RIDDEN_OUT, SLOW_WITHIN, SLOWER, slow_api, slow_within_deadline};

/// How long a restarted server and the replicas may take to be back on a loaded machine.
pub const RECOVER: Duration = Duration::from_secs(180);

/// How a server goes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: a crash.
    Kill,
    /// SIGTERM: a graceful shutdown (an upgrade).
    Graceful,
}

/// `server` goes down (killed or stopped) while a replica leads and the client writes, long
/// enough for the leader's RenewDeadline to pass; then it is restarted on the same port and
/// data. The leader steps down within RenewDeadline; while nobody leads, no replica even tries
/// a slice write; after the restart exactly one replica leads, and every change made before,
/// during and after the outage converges.
pub async fn restart(world: &mut World<'_>, members: &mut [Member], server: Server, stop: Stop) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let leader = &members[index].replica;
    let step_downs = metric(leader, "external_endpoints_leader_step_downs_total").await;
    let mut churn = world.churn_retrying(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    // A graceful stop stops listening at once, then waits for open requests (watches) for up
    // to a minute before the process exits: the leader's step-down is timed meanwhile.
    let down = Instant::now();
    let stopping = async {
        match stop {
            Stop::Kill => world.testbed.kill(server).await.unwrap(),
            Stop::Graceful => world.testbed.stop(server).await.unwrap(),
        }
        eprintln!("{server:?} {stop:?}: exited after {:?}", down.elapsed());
    };
    let ((), stepped) = tokio::join!(stopping, wait_gauge(leader, false, CONVERGE));
    let took = stepped - down;
    eprintln!("{server:?} {stop:?}: the leader stopped leading {took:?} after the stop began");
    assert!(
        took <= RENEW_DEADLINE + SLACK,
        "stopped leading {took:?} after the control plane went down (RenewDeadline {RENEW_DEADLINE:?})"
    );
    assert!(
        metric(leader, "external_endpoints_leader_step_downs_total").await > step_downs,
        "the step-down is counted"
    );

    // With every replica cut off, nobody leads now: nobody may even try a write (an attempt
    // would be counted as a write or a write error) until the control plane is back. Replicas
    // of another API server (HA) may take over meanwhile instead.
    let all_down = match server {
        Server::Etcd => true,
        Server::ApiServer(index) => members.iter().all(|m| m.apiserver == index),
    };
    if all_down {
        // Writes sent before the step-down may still fail (or land) now; once the old term's
        // work is over, the count must not move.
        wait_no_write_in_flight(leader).await;
        let attempts = write_attempts(members).await;
        tokio::time::sleep(RETRY_PERIOD * 2).await;
        for member in members.iter() {
            assert!(
                !member.replica.is_leader().await,
                "{} leads",
                member.replica.identity
            );
        }
        assert_eq!(
            write_attempts(members).await,
            attempts,
            "a replica tried to write while nobody led"
        );
    }
    world.testbed.restart(server).await.unwrap();
    wait_api_ready(&world.cluster).await;
    eprintln!("{server:?} {stop:?}: back after {:?}", down.elapsed());

    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (_, led) = wait_leading(&world.cluster, &replicas).await;
    eprintln!(
        "{server:?} {stop:?}: a replica leads {:?} after the stop began",
        led - down
    );
    exactly_one_leads(&replicas).await;
    world.settle(churn).await;
}

/// etcd's history is compacted while every replica's watches are open, and their connections
/// reset: each watch resumes from a compacted resourceVersion, the API server (no watch cache)
/// answers 410 Gone, and every replica re-lists each kind. Nothing changed meanwhile, so the
/// re-lists write nothing (no slice deleted or rewritten from a half-listed cache); each cache
/// ends with exactly the API's objects; a follower that takes over after its re-list writes
/// nothing either; new changes converge.
pub async fn watch_expiry(world: &mut World<'_>, members: &mut Vec<Member>) {
    let kinds = ["Service", "ExternalWorkload", "EndpointSlice"];
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    wait_any_leading(&world.cluster, &replicas).await;
    let churn = world.churn(CHANGES / 2);
    world.settle(churn).await;

    let mut relists = Vec::new();
    for member in members.iter() {
        relists.push(relist_counts(&member.replica, &kinds).await);
    }
    let versions = slice_versions(&world.cluster).await;
    let deletes = deletes_of(members).await;
    // Two writes the replicas do not watch move the revision past every watch's position.
    touch_unwatched(&world.cluster, 2).await;
    let revision = world.testbed.compact_etcd().await.unwrap();
    eprintln!("watch expiry: etcd compacted at revision {revision}");
    for member in members.iter() {
        member.proxy.as_ref().expect("proxied").reset();
    }
    for (member, before) in members.iter().zip(&relists) {
        eventually(
            &format!("{} to re-list every kind", member.replica.identity),
            CONVERGE,
            || async {
                let now = relist_counts(&member.replica, &kinds).await;
                if now.iter().zip(before).all(|(now, before)| now > before) {
                    Ok(())
                } else {
                    Err(format!("re-lists {before:?} → {now:?}"))
                }
            },
        )
        .await;
    }
    // Every re-list is complete and its differences dispatched; a reconcile they caused is
    // over once the queue is empty.
    for member in members.iter() {
        wait_idle(&member.replica).await;
    }
    assert_eq!(
        slice_versions(&world.cluster).await,
        versions,
        "a re-list wrote slices although nothing changed"
    );
    assert_eq!(
        deletes_of(members).await,
        deletes,
        "a re-list deleted slices"
    );

    // Each cache holds exactly what the API has: the counts the re-lists logged, and below, a
    // follower leading from its re-listed caches writes nothing.
    let listed = api_counts(&world.cluster).await;
    for member in members.iter() {
        for (kind, count) in kinds.iter().zip(&listed) {
            assert_eq!(
                relisted_objects(&member.replica, kind),
                Some(*count),
                "{}'s re-listed {kind} cache",
                member.replica.identity
            );
        }
    }
    let new = world.stop_leader(members).await;
    wait_idle(&members[new].replica).await;
    assert_eq!(
        slice_versions(&world.cluster).await,
        versions,
        "the follower's re-listed caches differ from the API's objects"
    );

    let churn = world.churn(CHANGES / 2);
    world.settle(churn).await;
}

/// Two API servers on one etcd, the replicas spread over both: the API server of the leader is
/// cut off from all its replicas (their proxies cut). The leader steps down within
/// RenewDeadline, a replica on the other API server leads, the slices converge; once the cut
/// heals, the old leader stays a follower.
pub async fn apiserver_partition(world: &mut World<'_>, members: &mut [Member]) {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    let side = members[index].apiserver;
    assert!(
        members.iter().any(|m| m.apiserver != side),
        "a replica on another API server"
    );
    let mut churn = world.churn(CHANGES);
    churn.wait_for(BEFORE_FAULT).await;

    let cut: Vec<&Member> = members.iter().filter(|m| m.apiserver == side).collect();
    for member in &cut {
        member.proxy.as_ref().expect("proxied").cut();
    }
    let down = Instant::now();
    let old = &members[index].replica;
    let stepped = wait_gauge(old, false, CONVERGE).await;
    eprintln!(
        "API server {side} cut off: the leader stopped leading {:?} later",
        stepped - down
    );
    assert!(stepped - down <= RENEW_DEADLINE + SLACK);
    let others: Vec<&Replica> = members
        .iter()
        .filter(|m| m.apiserver != side)
        .map(|m| &m.replica)
        .collect();
    let (_, led) = wait_leading(&world.cluster, &others).await;
    eprintln!(
        "API server {side} cut off: a replica of the other leads {:?} later",
        led - down
    );
    let stopped = log_time(old, "stopped leading").expect("a step-down in the log");
    let acquired = lease_acquire_time(&world.cluster).await.unwrap();
    assert!(
        stopped < acquired,
        "stopped at {stopped}, acquired at {acquired}"
    );
    world.settle(churn).await;

    let writes = slice_writes(old).await;
    for member in &cut {
        member.proxy.as_ref().expect("proxied").restore();
    }
    let churn = world.churn(CHANGES / 2);
    world.settle(churn).await;
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    exactly_one_leads(&replicas).await;
    assert_eq!(
        slice_writes(old).await,
        writes,
        "the old leader wrote after the cut"
    );
}

// === helpers ===

pub(super) async fn metric(replica: &Replica, name: &str) -> f64 {
    replica.metric(name, "").await.unwrap()
}

/// Writes and write errors of every replica: any attempt raises one of them.
async fn write_attempts(members: &[Member]) -> f64 {
    let mut total = 0.0;
    for member in members {
        total += metric(&member.replica, "external_endpoints_slice_writes_total").await;
        total += metric(
            &member.replica,
            "external_endpoints_slice_write_errors_total",
        )
        .await;
    }
    total
}

/// Slice deletes of every replica.
async fn deletes_of(members: &[Member]) -> f64 {
    let mut total = 0.0;
    for member in members {
        total += member
            .replica
            .metric("external_endpoints_slice_writes_total", "Delete")
            .await
            .unwrap();
    }
    total
}

/// Waits until one of `replicas` leads, allowing for a control plane that has just come back.
pub async fn wait_leading(cluster: &Cluster, replicas: &[&Replica]) -> (usize, Instant) {
    eventually("a replica to lead", RECOVER, || async {
        for replica in replicas {
            if replica.is_leader().await {
                return Ok(());
            }
        }
        Err("nobody leads".to_string())
    })
    .await;
    wait_any_leading(cluster, replicas).await
}

/// Exactly one of `replicas` reports itself leading.
pub async fn exactly_one_leads(replicas: &[&Replica]) {
    let mut leading = Vec::new();
    for replica in replicas {
        if replica.is_leader().await {
            leading.push(replica.identity.clone());
        }
    }
    assert_eq!(leading.len(), 1, "leading: {leading:?}");
}

/// Waits until the API answers lists again (an API server whose etcd came back reconnects
/// with a backoff of its own).
pub async fn wait_api_ready(cluster: &Cluster) {
    eventually("the API to answer", RECOVER, || async {
        cluster
            .services()
            .list(&ListParams::default())
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    })
    .await
}

/// Waits until the replica has no reconcile in flight (a write sent before its step-down may
/// hang until the API server gives up on etcd).
async fn wait_no_write_in_flight(replica: &Replica) {
    eventually(
        &format!("{}'s in-flight work to end", replica.identity),
        RECOVER,
        || async {
            match replica
                .metric("external_endpoints_queue_in_flight", "")
                .await?
            {
                0.0 => Ok(()),
                n => Err(format!("{n} in flight")),
            }
        },
    )
    .await
}

/// Waits until the replica's queue holds nothing queued or in flight.
pub(super) async fn wait_idle(replica: &Replica) {
    eventually(
        &format!("{}'s queue to be idle", replica.identity),
        CONVERGE,
        || async {
            let depth = replica.metric("external_endpoints_queue_depth", "").await?;
            let in_flight = replica
                .metric("external_endpoints_queue_in_flight", "")
                .await?;
            if depth == 0.0 && in_flight == 0.0 {
                Ok(())
            } else {
                Err(format!("{depth} queued, {in_flight} in flight"))
            }
        },
    )
    .await
}

/// The replica's re-list count of each kind.
async fn relist_counts(replica: &Replica, kinds: &[&str]) -> Vec<f64> {
    let mut counts = Vec::new();
    for kind in kinds {
        let labels = format!("kind=\"{kind}\"");
        counts.push(
            replica
                .metric("external_endpoints_watch_relists_total", &labels)
                .await
                .unwrap(),
        );
    }
    counts
}

/// How many objects the replica's last re-list of `kind` put in its cache (its log; the kind is
/// a field of the watch's span).
fn relisted_objects(replica: &Replica, kind: &str) -> Option<u64> {
    replica
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["message"] == "re-listed" && entry["span"]["kind"] == kind)
        .filter_map(|entry| entry["objects"].as_u64())
        .next_back()
}

/// Services, workloads and managed slices in the namespace.
async fn api_counts(cluster: &Cluster) -> [u64; 3] {
    let services = cluster
        .services()
        .list(&ListParams::default())
        .await
        .unwrap();
    let workloads = cluster
        .workloads()
        .list(&ListParams::default())
        .await
        .unwrap();
    [
        services.items.len() as u64,
        workloads.items.len() as u64,
        cluster.slices().await.len() as u64,
    ]
}

/// Writes a ConfigMap `times` times (an object no replica watches): each write is a revision.
async fn touch_unwatched(cluster: &Cluster, times: usize) {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    for round in 0..times {
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "revision-mover"},
            "data": {"round": round.to_string()},
        });
        api.patch(
            "revision-mover",
            &PatchParams::apply("chaos-test").force(),
            &Patch::Apply(&patch),
        )
        .await
        .unwrap();
    }
}
