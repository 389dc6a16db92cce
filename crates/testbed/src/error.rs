//! The one error type of the testbed.

use std::path::PathBuf;
use std::time::Duration;

/// Why the control plane could not be started or used.
///
/// None of these is worth retrying inside a test: start-up already retries port races, and
/// every other failure needs a person to look at the message (and the log tail it carries).
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// The etcd or kube-apiserver binary was not found. Not retryable: build them with
    /// `bash testbed/build.sh` (or point the `TEST_ASSET_*` / `KUBEBUILDER_ASSETS` variables
    /// at existing binaries).
    #[error(
        "control plane binaries not found: {detail}. Build them with `bash testbed/build.sh` \
         (cached in {cache}), or set TEST_ASSET_KUBE_APISERVER and TEST_ASSET_ETCD, or \
         KUBEBUILDER_ASSETS"
    )]
    MissingBinaries {
        /// What was looked for, and where.
        detail: String,
        /// The cache folder `testbed/build.sh` writes to for the pinned versions.
        cache: PathBuf,
    },

    /// A file or process operation failed. Not retryable.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Generating the certificates failed. Not retryable.
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),

    /// A server exited or never became ready. Not retryable (port races are already retried).
    #[error("{server} did not start: {detail}\n--- {server} log tail ({log}) ---\n{tail}")]
    Startup {
        /// `etcd` or `kube-apiserver`.
        server: &'static str,
        /// What went wrong.
        detail: String,
        /// The server's log file.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },

    /// A call to the API server failed. Not retryable here.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },

    /// The generated kubeconfig could not be loaded. Not retryable (a bug of the testbed).
    #[error("loading the testbed kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),

    /// A CRD manifest could not be read or is not a CRD. Not retryable: fix the file.
    #[error("CRD manifest {path}: {detail}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },

    /// A condition did not come true in time. Not retryable here.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
    },

    /// The shared control plane of this test binary failed to start earlier; every later
    /// test gets the same message instead of another slow attempt. Not retryable.
    #[error("the shared testbed failed to start: {0}")]
    SharedStartFailed(String),
}

impl TestbedError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}
