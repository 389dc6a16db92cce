//! The manifests in `deploy/` against a real kube-apiserver: every object passes a server-side
//! dry-run apply, and the controller runs with nothing but the ServiceAccount and RBAC they
//! grant (a bearer token of that ServiceAccount), cluster-wide as in production.
//!
//! Its own test binary, so its own control plane: a cluster-wide controller here cannot write
//! slices for the namespaces of other test binaries.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use harness::{CONVERGE, Cluster, LEASE_ARGS, Replica, eventually};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    coordination::v1::Lease,
    core::v1::{Secret, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
    events::v1::Event,
};
use k8s_openapi::serde::Deserialize;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::GroupVersionKind,
    discovery::{Discovery, Scope},
};
use serde_json::json;
use slices::testing::{Workload, vm, web};

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// Namespace and object name the manifests use; rewritten per test where objects are created.
const DEPLOY_NAME: &str = "external-endpoints";

/// The Lease name the Deployment passes (`--lease-name`).
const LEASE_NAME: &str = "external-endpoints-write";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The `resources` of `deploy/kustomization.yaml`.
fn kustomization_resources() -> Vec<String> {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    let kustomization: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    kustomization["resources"]
        .as_sequence()
        .expect("kustomization.yaml lists resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// Every YAML file under `deploy/` except the kustomization and `monitoring/` (opt-in: it needs
/// the Prometheus Operator's CRD), relative to it.
fn yaml_files(dir: &Path, base: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path == base.join("monitoring") {
            continue;
        }
        if path.is_dir() {
            yaml_files(&path, base, found);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && path.file_name().is_some_and(|n| n != "kustomization.yaml")
        {
            let relative = path.strip_prefix(base).unwrap();
            found.insert(relative.to_string_lossy().into_owned());
        }
    }
}

/// The objects of one manifest file (multi-document YAML; empty documents skipped).
fn manifests(file: &str) -> Vec<DynamicObject> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|document| {
            let value = serde_yaml::Value::deserialize(document).unwrap();
            (!value.is_null()).then(|| serde_yaml::from_value(value).unwrap())
        })
        .collect()
}

fn kind(object: &DynamicObject) -> &str {
    object.types.as_ref().map_or("", |t| t.kind.as_str())
}

