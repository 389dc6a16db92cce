//! A leader paused past its lease, with its own fence switched off (the `fenceless-controller`
//! test binary), wakes and sends the writes it had planned: the API server's fencing policy
//! (`deploy/fencing.yaml`) refuses every one, while the new leader's writes pass.
//!
//! The replicas authenticate with client certificates named as their Lease identities, so the
//! policy compares user names (the path of a client without a bound ServiceAccount token).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use tokio::time::Instant;

use harness::{CONVERGE, Cluster, LEASE, LEASE_ARGS, Replica, eventually, fencing, fixtures};
use testbed::AuditEvent;

/// The controller with its own fence switched off.
const FENCELESS: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_fenceless-controller"));

const REPLICA_A: &str = "paused-a";
const REPLICA_B: &str = "paused-b";

/// Services created while A leads: more than A writes before it is paused (its writes are
/// limited to a few per second), so A is paused with planned writes waiting.
const SERVICES: usize = 40;

async fn start(
    testbed: &testbed::Testbed,
    cluster: &Cluster,
    identity: &str,
    extra: &[&str],
) -> Replica {
    let kubeconfig = testbed.kubeconfig_for(identity, 0).unwrap();
    let mut args = vec![
        "--watch-namespace",
        cluster.namespace.as_str(),
        "--lease-namespace",
        cluster.namespace.as_str(),
        "--lease-name",
        LEASE,
        "--log-level",
        "info",
    ];
    args.extend(LEASE_ARGS);
    args.extend(extra);
    Replica::start_with(FENCELESS, &kubeconfig, identity, &args).await
}

fn writes_by(testbed: &testbed::Testbed, namespace: &str, user: &str) -> Vec<AuditEvent> {
    testbed
        .audit_events()
        .unwrap()
        .into_iter()
        .filter(|event| event.namespace == namespace && event.user == user)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_leader_without_its_own_fence_has_every_write_refused_by_the_api_server() {
    // Its own control plane, with the audit log on: the test reads who wrote what, and how the
    // API server answered.
    if testbed::Binaries::discover().is_err() && !testbed::running_in_ci() {
        eprintln!("skipped: run `bash testbed/build.sh`");
        return;
    }
    let options = testbed::Options {
        audit_log: true,
        ..testbed::Options::default()
    };
    let testbed = testbed::Testbed::start(options).await.unwrap();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(&testbed, "paused-leader").await;
    let ns = cluster.namespace.clone();
    fencing::install_policy(&cluster.client, &ns, LEASE, &[REPLICA_A, REPLICA_B]).await;

    // A leads, writing at most 2 slices a second.
    let a = start(&testbed, &cluster, REPLICA_A, &["--write-qps", "2"]).await;
    a.wait_leading(CONVERGE).await;
    let b = start(&testbed, &cluster, REPLICA_B, &[]).await;
    b.wait_ready(CONVERGE).await;

    fixtures::populate(&cluster.client, &ns, SERVICES, 1, Instant::now()).await;
    eventually("A writes its first slices", CONVERGE, || async {
        let written = writes_by(&testbed, &ns, REPLICA_A)
            .iter()
            .filter(|w| w.code < 300)
            .count();
        (written >= 2)
            .then_some(())
            .ok_or(format!("{written} written"))
    })
    .await;
    assert!(
        cluster.converged().await.is_err(),
        "A is paused with writes still to send"
    );

    // Paused past its lease: B takes over and publishes everything.
    a.pause();
    let before_wake = writes_by(&testbed, &ns, REPLICA_A).len();
    b.wait_leading(CONVERGE).await;
    assert_eq!(cluster.lease_holder().await.as_deref(), Some(REPLICA_B));
    cluster.wait_converged().await;

    // A wakes. Its workers were waiting to send planned writes; with no fence of its own they
    // send them. The API server refuses every one, and A counts them as fenced writes.
    a.resume();
    let fenced = eventually("A's fenced writes are counted", CONVERGE, || async {
        let fenced = a
            .metric("external_endpoints_fenced_writes_total", "")
            .await?;
        (fenced >= 1.0).then_some(fenced).ok_or(format!("{fenced}"))
    })
    .await;
    eventually("A follows", CONVERGE, || async {
        (!a.is_leader().await)
            .then_some(())
            .ok_or("still leading".to_string())
    })
    .await;
    let after_wake: Vec<AuditEvent> = writes_by(&testbed, &ns, REPLICA_A)
        .into_iter()
        .skip(before_wake)
        .collect();
    assert!(!after_wake.is_empty(), "A sent writes after waking");
    for write in &after_wake {
        assert_eq!(write.code, 403, "A's write after waking: {write:?}");
    }
    let by_b = writes_by(&testbed, &ns, REPLICA_B);
    assert!(!by_b.is_empty());
    assert!(
        by_b.iter().all(|write| write.code != 403),
        "the holder is never refused"
    );
    // Nothing A sent changed what B published.
    cluster.wait_converged().await;
    println!(
        "A sent {} writes after waking, all refused ({fenced} counted as fenced); B wrote {}",
        after_wake.len(),
        by_b.len()
    );
}
