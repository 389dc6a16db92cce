//! The core resources the controller relies on behave as it expects on the testbed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SERVICE_NAME: &str = "kubernetes.io/service-name";
const CONTROLLER: &str = "linkerd-external-workloads-controller";

fn slice(generate_name: &str, managed_by: &str, service: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {
            "generateName": generate_name,
            "labels": {MANAGED_BY: managed_by, SERVICE_NAME: service},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.10"], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

#[tokio::test]
async fn endpoint_slices_are_found_by_our_labels() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("slices").await.unwrap();
    let api: Api<EndpointSlice> = Api::namespaced(testbed.client().await.unwrap(), &namespace);

    let ours = api
        .create(
            &PostParams::default(),
            &slice("linkerd-external-x-", CONTROLLER, "x"),
        )
        .await
        .unwrap();
    // Same Service, another manager; and our manager, another Service.
    api.create(
        &PostParams::default(),
        &slice("other-x-", "someone-else", "x"),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &slice("linkerd-external-y-", CONTROLLER, "y"),
    )
    .await
    .unwrap();

    let selector = format!("{MANAGED_BY}={CONTROLLER},{SERVICE_NAME}=x");
    let found = api
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    let ours = ours.metadata.name.unwrap();
    assert!(ours.starts_with("linkerd-external-x-"), "{ours}");
    let names: Vec<_> = found
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, [ours]);
    assert_eq!(
        found.items[0].endpoints.as_ref().unwrap()[0].addresses,
        ["192.0.2.10"]
    );
}

#[tokio::test]
async fn lease_update_with_a_stale_resource_version_conflicts() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(testbed.client().await.unwrap(), &namespace);

    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &lease).await.unwrap();

    // Candidate b writes first, with the current resourceVersion: accepted.
    let mut by_b = created.clone();
    by_b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let updated = api
        .replace("leader", &PostParams::default(), &by_b)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );

    // Candidate c still holds the old resourceVersion: refused with 409 Conflict.
    let mut by_c = created;
    by_c.spec.as_mut().unwrap().holder_identity = Some("c".into());
    match api.replace("leader", &PostParams::default(), &by_c).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409, "{status:?}");
            assert_eq!(status.reason, "Conflict", "{status:?}");
        }
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
    let holder = api
        .get("leader")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("b"));
}
