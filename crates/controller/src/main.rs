//! `external-endpoints`: publishes EndpointSlices for Services that select ExternalWorkloads.
//! Also `kubectl external-endpoints` when installed as `kubectl-external_endpoints`.

use external_endpoints::{
    check,
    cli::{Args, Command},
    diff, run,
};

fn main() -> std::process::ExitCode {
    let settings = Args::parse_and_validate();
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
    let result = match settings.args.command.clone() {
        None | Some(Command::Run) => runtime.block_on(run(settings)).map(|()| true),
        Some(Command::Check(args)) => runtime.block_on(check(&settings, &args)),
        Some(Command::Diff(args)) => match runtime.block_on(diff(&settings, &args)) {
            // As `kubectl diff`: 1 means "there are changes", so an error is 2.
            Err(error) => {
                eprintln!("error: {error:#}");
                return std::process::ExitCode::from(2);
            }
            result => result,
        },
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
