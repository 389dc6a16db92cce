//! Two replicas of the example controller (`examples/namespace_labels.rs`) on the testbed's real
//! kube-apiserver: a graceful hand-over, a crash, and the stale-state scenario of the design
//! discussion (a replica that leads, loses, follows while things change, and leads again).
//! Each is shown by the replicas' own output lines and by the ConfigMaps in the API.
//!
//! The example binary is built by this test (`cargo build --example`, a no-op when fresh) in
//! the target folder the test runs from. Without the testbed binaries the tests skip (fail
//! under `CI=true`); see docs/testbed.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{
    path::PathBuf,
    process::{ExitStatus, Stdio},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use parking_lot::Mutex;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    time::Instant,
};

/// Short lease timings, so that a crash is taken over in seconds.
const TIMINGS: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "1s",
];

/// How long a test waits for a condition before failing.
const WAIT: Duration = Duration::from_secs(60);

/// One namespace holding the Lease and the ConfigMaps, labelled with a key of its own.
struct World {
    client: Client,
    kubeconfig: PathBuf,
    namespace: String,
    label: String,
}

/// One process of the example, its output lines collected as they come.
struct Replica {
    identity: String,
    child: Child,
    pid: u32,
    lines: Arc<Mutex<Vec<String>>>,
}

// === impl World ===

impl World {
    /// A fresh namespace whose label (a key unique to this test) is `value`.
    async fn new(testbed: &testbed::Testbed, test: &str, value: &str) -> Self {
        let client = testbed.client().await.unwrap();
        let namespace = testbed.fresh_namespace(test).await.unwrap();
        let world = Self {
            client,
            kubeconfig: testbed.kubeconfig_path().to_path_buf(),
            label: format!("labels.example/{namespace}"),
            namespace,
        };
        world.label_namespace(value).await;
        world
    }

    async fn label_namespace(&self, value: &str) {
        let patch = serde_json::json!({ "metadata": { "labels": { &self.label: value } } });
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &self.namespace,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn create_config_map(&self, name: &str) {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        self.config_maps()
            .create(&PostParams::default(), &config_map)
            .await
            .unwrap();
    }

    async fn delete_config_map(&self, name: &str) {
        self.config_maps()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// The value of the copied label on ConfigMap `name` (`None`: no label or no ConfigMap).
    async fn label_of(&self, name: &str) -> Option<String> {
        let config_map = self.config_maps().get_opt(name).await.unwrap()?;
        config_map.labels().get(&self.label).cloned()
    }

    /// Waits until ConfigMap `name` carries the label with `value` in the API.
    async fn wait_labelled(&self, name: &str, value: &str, replicas: &[&Replica]) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.label_of(name).await.as_deref() == Some(value) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never got {}={value}\n{}",
                self.label,
                transcript(replicas)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts a replica of the example with `identity`, competing for the Lease in this
    /// namespace; `extra` flags are appended.
    async fn start(&self, identity: &str, extra: &[&str]) -> Replica {
        let mut child = Command::new(example_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--identity", identity])
            .args(["--lease-namespace", &self.namespace])
            .args(["--label", &self.label])
            .args(TIMINGS)
            .args(extra)
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
        Replica {
            identity: identity.to_string(),
            child,
            pid,
            lines,
        }
    }
}

// === impl Replica ===

impl Replica {
    /// The lines printed so far, without their timestamps.
    fn lines(&self) -> Vec<String> {
        self.timed_lines()
            .into_iter()
            .map(|(_, line)| line)
            .collect()
    }

    /// The lines printed so far with their wall-clock time (ms since the epoch).
    fn timed_lines(&self) -> Vec<(u128, String)> {
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
    fn count(&self, prefix: &str) -> usize {
        let lines = self.lines();
        lines.iter().filter(|line| line.starts_with(prefix)).count()
    }

    /// Waits until at least `n` lines start with `prefix`; returns the time of the `n`th.
    async fn wait_for(&self, n: usize, prefix: &str, others: &[&Replica]) -> u128 {
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
    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Waits for the process to exit.
    async fn exited(&mut self) -> ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit", self.identity))
            .unwrap()
    }
}

/// Every replica's lines, for failure messages and `--nocapture` runs.
fn transcript(replicas: &[&Replica]) -> String {
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
fn example_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let target_dir = profile_dir.parent().unwrap();
            let mut build = std::process::Command::new(env!("CARGO"));
            build
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "leadership",
                    "--example",
                    "namespace_labels",
                ])
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
            profile_dir.join("examples").join("namespace_labels")
        })
        .clone()
}

/// SIGTERM on the leader: it drains and releases the Lease, the follower (which watches the
/// Lease) takes over at once, and a change made during the hand-over is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_hand_over_loses_no_change() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let world = World::new(testbed, "graceful", "red").await;
    world.create_config_map("before").await;

    let mut a = world.start("a", &[]).await;
    a.wait_for(1, "acquired term", &[]).await;
    world.wait_labelled("before", "red", &[&a]).await;
    let b = world.start("b", &[]).await;
    b.wait_for(1, "competing for lease", &[&a]).await;

    a.signal("TERM");
    world.create_config_map("during").await;
    let acquired = b.wait_for(1, "acquired term", &[&a]).await;
    assert!(a.exited().await.success(), "{}", transcript(&[&a, &b]));
    assert_eq!(a.count("released the lease; exiting"), 1);
    world.wait_labelled("during", "red", &[&a, &b]).await;
    let wrote_during = format!("wrote {}/during ", world.namespace);
    assert_eq!(
        a.count(&wrote_during) + b.count(&wrote_during),
        1,
        "one of them labelled the ConfigMap created during the hand-over\n{}",
        transcript(&[&a, &b])
    );

    // The new leader follows later changes too.
    world.label_namespace("blue").await;
    world.wait_labelled("before", "blue", &[&b]).await;
    world.wait_labelled("during", "blue", &[&b]).await;
    let shut_down = a.wait_for(1, "shutting down", &[]).await;
    println!(
        "graceful hand-over: SIGTERM seen by a → b acquired: {} ms\n{}",
        acquired.saturating_sub(shut_down),
        transcript(&[&a, &b])
    );
}

