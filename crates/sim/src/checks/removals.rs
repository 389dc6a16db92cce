//! Check (c), nothing deleted comes back: the removals replicas' writes publish, a write that
//! undoes one (and its excuses: [`Known::OwnerGone`], a stalled watch within its bound, a late
//! write's own), and the endpoints that stay published though unwanted.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::api::discovery::v1::EndpointSlice;

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
    /// it (and know: none of its caches blind within the stall bound).
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

    /// Check (c) for one Service after `write` to its slices.
    pub(super) fn check_removals(
        &self,
        state: &mut State,
        namespace: &str,
        service: &str,
        write: &SliceWrite,
    ) {
        let (writer, by_replica, orphan) = (write.writer.as_str(), write.by_replica, write.orphan);
        let pass = write.pass.as_ref();
        let key = (namespace.to_string(), service.to_string());
        // A pass's writes are one decision: what its first writes leave out, a later write of
        // the same pass may put into another slice (simulation seed 2695). Another write ends
        // the pass, and what it left out is published as removed.
        let same_pass =
            pass.is_some() && state.pending.get(&key).map(|pending| &pending.pass) == pass;
        if !same_pass && let Some(pending) = state.pending.remove(&key) {
            for (uid, published) in pending.left_out {
                let entry = (key.0.clone(), key.1.clone(), uid);
                if !state.wanted(&entry.0, &entry.1, &entry.2) {
                    state.removed.entry(entry).or_insert(published);
                }
            }
        }
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
        // selected (someone else's edit publishes nothing).
        if by_replica {
            for uid in state.candidates(namespace, service) {
                let entry = (namespace.to_string(), service.to_string(), uid);
                let pending = state
                    .pending
                    .get(&key)
                    .is_some_and(|pending| pending.left_out.contains_key(&entry.2));
                if !present.contains(&entry.2)
                    && !wanted(&entry.2)
                    && !state.removed.contains_key(&entry)
                    && !pending
                {
                    newly_removed.push((entry, writer.to_string()));
                }
            }
        }
        for entry in wanted_again {
            state.removed.remove(&entry);
        }
        match pass {
            // Published when the pass ends, unless a later write of it puts them back.
            Some(pass) => {
                let pending = state.pending.entry(key.clone()).or_insert_with(|| Pending {
                    pass: pass.clone(),
                    left_out: BTreeMap::new(),
                });
                pending.left_out.retain(|uid, _| !present.contains(uid));
                pending.left_out.extend(
                    newly_removed
                        .into_iter()
                        .map(|((_, _, uid), published)| (uid, published)),
                );
                if pending.left_out.is_empty() {
                    state.pending.remove(&key);
                }
            }
            None => state.removed.extend(newly_removed),
        }
        state.seen_in(namespace, service, &present, by_replica);
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

/// A slice write, as check (c) judges it.
pub(super) struct SliceWrite {
    /// Who wrote, when, which revision and slice (for the report).
    pub(super) writer: String,
    /// Whether a replica wrote it (someone else's edit publishes nothing).
    pub(super) by_replica: bool,
    /// Whether the slice names an owner that no longer exists.
    pub(super) orphan: bool,
    /// The pass a replica's create or update belongs to (its writer and the trigger time the
    /// pass stamps on every slice it writes); a replica's delete, or someone else's write, has
    /// none.
    pub(super) pass: Option<Pass>,
}

/// One pass of a replica's writes, as the slices it writes show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pass {
    /// Who wrote (the API's record of the caller).
    pub(super) caller: String,
    /// The trigger time the pass stamps on every slice it creates or updates.
    pub(super) trigger: String,
}

/// What the writes of a pass not yet over left out of a Service's slices, unwanted.
pub(super) struct Pending {
    pass: Pass,
    /// Workload uid → who published its removal (if the pass ends without putting it back).
    left_out: BTreeMap<String, String>,
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

    /// Forgets the removals (published, or left out by a pass not yet over) whose workload the
    /// Service selects again: a removal stands only while its workload stays unwanted, and once
    /// it is wanted, putting it back is right.
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
        let pending: Vec<(String, String, String)> = self
            .pending
            .iter()
            .flat_map(|((namespace, service), pending)| {
                pending
                    .left_out
                    .keys()
                    .map(move |uid| (namespace.clone(), service.clone(), uid.clone()))
            })
            .filter(|(namespace, service, uid)| self.wanted(namespace, service, uid))
            .collect();
        for (namespace, service, uid) in pending {
            let key = (namespace, service);
            if let Some(entry) = self.pending.get_mut(&key) {
                entry.left_out.remove(&uid);
                if entry.left_out.is_empty() {
                    self.pending.remove(&key);
                }
            }
        }
    }
}
