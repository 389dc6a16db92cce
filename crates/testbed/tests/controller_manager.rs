//! The optional kube-controller-manager: garbage collection and namespace deletion work when
//! it runs. Skipped unless it was built (`TESTBED_BUILD_KCM=1 bash testbed/build.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use testbed::{Binaries, Options, Testbed};

/// Polls `gone` every 200 ms for up to a minute.
async fn eventually<F, Fut>(what: &str, mut gone: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while !gone().await {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what} within 60 s");
}

#[tokio::test]
async fn garbage_collection_and_namespace_deletion_work() {
    if !Binaries::discover().is_ok_and(|b| b.kube_controller_manager.is_some()) {
        let _ = writeln!(
            std::io::stderr(),
            "controller-manager test skipped: run `TESTBED_BUILD_KCM=1 bash testbed/build.sh`"
        );
        return;
    }
    let options = Options {
        controller_manager: true,
        ..Options::default()
    };
    let testbed = Testbed::start(options).await.unwrap();
    let _logs = testbed.log_guard();
    assert!(testbed.has_controller_manager());
    let client = testbed.client().await.unwrap();
    let namespace = testbed.fresh_namespace("gc").await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);

    let owner = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let dependent: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "dependent",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                             "uid": owner.metadata.uid.unwrap()}],
    }}))
    .unwrap();
    maps.create(&PostParams::default(), &dependent)
        .await
        .unwrap();

    maps.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the dependent is garbage-collected", || async {
        matches!(maps.get_opt("dependent").await, Ok(None))
    })
    .await;

    let namespaces: Api<Namespace> = Api::all(client);
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace is deleted", || async {
        matches!(namespaces.get_opt(&namespace).await, Ok(None))
    })
    .await;
}
