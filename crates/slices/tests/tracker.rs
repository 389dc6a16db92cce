//! The term's own writes (docs/architecture.md, "A fresh view", clause 2) and the stale-tracker
//! scenario (docs/slices.md), one named test per rule.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{SliceStore, Svc, Workload, time};
use slices::{CachedSlice, Config, ServiceKey, Tracker, plan_slices};

fn key() -> ServiceKey {
    ServiceKey::new("default", "web")
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
fn nothing_recorded_needs_no_read_back() {
    assert!(!Tracker::new().needs_read_back(&key()));
}

#[test]
fn a_write_of_unknown_outcome_holds_its_service_until_read_back() {
    let mut tracker = Tracker::new();
    tracker.record_unknown_outcome(&key());
    assert!(tracker.needs_read_back(&key()));
    assert!(
        !tracker.needs_read_back(&ServiceKey::new("default", "api")),
        "only that Service is held"
    );
    tracker.read_back(&key());
    assert!(!tracker.needs_read_back(&key()));
}

#[test]
fn a_service_counts_as_written_from_its_first_write_of_the_term_answered_or_not() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    assert!(!tracker.has_written(&key()));
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert!(tracker.has_written(&key()));
    assert!(!tracker.has_written(&ServiceKey::new("default", "api")));
    // Someone deletes the slice: still written by this term.
    tracker.observe(Some(&CachedSlice::from(&created[0])), None);
    assert!(tracker.has_written(&key()));

    let mut unanswered = Tracker::new();
    unanswered.record_unknown_outcome(&key());
    assert!(
        unanswered.has_written(&key()),
        "a write of unknown outcome may have landed"
    );
    unanswered.read_back(&key());
    assert!(unanswered.has_written(&key()));
    unanswered.forget(&key());
    assert!(
        !unanswered.has_written(&key()),
        "a Service deleted starts again"
    );
}

#[test]
fn a_slice_someone_else_deleted_is_no_longer_taken_for_our_write() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    let created = write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    let ours = CachedSlice::from(&created[0]);
    tracker.observe(Some(&ours), None);
    // The same version seen again (a watch of a lagging API server instance replaying it) is
    // not ours any more: it is planned like anyone's slice.
    assert!(!tracker.is_own_write(&ours));
}

#[test]
fn the_tracker_counts_the_services_it_holds_records_of() {
    let (mut tracker, mut store) = (Tracker::new(), SliceStore::default());
    assert_eq!((tracker.is_empty(), tracker.len()), (true, 0));
    write_slices(&mut tracker, &mut store, &["10.0.0.1"]);
    assert_eq!((tracker.is_empty(), tracker.len()), (false, 1));
    tracker.record_unknown_outcome(&ServiceKey::new("default", "api"));
    assert_eq!((tracker.is_empty(), tracker.len()), (false, 2));
    let mut unresolved_only = Tracker::new();
    unresolved_only.record_unknown_outcome(&key());
    unresolved_only.read_back(&key());
    assert_eq!(
        (unresolved_only.is_empty(), unresolved_only.len()),
        (false, 1),
        "a write that may have landed stays on record"
    );
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
    tracker.record_unknown_outcome(&key());
    tracker.forget(&key());
    assert!(tracker.is_empty());
    assert!(!tracker.is_own_write(&CachedSlice::from(&created[0])));
    assert!(!tracker.needs_read_back(&key()));
}

/// The stale-tracker scenario: A writes, loses the lease (one write's outcome unknown), someone
/// deletes the slices, A leads again. The new term's tracker holds nothing of the old term: the
/// Service is planned at once from the cache, and the plan re-creates the slices.
#[test]
fn reacquired_leader_recreates_slices_deleted_while_following() {
    let (mut first_term, mut store) = (Tracker::new(), SliceStore::default());
    write_slices(&mut first_term, &mut store, &["10.0.0.1"]);
    first_term.record_unknown_outcome(&key());
    let deleted_while_following: Vec<EndpointSlice> = Vec::new();

    let mut second_term = Tracker::new();
    assert!(!second_term.needs_read_back(&key()));
    let mut store = SliceStore::with(deleted_while_following);
    let rewritten = write_slices(&mut second_term, &mut store, &["10.0.0.1"]);
    assert_eq!(rewritten.len(), 1, "slice re-created");
}