/// Server-side apply of `object` (a dry run when `dry_run`), resolved through discovery.
async fn apply(
    client: &Client,
    discovery: &Discovery,
    object: &DynamicObject,
    dry_run: bool,
) -> Result<DynamicObject, String> {
    let types = object.types.as_ref().ok_or("no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types).map_err(|e| e.to_string())?;
    let (resource, capabilities) = discovery
        .resolve_gvk(&gvk)
        .ok_or_else(|| format!("{gvk:?} is not served"))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = object
                .namespace()
                .ok_or("namespaced object without namespace")?;
            Api::namespaced_with(client.clone(), &namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply("deploy-test").force();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(&object.name_any(), &params, &Patch::Apply(object))
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn kustomization_lists_every_manifest() {
    let mut files = BTreeSet::new();
    yaml_files(&deploy_dir(), &deploy_dir(), &mut files);
    let listed: BTreeSet<String> = kustomization_resources().into_iter().collect();
    assert_eq!(listed, files);
}

/// `kubectl apply -k deploy/` as documented: kustomize builds exactly the objects of the listed
/// files and the API server accepts all of them in a server-side dry run.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_passes_a_server_side_dry_run() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(kubectl) = testbed.binaries().kubectl.clone() else {
        eprintln!("no kubectl next to the testbed binaries; skipped");
        return;
    };
    let kubectl = |args: &[&str]| {
        let output = std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(testbed.kubeconfig_path())
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "kubectl {args:?}:\n{stdout}\n{stderr}"
        );
        stdout
    };
    let deploy = deploy_dir();
    let deploy = deploy.to_str().unwrap();
    let expected: usize = (kustomization_resources().iter())
        .map(|file| manifests(file).len())
        .sum();
    let built = kubectl(&["kustomize", deploy]);
    let built = serde_yaml::Deserializer::from_str(&built).count();
    assert_eq!(built, expected, "objects built by kustomize");
    // The namespace first, for real, as in `every_manifest_passes_a_server_side_dry_run`.
    let namespace = deploy_dir().join("namespace.yaml");
    kubectl(&["apply", "--server-side", "-f", namespace.to_str().unwrap()]);
    let applied = kubectl(&["apply", "-k", deploy, "--server-side", "--dry-run=server"]);
    assert_eq!(
        applied
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count(),
        expected,
        "{applied}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_manifest_passes_a_server_side_dry_run() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let client = testbed.client().await.unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();

    // The namespace is created for real, as `kubectl apply -k` does first: a dry run of a
    // namespaced object in a namespace that does not exist is refused.
    for namespace in manifests("namespace.yaml") {
        apply(&client, &discovery, &namespace, false).await.unwrap();
    }
    let mut failures = Vec::new();
    let mut applied = 0;
    for file in kustomization_resources() {
        for object in manifests(&file) {
            let what = format!("{file}: {} {}", kind(&object), object.name_any());
            match apply(&client, &discovery, &object, true).await {
                Ok(result) => {
                    assert_eq!(result.name_any(), object.name_any(), "{what}");
                    assert_eq!(kind(&result), kind(&object), "{what}");
                    applied += 1;
                }
                Err(error) => failures.push(format!("{what}: {error}")),
            }
        }
    }
    assert!(failures.is_empty(), "refused:\n{}", failures.join("\n"));
    // Namespace, CRD, ServiceAccount, ClusterRole(+Binding), Role(+Binding), Deployment, PDB,
    // Service.
    assert!(applied >= 10, "only {applied} objects in deploy/");
}

#[tokio::test(flavor = "multi_thread")]
async fn deployment_holds_what_the_controller_needs() {
    let deployment = manifests("deployment.yaml").remove(0);
    let spec = &deployment.data["spec"];
    assert!(spec["replicas"].as_i64().unwrap() >= 2, "2+ replicas");
    let pod = &spec["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = (container["args"].as_array().unwrap().iter())
        .map(|a| a.as_str().unwrap())
        .collect();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
    };
    let drain = humantime::parse_duration(&flag("drain-timeout").unwrap()).unwrap();
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace > drain.as_secs() + 5,
        "grace {grace}s vs drain {drain:?}"
    );
    assert_eq!(flag("lease-name").as_deref(), Some(LEASE_NAME));
    let admin_port = flag("admin-addr")
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    assert_eq!(
        container["ports"][0]["containerPort"]
            .as_u64()
            .unwrap()
            .to_string(),
        admin_port
    );
    for (probe, path) in [("livenessProbe", "/live"), ("readinessProbe", "/ready")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
    }
    // The identity and the Lease namespace come from the downward API.
    for (variable, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let env = (container["env"].as_array().unwrap().iter())
            .find(|e| e["name"] == variable)
            .unwrap_or_else(|| panic!("{variable} is not set"));
        assert_eq!(
            env["valueFrom"]["fieldRef"]["fieldPath"], field,
            "{variable}"
        );
    }
    // The PodDisruptionBudget and the metrics Service select the Deployment's pods.
    let pod_labels = &spec["template"]["metadata"]["labels"];
    let pdb = manifests("pdb.yaml").remove(0);
    assert_eq!(&pdb.data["spec"]["selector"]["matchLabels"], pod_labels);
    let service = manifests("service.yaml").remove(0);
    assert_eq!(&service.data["spec"]["selector"], pod_labels);
    let service_account = pod["serviceAccountName"].as_str().unwrap();
    let accounts: Vec<String> = manifests("rbac.yaml")
        .iter()
        .filter(|o| kind(o) == "ServiceAccount")
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(accounts, [service_account]);
}

