//! What the example tests share: the namespace they run in ([`World`]), running an example's
//! binary as a replica and reading its output lines.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // tests fail loudly by design

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{Arc, OnceLock},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use parking_lot::Mutex;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    time::Instant,
};

/// How long a test waits for a condition before failing.
pub const WAIT: Duration = Duration::from_secs(60);

/// Short lease timings, so that a crash is taken over in seconds.
pub const TIMINGS: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "1s",
];

/// One fresh namespace of the testbed holding the Lease and the ConfigMaps, with a label key of
/// its own.
pub struct World {
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub namespace: String,
    /// `<prefix>/<namespace>`: unique to the test.
    pub label: String,
}

// === impl World ===

impl World {
    /// A fresh namespace named after `test`, its label key under `prefix`.
    pub async fn create(testbed: &testbed::Testbed, test: &str, prefix: &str) -> Self {
        let client = testbed.client().await.unwrap();
        let namespace = testbed.fresh_namespace(test).await.unwrap();
        Self {
            client,
            kubeconfig: testbed.kubeconfig_path().to_path_buf(),
            label: format!("{prefix}/{namespace}"),
            namespace,
        }
    }

    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates ConfigMap `name` with `labels` (no labels at all when empty).
    pub async fn create_config_map_labelled(&self, name: &str, labels: &[(&str, &str)]) {
        let labels = (!labels.is_empty()).then(|| {
            (labels.iter())
                .map(|(key, value)| ((*key).to_string(), (*value).to_string()))
                .collect()
        });
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels,
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        self.config_maps()
            .create(&PostParams::default(), &config_map)
            .await
            .unwrap();
    }

    /// Starts the example `example` as the replica `identity`, with this namespace's kubeconfig
    /// and `args`.
    pub fn start_example(&self, example: &str, identity: &str, args: &[&str]) -> Replica {
        let mut all: Vec<&OsStr> = vec!["--kubeconfig".as_ref(), self.kubeconfig.as_ref()];
        all.extend(args.iter().map(OsStr::new));
        Replica::spawn(identity, &example_binary(example), &all)
    }
}

/// Runs `check` every 100 ms until it gives a value, and returns that; fails after [`WAIT`]
/// with `failure` and the transcript of `replicas`.
pub async fn wait_for_value<T, Fut>(
    failure: &str,
    replicas: &[&Replica],
    mut check: impl FnMut() -> Fut,
) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{failure}\n{}",
            transcript(replicas)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One process of the example, its output lines collected as they come.
pub struct Replica {
    pub identity: String,
    pub child: Child,
    pid: u32,
    lines: Arc<Mutex<Vec<String>>>,
}

// === impl Replica ===

impl Replica {
    /// Starts `binary` with `args` as the replica `identity`, collecting its output lines.
    pub fn spawn(identity: &str, binary: &Path, args: &[&OsStr]) -> Self {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let collected = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                collected.lock().push(line);
            }
        });
        Self {
            identity: identity.to_string(),
            child,
            pid,
            lines,
        }
    }

    /// The lines printed so far, without their timestamps.
    pub fn lines(&self) -> Vec<String> {
        self.timed_lines()
            .into_iter()
            .map(|(_, line)| line)
            .collect()
    }

    /// The lines printed so far with their wall-clock time (ms since the epoch).
    pub fn timed_lines(&self) -> Vec<(u128, String)> {
        let lines = self.lines.lock();
        lines
            .iter()
            .map(|line| match line.split_once(' ') {
                Some((millis, text)) => (millis.parse().unwrap_or(0), text.to_string()),
                None => (0, line.clone()),
            })
            .collect()
    }

    /// How many lines so far start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        let lines = self.lines();
        lines.iter().filter(|line| line.starts_with(prefix)).count()
    }

    /// Waits until at least `n` lines start with `prefix`; returns the time of the `n`th.
    pub async fn wait_for(&self, n: usize, prefix: &str, others: &[&Replica]) -> u128 {
        let deadline = Instant::now() + WAIT;
        loop {
            let found: Vec<u128> = self
                .timed_lines()
                .into_iter()
                .filter(|(_, line)| line.starts_with(prefix))
                .map(|(at, _)| at)
                .collect();
            if let Some(at) = found.get(n - 1) {
                return *at;
            }
            let mut everyone = vec![self];
            everyone.extend_from_slice(others);
            assert!(
                Instant::now() < deadline,
                "{} never printed {n} × {prefix:?}\n{}",
                self.identity,
                transcript(&everyone)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `signal` (`TERM`, `KILL`, `STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Waits for the process to exit.
    pub async fn exited(&mut self) -> ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit", self.identity))
            .unwrap()
    }
}

/// Every replica's lines, for failure messages and `--nocapture` runs.
pub fn transcript(replicas: &[&Replica]) -> String {
    replicas
        .iter()
        .map(|replica| {
            format!(
                "--- {} ---\n{}\n",
                replica.identity,
                replica.lines().join("\n")
            )
        })
        .collect()
}

/// The example binary, built next to this test's own binary (`<target>/<profile>/examples`).
/// `cargo test -p leadership --test example` does not build examples, so this asks cargo to
/// (a no-op when it is up to date).
pub fn example_binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    let mut built = built.lock();
    built
        .entry(name.to_string())
        .or_insert_with(|| {
            let exe = std::env::current_exe().unwrap();
            let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let target_dir = profile_dir.parent().unwrap();
            let mut build = std::process::Command::new(env!("CARGO"));
            build
                .args(["build", "--quiet", "-p", "leadership", "--example", name])
                .env("CARGO_TARGET_DIR", target_dir)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            // Cargo gives this test its package's variables (CARGO_MANIFEST_DIR, ...); some
            // build scripts (ring's) rerun when they change, which would make this build and
            // the next `cargo test` rebuild the TLS stack in turn.
            for (name, _) in std::env::vars_os() {
                let name = name.to_string_lossy();
                let set_for_tests = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_EXE_"]
                    .iter()
                    .any(|prefix| name.starts_with(prefix))
                    || [
                        "CARGO_CRATE_NAME",
                        "CARGO_PRIMARY_PACKAGE",
                        "CARGO_TARGET_TMPDIR",
                    ]
                    .contains(&name.as_ref());
                if set_for_tests {
                    build.env_remove(name.as_ref());
                }
            }
            if profile_dir
                .file_name()
                .is_some_and(|name| name == "release")
            {
                build.arg("--release");
            }
            let status = build.status().unwrap();
            assert!(status.success(), "building the example failed");
            profile_dir.join("examples").join(name)
        })
        .clone()
}
