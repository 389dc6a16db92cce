//! Shared helpers of the testbed benchmarks: controller processes, metric scraping, bulk
//! creation of Services and workloads, and a small statistics table.
//!
//! A bench cannot import from `tests/`, so this is a small, self-contained sibling of the e2e
//! support code.
#![allow(dead_code)] // each bench binary uses a different part of this module
#![allow(clippy::unwrap_used, clippy::expect_used)] // bench support: a panic is the failure report

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};

use api::v1beta1::ExternalWorkload;
use futures::StreamExt;
use k8s_openapi::{api::core::v1::Service, jiff::Timestamp};
use kube::{Api, Client, api::PostParams};
use slices::testing::{Svc, Workload};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    process::{Child, Command},
    time::Instant,
};

/// Requests in flight while populating the cluster.
pub const CREATE_CONCURRENCY: usize = 32;

/// Whether the binary was started by `cargo bench` (which passes `--bench`). `cargo test
/// --all-targets` also runs bench targets; there they only say they were skipped.
pub fn invoked_by_cargo_bench() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// The main of a bench binary: runs `bench` on a multi-threaded runtime when started by
/// `cargo bench`, and only prints how to run it otherwise (`cargo test --all-targets`).
pub fn bench_main<F: Future<Output = ()>>(name: &str, bench: impl FnOnce() -> F) {
    if !invoked_by_cargo_bench() {
        eprintln!(
            "{name}: a benchmark; run it with `cargo bench -p external-endpoints --bench {name}`"
        );
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

/// A number from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A list of numbers from the environment (`1000,10000`), or `default`.
pub fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

/// Prints a progress line to stderr, prefixed with the bench's elapsed time.
pub fn progress(started: Instant, message: impl std::fmt::Display) {
    eprintln!("[{:7.1}s] {message}", started.elapsed().as_secs_f64());
}

/// Polls `check` every `every` until it returns `Some`, or panics after `timeout`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

// === Replica ===

/// How a replica is started.
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

/// One `external-endpoints` process, logging JSON to a file.
pub struct Replica {
    /// Lease identity.
    pub identity: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    admin: SocketAddr,
    /// When the process was spawned (wall clock, to compare with log timestamps).
    pub spawned_at: SystemTime,
    _dir: tempfile::TempDir,
}

impl Replica {
    /// Starts a replica and waits for its admin server.
    pub async fn start(kubeconfig: &Path, spec: &ReplicaSpec, identity: &str) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(format!("{identity}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_external-endpoints"));
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--identity", identity])
            .args(["--lease-namespace", &spec.lease_namespace])
            .args(["--lease-name", &spec.lease_name])
            .args(["--admin-addr", "127.0.0.1:0", "--log-format", "json"])
            .args(["--log-level", "info"]);
        if let Some(namespace) = &spec.watch_namespace {
            command.args(["--watch-namespace", namespace]);
        }
        let spawned_at = SystemTime::now();
        let child = command
            .args(&spec.extra)
            .env_remove("POD_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let admin = poll(
            "the admin address in the log",
            Duration::from_secs(30),
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

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wall-clock time of the first log line whose message contains `text`.
    pub fn logged_at(&self, text: &str) -> Option<SystemTime> {
        self.log().lines().find_map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).ok()?;
            let message = value.get("message")?.as_str()?;
            if !message.contains(text) {
                return None;
            }
            let timestamp: Timestamp = value.get("timestamp")?.as_str()?.parse().ok()?;
            Some(SystemTime::from(timestamp))
        })
    }

    /// `GET path` on the admin server: (status, body).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.admin, path).await
    }

    /// Current metrics.
    pub async fn metrics(&self) -> Option<Metrics> {
        let (status, body) = self.get("/metrics").await?;
        (status == 200).then_some(Metrics(body))
    }

    /// Whether /ready answers 200 (caches synced).
    pub async fn ready(&self) -> bool {
        matches!(self.get("/ready").await, Some((200, _)))
    }

    /// Whether the leader gauge is 1.
    pub async fn leading(&self) -> bool {
        self.metrics()
            .await
            .is_some_and(|m| m.sum("external_endpoints_leader", "") == 1.0)
    }

    /// Waits until /ready is 200.
    pub async fn wait_ready(&self, timeout: Duration) {
        poll(
            &format!("{} to be ready", self.identity),
            timeout,
            Duration::from_millis(50),
            || async { self.ready().await.then_some(()) },
        )
        .await
    }

    /// Waits until the leader gauge is 1.
    pub async fn wait_leading(&self, timeout: Duration) {
        poll(
            &format!("{} to lead", self.identity),
            timeout,
            Duration::from_millis(20),
            || async { self.leading().await.then_some(()) },
        )
        .await
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Resident set size (VmRSS) and its peak (VmHWM), in bytes.
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

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {} failed", self.pid);
    }

    /// Waits for the process to exit (panics after `timeout`).
    pub async fn wait_exit(&mut self, timeout: Duration) {
        if tokio::time::timeout(timeout, self.child.wait())
            .await
            .is_err()
        {
            panic!(
                "{} did not exit within {timeout:?}; log tail:\n{}",
                self.identity,
                tail(&self.log(), 30)
            );
        }
    }

    /// The last lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log(), lines)
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn admin_address(log: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        value.get("admin")?.as_str()?.parse().ok()
    })
}

