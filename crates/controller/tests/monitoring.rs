//! `deploy/monitoring/`: the rules pass `promtool check rules` and their unit tests (each alert
//! fires on a bad series and stays silent on a healthy one); the PrometheusRule and the chart
//! carry the same rules; and a real Prometheus on 127.0.0.1, scraping two controller replicas
//! on the testbed with the rules loaded, evaluates every dashboard and rule expression, the
//! dashboard's panels all return data, and the no-leader alert is pending once the leader is
//! stopped with no standby left.
//!
//! promtool and prometheus are built from Go modules by `scripts/build-tools.sh` into
//! ~/.cache/external-endpoints/<tool>-<version>; without them the tests are skipped outside CI.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use harness::{Cluster, Replica, http_get};
use serde_json::Value;
use slices::testing::{vm, web};
use tokio::time::Instant;

const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// The Prometheus version `scripts/build-tools.sh` builds (promtool comes with it).
const PROMETHEUS_VERSION: &str = "0.316.0";

/// Longest wait for Prometheus to have scraped and evaluated what a step needs.
const SETTLE: Duration = Duration::from_secs(60);

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring")
}

/// `~/.cache/external-endpoints/<tool>-<version>/<tool>`, or None (skip) outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME").unwrap();
    let path = Path::new(&home).join(format!(
        ".cache/external-endpoints/{name}-{PROMETHEUS_VERSION}/{name}"
    ));
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !testbed::running_in_ci(),
        "no {name} at {}: run scripts/build-tools.sh",
        path.display()
    );
    eprintln!("monitoring test skipped: run scripts/build-tools.sh {name}");
    None
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&text).unwrap()).unwrap()
}

/// Every rule of rules.yaml: (alert name or recorded name, expression).
fn rules() -> Vec<(String, bool, String)> {
    let rules = yaml(&monitoring().join("rules.yaml"));
    let mut found = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let (name, alert) = match rule.get("alert") {
                Some(alert) => (alert, true),
                None => (&rule["record"], false),
            };
            let name = name.as_str().unwrap().to_string();
            found.push((name, alert, rule["expr"].as_str().unwrap().to_string()));
        }
    }
    found
}

#[test]
fn promtool_checks_the_rules_and_each_alert_has_a_firing_and_a_silent_case() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    for args in [
        vec!["check", "rules", "rules.yaml"],
        vec!["test", "rules", "rules-test.yaml"],
    ] {
        let output = Command::new(&promtool)
            .args(&args)
            .current_dir(monitoring())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tests = yaml(&monitoring().join("rules-test.yaml"));
    let (mut firing, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for test in tests["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_string();
            match case["exp_alerts"].as_array().unwrap().is_empty() {
                true => silent.insert(name),
                false => firing.insert(name),
            };
        }
    }
    let alerts: BTreeSet<String> = (rules().into_iter())
        .filter(|(_, alert, _)| *alert)
        .map(|(name, _, _)| name)
        .collect();
    assert_eq!(alerts.len(), 9, "{alerts:?}");
    assert_eq!(firing, alerts, "a case where each alert fires");
    assert_eq!(silent, alerts, "a case where each alert is silent");
}

#[test]
fn the_prometheus_rule_and_the_chart_carry_the_same_rules() {
    let rules = yaml(&monitoring().join("rules.yaml"));
    let wrapped = yaml(&monitoring().join("prometheus-rule.yaml"));
    assert_eq!(wrapped["kind"], "PrometheusRule");
    assert_eq!(wrapped["spec"], rules);
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/external-endpoints");
    assert_eq!(
        std::fs::read_to_string(chart.join("files/rules.yaml")).unwrap(),
        std::fs::read_to_string(monitoring().join("rules.yaml")).unwrap(),
        "charts/external-endpoints/files/rules.yaml is a copy of deploy/monitoring/rules.yaml"
    );
}

/// The dashboard's expressions: (panel title, expression), `$__rate_interval` as 1m.
fn dashboard() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(monitoring().join("dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut found = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            found.push((
                panel["title"].as_str().unwrap().to_string(),
                expr.replace("$__rate_interval", "1m"),
            ));
        }
    }
    found
}

/// A Prometheus process, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(binary: &Path, targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: external-endpoints\n    static_configs:\n      - targets: [{}]\n",
            monitoring().join("rules.yaml").display(),
            targets.join(", ")
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let prometheus = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        prometheus
            .until("Prometheus ready", |p| async move {
                matches!(http_get(p.addr, "/-/ready").await, Ok((200, _))).then_some(())
            })
            .await;
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The `data` of an HTTP API answer; panics on an API error (a bad expression).
    async fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.addr, path).await.unwrap();
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert!(
            status == 200 && answer["status"] == "success",
            "{path}: {status} {body}"
        );
        answer["data"].clone()
    }

    /// The result vector of an instant query.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await;
        data["result"].as_array().unwrap().clone()
    }

    async fn until<'a, T, F, Fut>(&'a self, what: &str, check: F) -> T
    where
        F: Fn(&'a Prometheus) -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let started = Instant::now();
        loop {
            if let Some(value) = check(self).await {
                return value;
            }
            assert!(
                started.elapsed() < SETTLE,
                "{what}: not within {SETTLE:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_evaluates_the_dashboard_and_rules_and_the_no_leader_alert_pends() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(binary) = tool("prometheus") else {
        return;
    };
    let cluster = Cluster::new(testbed, "monitoring").await;
    let leader = Replica::start(BINARY, testbed, &cluster.namespace, "a", &[]).await;
    leader.wait_leading(harness::CONVERGE).await;
    let standby = Replica::start(BINARY, testbed, &cluster.namespace, "b", &[]).await;
    let prometheus = Prometheus::start(&binary, &[leader.admin(), standby.admin()]).await;
    // Changes published while Prometheus scrapes, so the latency and stage panels have data.
    cluster.create_service(web()).await;
    for i in 1..=5 {
        cluster
            .apply_workload(vm(&format!("vm-{i}"), &format!("10.30.0.{i}")))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cluster.wait_converged().await;

    // Every rule expression parses and evaluates; every dashboard panel returns data.
    for (_, _, expr) in rules() {
        prometheus.query(&expr).await;
    }
    for (title, expr) in dashboard() {
        prometheus
            .until(&format!("panel {title}: {expr}"), |p| {
                let expr = expr.clone();
                async move { (!p.query(&expr).await.is_empty()).then_some(()) }
            })
            .await;
    }
    let leaders = prometheus.query("external_endpoints:leaders:sum").await;
    assert_eq!(leaders[0]["value"][1], "1", "{leaders:?}");

    // No standby, then no leader: the alert goes pending (firing would take its 30 s `for`).
    drop(standby);
    drop(leader);
    prometheus
        .until("ExternalEndpointsNoLeader pending", |p| async move {
            let alerts = p.api("/api/v1/alerts").await;
            (alerts["alerts"].as_array().unwrap().iter()).find_map(|alert| {
                (alert["labels"]["alertname"] == "ExternalEndpointsNoLeader"
                    && alert["state"] == "pending")
                    .then_some(())
            })
        })
        .await;
}
