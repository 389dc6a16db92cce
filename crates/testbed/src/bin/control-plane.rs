//! Runs a local control plane (etcd + kube-apiserver, the project's CRDs installed) until
//! Ctrl-C or SIGTERM, then stops it and removes its files.

use anyhow::Context;
use clap::Parser;
use testbed::{Options, Testbed};

/// Local kube-apiserver + etcd for trying the controller by hand.
#[derive(Parser)]
struct Args {
    /// Also copy the admin kubeconfig here (it refers to certificates in the temporary folder,
    /// so it is valid while this command runs).
    #[arg(long)]
    write_kubeconfig: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let testbed = Testbed::start(Options::default()).await?;
    if let Some(path) = &args.write_kubeconfig {
        std::fs::copy(testbed.kubeconfig_path(), path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print_usage(&testbed, args.write_kubeconfig.as_deref());
    wait_for_shutdown().await?;
    eprintln!("stopping the control plane");
    drop(testbed);
    Ok(())
}

fn print_usage(testbed: &Testbed, copy: Option<&std::path::Path>) {
    let kubeconfig = copy.unwrap_or(testbed.kubeconfig_path()).display();
    let kubectl = testbed
        .binaries()
        .kubectl
        .as_ref()
        .map_or_else(|| "kubectl".to_string(), |path| path.display().to_string());
    println!("control plane ready: {}", testbed.server_url());
    println!("  export KUBECONFIG={kubeconfig}");
    println!("  {kubectl} get --raw /readyz");
    println!("  {kubectl} get crds");
    println!("  {kubectl} get externalworkloads,endpointslices -A");
    println!("  cargo run -p external-endpoints -- --kubeconfig {kubeconfig}");
    println!("Ctrl-C stops it and removes its files.");
}

async fn wait_for_shutdown() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("listening for Ctrl-C"),
        _ = terminate.recv() => Ok(()),
    }
}
