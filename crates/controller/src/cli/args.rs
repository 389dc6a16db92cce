//! The command line's definitions: the replica's flags, the tools' subcommands and their
//! flags, the value parsers of single flags, and where each setting came from.

use std::{net::SocketAddr, num::NonZeroU16, path::PathBuf, time::Duration};

use clap::{Parser, ValueEnum};

/// Publishes EndpointSlices for Services that select ExternalWorkloads.
///
/// Runs as several replicas; the holder of a coordination.k8s.io Lease writes, the others keep
/// warm caches and take over when the leader goes away.
#[derive(Clone, Debug, Parser)]
#[command(name = "external-endpoints", version, about, long_about = None)]
pub struct Args {
    /// Path to a kubeconfig file; without it, KUBECONFIG, ~/.kube/config, then in-cluster config.
    #[arg(global = true, long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use instead of the current one.
    #[arg(global = true, long)]
    pub context: Option<String>,

    /// Watch only this namespace (Services, ExternalWorkloads, EndpointSlices); all namespaces
    /// when unset.
    #[arg(global = true, long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// Identity recorded as the Lease holder; falls back to POD_NAME, then HOSTNAME.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Name of the Lease used for leader election.
    #[arg(
        global = true,
        long,
        env = "LEASE_NAME",
        default_value = "external-endpoints-write"
    )]
    pub lease_name: String,

    /// Namespace of the Lease (normally the controller's own namespace). `check` without it
    /// (or POD_NAMESPACE) looks at the installed controller's Deployment, then the kubeconfig.
    #[arg(global = true, long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// How long a Lease is valid for others after its last observed change.
    #[arg(long, default_value = "15s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub lease_duration: Duration,

    /// A leader that has not renewed for this long steps down (renewal grace period).
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub renew_deadline: Duration,

    /// Interval between renewals (leader) and acquisition attempts (followers).
    #[arg(long, default_value = "2s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub retry_period: Duration,

    /// Coordinated Leader Election (KEP-4355): publish a LeaseCandidate and lead only when the
    /// API server's election controller names this replica (the oldest version leads during a
    /// rolling upgrade). Needs the API server's CoordinatedLeaderElection feature gate and the
    /// coordination.k8s.io/v1beta1 API; off: replicas take the Lease themselves.
    #[arg(global = true, long, env = "COORDINATED_ELECTION")]
    pub coordinated_election: bool,

    /// With --coordinated-election: the emulation version announced in the LeaseCandidate
    /// (MAJOR.MINOR.PATCH, not newer than the binary's own version); defaults to the binary's.
    #[arg(long, env = "EMULATION_VERSION")]
    pub emulation_version: Option<String>,

    /// Most Services reconciled concurrently, and the cap of the EndpointSlice writes in flight:
    /// within it, the writes in flight follow the API server's answers (they start at 4, grow
    /// while answers are steady, shrink on 429, 5xx and rising latency).
    #[arg(long, env = "WORKERS", default_value = "32", value_parser = parse_workers, allow_negative_numbers = true)]
    pub workers: NonZeroU16,

    /// Most EndpointSlice writes per second, across all workers (a token bucket holding one
    /// second of writes); 0 for no limit but the writes in flight.
    #[arg(long, env = "WRITE_QPS", default_value_t = 2000)]
    pub write_qps: u32,

    /// Maximum endpoints in one EndpointSlice (1..=1000).
    #[arg(
        global = true,
        long,
        default_value_t = 100,
        allow_negative_numbers = true
    )]
    pub max_endpoints_per_slice: usize,

    /// Value of the endpointslice.kubernetes.io/managed-by label on the slices this controller owns.
    #[arg(
        global = true,
        long,
        default_value = "linkerd-external-workloads-controller"
    )]
    pub managed_by: String,

    /// Prefix of generated slice names (`<prefix><service>-xxxxx`).
    #[arg(global = true, long, default_value = "linkerd-external-")]
    pub slice_prefix: String,

    /// Full resync of every Service while leading (a safety net, not the recovery path).
    #[arg(long, default_value = "10m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub resync_period: Duration,

    /// On SIGTERM, how long to keep draining queued and in-flight work before releasing the Lease.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub drain_timeout: Duration,

    /// A watch that delivers nothing (no event, no bookmark) for this long is stalled: restarted
    /// (then re-listed with plain LIST requests if it stalls again), counted, and the replica is
    /// not ready meanwhile. Each watch asks the API server for a timeout of a sixth of this (at
    /// least 3 s).
    #[arg(long, default_value = "30s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub watch_stall_timeout: Duration,

    /// Address of the admin HTTP server (/live, /ready, /metrics).
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9990")]
    pub admin_addr: SocketAddr,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    /// Log filter, in tracing-subscriber's EnvFilter syntax (`info`, `cluster=debug,info`).
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// A tool to run instead of the controller; without one, the controller runs (except as
    /// the kubectl plugin, where no subcommand prints this help).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Where the settings the tools may look up elsewhere came from (not a flag).
    #[arg(skip)]
    pub sources: Sources,
}

