//! The HTTP-aware proxy against a real API server: a watch through it stalls (or freezes) while
//! other requests pass, a held request waits for its hold, a cut or a blackhole refuses or
//! silences requests until restored; and the API server's audit log names the user behind
//! each slice write made through it.
//!
//! These tests start a control plane of their own, with the audit log on.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    core::v1::ConfigMap,
    discovery::v1::{Endpoint, EndpointSlice},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, PostParams, WatchEvent, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use testbed::Testbed;
use tokio::time::Instant;

use harness::{
    CONVERGE, eventually,
    proxy::{HttpProxy, Mode},
};

/// This binary's control plane, with the audit log on (started on first use).
static PLANE: tokio::sync::OnceCell<Result<Testbed, String>> = tokio::sync::OnceCell::const_new();

/// How long a test waits to see that nothing arrives through a stalled or silenced proxy.
const QUIET: Duration = Duration::from_secs(2);

async fn plane() -> Option<&'static Testbed> {
    if testbed::Binaries::discover().is_err() && !testbed::running_in_ci() {
        eprintln!("proxy tests skipped: run `bash testbed/build.sh`");
        return None;
    }
    let plane = PLANE
        .get_or_init(|| async {
            let options = testbed::Options {
                audit_log: true,
                ..testbed::Options::default()
            };
            Testbed::start(options).await.map_err(|e| e.to_string())
        })
        .await;
    Some(plane.as_ref().unwrap())
}

/// A fresh namespace, a proxy acting as user `user`, and a client talking through it.
async fn through_proxy(testbed: &Testbed, test: &str, user: &str) -> (String, HttpProxy, Client) {
    let namespace = testbed.fresh_namespace(test).await.unwrap();
    let proxy = HttpProxy::start(&testbed.kubeconfig_for(user, 0).unwrap()).await;
    let file = proxy.kubeconfig();
    let kubeconfig = Kubeconfig::read_from(file.path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    (namespace, proxy, Client::try_from(config).unwrap())
}

async fn create_config_map(client: &Client, namespace: &str, name: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &map).await.unwrap();
}

