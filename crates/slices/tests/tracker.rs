//! Stale-cache protection and the stale-tracker scenario (docs/slices.md, "Stale-cache
//! protection"), one named test per rule.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{SliceStore, Svc, Workload, time};
use slices::{CachedSlice, Config, Freshness, ServiceKey, StaleReason, Tracker, plan_slices};

fn key() -> ServiceKey {
    ServiceKey::new("default", "web")
}

/// `tracker.check` on these slices, in the cached form the controller passes.
fn check(tracker: &mut Tracker, slices: &[&EndpointSlice]) -> Freshness {
    let cached: Vec<CachedSlice> = slices.iter().map(|s| CachedSlice::from(*s)).collect();
    let refs: Vec<&CachedSlice> = cached.iter().collect();
    tracker.check(&key(), &refs)
}

/// Applies a plan for one workload per address, recording each response in `tracker`.
fn write_slices(tracker: &mut Tracker, store: &mut SliceStore, ips: &[&str]) -> Vec<EndpointSlice> {
    let service = Svc::named("web").selector("app", "web");
    apply_plan(tracker, store, service, ips)
}

/// Applies the plan of a Service that lost its selector: its slices are deleted (with no
/// workloads left they would stay as a placeholder, docs/slices.md).
fn delete_slices(tracker: &mut Tracker, store: &mut SliceStore) -> Vec<EndpointSlice> {
    apply_plan(tracker, store, Svc::named("web"), &[])
}

fn apply_plan(
    tracker: &mut Tracker,
    store: &mut SliceStore,
    service: Svc,
    ips: &[&str],
) -> Vec<EndpointSlice> {
    let service = service.port("http", 80, 8080).build();
    let workloads: Vec<_> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            Workload::named(&format!("vm-{i}"))
                .label("app", "web")
                .ip(ip)
                .ready()
                .build()
        })
        .collect();
    let refs: Vec<_> = workloads.iter().collect();
    let plan = plan_slices(
        &service,
        &refs,
        &store.slices(),
        &Config::default(),
        &time(1),
    );
    let mut responses = Vec::new();
    for write in plan.writes() {
        let response = store.write(write);
        match write {
            slices::Write::Delete(_) => tracker.record_delete(&key(), &response),
            _ => tracker.record_write(&key(), &response),
        }
        responses.push(response);
    }
    responses
}

#[test]
fn nothing_recorded_is_fresh() {
    assert_eq!(Tracker::new().check(&key(), &[]), Freshness::Fresh);
}

#[test]
fn cache_missing_a_slice_we_created_is_stale() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert!(matches!(
        tracker.check(&key(), &[]),
        Freshness::Stale(StaleReason::MissingWrite { .. })
    ));
}

#[test]
fn cache_showing_an_older_generation_than_we_wrote_is_stale() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    let old_cache = created.clone();
    write_slices(&mut tracker, &mut store, &["10.0.0.2"]);
    let refs: Vec<_> = old_cache.iter().collect();
    let freshness = check(&mut tracker, &refs);
    assert!(
        matches!(&freshness, Freshness::Stale(reason) if reason.reason() == "older_generation"),
        "{freshness:?}"
    );
}

#[test]
fn cache_still_holding_a_slice_we_deleted_is_stale() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    delete_slices(&mut tracker, &mut store);
    let refs: Vec<_> = created.iter().collect();
    assert!(matches!(
        check(&mut tracker, &refs),
        Freshness::Stale(StaleReason::DeletedStillCached { .. })
    ));
    assert_eq!(
        tracker.check(&key(), &[]),
        Freshness::Fresh,
        "gone from the cache: caught up"
    );
}

#[test]
fn cache_that_caught_up_is_fresh() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert_eq!(check(&mut tracker, &store.slices()), Freshness::Fresh);
}

#[test]
fn slice_deleted_by_someone_else_after_the_cache_showed_it_is_not_waited_for() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert_eq!(check(&mut tracker, &store.slices()), Freshness::Fresh);
    // Someone deletes it: the cache now lacks it, and the plan must re-create it, not wait.
    assert_eq!(tracker.check(&key(), &[]), Freshness::Fresh);
}

#[test]
fn slice_deleted_by_someone_else_before_the_cache_showed_it_is_not_waited_for() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    tracker.observe(Some(&CachedSlice::from(&created[0])), None);
    assert_eq!(tracker.check(&key(), &[]), Freshness::Fresh);
}

#[test]
fn own_writes_seen_through_the_watch_are_recognised() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert!(tracker.is_own_write(&CachedSlice::from(&created[0])));
    let mut changed_by_someone = created[0].clone();
    changed_by_someone.metadata.resource_version = Some("999".into());
    assert!(!tracker.is_own_write(&CachedSlice::from(&changed_by_someone)));
}

#[test]
fn only_our_deletes_are_expected() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert!(
        !tracker.is_expected_delete(&CachedSlice::from(&created[0])),
        "we did not delete it (yet)"
    );
    delete_slices(&mut tracker, &mut store);
    assert!(tracker.is_expected_delete(&CachedSlice::from(&created[0])));
}

#[test]
fn deleted_service_is_forgotten() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    tracker.forget(&key());
    assert!(tracker.is_empty());
    assert!(!tracker.is_own_write(&CachedSlice::from(&created[0])));
    assert_eq!(tracker.check(&key(), &[]), Freshness::Fresh);
}

/// The stale-tracker scenario: A writes, loses the lease, someone deletes the slices, A leads
/// again.
/// With the old term's tracker A would wait forever for slices that will never come back; the
/// new term's tracker lets it plan, and the plan re-creates them.
#[test]
fn reacquired_leader_recreates_slices_deleted_while_following() {
    let (mut first_term, mut store) = (Tracker::new(), SliceStore::default());
    write_slices(&mut first_term, &mut store, &["10.0.0.1"]);
    let deleted_while_following: Vec<EndpointSlice> = Vec::new();

    assert!(
        matches!(first_term.check(&key(), &[]), Freshness::Stale(_)),
        "the old term's tracker would be stuck"
    );
    let mut second_term = Tracker::new();
    assert_eq!(second_term.check(&key(), &[]), Freshness::Fresh);
    let mut store = SliceStore::with(deleted_while_following);
    let rewritten = write_slices(&mut second_term, &mut store, &["10.0.0.1"]);
    assert_eq!(rewritten.len(), 1, "slice re-created");
}
