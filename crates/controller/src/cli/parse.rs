//! Turning a command line into settings: how the binary was invoked (by its own name or as the
//! kubectl plugin, with a leading `run` or not), parsing, where each setting came from, then
//! validation; with or without the environment's fallbacks.

use std::ffi::OsString;

use clap::{ArgMatches, CommandFactory, FromArgMatches, error::ErrorKind, parser::ValueSource};

use super::{Args, Settings, Source, Sources};

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
}

/// Identity used by the tools when none is set: they never hold the Lease.
const TOOL_IDENTITY: &str = "external-endpoints-tool";