/// The name of the next object event of a watch stream.
async fn next_name(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
) -> String {
    loop {
        match stream.try_next().await.unwrap().expect("the watch ended") {
            WatchEvent::Added(map) | WatchEvent::Modified(map) | WatchEvent::Deleted(map) => {
                return map.name_any();
            }
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(status) => panic!("watch error {status:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_watch_gets_nothing_while_other_requests_pass_then_catches_up() {
    let Some(testbed) = plane().await else { return };
    let admin = testbed.client().await.unwrap();
    let (namespace, proxy, client) = through_proxy(testbed, "proxy-stall", "stall-test").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let version = maps.list(&Default::default()).await.unwrap().metadata;
    let version = version.resource_version.unwrap();
    let mut stream = maps
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();
    create_config_map(&admin, &namespace, "before").await;
    assert_eq!(next_name(&mut stream).await, "before");

    proxy.set(Mode::StallWatches);
    create_config_map(&admin, &namespace, "during").await;
    // A read through the proxy passes and sees it; the watch does not.
    assert!(maps.get_opt("during").await.unwrap().is_some());
    let nothing = tokio::time::timeout(QUIET, next_name(&mut stream)).await;
    assert!(nothing.is_err(), "a stalled watch delivered {nothing:?}");
    // A watch started during the stall gets nothing either (not even its headers).
    let params = WatchParams::default();
    let started = tokio::time::timeout(QUIET, maps.watch(&params, &version));
    assert!(
        started.await.is_err(),
        "a new watch was answered during the stall"
    );

    proxy.restore();
    assert_eq!(next_name(&mut stream).await, "during");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_watch_never_catches_up_while_a_new_one_does() {
    let Some(testbed) = plane().await else { return };
    let admin = testbed.client().await.unwrap();
    let (namespace, proxy, client) = through_proxy(testbed, "proxy-freeze", "freeze-test").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let version = maps.list(&Default::default()).await.unwrap().metadata;
    let version = version.resource_version.unwrap();
    let mut frozen = maps
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();

    proxy.freeze_watches();
    create_config_map(&admin, &namespace, "after-freeze").await;
    let mut fresh = maps
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();
    assert_eq!(next_name(&mut fresh).await, "after-freeze");
    let nothing = tokio::time::timeout(QUIET, next_name(&mut frozen)).await;
    assert!(nothing.is_err(), "a frozen watch delivered {nothing:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_request_waits_for_its_hold_before_it_is_forwarded() {
    let Some(testbed) = plane().await else { return };
    let (namespace, proxy, client) = through_proxy(testbed, "proxy-hold", "hold-test").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    maps.list(&Default::default()).await.unwrap();
    let hold = Duration::from_millis(800);
    proxy.set(Mode::Hold(hold));
    let answered = proxy.requests();
    let sent = Instant::now();
    let held = tokio::spawn({
        let maps = maps.clone();
        async move { maps.get_opt("none").await.unwrap() }
    });
    // Not forwarded before its hold: the API server has not answered it yet half-way.
    tokio::time::sleep(hold / 2).await;
    assert_eq!(proxy.requests(), answered, "forwarded before its hold");
    assert!(held.await.unwrap().is_none());
    let took = sent.elapsed();
    assert!(took >= hold, "answered after {took:?}, held {hold:?}");
    eprintln!("a request held {hold:?} was answered after {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_refuses_and_blackhole_silences_requests_until_restored() {
    let Some(testbed) = plane().await else { return };
    let (namespace, proxy, client) = through_proxy(testbed, "proxy-cut", "cut-test").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    maps.list(&Default::default()).await.unwrap();

    proxy.cut();
    assert!(
        maps.get_opt("none").await.is_err(),
        "a request passed a cut"
    );
    proxy.blackhole();
    let silenced = tokio::time::timeout(QUIET, maps.get_opt("none")).await;
    assert!(silenced.is_err(), "a request was answered in a blackhole");
    let connections = proxy.forwarded();
    proxy.restore();
    eventually("a request through the restored proxy", CONVERGE, || async {
        maps.get_opt("none").await.map_err(|e| e.to_string())
    })
    .await;
    assert!(
        proxy.forwarded() > connections,
        "a new connection after the restore"
    );
    proxy.reset();
    eventually("a request after a reset", CONVERGE, || async {
        maps.get_opt("none").await.map_err(|e| e.to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_log_names_the_user_behind_each_slice_write() {
    let Some(testbed) = plane().await else { return };
    let admin = testbed.client().await.unwrap();
    let (namespace, _proxy, client) = through_proxy(testbed, "proxy-audit", "r7").await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some("audited-".into()),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec!["10.0.0.1".into()],
            ..Endpoint::default()
        }]),
        ..EndpointSlice::default()
    };
    let created = slices.create(&PostParams::default(), &slice).await.unwrap();
    let name = created.name_any();
    let by_admin: Api<EndpointSlice> = Api::namespaced(admin, &namespace);
    by_admin
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();

    let events: Vec<_> = testbed
        .audit_events()
        .unwrap()
        .into_iter()
        .filter(|event| event.namespace == namespace)
        .collect();
    let create = events
        .iter()
        .find(|event| event.verb == "create")
        .expect("the create is recorded");
    assert_eq!(create.user, "r7");
    assert_eq!(create.name, name);
    assert_eq!(create.resource_version, created.metadata.resource_version);
    assert!(create.received.is_some() && create.received <= create.completed);
    let delete = events
        .iter()
        .find(|event| event.verb == "delete")
        .expect("the delete is recorded");
    assert_eq!(
        (delete.user.as_str(), delete.name.as_str()),
        ("admin", name.as_str())
    );
    assert!(
        events
            .iter()
            .all(|event| event.verb != "list" && event.verb != "get"),
        "only writes are recorded"
    );
}