/// The RBAC of `deploy/rbac.yaml`, moved into `namespace` (the controller's namespace) with
/// cluster-scoped names made unique, so tests on one control plane stay independent.
fn rbac_in(namespace: &str) -> Vec<DynamicObject> {
    let unique = format!("{DEPLOY_NAME}-{namespace}");
    manifests("rbac.yaml")
        .into_iter()
        .map(|mut object| {
            match object.namespace().as_deref() {
                Some(DEPLOY_NAME) => object.metadata.namespace = Some(namespace.to_string()),
                Some(other) => panic!("rbac.yaml: unexpected namespace {other}"),
                None => object.metadata.name = Some(unique.clone()),
            }
            if let Some(subjects) = object
                .data
                .get_mut("subjects")
                .and_then(|s| s.as_array_mut())
            {
                for subject in subjects {
                    assert_eq!(subject["namespace"], DEPLOY_NAME);
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

/// A bearer token of the deployed ServiceAccount in `namespace`, valid for an hour.
async fn service_account_token(admin: &Client, namespace: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    accounts
        .create_token_request(DEPLOY_NAME, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|status| status.token)
        .expect("a token")
}

/// Writes a kubeconfig with the testbed's server and CA and `token` as the only credential.
fn token_kubeconfig(testbed: &testbed::Testbed, token: &str, path: &Path) {
    let admin = Kubeconfig::read_from(testbed.kubeconfig_path()).unwrap();
    let admin = serde_json::to_value(&admin).unwrap();
    let cluster = admin["clusters"][0]["cluster"].clone();
    assert_eq!(cluster["server"], testbed.server_url());
    // JSON is YAML: the binary reads it like any kubeconfig.
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "testbed", "cluster": cluster }],
        "users": [{ "name": "controller", "user": { "token": token } }],
        "contexts": [{ "name": "controller", "context": { "cluster": "testbed", "user": "controller" } }],
        "current-context": "controller",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&kubeconfig).unwrap()).unwrap();
}

async fn client_from(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// The HTTP status of a refused call (`None` when it was allowed).
fn refusal<T>(result: Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(other) => panic!("not an API refusal: {other}"),
    }
}

fn assert_no_rbac_errors(replica: &Replica) {
    let log = replica.log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "{} was refused something:\n{log}",
        replica.identity
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_runs_cluster_wide_with_only_the_deployed_rbac() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let admin = testbed.client().await.unwrap();
    let discovery = Discovery::new(admin.clone()).run().await.unwrap();

    // The controller's namespace, its ServiceAccount and RBAC, created for real.
    let home = testbed.fresh_namespace("deploy-home").await.unwrap();
    for object in rbac_in(&home) {
        apply(&admin, &discovery, &object, false).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("controller.kubeconfig");
    token_kubeconfig(
        testbed,
        &service_account_token(&admin, &home).await,
        &kubeconfig,
    );

    // Two replicas as the Deployment runs them: cluster-wide, Lease in their own namespace.
    let flags: Vec<&str> = [
        "--lease-namespace",
        home.as_str(),
        "--lease-name",
        LEASE_NAME,
    ]
    .into_iter()
    .chain(LEASE_ARGS)
    .chain(["--drain-timeout", "5s"])
    .collect();
    let mut a = Replica::start_with(BINARY, &kubeconfig, "a", &flags).await;
    a.wait_leading(CONVERGE).await;
    let b = Replica::start_with(BINARY, &kubeconfig, "b", &flags).await;
    a.wait_ready(CONVERGE).await;
    b.wait_ready(CONVERGE).await;

    // Slices and Events in another namespace.
    let cluster = Cluster::new(testbed, "deploy-workloads").await;
    cluster.create_service(web()).await;
    cluster.apply_workload(vm("vm-1", "10.0.0.1")).await;
    // Selected, but without the port `http` the Service's targetPort names: an Event.
    let no_http = Workload::named("vm-2").label("app", "web").ip("10.0.0.2");
    cluster
        .apply_workload(no_http.port("admin", 9000).ready())
        .await;
    cluster.wait_converged().await;
    assert!(cluster.endpoints_of("web").await["vm-1"].1);
    let events: Api<Event> = Api::namespaced(admin.clone(), &cluster.namespace);
    eventually("the Warning Event on web", CONVERGE, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        match list
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("UnresolvedWorkloadPort"))
        {
            true => Ok(()),
            false => Err(format!("{} events", list.items.len())),
        }
    })
    .await;

    // What the token may not do.
    let token = client_from(&kubeconfig).await;
    let elsewhere = &cluster.namespace;
    let services: Api<Service> = Api::namespaced(token.clone(), elsewhere);
    assert_eq!(
        refusal(services.delete("web", &DeleteParams::default()).await),
        Some(403),
        "deleting a Service"
    );
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(LEASE_NAME.into()),
            ..Default::default()
        },
        ..Lease::default()
    };
    let foreign_leases: Api<Lease> = Api::namespaced(token.clone(), elsewhere);
    assert_eq!(
        refusal(foreign_leases.create(&PostParams::default(), &lease).await),
        Some(403),
        "writing a Lease outside the controller's namespace"
    );
    let workloads: Api<api::v1beta1::ExternalWorkload> = Api::namespaced(token.clone(), elsewhere);
    assert_eq!(
        refusal(workloads.delete("vm-1", &DeleteParams::default()).await),
        Some(403),
        "deleting an ExternalWorkload"
    );
    let secrets: Api<Secret> = Api::namespaced(token.clone(), &home);
    assert_eq!(
        refusal(secrets.list(&ListParams::default()).await),
        Some(403),
        "reading Secrets"
    );
    let own_leases: Api<Lease> = Api::namespaced(token.clone(), &home);
    assert_eq!(
        refusal(
            own_leases
                .delete(LEASE_NAME, &DeleteParams::default())
                .await
        ),
        Some(403),
        "deleting its own Lease"
    );
    let patch = Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}));
    assert_eq!(
        refusal(
            own_leases
                .patch(LEASE_NAME, &PatchParams::default(), &patch)
                .await
        ),
        Some(403),
        "patching its Lease (it replaces, guarded by resourceVersion)"
    );
    // ...and, for contrast, what it does.
    assert_eq!(refusal(own_leases.get(LEASE_NAME).await), None);
    let slices: Api<EndpointSlice> = Api::namespaced(token.clone(), elsewhere);
    assert_eq!(refusal(slices.list(&ListParams::default()).await), None);

    // Hand-over under the same RBAC: A drains and releases, B (watching the Lease) takes over
    // and keeps the slices current.
    a.terminate();
    assert!(a.wait_exit(CONVERGE).await.success(), "{}", a.log());
    b.wait_leading(CONVERGE).await;
    cluster
        .apply_workload(vm("vm-1", "10.0.0.1").not_ready())
        .await;
    cluster.wait_converged().await;
    assert!(!cluster.endpoints_of("web").await["vm-1"].1);
    let holder = own_leases.get(LEASE_NAME).await.unwrap();
    let holder = holder.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("b"));
    assert_no_rbac_errors(&a);
    assert_no_rbac_errors(&b);
}

