//! End-to-end test support: real `external-endpoints` processes against the testbed's real
//! kube-apiserver, and helpers to change objects and wait for slices to converge.
#![allow(dead_code)] // each test binary uses a different part of this module
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the failure report

pub mod chaos;
pub mod proxy;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use slices::{Config, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, plan_slices};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    process::{Child, Command},
    time::Instant,
};

/// How long a test waits for a condition before failing.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// Lease timings used by the e2e replicas: short, so fail-over tests stay quick.
pub const LEASE_ARGS: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "1s",
];

/// Name of the Lease the e2e replicas share (one per test namespace).
pub const LEASE: &str = "e2e-lease";

/// Waits until `check` succeeds, polling; fails the test with the last error after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(error) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// One controller process.
pub struct Replica {
    /// Its Lease identity.
    pub identity: String,
    child: Child,
    log: PathBuf,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
}

// === impl Replica ===

impl Replica {
    /// Starts a replica watching `namespace` and competing for [`LEASE`] there, and waits for
    /// its admin server. `extra` flags are appended.
    pub async fn start(
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        extra: &[&str],
    ) -> Replica {
        let mut args = vec!["--watch-namespace", namespace];
        args.extend(["--lease-namespace", namespace, "--lease-name", LEASE]);
        args.extend(LEASE_ARGS);
        args.extend(["--log-level", "info,cluster=debug,leadership=debug"]);
        args.extend(["--drain-timeout", "5s"]);
        args.extend(extra);
        Replica::start_with(testbed.kubeconfig_path(), identity, &args).await
    }