/// SIGKILL on the leader: nothing is released, and the follower takes over once the Lease
/// expires (LeaseDuration after the last renewal it saw), then applies what changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_is_taken_over_after_the_lease_expires() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let world = World::new(testbed, "crash", "red").await;
    world.create_config_map("settings").await;

    let mut a = world.start("a", &[]).await;
    a.wait_for(1, "acquired term", &[]).await;
    world.wait_labelled("settings", "red", &[&a]).await;
    let b = world.start("b", &[]).await;
    b.wait_for(1, "competing for lease", &[&a]).await;

    let killed_at = std::time::SystemTime::now();
    a.signal("KILL");
    assert!(!a.exited().await.success());
    world.label_namespace("blue").await;

    let acquired = b.wait_for(1, "acquired term", &[&a]).await;
    world.wait_labelled("settings", "blue", &[&a, &b]).await;
    let wrote = format!("wrote {}/settings {}=blue", world.namespace, world.label);
    assert_eq!(b.count(&wrote), 1, "{}", transcript(&[&a, &b]));
    assert_eq!(
        a.count("released the lease"),
        0,
        "a was killed, not stopped"
    );
    let killed = killed_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    println!(
        "crash take-over (lease 4s): SIGKILL → b acquired: {} ms\n{}",
        acquired.saturating_sub(killed),
        transcript(&[&a, &b])
    );
}

/// The design discussion's stale-state scenario: a leads and writes; loses the Lease (paused
/// past its expiry, so b takes over); while it follows, a ConfigMap it wrote is deleted (its
/// handlers are off, so it never sees the deletion); it leads again. With fresh per-term state
/// it labels a new ConfigMap at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquired_leader_labels_what_changed_while_it_followed() {
    let Some((world, a, b)) = lead_lose_and_lead_again("stale-fresh", &[]).await else {
        return;
    };
    world.wait_labelled("new", "red", &[&a, &b]).await;
    // The label can be read back before a's line about it is: wait for the line.
    let wrote = format!("wrote {}/new ", world.namespace);
    a.wait_for(1, &wrote, &[&b]).await;
    assert_eq!(a.count(&wrote), 1, "{}", transcript(&[&a, &b]));
    println!("{}", transcript(&[&a, &b]));
}

/// The same scenario with the example's deliberately wrong `--reuse-state-across-terms`: the
/// tracker of the first term still waits for the deleted ConfigMap, so the namespace is stuck on
/// "cache behind" and the new ConfigMap is never labelled. This is what the previous test's
/// fresh state prevents (and shows that the scenario does reach the stale state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_state_stays_stuck_after_reacquiring() {
    let reuse = ["--reuse-state-across-terms"];
    let Some((world, a, b)) = lead_lose_and_lead_again("stale-reused", &reuse).await else {
        return;
    };
    let behind = format!("cache behind our writes in {}", world.namespace);
    let before = a.count(&behind);
    a.wait_for(before + 3, &behind, &[&b]).await;
    assert_eq!(
        world.label_of("new").await,
        None,
        "{}",
        transcript(&[&a, &b])
    );
    assert_eq!(a.count(&format!("wrote {}/new ", world.namespace)), 0);
}

/// a leads and labels `first` and `second`; a is paused (SIGSTOP) until b takes over; `first`
/// is deleted; a resumes and follows; b stops (SIGTERM) and a leads again; then `new` is
/// created. Returns with `new` created and a leading its second term (`None`: no testbed).
async fn lead_lose_and_lead_again(test: &str, extra: &[&str]) -> Option<(World, Replica, Replica)> {
    let testbed = testbed::require!(None);
    let _logs = testbed.log_guard();
    let world = World::new(testbed, test, "red").await;
    world.create_config_map("first").await;
    world.create_config_map("second").await;

    let a = world.start("a", extra).await;
    a.wait_for(1, "acquired term", &[]).await;
    world.wait_labelled("first", "red", &[&a]).await;
    world.wait_labelled("second", "red", &[&a]).await;
    let mut b = world.start("b", extra).await;
    b.wait_for(1, "competing for lease", &[&a]).await;

    a.signal("STOP");
    b.wait_for(1, "acquired term", &[&a]).await;
    world.delete_config_map("first").await;
    a.signal("CONT");
    a.wait_for(1, "lost term", &[&b]).await;

    b.signal("TERM");
    assert!(b.exited().await.success(), "{}", transcript(&[&a, &b]));
    a.wait_for(2, "acquired term", &[&b]).await;
    a.wait_for(2, "replayed", &[&b]).await;
    world.create_config_map("new").await;
    Some((world, a, b))
}
