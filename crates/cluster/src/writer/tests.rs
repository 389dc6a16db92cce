//! The write path ([`KubeReadWrite`]) against the in-memory API server,
//! which answers as the API server does (generated names, 409 on an older version, 404 on a
//! missing slice), with failures and the end of the term put at exact calls
//! ([`crate::test_api`]).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Preconditions;
use leadership::Fenced;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use slices::{CachedSlice, SERVICE_NAME_LABEL, ServiceKey, SlicePlan, Tracker};

use super::*;
use crate::{
    caches::Caches,
    metrics::{Metrics, Operation, WriteLabels},
    test_api::{TestApi, TestTerm},
    timing::Timing,
};

pub(super) const NAMESPACE: &str = "ns";

/// A slice of Service `web`: to create (named by `generateName`) or named.
fn slice(name: &str, generate_name: bool) -> EndpointSlice {
    let mut metadata = ObjectMeta {
        namespace: Some(NAMESPACE.into()),
        labels: Some([(SERVICE_NAME_LABEL.to_owned(), "web".to_owned())].into()),
        ..ObjectMeta::default()
    };
    if generate_name {
        metadata.generate_name = Some(name.into());
    } else {
        metadata.name = Some(name.into());
    }
    EndpointSlice {
        metadata,
        address_type: "IPv4".into(),
        ..EndpointSlice::default()
    }
}

/// A slice `name` that was never stored (its uid and version made up).
fn never_stored(name: &str) -> EndpointSlice {
    let mut slice = slice(name, false);
    slice.metadata.uid = Some(format!("uid-{name}"));
    slice.metadata.resource_version = Some("7".into());
    slice
}

/// Stores a slice for each of `names` and returns them as the plans of these tests saw them.
pub(super) async fn stored(api: &TestApi, names: &[&str]) -> Vec<EndpointSlice> {
    let mut slices = Vec::new();
    for name in names {
        slices.push(api.store(&slice(name, false)).await);
    }
    slices
}

/// A plan that creates `creates` (by generateName) and updates and deletes existing slices.
pub(super) fn plan(
    creates: &[&str],
    updates: Vec<EndpointSlice>,
    deletes: Vec<EndpointSlice>,
) -> SlicePlan {
    SlicePlan {
        creates: creates.iter().map(|name| slice(name, true)).collect(),
        updates,
        deletes,
        diagnostics: Vec::new(),
    }
}

/// The parts one pass needs: a term that lasts until a test ends it, a tracker, the caches,
/// metrics.
pub(super) struct Pass {
    pub(super) term: TestTerm,
    pub(super) tracker: Mutex<Tracker>,
    caches: Caches,
    pub(super) metrics: Metrics,
    rate: WriteRate,
    timing: Timing,
}

impl Pass {
    pub(super) fn new() -> Self {
        let metrics = Metrics::register(&mut Registry::default());
        Self {
            term: TestTerm::new(),
            tracker: Mutex::new(Tracker::new()),
            caches: Caches::new(),
            timing: Timing::new(metrics.timing.clone()),
            metrics,
            rate: WriteRate::unlimited(),
        }
    }

    pub(super) async fn write(
        &self,
        api: &TestApi,
        plan: &SlicePlan,
    ) -> Result<Written, WriteError> {
        let key = ServiceKey::new(NAMESPACE, "web");
        let pass = super::Pass {
            api: &api.writes,
            key: &key,
            fence: &self.term.fence,
            tracker: &self.tracker,
            caches: &self.caches,
            own_writes: true,
            metrics: &self.metrics,
            rate: &self.rate,
            timing: &self.timing,
        };
        write_plan(&pass, plan).await
    }

    pub(super) fn must_read_back(&self) -> bool {
        self.tracker
            .lock()
            .needs_read_back(&ServiceKey::new(NAMESPACE, "web"))
    }

    fn cached(&self, name: &str) -> Option<std::sync::Arc<CachedSlice>> {
        self.caches.slices.get(NAMESPACE, name)
    }

    fn expects_delete(&self, slice: &EndpointSlice) -> bool {
        self.tracker
            .lock()
            .is_expected_delete(&CachedSlice::from(slice))
    }
}

