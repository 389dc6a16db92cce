//! Chaos support: a client that keeps changing workloads and Services (with a model of what it
//! wrote, to check the slices against), replicas behind their own [`Proxy`], a recorder of the
//! Lease's history, Lease take-over by a foreign holder, and snapshots of slice writes.
//!
//! ```text
//!  Churn (model + random changes) ──► API ◄── replicas (some through a Proxy each)
//!  LeaseHistory ◄── watch of the Lease         slices ──► Model::check / SliceVersions
//! ```

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
    config::Kubeconfig,
};
use slices::testing::{Svc, Workload};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use futures::{StreamExt, TryStreamExt};

use super::{CONVERGE, Cluster, LEASE, LEASE_ARGS, Replica, eventually, proxy::Proxy};

/// The workloads' one port (named `http`).
const WORKLOAD_PORT: i32 = 8080;
/// Selector values a Service or workload label can take (`idle` selects nothing).
const APPS: [&str; 3] = ["web", "api", "idle"];

/// A small deterministic random generator (xorshift64*): a failing run prints its seed, and
/// `CHAOS_SEED=<seed>` replays the same choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

/// What the client last wrote for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ServiceModel {
    selector: &'static str,
    port: i32,
    /// `None`: the named targetPort `http`; a number otherwise.
    target: Option<i32>,
}

/// What the client last wrote for one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WorkloadModel {
    app: &'static str,
    ip: String,
    ready: bool,
    exists: bool,
}

/// The objects as the client last wrote them.
#[derive(Clone, Debug, Default)]
pub struct Model {
    services: BTreeMap<String, ServiceModel>,
    workloads: BTreeMap<String, WorkloadModel>,
    next_ip: u32,
}

