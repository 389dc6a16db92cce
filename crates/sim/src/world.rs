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

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use leadership::{LeaseTimings, RuntimeConfig};
use parking_lot::Mutex;
use slices::{
    MANAGED_BY_LABEL,
    testing::{Svc, Workload},
};
use tokio::{sync::mpsc, time::Instant};

use crate::{
    Report, Safeguard, Setup,
    checks::{Check, Checks, Judge},
    link::{AtWrite, Link},
    reference,
    replica::{self, LEASE_NAME, LEASE_NAMESPACE, Replica},
    rng::Rng,
    schedule::{
        APPS, Change, Fault, NAMESPACES, Options, SERVICES, Schedule, Step, Target, WorkloadSpec,
        ZONES,
    },
};

/// How far behind the Lease the API server's own fence reads (its informer's lag).
const SERVER_FENCE_LAG: Duration = Duration::from_millis(50);
/// How long after the faults stop every Service's slices must keep every rule of the reference.
pub const CONVERGENCE_BOUND: Duration = Duration::from_secs(60);
/// How often convergence is looked at.
const CONVERGENCE_POLL: Duration = Duration::from_millis(250);
/// How long past the stall bound a replica may take to notice a silent watch and stop
/// reporting ready (its watch loop looks every few seconds).
const READY_NOTICE: Duration = Duration::from_secs(5);
/// How often the quiet-time duplicate check, the published side of (c) and `/ready` look.
const QUIET_POLL: Duration = Duration::from_secs(1);
/// How long an endpoint may stay published after its Service stopped selecting it (or its
/// workload went), counting only time when a replica could write: the stall bound (a leader
/// blind that long), plus the longest lag of one kind (25 s), plus retries.
pub const UNWANTED_BOUND: Duration = Duration::from_secs(60);

/// A simulation being run (see the module docs).
pub struct World {
    seed: u64,
    options: Options,
    off: Option<Safeguard>,
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
    NoErrors(usize),
    NotSlow(usize),
    NoLag(usize),
    NoKindLag(usize),
    Restart(usize),
    CreateService { namespace: usize, service: usize },
}

// === impl World ===

