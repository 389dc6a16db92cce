//! An example controller built on `leadership` alone: it copies one label of each Namespace onto
//! every ConfigMap in that Namespace, and only the replica holding the Lease writes.
//!
//! ```text
//!  watch(Namespace with the label) ─┐                       ┌─► reconcile(namespace) ─► PATCH ConfigMaps
//!  watch(ConfigMap) ────────────────┴─► caches ─► dispatch ─► queue      (fenced)
//!                                     (always)  (leader only)
//! ```
//!
//! Run two or more replicas with different `--identity` values against a cluster:
//!
//! ```text
//! cargo run -p leadership --example namespace_labels -- \
//!     --identity a --lease-namespace default --label example.com/team
//! kubectl label namespace my-ns example.com/team=red   # every ConfigMap in my-ns gets it
//! ```
//!
//! It prints one line per leadership event and per write, for people and for its test
//! (`tests/example.rs`):
//!
//! ```text
//! competing for lease default/namespace-labels as a
//! acquired term 3
//! replayed 2 namespaces (term 3)
//! wrote my-ns/settings example.com/team=red (term 3)
//! lost term 3
//! released the lease; exiting
//! ```
//!
//! Its per-term state is a tracker of its own writes (the resourceVersion each PATCH returned):
//! before writing in a namespace, it waits until its cache shows every ConfigMap it wrote there
//! at least at that version, so it never plans from a cache that has not seen its last write.
//! The tracker learns of deletions through the ConfigMap handler, which runs only while leading:
//! a tracker kept across terms would miss the deletions made while following and wait forever
//! for ConfigMaps that are gone. `--reuse-state-across-terms` does exactly that, to show the
//! failure fresh per-term state prevents.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use clap::Parser;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use leadership::{
    Action, CancellationToken, Dispatcher, Leadership, LeaseConfig, LeaseElector, LeaseTimings,
    Reconciler, Runtime, RuntimeConfig, RuntimeError, Term, TermContext,
};
use parking_lot::Mutex;

/// Copies a Namespace label onto the namespace's ConfigMaps; one replica writes at a time.
#[derive(Parser, Debug)]
struct Args {
    /// Kubeconfig to use (default: in-cluster or $KUBECONFIG).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// This replica's identity in the Lease (unique among replicas).
    #[arg(long)]
    identity: String,
    /// Namespace of the Lease.
    #[arg(long, default_value = "default")]
    lease_namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = "namespace-labels")]
    lease_name: String,
    /// The label to copy; only Namespaces that carry it are watched.
    #[arg(long, default_value = "example.com/team")]
    label: String,
    /// LeaseDuration: how long followers wait after the last renewal they saw.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// RenewDeadline: how long the leader keeps leading without a successful renewal.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    renew_deadline: Duration,
    /// RetryPeriod: how often the leader renews and followers poll (they also watch).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    retry_period: Duration,
    /// Deliberately wrong: keep one tracker for every term instead of a fresh one per term
    /// (shows the stale-state failure; never use it for real).
    #[arg(long)]
    reuse_state_across_terms: bool,
}

/// The app: the caches it reads and what it writes with.
struct LabelCopier {
    client: Client,
    label: String,
    namespaces: Store<Namespace>,
    config_maps: Store<ConfigMap>,
    /// Set only with `--reuse-state-across-terms`: the one tracker every term gets.
    reused: Option<Arc<Tracker>>,
}

/// What this term wrote: ConfigMap (namespace, name) → resourceVersion our PATCH returned.
#[derive(Debug, Default)]
struct Tracker {
    written: Mutex<HashMap<(String, String), u64>>,
}