/// One change the client made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A workload's IP, readiness or labels changed, or it was deleted or re-created.
    Workload(String, &'static str),
    /// A Service's port or selector changed.
    Service(String, &'static str),
}

/// A background client making a bounded number of random changes.
pub struct Churn {
    progress: watch::Receiver<usize>,
    task: JoinHandle<(Model, Option<Change>)>,
}

/// The Lease records as a watch delivered them (every write, in order).
pub struct LeaseHistory {
    records: watch::Receiver<Vec<LeaseRecord>>,
    task: JoinHandle<()>,
}

/// One write of the Lease.
#[derive(Clone, Debug)]
pub struct LeaseRecord {
    /// The holder (None when released).
    pub holder: Option<String>,
    /// When the test saw it.
    pub seen: Instant,
}

/// Name → resourceVersion of the managed slices: any write changes it.
pub type SliceVersions = BTreeMap<String, String>;

// === impl Rng ===

impl Rng {
    /// From `CHAOS_SEED`, or the clock; the seed is printed (shown when the test fails).
    pub fn seeded(test: &str) -> Rng {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .and_then(|seed| seed.trim().parse().ok())
            .unwrap_or_else(|| Timestamp::now().as_nanosecond() as u64);
        eprintln!("{test}: CHAOS_SEED={seed}");
        Rng(seed | 1)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (from the high bits, the better ones of xorshift).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }

    /// An independent generator (for a background task).
    pub fn fork(&mut self) -> Rng {
        Rng(self.next() | 1)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

// === impl Model ===

impl Model {
    /// Two Services (`web` with a named targetPort, `api` with a numeric one) and six
    /// workloads split between them, some not ready.
    pub fn new() -> Model {
        let mut model = Model::default();
        for (name, selector, target) in [("web", "web", None), ("api", "api", Some(8080))] {
            let service = ServiceModel {
                selector,
                port: 80,
                target,
            };
            model.services.insert(name.to_string(), service);
        }
        for i in 0..6 {
            let workload = WorkloadModel {
                app: APPS[i % 2],
                ip: model.fresh_ip(),
                ready: i % 3 != 0,
                exists: true,
            };
            model.workloads.insert(format!("w{i}"), workload);
        }
        model
    }

    /// Creates every object of the model.
    pub async fn create(&self, cluster: &Cluster) {
        for name in self.services.keys() {
            cluster.create_service(self.service(name)).await;
        }
        for name in self.workloads.keys() {
            cluster.apply_workload(self.workload(name)).await;
        }
    }

    fn fresh_ip(&mut self) -> String {
        self.next_ip += 1;
        format!("10.1.{}.{}", self.next_ip / 250, self.next_ip % 250 + 1)
    }

    fn service(&self, name: &str) -> Svc {
        let model = &self.services[name];
        let service = Svc::named(name).selector("app", model.selector);
        match model.target {
            None => service.port("http", model.port, "http"),
            Some(number) => service.port("http", model.port, number),
        }
    }

    fn workload(&self, name: &str) -> Workload {
        let model = &self.workloads[name];
        let workload = Workload::named(name)
            .label("app", model.app)
            .ip(&model.ip)
            .port("http", WORKLOAD_PORT);
        if model.ready {
            workload.ready()
        } else {
            workload.not_ready()
        }
    }

    /// Picks a random change and records it in the model (not yet in the API).
    pub fn random_change(&mut self, rng: &mut Rng) -> Change {
        let roll = rng.below(100);
        if roll < 15 {
            let names: Vec<String> = self.services.keys().cloned().collect();
            let name = names[rng.below(names.len())].clone();
            let service = self.services.get_mut(&name).unwrap();
            if rng.below(2) == 0 {
                service.port = if service.port == 80 { 81 } else { 80 };
                service.target = rng.pick(&[None, Some(WORKLOAD_PORT), Some(9090)]);
                return Change::Service(name, "port");
            }
            let others: Vec<&str> = APPS[..2]
                .iter()
                .copied()
                .filter(|app| *app != service.selector)
                .collect();
            service.selector = rng.pick(&others);
            return Change::Service(name, "selector");
        }
        let names: Vec<String> = self.workloads.keys().cloned().collect();
        let name = names[rng.below(names.len())].clone();
        let ip = self.fresh_ip();
        let workload = self.workloads.get_mut(&name).unwrap();
        let what = if !workload.exists {
            workload.exists = true;
            "re-created"
        } else if roll < 50 {
            workload.ip = ip;
            "ip"
        } else if roll < 75 {
            workload.ready = !workload.ready;
            "readiness"
        } else if roll < 90 {
            let others: Vec<&str> = APPS
                .iter()
                .copied()
                .filter(|app| *app != workload.app)
                .collect();
            workload.app = rng.pick(&others);
            "labels"
        } else {
            workload.exists = false;
            "deleted"
        };
        Change::Workload(name, what)
    }

    /// A change that is certain to change some slice: a new ready workload selected by `web`.
    pub fn visible_change(&mut self) -> Change {
        let ip = self.fresh_ip();
        let app = self.services["web"].selector;
        let name = format!("visible-{}", self.next_ip);
        let workload = WorkloadModel {
            app,
            ip,
            ready: true,
            exists: true,
        };
        self.workloads.insert(name.clone(), workload);
        Change::Workload(name, "created")
    }

    /// Writes `change` (already in the model) to the API.
    pub async fn apply(&self, cluster: &Cluster, change: &Change) {
        match change {
            Change::Service(name, _) => {
                cluster.update_service(self.service(name)).await;
            }
            Change::Workload(name, _) if self.workloads[name].exists => {
                cluster.apply_workload(self.workload(name)).await;
            }
            Change::Workload(name, _) => cluster.delete_workload(name).await,
        }
    }

    /// Endpoints the slices of `service` must hold: workload → (addresses, ready).
    fn expected_endpoints(&self, service: &str) -> BTreeMap<String, (Vec<String>, bool)> {
        let selector = self.services[service].selector;
        self.workloads
            .iter()
            .filter(|(_, w)| w.exists && w.app == selector)
            .map(|(name, w)| (name.clone(), (vec![w.ip.clone()], w.ready)))
            .collect()
    }

    /// `Ok` when the slices hold exactly the endpoints and ports of what the client wrote.
    pub async fn check(&self, cluster: &Cluster) -> Result<(), String> {
        for name in self.services.keys() {
            self.check_service(cluster, name).await?;
        }
        Ok(())
    }

    async fn check_service(&self, cluster: &Cluster, name: &str) -> Result<(), String> {
        let expected = self.expected_endpoints(name);
        let actual = cluster.endpoints_of(name).await;
        if actual != expected {
            return Err(format!(
                "service {name}: endpoints {actual:?}, expected {expected:?}"
            ));
        }
        let port = self.services[name].target.unwrap_or(WORKLOAD_PORT);
        for slice in cluster.slices_of(name).await {
            let ports: Vec<Option<i32>> = slice
                .ports
                .unwrap_or_default()
                .iter()
                .map(|p| p.port)
                .collect();
            if ports != [Some(port)] {
                return Err(format!("service {name}: ports {ports:?}, expected {port}"));
            }
        }
        Ok(())
    }

    /// `Ok` when `change` shows in the slices (every Service, for a workload change).
    pub async fn check_change(&self, cluster: &Cluster, change: &Change) -> Result<(), String> {
        let result = match change {
            Change::Service(name, _) => self.check_service(cluster, name).await,
            Change::Workload(name, _) => {
                let mut result = Ok(());
                for service in self.services.keys() {
                    let expected = self.expected_endpoints(service).remove(name);
                    let actual = cluster.endpoints_of(service).await.remove(name);
                    if actual != expected {
                        result = Err(format!(
                            "service {service}: {name} is {actual:?}, expected {expected:?}"
                        ));
                        break;
                    }
                }
                result
            }
        };
        result.map_err(|error| format!("last change {change:?} not reflected: {error}"))
    }

    /// Waits until the cluster has converged and the slices match the model, the last change
    /// included.
    pub async fn wait_reflected(&self, cluster: &Cluster, last: Option<&Change>) {
        cluster.wait_converged().await;
        eventually("the slices to match the model", CONVERGE, || async {
            if let Some(change) = last {
                self.check_change(cluster, change).await?;
            }
            self.check(cluster).await
        })
        .await;
    }
}

// === impl Churn ===

impl Churn {
    /// Makes `changes` random changes from `model`, pausing 0..2×`pause` between them.
    pub fn start(
        cluster: &Cluster,
        mut model: Model,
        mut rng: Rng,
        changes: usize,
        pause: Duration,
    ) -> Churn {
        let cluster = cluster.clone();
        let (progress, receiver) = watch::channel(0);
        let task = tokio::spawn(async move {
            let mut last = None;
            for done in 1..=changes {
                let change = model.random_change(&mut rng);
                model.apply(&cluster, &change).await;
                last = Some(change);
                progress.send_replace(done);
                let jitter = rng.below(2000) as u32;
                tokio::time::sleep(pause * jitter / 1000).await;
            }
            (model, last)
        });
        Churn {
            progress: receiver,
            task,
        }
    }

    /// Waits until `count` changes were written.
    pub async fn wait_for(&mut self, count: usize) {
        let progress = self.progress.clone();
        eventually(&format!("{count} client changes"), CONVERGE, || {
            let done = *progress.borrow();
            async move {
                if done >= count {
                    Ok(())
                } else {
                    Err(format!("{done} done"))
                }
            }
        })
        .await
    }

    /// How many changes were written so far.
    pub fn done(&self) -> usize {
        *self.progress.borrow()
    }

    /// Waits for the last change; returns the model and that change.
    pub async fn finish(self) -> (Model, Option<Change>) {
        self.task.await.expect("the client task failed")
    }
}

// === impl LeaseHistory ===

impl LeaseHistory {
    /// Starts recording the e2e Lease: its record now, then every write.
    pub async fn start(cluster: &Cluster) -> LeaseHistory {
        let leases = cluster.leases();
        let by_name = format!("metadata.name={LEASE}");
        let list = leases
            .list(&ListParams::default().fields(&by_name))
            .await
            .unwrap();
        let mut version = list.metadata.resource_version.unwrap_or_default();
        // The record as it is now, then every later write.
        let current = list.items.first().map(|lease| LeaseRecord {
            holder: holder(lease),
            seen: Instant::now(),
        });
        let (sender, records) = watch::channel(Vec::from_iter(current));
        let task = tokio::spawn(async move {
            loop {
                let params = WatchParams::default().fields(&by_name);
                let Ok(stream) = leases.watch(&params, &version).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut stream = stream.boxed();
                while let Ok(Some(event)) = stream.try_next().await {
                    let lease = match event {
                        WatchEvent::Added(lease) | WatchEvent::Modified(lease) => lease,
                        WatchEvent::Deleted(_) | WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {
                            continue;
                        }
                    };
                    version = lease.metadata.resource_version.clone().unwrap_or_default();
                    let record = LeaseRecord {
                        holder: holder(&lease),
                        seen: Instant::now(),
                    };
                    sender.send_modify(|records| records.push(record));
                }
            }
        });
        LeaseHistory { records, task }
    }

    /// The records so far.
    pub fn records(&self) -> Vec<LeaseRecord> {
        self.records.borrow().clone()
    }

    /// The holders in order, consecutive repeats (renewals) collapsed.
    pub fn holders(&self) -> Vec<Option<String>> {
        let mut holders: Vec<Option<String>> = Vec::new();
        for record in self.records() {
            if holders.last() != Some(&record.holder) {
                holders.push(record.holder);
            }
        }
        holders
    }
}

impl Drop for LeaseHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.clone())
        .filter(|holder| !holder.is_empty())
}

// === Lease take-over ===

/// Makes `holder` the Lease holder for `seconds` through the API, as another controller
/// would (creating the Lease if missing).
pub async fn take_lease(cluster: &Cluster, holder: &str, seconds: i32) {
    update_lease(cluster, |spec| {
        spec.holder_identity = Some(holder.to_string());
        spec.lease_duration_seconds = Some(seconds);
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    })
    .await
}

/// Clears the holder, as a graceful release does.
pub async fn release_lease(cluster: &Cluster) {
    update_lease(cluster, |spec| {
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
    })
    .await
}

async fn update_lease(cluster: &Cluster, change: impl Fn(&mut LeaseSpec)) {
    let leases = cluster.leases();
    eventually("the lease write", CONVERGE, || async {
        let written = match leases.get_opt(LEASE).await.map_err(|e| e.to_string())? {
            Some(mut lease) => {
                change(lease.spec.get_or_insert_with(Default::default));
                leases.replace(LEASE, &PostParams::default(), &lease).await
            }
            None => {
                let mut lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(LEASE.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec::default()),
                };
                change(lease.spec.as_mut().unwrap());
                leases.create(&PostParams::default(), &lease).await
            }
        };
        written.map(|_| ()).map_err(|e| e.to_string())
    })
    .await
}

