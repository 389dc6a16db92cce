//! What the in-memory API server can do beyond answering like kube-apiserver (which
//! `tests/fidelity` holds it to): watch caches that lag, instances behind one address, and the
//! faults it produces. All on paused time: every lag and delay is exact.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
#![allow(clippy::result_large_err)] // the admission hook's answer is a Status, as the real server's

use std::{
    sync::{Arc, atomic::AtomicUsize, atomic::Ordering},
    time::Duration,
};

use apisim::{ApiServer, Instance, LostAnswer, ReadRace, ServerConfig, Verb};
use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
};
use parking_lot::Mutex;
use serde_json::json;

const LEASES: &str = "leases.coordination.k8s.io";

fn two_instances(lag: Duration) -> ApiServer {
    ApiServer::new(ServerConfig {
        instances: vec![Instance::default(), Instance::lagging(lag)],
        ..ServerConfig::default()
    })
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .unwrap()
}

fn leases(server: &ApiServer, caller: &str, instance: usize) -> Api<Lease> {
    Api::namespaced(
        kube::Client::new(server.service_on(caller, instance), "default"),
        "ns",
    )
}

#[tokio::test(start_paused = true)]
async fn a_lagging_instance_serves_cached_reads_and_watches_its_lag_late() {
    let server = two_instances(Duration::from_secs(2));
    let (fresh, lagging) = (leases(&server, "a", 0), leases(&server, "b", 1));
    let mut watch = lagging
        .watch(&WatchParams::default().timeout(60), "0")
        .await
        .unwrap()
        .boxed();
    let created = fresh
        .create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();

    assert!(server.cache(0).get::<Lease>("ns", "l").is_some());
    assert!(server.cache(1).get::<Lease>("ns", "l").is_none(), "not yet");
    let cached = lagging
        .list(&ListParams::default().match_any())
        .await
        .unwrap();
    assert!(cached.items.is_empty(), "resourceVersion=0 reads the cache");
    let consistent = lagging.list(&ListParams::default()).await.unwrap();
    assert_eq!(consistent.items.len(), 1, "a consistent read does not");

    let Some(Ok(WatchEvent::Added(seen))) = watch.next().await else {
        panic!("an ADDED event");
    };
    assert_eq!(seen.metadata.uid, created.metadata.uid);
    assert_eq!(started.elapsed(), Duration::from_secs(2), "the cache's lag");
    assert!(server.cache(1).get::<Lease>("ns", "l").is_some());
}

#[tokio::test(start_paused = true)]
async fn bookmarks_carry_the_version_of_the_lagging_cache_not_the_store() {
    let server = two_instances(Duration::from_secs(2));
    let lagging = leases(&server, "b", 1);
    let services: Api<Service> = Api::namespaced(server.client("driver"), "ns");
    let mut params = WatchParams::default().timeout(10);
    params.bookmarks = true;
    let mut watch = lagging.watch(&params, "0").await.unwrap().boxed();
    // A write of another resource at 3 s is in the Lease cache's version from 5 s on; one at
    // 7 s is not yet when the bookmark before the timeout goes out (at 8 s, the cache at 6 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let early = services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "early"}})).unwrap(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap(),
        )
        .await
        .unwrap();
    let Some(Ok(WatchEvent::Bookmark(bookmark))) = watch.next().await else {
        panic!("a bookmark");
    };
    assert_eq!(
        bookmark.metadata.resource_version,
        early.metadata.resource_version.unwrap(),
        "the cache's version: past the store's newest Lease, short of its newest write"
    );
    assert_eq!(
        server.revision(),
        bookmark.metadata.resource_version.parse::<u64>().unwrap() + 1
    );
}