#[tokio::test]
async fn writes_creates_then_updates_then_deletes_and_records_each() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-a", "web-b"]).await;
    let pass = Pass::new();
    let plan = plan(
        &["web-"],
        vec![existing[0].clone()],
        vec![existing[1].clone()],
    );
    let written = pass.write(&api, &plan).await.unwrap();
    assert_eq!(
        api.calls(),
        ["create web-", "replace web-a", "delete web-b"]
    );
    let expected = Written {
        created: 1,
        updated: 1,
        deleted: 1,
    };
    assert_eq!(written, expected);
    let created = api
        .slices(NAMESPACE)
        .into_iter()
        .find(|slice| slice.metadata.name.as_deref() != Some("web-a"))
        .expect("the created slice");
    let tracker = pass.tracker.lock();
    assert!(
        tracker.is_own_write(&CachedSlice::from(&created)),
        "create recorded"
    );
    assert!(
        tracker.is_expected_delete(&CachedSlice::from(&existing[1])),
        "delete recorded"
    );
}

#[tokio::test]
async fn failed_create_stops_the_pass() {
    let api = TestApi::new().failing(&[("create web-", 500)]);
    let existing = stored(&api, &["web-a", "web-b", "web-c"]).await;
    let pass = Pass::new();
    let plan = plan(&["web-"], existing[..1].to_vec(), existing[1..].to_vec());
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(matches!(error, WriteError::Api { .. }), "{error:?}");
    assert_eq!(
        api.calls(),
        ["create web-"],
        "nothing after the failed write"
    );
    assert!(
        pass.must_read_back(),
        "a 500 may have been applied: the Service is read back first"
    );
}

#[tokio::test]
async fn conflicting_update_is_reported_as_conflict_and_stops_the_pass() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-a", "web-b", "web-c"]).await;
    // Someone replaces web-a after the plan saw it: the API refuses the update of the older version.
    api.rewrite(&existing[0]).await;
    let pass = Pass::new();
    let plan = plan(&[], existing[..2].to_vec(), existing[2..].to_vec());
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(matches!(error, WriteError::Conflict { .. }), "{error:?}");
    assert_eq!(api.calls(), ["replace web-a"], "nothing after the conflict");
    assert!(
        pass.must_read_back(),
        "a 409 refreshes the slices by a read, not by waiting for the watch"
    );
}

#[tokio::test]
async fn delete_answered_not_found_counts_as_deleted() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-b"]).await;
    let pass = Pass::new();
    // web-a is gone already: the API answers 404.
    let gone = never_stored("web-a");
    let deletes = vec![gone.clone(), existing[0].clone()];
    let written = pass.write(&api, &plan(&[], Vec::new(), deletes)).await;
    assert_eq!(written.unwrap().deleted, 2);
    assert!(pass.expects_delete(&gone));
    assert!(pass.expects_delete(&existing[0]));
}

#[tokio::test]
async fn delete_answered_conflict_is_a_conflict_to_replan_not_a_delete() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-a", "web-b"]).await;
    // Someone replaces web-a after the plan saw it: its version no longer matches.
    api.rewrite(&existing[0]).await;
    let pass = Pass::new();
    let error = pass
        .write(&api, &plan(&[], Vec::new(), existing.clone()))
        .await;
    assert!(
        matches!(error, Err(WriteError::Conflict { .. })),
        "{error:?}"
    );
    assert_eq!(api.calls(), ["delete web-a"], "the pass stops there");
    assert!(
        !pass.expects_delete(&existing[0]),
        "the slice is still there: the cache must not wait for its delete"
    );
    let errors = pass.metrics.slice_write_errors.get_or_create(&WriteLabels {
        operation: Operation::Delete,
    });
    assert_eq!(errors.get(), 1);
}

#[tokio::test]
async fn deletes_carry_the_uid_and_resource_version_the_plan_saw() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-a"]).await;
    let pass = Pass::new();
    let plan = plan(&[], Vec::new(), existing.clone());
    pass.write(&api, &plan).await.unwrap();
    let expected = Preconditions {
        uid: existing[0].metadata.uid.clone(),
        resource_version: existing[0].metadata.resource_version.clone(),
    };
    assert!(expected.uid.is_some() && expected.resource_version.is_some());
    assert_eq!(api.delete_preconditions("web-a"), [expected]);
}