/// Deletes the Lease, as an operator might by hand.
pub async fn delete_lease(cluster: &Cluster) {
    cluster
        .leases()
        .delete(LEASE, &DeleteParams::default())
        .await
        .unwrap();
}

/// The Lease's acquireTime (None without a Lease).
pub async fn lease_acquire_time(cluster: &Cluster) -> Option<Timestamp> {
    cluster
        .lease()
        .await
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.acquire_time)
        .map(|time| time.0)
}

/// The Lease's renewTime (None without a Lease).
pub async fn lease_renew_time(cluster: &Cluster) -> Option<Timestamp> {
    cluster
        .lease()
        .await
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.renew_time)
        .map(|time| time.0)
}

// === slice snapshots ===

/// The managed slices' resourceVersions.
pub async fn slice_versions(cluster: &Cluster) -> SliceVersions {
    cluster
        .slices()
        .await
        .into_iter()
        .map(|slice| {
            let name = slice.metadata.name.unwrap_or_default();
            (name, slice.metadata.resource_version.unwrap_or_default())
        })
        .collect()
}

/// The latest `time` of any managedFields entry of the managed slices (second precision,
/// rounded down by the API server).
pub async fn last_slice_write(cluster: &Cluster) -> Option<Timestamp> {
    cluster
        .slices()
        .await
        .into_iter()
        .flat_map(|slice| slice.metadata.managed_fields.unwrap_or_default())
        .filter_map(|entry| entry.time.map(|time| time.0))
        .max()
}

