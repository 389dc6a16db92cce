//! `external-endpoints check` against a real kube-apiserver: the RBAC of `deploy/rbac.yaml`
//! passes (checked for the ServiceAccount by impersonation), RBAC missing one verb fails and
//! names it, a missing CRD fails, a stale Lease is reported, an unreachable server is one line;
//! without --lease-namespace the Lease is found through the installed Deployment, and a caller
//! who may not search is told so; every failing line ends with a command to run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{
    path::{Path, PathBuf},
    process::Output,
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
    serde::Deserialize,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ObjectMeta, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
    discovery::{Discovery, Scope},
};
use serde_json::json;
use tokio::time::Instant;

/// Names and namespace used by `deploy/rbac.yaml` and `deploy/deployment.yaml`.
const DEPLOY_NAME: &str = "external-endpoints";

/// Longest wait for RBAC changes to reach the API server's authorizer.
const RBAC_PROPAGATION: Duration = Duration::from_secs(20);

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The RBAC of `deploy/rbac.yaml` moved into `namespace`, cluster-scoped names made unique.
fn rbac_in(namespace: &str) -> Vec<DynamicObject> {
    let text = std::fs::read_to_string(deploy_dir().join("rbac.yaml")).unwrap();
    let unique = format!("{DEPLOY_NAME}-{namespace}");
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|document| {
            let value = serde_yaml::Value::deserialize(document).unwrap();
            (!value.is_null()).then(|| serde_yaml::from_value::<DynamicObject>(value).unwrap())
        })
        .map(|mut object| {
            match object.namespace() {
                Some(_) => object.metadata.namespace = Some(namespace.to_string()),
                None => object.metadata.name = Some(unique.clone()),
            }
            if let Some(subjects) = object.data.get_mut("subjects") {
                for subject in subjects.as_array_mut().unwrap() {
                    subject["namespace"] = json!(namespace);
                }
            }
            if object.data["roleRef"]["kind"] == "ClusterRole" {
                object.data["roleRef"]["name"] = json!(unique);
            }
            object
        })
        .collect()
}

async fn apply_all(client: &Client, objects: &[DynamicObject]) {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for object in objects {
        let gvk = GroupVersionKind::try_from(object.types.as_ref().unwrap()).unwrap();
        let (resource, capabilities) = discovery.resolve_gvk(&gvk).unwrap();
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => {
                Api::namespaced_with(client.clone(), &object.namespace().unwrap(), &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let params = PatchParams::apply("check-test").force();
        api.patch(&object.name_any(), &params, &Patch::Apply(object))
            .await
            .unwrap();
    }
}

/// The Lease `check` looks for by default, held by `holder`, last renewed `age` ago, valid for
/// 15 s, after 3 transitions.
async fn lease(client: &Client, namespace: &str, holder: &str, age: Duration) {
    create_lease(
        client,
        namespace,
        "external-endpoints-write",
        holder,
        age,
        3,
    )
    .await;
}

/// A Lease named `name` in `namespace`, held by `holder`, acquired and last renewed `age` ago,
/// valid for 15 s, after `transitions` transitions.
async fn create_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    holder: &str,
    age: Duration,
    transitions: i32,
) {
    let renewed = Timestamp::now() - SignedDuration::try_from(age).unwrap();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(renewed)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    };
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &lease).await.unwrap();
}

/// Runs `external-endpoints check` with `args` and the kubeconfig at `kubeconfig` (POD_NAMESPACE
/// and KUBECONFIG removed from its environment).
async fn check(kubeconfig: &Path, args: &[&str]) -> Output {
    check_with_env(kubeconfig, args, &[]).await
}

/// Runs `check` with `args`, asserts that it exits with `code`, and returns its standard output.
async fn check_exits(kubeconfig: &Path, args: &[&str], code: i32) -> String {
    let output = check(kubeconfig, args).await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(code), "{text}");
    text
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts that `text` (an output, or a line of one) contains `expected`; shows `text` if not.
#[track_caller]
fn assert_contains(text: &str, expected: &str) {
    assert!(text.contains(expected), "{text}");
}

