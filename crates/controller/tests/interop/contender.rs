//! The client-go contender (`testbed/contender`, built by `testbed/build.sh`) as a process, our
//! replicas on the same Lease, and the timings both sides run with.
//!
//! ```text
//!  Contender (client-go LeaseLock) ─┐                 ┌─ Replica (ours)
//!        [Proxy] ───────────────────┼─► kube-apiserver ◄┼──────── [Proxy]
//!  JSON events on stdout            └── Lease ──────────┘   JSON log on stderr
//! ```

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use kube::config::Kubeconfig;
use serde_json::Value;
use tokio::process::{Child, Command};

use harness::{CONVERGE, Replica, eventually, proxy::Proxy};

/// The Lease Linkerd's destination service holds (in namespace `linkerd`; here in the test's
/// namespace).
pub const LEASE_NAME: &str = "linkerd-destination-endpoint-write";

/// Linkerd's value of the `endpointslice.kubernetes.io/managed-by` label.
pub const LINKERD_MANAGED_BY: &str = "linkerd-external-workloads-controller";

/// The ConfigMap the contender annotates while it leads.
pub const MARKER_CONFIGMAP: &str = "contender-marker";

/// One side's leader election timings.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Linkerd's settings (its destination service's endpoints controller).
pub const LINKERD: Timings = Timings {
    lease_duration: Duration::from_secs(30),
    renew_deadline: Duration::from_secs(10),
    retry_period: Duration::from_secs(2),
};

