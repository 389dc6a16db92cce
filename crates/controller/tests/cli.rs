//! The command line of the real binary: invalid settings are refused with exit code 2 and a
//! one-line error before anything touches the cluster, and `--help` explains every flag.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    process::{Command, Output, Stdio},
    time::Duration,
};

use harness::{closed_port_kubeconfig, exit_within, wait_for_stderr_line};

/// Far more than the binary needs to reject its arguments; a run that got as far as the
/// cluster would retry a closed port for much longer than this.
const REJECT_WITHIN: Duration = Duration::from_secs(10);

/// Runs the binary with `args` (plus a closed-port kubeconfig, on which a binary that got past
/// its argument checks could only fail later and differently, and a free admin port) and no
/// identity in the environment; kills it if it is still running after [`REJECT_WITHIN`].
fn run(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = closed_port_kubeconfig(dir.path());
    let child = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--admin-addr", "127.0.0.1:0"])
        .args(args)
        .env_remove("POD_NAME")
        .env_remove("HOSTNAME")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (output, running) = exit_within(child, REJECT_WITHIN);
    assert!(
        !running,
        "{args:?} was not rejected within {REJECT_WITHIN:?}; stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Asserts a usage error: exit code 2, exactly one `error:` line that mentions `mentions`,
/// and no sign of the controller having started (no log line, nothing on stdout).
fn assert_rejected(args: &[&str], mentions: &str) {
    let output = run(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}; stderr:\n{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("error"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "{args:?}: one error line; stderr:\n{stderr}"
    );
    assert!(
        errors[0].starts_with("error: ") && errors[0].contains(mentions),
        "{args:?}: the error should mention {mentions:?}: {}",
        errors[0]
    );
    assert!(
        !stderr.contains("starting") && !stderr.contains("127.0.0.1"),
        "{args:?}: rejected before starting; stderr:\n{stderr}"
    );
    assert!(output.stdout.is_empty(), "{args:?}: nothing on stdout");
}

#[test]
fn negative_duration_is_refused() {
    for flag in [
        "--lease-duration",
        "--renew-deadline",
        "--retry-period",
        "--resync-period",
        "--drain-timeout",
    ] {
        assert_rejected(&["--identity", "a", flag, "-5s"], "cannot be negative");
    }
    assert_rejected(
        &["--identity", "a", "--lease-duration=-1s"],
        "--lease-duration",
    );
}

#[test]
fn malformed_duration_is_refused() {
    assert_rejected(
        &["--identity", "a", "--retry-period", "soon"],
        "--retry-period",
    );
}

#[test]
fn renew_deadline_not_shorter_than_lease_duration_is_refused() {
    assert_rejected(
        &["--identity", "a", "--renew-deadline", "15s"],
        "--renew-deadline (15s) must be shorter than --lease-duration (15s)",
    );
    assert_rejected(
        &[
            "--identity",
            "a",
            "--lease-duration",
            "5s",
            "--renew-deadline",
            "6s",
        ],
        "must be shorter than --lease-duration",
    );
}

#[test]
fn renew_deadline_within_retry_period_margin_is_refused() {
    assert_rejected(
        &["--identity", "a", "--retry-period", "9s"],
        "must be longer than 1.2 x --retry-period",
    );
}

#[test]
fn max_endpoints_per_slice_out_of_range_is_refused() {
    for bad in ["0", "1001", "-1"] {
        assert_rejected(
            &["--identity", "a", "--max-endpoints-per-slice", bad],
            "--max-endpoints-per-slice",
        );
    }
}

#[test]
fn zero_workers_is_refused() {
    assert_rejected(&["--identity", "a", "--workers", "0"], "--workers");
}

#[test]
fn missing_identity_is_refused() {
    assert_rejected(&[], "no identity");
    assert_rejected(&["--identity", "  "], "no identity");
}

#[test]
fn bad_admin_address_and_log_format_are_refused() {
    assert_rejected(
        &["--identity", "a", "--admin-addr", "localhost"],
        "--admin-addr",
    );
    assert_rejected(&["--identity", "a", "--log-format", "xml"], "--log-format");
}

#[test]
fn help_explains_every_flag_with_its_default() {
    let output = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8(output.stdout).unwrap();
    // (flag, its default as --help prints it; None where the fallback is described instead).
    let flags: [(&str, Option<&str>); 24] = [
        ("--kubeconfig", None),
        ("--context", None),
        ("--watch-namespace", None),
        ("--identity", None),
        ("--lease-name", Some("external-endpoints-write")),
        ("--lease-namespace", Some("default")),
        ("--lease-duration", Some("15s")),
        ("--renew-deadline", Some("10s")),
        ("--retry-period", Some("2s")),
        ("--coordinated-election", None),
        ("--emulation-version", None),
        ("--workers", Some("32")),
        ("--write-qps", Some("2000")),
        ("--max-endpoints-per-slice", Some("100")),
        (
            "--managed-by",
            Some("linkerd-external-workloads-controller"),
        ),
        ("--slice-prefix", Some("linkerd-external-")),
        ("--resync-period", Some("10m")),
        ("--drain-timeout", Some("10s")),
        ("--watch-stall-timeout", Some("30s")),
        ("--admin-addr", Some("127.0.0.1:9990")),
        ("--log-format", Some("plain")),
        ("--log-level", Some("info")),
        ("--help", None),
        ("--version", None),
    ];
    for (flag, default) in flags {
        let section =
            flag_section(&help, flag).unwrap_or_else(|| panic!("{flag} is not in --help:\n{help}"));
        let explained = section
            .lines()
            .skip(1)
            .any(|line| line.trim().len() > 10 && !line.trim().starts_with('['));
        assert!(explained, "{flag} has no explanation:\n{section}");
        if let Some(default) = default {
            assert!(
                section.contains(&format!("[default: {default}]")),
                "{flag} should show its default {default}:\n{section}"
            );
        }
    }
    let listed = help.lines().filter(|line| is_flag_line(line)).count();
    assert_eq!(listed, flags.len(), "a flag is not covered here:\n{help}");
}

/// Whether a `--help` line introduces a flag (`  --name <NAME>`, `  -h, --help`).
fn is_flag_line(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("--") || line.starts_with("-h, ") || line.starts_with("-V, ")
}

/// The lines of `--help` describing `flag`: its own line up to the next flag's.
fn flag_section(help: &str, flag: &str) -> Option<String> {
    let lines: Vec<&str> = help.lines().collect();
    let start = lines.iter().position(|line| {
        is_flag_line(line)
            && line
                .split([' ', ','])
                .any(|word| word == flag || word.starts_with(&format!("{flag}=")))
    })?;
    let end = (start + 1..lines.len())
        .find(|&i| is_flag_line(lines[i]))
        .unwrap_or(lines.len());
    Some(lines[start..end].join("\n"))
}

/// The contrast that gives the refusals above their meaning: the same closed-port kubeconfig
/// with valid flags gets past validation and starts (and would keep retrying the cluster).
#[test]
fn valid_flags_get_past_validation_to_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = closed_port_kubeconfig(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--admin-addr", "127.0.0.1:0", "--identity", "a"])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (started, seen) = wait_for_stderr_line(&mut child, "starting", REJECT_WITHIN);
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        started,
        "no \"starting\" log line; stderr:\n{}",
        seen.join("\n")
    );
    assert!(still_running, "it keeps retrying an unreachable cluster");
}

/// docs/operations.md documents exactly the flags `--help` lists, each with the same default.
#[test]
fn operations_guide_documents_every_flag_and_default() {
    let output = Command::new(env!("CARGO_BIN_EXE_external-endpoints"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
    )
    .unwrap();
    // Rows of the flags table: | `--flag` | env | default | meaning |
    let rows: Vec<Vec<&str>> = guide
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .map(|line| line.split('|').map(str::trim).collect())
        .collect();
    let documented: Vec<&str> = rows.iter().map(|r| r[1].trim_matches('`')).collect();
    let listed: Vec<String> = help
        .lines()
        .filter(|line| line.trim_start().starts_with("--"))
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(
        documented, listed,
        "the guide's flags table, in --help order"
    );
    for row in &rows {
        let flag = row[1].trim_matches('`');
        let section = flag_section(&help, flag).unwrap();
        let default = section
            .split("[default: ")
            .nth(1)
            .and_then(|rest| rest.split(']').next());
        if let Some(default) = default {
            assert!(
                row[3].contains(&format!("`{default}`")),
                "{flag}: the guide should give the default `{default}`: {}",
                row[3]
            );
        }
    }
}
