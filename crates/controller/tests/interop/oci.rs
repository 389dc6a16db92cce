//! The image scripts/image.sh builds (an OCI image layout), unpacked with umoci into a root
//! filesystem, and containers run from it with runc as a container runtime would: the image
//! config's user, entrypoint and environment, a read-only root, no capabilities, its own pid,
//! mount, ipc and uts namespaces, and the host's network namespace (so it reaches the testbed on
//! 127.0.0.1). The spec carries no `rlimits`: the sandboxes these tests run in refuse setrlimit to
//! containers.
//!
//! ```text
//!  target/image/oci ──umoci unpack──► rootfs (shared, read-only in each container)
//!  image config (User, Entrypoint, Env) ──► config.json per container ──runc run──► process
//! ```

use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// Where the kubeconfig folder is mounted in the containers.
pub const CONFIG_MOUNT: &str = "/etc/external-endpoints";

/// The built image: its layout, manifest and config.
pub struct Image {
    pub layout: PathBuf,
    /// The ref name in the layout's index (the tag scripts/image.sh gave).
    pub reference: String,
    /// The image config's `config` object (User, Entrypoint, Env, Labels, ExposedPorts).
    pub config: Value,
    /// The files scripts/image-rootfs.sh staged (the script's `files.txt`).
    pub staged_files: Vec<String>,
}

/// One container: `runc run` in the foreground, its stderr (the controller's log) in a file.
pub struct Container {
    pub id: String,
    state: PathBuf,
    log: PathBuf,
    child: Child,
}

// === impl Image ===

impl Image {
    /// The folder scripts/image.sh writes to: `IMAGE_OUT`, else the workspace's `target/image`.
    pub fn out_dir() -> PathBuf {
        std::env::var_os("IMAGE_OUT").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/image"),
            PathBuf::from,
        )
    }

    /// Reads the image from [`Image::out_dir`]; `None` when it has not been built.
    pub fn find() -> Option<Image> {
        let out = Self::out_dir();
        let layout = out.join("oci");
        let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).ok()?)
            .expect("index.json");
        let manifests = index["manifests"].as_array().expect("manifests");
        assert_eq!(manifests.len(), 1, "one image in {}", layout.display());
        let reference = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .expect("a ref name")
            .to_string();
        let manifest = read_blob(&layout, &manifests[0]["digest"]);
        let config = read_blob(&layout, &manifest["config"]["digest"]);
        let staged_files = std::fs::read_to_string(out.join("files.txt"))
            .expect("files.txt beside the layout")
            .lines()
            .map(str::to_string)
            .collect();
        Some(Image {
            layout,
            reference,
            config: config["config"].clone(),
            staged_files,
        })
    }

    /// The image's `User` as uid and gid (`65532:65532`).
    pub fn user(&self) -> (u32, u32) {
        let user = self.config["User"].as_str().expect("a User");
        let (uid, gid) = user.split_once(':').expect("uid:gid, numeric");
        (uid.parse().unwrap(), gid.parse().unwrap())
    }

    /// The image's `Entrypoint` followed by its `Cmd`.
    pub fn command(&self) -> Vec<String> {
        ["Entrypoint", "Cmd"]
            .iter()
            .filter_map(|field| self.config[field].as_array())
            .flatten()
            .map(|arg| arg.as_str().unwrap().to_string())
            .collect()
    }

    /// The image's labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.config["Labels"]
            .as_object()
            .map(|labels| {
                labels
                    .iter()
                    .map(|(key, value)| (key.clone(), value.as_str().unwrap().to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Unpacks the image's layers into `bundle/rootfs` with umoci (as root: files keep the
    /// image's owners); returns the root filesystem's path.
    pub fn unpack(&self, bundle: &Path) -> PathBuf {
        let source = format!("{}:{}", self.layout.display(), self.reference);
        let output = std::process::Command::new("umoci")
            .args(["unpack", "--image", &source])
            .arg(bundle)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "umoci unpack: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        bundle.join("rootfs")
    }

    /// The OCI runtime spec of a container of this image: the image's user, command and
    /// environment (plus `args` and `env`), the root filesystem read-only, `config_dir` mounted
    /// read-only at [`CONFIG_MOUNT`], no capabilities, no new privileges, no rlimits, and no
    /// network namespace of its own.
    pub fn runtime_spec(
        &self,
        rootfs: &Path,
        hostname: &str,
        config_dir: &Path,
        args: &[String],
        env: &[String],
    ) -> Value {
        let (uid, gid) = self.user();
        let mut process_args = self.command();
        process_args.extend(args.iter().cloned());
        let mut process_env: Vec<String> = self.config["Env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| entry.as_str().unwrap().to_string())
            .collect();
        process_env.extend(env.iter().cloned());
        let cwd = self.config["WorkingDir"]
            .as_str()
            .filter(|dir| !dir.is_empty())
            .unwrap_or("/");
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": uid, "gid": gid, "additionalGids": []},
                "args": process_args,
                "env": process_env,
                "cwd": cwd,
                "capabilities": {
                    "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
                },
                "noNewPrivileges": true
            },
            "root": {"path": rootfs, "readonly": true},
            "hostname": hostname,
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {
                    "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]
                },
                {
                    "destination": CONFIG_MOUNT, "type": "bind", "source": config_dir,
                    "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]
                }
            ],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
                "maskedPaths": [
                    "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                    "/sys/firmware"
                ],
                "readonlyPaths": [
                    "/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                    "/proc/sysrq-trigger"
                ]
            }
        })
    }
}