#[tokio::test]
async fn late_delete_of_an_ended_term_cannot_remove_a_slice_the_new_leader_rewrote() {
    // The old leader planned the delete of the slice at the version it stored; meanwhile the
    // new leader rewrote it (same object, same uid, newer resourceVersion).
    let api = TestApi::new();
    let stored = api.store(&slice("web-", true)).await;
    let name = stored.metadata.name.clone().unwrap();
    let rewritten = api.rewrite(&stored).await;
    let late = plan(&[], Vec::new(), vec![stored]);

    let pass = Pass::new();
    let error = pass.write(&api, &late).await;
    assert!(
        matches!(error, Err(WriteError::Conflict { .. })),
        "{error:?}"
    );
    let kept = api.slices(NAMESPACE);
    assert_eq!(kept.len(), 1, "the rewritten slice is still there");
    assert_eq!(kept[0].metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(
        kept[0].metadata.resource_version,
        rewritten.metadata.resource_version
    );

    // Planned again from the version the cache now shows, the delete goes through.
    let plan = plan(&[], Vec::new(), vec![rewritten]);
    assert_eq!(pass.write(&api, &plan).await.unwrap().deleted, 1);
    assert!(api.slices(NAMESPACE).is_empty());
}

#[tokio::test]
async fn failed_delete_stops_the_pass() {
    let api = TestApi::new().failing(&[("delete web-a", 500)]);
    let existing = stored(&api, &["web-a", "web-b"]).await;
    let pass = Pass::new();
    let error = pass
        .write(&api, &plan(&[], Vec::new(), existing.clone()))
        .await;
    assert!(matches!(error, Err(WriteError::Api { .. })), "{error:?}");
    assert_eq!(api.calls(), ["delete web-a"]);
    assert!(!pass.expects_delete(&existing[0]));
}

#[tokio::test]
async fn term_ending_mid_pass_fences_every_later_call() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-a", "web-b"]).await;
    let pass = Pass::new();
    api.end_term_after(1, &pass.term);
    let plan = plan(&["web-"], existing[..1].to_vec(), existing[1..].to_vec());
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(
        matches!(error, WriteError::Fenced(Fenced::TermEnded { .. })),
        "{error:?}"
    );
    assert_eq!(
        api.calls(),
        ["create web-"],
        "nothing sent after the term ended"
    );
}

/// RenewDeadline and margin of the two tests below: renewed 9.5 s before the pass, the lease is
/// past RenewDeadline − margin (not safely held) but not yet past RenewDeadline.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(1);
const RENEWED_BEFORE: Duration = Duration::from_millis(9500);

#[tokio::test(start_paused = true)]
async fn a_write_waits_for_the_renewal_that_makes_the_lease_safe_again_instead_of_failing_the_pass()
{
    let api = TestApi::new();
    let mut pass = Pass::new();
    let start = Instant::now();
    let (term, renewed) = TestTerm::renewed_at(start - RENEWED_BEFORE, RENEW_DEADLINE, MARGIN);
    pass.term = term;
    // A renewal (slower than RetryPeriod) is answered 300 ms into the pass.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        leadership::testing::renew(&renewed, start);
    });
    let written = pass
        .write(&api, &plan(&["web-"], Vec::new(), Vec::new()))
        .await
        .expect("written once the renewal came");
    assert_eq!(written.created, 1);
    assert_eq!(api.calls(), ["create web-"]);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(300),
        "sent at the renewal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_that_no_renewal_makes_safe_is_refused_at_renew_deadline_and_nothing_is_sent() {
    let api = TestApi::new();
    let mut pass = Pass::new();
    let start = Instant::now();
    (pass.term, _) = TestTerm::renewed_at(start - RENEWED_BEFORE, RENEW_DEADLINE, MARGIN);
    let error = pass
        .write(&api, &plan(&["web-"], Vec::new(), Vec::new()))
        .await
        .unwrap_err();
    assert!(
        matches!(error, WriteError::Fenced(Fenced::LeaseNotSafelyHeld { .. })),
        "{error:?}"
    );
    assert_eq!(start.elapsed(), RENEW_DEADLINE - RENEWED_BEFORE);
    assert!(api.calls().is_empty(), "nothing sent");
}

#[tokio::test]
async fn refusal_by_the_fencing_policy_is_a_fenced_write_that_stops_the_pass() {
    let api = TestApi::new();
    api.deny_as_not_holder("replace web-a");
    let existing = stored(&api, &["web-a", "web-b", "web-c"]).await;
    let pass = Pass::new();
    let plan = plan(&[], existing[..2].to_vec(), existing[2..].to_vec());
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(
        matches!(error, WriteError::Fenced(Fenced::RefusedByApiServer { .. })),
        "{error:?}"
    );
    assert_eq!(api.calls(), ["replace web-a"], "nothing sent after it");
}

