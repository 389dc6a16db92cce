//! A real control plane for tests: kube-apiserver backed by etcd, on 127.0.0.1.
//!
//! ```text
//!  testbed/build.sh ──► ~/.cache/external-endpoints/testbed/<k8s>-etcd<etcd>/{etcd,kube-apiserver}
//!                                   │ (or TEST_ASSET_* / KUBEBUILDER_ASSETS)
//!  Testbed::start ── certs (rcgen) ─┤
//!        │          etcd ◄── kube-apiserver (https, client-cert auth) ◄── kube::Client / kubectl
//!        └── installs every CRD in deploy/crds/ and waits until each version is served
//! ```
//!
//! Guarantees:
//! - one control plane per test binary through [`Testbed::shared`], started on first use and
//!   shared by all its tests, whatever runtime each test runs on: the testbed holds no
//!   runtime-bound state, and [`Testbed::client`] makes a fresh client on the caller's runtime;
//! - the servers and the temporary folder never outlive the test binary, however it ends
//!   (see `process.rs`);
//! - every listener is on 127.0.0.1, on ports picked at start-up (port races are retried);
//! - the admin identity is `system:masters`: RBAC never gets in a test's way; so is every user
//!   of [`Testbed::kubeconfig_for`] (one client certificate each, so the audit log can tell
//!   them apart);
//! - with [`Options::audit_log`], every API server records who created, changed or deleted an
//!   EndpointSlice ([`Testbed::audit_events`]), and nothing else;
//! - by default there is no kube-controller-manager: no garbage collection and namespaces
//!   never finish deleting, so tests each take a [`Testbed::fresh_namespace`] and never wait
//!   for cascades. [`Options::controller_manager`] (or `TESTBED_CONTROLLER_MANAGER=1`) adds
//!   it, with upstream's EndpointSlice controller, as in a real cluster.
//!
//! Integration tests start with [`require!`], which skips (one line on stderr) when the
//! binaries have not been built, except under `CI=true` where a missing binary fails the test:
//!
//! ```no_run
//! # async fn example() -> Result<(), testbed::TestbedError> {
//! let testbed = testbed::require!(Ok(()));
//! let _logs = testbed.log_guard(); // prints the servers' log tails if the test panics
//! let client = testbed.client().await?;
//! let namespace = testbed.fresh_namespace("my-test").await?;
//! # let _ = (client, namespace);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod assets;
mod audit;
mod certs;
mod coordinated;
mod crds;
mod error;
mod kubeconfig;
mod lifecycle;
mod process;
mod servers;
mod users;
mod wait;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub use crate::assets::{Binaries, CACHE_ENV, Versions};
pub use crate::audit::AuditEvent;
pub use crate::coordinated::COORDINATED_LEADER_ELECTION_ARGS;
pub use crate::error::TestbedError;
use crate::kubeconfig::write_kubeconfig;
use crate::lifecycle::server_name;
use crate::process::Supervised;
pub use crate::servers::SERVICE_CIDRS;
use crate::wait::Deadline;

/// Default start-up budget; loaded 2-core machines need well over a minute.
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(180);

/// Variable overriding the start-up budget, in seconds.
pub const START_TIMEOUT_ENV: &str = "TESTBED_START_TIMEOUT_SECS";

/// Variable turning on [`Options::controller_manager`] by default.
pub const CONTROLLER_MANAGER_ENV: &str = "TESTBED_CONTROLLER_MANAGER";

/// Lines per server printed by [`LogGuard`].
const GUARD_TAIL_LINES: usize = 60;

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Folders whose `*.yaml` / `*.yml` CRDs are installed; missing folders are skipped.
    pub crd_dirs: Vec<PathBuf>,
    /// Budget for the whole start-up, CRDs included.
    pub start_timeout: Duration,
    /// Also run kube-controller-manager (garbage collection, namespace deletion, upstream's
    /// EndpointSlice controller, service-account tokens). Default: the
    /// `TESTBED_CONTROLLER_MANAGER` variable (`1`/`true`), else off.
    pub controller_manager: bool,
    /// Flags appended to every kube-apiserver's defaults (e.g. `--watch-cache=false`).
    pub apiserver_args: Vec<String>,
    /// Every kube-apiserver keeps an audit log of EndpointSlice writes (creates, updates,
    /// patches, deletes; nothing else), read with [`Testbed::audit_events`]. Default off.
    pub audit_log: bool,
}