async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// One scrape of /metrics (Prometheus text).
#[derive(Clone, Debug)]
pub struct Metrics(pub String);

impl Metrics {
    /// Sum of the samples named exactly `name` whose series contains `labels`.
    pub fn sum(&self, name: &str, labels: &str) -> f64 {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let metric = series.split('{').next()?;
                (metric == name && series.contains(labels)).then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }

    /// Slice writes accepted by the API (creates + updates + deletes).
    pub fn writes(&self) -> f64 {
        self.sum("external_endpoints_slice_writes_total", "")
    }

    /// Slice writes of one operation (`Create`, `Update`, `Delete`).
    pub fn writes_of(&self, operation: &str) -> f64 {
        self.sum(
            "external_endpoints_slice_writes_total",
            &format!("operation=\"{operation}\""),
        )
    }

    /// Reconciles finished (any outcome).
    pub fn reconciles(&self) -> f64 {
        self.sum("external_endpoints_reconcile_duration_seconds_count", "")
    }

    /// Queued or retrying keys.
    pub fn queue_depth(&self) -> f64 {
        self.sum("external_endpoints_queue_depth", "")
    }

    /// Keys being reconciled.
    pub fn in_flight(&self) -> f64 {
        self.sum("external_endpoints_queue_in_flight", "")
    }

    /// Keys added to the queue.
    pub fn queue_adds(&self) -> f64 {
        self.sum("external_endpoints_queue_adds_total", "")
    }

    /// User + system CPU time of the process so far, in seconds (10 ms resolution).
    pub fn cpu_seconds(&self) -> f64 {
        self.sum("process_cpu_seconds_total", "")
    }

    /// Resident memory reported by the process itself.
    pub fn rss(&self) -> f64 {
        self.sum("process_resident_memory_bytes", "")
    }
}

// === Cluster population ===

/// Service `i` of a namespace: headless (no cluster IP to allocate), selecting `app=svc-<i>`,
/// one named port.
pub fn service(namespace: &str, i: usize) -> Service {
    let name = format!("svc-{i}");
    let mut service: Service = Svc::named(&name)
        .namespace(namespace)
        .selector("app", &name)
        .port("http", 80, "http")
        .headless()
        .build();
    service.metadata.uid = None;
    service
}

