//! Starting etcd and kube-apiserver, with retries when another process wins a port race.

use std::net::SocketAddr;
use std::path::Path;

use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::TestbedError;
use crate::certs::Pki;
use crate::process::{Supervised, free_port, lost_port_race};
use crate::wait::{Deadline, POLL, probe_once};

/// Attempts per server before a lost port race becomes an error.
const PORT_ATTEMPTS: usize = 5;

/// Lines of log carried by start-up errors.
const ERROR_TAIL_LINES: usize = 40;

/// The service range: dual-stack, so tests can create IPv6 and dual-stack Services.
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:10:96::/112";

/// Outcome of waiting for a server to become ready.
enum Readiness {
    Ready,
    Exited(String),
    TimedOut,
}

/// Starts etcd in `dir/etcd-data`; returns it with its client URL once `/health` is true.
pub(crate) async fn start_etcd(
    binary: &Path,
    dir: &Path,
    deadline: Deadline,
) -> Result<(Supervised, String), TestbedError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let client = format!("http://127.0.0.1:{}", free_port()?);
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let data = dir.join("etcd-data");
        // A previous attempt may have left a half-initialised member behind.
        let _ = std::fs::remove_dir_all(&data);
        let args = vec![
            "--name=testbed".to_string(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=testbed={peer}"),
            // Port 0: the metrics listener must not take a fixed port either.
            "--listen-metrics-urls=http://127.0.0.1:0".to_string(),
            // Test data need not survive a power cut; fsync dominates etcd latency.
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ];
        let mut etcd = Supervised::spawn("etcd", binary, &args, dir.join("etcd.log"))?;
        let health: SocketAddr = match client.trim_start_matches("http://").parse() {
            Ok(addr) => addr,
            Err(error) => {
                return Err(startup_error(
                    "etcd",
                    &etcd,
                    format!("bad address: {error}"),
                ));
            }
        };
        match wait_ready(&mut etcd, deadline, || etcd_healthy(health)).await {
            Readiness::Ready => return Ok((etcd, client)),
            Readiness::Exited(_) if attempt < PORT_ATTEMPTS && lost_port_race(etcd.log()) => {
                continue;
            }
            Readiness::Exited(status) => {
                return Err(startup_error("etcd", &etcd, format!("exited ({status})")));
            }
            Readiness::TimedOut => {
                return Err(startup_error("etcd", &etcd, "not healthy in time".into()));
            }
        }
    }
}

/// What distinguishes one kube-apiserver from another on the same etcd.
pub(crate) struct ApiServerSpec<'a> {
    pub binary: &'a Path,
    pub dir: &'a Path,
    pub pki: &'a Pki,
    pub etcd_url: &'a str,
    /// Server name and log file stem (`kube-apiserver`, `kube-apiserver-1`, ...).
    pub name: &'a str,
    /// The port whose URL is the service-account issuer: every API server of one control
    /// plane names the same issuer (the first one's), as in an HA control plane.
    pub issuer_port: Option<u16>,
    /// Flags appended to the defaults.
    pub extra_args: Vec<String>,
}

/// Starts kube-apiserver against `etcd_url`; returns it with its port once it listens
/// (readiness is awaited by the caller, through a client that uses the kubeconfig).
pub(crate) async fn start_apiserver(
    spec: &ApiServerSpec<'_>,
    deadline: Deadline,
) -> Result<(Supervised, u16), TestbedError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = free_port()?;
        let issuer = spec.issuer_port.unwrap_or(port);
        let mut args = apiserver_args(spec.dir, spec.pki, spec.etcd_url, port, issuer);
        args.extend(spec.extra_args.iter().cloned());
        let mut apiserver = Supervised::spawn(
            spec.name,
            spec.binary,
            &args,
            spec.dir.join(format!("{}.log", spec.name)),
        )?;
        match wait_listening(&mut apiserver, port, deadline).await {
            Readiness::Ready => return Ok((apiserver, port)),
            Readiness::Exited(_) if attempt < PORT_ATTEMPTS && lost_port_race(apiserver.log()) => {
                continue;
            }
            Readiness::Exited(status) => {
                let detail = format!("exited ({status})");
                return Err(startup_error("kube-apiserver", &apiserver, detail));
            }
            Readiness::TimedOut => {
                let detail = "not listening in time".to_string();
                return Err(startup_error("kube-apiserver", &apiserver, detail));
            }
        }
    }
}

