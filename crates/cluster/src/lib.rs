//! Kubernetes glue of external-endpoints: watches and caches, the handlers that turn changes
//! into Service keys, the reconcile, the fenced writer, Events and metrics.
//!
//! ```text
//!  watch(Service) ─┐                                  ┌─► reconcile(key, term) ─► plan ─► fenced writer
//!  watch(EW) ──────┼─► Caches ─► dispatch ───► queue
//!  watch(slices) ──┘   (always)  (leader only)
//!       │ health: synced, stalled, age, version read ──► /ready, metrics, acquisition barrier
//! ```
//!
//! Every replica runs the watches; the elector starts only once all three caches have synced,
//! so a term never plans on a partial cache, and a term acquired replays only once every cache
//! has been shown at least as new as a version read from the API server after the acquisition
//! (`watch::fresh`). The watches are supervised: one that ends or panics ends [`Controller::run`]
//! with an error naming its kind (after a leader has handed over), never a silently frozen cache.
#![deny(missing_docs)]

mod app;
mod caches;
mod confirm;
mod events;
mod handlers;
mod health;
mod intern;
mod limit;
pub mod measure;
mod metrics;
mod preview;
mod reconcile;
mod safeguards;
mod store;
#[cfg(test)]
mod test_api;
mod timing;
mod view;
mod watch;
mod writer;

use std::{collections::HashMap, sync::Arc, time::Duration};

use api::v1beta1::ExternalWorkload;
use futures::FutureExt;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{Api, Client, api::ListParams, runtime::events::Reporter};
use leadership::{
    CandidateConfig, LeaseConfig, LeaseElector, Runtime, RuntimeConfig, RuntimeError,
};
use prometheus_client::registry::Registry;
use slices::{MANAGED_BY_LABEL, ServiceKey};
use tokio::{sync::mpsc, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    app::App,
    caches::Caches,
    events::Diagnostics,
    handlers::{Dispatch, Handler, OnService, OnSlice, OnWorkload, ServiceDispatcher},
    limit::{LimitConfig, LimitMetrics, WriteLimit},
    metrics::{KindLabels, LeadershipCollector, Metrics},
    reconcile::{ReconcileError, Shared, TermState},
    watch::{
        fresh::{self, Barrier, CachedCount, ReadVersion},
        health::{Command, KindHealth, version_number},
        source::{Source, WatchCounters},
    },
    writer::{KubeReadWrite, WriteRate},
};
pub use crate::{
    health::CacheHealth, preview::plan_all, reconcile::VIEW_RETRY, safeguards::Safeguards,
};

/// Everything the controller is configured with.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Planner settings (max endpoints per slice, managed-by, name prefix).
    pub slices: slices::Config,
    /// The Lease and its timings.
    pub lease: LeaseConfig,
    /// Coordinated Leader Election: the versions this replica announces in its LeaseCandidate;
    /// `None`: replicas take the Lease themselves.
    pub coordinated: Option<CandidateConfig>,
    /// Workers, drain timeout, fence margin, resync period, queue pacing.
    pub runtime: RuntimeConfig,
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// A watch that delivers nothing (no event, no bookmark) for this long is stalled: it is
    /// restarted, counted, and the replica is not ready meanwhile. Each watch asks the server for
    /// a timeout of a sixth of this, so a healthy watch hears a bookmark well within it, and a
    /// lagging one too.
    pub stall_bound: Duration,
    /// Most slice writes per second, across workers (0: no limit but the writes-in-flight
    /// limit, which adapts to the API server up to the workers' count).
    pub write_qps: u32,
    /// The controller's protections: all on, except in tests built with `test-util`.
    pub safeguards: Safeguards,
}

/// Why the controller stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Leader election stopped. Not retryable: the process exits and is restarted.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A watch task ended or panicked: its cache would be frozen. Not retryable: the process
    /// exits (after handing over, if it led) and is restarted.
    #[error("the {kind} watch stopped: {reason}")]
    WatchStopped {
        /// The watched kind.
        kind: &'static str,
        /// How it stopped.
        reason: String,
    },
}

