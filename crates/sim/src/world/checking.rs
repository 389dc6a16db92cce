//! What the world looks at for the checks, beside what the API server and the links report:
//! every second, the calm duplicate check (d), the published side of (c) and each replica's
//! `/ready` (f); after the heal, convergence and rest (e).

use std::time::Duration;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use leadership::LeaseTimings;
use tokio::time::Instant;

use super::{CONVERGENCE_BOUND, UNWANTED_BOUND, World};
use crate::{checks::Check, reference};

/// The resources the replicas cache, by the names the API server's caches go by.
const CACHED: [&str; 3] = [
    "services",
    "externalworkloads.workload.linkerd.io",
    "endpointslices.discovery.k8s.io",
];

/// How often convergence is looked at.
const CONVERGENCE_POLL: Duration = Duration::from_millis(250);
/// How long past the stall bound a replica may take to notice a silent watch and stop
/// reporting ready (its watch loop looks every few seconds).
const READY_NOTICE: Duration = Duration::from_secs(5);

// === impl World ===

impl World {
    /// The periodic look, `elapsed` after the last: (d) if the world is calm, the published
    /// side of (c), and (f) for every replica that answers.
    pub(super) fn look(&self, elapsed: Duration) {
        self.quiet_check();
        // Time counts while the acting leader can both know and write: its link is up, and none
        // of its caches is blind within the stall bound (the controller's stated remedy for a
        // silent watch; time past the bound counts again, so a stall never noticed is still
        // found). Stalls one after another blind a leader for longer than one bound (seed 6610:
        // four in 63 s, a lagging kind between them).
        let may_write = self.checks.acting_leader().is_some_and(|leader| {
            self.replicas[leader].link.reachable() && !self.checks.blind_within_bound(leader)
        });
        self.checks
            .check_published(elapsed, may_write, UNWANTED_BOUND);
        for replica in &self.replicas {
            if let Some(ready) = replica.ready() {
                self.checks.check_ready(replica.index, ready, READY_NOTICE);
            }
        }
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

    /// (e): waits until every Service's slices keep the reference's rules and the replicas have
    /// settled; `None` (a violation) if that takes longer than [`CONVERGENCE_BOUND`].
    pub(super) async fn converge(&self, healed_at: Instant) -> Option<Duration> {
        let mut writes_at_last_look = None;
        // Since when the slices have kept the rules with no write on its way and every replica
        // seeing the present: after the heal nothing changes but what the replicas write, so a
        // later look that finds a rule broken saw a write planned from a view older than the
        // slices (the fault the acquisition barrier prevents, among others). While a replica is
        // still behind, what it writes is its catching up, in the order the changes were made
        // (seed 29133: both halves of a readiness flap through a lagging server cache).
        let mut kept_since = None;
        let mut drifted = false;
        loop {
            // Converged: the slices keep the rules, and nothing the faults left behind can still
            // make a replica write, so what follows is rest:
            // - no request or answer is still on its way (a write held by a fault may land now;
            //   a read whose answer a fault held can still make its pass write: seed 15573, a
            //   clause-3 read answered 2.35 s late by a slow link, and the addition it confirmed
            //   landed after convergence);
            // - every replica sees the present: no watch stream still silently stalled (the
            //   replica replaces it within the stall bound) and no frame a lag still holds
            //   (seeds 16867, 31831: a replica caught up after convergence and wrote);
            // - no slice write since the last look (the writes that catching up causes).
            let pending = self.unconverged();
            let on_the_wire = self
                .replicas
                .iter()
                .any(|replica| replica.link.exchanges_in_flight() > 0);
            // The API server's own watch caches too: an instance lagging behind the store still
            // holds changes made before the heal from every watch it serves (seed 29133: a
            // readiness flap 1.3 s before the heal reached the leader 1.6 s late, after the
            // slices had kept the rules, and it wrote both halves of it).
            let behind = self
                .replicas
                .iter()
                .any(|replica| replica.link.faulty() || replica.link.undelivered_frames() > 0)
                || !CACHED
                    .iter()
                    .all(|cached| self.server.cache_caught_up(cached));
            let (_, writes) = self.checks.slice_writes();
            let wrote = writes_at_last_look.replace(writes) != Some(writes);
            match kept_since {
                None if pending.is_empty() && !on_the_wire && !behind => {
                    kept_since = Some(Instant::now());
                }
                Some(since) if !pending.is_empty() && !drifted => {
                    drifted = true;
                    self.checks.report(
                        Check::NotConverged,
                        format!(
                            "drifted after the faults stopped: the slices kept the rules from {:.3}s, then {}",
                            (since - healed_at).as_secs_f64(),
                            pending.join("; ")
                        ),
                    );
                }
                _ => {}
            }
            if pending.is_empty() && !on_the_wire && !behind && !wrote {
                return Some(Instant::now() - healed_at);
            }
            if Instant::now() - healed_at >= CONVERGENCE_BOUND {
                let mut pending = pending;
                if on_the_wire {
                    pending.push("a request or its answer still on its way".to_string());
                }
                if behind {
                    pending.push(
                        "a replica still behind (a stalled stream, a lag, a lagging server cache)"
                            .to_string(),
                    );
                }
                if wrote {
                    pending.push("still writing".to_string());
                }
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
    pub(super) async fn rest(&self) {
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
    /// [`mod@reference`] (not by the controller's planner), with the first broken rule of each.
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
}

fn humantime_secs(duration: Duration) -> String {
    format!("{}s", duration.as_secs())
}
