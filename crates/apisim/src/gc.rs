//! The garbage collector, when [`ServerConfig::garbage_collection`](crate::ServerConfig) gives
//! it a delay: that long after an object is deleted, its dependents (objects whose
//! `ownerReferences` name its uid) are deleted when no other owner of theirs exists, and lose
//! the reference otherwise, as kube-controller-manager's collector does in the background
//! propagation policy. It writes as `apisim:garbage-collector`, through the observers and the
//! watch caches like any write (no admission: the collector is not fenced).

use std::{
    collections::{BTreeSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use serde_json::Value;
use tokio::time::Instant;

use crate::{Inner, Verb, http::commit_and_announce, kinds::RESOURCES, store::Key};

/// Who the collector's writes are attributed to.
pub const COLLECTOR: &str = "apisim:garbage-collector";

/// Starts the collector on the current runtime; it ends with the server.
pub fn start(inner: &Arc<Inner>, delay: Duration) {
    let weak = Arc::downgrade(inner);
    let mut revisions = inner.revisions.subscribe();
    let mut seen = inner.store.lock().revision;
    tokio::spawn(async move {
        // Owners deleted, with when their dependents are due.
        let mut due: VecDeque<(Instant, String)> = VecDeque::new();
        loop {
            let next = due.front().map(|(at, _)| *at);
            tokio::select! {
                biased;
                changed = revisions.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
            }
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let now = Instant::now();
            let (revision, deleted) = {
                let store = inner.store.lock();
                (store.revision, store.deleted_uids(seen))
            };
            seen = revision;
            due.extend(deleted.into_iter().map(|uid| (now + delay, uid)));
            while due.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, owner)) = due.pop_front() {
                    collect(&inner, &owner);
                }
            }
        }
    });
}

/// Deletes (or detaches) the dependents of the deleted owner `owner`.
fn collect(inner: &Arc<Inner>, owner: &str) {
    let (dependents, living) = {
        let store = inner.store.lock();
        let living: BTreeSet<String> = store
            .objects
            .values()
            .filter_map(|object| object.pointer("/metadata/uid").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        let dependents: Vec<(Key, Value)> = store
            .objects
            .iter()
            .filter(|(_, object)| owners(object).any(|uid| uid == owner))
            .map(|(key, object)| (key.clone(), object.clone()))
            .collect();
        (dependents, living)
    };
    for (key, mut object) in dependents {
        let Some(resource) = RESOURCES
            .into_iter()
            .find(|resource| resource.storage() == (key.0, key.1))
        else {
            continue;
        };
        if owners(&object).any(|uid| living.contains(uid)) {
            if let Some(references) = object
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            {
                references.retain(|reference| {
                    reference
                        .get("uid")
                        .and_then(Value::as_str)
                        .is_some_and(|uid| living.contains(uid))
                });
            }
            commit_and_announce(inner, COLLECTOR, Verb::Update, resource, key, Some(object));
        } else {
            commit_and_announce(inner, COLLECTOR, Verb::Delete, resource, key, None);
        }
    }
}

fn owners(object: &Value) -> impl Iterator<Item = &str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|reference| reference.get("uid").and_then(Value::as_str))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
    use kube::{Api, api::PostParams};
    use serde_json::json;

    use super::*;
    use crate::{ApiServer, ServerConfig};

    fn slice(name: &str, owners: &[&str]) -> EndpointSlice {
        let references: Vec<Value> = owners
            .iter()
            .map(|uid| json!({"apiVersion": "v1", "kind": "Service", "name": "x", "uid": uid}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "ownerReferences": references},
            "addressType": "IPv4", "endpoints": [],
        }))
        .unwrap_or_else(|error| panic!("{error}"))
    }

    #[tokio::test(start_paused = true)]
    async fn dependents_go_a_delay_after_their_last_owner() {
        let server = ApiServer::new(ServerConfig {
            garbage_collection: Some(Duration::from_secs(5)),
            ..ServerConfig::default()
        });
        let collected = Arc::new(AtomicUsize::new(0));
        let count = collected.clone();
        server.observe(move |applied| {
            if applied.caller == COLLECTOR {
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        let services: Api<Service> = Api::namespaced(server.client("driver"), "ns");
        let slices: Api<EndpointSlice> = Api::namespaced(server.client("driver"), "ns");
        let post = PostParams::default();
        let mut uids = Vec::new();
        for name in ["a", "b"] {
            let service = serde_json::from_value(json!({"metadata": {"name": name}}))
                .unwrap_or_else(|error| panic!("{error}"));
            let created = services.create(&post, &service).await;
            uids.push(
                created
                    .ok()
                    .and_then(|s| s.metadata.uid)
                    .unwrap_or_default(),
            );
        }
        for (name, owners) in [
            ("only-a", vec![&uids[0]]),
            ("a-and-b", vec![&uids[0], &uids[1]]),
        ] {
            let owners: Vec<&str> = owners.into_iter().map(String::as_str).collect();
            assert!(slices.create(&post, &slice(name, &owners)).await.is_ok());
        }
        assert!(services.delete("a", &Default::default()).await.is_ok());
        tokio::time::sleep(Duration::from_millis(4_900)).await;
        assert!(
            server.get::<EndpointSlice>("ns", "only-a").is_some(),
            "not before the delay"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            server.get::<EndpointSlice>("ns", "only-a").is_none(),
            "collected"
        );
        let kept = server
            .get::<EndpointSlice>("ns", "a-and-b")
            .unwrap_or_else(|| panic!("another owner lives"));
        let left: Vec<String> = kept
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|reference| reference.uid)
            .collect();
        assert_eq!(left, [uids[1].clone()], "the dangling reference is removed");
        assert_eq!(collected.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_delay_there_is_no_collector() {
        let server = ApiServer::new(ServerConfig::default());
        let services: Api<Service> = Api::namespaced(server.client("driver"), "ns");
        let slices: Api<EndpointSlice> = Api::namespaced(server.client("driver"), "ns");
        let service = serde_json::from_value(json!({"metadata": {"name": "a"}}))
            .unwrap_or_else(|error| panic!("{error}"));
        let uid = services
            .create(&PostParams::default(), &service)
            .await
            .ok()
            .and_then(|s| s.metadata.uid)
            .unwrap_or_default();
        assert!(
            slices
                .create(&PostParams::default(), &slice("s", &[&uid]))
                .await
                .is_ok()
        );
        assert!(services.delete("a", &Default::default()).await.is_ok());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(server.get::<EndpointSlice>("ns", "s").is_some());
    }
}