fn read_blob(layout: &Path, digest: &Value) -> Value {
    let digest = digest.as_str().expect("a digest");
    let (algorithm, hex) = digest.split_once(':').expect("algorithm:hex");
    let path = layout.join("blobs").join(algorithm).join(hex);
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

// === impl Container ===

impl Container {
    /// Writes `spec` as the bundle's config.json in `dir/<id>` and starts `runc run` on it, with
    /// runc's state under `dir/state`.
    pub fn run(dir: &Path, id: &str, spec: &Value) -> Container {
        let bundle = dir.join(id);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(spec).unwrap(),
        )
        .unwrap();
        let state = dir.join("state");
        let log = dir.join(format!("{id}.log"));
        let child = Command::new("runc")
            .arg("--root")
            .arg(&state)
            .arg("run")
            .arg("--bundle")
            .arg(&bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Container {
            id: id.to_string(),
            state,
            log,
            child,
        }
    }

    /// The container's log (the controller's stderr, and runc's own errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `runc state`: the container's status and its init process (the controller) as seen
    /// from the host.
    pub fn state(&self) -> Result<(String, u32), String> {
        let output = self.runc(&["state", &self.id])?;
        let state: Value = serde_json::from_str(&output).map_err(|e| e.to_string())?;
        let status = state["status"].as_str().unwrap_or_default().to_string();
        let pid = state["pid"].as_u64().unwrap_or_default() as u32;
        Ok((status, pid))
    }

    /// `runc kill <id> <signal>`, as the kubelet's runtime does to stop a container.
    pub fn signal(&self, signal: &str) {
        if let Err(error) = self.runc(&["kill", &self.id, signal]) {
            panic!("runc kill {signal}: {error}; log:\n{}", self.log());
        }
    }

    /// Waits for `runc run` to return: the controller's exit status.
    pub async fn wait_exit(&mut self, timeout: std::time::Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!("{} did not exit; log:\n{}", self.id, self.log()),
        }
    }

    fn runc(&self, args: &[&str]) -> Result<String, String> {
        let output = std::process::Command::new("runc")
            .arg("--root")
            .arg(&self.state)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }
}

impl Drop for Container {
    /// A container left running by a failed test is killed and deleted (killing `runc run`
    /// alone would leave it running).
    fn drop(&mut self) {
        let _ = self.runc(&["delete", "--force", &self.id]);
        if std::thread::panicking() {
            eprintln!("--- container {} ---\n{}", self.id, self.log());
        }
    }
}

/// Whether this process can run containers: root, with runc and umoci on the PATH.
pub fn missing_runtime() -> Option<String> {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"));
    if !root {
        return Some("runc needs root".to_string());
    }
    for tool in ["runc", "umoci"] {
        let found = std::process::Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            return Some(format!("{tool} is not installed (apt-get install {tool})"));
        }
    }
    None
}

/// A folder readable by the container's user (tempdirs are 0700).
pub fn open_dir(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
