//! Log output: plain or JSON lines on stderr, filtered by `--log-level`.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::cli::LogFormat;

/// Installs the global subscriber. Fails on a filter that does not parse.
pub fn init(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|error| anyhow::anyhow!("invalid --log-level {filter:?}: {error}"))?;
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Plain => registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
    }
    Ok(())
}
