//! `external-endpoints diff` against a real kube-apiserver with an audit log of slice writes: a
//! cluster the controller has converged diffs empty (exit 0), a change made while no replica
//! runs is shown (exit 1) with the field it changes, a namespace that does not exist is one
//! error line (exit 2), and the audit log holds no slice write made while `diff` ran.
//! Linkerd-format slices: see `adoption.rs` in the interop tests, which diffs them first.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::process::Output;

use harness::{Cluster, Replica};
use slices::testing::{Svc, vm, web};

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

    // While no replica runs: a workload added, one turned not ready, a Service added.
    cluster.apply_workload(vm("vm-3", "10.20.0.3")).await;
    cluster
        .apply_workload(vm("vm-1", "10.20.0.1").not_ready())
        .await;
    cluster
        .create_service(
            Svc::named("api")
                .selector("app", "web")
                .port("http", 81, 8081),
        )
        .await;
    let slice = cluster.slices_of("web").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let web = format!("{namespace}/web");
    let mut web_args = scope.to_vec();
    web_args.push(&web);
    let pending = diff(&testbed, &web_args).await;
    assert_eq!(pending.status.code(), Some(1), "{}", text(&pending.stderr));
    // The identity digest changes with the endpoints' workloads (vm-3 joins): one line each
    // way, its values aside.
    let stdout = text(&pending.stdout);
    let digest_lines = stdout
        .lines()
        .filter(|line| {
            line.starts_with("-identity-digest: ") || line.starts_with("+identity-digest: ")
        })
        .count();
    assert_eq!(digest_lines, 2, "{stdout}");
    let without_digest: String = stdout
        .lines()
        .filter(|line| !line[1..].starts_with("identity-digest: "))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(
        without_digest,
        format!(
            "{namespace}/web: 0 create(s), 1 update(s), 0 delete(s)\n\
             --- {namespace}/{slice} (live)\n\
             +++ {namespace}/{slice} (update)\n\
             -endpoint 10.20.0.1 target=vm-1 ready=true serving=true terminating=false\n\
             +endpoint 10.20.0.1 target=vm-1 ready=false serving=false terminating=false\n\
             +endpoint 10.20.0.3 target=vm-3 ready=true serving=true terminating=false\n"
        ),
        "the Service filter leaves api out; the slice's content is shown"
    );
    // Every Service: api's new slice too, its port and endpoints all added.
    let all = diff(&testbed, &scope).await;
    assert_eq!(all.status.code(), Some(1), "{}", text(&all.stderr));
    let all = text(&all.stdout);
    assert!(
        all.starts_with(&format!(
            "{namespace}/api: 1 create(s), 0 update(s), 0 delete(s)\n--- /dev/null\n+++ {namespace}/linkerd-external-api-… (create, IPv4)\n"
        )),
        "{all}"
    );
    for line in [
        "+port http 8081/TCP",
        "+endpoint 10.20.0.2 target=vm-2 ready=true serving=true terminating=false",
        "+metadata.labels.kubernetes.io/service-name: \"api\"",
    ] {
        assert!(all.lines().any(|l| l == line), "{line} not in:\n{all}");
    }
    assert!(all.ends_with(&text(&pending.stdout)), "{all}");

    // JSON carries the same detail.
    let mut json_args = web_args.clone();
    json_args.extend(["--output", "json"]);
    let json = diff(&testbed, &json_args).await;
    assert_eq!(json.status.code(), Some(1));
    let diffs: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let update = &diffs[0]["updates"][0];
    assert_eq!(update["name"], slice.as_str());
    assert_eq!(
        update["fields"],
        serde_json::json!(["endpoints", "identity-digest"])
    );
    let endpoints = &update["endpoints"];
    assert_eq!(
        endpoints["added"][0]["addresses"],
        serde_json::json!(["10.20.0.3"])
    );
    assert_eq!(endpoints["removed"], serde_json::json!([]));
    assert_eq!(
        endpoints["changed"][0]["before"]["conditions"]["ready"],
        true
    );
    assert_eq!(
        endpoints["changed"][0]["after"]["conditions"]["ready"],
        false
    );
    assert_eq!(update["ports"]["added"], serde_json::json!([]));

    // A Service that does not exist: an error, exit code 2.
    let missing = format!("{namespace}/no-such-service");
    let mut missing_args = scope.to_vec();
    missing_args.push(&missing);
    let missing = diff(&testbed, &missing_args).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr).contains("no-such-service not found"),
        "{}",
        text(&missing.stderr)
    );

    let mut summary_args = scope.to_vec();
    summary_args.extend(["--output", "summary"]);
    let summary = diff(&testbed, &summary_args).await;
    assert_eq!(summary.status.code(), Some(1));
    assert_eq!(
        text(&summary.stdout).lines().count(),
        2,
        "one line per Service"
    );

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

