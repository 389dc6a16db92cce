//! Two replicas of the kube-runtime example (`examples/kube_runtime_controller.rs`) on the
//! testbed's real kube-apiserver: the leader's `Controller` runs only during its term and its
//! writes are fenced; on SIGTERM its controller stops, the Lease is released, and the other
//! replica's controller starts and writes what comes next. A leader paused past its lease has
//! its controller stopped when it wakes, and writes nothing under its old term.
//!
//! The example binary is built by the test (a no-op when fresh). Without the testbed binaries
//! the tests skip (fail under `CI=true`); see docs/testbed.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use kube::ResourceExt;

use support::{Replica, TIMINGS, World, transcript, wait_for_value};

/// The annotation the example writes.
const STAMP: &str = "example.com/stamped-by";

// === impl World ===

impl World {
    async fn new(testbed: &testbed::Testbed, test: &str) -> Self {
        Self::create(testbed, test, "stamp.example").await
    }

    /// Creates a ConfigMap carrying the label the example selects.
    async fn create_config_map(&self, name: &str) {
        self.create_config_map_labelled(name, &[(self.label.as_str(), "yes")])
            .await;
    }

    /// Waits until ConfigMap `name` is stamped; returns the stamp (`identity/term`).
    async fn wait_stamped(&self, name: &str, replicas: &[&Replica]) -> String {
        let failure = format!("{name} was never stamped");
        wait_for_value(&failure, replicas, || async {
            let config_map = self.config_maps().get_opt(name).await.unwrap();
            config_map.and_then(|cm| cm.annotations().get(STAMP).cloned())
        })
        .await
    }

    fn start(&self, identity: &str) -> Replica {
        let mut args = vec![
            "--identity",
            identity,
            "--namespace",
            &self.namespace,
            "--label",
            &self.label,
        ];
        args.extend(TIMINGS);
        self.start_example("kube_runtime_controller", identity, &args)
    }
}

/// The term of a `controller started (term N)` line.
fn started_term(replica: &Replica, nth: usize) -> String {
    let lines = replica.lines();
    let started: Vec<&String> = lines
        .iter()
        .filter(|line| line.starts_with("controller started (term "))
        .collect();
    started[nth - 1]
        .trim_start_matches("controller started (term ")
        .trim_end_matches(')')
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runtime_controller_runs_only_during_a_term_and_hands_over() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let world = World::new(testbed, "kube-runtime").await;
    world.create_config_map("before").await;

    let mut a = world.start("a");
    a.wait_for(1, "controller started", &[]).await;
    let a_term = started_term(&a, 1);
    assert_eq!(
        world.wait_stamped("before", &[&a]).await,
        format!("a/{a_term}")
    );
    let b = world.start("b");
    b.wait_for(1, "competing for lease", &[&a]).await;
    assert_eq!(
        b.count("controller started"),
        0,
        "a follower runs no controller"
    );

    // SIGTERM: a's controller stops (its reconciles finish), then a releases; b starts its own.
    a.signal("TERM");
    assert!(a.exited().await.success(), "{}", transcript(&[&a, &b]));
    let lines = a.lines();
    let stopped = lines
        .iter()
        .position(|line| line.starts_with("controller stopped"))
        .expect("a's controller stopped");
    let released = lines
        .iter()
        .position(|line| line.starts_with("released the lease"))
        .expect("a released the lease");
    assert!(stopped < released, "{}", transcript(&[&a]));
    b.wait_for(1, "controller started", &[&a]).await;
    let b_term = started_term(&b, 1);
    world.create_config_map("after").await;
    assert_eq!(
        world.wait_stamped("after", &[&a, &b]).await,
        format!("b/{b_term}")
    );
    assert_eq!(
        world.wait_stamped("before", &[&b]).await,
        format!("a/{a_term}"),
        "b's fresh controller saw it stamped already: nothing rewritten"
    );
    println!("{}", transcript(&[&a, &b]));
}

/// A leader paused (SIGSTOP) until the other takes over: when it wakes, its term is over, its
/// controller stops, and the ConfigMap created meanwhile is stamped by the new leader only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_stops_its_controller_and_writes_nothing_after_its_term() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let world = World::new(testbed, "kube-runtime-paused").await;

    let a = world.start("a");
    a.wait_for(1, "controller started", &[]).await;
    let b = world.start("b");
    b.wait_for(1, "competing for lease", &[&a]).await;

    a.signal("STOP");
    b.wait_for(1, "controller started", &[&a]).await;
    let b_term = started_term(&b, 1);
    world.create_config_map("meanwhile").await;
    assert_eq!(
        world.wait_stamped("meanwhile", &[&a, &b]).await,
        format!("b/{b_term}")
    );
    a.signal("CONT");
    a.wait_for(1, "controller stopped", &[&b]).await;
    assert_eq!(
        a.count("stamped"),
        0,
        "a wrote nothing\n{}",
        transcript(&[&a, &b])
    );
    println!("{}", transcript(&[&a, &b]));
}
