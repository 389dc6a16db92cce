//! The schedule's faults: which replica each strikes, what it does to its link or process,
//! when it ends, and the heal that ends them all.

use std::time::Duration;

use api::v1beta1::ExternalWorkload;
use apisim::ReadRace;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use tokio::time::Instant;

use super::{Later, World};
use crate::{
    link::{AtWrite, Link},
    replica::{LEASE_NAME, LEASE_NAMESPACE},
    schedule::{APPS, Fault, NAMESPACES, SERVICES, Target},
};

/// The prefix of every replica's name, as its requests are attributed.
const REPLICAS: &str = "replica-";
/// The qualified name of the workloads' resource.
const WORKLOADS: &str = "externalworkloads.workload.linkerd.io";

/// The `pick`th of `objects`, wrapping around; `None` when there are none.
fn picked<T>(mut objects: Vec<T>, pick: u64) -> Option<T> {
    if objects.is_empty() {
        return None;
    }
    let index = usize::try_from(pick % objects.len() as u64).unwrap_or(0);
    Some(objects.swap_remove(index))
}

// === impl World ===

impl World {
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

    pub(super) async fn fault(&mut self, fault: &Fault) {
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
            Fault::DeleteLease => self.delete_lease().await,
            Fault::DeleteLeaseUnderPausedLeader { after, lasting } => {
                self.link_fault(Target::Leader, lasting, Link::pause, Later::Unpause);
                self.after(after, Later::DeleteLease);
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
            Fault::CloseWatches { resource } => self.server.close_watches(resource),
            Fault::LagCache {
                instance,
                resource,
                lag,
                lasting,
            } => {
                // An instance the server has (one, without the second instance), or all.
                let instances = match instance {
                    Some(instance) => {
                        let instance = instance % self.instances;
                        instance..instance + 1
                    }
                    None => 0..self.instances,
                };
                for instance in instances.clone() {
                    self.server.lag_cache(instance, resource, lag);
                }
                self.after(
                    lasting,
                    Later::CacheCaughtUp {
                        instances,
                        resource,
                    },
                );
            }
            Fault::RecreateBehindCompaction { service, pick, ip } => {
                self.recreate_behind_compaction(service, pick, ip);
            }
            Fault::RaceServiceRead {
                namespace,
                service,
                app,
            } => self.server.race_read(ReadRace {
                caller: REPLICAS.to_string(),
                resource: "services".to_string(),
                namespace: NAMESPACES[namespace].to_string(),
                name: None,
                target: SERVICES[service].to_string(),
                patch: json!({"spec": {"selector": {"app": APPS[app]}}}),
            }),
            Fault::RaceWorkloadRead {
                namespace,
                pick,
                app,
            } => {
                let Some(workload) = picked(self.workloads_of(namespace), pick) else {
                    return;
                };
                self.server.race_read(ReadRace {
                    caller: REPLICAS.to_string(),
                    resource: WORKLOADS.to_string(),
                    namespace: NAMESPACES[namespace].to_string(),
                    name: None,
                    target: workload.metadata.name.unwrap_or_default(),
                    patch: json!({"metadata": {"labels": {"app": APPS[app]}}}),
                });
            }
        }
    }

    /// The workloads of `namespace`, in name order.
    fn workloads_of(&self, namespace: usize) -> Vec<ExternalWorkload> {
        self.server
            .objects::<ExternalWorkload>()
            .into_iter()
            .filter(|workload| {
                workload.metadata.namespace.as_deref() == Some(NAMESPACES[namespace])
            })
            .collect()
    }

    /// Deletes and creates again one workload (at another address) or Service, behind a
    /// compaction that hides the deletion from every watcher.
    fn recreate_behind_compaction(&self, service: bool, pick: u64, ip: u8) {
        let (resource, object) = if service {
            let Some(object) = picked(self.server.objects::<Service>(), pick) else {
                return;
            };
            ("services", serde_json::to_value(object))
        } else {
            let Some(mut object) = picked(self.server.objects::<ExternalWorkload>(), pick) else {
                return;
            };
            let namespace = NAMESPACES
                .iter()
                .position(|name| object.metadata.namespace.as_deref() == Some(*name))
                .unwrap_or(0);
            if let Some(first) = object.spec.workload_ips.first_mut() {
                first.ip = format!("10.{}.0.{ip}", namespace + 1);
            }
            (WORKLOADS, serde_json::to_value(object))
        };
        let Ok(mut object) = object else {
            return;
        };
        let metadata = object["metadata"].take();
        let namespace = metadata["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = metadata["name"].as_str().unwrap_or_default().to_string();
        object["metadata"] = json!({"labels": metadata["labels"].clone()});
        self.server
            .recreate_behind_compaction(resource, &namespace, &name, object);
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

    pub(super) fn crash(&mut self, index: usize, restart_after: Duration) {
        if self.replicas[index].stopping_or_gone() {
            return;
        }
        self.replicas[index].crash(&self.checks);
        self.after(restart_after, Later::Restart(index));
    }

    pub(super) fn at_write(&mut self, index: usize, what: AtWrite) {
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
        let Some(slice) = picked(self.managed_slices(), pick) else {
            return;
        };
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
        let Some(mut slice) = picked(managed, pick) else {
            return;
        };
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

    pub(super) async fn delete_lease(&self) {
        let leases: Api<Lease> = Api::namespaced(self.driver.clone(), LEASE_NAMESPACE);
        let _ = leases.delete(LEASE_NAME, &DeleteParams::default()).await;
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

    /// Ends every fault and starts every replica that is down; returns when.
    pub(super) async fn heal(&mut self) -> Instant {
        for replica in &self.replicas {
            replica.link.heal();
        }
        *self.conflicts.lock() = 0;
        self.server.disarm();
        self.server.unlag_caches();
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
}
