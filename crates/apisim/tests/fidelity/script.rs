//! The hand-written script: EndpointSlices only, each step a named expectation (generateName,
//! paging, generation, preconditions, a watch from a version, a streaming list).

use std::{collections::BTreeMap, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams},
};
use serde_json::json;

/// Generated names, by order of appearance, so both servers' random suffixes compare equal.
#[derive(Default)]
struct Names(BTreeMap<String, String>);

impl Names {
    fn of(&mut self, name: &str) -> String {
        let next = format!("generated-{}", self.0.len());
        self.0.entry(name.to_string()).or_insert(next).clone()
    }
}

fn slice(endpoint: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {
            "generateName": "fidelity-",
            "labels": {"app": "fidelity", "kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [endpoint], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

/// The answer to one call: its HTTP status and reason, or what it returned.
fn outcome<T>(result: kube::Result<T>, ok: impl FnOnce(T) -> String) -> String {
    match result {
        Ok(value) => ok(value),
        Err(kube::Error::Api(status)) => format!("error {} {}", status.code, status.reason),
        Err(error) => format!("failed: {error}"),
    }
}

/// The script, run against `client` in `namespace`; returns what it observed, normalised.
pub async fn script(client: Client, namespace: &str) -> Vec<String> {
    let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
    let post = PostParams::default();
    let mut names = Names::default();
    let mut seen = Vec::new();

    // generateName, generation and resourceVersion on create.
    let mut created = Vec::new();
    for address in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
        let slice = api.create(&post, &slice(address)).await.unwrap();
        let name = slice.metadata.name.clone().unwrap();
        seen.push(format!(
            "create {} prefix={} generation={:?} uid={} version={}",
            names.of(&name),
            name.starts_with("fidelity-") && name.len() == "fidelity-".len() + 5,
            slice.metadata.generation,
            slice.metadata.uid.is_some(),
            slice.metadata.resource_version.is_some(),
        ));
        created.push(slice);
    }
    let before_updates = created[2].metadata.resource_version.clone().unwrap();

    // Paged list with a label selector.
    let first = api
        .list(&ListParams::default().labels("app=fidelity").limit(2))
        .await
        .unwrap();
    let token = first
        .metadata
        .continue_
        .clone()
        .filter(|token| !token.is_empty());
    seen.push(format!(
        "page 1: {} items, continue={}",
        first.items.len(),
        token.is_some()
    ));
    let second = api
        .list(
            &ListParams::default()
                .labels("app=fidelity")
                .limit(2)
                .continue_token(token.as_deref().unwrap_or_default()),
        )
        .await
        .unwrap();
    seen.push(format!(
        "page 2: {} items, continue={}",
        second.items.len(),
        second
            .metadata
            .continue_
            .as_deref()
            .is_some_and(|token| !token.is_empty())
    ));
    let none = api
        .list(&ListParams::default().labels("app in (other)"))
        .await
        .unwrap();
    seen.push(format!("set-based selector: {} items", none.items.len()));

    // Optimistic concurrency and generation.
    let mut stale = created[0].clone();
    stale.metadata.resource_version = Some("1".to_string());
    let name0 = created[0].metadata.name.clone().unwrap();
    seen.push(format!(
        "stale update: {}",
        outcome(api.replace(&name0, &post, &stale).await, |_| "ok".into())
    ));
    let mut changed = created[0].clone();
    changed.endpoints.as_mut().unwrap()[0].addresses = vec!["192.0.2.9".to_string()];
    let changed = api.replace(&name0, &post, &changed).await.unwrap();
    seen.push(format!(
        "endpoints changed: generation={:?}",
        changed.metadata.generation
    ));
    let mut annotated = changed.clone();
    annotated.metadata.annotations = Some([("note".to_string(), "x".to_string())].into());
    let annotated = api.replace(&name0, &post, &annotated).await.unwrap();
    seen.push(format!(
        "annotation changed: generation={:?}",
        annotated.metadata.generation
    ));
    let mut relabelled = annotated.clone();
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "a".into());
    let relabelled = api.replace(&name0, &post, &relabelled).await.unwrap();
    seen.push(format!(
        "labels changed: generation={:?}",
        relabelled.metadata.generation
    ));

    // Preconditioned deletes.
    let name1 = created[1].metadata.name.clone().unwrap();
    let delete = |uid: Option<String>, version: Option<String>| DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: version,
        }),
        ..DeleteParams::default()
    };
    let wrong_uid = api
        .delete(&name1, &delete(Some("not-the-uid".into()), None))
        .await;
    seen.push(format!(
        "delete, wrong uid: {}",
        outcome(wrong_uid, |_| "ok".into())
    ));
    let wrong_version = api.delete(&name1, &delete(None, Some("1".into()))).await;
    seen.push(format!(
        "delete, wrong version: {}",
        outcome(wrong_version, |_| "ok".into())
    ));
    let right = api
        .delete(
            &name1,
            &delete(
                created[1].metadata.uid.clone(),
                created[1].metadata.resource_version.clone(),
            ),
        )
        .await;
    seen.push(format!(
        "delete, right preconditions: {}",
        outcome(right, |_| "ok".into())
    ));
    let again = api.delete(&name1, &DeleteParams::default()).await;
    seen.push(format!("delete again: {}", outcome(again, |_| "ok".into())));
    seen.push(format!(
        "get deleted: {}",
        outcome(api.get(&name1).await, |_| "ok".into())
    ));
    let mut named = slice("192.0.2.4");
    named.metadata.generate_name = None;
    named.metadata.name = Some(name0.clone());
    let exists = api.create(&post, &named);
    seen.push(format!(
        "create existing name: {}",
        outcome(exists.await, |_| "ok".into())
    ));

    // A watch from a version: the changes after it, in order, for the selector.
    let params = WatchParams::default().labels("app=fidelity").timeout(5);
    let events: Vec<String> = api
        .watch(&params, &before_updates)
        .await
        .unwrap()
        .take(4)
        .map(|event| match event.unwrap() {
            WatchEvent::Added(s) => format!("ADDED {}", names.of(&s.metadata.name.unwrap())),
            WatchEvent::Modified(s) => format!("MODIFIED {}", names.of(&s.metadata.name.unwrap())),
            WatchEvent::Deleted(s) => format!("DELETED {}", names.of(&s.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => "BOOKMARK".to_string(),
            WatchEvent::Error(status) => format!("ERROR {}", status.code),
        })
        .collect()
        .await;
    seen.push(format!("watch from a version: {events:?}"));

    // A streaming list: the current objects, then a bookmark that ends them.
    let streaming = WatchParams::streaming_lists()
        .labels("app=fidelity")
        .timeout(5);
    let mut initial = Vec::new();
    let mut stream = api.watch(&streaming, "").await.unwrap().boxed();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        match event {
            WatchEvent::Added(s) => {
                initial.push(format!("ADDED {}", names.of(&s.metadata.name.unwrap())))
            }
            WatchEvent::Bookmark(bookmark) => {
                let end = bookmark
                    .metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .cloned();
                initial.push(format!("BOOKMARK initial-events-end={end:?}"));
                break;
            }
            other => initial.push(format!("{other:?}")),
        }
    }
    let objects = initial.len() - 1;
    initial[..objects].sort();
    seen.push(format!("streaming list: {initial:?}"));
    seen
}