/// Short settings both sides use where a test asserts a bound, so the tests stay quick.
///
/// A client-go leader that cannot renew gives up RetryPeriod + RenewDeadline after its last
/// renewal, and then, with ReleaseOnCancel (Linkerd's setting), tries to release the Lease for
/// up to another RenewDeadline *before* it cancels the context of OnStartedLeading: its writers
/// may act until RetryPeriod + 2 × RenewDeadline after its last renewal (7 s here; 22 s with
/// Linkerd's 30 s / 10 s / 2 s). Everyone else waits LeaseDuration after observing that renewal,
/// so LeaseDuration must exceed that sum: 9 s leaves 2 s.
pub const SHORT: Timings = Timings {
    lease_duration: Duration::from_secs(9),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

/// client-go's jitter on a follower's polls: it retries every RetryPeriod × (1 + up to 1.2).
pub const CLIENT_GO_JITTER: f64 = 1.2;

/// One JSON event of the contender (or one line of our replica's log).
#[derive(Clone, Debug)]
pub struct Event {
    pub time: Timestamp,
    pub name: String,
    pub fields: Value,
}

/// A running contender.
pub struct Contender {
    pub identity: String,
    child: Child,
    events: PathBuf,
    klog: PathBuf,
    _kubeconfig: Option<tempfile::NamedTempFile>,
    _dir: tempfile::TempDir,
}

// === impl Timings ===

impl Timings {
    /// Our flags for these timings.
    pub fn our_args(&self) -> Vec<String> {
        vec![
            "--lease-duration".into(),
            secs(self.lease_duration),
            "--renew-deadline".into(),
            secs(self.renew_deadline),
            "--retry-period".into(),
            secs(self.retry_period),
        ]
    }

    /// The contender's flags for these timings.
    fn contender_args(&self) -> Vec<String> {
        vec![
            "-lease-duration".into(),
            secs(self.lease_duration),
            "-renew-deadline".into(),
            secs(self.renew_deadline),
            "-retry-period".into(),
            secs(self.retry_period),
        ]
    }

    /// The longest wait between two polls of a client-go follower.
    pub fn client_go_poll(&self) -> Duration {
        self.retry_period.mul_f64(1.0 + CLIENT_GO_JITTER)
    }
}

fn secs(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

// === impl Contender ===

impl Contender {
    /// The contender's binary; `None` (after a notice) when it has not been built, unless in CI,
    /// where that fails the test.
    pub fn binary(testbed: &testbed::Testbed) -> Option<PathBuf> {
        match &testbed.binaries().contender {
            Some(path) => Some(path.clone()),
            None if testbed::running_in_ci() => {
                panic!("no contender binary: run `bash testbed/build.sh`")
            }
            None => {
                eprintln!(
                    "interop test skipped: no contender binary (run `bash testbed/build.sh`)"
                );
                None
            }
        }
    }

    /// Starts a contender for [`LEASE_NAME`] in `namespace`, through `proxy` if given, and
    /// waits for its first event.
    pub async fn start(
        binary: &Path,
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        timings: Timings,
        proxy: Option<&Proxy>,
    ) -> Contender {
        Contender::start_with(binary, testbed, namespace, identity, timings, proxy, &[]).await
    }

    /// [`Contender::start`] that exits on SIGTERM without releasing the Lease
    /// (`-release-on-cancel=false`), as Linkerd's destination process does: it exits before its
    /// elector's release is sent.
    pub async fn start_without_release(
        binary: &Path,
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        timings: Timings,
    ) -> Contender {
        let extra = ["-release-on-cancel=false"];
        Contender::start_with(binary, testbed, namespace, identity, timings, None, &extra).await
    }

    /// [`Contender::start`] with `extra` flags.
    async fn start_with(
        binary: &Path,
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        timings: Timings,
        proxy: Option<&Proxy>,
        extra: &[&str],
    ) -> Contender {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join(format!("{identity}.events"));
        let klog = dir.path().join(format!("{identity}.klog"));
        let rewritten = proxy.map(|proxy| kubeconfig_through(testbed, proxy.addr()));
        let kubeconfig = rewritten
            .as_ref()
            .map_or(testbed.kubeconfig_path(), |file| file.path());
        let child = Command::new(binary)
            .arg("-kubeconfig")
            .arg(kubeconfig)
            .args(["-identity", identity, "-lease-name", LEASE_NAME])
            .args(["-lease-namespace", namespace])
            .args(["-marker-configmap", MARKER_CONFIGMAP])
            .args(timings.contender_args())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&events).unwrap())
            .stderr(std::fs::File::create(&klog).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let contender = Contender {
            identity: identity.to_string(),
            child,
            events,
            klog,
            _kubeconfig: rewritten,
            _dir: dir,
        };
        contender.wait_event("starting", 1).await;
        contender
    }

    /// Its events so far.
    pub fn events(&self) -> Vec<Event> {
        parse_events(&std::fs::read_to_string(&self.events).unwrap_or_default())
    }

    /// The times of its events named `name`.
    pub fn times(&self, name: &str) -> Vec<Timestamp> {
        self.events()
            .into_iter()
            .filter(|event| event.name == name)
            .map(|event| event.time)
            .collect()
    }

    /// Waits until it has logged `name` at least `count` times; returns the last such time.
    pub async fn wait_event(&self, name: &str, count: usize) -> Timestamp {
        let what = format!("{} to log {name:?} {count} time(s)", self.identity);
        eventually(&what, CONVERGE * 3, || async {
            let times = self.times(name);
            if times.len() >= count {
                Ok(*times.last().unwrap())
            } else {
                Err(format!("{} so far", times.len()))
            }
        })
        .await
    }

    /// Whether it leads now (started leading more often than it stopped).
    pub fn is_leading(&self) -> bool {
        self.times("started leading").len() > self.times("stopped leading").len()
    }

    /// SIGTERM: it stops writing, then releases the Lease (unless started without), then exits.
    pub fn terminate(&self) {
        signal(self.child.id(), "-TERM");
    }

    /// SIGKILL: a crash.
    pub fn kill(&self) {
        signal(self.child.id(), "-KILL");
    }

    /// Waits for it to exit; returns the exit status and when the exit was seen.
    pub async fn wait_exit(&mut self) -> (ExitStatus, Timestamp) {
        match tokio::time::timeout(CONVERGE, self.child.wait()).await {
            Ok(status) => (status.unwrap(), Timestamp::now()),
            Err(_) => panic!("{} did not exit; events:\n{}", self.identity, self.tail()),
        }
    }

    fn tail(&self) -> String {
        let events = std::fs::read_to_string(&self.events).unwrap_or_default();
        let klog = std::fs::read_to_string(&self.klog).unwrap_or_default();
        let last = |text: &str| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        format!("{}\n--- klog ---\n{}", last(&events), last(&klog))
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- contender {} ---\n{}", self.identity, self.tail());
        }
    }
}

