//! Command line: every setting is a flag, most with an environment fallback.
//!
//! Invalid values are rejected here, before anything touches the cluster, with a one-line
//! message and exit code 2 (clap's usage-error code).
//!
//! Its parts: `args` defines the flags and subcommands, `parse` turns a command line into
//! settings (how the binary was invoked, where each setting came from) and `validate` checks
//! the values, building the library configurations from them.

mod args;
mod parse;
#[cfg(test)]
mod tests;
mod validate;

pub use self::{
    args::{Args, CheckArgs, Command, DiffArgs, DiffOutput, LogFormat, Output, Source, Sources},
    parse::{Invocation, PLUGIN_NAME},
    validate::Settings,
};
