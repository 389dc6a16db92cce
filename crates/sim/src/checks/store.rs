//! The checks' view of the API's store, kept from its record of every applied write (Services,
//! workloads, slices, each slice's recent writers), and each write handed to the check it
//! concerns.

use std::collections::BTreeSet;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use slices::{LAST_CHANGE_TRIGGER_TIME_ANNOTATION, SERVICE_NAME_LABEL};
use tokio::time::Instant;

use super::{
    Checks, State,
    removals::{Pass, SliceWrite},
};

// === impl Checks ===

impl Checks {
    /// The API applied a write (any caller): keeps the checks' view of the store, and checks (c).
    pub fn applied(&self, applied: &apisim::Applied) {
        let mut state = self.state.lock();
        match applied.plural.as_str() {
            "leases" => {
                self.lease_applied(&mut state, applied);
                self.leaders(&mut state);
            }
            "services" => {
                let key = key_of(applied);
                let service = decode::<Service>(applied);
                let uid = |service: Option<&Service>| service.and_then(|s| s.metadata.uid.clone());
                // Another incarnation of the Service (deleted, or created again under its name):
                // the workloads its slices held belonged to the one before, whose slices go with
                // it; none of them is a removal this one's writes can publish.
                if uid(service.as_ref()) != uid(state.services.get(&key)) {
                    state.present.remove(&key);
                }
                match service {
                    Some(service) => state.services.insert(key, service),
                    None => state.services.remove(&key),
                };
            }
            "externalworkloads" => {
                let old_uid = applied.old.as_ref().and_then(uid_of);
                if let Some(uid) = old_uid {
                    state.workloads.remove(&uid);
                }
                if let Some(workload) = decode::<ExternalWorkload>(applied) {
                    let uid = workload.metadata.uid.clone().unwrap_or_default();
                    let labels = workload.metadata.labels.clone().unwrap_or_default();
                    state
                        .workloads
                        .insert(uid, (applied_namespace(applied), labels));
                }
            }
            "endpointslices" => self.slice_applied(&mut state, applied),
            _ => {}
        }
        if matches!(applied.plural.as_str(), "services" | "externalworkloads") {
            state.forget_wanted_again();
        }
    }

    /// A slice was written by anyone: the store view, then check (c) for its Service.
    fn slice_applied(&self, state: &mut State, applied: &apisim::Applied) {
        let key = key_of(applied);
        let old = state.slices.get(&key).cloned();
        match decode::<EndpointSlice>(applied) {
            Some(slice) => state.slices.insert(key.clone(), slice),
            None => state.slices.remove(&key),
        };
        state.last_slice_write = Instant::now();
        state.slice_writes += 1;
        let history = state.slice_history.entry(key.clone()).or_default();
        history.push((state.slice_writes, applied.caller.clone()));
        if history.len() > 16 {
            history.remove(0);
        }
        let services: BTreeSet<String> = old
            .iter()
            .chain(state.slices.get(&key))
            .filter_map(service_of)
            .collect();
        let by_replica = state.replica_named(&applied.caller).is_some();
        let orphan = state
            .slices
            .get(&key)
            .is_some_and(|slice| !state.owner_exists(&key.0, slice));
        let writer = format!(
            "{} at {:.3}s (revision {}, slice {})",
            applied.caller,
            (Instant::now() - self.started).as_secs_f64(),
            applied.revision,
            key.1
        );
        let pass = state
            .slices
            .get(&key)
            .filter(|_| by_replica)
            .and_then(|slice| {
                slice
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)
            })
            .map(|trigger| Pass {
                caller: applied.caller.clone(),
                trigger: trigger.clone(),
            });
        let write = SliceWrite {
            writer,
            by_replica,
            orphan,
            pass,
        };
        for service in services {
            self.check_removals(state, &key.0, &service, &write);
        }
    }
}

fn key_of(applied: &apisim::Applied) -> (String, String) {
    (applied_namespace(applied), applied.name.clone())
}

fn applied_namespace(applied: &apisim::Applied) -> String {
    applied.namespace.clone().unwrap_or_default()
}

fn decode<K: serde::de::DeserializeOwned>(applied: &apisim::Applied) -> Option<K> {
    serde_json::from_value(applied.new.clone()?).ok()
}

fn uid_of(value: &serde_json::Value) -> Option<String> {
    value
        .pointer("/metadata/uid")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

pub(super) fn service_of(slice: &EndpointSlice) -> Option<String> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .cloned()
}

/// The uids of the workloads a slice's endpoints point at.
pub(super) fn uids(slice: &EndpointSlice) -> Vec<String> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|endpoint| endpoint.target_ref.as_ref()?.uid.clone())
        .collect()
}