/// Where a setting's value came from. The tools look further (the installed Deployment, the
/// kubeconfig) only for a setting the operator did not give.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// The flag's default: not given.
    #[default]
    Default,
    /// Its environment variable.
    Env,
    /// The flag on the command line.
    Flag,
}

/// The [`Source`] of each setting the tools can also read from an installed controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// `--kubeconfig` (env `KUBECONFIG`).
    pub kubeconfig: Source,
    /// `--lease-name` (env `LEASE_NAME`).
    pub lease_name: Source,
    /// `--lease-namespace` (env `POD_NAMESPACE`).
    pub lease_namespace: Source,
    /// `--max-endpoints-per-slice`.
    pub max_endpoints_per_slice: Source,
    /// `--managed-by`.
    pub managed_by: Source,
    /// `--slice-prefix`.
    pub slice_prefix: Source,
    /// `--watch-namespace` (env `WATCH_NAMESPACE`).
    pub watch_namespace: Source,
}

/// The operator's tools; they read the cluster and write nothing.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Command {
    /// Checks the API server, the ExternalWorkload CRD, the controller's rights and the Lease;
    /// one line per check, exit code 1 when any fails.
    Check(CheckArgs),
    /// Shows what the controller would write now, per Service, without writing; exit code 0
    /// when nothing would change, 1 when something would, 2 on error (as `kubectl diff`).
    Diff(DiffArgs),
    /// Starts a controller replica: what the binary does without a subcommand, and the only way
    /// to start one as the kubectl plugin. The replica's flags go before or right after `run`.
    Run,
}

/// Flags of `diff` (the planner's flags and --watch-namespace are the controller's own; those
/// not given are read from the installed controller's Deployment when one is found).
#[derive(Clone, Debug, clap::Args)]
pub struct DiffArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = DiffOutput::Text)]
    pub output: DiffOutput,

    /// Only these Services: NAMESPACE/NAME, or NAME in the kubeconfig's namespace.
    #[arg(value_name = "SERVICE")]
    pub services: Vec<String>,
}

/// How `diff` prints the planned writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffOutput {
    /// Per Service a summary line, then per slice its changes as `-`/`+` lines (as `kubectl
    /// diff`).
    Text,
    /// One line per Service.
    Summary,
    /// One JSON document.
    Json,
}

/// Flags of `check` (the kubeconfig, Lease and election flags are the controller's own).
#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {
    /// Check the rights of this user instead of the kubeconfig's, by impersonation (for the
    /// controller's ServiceAccount: system:serviceaccount:NAMESPACE:NAME).
    #[arg(long = "as")]
    pub as_user: Option<String>,

    /// Group to impersonate along with --as; repeatable.
    #[arg(long = "as-group", requires = "as_user")]
    pub as_groups: Vec<String>,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// How a tool prints its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One line per item.
    Text,
    /// One JSON document.
    Json,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

// === impl Args ===

impl Args {
    /// Whether this invocation starts a replica (no subcommand, or `run`).
    pub fn runs_replica(&self) -> bool {
        matches!(self.command, None | Some(Command::Run))
    }
}

/// Duration flags take hyphen values (`allow_hyphen_values`) so that `--lease-duration -5s` is
/// reported as a bad duration of that flag, not as an unknown argument `-5`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if text.trim().starts_with('-') {
        return Err("a duration cannot be negative".into());
    }
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (expected a duration such as 15s, 500ms or 10m)"))
}

/// Most workers accepted: more would only queue on the API server's connection limit.
const MAX_WORKERS: u16 = 256;

fn parse_workers(text: &str) -> Result<NonZeroU16, String> {
    match text.trim().parse::<u16>() {
        Ok(n @ 1..=MAX_WORKERS) => NonZeroU16::new(n).ok_or_else(|| "cannot be 0".into()),
        _ => Err(format!(
            "expected a number of workers from 1 to {MAX_WORKERS}"
        )),
    }
}
