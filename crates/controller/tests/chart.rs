//! The Helm chart (`charts/external-endpoints`): with `ci/deploy-values.yaml` it renders exactly
//! the objects of every file `deploy/kustomization.yaml` lists (one source of truth), `helm lint`
//! passes, and on the testbed it installs, upgrades (a changed value reaches the Deployment's
//! args), grants the ServiceAccount every right `external-endpoints check` asks for, and
//! uninstalls.
//!
//! helm is built from Go modules by `scripts/build-tools.sh helm` into
//! ~/.cache/external-endpoints/helm-<version> (or named by `HELM`); without it the tests are
//! skipped outside CI and fail in CI.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use k8s_openapi::{api::apps::v1::Deployment, serde::Deserialize};
use kube::Api;
use tokio::time::Instant;

/// The helm version `scripts/build-tools.sh` builds.
const HELM_VERSION: &str = "3.21.4";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart() -> PathBuf {
    repo().join("charts/external-endpoints")
}

/// The helm binary, or None (skip) when it is not built and this is not CI.
fn helm() -> Option<PathBuf> {
    let path = std::env::var_os("HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap();
            Path::new(&home).join(format!(
                ".cache/external-endpoints/helm-{HELM_VERSION}/helm"
            ))
        });
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !testbed::running_in_ci(),
        "no helm at {}: run scripts/build-tools.sh helm",
        path.display()
    );
    eprintln!("chart tests skipped: run scripts/build-tools.sh helm");
    None
}

/// Runs helm with its caches in a temporary folder; returns stdout, panics on failure.
fn run(helm: &Path, args: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let output = Command::new(helm)
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "helm {args:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The objects of a multi-document YAML text, keyed by kind, namespace and name.
fn objects(text: &str, into: &mut BTreeMap<String, serde_json::Value>) {
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(document).unwrap();
        if value.is_null() {
            continue;
        }
        let key = format!(
            "{} {}/{}",
            value["kind"].as_str().unwrap(),
            value["metadata"]["namespace"].as_str().unwrap_or(""),
            value["metadata"]["name"].as_str().unwrap()
        );
        assert!(into.insert(key.clone(), value).is_none(), "{key} twice");
    }
}

#[test]
fn the_chart_renders_every_deploy_file_exactly() {
    let Some(helm) = helm() else { return };
    let kustomization = std::fs::read_to_string(repo().join("deploy/kustomization.yaml")).unwrap();
    let kustomization: serde_yaml::Value = serde_yaml::from_str(&kustomization).unwrap();
    let mut deployed = BTreeMap::new();
    for file in kustomization["resources"].as_sequence().unwrap() {
        let path = repo().join("deploy").join(file.as_str().unwrap());
        objects(&std::fs::read_to_string(path).unwrap(), &mut deployed);
    }
    let chart = chart();
    let values = chart.join("ci/deploy-values.yaml");
    let rendered = run(
        &helm,
        &[
            "template",
            "external-endpoints",
            chart.to_str().unwrap(),
            "--namespace",
            "external-endpoints",
            "--include-crds",
            "--values",
            values.to_str().unwrap(),
        ],
    );
    let mut charted = BTreeMap::new();
    objects(&rendered, &mut charted);
    assert_eq!(
        charted.keys().collect::<Vec<_>>(),
        deployed.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, object) in &deployed {
        assert_eq!(&charted[key], object, "{key}: chart and deploy/ differ");
    }
}

