//! Two replicas of the example controller (`examples/namespace_labels.rs`) on the testbed's real
//! kube-apiserver: a graceful hand-over, a crash, and the stale-state scenario of the design
//! discussion (a replica that leads, loses, follows while things change, and leads again).
//! Each is shown by the replicas' own output lines and by the ConfigMaps in the API.
//!
//! The example binary is built by this test (`cargo build --example`, a no-op when fresh) in
//! the target folder the test runs from. Without the testbed binaries the tests skip (fail
//! under `CI=true`); see docs/testbed.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};

use support::{Replica, TIMINGS, World, transcript, wait_for_value};

// === impl World ===

impl World {
    /// A fresh namespace whose label (a key unique to this test) is `value`.
    async fn new(testbed: &testbed::Testbed, test: &str, value: &str) -> Self {
        let world = Self::create(testbed, test, "labels.example").await;
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

    async fn create_config_map(&self, name: &str) {
        self.create_config_map_labelled(name, &[]).await;
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
        let failure = format!("{name} never got {}={value}", self.label);
        wait_for_value(&failure, replicas, || async {
            (self.label_of(name).await.as_deref() == Some(value)).then_some(())
        })
        .await;
    }

    /// Starts a replica of the example with `identity`, competing for the Lease in this
    /// namespace; `extra` flags are appended.
    async fn start(&self, identity: &str, extra: &[&str]) -> Replica {
        let mut args = vec![
            "--identity",
            identity,
            "--lease-namespace",
            &self.namespace,
            "--label",
            &self.label,
        ];
        args.extend(TIMINGS);
        args.extend(extra);
        self.start_example("namespace_labels", identity, &args)
    }
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

/// a leads and labels `first` and `second`; a is paused (SIGSTOP) until b takes over, then
/// resumes and follows; `first` is deleted; b stops (SIGTERM) and a leads again; then `new` is
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
    a.signal("CONT");
    a.wait_for(1, "lost term", &[&b]).await;
    // Deleted once a follows. Deleted while a was paused, the deletion reached a's watch as it
    // woke, racing its step-down: a handler still registered for the ended term could see it.
    world.delete_config_map("first").await;

    b.signal("TERM");
    assert!(b.exited().await.success(), "{}", transcript(&[&a, &b]));
    a.wait_for(2, "acquired term", &[&b]).await;
    a.wait_for(2, "replayed", &[&b]).await;
    world.create_config_map("new").await;
    Some((world, a, b))
}