/// A controller ready to run: metrics registered, nothing started yet.
pub struct Controller {
    client: Client,
    config: ControllerConfig,
    caches: Arc<Caches>,
    metrics: Metrics,
    runtime: Runtime<ServiceKey, TermState, ReconcileError>,
    elector: LeaseElector,
    health: CacheHealth,
    commands: WatchCommands,
}

/// The command receivers of the three watches, taken when they start.
struct WatchCommands {
    services: mpsc::UnboundedReceiver<Command>,
    workloads: mpsc::UnboundedReceiver<Command>,
    slices: mpsc::UnboundedReceiver<Command>,
}

// === impl Controller ===

impl Controller {
    /// A controller writing through `client`; registers its metrics in `registry`.
    pub fn new(client: Client, config: ControllerConfig, registry: &mut Registry) -> Self {
        let reporter = Reporter {
            controller: config.slices.managed_by().to_string(),
            instance: Some(config.lease.identity().to_string()),
        };
        // Writes in flight adapt to the API server, capped by the workers (`--workers`).
        let limit = WriteLimit::new(
            LimitConfig::capped_at(config.runtime.workers().get()),
            LimitMetrics::register(registry),
        );
        let api = KubeReadWrite::new(client.clone(), reporter)
            .version_fenced_deletes(config.safeguards.version_fenced_deletes)
            .with_limit(Arc::new(limit));
        let caches = Arc::new(Caches::new());
        let metrics = Metrics::register(registry);
        let kind = |name| {
            let (health, commands) = KindHealth::new(name, config.stall_bound);
            (Arc::new(health), commands)
        };
        let (services, services_commands) = kind("Service");
        let (workloads, workloads_commands) = kind("ExternalWorkload");
        let (slices, slices_commands) = kind("EndpointSlice");
        let health = CacheHealth::new([services.clone(), workloads.clone(), slices.clone()]);
        registry.register_collector(Box::new(health.clone()));
        let selector = slice_selector(&config.slices);
        let barrier = Barrier::new(vec![
            fresh::Kind {
                health: services,
                read: read_version(api_for::<Service>(&client, &config), None),
                cached: count(&caches.services),
            },
            fresh::Kind {
                health: workloads,
                read: read_version(api_for::<ExternalWorkload>(&client, &config), None),
                cached: count(&caches.workloads),
            },
            fresh::Kind {
                health: slices,
                read: read_version(api_for::<EndpointSlice>(&client, &config), Some(selector)),
                cached: count(&caches.slices),
            },
        ])
        .relisting_at_most(config.safeguards.barrier_relist_at_most);
        let shared = Arc::new(Shared {
            caches: caches.clone(),
            config: config.slices.clone(),
            api,
            diagnostics: Diagnostics::default(),
            metrics: metrics.clone(),
            write_rate: WriteRate::new(config.write_qps),
            health: health.clone(),
            own_writes: config.safeguards.own_writes,
            additions: config.safeguards.additions,
        });
        let app = App::new(shared, barrier, metrics.clone())
            .with_barrier(config.safeguards.acquisition_point);
        let runtime = Runtime::new(config.runtime.clone(), app);
        let elector = match &config.coordinated {
            Some(candidate) => LeaseElector::coordinated_for_client(
                client.clone(),
                config.lease.clone(),
                candidate.clone(),
            ),
            None => LeaseElector::for_client(client.clone(), config.lease.clone()),
        };
        registry.register_collector(Box::new(LeadershipCollector {
            elector: elector.metrics(),
            fence: runtime.fence_metrics(),
            queue: runtime.queue_metrics(),
            leadership: elector.leadership(),
        }));
        Self {
            client,
            config,
            caches,
            metrics,
            runtime,
            elector,
            health,
            commands: WatchCommands {
                services: services_commands,
                workloads: workloads_commands,
                slices: slices_commands,
            },
        }
    }

    /// This replica's leadership: `Some(term)` while it leads.
    pub fn leadership(&self) -> leadership::Leadership {
        self.elector.leadership()
    }