/// Installed with its defaults, the chart asks for the image `scripts/image.sh` builds: the tag
/// follows the chart's appVersion, which is the workspace version the script tags with.
#[test]
fn the_default_image_is_the_one_scripts_image_sh_tags() {
    let Some(helm) = helm() else { return };
    let chart = chart();
    let rendered = run(
        &helm,
        &[
            "template",
            "ee",
            chart.to_str().unwrap(),
            "--namespace",
            "ops",
        ],
    );
    let mut charted = BTreeMap::new();
    objects(&rendered, &mut charted);
    let deployment = &charted["Deployment ops/ee"];
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap();
    let output = Command::new(repo().join("scripts/image.sh"))
        .arg("--print-ref")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let tagged = String::from_utf8(output.stdout).unwrap();
    assert_eq!(image, tagged.trim(), "the chart's default image");
    assert_eq!(
        image,
        format!("external-endpoints:{}", env!("CARGO_PKG_VERSION"))
    );
    let chart_yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).unwrap()).unwrap();
    assert_eq!(
        chart_yaml["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    // The label `check` and `diff` find the controller by, whatever the release's name.
    assert_eq!(
        deployment["metadata"]["labels"]["app.kubernetes.io/part-of"],
        "external-endpoints"
    );
}

#[test]
fn helm_lint_passes() {
    let Some(helm) = helm() else { return };
    let chart = chart();
    let values = chart.join("ci/deploy-values.yaml");
    run(&helm, &["lint", "--strict", chart.to_str().unwrap()]);
    let values = values.to_str().unwrap();
    run(
        &helm,
        &[
            "lint",
            "--strict",
            chart.to_str().unwrap(),
            "--values",
            values,
        ],
    );
}

/// The Deployment's container args.
async fn args(deployments: &Api<Deployment>, name: &str) -> Vec<String> {
    let deployment = deployments.get(name).await.unwrap();
    deployment.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installs_upgrades_and_uninstalls() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(helm) = helm() else { return };
    let namespace = testbed.fresh_namespace("chart").await.unwrap();
    let kubeconfig = testbed.kubeconfig_path().to_str().unwrap().to_string();
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let release = "ee";
    let helm_in = |verb: &[&str]| {
        let mut args = verb.to_vec();
        args.extend(["--kubeconfig", &kubeconfig, "--namespace", &namespace]);
        run(&helm, &args)
    };
    helm_in(&["install", release, chart]);
    let client = testbed.client().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let installed = args(&deployments, release).await;
    assert!(
        !installed.iter().any(|a| a.starts_with("--write-qps")),
        "{installed:?}"
    );

    helm_in(&["upgrade", release, chart, "--set", "writeQps=50"]);
    let upgraded = args(&deployments, release).await;
    assert!(
        upgraded.contains(&"--write-qps=50".to_string()),
        "{upgraded:?}"
    );

    // The chart's RBAC, by SelfSubjectAccessReview as the release's ServiceAccount.
    let account = format!("system:serviceaccount:{namespace}:{release}");
    let started = Instant::now();
    loop {
        let output = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
            .args([
                "check",
                "--kubeconfig",
                &kubeconfig,
                "--lease-namespace",
                &namespace,
            ])
            .args(["--as", &account])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let rbac: Vec<&str> = text.lines().filter(|l| l.contains(" rbac: ")).collect();
        if rbac.len() == 5 && rbac.iter().all(|l| l.starts_with("PASS")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the chart's RBAC does not pass:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Without --lease-namespace, `check` finds the Lease's namespace through the release's
    // Deployment, whatever the release is named.
    let output = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
        .args(["check", "--kubeconfig", &kubeconfig])
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        text.contains(&format!(
            "; {namespace}, from Deployment {namespace}/{release} (labelled"
        )),
        "{text}"
    );

    helm_in(&["uninstall", release]);
    assert!(deployments.get_opt(release).await.unwrap().is_none());
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client);
    assert!(roles.get_opt(release).await.unwrap().is_none());
}

#[test]
fn the_chart_renders_the_rules_of_deploy_monitoring_when_asked() {
    let Some(helm) = helm() else { return };
    let chart = chart();
    let rendered = run(
        &helm,
        &[
            "template",
            "external-endpoints",
            chart.to_str().unwrap(),
            "--namespace",
            "external-endpoints",
            "--set",
            "monitoring.prometheusRule.enabled=true",
        ],
    );
    let mut charted = BTreeMap::new();
    objects(&rendered, &mut charted);
    let rule = &charted["PrometheusRule external-endpoints/external-endpoints"];
    let text = std::fs::read_to_string(repo().join("deploy/monitoring/rules.yaml")).unwrap();
    let rules: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(rule["spec"], rules);
    let deployed = std::fs::read_to_string(repo().join("deploy/monitoring/prometheus-rule.yaml"));
    let deployed: serde_json::Value = serde_yaml::from_str(&deployed.unwrap()).unwrap();
    assert_eq!(
        rule, &deployed,
        "the chart's PrometheusRule is deploy/monitoring's"
    );
}
