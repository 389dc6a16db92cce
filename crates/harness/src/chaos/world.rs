//! The chaos tests' world: one namespace with the client's model, the replicas (some behind
//! their own proxy), and the timings the faults are judged by.

use std::time::Duration;

use tokio::time::Instant;

use crate::{
    CONVERGE, Cluster, Replica,
    chaos::{
        churn::{Churn, Model, Rng},
        slice_versions, wait_any_leading,
    },
    proxy::Proxy,
    replica::Binary,
};

/// The e2e replicas' lease timings ([`LEASE_ARGS`](crate::LEASE_ARGS)).
pub const LEASE_DURATION: Duration = Duration::from_secs(4);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(3);
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// Scheduling and scraping slack on timing assertions.
pub const SLACK: Duration = Duration::from_millis(700);
/// Client changes per fault, and the mean pause between two.
pub const CHANGES: usize = 30;
pub const PAUSE: Duration = Duration::from_millis(80);
/// Changes made before the fault (it strikes mid-stream).
pub const BEFORE_FAULT: usize = 6;
/// The replicas' reconcile workers (the default).
pub const WORKERS: f64 = 4.0;
/// The replicas' drain deadline (`--drain-timeout` of [`e2e_args`](crate::replica::e2e_args)).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Mean pause between two resets of every connection.
pub const RESET_EVERY: Duration = Duration::from_millis(250);
/// A flap: longer than RetryPeriod (one renewal attempt fails), shorter than RenewDeadline.
pub const FLAP: Duration = Duration::from_millis(1200);

/// One test's namespace, client model and randomness.
pub struct World<'a> {
    /// The controller binary the replicas run.
    pub binary: Binary,
    pub testbed: &'a testbed::Testbed,
    pub cluster: Cluster,
    pub model: Model,
    pub rng: Rng,
    pub replicas: usize,
    /// Replicas that exited or were killed, kept for their logs (the write audit reads them).
    pub retired: Vec<Member>,
    /// Which API server new replicas talk to ([`testbed::Server::ApiServer`] index).
    pub apiserver: usize,
    /// Client changes started so far (every one is checked when its client settles).
    pub changes: usize,
}

/// A replica, and its proxy when its API traffic can be cut.
pub struct Member {
    pub replica: Replica,
    pub proxy: Option<Proxy>,
    /// The API server it talks to ([`testbed::Server::ApiServer`] index).
    pub apiserver: usize,
}

// === impl World ===

impl<'a> World<'a> {
    /// A fresh namespace holding the client's initial objects.
    pub async fn new(binary: Binary, testbed: &'a testbed::Testbed, test: &str) -> World<'a> {
        let cluster = Cluster::new(testbed, test).await;
        let model = Model::new();
        model.create(&cluster).await;
        World {
            binary,
            testbed,
            cluster,
            model,
            rng: Rng::seeded(test),
            replicas: 0,
            retired: Vec::new(),
            apiserver: 0,
            changes: 0,
        }
    }

    /// Starts one replica per entry (`true`: behind its own proxy); the first leads, the others
    /// follow; returns once the slices show the initial objects.
    pub async fn start(&mut self, proxied: &[bool]) -> Vec<Member> {
        let mut members = Vec::new();
        for (index, proxied) in proxied.iter().enumerate() {
            members.push(self.member(*proxied).await);
            if index == 0 {
                members[0].replica.wait_leading(CONVERGE).await;
            }
        }
        let model = self.model.clone();
        model.wait_reflected(&self.cluster, None).await;
        members
    }

    /// Starts a replica, proxied or not, with a fresh identity.
    pub async fn member(&mut self, proxied: bool) -> Member {
        let identity = format!("r{}", self.replicas);
        self.replicas += 1;
        let namespace = &self.cluster.namespace;
        if proxied || self.apiserver != 0 {
            let upstream = self.testbed.apiserver_url(self.apiserver).unwrap();
            let (replica, proxy) = Replica::start_proxied_to(
                self.binary,
                self.testbed,
                &upstream,
                namespace,
                &identity,
                &[],
            )
            .await;
            Member {
                replica,
                proxy: Some(proxy),
                apiserver: self.apiserver,
            }
        } else {
            let replica =
                Replica::start(self.binary, self.testbed, namespace, &identity, &[]).await;
            Member {
                replica,
                proxy: None,
                apiserver: 0,
            }
        }
    }

    /// Stops the leader gracefully (SIGTERM; it must exit cleanly), retires it from `members`,
    /// and waits until another member leads; returns that member's index.
    pub async fn stop_leader(&mut self, members: &mut Vec<Member>) -> usize {
        let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
        let (index, _) = wait_any_leading(&self.cluster, &replicas).await;
        let mut old = members.remove(index);
        old.replica.terminate();
        assert!(old.replica.wait_exit(CONVERGE).await.success());
        self.retire(old);
        let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
        wait_any_leading(&self.cluster, &replicas).await.0
    }

    /// Starts the client on a copy of the model.
    pub fn churn(&mut self, changes: usize) -> Churn {
        let rng = self.rng.fork();
        self.changes += changes;
        Churn::start(&self.cluster, self.model.clone(), rng, changes, PAUSE)
    }

    /// Starts a client that retries each change while the API is unavailable.
    pub fn churn_retrying(&mut self, changes: usize) -> Churn {
        let rng = self.rng.fork();
        self.changes += changes;
        Churn::start_retrying(&self.cluster, self.model.clone(), rng, changes, PAUSE)
    }

    /// Keeps a replica that left (its log stays readable).
    pub fn retire(&mut self, member: Member) {
        self.retired.push(member);
    }

    /// Waits for the client's last change, then for the slices to converge and match it.
    pub async fn settle(&mut self, churn: Churn) {
        let (model, last) = churn.finish().await;
        self.model = model;
        self.model
            .wait_reflected(&self.cluster, last.as_ref())
            .await;
    }

    /// Makes a change certain to change a slice, and checks that it is not applied yet.
    pub async fn unapplied_change(&mut self) {
        let change = self.model.visible_change();
        self.changes += 1;
        self.model.apply(&self.cluster, &change).await;
        assert!(
            self.model
                .check_change(&self.cluster, &change)
                .await
                .is_err(),
            "{change:?} must not be applied while nobody leads"
        );
    }

    /// Holds for `period`, failing at once if a slice is written or anyone leads.
    pub async fn nothing_written(&self, members: &[Member], period: Duration) {
        let versions = slice_versions(&self.cluster).await;
        let until = Instant::now() + period;
        while Instant::now() < until {
            assert_eq!(
                slice_versions(&self.cluster).await,
                versions,
                "a slice was written while nobody may lead"
            );
            for member in members {
                assert!(
                    !member.replica.is_leader().await,
                    "{} leads while a foreign holder keeps the Lease",
                    member.replica.identity
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The replica's `leader_acquisitions` counter.
pub async fn acquisitions_of(replica: &Replica) -> f64 {
    replica
        .metric("external_endpoints_leader_acquisitions_total", "")
        .await
        .unwrap()
}