/// `diff` plans with the flags of the installed controller's Deployment (found by its label in
/// any namespace) for those the operator does not give: a replica running with its own
/// `--managed-by` and `--max-endpoints-per-slice` converged the cluster, and `diff` without
/// those flags shows nothing, while the default managed-by (given explicitly) would see none of
/// its slices and plan new ones. The only test of this binary that creates a Deployment.
#[tokio::test(flavor = "multi_thread")]
async fn diff_plans_with_the_installed_deployments_flags() {
    use harness::{CONVERGE, eventually};
    use k8s_openapi::api::{apps::v1::Deployment, discovery::v1::EndpointSlice};
    use kube::api::{ListParams, PostParams};
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let cluster = Cluster::new(testbed, "diff-installed").await;
    let namespace = cluster.namespace.clone();
    let flags = ["--managed-by=ops-controller", "--max-endpoints-per-slice=1"];

    // deploy/deployment.yaml in this namespace with the same flags (nothing runs it: the
    // testbed has no kubelet).
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/deployment.yaml"),
    )
    .unwrap();
    let mut deployment: Deployment = serde_yaml::from_str(&manifest).unwrap();
    deployment.metadata.namespace = Some(namespace.clone());
    let pod = deployment.spec.template.spec.as_mut().unwrap();
    (pod.containers[0].args.as_mut().unwrap()).extend(flags.iter().map(|f| f.to_string()));
    let deployments: kube::Api<Deployment> =
        kube::Api::namespaced(cluster.client.clone(), &namespace);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.30.0.1")).await;
    cluster.apply_workload(vm("vm-2", "10.30.0.2")).await;
    {
        let replica = Replica::start(BINARY, testbed, &namespace, "a", &flags).await;
        eventually(
            "two one-endpoint slices of ops-controller",
            CONVERGE,
            || async {
                let params = ListParams::default()
                    .labels("endpointslice.kubernetes.io/managed-by=ops-controller");
                let slices: Vec<EndpointSlice> = cluster
                    .slices_api()
                    .list(&params)
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let sizes: Vec<usize> = (slices.iter())
                    .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
                    .collect();
                match sizes.as_slice() {
                    [1, 1] => Ok(()),
                    other => Err(format!("slice sizes {other:?}")),
                }
            },
        )
        .await;
        drop(replica);
    }

    let scope = ["--watch-namespace", namespace.as_str()];
    let installed = diff(testbed, &scope).await;
    let stderr = text(&installed.stderr);
    assert_eq!(installed.status.code(), Some(0), "{stderr}");
    assert_eq!(
        text(&installed.stdout),
        "",
        "nothing the controller would write"
    );
    assert!(
        stderr.contains(&format!(
            "planning with the flags of Deployment {namespace}/external-endpoints: --max-endpoints-per-slice=1 --managed-by=ops-controller --slice-prefix=linkerd-external-"
        )),
        "{stderr}"
    );

    // The contrast: a managed-by given on the command line wins, and then every slice is new.
    let mut explicit = scope.to_vec();
    explicit.extend(["--managed-by", "linkerd-external-workloads-controller"]);
    let default = diff(testbed, &explicit).await;
    assert_eq!(default.status.code(), Some(1), "{}", text(&default.stderr));
    assert!(
        text(&default.stdout).starts_with(&format!(
            "{namespace}/web: 2 create(s), 0 update(s), 0 delete(s)\n"
        )),
        "{}",
        text(&default.stdout)
    );
}