/// `deploy/fencing.yaml` is the leadership crate's documented policy template, filled in for
/// this controller (plus labels): the template adopters copy is the one tested here.
#[test]
fn fencing_policy_is_the_leadership_template_for_this_controller() {
    let rendered = leadership::FENCING_POLICY_TEMPLATE
        .replace("POLICY_NAME", "external-endpoints-fencing")
        .replace("API_GROUP", "discovery.k8s.io")
        .replace("OBJECTS", "endpointslices")
        .replace(
            "USER",
            "system:serviceaccount:external-endpoints:external-endpoints",
        )
        .replace("LEASE_NAMESPACE", DEPLOY_NAME)
        .replace("LEASE_NAME", LEASE_NAME);
    let documents = |text: &str| -> Vec<serde_yaml::Value> {
        serde_yaml::Deserializer::from_str(text)
            .map(|document| serde_yaml::Value::deserialize(document).unwrap())
            .collect()
    };
    let mut deployed =
        documents(&std::fs::read_to_string(deploy_dir().join("fencing.yaml")).unwrap());
    for object in &mut deployed {
        let metadata = object["metadata"].as_mapping_mut().unwrap();
        metadata
            .remove("labels")
            .expect("deployed objects are labelled");
    }
    assert_eq!(deployed, documents(&rendered));
}