/// A server of the control plane, for the tests that stop and restart it
/// ([`Testbed::kill`], [`Testbed::stop`], [`Testbed::restart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// The one etcd.
    Etcd,
    /// A kube-apiserver: 0 is the one started with the testbed, the others come from
    /// [`Testbed::add_apiserver`] in order.
    ApiServer(usize),
}

/// A running etcd + kube-apiserver. Dropping it stops both and removes its folder.
///
/// The servers can be killed, stopped and restarted on the same ports and data folder
/// ([`Testbed::kill`], [`Testbed::restart`]), and more API servers added on the same etcd
/// ([`Testbed::add_apiserver`]); the tests that do so start a control plane of their own
/// ([`Testbed::start`]) so that no other test shares the outage. These calls are not meant to
/// run concurrently on one server.
#[derive(Debug)]
pub struct Testbed {
    dir: PathBuf,
    kubeconfig: PathBuf,
    config: Config,
    server: String,
    etcd_url: String,
    binaries: Binaries,
    pki: certs::Pki,
    apiserver_args: Vec<String>,
    /// Whether each API server keeps an audit log ([`Options::audit_log`]).
    audit_log: bool,
    /// The API servers' ports, by [`Server::ApiServer`] index.
    apiserver_ports: parking_lot::Mutex<Vec<u16>>,
    logs: parking_lot::Mutex<Vec<(String, PathBuf)>>,
    /// In start order (etcd, kube-apiserver, kube-controller-manager, added API servers);
    /// stopped in reverse order, janitor last. A server being restarted is briefly out of it.
    servers: parking_lot::Mutex<Vec<Supervised>>,
    janitor: Option<Supervised>,
}

/// Prints the servers' log tails to stderr when dropped during a panic (a failing test).
#[must_use = "the guard prints only while it is alive"]
#[derive(Debug)]
pub struct LogGuard<'a> {
    testbed: &'a Testbed,
}

/// Returns early from the calling test when the control plane binaries are missing (after
/// one line on stderr), panics with a clear message when they are missing under `CI=true` or
/// start-up fails, and otherwise evaluates to the shared `&'static Testbed`.
///
/// `require!()` returns `()`; `require!(value)` returns `value` (e.g. `require!(Ok(()))` in
/// a test returning `Result`). Must be used inside an `async` test.
#[macro_export]
macro_rules! require {
    () => {
        $crate::require!(())
    };
    ($skip:expr) => {
        match $crate::Testbed::shared_or_skip().await {
            ::std::result::Result::Ok(::std::option::Option::Some(testbed)) => testbed,
            ::std::result::Result::Ok(::std::option::Option::None) => return $skip,
            ::std::result::Result::Err(error) => ::std::panic!("testbed: {error}"),
        }
    };
}

/// The repository's `deploy/crds/` folder.
pub fn default_crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

/// Whether the `CI` variable says we run in continuous integration (`true`, `1`, ...).
pub fn running_in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| {
        let value = value.trim().to_ascii_lowercase();
        !value.is_empty() && value != "false" && value != "0"
    })
}

// === impl Options ===

impl Default for Options {
    fn default() -> Self {
        let start_timeout = std::env::var(START_TIMEOUT_ENV)
            .ok()
            .and_then(|secs| secs.trim().parse().ok())
            .map_or(DEFAULT_START_TIMEOUT, Duration::from_secs);
        let controller_manager = std::env::var(CONTROLLER_MANAGER_ENV)
            .is_ok_and(|value| matches!(value.trim(), "1" | "true" | "yes"));
        Self {
            crd_dirs: vec![default_crd_dir()],
            start_timeout,
            controller_manager,
            apiserver_args: Vec::new(),
            audit_log: false,
        }
    }
}

// === impl Testbed ===

static SHARED: tokio::sync::OnceCell<Result<Testbed, String>> = tokio::sync::OnceCell::const_new();
static SKIP_NOTICE: std::sync::Once = std::sync::Once::new();

