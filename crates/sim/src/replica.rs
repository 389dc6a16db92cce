//! One controller replica of the simulation: the production `cluster::Controller`, built the
//! way the binary builds it, with a `kube::Client` over its [`Link`] to the in-memory API.

use std::{sync::Arc, time::Duration};

use cluster::{Controller, ControllerConfig};
use leadership::{Leadership, LeaseConfig, LeaseTimings, RuntimeConfig};
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

/// A running controller: its task, its shutdown signal (SIGTERM), and the task that checks
/// leadership whenever its leadership changes.
struct Process {
    run: JoinHandle<Result<(), cluster::Error>>,
    shutdown: CancellationToken,
    watcher: JoinHandle<()>,
    leadership: Leadership,
    /// The controller's metrics, as the binary serves them on `/metrics`.
    registry: Registry,
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
        let service = LinkService::new(
            server.service(&self.identity),
            self.link.clone(),
            checks.clone(),
        );
        let client = kube::Client::new(service, "default");
        let mut registry = Registry::default();
        let controller = Controller::new(client, config, &mut registry);
        let leadership = controller.leadership();
        self.link.attach(leadership.clone(), checks.clone());
        checks.attach(self.index, leadership.clone());
        let shutdown = CancellationToken::new();
        let span = tracing::info_span!("replica", name = %self.identity);
        let run = tokio::spawn(tracing::Instrument::instrument(
            controller.run(shutdown.clone()),
            span,
        ));
        let watched = checks.clone();
        let link = self.link.clone();
        let mut changes = leadership.clone();
        let watcher = tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                link.observe();
                watched.check_leaders();
            }
        });
        self.process = Some(Process {
            run,
            shutdown,
            watcher,
            leadership,
            registry,
        });
    }

    /// The running process's leadership: `Some(term)` while it leads.
    pub fn leadership(&self) -> Option<Leadership> {
        Some(self.process.as_ref()?.leadership.clone())
    }

    /// The running process's metrics in the text format of `/metrics` (empty when none runs).
    pub fn metrics(&self) -> String {
        let mut text = String::new();
        if let Some(process) = &self.process {
            // Writing into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut text, &process.registry);
        }
        text
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

/// The controller's configuration in the simulation for replica `identity`, with the
/// protection `off` switched off: the binary's defaults but for the stall bound (30 s).
pub fn config(identity: &str, off: Option<Safeguard>) -> ControllerConfig {
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
        Some(Safeguard::StallBound) | None => {}
    }
    let stall_bound = if off == Some(Safeguard::StallBound) {
        Duration::from_secs(3_600)
    } else {
        Duration::from_secs(30)
    };
    #[allow(clippy::expect_used)] // constants of the simulation, valid by construction
    let lease = LeaseConfig::new(
        LEASE_NAME,
        LEASE_NAMESPACE,
        identity,
        LeaseTimings::default(),
    )
    .expect("valid lease config")
    .with_safeguards(leadership);
    #[allow(clippy::expect_used)]
    // The binary's defaults (issue 34): up to 32 Services at once, their calls in flight under
    // the write path's adaptive limit, so the seeds run with writes pipelined as deployed.
    let runtime = RuntimeConfig::builder()
        .workers(32)
        .build()
        .expect("valid runtime config")
        .with_safeguards(leadership);
    ControllerConfig {
        slices: slices::Config::default(),
        lease,
        coordinated: None,
        runtime,
        namespace: None,
        stall_bound,
        write_qps: 2000,
        safeguards: controller,
    }
}