/// Workload `j` of Service `i`: one IPv4 address unique in the namespace, labels selecting it.
pub fn workload(namespace: &str, i: usize, j: usize, per_service: usize) -> ExternalWorkload {
    let n = i * per_service + j;
    let ip = format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256);
    let mut workload: ExternalWorkload = Workload::named(&format!("svc-{i}-vm-{j}"))
        .namespace(namespace)
        .label("app", &format!("svc-{i}"))
        .ip(&ip)
        .port("http", 8080)
        .build();
    workload.metadata.uid = None;
    workload
}

/// Creates `services` Services and `per_service` workloads for each in `namespace`, with
/// [`CREATE_CONCURRENCY`] requests in flight; a request that fails is retried a few times.
pub async fn populate(
    client: &Client,
    namespace: &str,
    services: usize,
    per_service: usize,
    started: Instant,
) {
    populate_range(client, namespace, 0..services, per_service, started).await
}

/// Like [`populate`], for Services `range` (`svc-<i>` for `i` in it) and their workloads.
pub async fn populate_range(
    client: &Client,
    namespace: &str,
    range: std::ops::Range<usize>,
    per_service: usize,
    started: Instant,
) {
    let service_api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let workload_api: Api<ExternalWorkload> = Api::namespaced(client.clone(), namespace);
    let total = range.len() * (1 + per_service);
    let done = Arc::new(AtomicUsize::new(0));
    let begun = Instant::now();
    let reporter = {
        let done = done.clone();
        let namespace = namespace.to_string();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let n = done.load(Ordering::Relaxed);
                progress(
                    started,
                    format!(
                        "  {namespace}: {n}/{total} objects ({:.0}/s)",
                        n as f64 / begun.elapsed().as_secs_f64()
                    ),
                );
            }
        })
    };
    let jobs = range.flat_map(|i| (0..=per_service).map(move |j| (i, j)));
    futures::stream::iter(jobs)
        .for_each_concurrent(CREATE_CONCURRENCY, |(i, j)| {
            let (service_api, workload_api, done) =
                (service_api.clone(), workload_api.clone(), done.clone());
            async move {
                for attempt in 0.. {
                    let result = if j == 0 {
                        service_api
                            .create(&PostParams::default(), &service(namespace, i))
                            .await
                            .map(drop)
                    } else {
                        workload_api
                            .create(
                                &PostParams::default(),
                                &workload(namespace, i, j - 1, per_service),
                            )
                            .await
                            .map(drop)
                    };
                    match result {
                        Ok(()) => break,
                        Err(kube::Error::Api(status)) if status.code == 409 => break,
                        Err(error) if attempt < 10 => {
                            eprintln!("create {i}/{j} failed (retrying): {error}");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(error) => panic!("create {i}/{j} failed: {error}"),
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
        .await;
    reporter.abort();
    progress(
        started,
        format!(
            "  {namespace}: {total} objects created in {:.1}s",
            begun.elapsed().as_secs_f64()
        ),
    );
}

// === Statistics ===

/// min / median / max of samples, in the unit they were given.
pub fn summary(samples: &[f64]) -> (f64, f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (sorted[0], median, sorted[n - 1])
}

/// Seconds from `from` to `to` (negative when `to` is earlier).
pub fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A results table, printed to stdout.
#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 6]>,
}

impl Table {
    /// Adds a row: what, n, min, median, max, target/verdict.
    pub fn row(&mut self, what: &str, unit: &str, samples: &[f64], target: &str) {
        let (min, median, max) = summary(samples);
        let fmt = |v: f64| {
            if unit.is_empty() {
                format!("{v:.0}")
            } else {
                format!("{v:.3} {unit}")
            }
        };
        self.rows.push([
            what.to_string(),
            samples.len().to_string(),
            fmt(min),
            fmt(median),
            fmt(max),
            target.to_string(),
        ]);
    }

    /// Prints the table as Markdown.
    pub fn print(&self, title: &str) {
        println!("\n### {title}\n");
        println!("| measurement | n | min | median | max | target |");
        println!("|---|---|---|---|---|---|");
        for row in &self.rows {
            println!("| {} |", row.join(" | "));
        }
        println!();
    }
}
