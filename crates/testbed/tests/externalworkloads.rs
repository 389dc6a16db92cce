//! The ExternalWorkload CRD from `deploy/crds/`, as installed by the testbed: both versions
//! served, list/watch work, and the schema rejects what the design says it must.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Client};
use serde_json::{Value, json};

fn resource(version: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("workload.linkerd.io", version, "ExternalWorkload");
    ApiResource::from_gvk_with_plural(&gvk, "externalworkloads")
}

fn workloads(client: Client, namespace: &str, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &resource(version))
}

/// A valid v1beta1 workload with the given spec overrides.
fn workload(name: &str, spec_overrides: Value) -> DynamicObject {
    let mut spec = json!({
        "meshTLS": {"identity": "vm.default.serviceaccount.identity.linkerd.cluster.local",
                    "serverName": "vm.cluster.local"},
        "ports": [{"name": "http", "port": 8080}],
        "workloadIPs": [{"ip": "192.0.2.10"}],
    });
    for (key, value) in spec_overrides.as_object().cloned().unwrap_or_default() {
        spec[key] = value;
    }
    let mut object = DynamicObject::new(name, &resource("v1beta1"));
    object.metadata.labels = Some([("app".to_string(), "vm".to_string())].into());
    object.data = json!({ "spec": spec });
    object
}

/// The API server's rejection message for `object`, which must be a 422 Invalid.
async fn rejection(api: &Api<DynamicObject>, object: &DynamicObject) -> String {
    match api.create(&PostParams::default(), object).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "expected 422 Invalid, got {status:?}");
            status.message
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn v1beta1_create_get_list() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-v1beta1").await.unwrap();
    let api = workloads(testbed.client().await.unwrap(), &namespace, "v1beta1");

    let created = api
        .create(&PostParams::default(), &workload("vm-1", json!({})))
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["ports"][0]["protocol"], "TCP",
        "defaulted"
    );

    let fetched = api.get("vm-1").await.unwrap();
    assert_eq!(fetched.data["spec"]["workloadIPs"][0]["ip"], "192.0.2.10");
    assert_eq!(
        fetched.data["spec"]["meshTLS"]["serverName"],
        "vm.cluster.local"
    );

    let listed = api
        .list(&ListParams::default().labels("app=vm"))
        .await
        .unwrap();
    let names: Vec<_> = listed
        .items
        .iter()
        .map(|o| o.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["vm-1"]);
}

#[tokio::test]
async fn v1beta1_watch_sees_creations() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-watch").await.unwrap();
    let api = workloads(testbed.client().await.unwrap(), &namespace, "v1beta1");

    let version = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default().timeout(60), &version)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &workload("vm-watched", json!({})))
        .await
        .unwrap();

    let added = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.try_next().await.unwrap() {
            if let WatchEvent::Added(object) = event {
                return object;
            }
        }
        panic!("watch ended without an Added event");
    })
    .await
    .expect("no Added event within 30 s");
    assert_eq!(added.metadata.name.as_deref(), Some("vm-watched"));
}

#[tokio::test]
async fn v1alpha1_is_served() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-v1alpha1").await.unwrap();
    let client = testbed.client().await.unwrap();
    let alpha = workloads(client.clone(), &namespace, "v1alpha1");

    let mut object = DynamicObject::new("vm-alpha", &resource("v1alpha1"));
    object.data = json!({"spec": {
        "meshTls": {"identity": "vm.identity", "serverName": "vm.server"},
        "ports": [{"port": 80}],
        "workloadIPs": [{"ip": "2001:db8::1"}],
    }});
    alpha.create(&PostParams::default(), &object).await.unwrap();

    let fetched = alpha.get("vm-alpha").await.unwrap();
    assert_eq!(
        fetched.types.unwrap().api_version,
        "workload.linkerd.io/v1alpha1"
    );
    assert_eq!(fetched.data["spec"]["workloadIPs"][0]["ip"], "2001:db8::1");
    assert_eq!(fetched.data["spec"]["ports"][0]["port"], 80);
    // Not asserted: `meshTls`. Stored as v1beta1 with no conversion webhook, it is pruned by
    // the storage schema (which spells it `meshTLS`), whichever version reads it back.

    let listed = alpha.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);

    // The same object is visible through the storage version.
    let beta = workloads(client, &namespace, "v1beta1");
    let seen = beta.get("vm-alpha").await.unwrap();
    assert_eq!(seen.data["spec"]["workloadIPs"][0]["ip"], "2001:db8::1");
}

#[tokio::test]
async fn rejects_a_workload_ip_that_is_not_an_ip() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-not-ip").await.unwrap();
    let api = workloads(testbed.client().await.unwrap(), &namespace, "v1beta1");

    let bad = workload("vm-bad", json!({"workloadIPs": [{"ip": "not-an-ip"}]}));
    let message = rejection(&api, &bad).await;
    assert!(message.contains("spec.workloadIPs[0].ip"), "{message}");
    assert!(
        message.contains("must be an IPv4 or IPv6 address"),
        "{message}"
    );
}

#[tokio::test]
async fn rejects_port_zero() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-port-zero").await.unwrap();
    let api = workloads(testbed.client().await.unwrap(), &namespace, "v1beta1");

    let bad = workload("vm-bad", json!({"ports": [{"port": 0}]}));
    let message = rejection(&api, &bad).await;
    assert!(message.contains("spec.ports[0].port"), "{message}");
    assert!(
        message.contains("should be greater than or equal to 1"),
        "{message}"
    );
}

#[tokio::test]
async fn rejects_three_workload_ips() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-three-ips").await.unwrap();
    let api = workloads(testbed.client().await.unwrap(), &namespace, "v1beta1");

    let ips = json!([{"ip": "192.0.2.1"}, {"ip": "2001:db8::1"}, {"ip": "192.0.2.2"}]);
    let message = rejection(&api, &workload("vm-bad", json!({ "workloadIPs": ips }))).await;
    assert!(message.contains("spec.workloadIPs"), "{message}");
    assert!(message.contains("must have at most 2 items"), "{message}");
}

#[tokio::test]
async fn rejects_two_ips_of_one_family() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("ew-same-family").await.unwrap();
    let api = workloads(testbed.client().await.unwrap(), &namespace, "v1beta1");

    let ips = json!([{"ip": "192.0.2.1"}, {"ip": "192.0.2.2"}]);
    let message = rejection(&api, &workload("vm-bad", json!({ "workloadIPs": ips }))).await;
    assert!(
        message.contains("at most one IPv4 and one IPv6 address"),
        "{message}"
    );
}
