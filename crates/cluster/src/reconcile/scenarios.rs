//! The cluster core under leadership changes, in process and in paused time: the real caches,
//! handlers, reconcile, tracker, fenced writer and leadership runtime, against a fake API server
//! whose slice watch the tests slow down or hold back ([`crate::fake::harness`]).
//!
//! Each test is named for the failure it prevents.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use slices::{
    ServiceKey,
    testing::{NAMESPACE, Svc, vm, web},
};
use tokio::time::{Instant, sleep};

use crate::{
    fake::harness::{Core, WATCH_DELAY, wait_until},
    metrics::Outcome,
};

/// A stale limit no scenario should reach: a scenario that converges only through it would hide
/// the bug it is about.
const NEVER: Duration = Duration::from_secs(24 * 3600);

fn web_key() -> ServiceKey {
    ServiceKey::new(NAMESPACE, "web")
}

/// The name of the one slice Service `service` has on the server.
fn only_slice(core: &Core, service: &str) -> String {
    let slices = core.server().slices_of(NAMESPACE, service);
    assert_eq!(slices.len(), 1, "{slices:?}");
    slices[0].metadata.name.clone().unwrap()
}

/// The core leading, with `web` selecting vm-1 and vm-2, published and seen back by the cache.
async fn leading_with_web() -> Core {
    let core = Core::start(NEVER);
    core.feed().apply_service(&web().build());
    core.feed().apply_workload(&vm("vm-1", "10.0.0.1").build());
    core.feed().apply_workload(&vm("vm-2", "10.0.0.2").build());
    core.lead().await;
    core.wait_published("web", &["10.0.0.1", "10.0.0.2"]).await;
    core.settle().await;
    core
}

/// The seed's scenario (leader-election-design-discussion): A leads and writes; A loses the
/// lease before its watch shows that write; meanwhile someone deletes the slice; A leads again.
/// A tracker kept from the first term still expects the write it never saw and never saw the
/// delete (handlers are off while following): "cache out of date" for ever. A fresh tracker per
/// term re-creates the slice at once.
#[tokio::test(start_paused = true)]
async fn reacquired_leader_recreates_slices_deleted_while_following() {
    let core = Core::start(NEVER);
    core.feed().apply_service(&web().build());
    core.feed().apply_workload(&vm("vm-1", "10.0.0.1").build());
    core.feed().apply_workload(&vm("vm-2", "10.0.0.2").build());
    core.server().hold_watch();
    core.lead().await;
    core.wait_published("web", &["10.0.0.1", "10.0.0.2"]).await;
    core.follow().await;

    // While following: someone deletes our slice; the watch then delivers our create and the
    // delete, through no handler.
    let slice = only_slice(&core, "web");
    core.server().delete_by_other(NAMESPACE, &slice);
    core.server().release_watch(WATCH_DELAY);
    wait_until("the watch caught up", || core.server().undelivered() == 0).await;
    assert!(core.caches().slices_of(&web_key()).is_empty());

    let stale = core.outcomes(Outcome::Stale);
    core.lead().await;
    core.wait_published("web", &["10.0.0.1", "10.0.0.2"]).await;
    core.settle().await;
    assert_eq!(
        core.outcomes(Outcome::Stale),
        stale,
        "the new term waited on none of the old term's writes"
    );
    core.stop().await;
}

/// The same with a change instead of a delete: someone removed an endpoint while we followed;
/// the replay of the next term puts it back.
#[tokio::test(start_paused = true)]
async fn reacquired_leader_restores_slices_changed_while_following() {
    let core = leading_with_web().await;
    core.follow().await;
    let slice = only_slice(&core, "web");
    core.server().edit_by_other(NAMESPACE, &slice, |slice| {
        let endpoints = slice.endpoints.get_or_insert_default();
        endpoints.retain(|e| e.addresses != ["10.0.0.2"]);
    });
    wait_until("the watch caught up", || core.server().undelivered() == 0).await;
    assert_eq!(core.published("web"), ["10.0.0.1"]);
    let writes = core.api().calls().len();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        core.api().calls().len(),
        writes,
        "a follower writes nothing"
    );

    core.lead().await;
    core.wait_published("web", &["10.0.0.1", "10.0.0.2"]).await;
    assert_eq!(only_slice(&core, "web"), slice, "updated in place");
    core.stop().await;
}