#[tokio::test(start_paused = true)]
async fn a_fencing_policy_reads_the_lease_as_the_serving_instance_caches_it() {
    let server = ApiServer::new(ServerConfig {
        instances: vec![
            Instance::default(),
            Instance::default().with_lag(LEASES, Duration::from_secs(1)),
        ],
        ..ServerConfig::default()
    });
    let holders = Arc::new(Mutex::new(Vec::new()));
    let seen = holders.clone();
    server.admit(move |request| {
        if request.plural == "endpointslices" {
            let holder = request
                .cache
                .get::<Lease>("ns", "fence")
                .and_then(|lease| lease.spec?.holder_identity);
            seen.lock().push((request.cache.instance(), holder));
        }
        Ok(())
    });
    let fresh = leases(&server, "a", 0);
    let stored = fresh
        .create(&PostParams::default(), &lease("fence", "a"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut moved = stored.clone();
    moved.spec.as_mut().unwrap().holder_identity = Some("b".into());
    fresh
        .replace("fence", &PostParams::default(), &moved)
        .await
        .unwrap();

    let slice = |name: &str| -> EndpointSlice {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "addressType": "IPv4", "endpoints": []}),
        )
        .unwrap()
    };
    for instance in [0, 1] {
        let slices: Api<EndpointSlice> = Api::namespaced(
            kube::Client::new(server.service_on("b", instance), "default"),
            "ns",
        );
        slices
            .create(&PostParams::default(), &slice(&format!("now-{instance}")))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slices: Api<EndpointSlice> = Api::namespaced(
        kube::Client::new(server.service_on("b", 1), "default"),
        "ns",
    );
    slices
        .create(&PostParams::default(), &slice("later"))
        .await
        .unwrap();
    assert_eq!(
        *holders.lock(),
        [
            (0, Some("b".to_string())),
            (1, Some("a".to_string())),
            (1, Some("b".to_string()))
        ],
        "the lagging instance's policy saw the old holder for a second"
    );
}

/// The caches of a lagging instance hold a change only once the lag has passed: until then a
/// watch it serves cannot show the present.
#[tokio::test(start_paused = true)]
async fn a_lagging_instance_catches_up_with_a_change_after_its_lag() {
    let server = two_instances(Duration::from_secs(2));
    assert!(server.cache_caught_up(LEASES), "nothing written yet");
    let api: Api<Lease> = Api::namespaced(
        kube::Client::new(server.service_on("a", 0), "default"),
        "ns",
    );
    api.create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    assert!(
        !server.cache_caught_up(LEASES),
        "the lagging instance has not seen it"
    );
    assert!(
        server.cache_caught_up("services"),
        "nothing of that resource changed"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(server.cache_caught_up(LEASES));
}

/// A delete the admission hook refuses answers the refusal and keeps the object, as a refused
/// create or update does: the fencing policy refuses a deposed leader's deletes too.
#[tokio::test(start_paused = true)]
async fn a_delete_refused_by_admission_keeps_the_object() {
    let server = ApiServer::new(ServerConfig::default());
    let api: Api<Lease> = Api::namespaced(server.client("a"), "ns");
    api.create(&PostParams::default(), &lease("kept", "a"))
        .await
        .unwrap();
    server.admit(|request| match request.verb {
        Verb::Delete => {
            Err(kube::core::Status::failure("not the holder", "Forbidden").with_code(403))
        }
        _ => Ok(()),
    });
    let refused = api
        .delete("kept", &DeleteParams::default())
        .await
        .expect_err("refused");
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 403),
        "{refused:?}"
    );
    assert!(api.get_opt("kept").await.unwrap().is_some(), "still stored");
}

#[tokio::test(start_paused = true)]
async fn requests_to_one_address_are_spread_over_the_instances_by_the_seed() {
    let server = two_instances(Duration::ZERO);
    let instances = Arc::new(Mutex::new(Vec::new()));
    let seen = instances.clone();
    server.admit(move |request| {
        seen.lock().push(request.cache.instance());
        Ok(())
    });
    let api: Api<Lease> = Api::namespaced(server.client("a"), "ns");
    for index in 0..20 {
        api.create(&PostParams::default(), &lease(&format!("l{index}"), "a"))
            .await
            .unwrap();
    }
    let instances = instances.lock().clone();
    assert!(
        instances.contains(&0) && instances.contains(&1),
        "{instances:?}"
    );

    let again = two_instances(Duration::ZERO);
    let repeat = Arc::new(Mutex::new(Vec::new()));
    let seen = repeat.clone();
    again.admit(move |request| {
        seen.lock().push(request.cache.instance());
        Ok(())
    });
    let api: Api<Lease> = Api::namespaced(again.client("a"), "ns");
    for index in 0..20 {
        api.create(&PostParams::default(), &lease(&format!("l{index}"), "a"))
            .await
            .unwrap();
    }
    assert_eq!(*repeat.lock(), instances, "the same seed, the same spread");
}