// === replicas ===

/// When the replica last logged `message` (its JSON log's `timestamp`, this machine's clock).
pub fn log_time(replica: &Replica, message: &str) -> Option<Timestamp> {
    replica
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["message"] == message)
        .filter_map(|entry| entry["timestamp"].as_str()?.parse().ok())
        .next_back()
}

/// Successful slice writes of a replica (every operation).
pub async fn slice_writes(replica: &Replica) -> f64 {
    replica
        .metric("external_endpoints_slice_writes_total", "")
        .await
        .unwrap()
}

/// Waits until the replica's `external_endpoints_leader` is `leading`; returns when it was
/// first seen so.
pub async fn wait_gauge(replica: &Replica, leading: bool, timeout: Duration) -> Instant {
    let what = format!("{} leading={leading}", replica.identity);
    eventually(&what, timeout, || async {
        let gauge = replica.metric("external_endpoints_leader", "").await?;
        if (gauge == 1.0) == leading {
            Ok(Instant::now())
        } else {
            Err(format!("gauge {gauge}"))
        }
    })
    .await
}

/// Waits until one of `replicas` leads and the Lease names it; returns its index and when it
/// was first seen leading.
pub async fn wait_any_leading(cluster: &Cluster, replicas: &[&Replica]) -> (usize, Instant) {
    let (index, seen) = eventually("a replica to lead", CONVERGE, || async {
        for (index, replica) in replicas.iter().enumerate() {
            if replica.is_leader().await {
                return Ok((index, Instant::now()));
            }
        }
        Err("nobody leads".to_string())
    })
    .await;
    let identity = &replicas[index].identity;
    assert_eq!(
        cluster.lease_holder().await.as_ref(),
        Some(identity),
        "the Lease names the leading replica"
    );
    (index, seen)
}

