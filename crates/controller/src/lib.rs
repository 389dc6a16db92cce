//! The `external-endpoints` binary's parts: command line, logging, admin server, and [`run`],
//! which wires them to the controller.
#![deny(missing_docs)]

pub mod admin;
pub mod check;
pub mod cli;
pub mod diff;
pub mod installed;
pub mod logging;
pub mod process;

use std::sync::Arc;

use anyhow::Context as _;
use cluster::{Controller, ControllerConfig};
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::{Admin, Health},
    cli::{CheckArgs, DiffArgs, DiffOutput, Output, Settings},
    process::ProcessCollector,
};

/// Runs the controller until SIGTERM or SIGINT (a second signal exits at once).
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let args = &settings.args;
    logging::init(args.log_format, &args.log_level)?;
    let config = controller_config(&settings);
    let client = client(&settings, None).await?;

    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    let controller = Controller::new(
        client,
        config,
        registry.sub_registry_with_prefix("external_endpoints"),
    );

    let shutdown = CancellationToken::new();
    let leader =
        leadership::LeaderHealth::new(controller.leadership(), admin::LEADER_HEALTH_TOLERANCE);
    let health = Arc::new(Health::new(controller.health()).with_leader(leader));
    let admin = Admin::new(health.clone(), registry);
    let (admin_addr, serve_admin) = admin
        .bind(args.admin_addr, shutdown.child_token())
        .await
        .with_context(|| format!("binding the admin server to {}", args.admin_addr))?;
    tokio::spawn(serve_admin);
    tracing::info!(
        identity = %settings.lease.identity(),
        lease = %format!("{}/{}", args.lease_namespace, args.lease_name),
        admin = %admin_addr,
        "starting"
    );

    let controller = controller.run(shutdown.clone());
    tokio::select! {
        result = controller => result?,
        () = signals(shutdown, health) => anyhow::bail!("second signal: exited without draining"),
    }
    tracing::info!("exiting");
    Ok(())
}

/// The controller's configuration from the binary's settings.
pub fn controller_config(settings: &Settings) -> ControllerConfig {
    let args = &settings.args;
    ControllerConfig {
        slices: settings.slices.clone(),
        lease: settings.lease.clone(),
        coordinated: settings.coordinated.clone(),
        runtime: settings.runtime.clone(),
        namespace: args.watch_namespace.clone(),
        stall_bound: args.watch_stall_timeout,
        write_qps: args.write_qps,
        safeguards: cluster::Safeguards::default(),
    }
}

/// `external-endpoints check`: prints every check's outcome; true when all passed.
pub async fn check(settings: &Settings, check: &CheckArgs) -> anyhow::Result<bool> {
    let impersonate = check
        .as_user
        .clone()
        .map(|user| (user, check.as_groups.clone()));
    // The operator's kubectl reads KUBECONFIG itself: only a --kubeconfig flag is repeated.
    let kubeconfig = (settings.args.sources.kubeconfig == cli::Source::Flag)
        .then_some(settings.args.kubeconfig.as_ref())
        .flatten();
    let kubectl = check::Kubectl {
        kubeconfig: kubeconfig.map(|path| path.display().to_string()),
        context: settings.args.context.clone(),
        impersonate: impersonate.clone(),
    };
    // The installed controller is looked for as the caller, not as the identity checked.
    let own = client(settings, None).await?;
    let client = match impersonate {
        Some(_) => client(settings, impersonate).await?,
        None => own.clone(),
    };
    let outcomes = check::run(&own, &client, settings, &kubectl).await;
    match check.output {
        Output::Text => outcomes.iter().for_each(|o| println!("{}", o.line())),
        Output::Json => println!("{}", serde_json::to_string_pretty(&outcomes)?),
    }
    Ok(outcomes.iter().all(|o| o.ok))
}

/// `external-endpoints diff`: prints the writes the controller would make now; true when
/// there are none.
pub async fn diff(settings: &Settings, diff: &DiffArgs) -> anyhow::Result<bool> {
    let client = client(settings, None).await?;
    let diffs = diff::run(&client, settings, &diff.services).await?;
    match diff.output {
        DiffOutput::Text => {
            (diffs.iter().flat_map(diff::ServiceDiff::lines)).for_each(|line| println!("{line}"))
        }
        DiffOutput::Summary => diffs.iter().for_each(|d| println!("{}", d.summary())),
        DiffOutput::Json => println!("{}", serde_json::to_string_pretty(&diffs)?),
    }
    Ok(diffs.is_empty())
}

/// The kubeconfig's client; `impersonate` is a user and groups to act as (`--as`).
async fn client(
    settings: &Settings,
    impersonate: Option<(String, Vec<String>)>,
) -> anyhow::Result<kube::Client> {
    let args = &settings.args;
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    let mut config = config;
    // No retries hidden in the client (kube's default resends a 429, 503 or 504 up to 15 times):
    // a write must be sent again only through the fence, and the writes in flight must see the
    // server's 429s to back off (cluster::limit, issue 34). The elector retries at its
    // RetryPeriod and the watches with their backoff, as the simulation's client always did.
    config.default_retry = false;
    if let Some((user, groups)) = impersonate {
        config.auth_info.impersonate = Some(user);
        config.auth_info.impersonate_groups = (!groups.is_empty()).then_some(groups);
    }
    Ok(kube::Client::try_from(config)?)
}

/// The first SIGTERM/SIGINT starts a graceful shutdown (drain, then release); the future
/// completes on the second, and the caller then stops at once.
async fn signals(shutdown: CancellationToken, health: Arc<Health>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT; only a kill stops this process");
        return std::future::pending().await;
    };
    for count in 0.. {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        if count > 0 {
            tracing::warn!("second signal: exiting at once");
            return;
        }
        tracing::info!("shutting down: draining, then releasing the lease");
        health.set_shutting_down();
        shutdown.cancel();
    }
}