/// Starts a stopped server again with the same flags (so the same ports and data folder) and
/// waits until it listens on `port` (kube-apiserver) or `/health` is true (etcd at `port`).
pub(crate) async fn restart(
    stopped: &Supervised,
    port: u16,
    etcd: bool,
    deadline: Deadline,
) -> Result<Supervised, TestbedError> {
    let mut server = stopped.respawn()?;
    let readiness = if etcd {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_ready(&mut server, deadline, || etcd_healthy(addr)).await
    } else {
        wait_listening(&mut server, port, deadline).await
    };
    match readiness {
        Readiness::Ready => Ok(server),
        Readiness::Exited(status) => Err(startup_error(
            "a restarted server",
            &server,
            format!("{} exited ({status})", server.name()),
        )),
        Readiness::TimedOut => Err(startup_error(
            "a restarted server",
            &server,
            format!("{} not ready in time", server.name()),
        )),
    }
}

async fn wait_listening(server: &mut Supervised, port: u16, deadline: Deadline) -> Readiness {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listening = || async move { tokio::net::TcpStream::connect(addr).await.is_ok() };
    wait_ready(server, deadline, listening).await
}

/// Compacts etcd's history up to its current revision (physically, so it is done when this
/// returns) through etcd's JSON gateway; returns that revision. Watches that resume from an
/// older revision then get "compacted", which kube-apiserver answers with 410 Gone.
pub(crate) async fn compact_etcd(addr: SocketAddr) -> Result<i64, TestbedError> {
    let failed = |detail: String| TestbedError::Io {
        context: "compacting etcd".into(),
        source: std::io::Error::other(detail),
    };
    // Any key: the answer's header carries the store's current revision.
    let range = etcd_post(addr, "/v3/kv/range", r#"{"key":"AA=="}"#)
        .await
        .map_err(TestbedError::io("reading etcd's revision"))?;
    let value: serde_json::Value =
        serde_json::from_str(&range).map_err(|error| failed(format!("{error} in {range}")))?;
    let revision: i64 = value["header"]["revision"]
        .as_str()
        .and_then(|revision| revision.parse().ok())
        .ok_or_else(|| failed(format!("no revision in {range}")))?;
    let body = format!(r#"{{"revision":"{revision}","physical":true}}"#);
    let compacted = etcd_post(addr, "/v3/kv/compaction", &body)
        .await
        .map_err(TestbedError::io("compacting etcd"))?;
    if compacted.contains("\"error\"") || compacted.contains("\"code\"") {
        return Err(failed(compacted));
    }
    Ok(revision)
}

/// `POST path` with a JSON body over plain HTTP/1.0; returns the response body.
async fn etcd_post(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head
        .lines()
        .next()
        .is_some_and(|status| status.contains(" 200 "))
    {
        return Err(std::io::Error::other(response.clone()));
    }
    Ok(body.to_string())
}

/// Waits until `/readyz` answers and namespace `default` exists, failing early if the
/// server exits.
pub(crate) async fn wait_apiserver_ready(
    apiserver: &mut Supervised,
    client: &Client,
    deadline: Deadline,
) -> Result<(), TestbedError> {
    let ready = || async {
        let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
            return false;
        };
        if client.request_text(request).await.is_err() {
            return false;
        }
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(client.clone());
        matches!(namespaces.get_opt("default").await, Ok(Some(_)))
    };
    match wait_ready(apiserver, deadline, ready).await {
        Readiness::Ready => Ok(()),
        Readiness::Exited(status) => Err(startup_error(
            "kube-apiserver",
            apiserver,
            format!("exited ({status})"),
        )),
        Readiness::TimedOut => Err(startup_error(
            "kube-apiserver",
            apiserver,
            "/readyz or namespace default not ready in time".into(),
        )),
    }
}

/// Starts kube-controller-manager with the admin kubeconfig and waits until its
/// service-account controller has created `default/default` (proof that its controllers run).
pub(crate) async fn start_controller_manager(
    binary: &Path,
    dir: &Path,
    kubeconfig: &Path,
    pki: &Pki,
    client: &Client,
    deadline: Deadline,
) -> Result<Supervised, TestbedError> {
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        // One instance: no Lease to win, no start-up delay.
        "--leader-elect=false".to_string(),
        // Serve nothing: no port to pick, nothing listening beyond the two servers.
        "--secure-port=0".to_string(),
        format!("--root-ca-file={}", pki.ca_cert.display()),
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
    ];
    let log = dir.join("kube-controller-manager.log");
    let mut manager = Supervised::spawn("kube-controller-manager", binary, &args, log)?;
    let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(client.clone(), "default");
    let ready = || async { matches!(accounts.get_opt("default").await, Ok(Some(_))) };
    match wait_ready(&mut manager, deadline, ready).await {
        Readiness::Ready => Ok(manager),
        Readiness::Exited(status) => Err(startup_error(
            "kube-controller-manager",
            &manager,
            format!("exited ({status})"),
        )),
        Readiness::TimedOut => Err(startup_error(
            "kube-controller-manager",
            &manager,
            "no default ServiceAccount in time".into(),
        )),
    }
}