#[tokio::test(start_paused = true)]
async fn a_watch_closed_by_the_server_ends_cleanly() {
    let server = ApiServer::new(ServerConfig::default());
    let api: Api<Lease> = Api::namespaced(server.client("a"), "ns");
    let mut watch = api
        .watch(&WatchParams::default().timeout(600), "0")
        .await
        .unwrap()
        .boxed();
    let services: Api<Service> = Api::namespaced(server.client("a"), "ns");
    let mut other = services
        .watch(&WatchParams::default().timeout(600), "0")
        .await
        .unwrap()
        .boxed();
    server.close_watches(Some(LEASES));
    assert!(watch.next().await.is_none(), "the Lease watch ended");
    api.create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    let mut reopened = api
        .watch(&WatchParams::default().timeout(600), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        reopened.next().await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap(),
        )
        .await
        .unwrap();
    assert!(
        matches!(other.next().await, Some(Ok(WatchEvent::Added(_)))),
        "another resource's watch goes on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_delete_and_recreate_behind_a_compaction_is_never_seen_as_a_delete() {
    let server = ApiServer::new(ServerConfig::default());
    let api: Api<Lease> = Api::namespaced(server.client("a"), "ns");
    let first = api
        .create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    let mut watch = api
        .watch(
            &WatchParams::default().timeout(600),
            &first.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    assert!(server.recreate_behind_compaction(
        LEASES,
        "ns",
        "l",
        json!({"metadata": {}, "spec": {"holderIdentity": "b"}})
    ));
    assert!(
        watch.next().await.is_none(),
        "the open watch was closed, no DELETED on it"
    );
    let resumed = api
        .watch(
            &WatchParams::default().timeout(600),
            &first.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed()
        .next()
        .await;
    assert!(
        matches!(&resumed, Some(Ok(WatchEvent::Error(status))) if status.code == 410),
        "{resumed:?}"
    );
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_ne!(
        listed.items[0].metadata.uid, first.metadata.uid,
        "another object"
    );
    assert_eq!(
        listed.items[0]
            .spec
            .as_ref()
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );
}

/// A server holding Service `ns/web` selecting `app: a`, and the driver's client of it.
async fn with_web() -> (ApiServer, Api<Service>) {
    let server = ApiServer::new(ServerConfig::default());
    let driver: Api<Service> = Api::namespaced(server.client("driver"), "ns");
    let web: Service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "a"}}}),
    )
    .unwrap();
    driver.create(&PostParams::default(), &web).await.unwrap();
    (server, driver)
}