    /// The health of the caches, for readiness: ready while every cache is synced, not stalled
    /// and not re-listing past the stall bound.
    pub fn health(&self) -> CacheHealth {
        self.health.clone()
    }

    /// Runs until `shutdown`: watches start at once; once every cache has synced, the elector
    /// starts competing. On shutdown the runtime drains, then releases the Lease, then this
    /// returns. A watch that stops ends the run with [`Error::WatchStopped`] (a leader first
    /// drains and releases, as on shutdown).
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let stop_watches = CancellationToken::new();
        let dispatcher = self.runtime.dispatcher();
        let commands = std::mem::replace(&mut self.commands, WatchCommands::closed());
        let mut watches = Watches::spawn(&self, &dispatcher, commands, &stop_watches);

        let synced = self.health.synced();
        tokio::pin!(synced);
        // A watch that stops before every cache has synced ends the run as well.
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                stop_watches.cancel();
                return Ok(());
            }
            () = &mut synced => {}
            stopped = watches.next_stopped() => {
                stop_watches.cancel();
                return Err(stopped);
            }
        }
        let (services, workloads, slices) = self.caches.summary();
        tracing::info!(
            services,
            workloads,
            slices,
            "caches synced; joining the election"
        );

        let stop_runtime = shutdown.child_token();
        let runtime = self.runtime.run(self.elector.spawn(), stop_runtime.clone());
        tokio::pin!(runtime);
        let result = tokio::select! {
            biased;
            result = &mut runtime => result.map_err(Error::from),
            stopped = watches.next_stopped() => {
                tracing::error!(%stopped, "a watch stopped; handing over and exiting");
                stop_runtime.cancel();
                if let Err(error) = runtime.await {
                    tracing::warn!(%error, "hand-over after a stopped watch failed");
                }
                Err(stopped)
            }
        };
        stop_watches.cancel();
        result
    }
}

/// The watches of a controller, supervised: each runs in `set`, and `kinds` names each task.
#[derive(Default)]
struct Watches {
    set: JoinSet<()>,
    kinds: HashMap<tokio::task::Id, &'static str>,
}

// === impl Watches ===

impl Watches {
    fn spawn(
        controller: &Controller,
        dispatcher: &ServiceDispatcher,
        commands: WatchCommands,
        stop: &CancellationToken,
    ) -> Self {
        let mut watches = Self::default();
        let [services, workloads, slices] = controller.health.kinds();
        watches.start::<Service, _>(
            controller,
            dispatcher,
            stop,
            (services, commands.services),
            None,
            controller.caches.services.clone(),
            OnService,
        );
        watches.start::<ExternalWorkload, _>(
            controller,
            dispatcher,
            stop,
            (workloads, commands.workloads),
            None,
            controller.caches.workloads.clone(),
            OnWorkload(controller.caches.clone()),
        );
        watches.start::<EndpointSlice, _>(
            controller,
            dispatcher,
            stop,
            (slices, commands.slices),
            Some(slice_selector(&controller.config.slices)),
            controller.caches.slices.clone(),
            OnSlice(controller.config.slices.clone()),
        );
        watches
    }

    /// Starts the watch of one kind: changes go into `cache`, then through `handler` while
    /// leading.
    #[allow(clippy::too_many_arguments)] // the one place a watch is assembled from its parts
    fn start<K, H>(
        &mut self,
        controller: &Controller,
        dispatcher: &ServiceDispatcher,
        stop: &CancellationToken,
        (health, commands): (Arc<KindHealth>, mpsc::UnboundedReceiver<Command>),
        labels: Option<String>,
        cache: Arc<store::Store<K::Cached>>,
        handler: H,
    ) where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + watch::Project,
        K::DynamicType: Default,
        H: Handler<K::Cached>,
    {
        let kind = health.kind();
        let labels_of_kind = KindLabels { kind };
        let metrics = &controller.metrics;
        let counters = WatchCounters {
            errors: metrics.watch_errors.get_or_create(&labels_of_kind).clone(),
            relists: metrics.watch_relists.get_or_create(&labels_of_kind).clone(),
            stalls: metrics.watch_stalls.get_or_create(&labels_of_kind).clone(),
        };
        let source = Source::new(
            api_for::<K>(&controller.client, &controller.config),
            labels,
            health.clone(),
            commands,
            counters,
        );
        let sink = Dispatch {
            dispatcher: dispatcher.clone(),
            handler,
        };
        // One span per watch: every line it logs names its kind.
        let span = tracing::info_span!("watch", kind);
        let watch = watch::run(
            source,
            cache,
            controller.caches.interner.clone(),
            health,
            sink,
            stop.clone(),
        );
        self.supervise(kind, watch.instrument(span));
    }

