//! Check (c), nothing deleted comes back: the removals replicas' writes publish, a write that
//! undoes one (and its excuses: [`Known::OwnerGone`], a stalled watch within its bound, a late
//! write's own), and the endpoints that stay published though unwanted.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::time::Instant;

use super::{
    Check, Checks, Known, State,
    store::{service_of, uids},
};

// === impl Checks ===

impl Checks {
    /// Check (c), the published side: every endpoint in a Service's slices (of the Service as
    /// it exists: others are the garbage collector's) is selected by it and its workload
    /// exists, or has been for no longer than `bound` of the time a replica could write.
    /// `elapsed` is the time since the last look, `may_write` whether a replica could write in
    /// it.
    pub fn check_published(&self, elapsed: Duration, may_write: bool, bound: Duration) {
        let mut state = self.state.lock();
        let mut unwanted = BTreeSet::new();
        for ((namespace, _), slice) in &state.slices {
            let Some(service) = service_of(slice) else {
                continue;
            };
            if !state.owner_exists(namespace, slice) {
                continue;
            }
            for uid in uids(slice) {
                if !state.wanted(namespace, &service, &uid) {
                    unwanted.insert((namespace.clone(), service.clone(), uid));
                }
            }
        }
        state.unwanted.retain(|key, _| unwanted.contains(key));
        let mut overdue = Vec::new();
        for key in unwanted {
            let (waited, reported) = state.unwanted.entry(key.clone()).or_default();
            if may_write {
                *waited += elapsed;
            }
            if *waited > bound && !*reported {
                *reported = true;
                overdue.push(key);
            }
        }
        for (namespace, service, uid) in overdue {
            let now = match state.workloads.get(&uid) {
                Some((_, labels)) => format!("labels {labels:?}"),
                None => "deleted".to_string(),
            };
            let detail = format!(
                "workload {uid} ({now}) still in the slices of {namespace}/{service} after {}s in which a replica could write",
                bound.as_secs()
            );
            self.violate(&mut state, Check::UnwantedStayed, detail);
        }
    }

    /// Check (c) for one Service after a write to its slices.
    pub(super) fn check_removals(
        &self,
        state: &mut State,
        namespace: &str,
        service: &str,
        replica: Option<&String>,
        writer: &str,
        orphan: bool,
    ) {
        let present: BTreeSet<String> = state
            .slices
            .iter()
            .filter(|((ns, _), slice)| {
                ns == namespace && service_of(slice).as_deref() == Some(service)
            })
            .flat_map(|(_, slice)| uids(slice))
            .collect();
        let wanted = |uid: &str| state.wanted(namespace, service, uid);
        let mut came_back = Vec::new();
        let mut newly_removed = Vec::new();
        let mut wanted_again = Vec::new();
        for (entry, published) in state
            .removed
            .iter()
            .filter(|((ns, svc, _), _)| ns == namespace && svc == service)
        {
            match (present.contains(&entry.2), wanted(&entry.2)) {
                (true, false) => came_back.push((entry.clone(), published.clone())),
                (_, true) => wanted_again.push(entry.clone()),
                (false, false) => {}
            }
        }
        // What a replica's write just left out, because its workload is gone or no longer
        // selected (someone else's edit publishes nothing). A write sent before the change
        // that made the endpoint unwanted did not leave it out for that reason: it was planned
        // without it (the first write of a pass that puts it into another slice, say), and a
        // write planned from reads taken before the change (the same pass's next write, held
        // on the way) putting it back is the read-to-write race that the published side's
        // bound covers, not a removal undone (simulation seed 2695).
        let sent_at = replica
            .and_then(|_| writer.split(' ').next())
            .and_then(|name| state.replica_named(name))
            .and_then(|index| state.replicas[index].landing.as_ref())
            .map(|sent| sent.at());
        if let Some(replica) = replica {
            for uid in state.candidates(namespace, service) {
                let entry = (namespace.to_string(), service.to_string(), uid);
                let sent_after_change = match (sent_at, state.unwanted_since.get(&entry)) {
                    (Some(sent), Some(since)) => sent >= *since,
                    _ => true,
                };
                if !present.contains(&entry.2)
                    && !wanted(&entry.2)
                    && sent_after_change
                    && !state.removed.contains_key(&entry)
                {
                    newly_removed.push((entry, replica.clone()));
                }
            }
        }
        for entry in wanted_again {
            state.removed.remove(&entry);
        }
        state.removed.extend(newly_removed);
        state.seen_in(namespace, service, &present, replica.is_some());
        for (entry, published) in came_back {
            state.removed.remove(&entry);
            let now = match state.workloads.get(&entry.2) {
                Some((_, labels)) => format!("labels {labels:?}"),
                None => "deleted".to_string(),
            };
            let selector = state
                .services
                .get(&(namespace.to_string(), service.to_string()))
                .and_then(|service| service.spec.as_ref()?.selector.clone());
            let detail = format!(
                "workload {} ({now}; selector {selector:?}) came back into the slices of {namespace}/{service} (written by {writer}) after its removal was published by {published}",
                entry.2
            );
            let replica = writer
                .split(' ')
                .next()
                .and_then(|name| state.replica_named(name));
            // A write from an ended tenure brings back what it brings back for the reason check
            // (a) gives it; a stalled watch within its bound is a limitation of its own.
            let late = replica.and_then(|replica| {
                let sent = state.replicas[replica].landing.as_ref()?;
                state.late(replica, sent)?.known
            });
            // Stalled when it lands, or when it was sent (a write held on the way).
            let stalled = replica.is_some_and(|replica| {
                let record = &state.replicas[replica];
                record.stalled_within(self.judge.stall_bound)
                    || record.landing.as_ref().is_some_and(|sent| sent.stalled)
            });
            let known = if orphan {
                Some(Known::OwnerGone)
            } else {
                late.or(stalled.then_some(Known::StalledWatchWithinBound))
            };
            self.record(state, Check::RemovedCameBack, detail, known);
        }
    }
}

