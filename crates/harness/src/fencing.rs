//! The API server's fencing policy (`deploy/fencing.yaml`) in tests: the deployed policy and
//! binding, with the match condition pointed at a test's users (client certificates of
//! [`testbed::Testbed::kubeconfig_for`]: no bound token, so the policy compares user names with
//! the Lease holder) and the binding at the test's namespace and Lease.

use std::path::Path;

use k8s_openapi::serde::Deserialize;
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

/// The policy and binding of `deploy/fencing.yaml`, named `fencing-<namespace>`, refusing slice
/// writes in `namespace` by any of `users` who is not the holder of Lease `lease` there.
pub fn policy_for(namespace: &str, lease: &str, users: &[&str]) -> Vec<DynamicObject> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fencing.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut objects: Vec<DynamicObject> = serde_yaml::Deserializer::from_str(&text)
        .map(|document| {
            let value = serde_yaml::Value::deserialize(document).unwrap();
            serde_yaml::from_value(value).unwrap()
        })
        .collect();
    let name = format!("fencing-{namespace}");
    let users: Vec<String> = users.iter().map(|user| format!("'{user}'")).collect();
    for object in &mut objects {
        object.metadata.name = Some(name.clone());
        let spec = &mut object.data["spec"];
        if spec.get("policyName").is_some() {
            spec["policyName"] = json!(name);
            spec["paramRef"]["name"] = json!(lease);
            spec["paramRef"]["namespace"] = json!(namespace);
            spec["matchResources"] = json!({
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            });
        } else {
            let condition = &mut spec["matchConditions"][0]["expression"];
            assert!(
                condition
                    .as_str()
                    .unwrap()
                    .contains("system:serviceaccount:"),
                "the deployed policy matches the controller's ServiceAccount"
            );
            *condition = json!(format!(
                "request.userInfo.username in [{}]",
                users.join(", ")
            ));
        }
    }
    objects
}

fn admission_api(client: &Client, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Creates [`policy_for`]'s objects. The API server loads them asynchronously: wait for a
/// refusal before relying on them.
pub async fn install_policy(client: &Client, namespace: &str, lease: &str, users: &[&str]) {
    for object in policy_for(namespace, lease, users) {
        let kind = object.types.as_ref().unwrap().kind.clone();
        admission_api(client, &kind)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
}

/// A client authenticated as `user` (a client certificate of the testbed's CA).
pub async fn client_as(testbed: &testbed::Testbed, user: &str) -> Client {
    let path = testbed.kubeconfig_for(user, 0).unwrap();
    let kubeconfig = Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}
