//! Unit tests of the store: grouping, the label index, re-lists, and the versions and
//! tombstones that keep a store moving forward.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ObjectMeta;

use super::*;

fn slice(name: &str, service: &str, rv: &str) -> CachedSlice {
    CachedSlice::from(&EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            labels: Some([("kubernetes.io/service-name".into(), service.into())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: None,
        ports: None,
    })
}

/// A re-list in one call: the changes it amounts to.
fn replace<K: Cached>(store: &Store<K>, objects: Vec<K>) -> Vec<Change<K>> {
    let mut relist = store.relist();
    let mut changes: Vec<Change<K>> = objects
        .into_iter()
        .filter_map(|object| store.relist_apply(&mut relist, object))
        .collect();
    changes.extend(store.finish_relist(relist, 0));
    changes
}

fn by_service(slice: &CachedSlice) -> Option<Text> {
    slice
        .labels
        .iter()
        .find(|(k, _)| &***k == "kubernetes.io/service-name")
        .map(|(_, v)| v.clone())
}

#[test]
fn apply_moves_an_object_between_groups_when_its_label_changes() {
    let cache = Store::grouped(by_service);
    assert!(cache.apply(slice("s1", "web", "1")).unwrap().old.is_none());
    let change = cache.apply(slice("s1", "api", "2")).unwrap();
    assert_eq!(
        change.old.unwrap().resource_version,
        Some(Token::parse("1"))
    );
    assert!(cache.in_group("ns", "web").is_empty());
    assert_eq!(cache.in_group("ns", "api").len(), 1);
    assert_eq!(cache.len(), 1);
}

#[test]
fn relist_reports_adds_updates_and_deletes_but_not_unchanged_objects() {
    let cache = Store::grouped(by_service);
    cache.apply(slice("kept", "web", "1"));
    cache.apply(slice("changed", "web", "1"));
    cache.apply(slice("gone", "web", "1"));
    let changes = replace(
        &cache,
        vec![
            slice("kept", "web", "1"),
            slice("changed", "web", "2"),
            slice("added", "web", "1"),
        ],
    );
    let mut summary: Vec<_> = changes
        .iter()
        .map(|c| {
            let name = c.new.as_ref().or(c.old.as_ref()).unwrap().name.to_string();
            (name, c.old.is_some(), c.new.is_some())
        })
        .collect();
    summary.sort();
    assert_eq!(
        summary,
        vec![
            ("added".into(), false, true),
            ("changed".into(), true, true),
            ("gone".into(), true, false),
        ]
    );
    assert_eq!(cache.len(), 3);
}

fn label_pairs(slice: &CachedSlice) -> Vec<LabelPair> {
    slice
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[test]
fn label_index_follows_label_changes_and_deletes() {
    let cache = Store::new().label_indexed(label_pairs);
    let web: LabelPair = ("kubernetes.io/service-name".into(), "web".into());
    let api: LabelPair = ("kubernetes.io/service-name".into(), "api".into());
    cache.apply(slice("s1", "web", "1"));
    cache.apply(slice("s2", "web", "1"));
    assert_eq!(cache.with_label("ns", &web).len(), 2);
    cache.apply(slice("s1", "api", "2"));
    assert_eq!(cache.with_label("ns", &web).len(), 1);
    assert_eq!(&*cache.with_label("ns", &api)[0].name, "s1");
    cache.delete(slice("s2", "web", "3"));
    assert!(cache.with_label("ns", &web).is_empty());
    assert!(cache.with_label("other", &web).is_empty());
}

#[test]
fn delete_of_an_unknown_object_still_reports_it() {
    let cache: Store<CachedSlice> = Store::grouped(by_service);
    let change = cache.delete(slice("x", "web", "5")).unwrap();
    assert!(change.old.is_some() && change.new.is_none());
    assert!(cache.is_empty());
}

#[test]
fn an_older_or_equal_version_changes_nothing() {
    let cache = Store::grouped(by_service);
    cache.apply(slice("s1", "web", "5"));
    assert!(
        cache.apply(slice("s1", "web", "5")).is_none(),
        "the same version"
    );
    assert!(
        cache.apply(slice("s1", "web", "4")).is_none(),
        "an older version"
    );
    assert_eq!(
        cache.get("ns", "s1").unwrap().resource_version,
        Some(Token::parse("5"))
    );
    assert!(cache.apply(slice("s1", "web", "6")).is_some());
    let mut relist = cache.relist();
    assert!(
        cache
            .relist_apply(&mut relist, slice("s1", "web", "3"))
            .is_none()
    );
}

#[test]
fn an_object_known_gone_does_not_come_back_through_an_older_report() {
    let cache = Store::grouped(by_service);
    cache.apply(slice("s1", "web", "5"));
    let gone = cache.remove_known_gone(&"ns".into(), &"s1".into(), None, 5);
    assert!(gone.is_some());
    assert!(
        cache.apply(slice("s1", "web", "5")).is_none(),
        "the watch's echo"
    );
    assert!(cache.is_empty());
    assert!(
        cache.delete(slice("s1", "web", "7")).is_none(),
        "the watch's delete of it changes nothing"
    );
    assert!(
        cache.apply(slice("s1", "web", "5")).is_some(),
        "the tombstone served once"
    );
}

#[test]
fn a_relist_keeps_objects_newer_than_its_list() {
    let cache = Store::grouped(by_service);
    cache.apply(slice("old", "web", "3"));
    let mut relist = cache.relist();
    cache.relist_apply(&mut relist, slice("listed", "web", "9"));
    // Our own create, answered after the list was read at 10.
    cache.apply(slice("ours", "web", "12"));
    let gone = cache.finish_relist(relist, 10);
    let names: Vec<_> = gone
        .iter()
        .map(|change| change.old.as_ref().unwrap().name.to_string())
        .collect();
    assert_eq!(names, ["old"]);
    assert!(cache.get("ns", "ours").is_some());
}

#[test]
fn a_delete_of_another_object_of_the_same_name_changes_nothing() {
    let cache = Store::grouped(by_service);
    let mut first = slice("s1", "web", "3");
    first.uid = Some(Token::parse("a"));
    let mut second = slice("s1", "web", "8");
    second.uid = Some(Token::parse("b"));
    cache.apply(second);
    assert!(cache.delete(first).is_none());
    assert_eq!(cache.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_delete_seen_is_remembered_against_a_late_answer_for_a_while() {
    let ttl = Duration::from_secs(60);
    let cache = Store::grouped(by_service).remembering_deletes(ttl);
    cache.apply(slice("s1", "web", "5"));
    // Someone deletes it; the watch says so at version 9.
    assert!(cache.delete(slice("s1", "web", "9")).is_some());
    // The answer to our own update of it (version 7) arrives late: it stays gone.
    assert!(cache.apply(slice("s1", "web", "7")).is_none());
    assert!(cache.is_empty());
    tokio::time::advance(ttl + Duration::from_secs(1)).await;
    cache.delete(slice("other", "web", "12"));
    assert!(
        cache.apply(slice("s1", "web", "7")).is_some(),
        "forgotten once no answer can still come"
    );
}

#[test]
fn a_read_of_one_group_forgets_what_it_no_longer_holds_but_not_newer_answers() {
    let cache = Store::grouped(by_service);
    cache.apply(slice("gone", "web", "3"));
    cache.apply(slice("kept", "web", "4"));
    cache.apply(slice("ours", "web", "12"));
    cache.apply(slice("other", "api", "2"));
    cache.read_group("ns", "web", vec![slice("kept", "web", "9")], 10);
    let names: Vec<String> = cache
        .in_group("ns", "web")
        .iter()
        .map(|slice| slice.name.to_string())
        .collect();
    assert_eq!(names, ["kept", "ours"]);
    assert_eq!(
        cache.in_group("ns", "api").len(),
        1,
        "another group untouched"
    );
    assert!(
        cache.apply(slice("gone", "web", "3")).is_none(),
        "the watch's late report of it changes nothing"
    );
}