/// A term that ends between two writes of one pass sends nothing more (the fence), reports the
/// refusal as `Fenced` (not `Ok`), and the next term writes what is missing, once.
#[tokio::test(start_paused = true)]
async fn term_ending_mid_pass_sends_nothing_more_and_the_next_term_finishes_the_plan() {
    let core = Core::start(NEVER);
    let dual_stack = web().families(&["IPv4", "IPv6"]).build();
    core.feed().apply_service(&dual_stack);
    let workload = vm("vm-1", "10.0.0.1").ip("fd00::1").build();
    core.feed().apply_workload(&workload);
    // The plan creates one slice per family; the term ends once the first is sent.
    core.api().end_term_after(1, core.leadership());
    core.publish_term();
    wait_until("the refused write", || core.outcomes(Outcome::Fenced) == 1).await;
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        core.api().calls().len(),
        1,
        "nothing sent after the term ended"
    );
    assert_eq!(core.outcomes(Outcome::Ok), 0, "a refused pass is not Ok");
    assert_eq!(core.published("web"), ["10.0.0.1"]);

    core.lead().await;
    core.wait_published("web", &["10.0.0.1", "fd00::1"]).await;
    core.settle().await;
    assert_eq!(
        core.calls_to("create"),
        2,
        "each family's slice created once"
    );
    core.stop().await;
}