/// Why a reconcile failed (retried with backoff by the runtime).
#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("write refused by the fence: {0}")]
    Fenced(#[from] leadership::Fenced),
    #[error("API: {0}")]
    Api(#[from] kube::Error),
}

type Context = TermContext<String, Arc<Tracker>>;

// === impl LabelCopier ===

impl Reconciler for LabelCopier {
    type Key = String;
    type TermState = Arc<Tracker>;
    type Error = ReconcileError;

    fn start_term(&self, term: &Term) -> Arc<Tracker> {
        say(format!("acquired term {term}"));
        self.reused.clone().unwrap_or_default()
    }

    fn replay(&self, context: &Context) {
        let namespaces = self.namespaces.state();
        for namespace in &namespaces {
            context.enqueue(namespace.name_any());
        }
        say(format!(
            "replayed {} namespaces (term {})",
            namespaces.len(),
            context.fence().term()
        ));
    }

    fn reconcile(
        &self,
        namespace: String,
        context: Context,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        let client = self.client.clone();
        let label = self.label.clone();
        let value = self
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .and_then(|ns| ns.labels().get(&label).cloned());
        let config_maps: Vec<Arc<ConfigMap>> = self
            .config_maps
            .state()
            .into_iter()
            .filter(|cm| cm.namespace().as_deref() == Some(namespace.as_str()))
            .collect();
        async move {
            let Some(value) = value else {
                return Ok(Action::Done); // label removed or namespace gone: nothing to copy
            };
            let tracker = context.state();
            if !tracker.caught_up(&namespace, &config_maps) {
                say(format!(
                    "cache behind our writes in {namespace}; retrying (term {})",
                    context.fence().term()
                ));
                return Ok(Action::RequeueAfter(Duration::from_millis(500)));
            }
            let api = Api::<ConfigMap>::namespaced(client, &namespace);
            let patch = serde_json::json!({ "metadata": { "labels": { &label: &value } } });
            for config_map in config_maps {
                if config_map.labels().get(&label) == Some(&value) {
                    continue;
                }
                let name = config_map.name_any();
                context.fence().check()?; // immediately before the write
                let written = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                tracker.record(&namespace, &name, &written);
                say(format!(
                    "wrote {namespace}/{name} {label}={value} (term {})",
                    context.fence().term()
                ));
            }
            Ok(Action::Done)
        }
    }
}

// === impl Tracker ===

impl Tracker {
    /// Whether the cache shows every ConfigMap this term wrote in `namespace` at least at the
    /// version the write returned. (resourceVersions are etcd revisions here; a real controller
    /// should compare generations or keep the objects it wrote, as they are opaque.)
    fn caught_up(&self, namespace: &str, cached: &[Arc<ConfigMap>]) -> bool {
        let written = self.written.lock();
        written
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .all(|((_, name), version)| {
                cached
                    .iter()
                    .find(|cm| cm.meta().name.as_deref() == Some(name.as_str()))
                    .and_then(|cm| version_of(cm))
                    .is_some_and(|seen| seen >= *version)
            })
    }

    fn record(&self, namespace: &str, name: &str, written: &ConfigMap) {
        if let Some(version) = version_of(written) {
            let key = (namespace.to_string(), name.to_string());
            self.written.lock().insert(key, version);
        }
    }

    /// A ConfigMap deleted: nothing to wait for any more (seen only while leading).
    fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.written.lock().remove(&key);
    }
}

fn version_of(config_map: &ConfigMap) -> Option<u64> {
    config_map.meta().resource_version.as_deref()?.parse().ok()
}