// === impl Replica ===

impl Replica {
    /// A replica whose every API connection goes through its own [`Proxy`].
    pub async fn start_proxied(
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        extra: &[&str],
    ) -> (Replica, Proxy) {
        let upstream: SocketAddr = testbed
            .server_url()
            .trim_start_matches("https://")
            .parse()
            .unwrap();
        let proxy = Proxy::start(upstream).await;
        let mut kubeconfig = Kubeconfig::read_from(testbed.kubeconfig_path()).unwrap();
        for cluster in &mut kubeconfig.clusters {
            if let Some(cluster) = cluster.cluster.as_mut() {
                cluster.server = Some(format!("https://{}", proxy.addr()));
            }
        }
        // JSON is YAML: the replica reads it like any kubeconfig. It is read once, at start.
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), serde_json::to_vec(&kubeconfig).unwrap()).unwrap();
        let mut args = vec![
            "--watch-namespace",
            namespace,
            "--lease-namespace",
            namespace,
        ];
        args.extend(["--lease-name", LEASE]);
        args.extend(LEASE_ARGS);
        args.extend(["--log-level", "info,cluster=debug,leadership=debug"]);
        args.extend(["--drain-timeout", "5s"]);
        args.extend(extra);
        let replica = Replica::start_with(file.path(), identity, &args).await;
        (replica, proxy)
    }
}
