//! Command line: every setting is a flag, most with an environment fallback.
//!
//! Invalid values are rejected here, before anything touches the cluster, with a one-line
//! message and exit code 2 (clap's usage-error code).

use std::{ffi::OsString, net::SocketAddr, num::NonZeroU16, path::PathBuf, time::Duration};

use clap::{
    ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum, error::ErrorKind,
    parser::ValueSource,
};
use leadership::{
    CandidateConfig, CandidateError, LeaseConfig, LeaseConfigError, LeaseTimings, RuntimeConfig,
};

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

/// How the binary was invoked: by its own name, or by kubectl as the plugin
/// [`PLUGIN_NAME`].
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The arguments clap parses (a leading `run` removed: see [`Invocation::of`]).
    pub argv: Vec<OsString>,
    /// Invoked as `kubectl-external_endpoints`.
    pub as_plugin: bool,
    /// The first argument was `run`.
    pub explicit_run: bool,
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

/// Settings after validation: the flags, and the library configurations built (and so checked)
/// from them.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Parsed flags.
    pub args: Args,
    /// The Lease, its holder identity (resolved from the flag or the environment) and timings.
    pub lease: LeaseConfig,
    /// The planner's settings.
    pub slices: slices::Config,
    /// The leadership runtime's settings (workers, drain, fence margin, resync).
    pub runtime: RuntimeConfig,
    /// The versions announced in the LeaseCandidate, with `--coordinated-election`.
    pub coordinated: Option<CandidateConfig>,
}

/// The executable name kubectl looks for on the PATH to run `kubectl external-endpoints`.
pub const PLUGIN_NAME: &str = "kubectl-external_endpoints";

// === impl Invocation ===

impl Invocation {
    /// `argv` as the process received it. A leading `run` is removed, so the replica's flags
    /// (defined on the top-level command) may follow it; position 1 can hold nothing else, as
    /// the top-level command takes no positional argument.
    pub fn of(mut argv: Vec<OsString>) -> Self {
        let as_plugin = argv
            .first()
            .and_then(|arg0| std::path::Path::new(arg0).file_name())
            .is_some_and(|name| name == PLUGIN_NAME);
        let explicit_run = argv.get(1).is_some_and(|arg| arg == "run");
        if explicit_run {
            argv.remove(1);
        }
        Invocation {
            argv,
            as_plugin,
            explicit_run,
        }
    }

    /// The command line, named as the operator typed it.
    pub fn command(&self) -> clap::Command {
        let command = Args::command();
        match self.as_plugin {
            true => command.bin_name("kubectl external-endpoints"),
            false => command,
        }
    }
}

// === impl Sources ===

impl Sources {
    fn of(matches: &ArgMatches) -> Self {
        let source = |id: &str| match matches.value_source(id) {
            Some(ValueSource::CommandLine) => Source::Flag,
            Some(ValueSource::EnvVariable) => Source::Env,
            _ => Source::Default,
        };
        Sources {
            kubeconfig: source("kubeconfig"),
            lease_name: source("lease_name"),
            lease_namespace: source("lease_namespace"),
            max_endpoints_per_slice: source("max_endpoints_per_slice"),
            managed_by: source("managed_by"),
            slice_prefix: source("slice_prefix"),
            watch_namespace: source("watch_namespace"),
        }
    }
}

// === impl Args ===

