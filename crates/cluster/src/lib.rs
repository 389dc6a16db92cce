//! Kubernetes glue of external-endpoints: watches and caches, the handlers that turn changes
//! into Service keys, the reconcile, the fenced writer, Events and metrics.
//!
//! ```text
//!  watch(Service) ─┐                                  ┌─► reconcile(key, term) ─► plan ─► fenced writer
//!  watch(EW) ──────┼─► Caches ─► Gate::dispatch ─► queue
//!  watch(slices) ──┘   (always)  (leader only)
//! ```
//!
//! Every replica runs the watches; the elector starts only once all three caches have synced,
//! so a term never plans on a partial cache.
#![deny(missing_docs)]

mod caches;
mod events;
#[cfg(test)]
mod fake;
mod handlers;
mod intern;
pub mod measure;
mod metrics;
mod reconcile;
mod store;
mod watch;
mod writer;

use std::sync::Arc;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api, Client,
    runtime::{events::Reporter, watcher},
};
use leadership::{KubeLeaseStore, LeaseConfig, LeaseElector, Runtime, RuntimeConfig, RuntimeError};
use prometheus_client::registry::Registry;
use slices::{MANAGED_BY_LABEL, ServiceKey};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    caches::Caches,
    events::Diagnostics,
    handlers::ServiceGate,
    metrics::{KindLabels, LeadershipCollector, Metrics},
    reconcile::{ReconcileError, Shared, SliceReconciler, TermState},
    writer::KubeWrites,
};

/// Everything the controller is configured with.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Planner settings (max endpoints per slice, managed-by, name prefix).
    pub slices: slices::Config,
    /// The Lease and its timings.
    pub lease: LeaseConfig,
    /// Workers, drain timeout, fence margin, resync period, queue pacing.
    pub runtime: RuntimeConfig,
    /// How long a Service may wait on a cache that does not catch up with this term's writes.
    pub stale_limit: std::time::Duration,
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
}

/// Why the controller stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Leader election stopped. Not retryable: the process exits and is restarted.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// A controller ready to run: metrics registered, nothing started yet.
pub struct Controller {
    client: Client,
    config: ControllerConfig,
    caches: Arc<Caches>,
    metrics: Metrics,
    runtime: Runtime<ServiceKey, TermState, ReconcileError>,
    elector: LeaseElector<KubeLeaseStore>,
}

// === impl Controller ===

impl Controller {
    /// A controller writing through `client`; registers its metrics in `registry`.
    pub fn new(client: Client, config: ControllerConfig, registry: &mut Registry) -> Self {
        let reporter = Reporter {
            controller: config.slices.managed_by().to_string(),
            instance: Some(config.lease.identity().to_string()),
        };
        let api = KubeWrites::new(client.clone(), reporter);
        let caches = Arc::new(Caches::new());
        let metrics = Metrics::register(registry);
        let shared = Arc::new(Shared {
            caches: caches.clone(),
            config: config.slices.clone(),
            api,
            diagnostics: Diagnostics::default(),
            metrics: metrics.clone(),
            stale_limit: config.stale_limit,
        });
        let runtime = Runtime::new(config.runtime.clone(), SliceReconciler(shared));
        let elector = LeaseElector::for_client(client.clone(), config.lease.clone());
        registry.register_collector(Box::new(LeadershipCollector {
            elector: elector.metrics(),
            fence: runtime.fence_metrics(),
            queue: runtime.queue(),
            leadership: elector.leadership(),
        }));
        Self {
            client,
            config,
            caches,
            metrics,
            runtime,
            elector,
        }
    }

    /// Runs until `shutdown`: watches start at once; once every cache has synced, `on_synced`
    /// runs and the elector starts competing. On shutdown the runtime drains, then releases the
    /// Lease, then this returns.
    pub async fn run(
        self,
        on_synced: impl FnOnce() + Send,
        shutdown: CancellationToken,
    ) -> Result<(), Error> {
        let watches = shutdown.child_token();
        let gate = self.runtime.gate();
        let (synced_tx, mut synced_rx) = tokio::sync::mpsc::channel::<()>(3);
        self.spawn_watches(&gate, synced_tx, watches.clone());

        for _ in 0..3 {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    watches.cancel();
                    return Ok(());
                }
                _ = synced_rx.recv() => {}
            }
        }
        let (services, workloads, slices) = self.caches.summary();
        tracing::info!(
            services,
            workloads,
            slices,
            "caches synced; joining the election"
        );
        on_synced();

        let result = self.runtime.run(self.elector.spawn(), shutdown).await;
        watches.cancel();
        Ok(result?)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.config.namespace {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        }
    }

    fn spawn_watches(
        &self,
        gate: &ServiceGate,
        synced: tokio::sync::mpsc::Sender<()>,
        stop: CancellationToken,
    ) {
        let caches = self.caches.clone();
        let config = self.config.slices.clone();
        let selector = format!("{MANAGED_BY_LABEL}={}", config.managed_by());
        let watches = Watches {
            gate,
            synced: &synced,
            stop: &stop,
        };
        watches.spawn::<Service, _>(
            self,
            "Service",
            watcher::Config::default(),
            self.caches.services.clone(),
            handlers::on_service,
        );
        watches.spawn::<ExternalWorkload, _>(
            self,
            "ExternalWorkload",
            watcher::Config::default(),
            self.caches.workloads.clone(),
            move |context, change| handlers::on_workload(context, &caches, change),
        );
        watches.spawn::<EndpointSlice, _>(
            self,
            "EndpointSlice",
            watcher::Config::default().labels(&selector),
            self.caches.slices.clone(),
            move |context, change| handlers::on_slice(context, &config, change),
        );
    }
}

/// What every watch of a controller shares: its gate, the sync signal and the stop token.
struct Watches<'a> {
    gate: &'a ServiceGate,
    synced: &'a tokio::sync::mpsc::Sender<()>,
    stop: &'a CancellationToken,
}

impl Watches<'_> {
    /// Spawns the watch of one kind: changes go into `cache`, then through `handler` while
    /// leading; the first complete list signals `synced`.
    fn spawn<K, H>(
        &self,
        controller: &Controller,
        kind: &'static str,
        config: watcher::Config,
        cache: Arc<store::Store<K::Cached>>,
        handler: H,
    ) where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + watch::Project,
        K::DynamicType: Default,
        H: Fn(&handlers::Context, &store::Change<K::Cached>) + Send + 'static,
    {
        let gate = self.gate.clone();
        let synced = self.synced.clone();
        let labels = KindLabels { kind };
        let counters = watch::WatchCounters {
            errors: controller
                .metrics
                .watch_errors
                .get_or_create(&labels)
                .clone(),
            relists: controller
                .metrics
                .watch_relists
                .get_or_create(&labels)
                .clone(),
        };
        // One span per watch: every line it logs names its kind.
        let span = tracing::info_span!("watch", kind);
        let watch = watch::run(
            controller.api::<K>(),
            config,
            cache,
            controller.caches.interner.clone(),
            move |change| {
                gate.dispatch(|context| handler(context, &change));
            },
            move || {
                let _ = synced.try_send(());
            },
            counters,
            self.stop.clone(),
        );
        tokio::spawn(watch.instrument(span));
    }
}