/// One line on stdout, with the wall-clock time in milliseconds (the test reads these).
fn say(line: String) {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    println!("{millis} {line}");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let client = client(&args).await?;
    let timings = LeaseTimings::new(args.lease_duration, args.renew_deadline, args.retry_period)?;
    let lease = LeaseConfig::new(
        &args.lease_name,
        &args.lease_namespace,
        &args.identity,
        timings,
    )?;

    // Caches on every replica, always: a follower is warm when it takes over.
    let (namespaces, namespaces_writer) = reflector::store();
    let (config_maps, config_maps_writer) = reflector::store();
    let app = LabelCopier {
        client: client.clone(),
        label: args.label.clone(),
        namespaces: namespaces.clone(),
        config_maps: config_maps.clone(),
        reused: args.reuse_state_across_terms.then(Arc::default),
    };
    let runtime = Runtime::new(RuntimeConfig::builder().workers(2).build()?, app);
    let dispatcher = runtime.dispatcher();
    let by_label = watcher::Config::default().labels(&args.label);
    let namespace_events = reflector::reflector(
        namespaces_writer,
        watcher(Api::<Namespace>::all(client.clone()), by_label).default_backoff(),
    );
    let config_map_events = reflector::reflector(
        config_maps_writer,
        watcher(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    );
    // The watches never end on their own (errors are retried with backoff); if one did, its
    // cache would freeze, so that ends the process too (below).
    let mut watches = tokio::spawn(futures::future::select(
        Box::pin(handle(namespace_events, dispatcher.clone(), on_namespace)),
        Box::pin(handle(config_map_events, dispatcher, on_config_map)),
    ));
    namespaces.wait_until_ready().await?;
    config_maps.wait_until_ready().await?;

    say(format!(
        "competing for lease {}/{} as {}",
        args.lease_namespace, args.lease_name, args.identity
    ));
    let elector = LeaseElector::for_client(client.clone(), lease).spawn();
    tokio::spawn(report_losses(elector.leadership()));
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signals(shutdown.clone()));

    let run = runtime.run(elector, shutdown.clone());
    tokio::pin!(run);
    let result = tokio::select! {
        result = &mut run => result,
        _ = &mut watches => {
            say("a watch ended; handing over and exiting".to_string());
            shutdown.cancel();
            run.await?;
            anyhow::bail!("a watch ended");
        }
    };
    watches.abort();
    match result {
        Ok(()) => {
            say("released the lease; exiting".to_string());
            Ok(())
        }
        // A lost elector is not an error to log and carry on from: this process may no longer
        // take part in the election, so it exits non-zero and its supervisor restarts it.
        Err(RuntimeError::ElectorLost(error)) => {
            say(format!("elector lost ({error}); exiting"));
            Err(error).context("leader election stopped")
        }
        Err(error) => Err(error.into()),
    }
}

/// Feeds every event of a reflected watch through `handler`, while leading.
async fn handle<K, H>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    dispatcher: Dispatcher<String, Arc<Tracker>>,
    handler: H,
) where
    H: Fn(&Context, &K, bool),
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                dispatcher.dispatch(|context| handler(context, &object, false));
            }
            Ok(watcher::Event::Delete(object)) => {
                dispatcher.dispatch(|context| handler(context, &object, true));
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(error) => tracing::warn!(%error, "watch error; retrying with backoff"),
        }
    }
}

fn on_namespace(context: &Context, namespace: &Namespace, _deleted: bool) {
    context.enqueue(namespace.name_any());
}

fn on_config_map(context: &Context, config_map: &ConfigMap, deleted: bool) {
    let Some(namespace) = config_map.namespace() else {
        return;
    };
    if deleted {
        context.state().forget(&namespace, &config_map.name_any());
    }
    context.enqueue(namespace);
}

/// Prints when a term ends (leadership lost or released).
async fn report_losses(mut leadership: Leadership) {
    let mut current = leadership.borrow_and_update().as_ref().map(Term::id);
    while leadership.changed().await.is_ok() {
        let next = leadership.borrow_and_update().as_ref().map(Term::id);
        if let Some(term) = current.filter(|term| Some(*term) != next) {
            say(format!("lost term {term}"));
        }
        current = next;
    }
}

/// SIGTERM or SIGINT: drain, then release. A second signal exits at once.
async fn on_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    say("shutting down: draining, then releasing the lease".to_string());
    shutdown.cancel();
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    say("second signal: exiting without draining".to_string());
    std::process::exit(1);
}

async fn client(args: &Args) -> anyhow::Result<Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}
