//! The client of the chaos tests: a bounded number of random changes to workloads (IP,
//! readiness, labels, deletion) and Services (port, targetPort, selector), written in the
//! background, with a model of what it last wrote for each object, to check the slices against.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::jiff::Timestamp;
use slices::testing::{Svc, Workload};
use tokio::{sync::watch, task::JoinHandle};

use crate::{CONVERGE, Cluster, eventually};

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

/// How long [`Model::apply_retrying`] keeps trying one change (a restarting API server or
/// etcd on a loaded machine).
const RETRY_WRITES_FOR: Duration = Duration::from_secs(240);

/// A background client making a bounded number of random changes.
pub struct Churn {
    progress: watch::Receiver<usize>,
    task: JoinHandle<(Model, Option<Change>)>,
}

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
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (from the high bits, the better ones of xorshift).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// An independent generator (for a background task).
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64() | 1)
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
        self.try_apply(cluster, change).await.unwrap()
    }

    /// Writes `change`, failing instead of panicking (every change is safe to write again).
    pub async fn try_apply(&self, cluster: &Cluster, change: &Change) -> Result<(), kube::Error> {
        match change {
            Change::Service(name, _) => cluster
                .try_update_service(self.service(name))
                .await
                .map(|_| ()),
            Change::Workload(name, _) if self.workloads[name].exists => cluster
                .try_apply_workload(self.workload(name))
                .await
                .map(|_| ()),
            Change::Workload(name, _) => cluster.try_delete_workload(name).await,
        }
    }

    /// Writes `change`, again and again while the API is unavailable (a control-plane outage),
    /// until it is accepted or `RETRY_WRITES_FOR` has passed.
    pub async fn apply_retrying(&self, cluster: &Cluster, change: &Change) {
        let deadline = tokio::time::Instant::now() + RETRY_WRITES_FOR;
        loop {
            match self.try_apply(cluster, change).await {
                Ok(()) => return,
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    panic!("{change:?} not accepted in {RETRY_WRITES_FOR:?}: {error}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
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
            // A placeholder (docs/slices.md): the last slice of a family kept empty when its
            // last endpoint left, with no endpoints and no ports.
            let placeholder = slice.endpoints.as_ref().is_none_or(Vec::is_empty);
            let ports: Vec<Option<i32>> = slice
                .ports
                .unwrap_or_default()
                .iter()
                .map(|p| p.port)
                .collect();
            let expected: &[Option<i32>] = if placeholder { &[] } else { &[Some(port)] };
            if ports != expected {
                return Err(format!(
                    "service {name}: ports {ports:?}, expected {expected:?}{}",
                    if placeholder { " (a placeholder)" } else { "" }
                ));
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
        model: Model,
        rng: Rng,
        changes: usize,
        pause: Duration,
    ) -> Churn {
        Self::start_writing(cluster, model, rng, (changes, pause), false)
    }

    /// Like [`Churn::start`], but each change is retried while the API is unavailable (see
    /// [`Model::apply_retrying`]): the client of a control-plane outage.
    pub fn start_retrying(
        cluster: &Cluster,
        model: Model,
        rng: Rng,
        changes: usize,
        pause: Duration,
    ) -> Churn {
        Self::start_writing(cluster, model, rng, (changes, pause), true)
    }

    fn start_writing(
        cluster: &Cluster,
        mut model: Model,
        mut rng: Rng,
        (changes, pause): (usize, Duration),
        retry: bool,
    ) -> Churn {
        let cluster = cluster.clone();
        let (progress, receiver) = watch::channel(0);
        let task = tokio::spawn(async move {
            let mut last = None;
            for done in 1..=changes {
                let change = model.random_change(&mut rng);
                if retry {
                    model.apply_retrying(&cluster, &change).await;
                } else {
                    model.apply(&cluster, &change).await;
                }
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