    /// Runs `watch` under supervision: [`Watches::next_stopped`] reports its end, naming `kind`.
    fn supervise(&mut self, kind: &'static str, watch: impl Future<Output = ()> + Send + 'static) {
        let task = self.set.spawn(watch);
        self.kinds.insert(task.id(), kind);
    }

    /// Waits for a watch to stop (they run until the stop token; any earlier end is a failure).
    async fn next_stopped(&mut self) -> Error {
        let stopped = match self.set.join_next_with_id().await {
            Some(Ok((id, ()))) => (id, "it returned".to_string()),
            Some(Err(error)) => (error.id(), error.to_string()),
            None => return std::future::pending().await,
        };
        let kind = self.kinds.get(&stopped.0).copied().unwrap_or("unknown");
        Error::WatchStopped {
            kind,
            reason: stopped.1,
        }
    }
}

// === impl WatchCommands ===

impl WatchCommands {
    /// Receivers with no sender, left behind once the watches have taken the real ones.
    fn closed() -> Self {
        let closed = || mpsc::unbounded_channel().1;
        Self {
            services: closed(),
            workloads: closed(),
            slices: closed(),
        }
    }
}

/// The Api of `K` in the watched namespace, or all namespaces.
fn api_for<K>(client: &Client, config: &ControllerConfig) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match &config.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// How many objects `store` holds, for the barrier's choice between re-list and probe.
fn count<K: store::Cached>(store: &Arc<store::Store<K>>) -> CachedCount {
    let store = store.clone();
    Arc::new(move || store.len())
}

/// The label selector of the managed slices.
fn slice_selector(config: &slices::Config) -> String {
    format!("{MANAGED_BY_LABEL}={}", config.managed_by())
}

/// A consistent read of the current resourceVersion of `api`'s objects: a LIST of at most one
/// object's metadata, without a resourceVersion (served once the API server's cache has caught
/// up with etcd).
fn read_version<K>(api: Api<K>, labels: Option<String>) -> ReadVersion
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    Arc::new(move || {
        let api = api.clone();
        let mut params = ListParams::default().limit(1);
        if let Some(labels) = &labels {
            params = params.labels(labels);
        }
        async move {
            let list = api.list_metadata(&params).await?;
            Ok(list
                .metadata
                .resource_version
                .as_deref()
                .map_or(0, version_number))
        }
        .boxed()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_task_that_panics_ends_the_run_with_an_error_naming_its_kind() {
        let mut watches = Watches::default();
        watches.supervise("Service", std::future::pending());
        watches.supervise("ExternalWorkload", async {
            tokio::task::yield_now().await;
            panic!("a projection bug");
        });
        let stopped = tokio::time::timeout(Duration::from_secs(5), watches.next_stopped())
            .await
            .expect("the panic is reported");
        match stopped {
            Error::WatchStopped { kind, reason } => {
                assert_eq!(kind, "ExternalWorkload");
                assert!(reason.contains("panicked"), "{reason}");
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[tokio::test]
    async fn a_watch_task_that_returns_is_a_failure_too() {
        let mut watches = Watches::default();
        watches.supervise("EndpointSlice", async {});
        let stopped = watches.next_stopped().await;
        assert!(
            matches!(
                stopped,
                Error::WatchStopped {
                    kind: "EndpointSlice",
                    ..
                }
            ),
            "{stopped}"
        );
    }
}
