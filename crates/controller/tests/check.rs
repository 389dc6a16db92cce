//! `external-endpoints check` against a real kube-apiserver: the RBAC of `deploy/rbac.yaml`
//! passes (checked for the ServiceAccount by impersonation), RBAC missing one verb fails and
//! names it, a missing CRD fails, a stale Lease is reported, an unreachable server is one line.
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

/// Names and namespace used by `deploy/rbac.yaml`.
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

/// A Lease held by `holder`, last renewed `age` ago, valid for 15 s.
async fn lease(client: &Client, namespace: &str, holder: &str, age: Duration) {
    let renewed = Timestamp::now() - SignedDuration::try_from(age).unwrap();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("external-endpoints-write".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(renewed)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }),
    };
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &lease).await.unwrap();
}

/// Runs `external-endpoints check` with `args` and the kubeconfig at `kubeconfig`.
async fn check(kubeconfig: &Path, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_external-endpoints"));
    command
        .arg("check")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("POD_NAMESPACE")
        .env_remove("KUBECONFIG");
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
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
        assert!(text.contains(&format!("PASS {check}: ")), "{text}");
    }
    assert!(text.contains("held by replica-0"), "{text}");
    assert!(text.contains("3 transitions"), "{text}");

    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let output = check(testbed.kubeconfig_path(), &json_args).await;
    assert_eq!(output.status.code(), Some(0));
    let outcomes: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let outcomes = outcomes.as_array().unwrap();
    // api-server, crd, five resources, lease.
    assert_eq!(outcomes.len(), 8, "{outcomes:?}");
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

    let output = check(
        testbed.kubeconfig_path(),
        &["--lease-namespace", &namespace],
    )
    .await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let line = text.lines().find(|l| l.starts_with("FAIL lease:")).unwrap();
    assert!(
        line.contains("held by gone-0, stale: last renewed 1m"),
        "{line}"
    );
    assert!(line.contains("beyond its 15s duration"), "{line}");
    assert!(line.contains("takeover possible since 45s ago"), "{line}");
    assert!(line.contains("3 transitions"), "{line}");

    // The same namespace without any Lease: named as missing.
    let output = check(testbed.kubeconfig_path(), &["--lease-namespace", "default"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).contains("FAIL lease: default/external-endpoints-write does not exist")
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
    let output = check(bare.kubeconfig_path(), &[]).await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("PASS api-server: "), "{text}");
    assert!(
        text.contains("FAIL crd: workload.linkerd.io/v1beta1 is not served -> install"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_api_server_is_one_failing_line() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let kubeconfig = dir.path().join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: closed\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: closed\n  context:\n    cluster: closed\n    user: nobody\ncurrent-context: closed\nusers:\n- name: nobody\n  user: {{}}\n"
    );
    std::fs::write(&kubeconfig, text).unwrap();
    let output = check(&kubeconfig, &[]).await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
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
    assert!(stderr.contains("nowhere"), "{stderr}");
}
