//! One controller replica of the simulation: the production `cluster::Controller`, built the
//! way the binary builds it, with a `kube::Client` over its [`Link`] to the in-memory API.

use std::{sync::Arc, time::Duration};

use cluster::{Controller, ControllerConfig};
use external_endpoints::admin::{self, Admin, Health};
use http_body_util::BodyExt;
use leadership::{LeaderHealth, Leadership};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    Safeguard,
    checks::Checks,
    link::{Link, LinkService},
};

/// The Lease the replicas compete for.
pub const LEASE_NAME: &str = "external-endpoints-write";
/// Its namespace.
pub const LEASE_NAMESPACE: &str = "default";
/// The bound on a silent watch in the simulation (`--stall-bound`).
pub const STALL_BOUND: Duration = Duration::from_secs(30);

/// A replica: its identity and link, and its process while it runs.
pub struct Replica {
    /// Its number.
    pub index: usize,
    /// Its identity (the pod name).
    pub identity: String,
    /// Its link to the API server.
    pub link: Arc<Link>,
    process: Option<Process>,
}

/// A running controller: its task, its shutdown signal (SIGTERM), the task that checks
/// leadership whenever its leadership changes, and its admin endpoints.
struct Process {
    run: JoinHandle<Result<(), cluster::Error>>,
    shutdown: CancellationToken,
    watcher: JoinHandle<()>,
    leadership: Leadership,
    /// The binary's admin endpoints (`/live`, `/ready`, `/metrics`), asked in-process, and
    /// the health they report (not ready once shutdown starts, as the binary's signal handler
    /// sets it).
    admin: Admin,
    health: Arc<Health>,
}

// === impl Replica ===

impl Replica {
    /// A replica that does not run yet.
    pub fn new(index: usize, identity: String, link: Arc<Link>) -> Self {
        Self {
            index,
            identity,
            link,
            process: None,
        }
    }

    /// Starts the controller (empty caches, as a new process).
    pub fn start(
        &mut self,
        server: &apisim::ApiServer,
        config: ControllerConfig,
        checks: &Arc<Checks>,
    ) {
        let incarnation = checks.start(self.index);
        let service = LinkService::new(
            server.service(&self.identity),
            self.link.clone(),
            checks.clone(),
            incarnation,
        );
        let client = kube::Client::new(service, "default");
        let mut registry = Registry::default();
        let controller = Controller::new(client, config, &mut registry);
        let leadership = controller.leadership();
        // As the binary's `run` builds them (the registry without the binary's prefix and
        // process collector: the scenarios read the controller's own series by name).
        let leader = LeaderHealth::new(leadership.clone(), admin::LEADER_HEALTH_TOLERANCE);
        let health = Arc::new(Health::new(controller.health()).with_leader(leader));
        let admin = Admin::new(health.clone(), registry);
        self.link.attach(checks.clone());
        checks.attach(self.index, leadership.clone());
        let shutdown = CancellationToken::new();
        let span = tracing::info_span!("replica", name = %self.identity);
        let run = tokio::spawn(tracing::Instrument::instrument(
            controller.run(shutdown.clone()),
            span,
        ));
        let watched = checks.clone();
        let mut changes = leadership.clone();
        let watcher = tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                watched.check_leaders();
            }
        });
        self.process = Some(Process {
            run,
            shutdown,
            watcher,
            leadership,
            admin,
            health,
        });
    }

    /// The running process's leadership: `Some(term)` while it leads.
    pub fn leadership(&self) -> Option<Leadership> {
        Some(self.process.as_ref()?.leadership.clone())
    }

    /// The running process's answer to `GET path` on its admin server: status and body
    /// (`None` when no process runs).
    pub fn admin(&self, path: &str) -> Option<(u16, String)> {
        let process = self.process.as_ref()?;
        let request = http::Request::get(path).body(()).ok()?;
        let response = process.admin.respond(&request);
        let status = response.status().as_u16();
        // A whole body in one frame: ready at once.
        let body = futures::FutureExt::now_or_never(response.into_body().collect())?.ok()?;
        Some((
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        ))
    }

    /// The running process's metrics as `/metrics` serves them (empty when none runs).
    pub fn metrics(&self) -> String {
        self.admin("/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Whether the running process's `/ready` answers 200 (`None` when none runs).
    pub fn ready(&self) -> Option<bool> {
        self.admin("/ready").map(|(status, _)| status == 200)
    }

    /// Kills the process at once (SIGKILL): nothing of it runs any more; requests it already
    /// handed to the API may still land.
    pub fn crash(&mut self, checks: &Checks) {
        if let Some(process) = self.process.take() {
            process.run.abort();
            process.watcher.abort();
        }
        checks.detach(self.index);
    }

    /// Asks the process to stop (SIGTERM): it drains, releases the Lease and ends on its own.
    pub fn stop(&mut self) {
        if let Some(process) = &self.process {
            process.health.set_shutting_down();
            process.shutdown.cancel();
        }
    }

    /// Whether a process is running (a stopped one runs until its drain and release are done).
    pub fn running(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|process| !process.run.is_finished())
    }

    /// Whether a process was asked to stop or is gone.
    pub fn stopping_or_gone(&self) -> bool {
        self.process
            .as_ref()
            .is_none_or(|process| process.shutdown.is_cancelled() || process.run.is_finished())
    }

    /// Forgets a process that has ended (after a graceful stop), so that it can start again.
    /// Returns what it ended with, if it ended with an error.
    pub fn reap(&mut self, checks: &Checks) -> Option<String> {
        let ended = self
            .process
            .as_ref()
            .is_some_and(|process| process.run.is_finished());
        if !ended {
            return None;
        }
        let process = self.process.take()?;
        process.watcher.abort();
        checks.detach(self.index);
        let outcome = futures::FutureExt::now_or_never(process.run)?;
        match outcome {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(join) => Some(join.to_string()),
        }
    }
}

