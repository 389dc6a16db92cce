//! The `external-endpoints` binary's parts: command line, logging, admin server, and [`run`],
//! which wires them to the controller.
#![deny(missing_docs)]

pub mod admin;
pub mod cli;
pub mod logging;
pub mod process;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use cluster::{Controller, ControllerConfig};
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::{Admin, Health},
    cli::Settings,
    process::ProcessCollector,
};

/// Runs the controller until SIGTERM or SIGINT (a second signal exits at once).
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let args = &settings.args;
    logging::init(args.log_format, &args.log_level)?;
    let config = controller_config(&settings);
    let client = client(&settings).await?;

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

fn controller_config(settings: &Settings) -> ControllerConfig {
    let args = &settings.args;
    ControllerConfig {
        slices: settings.slices.clone(),
        lease: settings.lease.clone(),
        coordinated: settings.coordinated.clone(),
        runtime: settings.runtime.clone(),
        stale_limit: Duration::from_secs(30),
        namespace: args.watch_namespace.clone(),
        stall_bound: args.watch_stall_timeout,
        write_qps: args.write_qps,
        safeguards: cluster::Safeguards::default(),
    }
}

async fn client(settings: &Settings) -> anyhow::Result<kube::Client> {
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