fn signal(pid: Option<u32>, signal: &str) {
    if let Some(pid) = pid {
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

/// JSON lines with a `time` (contender) or `timestamp` (our replicas) and an `event` or
/// `message`; other lines are skipped.
pub fn parse_events(text: &str) -> Vec<Event> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|fields| {
            let time = fields
                .get("time")
                .or_else(|| fields.get("timestamp"))?
                .as_str()?
                .parse()
                .ok()?;
            let name = fields
                .get("event")
                .or_else(|| fields.get("message"))?
                .as_str()?
                .to_string();
            Some(Event { time, name, fields })
        })
        .collect()
}

/// A copy of the testbed's kubeconfig whose server is `addr` (a [`Proxy`] in front of the API
/// server; the serving certificate's SAN 127.0.0.1 still verifies).
pub fn kubeconfig_through(testbed: &testbed::Testbed, addr: SocketAddr) -> tempfile::NamedTempFile {
    let mut kubeconfig = Kubeconfig::read_from(testbed.kubeconfig_path()).unwrap();
    for cluster in &mut kubeconfig.clusters {
        if let Some(cluster) = cluster.cluster.as_mut() {
            cluster.server = Some(format!("https://{addr}"));
        }
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_vec(&kubeconfig).unwrap()).unwrap();
    file
}

/// A proxy in front of the testbed's API server.
pub async fn proxy(testbed: &testbed::Testbed) -> Proxy {
    let upstream: SocketAddr = testbed
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    Proxy::start(upstream).await
}

// === our replicas ===

/// One of our replicas, and the proxy its API traffic goes through if any.
pub struct Ours {
    pub replica: Replica,
    pub proxy: Option<Proxy>,
    _kubeconfig: Option<tempfile::NamedTempFile>,
}

impl Ours {
    /// Starts a replica of ours on [`LEASE_NAME`] in `namespace`, with Linkerd's managed-by
    /// value set explicitly (as docs/operations.md's migration section says), optionally behind
    /// its own proxy.
    pub async fn start(
        testbed: &testbed::Testbed,
        namespace: &str,
        identity: &str,
        timings: Timings,
        proxied: bool,
    ) -> Ours {
        Ours::start_on(testbed, namespace, LEASE_NAME, identity, timings, proxied).await
    }

    /// [`Ours::start`] on the Lease `lease`.
    pub async fn start_on(
        testbed: &testbed::Testbed,
        namespace: &str,
        lease: &str,
        identity: &str,
        timings: Timings,
        proxied: bool,
    ) -> Ours {
        let proxy = if proxied {
            Some(proxy(testbed).await)
        } else {
            None
        };
        let rewritten = proxy
            .as_ref()
            .map(|proxy| kubeconfig_through(testbed, proxy.addr()));
        let kubeconfig = rewritten
            .as_ref()
            .map_or(testbed.kubeconfig_path(), |file| file.path());
        let timing_args = timings.our_args();
        let mut args: Vec<&str> = vec!["--watch-namespace", namespace];
        args.extend(["--lease-name", lease, "--lease-namespace", namespace]);
        args.extend(timing_args.iter().map(String::as_str));
        args.extend(["--managed-by", LINKERD_MANAGED_BY]);
        args.extend(["--slice-prefix", "linkerd-external-"]);
        args.extend(["--log-level", "info,cluster=debug,leadership=debug"]);
        args.extend(["--drain-timeout", "5s"]);
        let replica = Replica::start_with(crate::BINARY, kubeconfig, identity, &args).await;
        Ours {
            replica,
            proxy,
            _kubeconfig: rewritten,
        }
    }

    /// Its log as events.
    pub fn events(&self) -> Vec<Event> {
        parse_events(&self.replica.log())
    }
}
