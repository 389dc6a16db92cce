//! Unit tests of the command line: the plugin's name, `run`, the sources of settings, the
//! defaults, and the validation of each flag.

use std::time::Duration;

use clap::Parser;
use leadership::CandidateConfig;

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
        refused(&["--identity", "a", "--emulation-version", "1.x"]).contains("--emulation-version")
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