/// web's selector changed to `app: b` right after a replica's read of `name` (any Service read
/// in `ns` with `None`).
fn web_to_b(name: Option<&str>) -> ReadRace {
    ReadRace {
        caller: "replica-".into(),
        resource: "services".into(),
        namespace: "ns".into(),
        name: name.map(str::to_string),
        target: "web".into(),
        patch: json!({"spec": {"selector": {"app": "b"}}}),
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_lands_between_a_confirming_read_and_what_follows_it() {
    let (server, driver) = with_web().await;
    server.race_read(web_to_b(Some("web")));
    let selector = |service: Service| service.spec.unwrap().selector.unwrap()["app"].clone();
    assert_eq!(
        selector(driver.get("web").await.unwrap()),
        "a",
        "another reader: no race"
    );
    let replica: Api<Service> = Api::namespaced(server.client("replica-0"), "ns");
    assert_eq!(
        selector(replica.get("web").await.unwrap()),
        "a",
        "the confirming read"
    );
    assert_eq!(
        selector(replica.get("web").await.unwrap()),
        "b",
        "changed right after it"
    );
    let acts: Vec<String> = server
        .log()
        .iter()
        .filter(|entry| entry.caller == "apisim:fault")
        .map(|entry| format!("{} {}", entry.method, entry.uri))
        .collect();
    assert_eq!(
        acts,
        ["PATCH services/ns/web after replica-0's read"],
        "the race is in the request log"
    );
}

#[tokio::test(start_paused = true)]
async fn an_armed_fault_disarmed_never_strikes() {
    let (server, _) = with_web().await;
    server.race_read(web_to_b(None));
    server.lose_answer(LostAnswer {
        caller: "replica-".into(),
        resource: "services".into(),
        verb: None,
    });
    server.disarm();
    let replica: Api<Service> = Api::namespaced(server.client("replica-0"), "ns");
    replica.get("web").await.unwrap();
    let mut read = replica.get("web").await.unwrap();
    assert_eq!(
        read.spec.as_ref().unwrap().selector.as_ref().unwrap()["app"],
        "a"
    );
    read.metadata.labels = Some([("k".to_string(), "v".to_string())].into());
    assert!(
        replica
            .replace("web", &PostParams::default(), &read)
            .await
            .is_ok(),
        "answered"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_leaves_the_write_applied() {
    let server = ApiServer::new(ServerConfig::default());
    let applied = Arc::new(AtomicUsize::new(0));
    let count = applied.clone();
    server.observe(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    server.lose_answer(LostAnswer {
        caller: "replica-".into(),
        resource: LEASES.into(),
        verb: Some(Verb::Create),
    });
    let api: Api<Lease> = Api::namespaced(server.client("replica-1"), "ns");
    let answer = api.create(&PostParams::default(), &lease("l", "a")).await;
    assert!(
        matches!(answer, Err(ref error) if !matches!(error, kube::Error::Api(_))),
        "a transport error, not an answer: {answer:?}"
    );
    assert!(server.get::<Lease>("ns", "l").is_some(), "applied");
    assert_eq!(applied.load(Ordering::SeqCst), 1);
    let again = api.create(&PostParams::default(), &lease("m", "a")).await;
    assert!(again.is_ok(), "one answer lost, not every one");
}

#[tokio::test(start_paused = true)]
async fn finalizers_hold_a_deleted_object_until_the_last_is_removed() {
    let server = ApiServer::new(ServerConfig::default());
    let api: Api<Lease> = Api::namespaced(server.client("a"), "ns");
    let mut held = lease("l", "a");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let answer = api.delete("l", &Default::default()).await.unwrap();
    let deleting = answer.left().expect("the object, marked deleting");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert!(server.get::<Lease>("ns", "l").is_some(), "still there");
    let patch = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch("l", &Default::default(), &patch).await.unwrap();
    assert!(
        server.get::<Lease>("ns", "l").is_none(),
        "gone with its last finalizer"
    );
}

#[test]
fn seeded_instances_draw_each_cache_its_own_bounded_lag() {
    let max = Duration::from_millis(1500);
    let one = Instance::seeded(1, max);
    assert_eq!(
        one,
        Instance::seeded(1, max),
        "the same seed, the same lags"
    );
    assert_ne!(one, Instance::seeded(2, max));
    assert!(one.lags.contains_key(LEASES) && one.lags.contains_key("services"));
    assert!(one.lags.values().all(|lag| *lag <= max));
    let distinct: std::collections::BTreeSet<_> = one.lags.values().collect();
    assert!(
        distinct.len() > 1,
        "lags differ by resource: {:?}",
        one.lags
    );
}

#[tokio::test(start_paused = true)]
async fn a_cache_lagged_at_run_time_stands_still_then_follows_late_and_never_goes_back() {
    let server = ApiServer::new(ServerConfig::default());
    let driver: Api<Service> = Api::namespaced(server.client("driver"), "ns");
    let service = |name: &str| -> Service {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {}})).unwrap()
    };
    driver
        .create(&PostParams::default(), &service("a"))
        .await
        .unwrap();
    let cache = server.cache(0);
    let seen = |name: &str| cache.get::<Service>("ns", name).is_some();
    assert!(seen("a"), "no lag: the store itself");
    server.lag_cache(0, "services", Duration::from_secs(5));
    assert!(
        seen("a"),
        "a lag raised does not take back what the cache held"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    driver
        .create(&PostParams::default(), &service("b"))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(!seen("b"), "4 s after it, behind a 5 s lag");
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert!(seen("b"), "5 s after it");
    driver
        .create(&PostParams::default(), &service("c"))
        .await
        .unwrap();
    assert!(!seen("c"));
    server.unlag_cache(0, "services");
    assert!(seen("c"), "the lag ended: the cache caught up at once");
}