/// The command line of replica `identity` in the simulation: the binary's defaults but for the
/// identity, the Lease and the stall bound.
pub fn arguments(identity: &str) -> Vec<String> {
    let stall = format!("{}s", STALL_BOUND.as_secs());
    [
        "external-endpoints",
        "--identity",
        identity,
        "--lease-name",
        LEASE_NAME,
        "--lease-namespace",
        LEASE_NAMESPACE,
        "--watch-stall-timeout",
        &stall,
    ]
    .map(str::to_string)
    .to_vec()
}

/// The controller's configuration in the simulation for replica `identity`, with the
/// protection `off` switched off: built by the binary's own parser from [`arguments`] (reading
/// no environment variable, so nothing of this process's environment leaks into a seed), then
/// the test-only switch of `off`, which no flag has.
pub fn config(identity: &str, off: Option<Safeguard>) -> ControllerConfig {
    #[allow(clippy::expect_used)] // constants of the simulation, valid by construction
    let settings = external_endpoints::cli::Args::settings_from_args(arguments(identity))
        .expect("the simulation's command line is valid");
    let mut config = external_endpoints::controller_config(&settings);
    let mut leadership = leadership::Safeguards::default();
    let mut controller = cluster::Safeguards::default();
    match off {
        Some(Safeguard::Fence) => leadership = leadership.without_fence(),
        Some(Safeguard::Drain) => leadership = leadership.without_drain(),
        Some(Safeguard::FreshTracker) => leadership = leadership.without_fresh_state(),
        Some(Safeguard::DeletedLeaseWait) => {
            leadership = leadership.without_deleted_lease_wait();
        }
        Some(Safeguard::Barrier) => controller = controller.without_acquisition_point(),
        Some(Safeguard::VersionFencedDeletes) => {
            controller = controller.without_version_fenced_deletes();
        }
        Some(Safeguard::OwnWrites) => controller = controller.without_own_writes(),
        Some(Safeguard::Additions) => controller = controller.without_additions(),
        // A bound past any run: the stalled watch is never replaced.
        Some(Safeguard::StallBound) => config.stall_bound = Duration::from_secs(3_600),
        None => {}
    }
    config.lease = config.lease.with_safeguards(leadership);
    config.runtime = config.runtime.with_safeguards(leadership);
    config.safeguards = controller;
    config
}