impl Args {
    /// Parses the process arguments; exits with code 2 and a one-line message on invalid input.
    /// As the kubectl plugin without a subcommand, prints the help and exits 0 instead of
    /// starting a replica with the operator's credentials (exit 0 and help on stdout: what
    /// kubectl itself and cobra-built plugins do when given no command, and what clap does for
    /// `--help`).
    pub fn parse_and_validate() -> Settings {
        let invocation = Invocation::of(std::env::args_os().collect());
        let mut command = invocation.command();
        let args = match Args::parse_from_invocation(&invocation) {
            Ok(args) => args,
            Err(error) => error.exit(),
        };
        if args.command.is_none() && invocation.as_plugin && !invocation.explicit_run {
            let printed = command.print_long_help();
            std::process::exit(if printed.is_ok() { 0 } else { 1 });
        }
        // The tools need no holder identity; the Lease flags are still checked.
        let is_tool = !args.runs_replica();
        let hostname = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| is_tool.then(|| TOOL_IDENTITY.to_string()));
        match args.validate(hostname) {
            Ok(settings) => settings,
            Err(message) => command.error(ErrorKind::ValueValidation, message).exit(),
        }
    }

    /// Parses `invocation`'s arguments, recording where each setting came from.
    pub fn parse_from_invocation(invocation: &Invocation) -> Result<Args, clap::Error> {
        let matches = invocation
            .command()
            .try_get_matches_from(&invocation.argv)?;
        let mut args = Args::from_arg_matches(&matches)?;
        if invocation.explicit_run && args.command.is_some() {
            // `run check` would otherwise run the check: `run` was dropped before parsing.
            return Err(invocation.command().error(
                ErrorKind::ArgumentConflict,
                "`run` starts a replica and takes no other subcommand",
            ));
        }
        args.sources = Sources::of(&matches);
        Ok(args)
    }

    /// Settings from `argv` alone (the program name first), parsed and validated as the binary
    /// does, reading no environment variable: neither a flag's fallback (`POD_NAME`, `WORKERS`,
    /// ...) nor `HOSTNAME`. For building a replica's settings inside a process whose
    /// environment is not the replica's (the simulation runs several in one process).
    pub fn settings_from_args<I, T>(argv: I) -> Result<Settings, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Args::command()
            .mut_args(|arg| arg.env(None::<&'static str>))
            .try_get_matches_from(argv)
            .map_err(|error| error.to_string())?;
        let mut args = Args::from_arg_matches(&matches).map_err(|error| error.to_string())?;
        args.sources = Sources::of(&matches);
        args.validate(None)
    }

    /// The command line without its environment fallbacks, the last of a repeated flag
    /// winning: for reading the settings of a container (see `installed`), not of this process.
    pub fn command_without_env() -> clap::Command {
        Args::command()
            .mut_args(|arg| arg.env(None::<&'static str>))
            .args_override_self(true)
    }

    /// Whether this invocation starts a replica (no subcommand, or `run`).
    pub fn runs_replica(&self) -> bool {
        matches!(self.command, None | Some(Command::Run))
    }

    /// Builds the lease and planner configurations, whose constructors check every rule, and
    /// resolves the identity. `hostname` is the `HOSTNAME` fallback, passed in so tests need not
    /// touch the process environment. The error names the flags at fault.
    pub fn validate(self, hostname: Option<String>) -> Result<Settings, String> {
        let non_empty = |id: String| Some(id.trim().to_string()).filter(|id| !id.is_empty());
        let identity = (self.identity.clone().and_then(non_empty))
            .or_else(|| hostname.and_then(non_empty))
            .ok_or("no identity: pass --identity or set POD_NAME or HOSTNAME")?;
        if self.resync_period.is_zero() {
            return Err("--resync-period must be greater than zero".into());
        }
        if self.watch_stall_timeout < Duration::from_secs(6) {
            // The server timeout asked of each watch is a sixth of it (at least 3 s), and its
            // bookmark comes two seconds before that timeout: below 6 s a healthy watch could
            // look stalled.
            return Err("--watch-stall-timeout must be at least 6s".into());
        }
        let timings =
            LeaseTimings::new(self.lease_duration, self.renew_deadline, self.retry_period)
                .map_err(|error| lease_flags_error(&error))?;
        let lease = LeaseConfig::new(
            self.lease_name.clone(),
            self.lease_namespace.clone(),
            identity,
            timings,
        )
        .map_err(|error| lease_flags_error(&error))?;
        let slices = slices::Config::new(
            self.max_endpoints_per_slice,
            self.managed_by.clone(),
            self.slice_prefix.clone(),
        )
        .map_err(|error| slice_flags_error(&error))?;
        let coordinated = self.candidate_config(&lease)?;
        let runtime = RuntimeConfig::builder()
            .workers(self.workers.get().into())
            .drain_timeout(self.drain_timeout)
            // Stop writing half a retry period before the renew deadline would end the term.
            .fence_margin(self.retry_period / 2)
            .resync_period(Some(self.resync_period))
            .build()
            // Every rule is checked above (workers ≥ 1, resync > 0); this names the flags anyway.
            .map_err(|error| format!("--workers, --resync-period: {error}"))?;
        Ok(Settings {
            args: self,
            lease,
            slices,
            coordinated,
            runtime,
        })
    }

    /// The LeaseCandidate versions: the binary version is this build's, the emulation version
    /// the flag's or the same.
    fn candidate_config(&self, lease: &LeaseConfig) -> Result<Option<CandidateConfig>, String> {
        if !self.coordinated_election {
            return match self.emulation_version {
                Some(_) => Err("--emulation-version needs --coordinated-election".into()),
                None => Ok(None),
            };
        }
        let binary = env!("CARGO_PKG_VERSION");
        let emulation = self.emulation_version.as_deref().unwrap_or(binary);
        let config = CandidateConfig::new(binary, emulation).map_err(|error| match error {
            CandidateError::InvalidVersion { .. }
            | CandidateError::EmulationNewerThanBinary { .. } => {
                format!("--emulation-version: {error}")
            }
            CandidateError::InvalidIdentity(_) => format!("--identity: {error}"),
        })?;
        config
            .check_identity(lease.identity())
            .map_err(|error| format!("--identity: {error}"))?;
        Ok(Some(config))
    }
}

/// The library's reason, phrased with the flags an operator sets.
fn lease_flags_error(error: &LeaseConfigError) -> String {
    let format = |d: &Duration| humantime::format_duration(*d).to_string();
    match error {
        LeaseConfigError::LeaseDurationTooShort {
            lease_duration,
            renew_deadline,
        } => format!(
            "--renew-deadline ({}) must be shorter than --lease-duration ({})",
            format(renew_deadline),
            format(lease_duration)
        ),
        LeaseConfigError::RenewDeadlineTooShort {
            renew_deadline,
            retry_period,
        } => format!(
            "--renew-deadline ({}) must be longer than 1.2 x --retry-period ({})",
            format(renew_deadline),
            format(retry_period)
        ),
        LeaseConfigError::ZeroRetryPeriod => "--retry-period must be greater than zero".into(),
        LeaseConfigError::LeaseDurationOutOfRange(_) => format!("--lease-duration: {error}"),
        LeaseConfigError::EmptyName => {
            "--lease-name and --lease-namespace must not be empty".into()
        }
        LeaseConfigError::EmptyIdentity => {
            "no identity: pass --identity or set POD_NAME or HOSTNAME".into()
        }
    }
}

/// The planner's reason, with the flag it comes from.
fn slice_flags_error(error: &slices::ConfigError) -> String {
    let flag = match error {
        slices::ConfigError::MaxEndpointsOutOfRange(_) => "--max-endpoints-per-slice",
        slices::ConfigError::InvalidManagedBy(_) => "--managed-by",
        slices::ConfigError::InvalidNamePrefix(_) => "--slice-prefix",
    };
    format!("{flag}: {error}")
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

/// Identity used by the tools when none is set: they never hold the Lease.
const TOOL_IDENTITY: &str = "external-endpoints-tool";

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["external-endpoints"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    }

    fn invocation(argv: &[&str]) -> Invocation {
        Invocation::of(argv.iter().map(Into::into).collect())
    }

    #[test]
    fn the_plugin_is_recognised_by_its_executable_name_only() {
        let plugin = invocation(&["/home/me/.krew/bin/kubectl-external_endpoints"]);
        assert!(plugin.as_plugin && !plugin.explicit_run);
        assert!(!invocation(&["/usr/local/bin/external-endpoints"]).as_plugin);
        assert!(!invocation(&["kubectl-external_endpoints-old"]).as_plugin);
        let help = plugin.command().render_usage().to_string();
        assert!(
            help.starts_with("Usage: kubectl external-endpoints"),
            "{help}"
        );
    }

    #[test]
    fn settings_from_args_read_the_arguments_and_no_environment_variable() {
        // Whatever this process's HOSTNAME, POD_NAME or WORKERS: only the list counts.
        let missing = Args::settings_from_args(["external-endpoints"]).unwrap_err();
        assert!(missing.contains("no identity"), "{missing}");
        let settings = Args::settings_from_args([
            "external-endpoints",
            "--identity",
            "replica-0",
            "--workers",
            "2",
            "--lease-namespace",
            "sim",
        ])
        .unwrap();
        assert_eq!(settings.lease.identity(), "replica-0");
        assert_eq!(settings.runtime.workers().get(), 2);
        assert_eq!(settings.args.lease_namespace, "sim");
        assert_eq!(settings.args.sources.lease_namespace, Source::Flag);
        let defaults = Args::settings_from_args(["external-endpoints", "--identity", "a"]).unwrap();
        assert_eq!(defaults.runtime.workers().get(), 32);
        assert_eq!(defaults.args.lease_namespace, "default");
        assert!(
            Args::settings_from_args(["external-endpoints", "--identity", "a", "--workers", "0"])
                .is_err()
        );
    }

    #[test]
    fn run_is_dropped_so_the_replica_flags_may_follow_it() {
        let run = invocation(&["external-endpoints", "run", "--identity", "a"]);
        assert!(run.explicit_run);
        let args = Args::parse_from_invocation(&run).unwrap();
        assert!(args.command.is_none() && args.runs_replica());
        assert_eq!(args.identity.as_deref(), Some("a"));
        let after_flags = invocation(&["external-endpoints", "--identity", "a", "run"]);
        let args = Args::parse_from_invocation(&after_flags).unwrap();
        assert!(matches!(args.command, Some(Command::Run)) && args.runs_replica());
        let check = invocation(&["external-endpoints", "check"]);
        assert!(!Args::parse_from_invocation(&check).unwrap().runs_replica());
        let both = invocation(&["external-endpoints", "run", "check"]);
        assert_eq!(
            Args::parse_from_invocation(&both).unwrap_err().exit_code(),
            2
        );
    }

    #[test]
    fn sources_tell_a_flag_from_a_default() {
        let given = invocation(&[
            "external-endpoints",
            "diff",
            "--managed-by",
            "me",
            "--lease-namespace",
            "ns",
        ]);
        let sources = Args::parse_from_invocation(&given).unwrap().sources;
        assert_eq!(sources.managed_by, Source::Flag);
        assert_eq!(sources.lease_namespace, Source::Flag);
        assert_eq!(sources.slice_prefix, Source::Default);
        assert_eq!(sources.max_endpoints_per_slice, Source::Default);
        let args = Args::parse_from_invocation(&invocation(&["external-endpoints"])).unwrap();
        assert_eq!(args.sources.managed_by, Source::Default);
    }

    #[test]
    fn defaults_match_the_design() {
        let args = parse(&["--identity", "a"]).unwrap();
        assert_eq!(args.lease_duration, Duration::from_secs(15));
        assert_eq!(args.renew_deadline, Duration::from_secs(10));
        assert_eq!(args.retry_period, Duration::from_secs(2));
        // Caps since issue 34: the writes in flight adapt below them.
        assert_eq!(args.workers.get(), 32);
        assert_eq!(args.write_qps, 2000);
        assert_eq!(args.max_endpoints_per_slice, 100);
        assert_eq!(args.managed_by, "linkerd-external-workloads-controller");
        assert_eq!(args.slice_prefix, "linkerd-external-");
        assert_eq!(args.resync_period, Duration::from_secs(600));
        assert!(args.validate(None).is_ok());
    }

    #[test]
    fn coordinated_election_is_off_by_default_and_announces_the_build_version() {
        let settings = parse(&["--identity", "a"]).unwrap().validate(None).unwrap();
        assert_eq!(settings.coordinated, None);

        let settings = parse(&["--identity", "a", "--coordinated-election"])
            .unwrap()
            .validate(None)
            .unwrap();
        // Binary and emulation versions: both this build's.
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            settings.coordinated.unwrap(),
            CandidateConfig::new(version, version).unwrap()
        );

        let settings = parse(&[
            "--identity",
            "a",
            "--coordinated-election",
            "--emulation-version",
            "0.0.1",
        ])
        .unwrap()
        .validate(None)
        .unwrap();
        // The binary's version, and the emulation version of the flag.
        assert_eq!(
            settings.coordinated.unwrap(),
            CandidateConfig::new(env!("CARGO_PKG_VERSION"), "0.0.1").unwrap()
        );
    }

    #[test]
    fn coordinated_election_refuses_bad_versions_and_identities() {
        let refused = |extra: &[&str]| {
            let mut argv = vec!["--coordinated-election"];
            argv.extend_from_slice(extra);
            parse(&argv).unwrap().validate(None).unwrap_err()
        };
        assert!(
            refused(&["--identity", "a", "--emulation-version", "1.x"])
                .contains("--emulation-version")
        );
        assert!(
            refused(&["--identity", "a", "--emulation-version", "999.0.0"])
                .contains("--emulation-version")
        );
        assert!(refused(&["--identity", "pod/a"]).contains("--identity"));
        let alone = parse(&["--identity", "a", "--emulation-version", "0.0.1"]).unwrap();
        assert!(
            alone
                .validate(None)
                .unwrap_err()
                .contains("--coordinated-election")
        );
    }

    #[test]
    fn negative_duration_is_a_usage_error() {
        let err = parse(&["--lease-duration", "-5s"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn max_endpoints_out_of_range_is_refused() {
        for bad in ["0", "1001"] {
            let args = parse(&["--identity", "a", "--max-endpoints-per-slice", bad]).unwrap();
            let err = args.validate(None).unwrap_err();
            assert!(err.starts_with("--max-endpoints-per-slice"), "{err}");
        }
        let args = parse(&["--identity", "a", "--max-endpoints-per-slice", "1000"]).unwrap();
        assert_eq!(
            args.validate(None)
                .unwrap()
                .slices
                .max_endpoints_per_slice(),
            1000
        );
    }

    #[test]
    fn invalid_slice_labels_name_their_flag() {
        let args = parse(&["--identity", "a", "--managed-by", " "]).unwrap();
        assert!(args.validate(None).unwrap_err().starts_with("--managed-by"));
        let args = parse(&["--identity", "a", "--slice-prefix", "Upper"]).unwrap();
        assert!(
            args.validate(None)
                .unwrap_err()
                .starts_with("--slice-prefix")
        );
    }

    #[test]
    fn a_watch_stall_timeout_below_six_seconds_is_refused() {
        let args = parse(&["--identity", "a"]).unwrap();
        assert_eq!(args.watch_stall_timeout, Duration::from_secs(30));
        let args = parse(&["--identity", "a", "--watch-stall-timeout", "5s"]).unwrap();
        let err = args.validate(None).unwrap_err();
        assert!(err.starts_with("--watch-stall-timeout"), "{err}");
        let args = parse(&["--identity", "a", "--watch-stall-timeout", "6s"]).unwrap();
        assert!(args.validate(None).is_ok());
    }

    #[test]
    fn empty_lease_name_is_refused() {
        let args = parse(&["--identity", "a", "--lease-name", ""]).unwrap();
        assert!(args.validate(None).unwrap_err().contains("--lease-name"));
    }

    #[test]
    fn renew_deadline_must_be_shorter_than_lease_duration() {
        let args = parse(&["--identity", "a", "--renew-deadline", "15s"]).unwrap();
        let err = args.validate(None).unwrap_err();
        assert!(err.contains("--renew-deadline"), "{err}");
    }

    #[test]
    fn renew_deadline_must_exceed_retry_period_margin() {
        let args = parse(&["--identity", "a", "--retry-period", "9s"]).unwrap();
        assert!(args.validate(None).is_err());
    }

    #[test]
    fn identity_falls_back_to_hostname() {
        // An empty --identity counts as unset, whatever POD_NAME holds in the test environment.
        let args = parse(&["--identity", ""]).unwrap();
        let settings = args.clone().validate(Some("host-1".into())).unwrap();
        assert_eq!(settings.lease.identity(), "host-1");
        let err = args.validate(None).unwrap_err();
        assert!(err.contains("no identity"), "{err}");
    }
}
