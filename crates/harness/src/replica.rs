//! One `external-endpoints` process: spawned with a kubeconfig, an identity and flags, logging
//! JSON to a file, with its admin server found in the log; killed when dropped.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, SystemTime},
};

use k8s_openapi::jiff::Timestamp;
use tokio::process::{Child, Command};

use crate::{
    http::http_get,
    metrics::Metrics,
    poll::{CONVERGE, poll_every},
};

/// Lease timings used by the e2e replicas: short, so fail-over tests stay quick.
pub const LEASE_ARGS: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "1s",
];

/// Name of the Lease the e2e replicas share (one per test namespace).
pub const LEASE: &str = "e2e-lease";

/// Writes into `dir` a kubeconfig whose server is a port nobody listens on (one just bound and
/// let go, on 127.0.0.1), for an anonymous user, and returns its path. A replica started with it
/// logs "starting" and keeps retrying; the tools fail fast on it.
pub fn closed_port_kubeconfig(dir: &Path) -> PathBuf {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: closed\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: closed\n  context:\n    cluster: closed\n    user: nobody\ncurrent-context: closed\nusers:\n- name: nobody\n  user: {{}}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Waits until `child` exits or `within` has passed, and kills it if it is still running then.
/// Returns its output (what it piped) and whether it had to be killed.
pub fn exit_within(
    mut child: std::process::Child,
    within: Duration,
) -> (std::process::Output, bool) {
    let started = tokio::time::Instant::now();
    let mut running = true;
    while started.elapsed() < within {
        if child.try_wait().unwrap().is_some() {
            running = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if running {
        child.kill().unwrap();
    }
    (child.wait_with_output().unwrap(), running)
}

/// Reads the piped stderr of `child` (on a thread of its own) until a line contains `needle` or
/// `within` has passed. Returns whether such a line came, and the lines before it.
pub fn wait_for_stderr_line(
    child: &mut std::process::Child,
    needle: &str,
    within: Duration,
) -> (bool, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let stderr = child.stderr.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match received.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return (true, seen),
            Ok(line) => seen.push(line),
            Err(_) => return (false, seen),
        }
    }
}

/// The controller binary to run. Only the package's own tests and benches know its path, so
/// each passes it: `Binary(env!("CARGO_BIN_EXE_external-endpoints"))`.
#[derive(Clone, Copy, Debug)]
pub struct Binary(pub &'static str);

/// How a bench replica is started (see [`ReplicaSpec::start`]).
#[derive(Clone, Debug)]
pub struct ReplicaSpec {
    /// Watch only this namespace (all when None).
    pub watch_namespace: Option<String>,
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// Extra flags.
    pub extra: Vec<String>,
}

/// One controller process.
pub struct Replica {
    /// Its Lease identity.
    pub identity: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    admin: SocketAddr,
    /// When the process was spawned (wall clock, to compare with log timestamps).
    pub spawned_at: SystemTime,
    _dir: tempfile::TempDir,
}

// === impl ReplicaSpec ===

impl ReplicaSpec {
    /// The flags of this spec: the Lease, `info` logs, the namespace watched, the extra flags.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--lease-namespace",
            &self.lease_namespace,
            "--lease-name",
            &self.lease_name,
            "--log-level",
            "info",
        ]
        .map(String::from)
        .into();
        if let Some(namespace) = &self.watch_namespace {
            args.extend(["--watch-namespace".to_string(), namespace.clone()]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Starts a replica of `binary` with this spec and waits for its admin server.
    pub async fn start(&self, binary: Binary, kubeconfig: &Path, identity: &str) -> Replica {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Replica::start_with(binary, kubeconfig, identity, &args).await
    }
}

// === impl Replica ===

impl Replica {
    /// Starts a replica watching `namespace` and competing for [`LEASE`] there, and waits for
    /// its admin server. `extra` flags are appended.
    pub async fn start(
        binary: Binary,
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        extra: &[&str],
    ) -> Replica {
        Replica::start_with(
            binary,
            testbed.kubeconfig_path(),
            identity,
            &e2e_args(namespace, extra),
        )
        .await
    }

    /// Starts the binary with `kubeconfig`, `identity`, JSON logs on a free admin port and
    /// exactly the other flags in `args` (no namespace or Lease flags are added: cluster-wide
    /// unless `args` says otherwise), and waits for its admin server.
    pub async fn start_with(
        binary: Binary,
        kubeconfig: &Path,
        identity: &str,
        args: &[&str],
    ) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(format!("{identity}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let spawned_at = SystemTime::now();
        let child = Command::new(binary.0)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--identity", identity])
            .args(["--admin-addr", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("WATCH_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let admin = poll_every(
            "the admin address in the log",
            CONVERGE,
            Duration::from_millis(20),
            || async { admin_address(&log) },
        )
        .await;
        Replica {
            identity: identity.to_string(),
            child,
            pid,
            log,
            admin,
            spawned_at,
            _dir: dir,
        }
    }

    /// The admin server's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The replica's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The log's JSON lines.
    pub fn log_entries(&self) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Wall-clock time of the first log line whose message contains `text`.
    pub fn logged_at(&self, text: &str) -> Option<SystemTime> {
        self.log_entries().into_iter().find_map(|entry| {
            let message = entry.get("message")?.as_str()?;
            if !message.contains(text) {
                return None;
            }
            let timestamp: Timestamp = entry.get("timestamp")?.as_str()?.parse().ok()?;
            Some(SystemTime::from(timestamp))
        })
    }

    /// `GET path` on the admin server: (status, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.admin, path).await
    }

    /// Current metrics (`/metrics` answered 200).
    pub async fn metrics(&self) -> Result<Metrics, String> {
        match self.get("/metrics").await? {
            (200, body) => Ok(Metrics(body)),
            (status, body) => Err(format!("/metrics {status} {body}")),
        }
    }

    /// The sum of every series of metric `name` (optionally only those whose labels contain
    /// `labels`, e.g. `operation="Create"`).
    pub async fn metric(&self, name: &str, labels: &str) -> Result<f64, String> {
        let metrics = self.metrics().await?;
        metrics
            .get(name, labels)
            .ok_or_else(|| format!("no metric {name} in:\n{}", metrics.0))
    }

    /// Whether the replica reports itself as leader.
    pub async fn is_leader(&self) -> bool {
        self.metric("external_endpoints_leader", "")
            .await
            .unwrap_or(0.0)
            == 1.0
    }

    /// Whether `/ready` answers 200 (caches synced).
    pub async fn is_ready(&self) -> bool {
        matches!(self.get("/ready").await, Ok((200, _)))
    }

    /// Waits until this replica leads (checked every 20 ms: the benches time with it).
    pub async fn wait_leading(&self, timeout: Duration) {
        let what = format!("{} to lead", self.identity);
        poll_every(&what, timeout, Duration::from_millis(20), || async {
            if self.is_leader().await {
                Ok(())
            } else {
                Err("not leading".to_string())
            }
        })
        .await
    }

    /// Waits until `/ready` answers 200.
    pub async fn wait_ready(&self, timeout: Duration) {
        let what = format!("{} to be ready", self.identity);
        poll_every(&what, timeout, Duration::from_millis(50), || async {
            match self.get("/ready").await? {
                (200, _) => Ok(()),
                (status, body) => Err(format!("/ready {status} {body}")),
            }
        })
        .await
    }

    /// Resident set size (VmRSS) and its peak (VmHWM), in bytes (0 once the process is gone).
    pub fn rss(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends SIGKILL (crash).
    pub fn kill(&self) {
        self.signal("-KILL");
    }

    /// Stops the process where it is (SIGSTOP), as a long pause of its node would.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`Replica::pause`]d process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        // Once reaped the pid may be another process's: signal only a child not waited for.
        if let Some(pid) = self.child.id() {
            let status = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill {signal} {pid} failed");
        }
    }

    /// Waits for the process to exit (panics after `timeout`).
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!(
                "{} did not exit within {timeout:?}; log tail:\n{}",
                self.identity,
                self.log_tail(60)
            ),
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The whole log outlives the temporary directory, for the failure's analysis.
            let kept = std::env::temp_dir().join(format!(
                "external-endpoints-{}-{}.log",
                self.identity,
                self.child.id().unwrap_or_default()
            ));
            let kept = match std::fs::copy(&self.log, &kept) {
                Ok(_) => format!("whole log kept in {}", kept.display()),
                Err(error) => format!("log not kept: {error}"),
            };
            eprintln!(
                "--- replica {} log (last 60 lines; {kept}) ---\n{}",
                self.identity,
                self.log_tail(60)
            );
        }
        // kill_on_drop would too; say it here, where a reader looks.
        let _ = self.child.start_kill();
    }
}

/// The flags of an e2e replica in `namespace`: watch it, compete for [`LEASE`] there with
/// [`LEASE_ARGS`], debug logs of the cluster and leadership crates, a 5 s drain; then `extra`.
pub fn e2e_args<'a>(namespace: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    e2e_args_timed(namespace, &LEASE_ARGS, extra)
}

/// [`e2e_args`] with the lease timing flags `lease` instead of [`LEASE_ARGS`].
pub fn e2e_args_timed<'a>(
    namespace: &'a str,
    lease: &[&'a str],
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["--watch-namespace", namespace];
    args.extend(["--lease-namespace", namespace, "--lease-name", LEASE]);
    args.extend(lease);
    args.extend(["--log-level", "info,cluster=debug,leadership=debug"]);
    args.extend(["--drain-timeout", "5s"]);
    args.extend(extra);
    args
}

fn admin_address(log: &Path) -> Result<SocketAddr, String> {
    let text = std::fs::read_to_string(log).map_err(|e| e.to_string())?;
    for line in text.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(admin) = value.get("admin").and_then(|a| a.as_str()) {
            return admin.parse().map_err(|e| format!("{admin}: {e}"));
        }
    }
    Err(format!("no admin address yet; log:\n{text}"))
}
