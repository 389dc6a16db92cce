//! `fenceless-controller`: the controller binary with its own write fence switched off, for
//! testbed tests only (a leader paused past its lease then writes as if still leading, and the
//! API server's fencing policy is what must refuse it). Same flags as `external-endpoints`.

use external_endpoints::{cli::Args, run};

fn main() -> std::process::ExitCode {
    let mut settings = Args::parse_and_validate();
    settings.runtime = settings
        .runtime
        .with_safeguards(leadership::Safeguards::default().without_fence());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
