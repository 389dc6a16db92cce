//! Finding the control plane binaries.
//!
//! Order, as controller-runtime's envtest does it: `TEST_ASSET_KUBE_APISERVER` and
//! `TEST_ASSET_ETCD` (one file each), then `KUBEBUILDER_ASSETS` (a folder holding both), then
//! the cache folder `testbed/build.sh` fills for the versions pinned in `testbed/versions.env`.

use std::path::{Path, PathBuf};

use crate::TestbedError;

/// `testbed/versions.env`, the single place the versions are pinned (build.sh sources it).
const VERSIONS_ENV: &str = include_str!("../../../testbed/versions.env");

/// Variable overriding the root of the build cache (same name as in `testbed/build.sh`).
pub const CACHE_ENV: &str = "EXTERNAL_ENDPOINTS_TESTBED_CACHE";

/// The control plane versions pinned in `testbed/versions.env`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The `k8s.io/kubernetes` release, e.g. `v1.37.2`.
    pub kubernetes: String,
    /// The `go.etcd.io/etcd/server/v3` release, e.g. `v3.6.16`.
    pub etcd: String,
}

/// Paths of the binaries the testbed runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kubectl`, when one was built next to the servers (or `TEST_ASSET_KUBECTL` names one).
    pub kubectl: Option<PathBuf>,
    /// `kube-controller-manager`, when one was built next to the servers (`TESTBED_BUILD_KCM=1
    /// testbed/build.sh`) or `TEST_ASSET_KUBE_CONTROLLER_MANAGER` names one.
    pub kube_controller_manager: Option<PathBuf>,
    /// `contender`, the client-go leader election contender built from `testbed/contender`
    /// next to the servers, or the file `TEST_ASSET_CONTENDER` names.
    pub contender: Option<PathBuf>,
}

// === impl Versions ===

impl Versions {
    /// The versions pinned in `testbed/versions.env`.
    pub fn pinned() -> Self {
        Self::parse(VERSIONS_ENV)
    }

    fn parse(text: &str) -> Self {
        let value = |key: &str| {
            text.lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .filter_map(|line| line.trim().split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        Self {
            kubernetes: value("K8S_VERSION"),
            etcd: value("ETCD_VERSION"),
        }
    }

    /// The folder `testbed/build.sh` writes these versions' binaries to:
    /// `${EXTERNAL_ENDPOINTS_TESTBED_CACHE:-$HOME/.cache/external-endpoints/testbed}/<k8s>-etcd<etcd>`.
    pub fn cache_dir(&self) -> PathBuf {
        let root = match std::env::var_os(CACHE_ENV) {
            Some(root) if !root.is_empty() => PathBuf::from(root),
            _ => std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir)
                .join(".cache/external-endpoints/testbed"),
        };
        let strip = |v: &str| v.trim_start_matches('v').to_string();
        root.join(format!(
            "{}-etcd{}",
            strip(&self.kubernetes),
            strip(&self.etcd)
        ))
    }
}

// === impl Binaries ===

impl Binaries {
    /// Finds the binaries, or says where they were looked for.
    pub fn discover() -> Result<Self, TestbedError> {
        let cache = Versions::pinned().cache_dir();
        let env_file = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let assets = env_file("KUBEBUILDER_ASSETS");

        let find = |env: &str, file: &str| -> Result<PathBuf, TestbedError> {
            let (path, source) = if let Some(path) = env_file(env) {
                (path, env.to_string())
            } else if let Some(dir) = &assets {
                (dir.join(file), "KUBEBUILDER_ASSETS".to_string())
            } else {
                (cache.join(file), "the testbed/build.sh cache".to_string())
            };
            if is_executable(&path) {
                Ok(path)
            } else {
                Err(TestbedError::MissingBinaries {
                    detail: format!("no executable {file} at {} (from {source})", path.display()),
                    cache: cache.clone(),
                })
            }
        };

        let kube_apiserver = find("TEST_ASSET_KUBE_APISERVER", "kube-apiserver")?;
        let etcd = find("TEST_ASSET_ETCD", "etcd")?;
        // Optional tools: also looked for beside kube-apiserver.
        let optional = |env: &str, file: &str| {
            find(env, file).ok().or_else(|| {
                let beside = kube_apiserver.parent()?.join(file);
                is_executable(&beside).then_some(beside)
            })
        };
        let kubectl = optional("TEST_ASSET_KUBECTL", "kubectl");
        let kube_controller_manager = optional(
            "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
            "kube-controller-manager",
        );
        let contender = optional("TEST_ASSET_CONTENDER", "contender");
        Ok(Self {
            kube_apiserver,
            etcd,
            kubectl,
            kube_controller_manager,
            contender,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pinned_versions_are_read_from_versions_env() {
        let versions = Versions::pinned();
        assert!(versions.kubernetes.starts_with("v1.37."), "{versions:?}");
        assert!(versions.etcd.starts_with("v3.6."), "{versions:?}");
    }

    #[test]
    fn parse_ignores_comments_and_blank_lines() {
        let versions = Versions::parse("# c\n\nK8S_VERSION=v1.2.3\n ETCD_VERSION = v3.4.5 \n");
        assert_eq!(
            versions,
            Versions {
                kubernetes: "v1.2.3".into(),
                etcd: "v3.4.5".into()
            }
        );
    }
}