// === impl State ===

impl State {
    /// Whether the Service a slice names as its owner exists (the same object: name and uid).
    pub(super) fn owner_exists(&self, namespace: &str, slice: &EndpointSlice) -> bool {
        let Some(service) = service_of(slice) else {
            return true;
        };
        let current = self
            .services
            .get(&(namespace.to_string(), service))
            .and_then(|service| service.metadata.uid.clone());
        slice
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|owners| {
                owners
                    .iter()
                    .filter(|owner| owner.kind == "Service")
                    .all(|owner| Some(&owner.uid) == current.as_ref())
            })
    }

    /// Whether the Service `namespace/service` selects the workload `uid` now.
    fn wanted(&self, namespace: &str, service: &str, uid: &str) -> bool {
        let Some((ns, labels)) = self.workloads.get(uid) else {
            return false;
        };
        let selector = self
            .services
            .get(&(namespace.to_string(), service.to_string()))
            .and_then(|service| service.spec.as_ref()?.selector.as_ref());
        ns == namespace
            && selector.is_some_and(|selector| {
                selector
                    .iter()
                    .all(|(key, value)| labels.get(key) == Some(value))
            })
    }

    /// Workloads ever seen in a Service's slices (the ones whose absence can be a removal).
    /// The workloads in the Service's slices before the write being judged: only a write that
    /// takes one out publishes its removal (a write that leaves alone an endpoint the Service's
    /// slices never held, as the first write of a pass that puts it into another slice, does
    /// not).
    fn candidates(&self, namespace: &str, service: &str) -> Vec<String> {
        self.present
            .get(&(namespace.to_string(), service.to_string()))
            .map(|uids| uids.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records what a slice write left in the Service's slices. Someone else's edit only adds:
    /// an endpoint it took out stays a candidate, so the next replica write that leaves it out
    /// publishes its removal.
    fn seen_in(
        &mut self,
        namespace: &str,
        service: &str,
        present: &BTreeSet<String>,
        by_replica: bool,
    ) {
        let entry = self
            .present
            .entry((namespace.to_string(), service.to_string()))
            .or_default();
        if by_replica {
            entry.clone_from(present);
        } else {
            entry.extend(present.iter().cloned());
        }
    }

    /// After a change of a Service or a workload: notes when each endpoint a Service's slices
    /// hold (or held) stopped being wanted, and forgets that once it is wanted again.
    pub(super) fn note_unwanted(&mut self) {
        let now = Instant::now();
        let held: Vec<(String, String, String)> = self
            .present
            .iter()
            .flat_map(|((namespace, service), uids)| {
                uids.iter()
                    .map(move |uid| (namespace.clone(), service.clone(), uid.clone()))
            })
            .collect();
        for entry in held {
            if !self.wanted(&entry.0, &entry.1, &entry.2) {
                self.unwanted_since.entry(entry).or_insert(now);
            }
        }
        let wanted_again: Vec<_> = self
            .unwanted_since
            .keys()
            .filter(|(namespace, service, uid)| self.wanted(namespace, service, uid))
            .cloned()
            .collect();
        for entry in wanted_again {
            self.unwanted_since.remove(&entry);
        }
    }

    /// Forgets the removals whose workload the Service selects again: a removal stands only
    /// while its workload stays unwanted, and once it is wanted, putting it back is right.
    pub(super) fn forget_wanted_again(&mut self) {
        let wanted: Vec<_> = self
            .removed
            .keys()
            .filter(|(namespace, service, uid)| self.wanted(namespace, service, uid))
            .cloned()
            .collect();
        for entry in wanted {
            self.removed.remove(&entry);
        }
    }
}