fn apiserver_args(
    dir: &Path,
    pki: &Pki,
    etcd_url: &str,
    port: u16,
    issuer_port: u16,
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        // Without it the server picks the default-route interface and fails on a machine
        // that has none.
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", dir.display()),
        format!("--tls-cert-file={}", path(&pki.serving_cert)),
        format!("--tls-private-key-file={}", path(&pki.serving_key)),
        format!("--client-ca-file={}", path(&pki.ca_cert)),
        "--authorization-mode=RBAC".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
        format!("--service-account-issuer=https://127.0.0.1:{issuer_port}/"),
        format!("--service-account-key-file={}", path(&pki.sa_public)),
        format!(
            "--service-account-signing-key-file={}",
            path(&pki.sa_private)
        ),
        // No controller-manager mints service-account tokens for pods.
        "--disable-admission-plugins=ServiceAccount".into(),
        "--allow-privileged=true".into(),
        // 127.0.0.1 is not a valid endpoint address for the `kubernetes` Service.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
    ]
}

/// Polls `probe` until it is true, the server exits, or the deadline passes.
async fn wait_ready<F, Fut>(server: &mut Supervised, deadline: Deadline, mut probe: F) -> Readiness
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if let Some(status) = server.exited() {
            return Readiness::Exited(status.to_string());
        }
        if probe_once(&mut probe).await {
            return Readiness::Ready;
        }
        if deadline.passed() {
            return Readiness::TimedOut;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `GET /health` over plain HTTP/1.0: etcd answers `{"health":"true",...}` when it can serve.
async fn etcd_healthy(addr: SocketAddr) -> bool {
    let check = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let status_ok = response
            .lines()
            .next()
            .is_some_and(|status| status.contains(" 200 "));
        std::io::Result::Ok(status_ok && response.contains(r#""health":"true""#))
    };
    check.await.unwrap_or(false)
}

fn startup_error(server: &'static str, process: &Supervised, detail: String) -> TestbedError {
    TestbedError::Startup {
        server,
        detail,
        log: process.log().to_path_buf(),
        tail: process.log_tail(ERROR_TAIL_LINES),
    }
}
