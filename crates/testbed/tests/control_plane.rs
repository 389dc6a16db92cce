//! The control plane itself: versions, identity, dual-stack Services, kubeconfig.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;

#[tokio::test]
async fn serves_the_pinned_kubernetes_version() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let client = testbed.client().await.unwrap();
    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.git_version, testbed::Versions::pinned().kubernetes);
}

#[tokio::test]
async fn accepts_dual_stack_services() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("dual-stack").await.unwrap();
    let services: Api<Service> = Api::namespaced(testbed.client().await.unwrap(), &namespace);
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "both"},
        "spec": {
            "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv6", "IPv4"],
            "selector": {"app": "x"},
            "ports": [{"port": 80}],
        }
    }))
    .unwrap();
    let created = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let ips = created.spec.unwrap().cluster_ips.unwrap();
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(ips[0].contains(':'), "IPv6 first: {ips:?}");
}