/// An update planned on a version someone else has since replaced is refused (409), counted as
/// `Conflict` (not `Ok`, not an error with backoff), and planned again once the cache shows the
/// other write: their change and ours both land.
#[tokio::test(start_paused = true)]
async fn write_conflict_is_reported_and_replanned_once_the_cache_catches_up() {
    let core = leading_with_web().await;
    let slice = only_slice(&core, "web");
    core.server().hold_watch();
    core.server().edit_by_other(NAMESPACE, &slice, |slice| {
        let endpoints = slice.endpoints.get_or_insert_default();
        endpoints.retain(|e| e.addresses != ["10.0.0.2"]);
    });
    core.feed().apply_workload(&vm("vm-3", "10.0.0.3").build());
    wait_until("a conflict", || core.outcomes(Outcome::Conflict) >= 1).await;
    assert_eq!(
        core.published("web"),
        ["10.0.0.1"],
        "our stale update refused"
    );

    core.server().release_watch(WATCH_DELAY);
    core.wait_published("web", &["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        .await;
    core.settle().await;
    assert_eq!(core.outcomes(Outcome::Error), 0);
    assert_eq!(only_slice(&core, "web"), slice, "updated in place");
    core.stop().await;
}

/// A delete planned on a version someone else has since replaced is refused by its
/// resourceVersion precondition and planned again, instead of counting as deleted; then it
/// goes through with the version the cache shows.
#[tokio::test(start_paused = true)]
async fn delete_of_a_slice_changed_since_planned_is_replanned_not_counted_as_deleted() {
    let core = Core::start(NEVER);
    core.feed().apply_service(&web().build());
    let workload = vm("vm-1", "10.0.0.1").build();
    core.feed().apply_workload(&workload);
    core.lead().await;
    core.wait_published("web", &["10.0.0.1"]).await;
    core.settle().await;

    let slice = only_slice(&core, "web");
    core.server().hold_watch();
    core.server().edit_by_other(NAMESPACE, &slice, |slice| {
        let labels = slice.metadata.labels.get_or_insert_default();
        labels.insert("touched-by".into(), "someone".into());
    });
    // The workload goes: the slice would be empty, so the plan deletes it.
    core.feed().delete_workload(&workload);
    wait_until("a conflict", || core.outcomes(Outcome::Conflict) >= 1).await;
    assert_eq!(core.published("web"), ["10.0.0.1"], "not deleted yet");
    assert_eq!(
        core.api().delete_preconditions(&slice).len(),
        core.calls_to("delete")
    );

    core.server().release_watch(WATCH_DELAY);
    wait_until("the slice deleted", || {
        core.server().slices_of(NAMESPACE, "web").is_empty()
    })
    .await;
    core.settle().await;
    assert_eq!(core.outcomes(Outcome::Error), 0);
    core.stop().await;
}

/// A slice watch that does not show our own writes holds the Service (`Stale`, nothing written)
/// until the stale limit, then the Service is planned from the cache as it is; once the watch
/// catches up, the slices converge with no endpoint published twice.
#[tokio::test(start_paused = true)]
async fn slice_watch_lagging_our_writes_holds_the_service_until_the_stale_limit() {
    let stale_limit = Duration::from_secs(5);
    let core = Core::start(stale_limit);
    core.feed().apply_service(&web().build());
    core.feed().apply_workload(&vm("vm-1", "10.0.0.1").build());
    core.server().hold_watch();
    core.lead().await;
    core.wait_published("web", &["10.0.0.1"]).await;

    // The cache never showed our create: the next change waits for it.
    core.feed().apply_workload(&vm("vm-2", "10.0.0.2").build());
    wait_until("a stale pass", || core.outcomes(Outcome::Stale) >= 1).await;
    let waiting_since = Instant::now();
    sleep(stale_limit - Duration::from_secs(1)).await;
    assert_eq!(
        core.api().calls().len(),
        1,
        "nothing written while the cache is behind"
    );
    assert!(core.outcomes(Outcome::Stale) > 10, "retried every 100 ms");
    assert_eq!(
        core.metrics().stale_cache_retries.get(),
        core.outcomes(Outcome::Stale)
    );

    wait_until("a write past the stale limit", || {
        core.api().calls().len() > 1
    })
    .await;
    assert!(waiting_since.elapsed() >= stale_limit - Duration::from_millis(200));

    core.server().release_watch(WATCH_DELAY);
    core.wait_published("web", &["10.0.0.1", "10.0.0.2"]).await;
    core.settle().await;
    assert_eq!(core.published("web"), ["10.0.0.1", "10.0.0.2"], "each once");
    assert_eq!(core.outcomes(Outcome::Error), 0);
    core.stop().await;
}

/// Changes made while following (workloads added and removed, a new Service) reach no handler
/// and write nothing; the replay of the next term publishes all of them.
#[tokio::test(start_paused = true)]
async fn replay_after_reacquire_publishes_changes_made_while_following() {
    let core = leading_with_web().await;
    core.follow().await;
    let writes = core.api().calls().len();

    core.feed().delete_workload(&vm("vm-1", "10.0.0.1").build());
    core.feed().apply_workload(&vm("vm-3", "10.0.0.3").build());
    let api = Svc::named("api")
        .selector("app", "api")
        .port("http", 80, "http");
    core.feed().apply_service(&api.build());
    let api_vm = vm("vm-api", "10.0.1.1").label("app", "api");
    core.feed().apply_workload(&api_vm.build());
    sleep(Duration::from_secs(5)).await;
    assert!(core.is_idle(), "a follower queues nothing");
    assert_eq!(
        core.api().calls().len(),
        writes,
        "a follower writes nothing"
    );

    core.lead().await;
    core.wait_published("web", &["10.0.0.2", "10.0.0.3"]).await;
    core.wait_published("api", &["10.0.1.1"]).await;
    core.stop().await;
}

/// A change that finds its Service waiting for our own previous write to show in the cache is
/// published as soon as the watch shows that write, not a fixed stale retry later (issue 20: the
/// 100 ms stale retry was the largest share of our p99 under load).
#[tokio::test(start_paused = true)]
async fn change_behind_our_own_write_is_published_when_the_write_shows_not_after_the_stale_retry() {
    let core = leading_with_web().await;
    let replaces = core.calls_to("replace");
    core.feed().apply_workload(&vm("vm-1", "10.0.0.11").build());
    wait_until("the first change written", || {
        core.calls_to("replace") > replaces
    })
    .await;
    // Our write is answered; the watch shows it WATCH_DELAY later. A change now finds the cache
    // behind that write.
    let stale = core.outcomes(Outcome::Stale);
    let changed = Instant::now();
    core.feed().apply_workload(&vm("vm-2", "10.0.0.12").build());
    core.wait_published("web", &["10.0.0.11", "10.0.0.12"])
        .await;
    let took = changed.elapsed();
    assert!(
        core.outcomes(Outcome::Stale) > stale,
        "the second change found the cache behind the first write"
    );
    assert!(
        took < crate::reconcile::STALE_RETRY / 2,
        "published {took:?} after the change; the write showed within {WATCH_DELAY:?}"
    );
    core.settle().await;
    core.stop().await;
}