impl Testbed {
    /// The control plane of this test binary, started with [`Options::default`] on first use.
    /// A failed start is remembered: later calls fail at once with the same message.
    pub async fn shared() -> Result<&'static Testbed, TestbedError> {
        let started = SHARED
            .get_or_init(|| async {
                Testbed::start(Options::default())
                    .await
                    .map_err(|error| error.to_string())
            })
            .await;
        started
            .as_ref()
            .map_err(|message| TestbedError::SharedStartFailed(message.clone()))
    }

    /// Like [`Testbed::shared`], but `Ok(None)` when the binaries are missing and we are not
    /// in CI (printing one notice per test binary). See [`require!`].
    pub async fn shared_or_skip() -> Result<Option<&'static Testbed>, TestbedError> {
        match Binaries::discover() {
            Ok(_) => Self::shared().await.map(Some),
            Err(TestbedError::MissingBinaries { detail, .. }) if !running_in_ci() => {
                SKIP_NOTICE.call_once(|| {
                    // Straight to the stderr handle: libtest captures `eprintln!`, and a skip
                    // must be visible in a passing run.
                    let _ = writeln!(
                        std::io::stderr(),
                        "integration tests skipped: run `bash testbed/build.sh` ({detail})"
                    );
                });
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Starts a new control plane owned by the caller.
    pub async fn start(options: Options) -> Result<Self, TestbedError> {
        #[allow(clippy::disallowed_types)] // wall-clock measurement of real processes
        let started_at = std::time::Instant::now();
        let deadline = Deadline::after(options.start_timeout);
        let binaries = Binaries::discover()?;
        let controller_manager = match (
            &binaries.kube_controller_manager,
            options.controller_manager,
        ) {
            (Some(path), true) => Some(path.clone()),
            (None, true) => {
                return Err(TestbedError::MissingBinaries {
                    detail: "kube-controller-manager was asked for; build it with \
                             `TESTBED_BUILD_KCM=1 bash testbed/build.sh`"
                        .into(),
                    cache: Versions::pinned().cache_dir(),
                });
            }
            (_, false) => None,
        };
        let crds = crds::read_crds(&options.crd_dirs)?;

        let dir = tempfile::Builder::new()
            .prefix("external-endpoints-testbed-")
            .tempdir()
            .map_err(TestbedError::io("creating the testbed folder"))?
            .keep();
        // From here on `testbed` owns everything: an early return drops it, which stops
        // whatever has started and removes the folder.
        let janitor = Some(Supervised::janitor(&dir)?);
        let pki = certs::write_pki(&dir)?;
        if options.audit_log {
            audit::write_policy(&dir)?;
        }
        let mut testbed = Testbed {
            janitor,
            kubeconfig: dir.join("kubeconfig"),
            dir,
            config: Config::new(http::Uri::from_static("https://127.0.0.1")),
            server: String::new(),
            etcd_url: String::new(),
            binaries,
            pki,
            apiserver_args: options.apiserver_args.clone(),
            audit_log: options.audit_log,
            apiserver_ports: parking_lot::Mutex::default(),
            logs: parking_lot::Mutex::default(),
            servers: parking_lot::Mutex::default(),
        };

        let (etcd, etcd_url) =
            servers::start_etcd(&testbed.binaries.etcd, &testbed.dir, deadline).await?;
        testbed.add_server(etcd);
        testbed.etcd_url = etcd_url;

        let (apiserver, port) =
            servers::start_apiserver(&testbed.apiserver_spec("kube-apiserver", None), deadline)
                .await?;
        testbed.add_server(apiserver);
        testbed.apiserver_ports.lock().push(port);
        testbed.server = format!("https://127.0.0.1:{port}");

        let admin = (
            testbed.pki.admin_cert.as_path(),
            testbed.pki.admin_key.as_path(),
        );
        write_kubeconfig(&testbed.kubeconfig, &testbed.server, &testbed.pki, admin)?;
        let kubeconfig = Kubeconfig::read_from(&testbed.kubeconfig)?;
        testbed.config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let client = testbed.client().await?;
        testbed
            .wait_ready(Server::ApiServer(0), &client, deadline)
            .await?;
        crds::install(&client, &crds, deadline).await?;

        if let Some(binary) = controller_manager {
            let manager = servers::start_controller_manager(
                &binary,
                &testbed.dir,
                &testbed.kubeconfig,
                &testbed.pki,
                &client,
                deadline,
            )
            .await?;
            testbed.add_server(manager);
        }

        let _ = writeln!(
            std::io::stderr(),
            "testbed: control plane ready in {:.1}s at {} (kubeconfig {}, {} CRDs)",
            started_at.elapsed().as_secs_f64(),
            testbed.server,
            testbed.kubeconfig.display(),
            crds.len(),
        );
        Ok(testbed)
    }

    /// A new client for the admin user, bound to the caller's tokio runtime (a client must not
    /// outlive the runtime that made it, so tests each make their own).
    pub async fn client(&self) -> Result<Client, TestbedError> {
        Client::try_from(self.config.clone()).map_err(TestbedError::kube("building a client"))
    }

    /// The admin client configuration, for callers that tune it before building a client.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// A kubeconfig for the admin user (absolute paths to PEM files), usable by kubectl and
    /// by controller processes started from tests.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The etcd client URL, `http://127.0.0.1:<port>`.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The process id of `server` (for its CPU time in `/proc`), while it runs.
    pub fn pid(&self, server: Server) -> Option<u32> {
        let name = server_name(server);
        self.servers
            .lock()
            .iter_mut()
            .find(|process| process.name() == name)
            .and_then(|process| process.pid())
    }

    /// Whether kube-controller-manager runs (see [`Options::controller_manager`]).
    pub fn has_controller_manager(&self) -> bool {
        self.logs
            .lock()
            .iter()
            .any(|(server, _)| server == "kube-controller-manager")
    }

    /// The binaries this control plane runs, and kubectl if one was found.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// Creates a namespace named `<prefix>-<random>` and returns its name. The prefix is
    /// lower-cased and reduced to what a namespace name allows (test function names work).
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<String, TestbedError> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", namespace_prefix(prefix))),
                labels: Some([("external-endpoints.testbed/fresh".into(), "true".into())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let api: Api<Namespace> = Api::all(self.client().await?);
        let created = api
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(TestbedError::kube(format!(
                "creating a namespace for {prefix}"
            )))?;
        Ok(created.metadata.name.unwrap_or_default())
    }

    /// The last `lines` lines of each server's log, with headers.
    pub fn log_tail(&self, lines: usize) -> String {
        self.logs
            .lock()
            .iter()
            .map(|(server, path)| {
                format!(
                    "--- {server} ({}) ---\n{}\n",
                    path.display(),
                    process::tail(path, lines)
                )
            })
            .collect()
    }

    /// A guard that prints [`Testbed::log_tail`] if the test panics while it is alive.
    pub fn log_guard(&self) -> LogGuard<'_> {
        LogGuard { testbed: self }
    }

    /// The URL of API server `index` (0: [`Testbed::server_url`]; then the added ones).
    pub fn apiserver_url(&self, index: usize) -> Option<String> {
        let port = *self.apiserver_ports.lock().get(index)?;
        Some(format!("https://127.0.0.1:{port}"))
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        while let Some(mut server) = self.servers.get_mut().pop() {
            server.stop();
        }
        if let Some(mut janitor) = self.janitor.take() {
            janitor.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// === impl LogGuard ===

impl Drop for LogGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "testbed: control plane logs at the failure:\n{}",
                self.testbed.log_tail(GUARD_TAIL_LINES)
            );
        }
    }
}

// === helpers ===

fn namespace_prefix(prefix: &str) -> String {
    let mut name: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    // Room for the 5 random characters generateName adds (63 at most in all).
    name.truncate(50);
    let name = name.trim_matches('-');
    if name.is_empty() {
        "test".to_string()
    } else {
        name.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn namespace_prefixes_are_valid_names() {
        assert_eq!(namespace_prefix("slice_is_Created"), "slice-is-created");
        assert_eq!(namespace_prefix("__"), "test");
        assert_eq!(namespace_prefix(&"a".repeat(80)).len(), 50);
    }
}
