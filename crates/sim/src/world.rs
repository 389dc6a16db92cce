//! One simulation: the in-memory API server, the replicas, the world's own client making the
//! schedule's changes and faults, and the checks, on one current-thread runtime in paused time.
//!
//! ```text
//!  schedule(seed) ──► World ──changes──► driver client ─┐
//!                       │  ──faults───► links, replicas  │
//!                       ▼                                ▼
//!   replica i: Controller::new(kube::Client(Link i ─► in-memory API)) ──► writes
//!                                                        │ admit: 409s, server fence
//!   Checks ◄── every applied write, every landed slice write, every leadership change
//! ```
//!
//! This module holds the world's parts, its run from the schedule's first step to the report,
//! and the API server's admission of writes; `changes` makes the schedule's changes (and
//! collects garbage as the cluster would), `faults` places the schedule's faults and heals them,
//! `checking` holds what the world looks at for the checks.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use leadership::{LeaseTimings, RuntimeConfig};
use parking_lot::Mutex;
use tokio::{sync::mpsc, time::Instant};

use crate::{
    Report, Safeguard, Setup,
    checks::{Checks, Judge},
    link::{AtWrite, Link},
    replica::{self, LEASE_NAME, LEASE_NAMESPACE, Replica},
    rng::Rng,
    schedule::{Options, Schedule, Step},
};

mod changes;
mod checking;
mod faults;

/// How far behind the Lease the API server's own fence reads (its informer's lag).
const SERVER_FENCE_LAG: Duration = Duration::from_millis(50);
/// How long after the faults stop every Service's slices must keep every rule of the reference.
pub const CONVERGENCE_BOUND: Duration = Duration::from_secs(60);
/// How often the quiet-time duplicate check, the published side of (c) and `/ready` look.
const QUIET_POLL: Duration = Duration::from_secs(1);
/// How long an endpoint may stay published after its Service stopped selecting it (or its
/// workload went), counting only time when a replica could write and know (a leader blind
/// within the stall bound does not count): the longest lag of one kind (25 s), plus retries and
/// their backoffs, with room to spare.
pub const UNWANTED_BOUND: Duration = Duration::from_secs(60);

/// A simulation being run (see the module docs).
pub struct World {
    seed: u64,
    options: Options,
    off: Option<Safeguard>,
    /// Whether the replicas' barrier probes every kind rather than re-listing it.
    probing: bool,
    /// How many API server instances serve behind the one address.
    instances: usize,
    rng: Rng,
    server: apisim::ApiServer,
    driver: kube::Client,
    checks: Arc<Checks>,
    replicas: Vec<Replica>,
    exits: mpsc::UnboundedReceiver<(usize, AtWrite)>,
    /// Faults to undo, and replicas to start again, at an instant.
    later: Vec<(Instant, Later)>,
    /// Faults armed on a replica's next slice write, by replica: the restart delay of a crash or
    /// stop, or how long a pause lasts.
    armed: BTreeMap<usize, Duration>,
    conflicts: Arc<Mutex<u32>>,
    started: Instant,
}

/// Something the world does later.
#[derive(Clone, Debug)]
enum Later {
    Uncut(usize),
    Unpause(usize),
    DeleteLease,
    NoErrors(usize),
    NotSlow(usize),
    NoLag(usize),
    NoKindLag(usize),
    CacheCaughtUp {
        instances: std::ops::Range<usize>,
        resource: &'static str,
    },
    Restart(usize),
    CreateService {
        namespace: usize,
        service: usize,
    },
}

// === impl World ===

impl World {
    /// The world of `seed`, with `setup`'s protections.
    pub fn new(seed: u64, options: Options, setup: Setup) -> Self {
        let off = setup.off;
        let mut rng = Rng::new(seed);
        let probing = rng.derive(5).chance(options.probing_barrier);
        let mut instances = vec![apisim::Instance::default()];
        if !options.instance_lag.is_zero() {
            // From a stream of its own: the rest of the world draws as it did without it.
            let lags = rng.derive(4).next_u64();
            instances.push(apisim::Instance::seeded(lags, options.instance_lag));
        }
        let count = instances.len();
        let server = apisim::ApiServer::new(apisim::ServerConfig {
            seed: rng.next_u64(),
            instances,
            ..apisim::ServerConfig::default()
        });
        let driver = server.client("driver");
        let identities: Vec<String> = (0..options.replicas)
            .map(|index| format!("replica-{index}"))
            .collect();
        let runtime = RuntimeConfig::default();
        let judge = Judge {
            renew_deadline: LeaseTimings::default().renew_deadline(),
            stall_bound: replica::STALL_BOUND,
            margin: runtime.fence_margin(),
            fence: off != Some(Safeguard::Fence),
        };
        let checks = Arc::new(Checks::new(identities.clone(), judge));
        let (exit_sender, exits) = mpsc::unbounded_channel();
        let replicas = identities
            .into_iter()
            .enumerate()
            .map(|(index, identity)| {
                let link = Link::new(index, rng.fork(), exit_sender.clone());
                Replica::new(index, identity, link)
            })
            .collect();
        let conflicts = Arc::new(Mutex::new(0));
        let observed = checks.clone();
        server.observe(move |applied| observed.applied(applied));
        let fence = setup.server_fence;
        let (fencing, refusing) = (checks.clone(), conflicts.clone());
        #[allow(clippy::result_large_err)] // the API server's answer is a Status
        server.admit(move |request| admit(request, fence, &fencing, &refusing));
        Self {
            seed,
            options,
            off,
            probing,
            instances: count,
            rng,
            server,
            driver,
            checks,
            replicas,
            exits,
            later: Vec::new(),
            armed: BTreeMap::new(),
            conflicts,
            started: Instant::now(),
        }
    }

