//! The chaos tests' world: one namespace with the client's model, the replicas (some behind
//! their own proxy), and the timings the faults are judged by.
//!
//! Each replica is a user of its own on the API server (a client certificate with its identity
//! as name: [`testbed::Testbed::kubeconfig_for`]), so the API server's audit log names the
//! replica behind every write ([`audit`](super::audit)).

use std::time::Duration;

use tokio::time::Instant;

use crate::{
    CONVERGE, Cluster, Replica,
    chaos::{
        churn::{Churn, Model, Rng},
        slice_versions, wait_any_leading,
    },
    proxy::HttpProxy,
    replica::{Binary, LEASE_ARGS, e2e_args_timed},
};

/// The e2e replicas' lease timings ([`LEASE_ARGS`]): [`World::lease`] by default, and what
/// the faults of `faults`, `network`, `control` and `latency` are judged by.
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
/// The replicas' reconcile workers and cap of calls in flight (the default, `--workers`; 4 before
/// issue 34 made it a cap the writes in flight adapt under): at most this many writes can be on
/// the wire when a term ends.
pub const WORKERS: f64 = 32.0;
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
    /// The lease timings of the replicas started from now on.
    pub lease: LeaseTimings,
    /// Flags of the replicas started from now on, after the e2e ones (e.g. the watch stall
    /// bound of [`quiet`](super::quiet)).
    pub extra: Vec<String>,
}

/// Lease timings of replicas (`--lease-duration`, `--renew-deadline`, `--retry-period`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// A replica, and its proxy when its API traffic can be struck.
pub struct Member {
    pub replica: Replica,
    pub proxy: Option<HttpProxy>,
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
            lease: LeaseTimings::E2E,
            extra: Vec::new(),
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

    /// Starts a replica with a fresh identity, as a user of that name, on API server
    /// [`World::apiserver`], behind its own [`HttpProxy`] if `proxied`.
    pub async fn member(&mut self, proxied: bool) -> Member {
        let identity = format!("r{}", self.replicas);
        self.replicas += 1;
        let own = self
            .testbed
            .kubeconfig_for(&identity, self.apiserver)
            .unwrap();
        let lease = self.lease.args();
        let lease: Vec<&str> = lease.iter().map(String::as_str).collect();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let args = e2e_args_timed(&self.cluster.namespace, &lease, &extra);
        let proxy = match proxied {
            true => Some(HttpProxy::start(&own).await),
            false => None,
        };
        // Read once, at start: the file may go once the replica runs.
        let through = proxy.as_ref().map(HttpProxy::kubeconfig);
        let kubeconfig = through.as_ref().map_or(own.as_path(), |file| file.path());
        let replica = Replica::start_with(self.binary, kubeconfig, &identity, &args).await;
        Member {
            replica,
            proxy,
            apiserver: self.apiserver,
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

// === impl LeaseTimings ===

impl LeaseTimings {
    /// The e2e timings ([`LEASE_ARGS`]: 4 s, 3 s, 1 s): fail-overs within seconds.
    pub const E2E: LeaseTimings = LeaseTimings {
        duration: LEASE_DURATION,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY_PERIOD,
    };

    /// The controller's defaults (15 s, 10 s, 2 s).
    pub const DEFAULT: LeaseTimings = LeaseTimings {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// The flags.
    pub fn args(&self) -> Vec<String> {
        if *self == LeaseTimings::E2E {
            return LEASE_ARGS.map(String::from).into();
        }
        let flag =
            |name: &str, value: Duration| [name.to_string(), format!("{}ms", value.as_millis())];
        [
            flag("--lease-duration", self.duration),
            flag("--renew-deadline", self.renew_deadline),
            flag("--retry-period", self.retry_period),
        ]
        .concat()
    }
}

/// The replica's `leader_acquisitions` counter.
pub async fn acquisitions_of(replica: &Replica) -> f64 {
    replica
        .metric("external_endpoints_leader_acquisitions_total", "")
        .await
        .unwrap()
}
