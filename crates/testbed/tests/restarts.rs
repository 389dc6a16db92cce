//! Control-plane faults for tests: servers killed and restarted on the same port and data, a
//! second API server on the same etcd, etcd compaction reaching a watch as 410 Gone. One
//! control plane of this test's own (the shared one must not go down under other tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use testbed::{Options, Server, Testbed};

#[tokio::test]
async fn servers_restart_on_their_port_and_data_and_compaction_expires_watches() {
    if testbed::Binaries::discover().is_err() && !testbed::running_in_ci() {
        eprintln!("skipped: run `bash testbed/build.sh`");
        return;
    }
    let options = Options {
        apiserver_args: vec!["--watch-cache=false".to_string()],
        ..Options::default()
    };
    let testbed = Testbed::start(options).await.unwrap();
    let _logs = testbed.log_guard();
    let namespace = testbed.fresh_namespace("restarts").await.unwrap();
    let maps = |client| Api::<ConfigMap>::namespaced(client, &namespace);
    let created = maps(testbed.client().await.unwrap())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kept"}})).unwrap(),
        )
        .await
        .unwrap();
    let url = testbed.server_url().to_string();

    // etcd killed and restarted: the object is still there (data kept).
    testbed.kill(Server::Etcd).await.unwrap();
    testbed.restart(Server::Etcd).await.unwrap();
    let api = maps(testbed.client().await.unwrap());
    let mut found = None;
    for _ in 0..300 {
        if let Ok(Some(map)) = api.get_opt("kept").await {
            found = Some(map);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        found.and_then(|map| map.metadata.uid),
        created.metadata.uid,
        "the object survived etcd's restart"
    );

    // kube-apiserver killed: unreachable; restarted on the same URL, serving again.
    testbed.kill(Server::ApiServer(0)).await.unwrap();
    assert!(api.get_opt("kept").await.is_err(), "the API server is down");
    testbed.restart(Server::ApiServer(0)).await.unwrap();
    assert_eq!(testbed.server_url(), url);
    assert!(api.get_opt("kept").await.unwrap().is_some());

    // A second API server on the same etcd sees the same objects.
    let index = testbed.add_apiserver().await.unwrap();
    assert_eq!(index, 1);
    let mut config = testbed.config();
    config.cluster_url = testbed.apiserver_url(1).unwrap().parse().unwrap();
    let other = maps(kube::Client::try_from(config).unwrap());
    assert!(other.get_opt("kept").await.unwrap().is_some());

    // Compaction past a watch's resourceVersion: resuming from it is answered 410 Gone.
    let old = created.metadata.resource_version.clone().unwrap();
    for round in 0..2 {
        let mut map = api.get("kept").await.unwrap();
        map.data = Some([("round".to_string(), round.to_string())].into());
        api.replace("kept", &PostParams::default(), &map)
            .await
            .unwrap();
    }
    let revision = testbed.compact_etcd().await.unwrap();
    assert!(revision > old.parse::<i64>().unwrap());
    let gone = match api.watch(&WatchParams::default(), &old).await {
        Err(kube::Error::Api(status)) => status.code == 410,
        Ok(stream) => {
            let mut stream = stream.boxed();
            matches!(stream.try_next().await, Ok(Some(WatchEvent::Error(status))) if status.code == 410)
        }
        Err(_) => false,
    };
    assert!(
        gone,
        "a watch from a compacted resourceVersion gets 410 Gone"
    );
}