#[tokio::test]
async fn rbac_refusal_is_an_api_error_not_a_fenced_write() {
    let api = TestApi::new().failing(&[("replace web-a", 403)]);
    let existing = stored(&api, &["web-a"]).await;
    let pass = Pass::new();
    let error = pass.write(&api, &plan(&[], existing, Vec::new())).await;
    assert!(matches!(error, Err(WriteError::Api { .. })), "{error:?}");
    assert!(!pass.must_read_back(), "a definite refusal changed nothing");
}

#[tokio::test]
async fn delete_refused_by_the_fencing_policy_is_a_fenced_write() {
    let api = TestApi::new();
    api.deny_as_not_holder("delete web-a");
    let existing = stored(&api, &["web-a", "web-b"]).await;
    let pass = Pass::new();
    let error = pass
        .write(&api, &plan(&[], Vec::new(), existing.clone()))
        .await;
    assert!(
        matches!(
            error,
            Err(WriteError::Fenced(Fenced::RefusedByApiServer { .. }))
        ),
        "{error:?}"
    );
    assert_eq!(api.calls(), ["delete web-a"]);
    assert!(!pass.expects_delete(&existing[0]));
    assert_eq!(api.slices(NAMESPACE).len(), 2, "nothing deleted");
}

#[tokio::test(start_paused = true)]
async fn a_write_the_api_server_never_answers_fails_after_the_call_timeout() {
    let timeout = std::time::Duration::from_millis(200);
    let api = TestApi::new().with_call_timeout(timeout);
    let existing = stored(&api, &["web-a"]).await;
    api.hang("replace web-a");
    let pass = Pass::new();
    let plan = plan(&[], existing, Vec::new());
    // Far above the call timeout: only reached when the call is not bounded.
    let hung = std::time::Duration::from_secs(20);
    let error = tokio::time::timeout(hung, pass.write(&api, &plan))
        .await
        .expect("the write still hangs");
    let Err(WriteError::Api { source, .. }) = error else {
        panic!("expected an API error, got {error:?}");
    };
    let kube::Error::Service(cause) = source else {
        panic!("expected a timed-out call, got {source:?}");
    };
    assert!(cause.is::<CallTimedOut>(), "{cause}");
    assert!(
        pass.must_read_back(),
        "no answer: the outcome is unknown until a read shows it"
    );
}

#[tokio::test]
async fn each_answer_enters_the_cache_at_once_and_its_echo_changes_nothing() {
    let api = TestApi::new();
    let existing = stored(&api, &["web-a", "web-b"]).await;
    let pass = Pass::new();
    for slice in &existing {
        drop(pass.caches.slices.apply(CachedSlice::from(slice)));
    }
    let plan = plan(
        &["web-"],
        vec![existing[0].clone()],
        vec![existing[1].clone()],
    );
    pass.write(&api, &plan).await.unwrap();
    let stored = api.slices(NAMESPACE);
    let created = stored
        .iter()
        .find(|slice| slice.metadata.name.as_deref() != Some("web-a"))
        .expect("the created slice");
    let updated = stored
        .iter()
        .find(|slice| slice.metadata.name.as_deref() == Some("web-a"))
        .expect("the updated slice");
    let name = created.metadata.name.as_deref().unwrap();
    assert_eq!(
        pass.cached(name).map(|c| c.resource_version.clone()),
        Some(CachedSlice::from(created).resource_version),
        "the create's answer is cached"
    );
    assert_eq!(
        pass.cached("web-a").map(|c| c.resource_version.clone()),
        Some(CachedSlice::from(updated).resource_version),
        "the update's answer is cached"
    );
    assert!(pass.cached("web-b").is_none(), "the delete is cached");
    // The watch's echoes, late: the create, the version of web-a the plan saw, web-b's delete.
    let slices = &pass.caches.slices;
    assert!(slices.apply(CachedSlice::from(created)).is_none());
    assert!(slices.apply(CachedSlice::from(&existing[0])).is_none());
    assert!(slices.apply(CachedSlice::from(&existing[1])).is_none());
    assert!(slices.delete(CachedSlice::from(&existing[1])).is_none());
    assert!(!pass.must_read_back());
}