    /// The admin server's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The replica's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` on the admin server: (status, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.admin, path).await
    }

    /// The sum of every series of metric `name` (optionally only those whose labels contain
    /// `labels`, e.g. `operation="Create"`).
    pub async fn metric(&self, name: &str, labels: &str) -> Result<f64, String> {
        let (_, body) = self.get("/metrics").await?;
        sum_metric(&body, name, labels).ok_or_else(|| format!("no metric {name} in:\n{body}"))
    }

    /// Whether the replica reports itself as leader.
    pub async fn is_leader(&self) -> bool {
        self.metric("external_endpoints_leader", "")
            .await
            .unwrap_or(0.0)
            == 1.0
    }

    /// Waits until this replica leads.
    pub async fn wait_leading(&self) {
        eventually(&format!("{} to lead", self.identity), CONVERGE, || async {
            if self.is_leader().await {
                Ok(())
            } else {
                Err("not leading".to_string())
            }
        })
        .await
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends SIGKILL (crash).
    pub fn kill(&self) {
        self.signal("-KILL");
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.id() {
            let status = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill {signal} {pid} failed");
        }
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!(
                "{} did not exit within {timeout:?}; log:\n{}",
                self.identity,
                self.log()
            ),
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "--- replica {} log (last 60 lines) ---\n{}",
                self.identity,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

fn admin_address(log: &Path) -> Result<SocketAddr, String> {
    let text = std::fs::read_to_string(log).map_err(|e| e.to_string())?;
    for line in text.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(admin) = value.get("admin").and_then(|a| a.as_str()) {
            return admin.parse().map_err(|e| format!("{admin}: {e}"));
        }
    }
    Err(format!("no admin address yet; log:\n{text}"))
}

/// `GET path` over plain HTTP/1.1: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("bad response: {response}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Sums the samples of `name` (counters end in `_total`) in Prometheus text, filtered by a
/// label substring. A declared family with no sample yet sums to 0; an undeclared name is None,
/// so a misspelt metric can never pass as zero.
pub fn sum_metric(body: &str, name: &str, labels: &str) -> Option<f64> {
    let family = name.strip_suffix("_total").unwrap_or(name);
    let declared = body
        .lines()
        .any(|line| line.starts_with(&format!("# TYPE {family} ")));
    let samples: Vec<f64> = body
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name && series.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .collect();
    (declared || !samples.is_empty()).then(|| samples.iter().sum::<f64>() + 0.0)
}

/// The objects of one test namespace, through the real API.
#[derive(Clone)]
pub struct Cluster {
    /// Admin client.
    pub client: Client,
    /// The test's namespace.
    pub namespace: String,
}

// === impl Cluster ===

impl Cluster {
    /// A fresh namespace on the shared testbed.
    pub async fn new(testbed: &testbed::Testbed, test: &str) -> Cluster {
        let client = testbed.client().await.unwrap();
        let namespace = testbed.fresh_namespace(test).await.unwrap();
        Cluster { client, namespace }
    }

    /// Services of the namespace.
    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// ExternalWorkloads of the namespace.
    pub fn workloads(&self) -> Api<ExternalWorkload> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// EndpointSlices of the namespace.
    pub fn slices_api(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Leases of the namespace.
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a Service from a fixture (server-assigned uid and cluster IP).
    pub async fn create_service(&self, service: impl Into<Service>) -> Service {
        let mut service = service.into();
        service.metadata.namespace = Some(self.namespace.clone());
        service.metadata.uid = None;
        if let Some(spec) = service.spec.as_mut()
            && spec.cluster_ip.as_deref() != Some("None")
        {
            spec.cluster_ip = None;
        }
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .unwrap()
    }

    /// Replaces a Service's spec and labels with the fixture's.
    pub async fn update_service(&self, service: impl Into<Service>) -> Service {
        self.try_update_service(service).await.unwrap()
    }

    /// [`Cluster::update_service`], failing instead of panicking.
    pub async fn try_update_service(
        &self,
        service: impl Into<Service>,
    ) -> Result<Service, kube::Error> {
        let wanted = service.into();
        let name = wanted.name_any();
        let mut current = self.services().get(&name).await?;
        current.metadata.labels = wanted.metadata.labels;
        let cluster_ip = current.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        let cluster_ips = current.spec.as_ref().and_then(|s| s.cluster_ips.clone());
        let mut spec = wanted.spec.unwrap_or_default();
        spec.cluster_ip = cluster_ip;
        spec.cluster_ips = cluster_ips;
        current.spec = Some(spec);
        self.services()
            .replace(&name, &PostParams::default(), &current)
            .await
    }

    /// Creates or replaces a workload from a fixture, status included.
    pub async fn apply_workload(&self, workload: impl Into<ExternalWorkload>) -> ExternalWorkload {
        self.try_apply_workload(workload).await.unwrap()
    }

    /// [`Cluster::apply_workload`], failing instead of panicking (safe to retry).
    pub async fn try_apply_workload(
        &self,
        workload: impl Into<ExternalWorkload>,
    ) -> Result<ExternalWorkload, kube::Error> {
        let mut workload = workload.into();
        workload.metadata.namespace = Some(self.namespace.clone());
        workload.metadata.uid = None;
        let status = workload.status.clone();
        let name = workload.name_any();
        let api = self.workloads();
        let mut stored = match api.get_opt(&name).await? {
            Some(current) => {
                workload.metadata.resource_version = current.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &workload)
                    .await?
            }
            None => api.create(&PostParams::default(), &workload).await?,
        };
        if status.is_some() {
            stored.status = status;
            stored = api
                .replace_status(&name, &PostParams::default(), &stored)
                .await?;
        }
        Ok(stored)
    }

    /// Deletes a workload.
    pub async fn delete_workload(&self, name: &str) {
        self.try_delete_workload(name).await.unwrap()
    }

    /// Deletes a workload; one already gone counts as deleted (a retry after a lost answer).
    pub async fn try_delete_workload(&self, name: &str) -> Result<(), kube::Error> {
        match self
            .workloads()
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// The managed slices of the namespace (our managed-by label), sorted by name.
    pub async fn slices(&self) -> Vec<EndpointSlice> {
        let params = ListParams::default().labels(&format!(
            "{MANAGED_BY_LABEL}={}",
            Config::default().managed_by()
        ));
        let mut slices = self.slices_api().list(&params).await.unwrap().items;
        slices.sort_by_key(|s| s.name_any());
        slices
    }

    /// The managed slices of one Service.
    pub async fn slices_of(&self, service: &str) -> Vec<EndpointSlice> {
        self.slices()
            .await
            .into_iter()
            .filter(|s| s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(service))
            .collect()
    }

    /// Endpoints of a Service's slices: workload name → (addresses, ready).
    pub async fn endpoints_of(&self, service: &str) -> BTreeMap<String, (Vec<String>, bool)> {
        let mut endpoints = BTreeMap::new();
        for slice in self.slices_of(service).await {
            for endpoint in slice.endpoints.unwrap_or_default() {
                let name = endpoint.target_ref.and_then(|r| r.name).unwrap_or_default();
                let ready = endpoint.conditions.and_then(|c| c.ready).unwrap_or(false);
                endpoints.insert(name, (endpoint.addresses, ready));
            }
        }
        endpoints
    }

    /// `Ok` when every Service's slices are exactly what the planner computes from the objects
    /// now in the API (planning over them yields no write).
    pub async fn converged(&self) -> Result<(), String> {
        let services = self
            .services()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let workloads = self
            .workloads()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let slices = self.slices().await;
        let config = Config::default();
        let now = Time(Timestamp::now());
        let workload_refs: Vec<&ExternalWorkload> = workloads.iter().collect();
        for service in &services {
            let name = service.name_any();
            let existing: Vec<&EndpointSlice> = slices
                .iter()
                .filter(|s| s.labels().get(SERVICE_NAME_LABEL) == Some(&name))
                .collect();
            let plan = plan_slices(service, &workload_refs, &existing, &config, &now);
            if !plan.is_empty() {
                return Err(format!(
                    "service {name}: {} creates, {} updates, {} deletes still needed",
                    plan.creates.len(),
                    plan.updates.len(),
                    plan.deletes.len()
                ));
            }
        }
        Ok(())
    }

    /// Waits until [`Cluster::converged`].
    pub async fn wait_converged(&self) {
        eventually("slices to converge", CONVERGE, || self.converged()).await
    }

    /// The Lease of the e2e replicas.
    pub async fn lease(&self) -> Option<Lease> {
        self.leases().get_opt(LEASE).await.unwrap()
    }

    /// Holder of the e2e Lease (None when released).
    pub async fn lease_holder(&self) -> Option<String> {
        self.lease()
            .await
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
    }
}

// === Added for tests that choose every flag themselves (deploy.rs) ===

impl Replica {
    /// Starts the binary with `kubeconfig`, `identity`, JSON logs on a free admin port and
    /// exactly the other flags in `args` (no namespace or Lease flags are added: cluster-wide
    /// unless `args` says otherwise), and waits for its admin server.
    pub async fn start_with(kubeconfig: &Path, identity: &str, args: &[&str]) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(format!("{identity}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--identity", identity])
            .args(["--admin-addr", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("WATCH_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let admin = eventually("the admin address in the log", CONVERGE, || async {
            admin_address(&log)
        })
        .await;
        Replica {
            identity: identity.to_string(),
            child,
            log,
            admin,
            _dir: dir,
        }
    }

    /// Waits until `/ready` answers 200.
    pub async fn wait_ready(&self) {
        eventually(
            &format!("{} to be ready", self.identity),
            CONVERGE,
            || async {
                match self.get("/ready").await? {
                    (200, _) => Ok(()),
                    (status, body) => Err(format!("/ready {status} {body}")),
                }
            },
        )
        .await
    }
}
