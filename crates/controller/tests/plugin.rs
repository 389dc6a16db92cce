//! The binary as a kubectl plugin: installed as `kubectl-external_endpoints` on the PATH, kubectl
//! runs it for `kubectl external-endpoints ...` with argv[0] the plugin's path. Without a
//! subcommand it prints its help and exits 0 (as kubectl and cobra-built plugins do) and starts
//! no replica; `run` starts one; `check` works. The same binary under its own name still starts
//! a replica without a subcommand (the image's entrypoint, `deploy/` and the chart rely on it).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use harness::{closed_port_kubeconfig, exit_within, wait_for_stderr_line};

/// Far more than printing help takes; a replica would still be running after it.
const WITHIN: Duration = Duration::from_secs(10);

/// A folder holding `kubectl-external_endpoints`, a symlink to the binary, as a plugin
/// installation (krew, or a copy on the PATH) does.
fn plugin_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-external_endpoints");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_external-endpoints"), &plugin).unwrap();
    (dir, plugin)
}

/// Runs `program args` with everything a replica needs to start (a kubeconfig in KUBECONFIG,
/// an identity in POD_NAME, a free admin port) until it exits or `WITHIN` passes. Returns its
/// output and whether it was still running (then killed).
fn run(program: &Path, args: &[&str], kubeconfig: &Path) -> (Output, bool) {
    let child = Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", "operator-laptop")
        .env("ADMIN_ADDR", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    exit_within(child, WITHIN)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn plugin_without_a_subcommand_prints_help_exits_0_and_starts_no_replica() {
    let (dir, plugin) = plugin_dir();
    let kubeconfig = closed_port_kubeconfig(dir.path());
    let (output, still_running) = run(&plugin, &[], &kubeconfig);
    assert!(!still_running, "it kept running: a replica was started");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let help = text(&output.stdout);
    assert!(
        help.contains("Usage: kubectl external-endpoints [OPTIONS] [COMMAND]"),
        "{help}"
    );
    for command in ["check", "diff", "run"] {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(&format!("{command} "))),
            "{command} is not listed:\n{help}"
        );
    }
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("starting"), "a replica logged:\n{stderr}");
}

/// The contrasts that give the test above its meaning: with the same environment, `run` under
/// the plugin's name and the bare binary under its own name do start a replica.
#[test]
fn run_as_plugin_and_the_bare_binary_start_a_replica() {
    let (dir, plugin) = plugin_dir();
    let kubeconfig = closed_port_kubeconfig(dir.path());
    let binary = Path::new(env!("CARGO_BIN_EXE_external-endpoints"));
    for (program, args) in [(plugin.as_path(), &["run"][..]), (binary, &[][..])] {
        let mut child = Command::new(program)
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", "operator-laptop")
            .env("ADMIN_ADDR", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (started, seen) = wait_for_stderr_line(&mut child, "starting", WITHIN);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            started,
            "{} {args:?}: no \"starting\" log line:\n{}",
            program.display(),
            seen.join("\n")
        );
    }
}

/// `kubectl external-endpoints check` reaches the tool, named as the plugin in its errors.
#[test]
fn plugin_runs_check() {
    let (dir, plugin) = plugin_dir();
    let kubeconfig = closed_port_kubeconfig(dir.path());
    let (output, still_running) = run(&plugin, &["check"], &kubeconfig);
    assert!(!still_running);
    assert_eq!(output.status.code(), Some(1));
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with("FAIL api-server: cannot reach the API server"),
        "{stdout}"
    );
    let (output, _) = run(&plugin, &["check", "--no-such-flag"], &kubeconfig);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("Usage: kubectl external-endpoints check"),
        "{stderr}"
    );
}

/// Through kubectl itself, when it is on the PATH: `kubectl external-endpoints` finds the plugin
/// on the PATH and prints its help.
#[test]
fn kubectl_finds_the_plugin_on_the_path() {
    let Some(kubectl) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("kubectl"))
        .find(|path| path.is_file())
    else {
        eprintln!("kubectl is not on the PATH: skipped");
        return;
    };
    let (dir, _plugin) = plugin_dir();
    let kubeconfig = closed_port_kubeconfig(dir.path());
    let path = std::env::join_paths(
        std::iter::once(dir.path().to_path_buf())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let output = Command::new(&kubectl)
        .arg("external-endpoints")
        .env("PATH", path)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAME", "operator-laptop")
        .env("ADMIN_ADDR", "127.0.0.1:0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("Usage: kubectl external-endpoints"),
        "{}",
        text(&output.stdout)
    );
}
