//! Fencing for an app that keeps kube-runtime's `Controller` instead of this crate's
//! `Runtime`: the elector decides who leads, a new `Controller` runs for each term and stops at
//! its end, and every write passes the term's `Fence` right before it is sent.
//!
//! It stamps each ConfigMap carrying a label with an annotation naming the replica and term
//! that wrote it:
//!
//! ```text
//!  LeaseElector ──Leadership──► term starts: Fence::current ──► Controller (fresh watch + cache)
//!                               term ends:   fence.ended()  ──► graceful_shutdown_on: stops it
//!  reconcile(ConfigMap): fence.check()? ──► PATCH (a policy denial counts as fenced)
//! ```
//!
//! Run two or more replicas with different `--identity` values against a cluster:
//!
//! ```text
//! cargo run -p leadership --example kube_runtime_controller -- \
//!     --identity a --namespace default --label example.com/stamp
//! kubectl -n default create configmap settings && \
//!     kubectl -n default label configmap settings example.com/stamp=yes
//! ```
//!
//! It prints one line per leadership event and per write (its test, in `tests/example.rs`,
//! reads them):
//!
//! ```text
//! competing for lease default/stamper as a
//! controller started (term 3)
//! stamped default/settings (term 3)
//! controller stopped (term 3)
//! released the lease; exiting
//! ```
//!
//! The `Controller` lists its objects afresh when each term starts, so every term begins from a
//! cache that is current and reconciles every object (the replay), at the cost of one list per
//! take-over. Its state lives in the per-term context, so nothing survives from an earlier term.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{Controller, controller::Action, watcher},
};
use leadership::{
    CancellationToken, ElectorHandle, Fence, FenceMetrics, Fenced, Leadership, LeaseConfig,
    LeaseElector, LeaseTimings, is_fencing_policy_denial,
};

/// The annotation each write sets: `<identity>/<term>`.
const STAMP: &str = "example.com/stamped-by";

/// Writes stop this long before the term's RenewDeadline would end it.
const FENCE_MARGIN: Duration = Duration::from_secs(1);

/// Stamps labelled ConfigMaps with the replica that wrote them; one replica writes at a time.
#[derive(Parser, Debug)]
struct Args {
    /// Kubeconfig to use (default: in-cluster or $KUBECONFIG).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// This replica's identity in the Lease: unique among replicas (the pod's name).
    #[arg(long)]
    identity: String,
    /// Namespace of the Lease and of the ConfigMaps.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = "stamper")]
    lease_name: String,
    /// Only ConfigMaps carrying this label are stamped.
    #[arg(long, default_value = "example.com/stamp")]
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
}

/// What every reconcile of one term shares: built when the term starts, dropped at its end.
struct TermContext {
    client: Client,
    stamp: String,
    fence: Fence,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    /// Not retried in this term: the next term's controller reconciles everything again.
    #[error("write refused: {0}")]
    Fenced(#[from] Fenced),
    #[error("API: {0}")]
    Api(#[from] kube::Error),
}

async fn reconcile(
    config_map: Arc<ConfigMap>,
    context: Arc<TermContext>,
) -> Result<Action, ReconcileError> {
    if config_map.annotations().contains_key(STAMP) {
        return Ok(Action::await_change());
    }
    let (namespace, name) = (
        config_map.namespace().unwrap_or_default(),
        config_map.name_any(),
    );
    let api = Api::<ConfigMap>::namespaced(context.client.clone(), &namespace);
    let patch = serde_json::json!({ "metadata": { "annotations": { STAMP: &context.stamp } } });
    context.fence.check()?; // immediately before the write
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        // The API server's own fence (`leadership::FENCING_POLICY_TEMPLATE`, if installed).
        Err(error) if is_fencing_policy_denial(&error) => {
            return Err(context.fence.refused_by_api_server().into());
        }
        Err(error) => return Err(error.into()),
    }
    say(format!(
        "stamped {namespace}/{name} (term {})",
        context.fence.term()
    ));
    Ok(Action::await_change())
}

fn error_policy(
    _config_map: Arc<ConfigMap>,
    error: &ReconcileError,
    _context: Arc<TermContext>,
) -> Action {
    match error {
        ReconcileError::Fenced(_) => Action::await_change(),
        ReconcileError::Api(_) => Action::requeue(Duration::from_secs(1)),
    }
}

/// Runs one term's `Controller` until the term ends or `shutdown`; in-flight reconciles finish
/// first (their writes still fenced).
async fn run_term(args: &Args, client: &Client, fence: Fence, shutdown: &CancellationToken) {
    let term = fence.term().clone();
    let context = Arc::new(TermContext {
        client: client.clone(),
        stamp: format!("{}/{term}", args.identity),
        fence: fence.clone(),
    });
    let api = Api::<ConfigMap>::namespaced(client.clone(), &args.namespace);
    say(format!("controller started (term {term})"));
    Controller::new(api, watcher::Config::default().labels(&args.label))
        .graceful_shutdown_on(fence.ended())
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile failed");
            }
        })
        .await;
    say(format!("controller stopped (term {term})"));
}

/// A fence for the next term this replica leads; `None` once nobody can publish leadership.
async fn next_term(leadership: &mut Leadership, metrics: &FenceMetrics) -> Option<Fence> {
    loop {
        leadership.wait_for(Option::is_some).await.ok()?;
        // The term may have ended between the two looks: wait again then.
        if let Some(fence) = Fence::current(leadership, FENCE_MARGIN, metrics) {
            return Some(fence);
        }
    }
}

/// Leads terms until `shutdown`, one `Controller` per term. Returns an error if the elector is
/// lost (the process must then exit so it is restarted).
async fn lead_terms(
    args: &Args,
    client: &Client,
    elector: &mut ElectorHandle,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let mut leadership = elector.leadership();
    let metrics = FenceMetrics::default();
    loop {
        let fence = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            error = elector.lost() => return Err(error).context("leader election stopped"),
            fence = next_term(&mut leadership, &metrics) => fence,
        };
        let Some(fence) = fence else {
            // Nobody publishes leadership any more: the elector task has ended.
            return Err(elector.lost().await).context("leader election stopped");
        };
        tokio::select! {
            biased;
            error = elector.lost() => return Err(error).context("leader election stopped"),
            () = run_term(args, client, fence, shutdown) => {}
        }
    }
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
    let lease = LeaseConfig::new(&args.lease_name, &args.namespace, &args.identity, timings)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signals(shutdown.clone()));

    say(format!(
        "competing for lease {}/{} as {}",
        args.namespace, args.lease_name, args.identity
    ));
    let mut elector = LeaseElector::for_client(client.clone(), lease).spawn();
    let result = lead_terms(&args, &client, &mut elector, &shutdown).await;
    if let Err(error) = result {
        say(format!("{error:#}; exiting"));
        return Err(error);
    }
    // The term's controller has stopped (its reconciles finished): now hand the Lease over.
    elector.release().await?;
    say("released the lease; exiting".to_string());
    Ok(())
}

/// SIGTERM or SIGINT: stop the term's controller, then release. A second signal exits at once.
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
    say("shutting down: stopping the controller, then releasing the lease".to_string());
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