    /// Runs the schedule, heals, waits for convergence and rest, and reports.
    pub async fn run(mut self) -> Report {
        let schedule = Schedule::generate(&mut self.rng, &self.options);
        self.populate(&schedule.initial).await;
        for index in 0..self.replicas.len() {
            self.start(index);
        }
        let mut steps = schedule.steps.iter().peekable();
        let mut next_quiet_check = Instant::now() + QUIET_POLL;
        let mut last_look = Instant::now();
        loop {
            let next_step = steps.peek().map(|timed| self.started + timed.at);
            let next_later = self.later.iter().map(|(at, _)| *at).min();
            let Some(wake) = [next_step, next_later, Some(next_quiet_check)]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            if next_step.is_none() && next_later.is_none() {
                break;
            }
            tokio::select! {
                biased;
                Some((replica, what)) = self.exits.recv() => self.at_write(replica, what),
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            self.reap();
            self.run_later(now).await;
            while let Some(timed) = steps.next_if(|timed| self.started + timed.at <= now) {
                match &timed.step {
                    Step::Change(change) => self.change(change).await,
                    Step::Fault(fault) => self.fault(fault).await,
                }
            }
            if now >= next_quiet_check {
                self.collect_garbage().await;
                self.look(now - last_look);
                last_look = now;
                next_quiet_check = now + QUIET_POLL;
            }
        }
        let healed_at = self.heal().await;
        let converged_after = self.converge(healed_at).await;
        if converged_after.is_some() {
            self.rest().await;
        }
        let simulated = Instant::now() - self.started;
        self.shut_down().await;
        Report {
            seed: self.seed,
            violations: self.checks.violations(),
            converged_after,
            trace_hash: self.server.log_hash(),
            slice_writes: self.checks.slice_writes().1,
            simulated,
            schedule,
            requests: self.server.log().iter().map(ToString::to_string).collect(),
        }
    }

    fn start(&mut self, index: usize) {
        let mut config = replica::config(&self.replicas[index].identity, self.off);
        if self.probing {
            config.safeguards = config.safeguards.with_barrier_relisting_at_most(0);
        }
        let replica = &mut self.replicas[index];
        replica.link.heal();
        replica.start(&self.server, config, &self.checks);
    }

    /// Forgets replicas whose graceful stop has ended.
    fn reap(&mut self) {
        for replica in &mut self.replicas {
            let _ = replica.reap(&self.checks);
        }
    }

    async fn run_later(&mut self, now: Instant) {
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.later)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.later = rest;
        for (_, action) in due {
            match action {
                Later::Uncut(index) => self.replicas[index].link.uncut(),
                Later::Unpause(index) => self.replicas[index].link.unpause(),
                Later::NoErrors(index) => self.replicas[index].link.errors(0),
                Later::NotSlow(index) => self.replicas[index].link.slow(Duration::ZERO),
                Later::NoLag(index) => self.replicas[index].link.lag(Duration::ZERO),
                Later::NoKindLag(index) => self.replicas[index].link.unlag_watches(),
                Later::DeleteLease => self.delete_lease().await,
                Later::CacheCaughtUp {
                    instances,
                    resource,
                } => {
                    for instance in instances {
                        self.server.unlag_cache(instance, resource);
                    }
                }
                Later::Restart(index) => {
                    if self.replicas[index].running() {
                        // Still draining after a graceful stop: try again shortly.
                        self.later
                            .push((now + Duration::from_millis(100), Later::Restart(index)));
                    } else {
                        self.reap();
                        self.start(index);
                    }
                }
                Later::CreateService { namespace, service } => {
                    self.create_service(namespace, service).await;
                }
            }
        }
    }

    fn after(&mut self, delay: Duration, action: Later) {
        self.later.push((Instant::now() + delay, action));
    }

    /// Stops every replica gracefully and waits (bounded) for them to end.
    async fn shut_down(&mut self) {
        for replica in &mut self.replicas {
            replica.stop();
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.replicas.iter().any(Replica::running) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for replica in &mut self.replicas {
            replica.crash(&self.checks);
        }
    }
}

/// The API server's admission of a write: the injected conflicts, then its fence (the Lease's
/// holder, as its informer saw it a moment ago, must be the caller).
#[allow(clippy::result_large_err)] // the API server's answer is a Status
fn admit(
    request: &apisim::WriteRequest,
    fence: bool,
    checks: &Checks,
    conflicts: &Mutex<u32>,
) -> Result<(), kube::core::Status> {
    if request.plural != "endpointslices" || !request.caller.starts_with("replica-") {
        return Ok(());
    }
    {
        let mut left = conflicts.lock();
        if *left > 0 {
            *left -= 1;
            return Err(kube::core::Status::failure(
                "simulated: the object has been modified; please apply your changes to the latest version and try again",
                "Conflict",
            )
            .with_code(409));
        }
    }
    if fence && checks.holder_seen(SERVER_FENCE_LAG).as_deref() != Some(request.caller.as_str()) {
        // Worded as deploy/fencing.yaml words it, so the controller tells it from RBAC.
        let message = format!(
            "'{}' {} {LEASE_NAMESPACE}/{LEASE_NAME}",
            request.caller,
            leadership::FENCING_POLICY_DENIAL
        );
        return Err(kube::core::Status::failure(&message, "Forbidden").with_code(403));
    }
    Ok(())
}