impl World {
    /// The world of `seed`, with `setup`'s protections.
    pub fn new(seed: u64, options: Options, setup: Setup) -> Self {
        let off = setup.off;
        let mut rng = Rng::new(seed);
        let server = apisim::ApiServer::new(apisim::ServerConfig {
            seed: rng.next_u64(),
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
                self.quiet_check();
                let may_write = self
                    .checks
                    .acting_leader()
                    .is_some_and(|leader| self.replicas[leader].link.reachable());
                self.checks
                    .check_published(now - last_look, may_write, UNWANTED_BOUND);
                for replica in &self.replicas {
                    if let Some(ready) = replica.ready() {
                        self.checks.check_ready(replica.index, ready, READY_NOTICE);
                    }
                }
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

    /// The Services of every namespace and the initial workloads.
    async fn populate(&self, initial: &[WorkloadSpec]) {
        for namespace in 0..NAMESPACES.len() {
            for service in 0..SERVICES.len() {
                self.create_service(namespace, service).await;
            }
        }
        for spec in initial {
            self.create_workload(spec).await;
        }
    }

    fn start(&mut self, index: usize) {
        let config = replica::config(&self.replicas[index].identity, self.off);
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

    /// The replica a fault strikes.
    fn target(&mut self, target: Target) -> usize {
        let leader = self.checks.leader();
        let count = self.replicas.len();
        match (target, leader) {
            (Target::Leader, Some(leader)) => leader,
            (Target::Follower, Some(leader)) if count > 1 => {
                (leader + 1 + self.rng.index(count - 1)) % count
            }
            _ => self.rng.index(count),
        }
    }

    async fn fault(&mut self, fault: &Fault) {
        match *fault {
            Fault::StallWatches { target } => {
                let index = self.target(target);
                self.replicas[index].link.stall();
            }
            Fault::LagWatches {
                target,
                lag,
                lasting,
            } => {
                let lagging = move |link: &Link| link.lag(lag);
                self.link_fault(target, lasting, lagging, Later::NoLag);
            }
            Fault::Cut { target, lasting } => {
                self.link_fault(target, lasting, Link::cut, Later::Uncut);
            }
            Fault::Pause { target, lasting } => {
                self.link_fault(target, lasting, Link::pause, Later::Unpause);
            }
            Fault::Errors {
                target,
                percent,
                lasting,
            } => {
                let errors = move |link: &Link| link.errors(percent);
                self.link_fault(target, lasting, errors, Later::NoErrors);
            }
            Fault::Slow {
                target,
                delay,
                lasting,
            } => {
                let slow = move |link: &Link| link.slow(delay);
                self.link_fault(target, lasting, slow, Later::NotSlow);
            }
            Fault::Crash {
                target,
                restart_after,
            } => {
                let index = self.target(target);
                self.crash(index, restart_after);
            }
            Fault::Stop {
                target,
                restart_after,
            } => {
                let index = self.target(target);
                if !self.replicas[index].stopping_or_gone() {
                    self.replicas[index].stop();
                    self.after(restart_after, Later::Restart(index));
                }
            }
            Fault::CrashAfterNextWrite { restart_after } => {
                let index = self.target(Target::Leader);
                self.armed.insert(index, restart_after);
                self.replicas[index].link.crash_after_next_write();
            }
            Fault::StopDuringNextWrite {
                hold,
                restart_after,
            } => {
                let index = self.target(Target::Leader);
                self.armed.insert(index, restart_after);
                self.replicas[index].link.stop_during_next_write(hold);
            }
            Fault::PauseDuringNextWrite { lasting } => {
                let index = self.target(Target::Leader);
                self.armed.insert(index, lasting);
                self.replicas[index].link.pause_at_next_write();
            }
            Fault::LagKind {
                target,
                resource,
                lag,
                lasting,
            } => {
                let lagging = move |link: &Link| link.lag_watches_of(resource, lag);
                self.link_fault(target, lasting, lagging, Later::NoKindLag);
            }
            Fault::LoseAnswers { count } => {
                let index = self.target(Target::Leader);
                self.replicas[index].link.lose_next_answers(count);
            }
            Fault::Expire { target } => {
                let index = self.target(target);
                self.server.compact();
                self.replicas[index].link.end_streams();
            }
            Fault::Conflicts { count } => *self.conflicts.lock() += count,
            Fault::ForeignDelete { pick } => self.foreign_delete(pick).await,
            Fault::ForeignEdit { pick } => self.foreign_edit(pick).await,
            Fault::DeleteLease => {
                let leases: Api<Lease> = Api::namespaced(self.driver.clone(), LEASE_NAMESPACE);
                let _ = leases.delete(LEASE_NAME, &DeleteParams::default()).await;
            }
            Fault::OverwriteLease => self.overwrite_lease().await,
            Fault::StaleTakeover {
                lag,
                lasting,
                restart_after,
            } => {
                let follower = self.target(Target::Follower);
                self.replicas[follower].link.lag(lag);
                self.after(lasting, Later::NoLag(follower));
                if let Some(leader) = self.checks.leader()
                    && leader != follower
                {
                    self.crash(leader, restart_after);
                }
            }
        }
    }

    /// Puts a fault on the link of the replica `target` names, and its end `lasting` later.
    fn link_fault(
        &mut self,
        target: Target,
        lasting: Duration,
        fault: impl FnOnce(&Link),
        end: fn(usize) -> Later,
    ) {
        let index = self.target(target);
        fault(&self.replicas[index].link);
        self.after(lasting, end(index));
    }

    fn crash(&mut self, index: usize, restart_after: Duration) {
        if self.replicas[index].stopping_or_gone() {
            return;
        }
        self.replicas[index].crash(&self.checks);
        self.after(restart_after, Later::Restart(index));
    }

    fn at_write(&mut self, index: usize, what: AtWrite) {
        let after = self.armed.remove(&index).unwrap_or(Duration::ZERO);
        match what {
            AtWrite::Crash => self.crash(index, after),
            AtWrite::Pause => self.after(after, Later::Unpause(index)),
            AtWrite::Stop => {
                if !self.replicas[index].stopping_or_gone() {
                    self.replicas[index].stop();
                    self.after(after, Later::Restart(index));
                }
            }
        }
    }

    async fn foreign_delete(&self, pick: u64) {
        let managed = self.managed_slices();
        if managed.is_empty() {
            return;
        }
        let slice = &managed[usize::try_from(pick % managed.len() as u64).unwrap_or(0)];
        let api: Api<EndpointSlice> = Api::namespaced(
            self.driver.clone(),
            slice.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = slice.metadata.name.clone().unwrap_or_default();
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }

    async fn foreign_edit(&self, pick: u64) {
        let managed: Vec<EndpointSlice> = self
            .managed_slices()
            .into_iter()
            .filter(|slice| {
                slice
                    .endpoints
                    .as_ref()
                    .is_some_and(|endpoints| !endpoints.is_empty())
            })
            .collect();
        if managed.is_empty() {
            return;
        }
        let mut slice = managed[usize::try_from(pick % managed.len() as u64).unwrap_or(0)].clone();
        if let Some(endpoints) = slice.endpoints.as_mut() {
            endpoints.remove(0);
        }
        let api: Api<EndpointSlice> = Api::namespaced(
            self.driver.clone(),
            slice.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = slice.metadata.name.clone().unwrap_or_default();
        let _ = api.replace(&name, &PostParams::default(), &slice).await;
    }

    async fn overwrite_lease(&self) {
        let leases: Api<Lease> = Api::namespaced(self.driver.clone(), LEASE_NAMESPACE);
        let Ok(mut lease) = leases.get(LEASE_NAME).await else {
            return;
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".to_string());
        }
        let _ = leases
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await;
    }

    fn managed_slices(&self) -> Vec<EndpointSlice> {
        self.server
            .objects::<EndpointSlice>()
            .into_iter()
            .filter(|slice| {
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|labels| labels.contains_key(MANAGED_BY_LABEL))
            })
            .collect()
    }

    /// (d) while the world is calm: no fault in force, every replica up, a leader, and no slice
    /// write for a lease duration.
    fn quiet_check(&self) {
        let calm = self.later.is_empty()
            && self
                .replicas
                .iter()
                .all(|replica| replica.running() && !replica.link.faulty());
        let (last_write, _) = self.checks.slice_writes();
        let quiet = Instant::now() - last_write >= LeaseTimings::default().lease_duration();
        if calm && quiet && self.checks.leader().is_some() {
            self.checks.check_duplicates("quiet for a lease duration");
        }
    }

    /// Ends every fault and starts every replica that is down; returns when.
    async fn heal(&mut self) -> Instant {
        for replica in &self.replicas {
            replica.link.heal();
        }
        *self.conflicts.lock() = 0;
        let pending = std::mem::take(&mut self.later);
        for (_, action) in pending {
            if let Later::CreateService { namespace, service } = action {
                self.create_service(namespace, service).await;
            }
        }
        // A replica still draining is waited for, then started again.
        for index in 0..self.replicas.len() {
            while self.replicas[index].running() && self.replicas[index].stopping_or_gone() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.reap();
            if !self.replicas[index].running() {
                self.start(index);
            }
        }
        Instant::now()
    }

    /// (e): waits until every Service's slices keep the reference's rules; `None` (a violation) if that
    /// takes longer than [`CONVERGENCE_BOUND`].
    async fn converge(&self, healed_at: Instant) -> Option<Duration> {
        loop {
            // Converged: the slices keep the rules, and no write is still on its way to the API
            // (one held by a fault until the heal may land now, and is not a write at rest).
            let pending = self.unconverged();
            let on_the_wire = self
                .replicas
                .iter()
                .any(|replica| replica.link.writes_in_flight() > 0);
            if pending.is_empty() && !on_the_wire {
                return Some(Instant::now() - healed_at);
            }
            if Instant::now() - healed_at >= CONVERGENCE_BOUND {
                self.checks.report(
                    Check::NotConverged,
                    format!(
                        "{} after the faults stopped: {}",
                        humantime_secs(CONVERGENCE_BOUND),
                        pending.join("; ")
                    ),
                );
                return None;
            }
            tokio::time::sleep(CONVERGENCE_POLL).await;
        }
    }

    /// (e), then: two lease durations with no write, slices still keeping the rules, and no
    /// duplicate (d).
    async fn rest(&self) {
        let (_, before) = self.checks.slice_writes();
        tokio::time::sleep(2 * LeaseTimings::default().lease_duration()).await;
        let (_, after) = self.checks.slice_writes();
        if after != before {
            self.checks.report(
                Check::WroteAtRest,
                format!("{} slice writes while nothing changed", after - before),
            );
        }
        let pending = self.unconverged();
        if !pending.is_empty() {
            self.checks.report(
                Check::NotConverged,
                format!("drifted at rest: {}", pending.join("; ")),
            );
        }
        self.checks.check_duplicates("at rest");
    }

    /// The Services whose slices break a rule of the spec, judged by the independent
    /// [`reference`] (not by the controller's planner), with the first broken rule of each.
    fn unconverged(&self) -> Vec<String> {
        let services = self.server.objects::<Service>();
        let workloads = self.server.objects::<ExternalWorkload>();
        let slices = self.server.objects::<EndpointSlice>();
        let workloads: Vec<&ExternalWorkload> = workloads.iter().collect();
        let slices: Vec<&EndpointSlice> = slices.iter().collect();
        let rules = reference::Rules::default();
        let mut pending = Vec::new();
        for service in &services {
            let faults = reference::judge(service, &workloads, &slices, &rules);
            if let Some(first) = faults.first() {
                pending.push(format!(
                    "{}/{}: {} fault(s), first {first}",
                    service.metadata.namespace.as_deref().unwrap_or_default(),
                    service.metadata.name.as_deref().unwrap_or_default(),
                    faults.len(),
                ));
            }
        }
        pending
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

    async fn change(&mut self, change: &Change) {
        match change {
            Change::CreateWorkload(spec) => self.create_workload(spec).await,
            Change::DeleteWorkload { namespace, name } => {
                let _ = self
                    .workloads(*namespace)
                    .delete(name, &DeleteParams::default())
                    .await;
            }
            Change::RecreateWorkload { namespace, name } => {
                let api = self.workloads(*namespace);
                let Ok(old) = api.get(name).await else {
                    return;
                };
                let _ = api.delete(name, &DeleteParams::default()).await;
                let mut new = old.clone();
                new.metadata = kube::api::ObjectMeta {
                    name: old.metadata.name.clone(),
                    namespace: old.metadata.namespace.clone(),
                    labels: old.metadata.labels.clone(),
                    ..Default::default()
                };
                let ready = ready_of(&old);
                if let Ok(created) = api.create(&PostParams::default(), &new).await {
                    self.set_ready(*namespace, created, ready).await;
                }
            }
            Change::Relabel {
                namespace,
                name,
                app,
            } => {
                self.edit_workload(*namespace, name, |workload| {
                    workload
                        .metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert("app".to_string(), APPS[*app].to_string());
                })
                .await;
            }
            Change::Readdress {
                namespace,
                name,
                ip,
            } => {
                self.edit_workload(*namespace, name, |workload| {
                    if let Some(first) = workload.spec.workload_ips.first_mut() {
                        first.ip = format!("10.{}.0.{ip}", namespace + 1);
                    }
                })
                .await;
            }
            Change::Readiness {
                namespace,
                name,
                ready,
            } => {
                if let Ok(workload) = self.workloads(*namespace).get(name).await {
                    self.set_ready(*namespace, workload, *ready).await;
                }
            }
            Change::Rezone {
                namespace,
                name,
                zone,
            } => {
                self.edit_workload(*namespace, name, |workload| {
                    workload
                        .metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert(
                            "topology.kubernetes.io/zone".to_string(),
                            ZONES[*zone].to_string(),
                        );
                })
                .await;
            }
            Change::Reselect {
                namespace,
                service,
                app,
            } => {
                self.edit_service(*namespace, *service, |spec| {
                    spec.selector = Some(BTreeMap::from([(
                        "app".to_string(),
                        APPS[*app].to_string(),
                    )]));
                })
                .await;
            }
            Change::Retarget {
                namespace,
                service,
                numeric,
            } => {
                let target = if *numeric {
                    IntOrString::Int(8080)
                } else {
                    IntOrString::String("http".to_string())
                };
                self.edit_service(*namespace, *service, |spec| {
                    if let Some(port) = spec.ports.as_mut().and_then(|ports| ports.first_mut()) {
                        port.target_port = Some(target.clone());
                    }
                })
                .await;
            }
            Change::RecreateService {
                namespace,
                service,
                after,
            } => {
                self.delete_service(*namespace, *service).await;
                self.after(
                    *after,
                    Later::CreateService {
                        namespace: *namespace,
                        service: *service,
                    },
                );
            }
        }
    }

    fn workloads(&self, namespace: usize) -> Api<ExternalWorkload> {
        Api::namespaced(self.driver.clone(), NAMESPACES[namespace])
    }

    fn services(&self, namespace: usize) -> Api<Service> {
        Api::namespaced(self.driver.clone(), NAMESPACES[namespace])
    }

    async fn create_workload(&self, spec: &WorkloadSpec) {
        let namespace = NAMESPACES[spec.namespace];
        let mut builder = Workload::named(&spec.name)
            .namespace(namespace)
            .label("app", APPS[spec.app])
            .zone(ZONES[spec.zone])
            .ip(&format!("10.{}.0.{}", spec.namespace + 1, spec.ip))
            .port("http", 8080);
        if spec.dual_stack {
            builder = builder.ip(&format!("fd00:{}::{:x}", spec.namespace + 1, spec.ip));
        }
        let mut workload = builder.build();
        workload.metadata.uid = None;
        workload.status = None;
        let api = self.workloads(spec.namespace);
        if let Ok(created) = api.create(&PostParams::default(), &workload).await {
            self.set_ready(spec.namespace, created, spec.ready).await;
        }
    }

    async fn set_ready(&self, namespace: usize, mut workload: ExternalWorkload, ready: bool) {
        let builder = Workload::named("status");
        let with_status = if ready {
            builder.ready()
        } else {
            builder.not_ready()
        }
        .build();
        workload.status = with_status.status;
        let name = workload.metadata.name.clone().unwrap_or_default();
        let _ = self
            .workloads(namespace)
            .replace_status(&name, &PostParams::default(), &workload)
            .await;
    }

    async fn edit_workload(
        &self,
        namespace: usize,
        name: &str,
        edit: impl FnOnce(&mut ExternalWorkload),
    ) {
        let api = self.workloads(namespace);
        let Ok(mut workload) = api.get(name).await else {
            return;
        };
        edit(&mut workload);
        let _ = api.replace(name, &PostParams::default(), &workload).await;
    }

    async fn create_service(&self, namespace: usize, service: usize) {
        let name = SERVICES[service];
        let mut builder = Svc::named(name)
            .namespace(NAMESPACES[namespace])
            .selector("app", APPS[service])
            .port("http", 80, "http");
        if name == "db" {
            builder = builder.families(&["IPv4", "IPv6"]);
        }
        let mut object = builder.build();
        object.metadata.uid = None;
        if let Some(spec) = object.spec.as_mut() {
            spec.cluster_ip = None;
        }
        let _ = self
            .services(namespace)
            .create(&PostParams::default(), &object)
            .await;
    }

    async fn edit_service(
        &self,
        namespace: usize,
        service: usize,
        edit: impl FnOnce(&mut k8s_openapi::api::core::v1::ServiceSpec),
    ) {
        let api = self.services(namespace);
        let name = SERVICES[service];
        let Ok(mut object) = api.get(name).await else {
            return;
        };
        if let Some(spec) = object.spec.as_mut() {
            edit(spec);
        }
        let _ = api.replace(name, &PostParams::default(), &object).await;
    }

    /// The garbage collector: deletes managed slices whose owner Service no longer exists (a
    /// write planned before the Service's deletion can land after it, and the real collector
    /// removes such a slice too, by its owner reference).
    async fn collect_garbage(&self) {
        let services: Vec<String> = self
            .server
            .objects::<Service>()
            .into_iter()
            .filter_map(|service| service.metadata.uid)
            .collect();
        for slice in self.managed_slices() {
            let orphan = slice
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|owners| {
                    owners
                        .iter()
                        .any(|owner| owner.kind == "Service" && !services.contains(&owner.uid))
                });
            if orphan {
                let namespace = slice.metadata.namespace.clone().unwrap_or_default();
                let name = slice.metadata.name.clone().unwrap_or_default();
                let slices: Api<EndpointSlice> = Api::namespaced(self.driver.clone(), &namespace);
                let _ = slices.delete(&name, &DeleteParams::default()).await;
            }
        }
    }

    /// Deletes a Service and, as the garbage collector would, the slices it owns.
    async fn delete_service(&self, namespace: usize, service: usize) {
        let api = self.services(namespace);
        let name = SERVICES[service];
        let Ok(object) = api.get(name).await else {
            return;
        };
        let _ = api.delete(name, &DeleteParams::default()).await;
        let uid = object.metadata.uid.unwrap_or_default();
        let slices: Api<EndpointSlice> =
            Api::namespaced(self.driver.clone(), NAMESPACES[namespace]);
        for slice in self.managed_slices() {
            let owned = slice
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|owners| owners.iter().any(|owner| owner.uid == uid));
            if owned {
                let name = slice.metadata.name.unwrap_or_default();
                let _ = slices.delete(&name, &DeleteParams::default()).await;
            }
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

fn ready_of(workload: &ExternalWorkload) -> bool {
    workload.status.as_ref().is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
    })
}

fn humantime_secs(duration: Duration) -> String {
    format!("{}s", duration.as_secs())
}