/// Runs the check until `done` holds for its output, or fails after [`RBAC_PROPAGATION`].
async fn check_until(kubeconfig: &Path, args: &[&str], done: impl Fn(&str) -> bool) -> Output {
    let started = Instant::now();
    loop {
        let output = check(kubeconfig, args).await;
        if done(&stdout(&output)) {
            return output;
        }
        assert!(
            started.elapsed() < RBAC_PROPAGATION,
            "check never reached the expected state:\n{}{}",
            stdout(&output),
            String::from_utf8_lossy(&output.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn service_account(namespace: &str) -> String {
    format!("system:serviceaccount:{namespace}:{DEPLOY_NAME}")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deployed_rbac_passes_every_check() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let admin = testbed.client().await.unwrap();
    let namespace = testbed.fresh_namespace("check-ok").await.unwrap();
    apply_all(&admin, &rbac_in(&namespace)).await;
    lease(&admin, &namespace, "replica-0", Duration::from_secs(1)).await;

    let account = service_account(&namespace);
    let args = ["--lease-namespace", &namespace, "--as", &account];
    let output = check_until(testbed.kubeconfig_path(), &args, |out| {
        !out.contains("FAIL")
    })
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    let text = stdout(&output);
    for check in ["api-server", "crd", "rbac", "lease"] {
        assert_contains(&text, &format!("PASS {check}: "));
    }
    assert_contains(&text, "held by replica-0");
    assert_contains(&text, "3 transitions");

    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let output = check(testbed.kubeconfig_path(), &json_args).await;
    assert_eq!(output.status.code(), Some(0));
    let outcomes: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let outcomes = outcomes.as_array().unwrap();
    // api-server, where the Lease was looked for (a note), crd, five resources, lease.
    assert_eq!(outcomes.len(), 9, "{outcomes:?}");
    assert_eq!(outcomes[1]["check"], "lease-namespace");
    assert_eq!(outcomes[1]["note"], true);
    assert!(outcomes.iter().all(|o| o["ok"] == true), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rbac_missing_one_verb_fails_and_names_it() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let admin = testbed.client().await.unwrap();
    let namespace = testbed.fresh_namespace("check-verb").await.unwrap();
    let mut rbac = rbac_in(&namespace);
    let role = (rbac.iter_mut())
        .find(|o| o.types.as_ref().unwrap().kind == "ClusterRole")
        .unwrap();
    for rule in role.data["rules"].as_array_mut().unwrap() {
        if rule["resources"] == json!(["endpointslices"]) {
            let verbs = rule["verbs"].as_array_mut().unwrap();
            verbs.retain(|verb| verb != "delete");
        }
    }
    apply_all(&admin, &rbac).await;
    lease(&admin, &namespace, "replica-0", Duration::from_secs(1)).await;

    let account = service_account(&namespace);
    let args = ["--lease-namespace", &namespace, "--as", &account];
    // Wait until the grant itself has reached the authorizer (services pass), then judge.
    let output = check_until(testbed.kubeconfig_path(), &args, |out| {
        out.contains("PASS rbac: services cluster-wide")
            && out.contains("PASS rbac: leases.coordination.k8s.io")
    })
    .await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let failures: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failures.len(), 1, "{text}");
    assert!(
        failures[0].starts_with(
            "FAIL rbac: endpointslices.discovery.k8s.io cluster-wide: missing delete ->"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_lease_is_reported_with_its_takeover_time() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let admin = testbed.client().await.unwrap();
    let namespace = testbed.fresh_namespace("check-stale").await.unwrap();
    lease(&admin, &namespace, "gone-0", Duration::from_secs(60)).await;

    let text = check_exits(
        testbed.kubeconfig_path(),
        &["--lease-namespace", &namespace],
        1,
    )
    .await;
    let line = text.lines().find(|l| l.starts_with("FAIL lease:")).unwrap();
    assert_contains(line, "held by gone-0, expired: last renewed 1m");
    assert_contains(line, "beyond its 15s duration");
    assert_contains(line, "takeover possible since 45s ago");
    assert_contains(line, "3 transitions");

    // The same namespace without any Lease: named as missing.
    let text = check_exits(
        testbed.kubeconfig_path(),
        &["--lease-namespace", "default"],
        1,
    )
    .await;
    assert_contains(
        &text,
        "FAIL lease: default/external-endpoints-write does not exist",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_crd_fails() {
    // Skips with the shared testbed when the binaries are missing.
    let _shared = testbed::require!();
    let bare = testbed::Testbed::start(testbed::Options {
        crd_dirs: Vec::new(),
        ..testbed::Options::default()
    })
    .await
    .unwrap();
    let text = check_exits(bare.kubeconfig_path(), &[], 1).await;
    assert_contains(&text, "PASS api-server: ");
    assert_contains(
        &text,
        "FAIL crd: workload.linkerd.io/v1beta1 is not served -> install",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_api_server_is_one_failing_line() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = harness::closed_port_kubeconfig(dir.path());
    let text = check_exits(&kubeconfig, &[], 1).await;
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("FAIL api-server: cannot reach the API server"),
        "{text}"
    );

    // A context the kubeconfig does not have: one error line on stderr, nothing on stdout.
    let output = check(&kubeconfig, &["--context", "nowhere"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_contains(&stderr, "nowhere");
}

/// `deploy/deployment.yaml` moved into `namespace`, its replicas using the Lease `lease_name`.
/// Nothing runs it (the testbed has no kubelet): `check` and `diff` only read it.
fn deployment_in(namespace: &str, lease_name: &str) -> DynamicObject {
    let text = std::fs::read_to_string(deploy_dir().join("deployment.yaml")).unwrap();
    let mut deployment: DynamicObject = serde_yaml::from_str(&text).unwrap();
    deployment.metadata.namespace = Some(namespace.to_string());
    let args = &mut deployment.data["spec"]["template"]["spec"]["containers"][0]["args"];
    for arg in args.as_array_mut().unwrap() {
        if arg.as_str().unwrap().starts_with("--lease-name=") {
            *arg = json!(format!("--lease-name={lease_name}"));
        }
    }
    deployment
}

/// Runs `check` with `args` and the environment variables `env` set (POD_NAMESPACE and
/// KUBECONFIG removed otherwise).
async fn check_with_env(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_external-endpoints"));
    command
        .arg("check")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("POD_NAMESPACE")
        .env_remove("KUBECONFIG")
        .envs(env.iter().copied());
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Every failing outcome of a `--output json` run ends its text line with its command, and
/// the command is one an operator runs (`kubectl ...`).
async fn assert_failures_end_with_a_command(kubeconfig: &Path, args: &[&str]) -> usize {
    let text = stdout(&check(kubeconfig, args).await);
    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let outcomes: Vec<serde_json::Value> =
        serde_json::from_slice(&check(kubeconfig, &json_args).await.stdout).unwrap();
    let failures: Vec<&serde_json::Value> = outcomes.iter().filter(|o| o["ok"] == false).collect();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(lines.len(), failures.len(), "{text}");
    for (line, failure) in lines.iter().zip(&failures) {
        let command = failure["command"].as_str().unwrap();
        assert!(command.starts_with("kubectl "), "{failure}");
        assert!(line.ends_with(&format!(": {command}")), "{line}");
    }
    failures.len()
}

/// The operator's case of issue 36: no --lease-namespace, no POD_NAMESPACE, a kubeconfig whose
/// namespace is `default`; the Lease lives in the namespace of the installed Deployment (found
/// by its label, in any namespace) under the name its args give. The only test of this binary
/// that creates a Deployment, so the search finds exactly this one.
#[tokio::test(flavor = "multi_thread")]
async fn lease_found_through_the_installed_deployment_without_flag_or_pod_namespace() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let admin = testbed.client().await.unwrap();
    let namespace = testbed.fresh_namespace("check-found").await.unwrap();
    apply_all(&admin, &[deployment_in(&namespace, "found-lease")]).await;
    // Just renewed, never moved.
    create_lease(
        &admin,
        &namespace,
        "found-lease",
        "replica-0",
        Duration::ZERO,
        0,
    )
    .await;
    let kubeconfig = testbed.kubeconfig_path();

    let text = check_exits(kubeconfig, &[], 0).await;
    let note = text
        .lines()
        .find(|l| l.starts_with("NOTE lease-namespace: "))
        .unwrap_or_else(|| panic!("no note of where it looked:\n{text}"));
    assert_contains(note, "--lease-namespace not given");
    assert_contains(note, "POD_NAMESPACE not set");
    assert_contains(
        note,
        &format!(
            "{namespace}, from Deployment {namespace}/external-endpoints (labelled app.kubernetes.io/part-of=external-endpoints"
        ),
    );
    assert_contains(
        &text,
        &format!("PASS lease: {namespace}/found-lease held by replica-0"),
    );
    assert_contains(
        &text,
        &format!("PASS rbac: leases.coordination.k8s.io in namespace {namespace}"),
    );

    // POD_NAMESPACE comes before the Deployment, and the flag before both.
    let output = check_with_env(kubeconfig, &[], &[("POD_NAMESPACE", "default")]).await;
    let text = stdout(&output);
    assert_contains(&text, "NOTE lease-namespace: default, from POD_NAMESPACE");
    assert_contains(
        &text,
        "FAIL lease: default/external-endpoints-write does not exist",
    );
    let output = check_with_env(
        kubeconfig,
        &[
            "--lease-namespace",
            &namespace,
            "--lease-name",
            "found-lease",
        ],
        &[("POD_NAMESPACE", "default")],
    )
    .await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert_contains(
        &text,
        &format!("NOTE lease-namespace: {namespace}, from --lease-namespace"),
    );

    // The Lease gone: the failing line names it and ends with where to look next, the
    // Deployment's logs.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &namespace);
    leases
        .delete("found-lease", &Default::default())
        .await
        .unwrap();
    let text = check_exits(kubeconfig, &[], 1).await;
    let line = text.lines().find(|l| l.starts_with("FAIL lease:")).unwrap();
    assert!(
        line.starts_with(&format!(
            "FAIL lease: {namespace}/found-lease does not exist ->"
        )),
        "{line}"
    );
    assert!(
        line.ends_with(&format!(
            ": kubectl --kubeconfig {} -n {namespace} logs deploy/external-endpoints",
            kubeconfig.display()
        )),
        "{line}"
    );
    assert_eq!(assert_failures_end_with_a_command(kubeconfig, &[]).await, 1);
}

/// A caller who may not list Deployments in every namespace is told so, with the command that
/// shows it, and `check` goes on with the kubeconfig's namespace; every failure that follows
/// ends with a command.
#[tokio::test(flavor = "multi_thread")]
async fn a_caller_who_cannot_list_deployments_is_told_and_the_kubeconfig_namespace_is_used() {
    use k8s_openapi::api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    };
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let admin = testbed.client().await.unwrap();
    let namespace = testbed.fresh_namespace("check-nobody").await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), &namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("nobody".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request("nobody", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|status| status.token)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let admin_config = kube::config::Kubeconfig::read_from(testbed.kubeconfig_path()).unwrap();
    let admin_config = serde_json::to_value(&admin_config).unwrap();
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "testbed", "cluster": admin_config["clusters"][0]["cluster"] }],
        "users": [{ "name": "nobody", "user": { "token": token } }],
        "contexts": [{ "name": "nobody", "context": {
            "cluster": "testbed", "user": "nobody", "namespace": namespace } }],
        "current-context": "nobody",
    });
    std::fs::write(&kubeconfig, serde_json::to_vec(&config).unwrap()).unwrap();

    let text = check_exits(&kubeconfig, &[], 1).await;
    let note = text
        .lines()
        .find(|l| l.starts_with("NOTE lease-namespace: "))
        .unwrap_or_else(|| panic!("no note:\n{text}"));
    assert_contains(
        note,
        "the kubeconfig's user may not list Deployments in all namespaces",
    );
    assert_contains(
        note,
        &format!(
            "kubectl --kubeconfig {} auth can-i list deployments.apps --all-namespaces",
            kubeconfig.display()
        ),
    );
    assert!(
        note.ends_with(&format!("{namespace}, the kubeconfig's namespace")),
        "{note}"
    );
    assert_contains(
        &text,
        &format!("FAIL lease: cannot read {namespace}/external-endpoints-write"),
    );
    let failures = assert_failures_end_with_a_command(&kubeconfig, &[]).await;
    assert!(
        failures >= 5,
        "no rights, so every rbac line fails too:\n{text}"
    );
}
