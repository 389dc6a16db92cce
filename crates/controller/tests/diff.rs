//! `external-endpoints diff` against a real kube-apiserver with an audit log of slice writes: a
//! cluster the controller has converged diffs empty (exit 0), a change made while no replica
//! runs is shown (exit 1) with the field it changes, a namespace that does not exist is one
//! error line (exit 2), and the audit log holds no slice write made while `diff` ran.
//! Linkerd-format slices: see `adoption.rs` in the interop tests, which diffs them first.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::process::Output;

use harness::{Cluster, Replica};
use slices::testing::{vm, web};

const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// Runs `external-endpoints diff` with `args` against `testbed`.
async fn diff(testbed: &testbed::Testbed, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_external-endpoints"));
    command
        .arg("diff")
        .arg("--kubeconfig")
        .arg(testbed.kubeconfig_path())
        .args(args);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn diff_shows_only_pending_writes_and_writes_nothing() {
    // Skips with the shared testbed when the binaries are missing; the audit log needs its own.
    let _shared = testbed::require!();
    let testbed = testbed::Testbed::start(testbed::Options {
        audit_log: true,
        ..testbed::Options::default()
    })
    .await
    .unwrap();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(&testbed, "diff").await;
    let namespace = cluster.namespace.clone();
    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.20.0.1")).await;
    cluster.apply_workload(vm("vm-2", "10.20.0.2")).await;

    let scope = ["--watch-namespace", namespace.as_str()];
    {
        let replica = Replica::start(BINARY, &testbed, &namespace, "a", &[]).await;
        cluster.wait_converged().await;
        drop(replica);
    }

    let writes_before = testbed.audit_events().unwrap().len();
    assert!(
        writes_before > 0,
        "the audit log records the controller's writes"
    );
    let converged = diff(&testbed, &scope).await;
    assert_eq!(
        converged.status.code(),
        Some(0),
        "{}",
        text(&converged.stderr)
    );
    assert_eq!(
        text(&converged.stdout),
        "",
        "a converged cluster diffs empty"
    );

    // A workload added while no replica runs: its Service's slice would be updated.
    cluster.apply_workload(vm("vm-3", "10.20.0.3")).await;
    let slice = cluster.slices_of("web").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let pending = diff(&testbed, &scope).await;
    assert_eq!(pending.status.code(), Some(1), "{}", text(&pending.stderr));
    assert_eq!(
        text(&pending.stdout),
        format!(
            "{namespace}/web: 0 create(s), 1 update(s), 0 delete(s)\n  ~ update {slice}: endpoints, identity-digest\n"
        )
    );
    let mut summary_args = scope.to_vec();
    summary_args.extend(["--output", "summary"]);
    let summary = diff(&testbed, &summary_args).await;
    assert_eq!(summary.status.code(), Some(1));
    assert_eq!(text(&summary.stdout).lines().count(), 1);

    // Bad input: one line, exit code 2, nothing on stdout.
    let missing = diff(&testbed, &["--watch-namespace", "no-such-namespace"]).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(missing.stdout.is_empty());
    let stderr = text(&missing.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no-such-namespace does not exist"),
        "{stderr}"
    );

    let bad_flag = diff(&testbed, &["--max-endpoints-per-slice", "0"]).await;
    assert_eq!(bad_flag.status.code(), Some(2));
    assert!(bad_flag.stdout.is_empty());

    let writes = testbed.audit_events().unwrap();
    assert_eq!(
        writes.len(),
        writes_before,
        "slice writes while diff ran: {:?}",
        &writes[writes_before..]
    );
}
