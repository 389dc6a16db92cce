//! The write path against a fake [`WriteApi`] that fails or ends the term at exact calls, or
//! that stands for an API server checking versions ([`SliceServer`]).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus_client::registry::Registry;
use slices::{CachedSlice, SERVICE_NAME_LABEL};

use super::*;
use crate::{
    fake::{FakeApi, SliceServer, TestTerm},
    metrics::WriteLabels,
};

const NAMESPACE: &str = "ns";

/// The resourceVersion of every existing slice the plans of these tests were made from.
const PLANNED_VERSION: &str = "7";

fn slice(name: &str, generate_name: bool) -> EndpointSlice {
    let mut metadata = ObjectMeta {
        namespace: Some(NAMESPACE.into()),
        uid: Some(format!("uid-{name}")),
        labels: Some([(SERVICE_NAME_LABEL.to_owned(), "web".to_owned())].into()),
        ..ObjectMeta::default()
    };
    if generate_name {
        metadata.generate_name = Some(name.into());
    } else {
        metadata.name = Some(name.into());
        metadata.resource_version = Some(PLANNED_VERSION.into());
    }
    EndpointSlice {
        metadata,
        ..EndpointSlice::default()
    }
}

fn cached(name: &str, generate_name: bool) -> CachedSlice {
    CachedSlice::from(&slice(name, generate_name))
}

fn plan(creates: &[&str], updates: &[&str], deletes: &[&str]) -> SlicePlan {
    let existing = |names: &[&str]| names.iter().map(|name| slice(name, false)).collect();
    SlicePlan {
        creates: creates.iter().map(|name| slice(name, true)).collect(),
        updates: existing(updates),
        deletes: existing(deletes),
        diagnostics: Vec::new(),
    }
}

/// The parts one pass needs: a term that lasts until a test ends it, a tracker, metrics.
struct Pass {
    term: TestTerm,
    tracker: Mutex<Tracker>,
    metrics: Metrics,
    rate: WriteRate,
    timing: Timing,
}

impl Pass {
    fn new() -> Self {
        let metrics = Metrics::register(&mut Registry::default());
        Self {
            term: TestTerm::new(),
            tracker: Mutex::new(Tracker::new()),
            timing: Timing::new(metrics.timing.clone()),
            metrics,
            rate: WriteRate::unlimited(),
        }
    }

    async fn write(&self, api: &impl WriteApi, plan: &SlicePlan) -> Result<Written, WriteError> {
        let key = ServiceKey::new(NAMESPACE, "web");
        let pass = super::Pass {
            api,
            key: &key,
            fence: &self.term.fence,
            tracker: &self.tracker,
            metrics: &self.metrics,
            rate: &self.rate,
            timing: &self.timing,
        };
        write_plan(&pass, plan).await
    }
}

#[tokio::test]
async fn writes_creates_then_updates_then_deletes_and_records_each() {
    let api = FakeApi::default();
    let pass = Pass::new();
    let plan = plan(&["web-"], &["web-a"], &["web-b"]);
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
    let tracker = pass.tracker.lock();
    let mut created = slice("web-x1", false);
    created.metadata.resource_version = Some("1".into());
    assert!(
        tracker.is_own_write(&CachedSlice::from(&created)),
        "create recorded"
    );
    assert!(
        tracker.is_expected_delete(&cached("web-b", false)),
        "delete recorded"
    );
}

#[tokio::test]
async fn failed_create_sends_the_updates_but_no_delete() {
    let api = FakeApi::failing(&[("create web-", 500)]);
    let pass = Pass::new();
    let plan = plan(&["web-"], &["web-a"], &["web-b", "web-c"]);
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(matches!(error, WriteError::Api { .. }), "{error:?}");
    assert_eq!(api.calls(), ["create web-", "replace web-a"]);
}

#[tokio::test]
async fn conflicting_update_is_reported_as_conflict_and_blocks_the_deletes() {
    let api = FakeApi::failing(&[("replace web-a", 409)]);
    let pass = Pass::new();
    let plan = plan(&[], &["web-a", "web-b"], &["web-c"]);
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(matches!(error, WriteError::Conflict { .. }), "{error:?}");
    assert_eq!(api.calls(), ["replace web-a", "replace web-b"]);
}

#[tokio::test]
async fn delete_answered_not_found_counts_as_deleted() {
    let api = FakeApi::failing(&[("delete web-a", 404)]);
    let pass = Pass::new();
    let written = pass.write(&api, &plan(&[], &[], &["web-a", "web-b"])).await;
    assert_eq!(written.unwrap().deleted, 2);
    let tracker = pass.tracker.lock();
    assert!(tracker.is_expected_delete(&cached("web-a", false)));
    assert!(tracker.is_expected_delete(&cached("web-b", false)));
}

#[tokio::test]
async fn delete_answered_conflict_is_a_conflict_to_replan_not_a_delete() {
    let api = FakeApi::failing(&[("delete web-a", 409)]);
    let pass = Pass::new();
    let error = pass.write(&api, &plan(&[], &[], &["web-a", "web-b"])).await;
    assert!(
        matches!(error, Err(WriteError::Conflict { .. })),
        "{error:?}"
    );
    assert_eq!(api.calls(), ["delete web-a"], "the pass stops there");
    let tracker = pass.tracker.lock();
    assert!(
        !tracker.is_expected_delete(&cached("web-a", false)),
        "the slice is still there: the cache must not wait for its delete"
    );
    let errors = pass.metrics.slice_write_errors.get_or_create(&WriteLabels {
        operation: Operation::Delete,
    });
    assert_eq!(errors.get(), 1);
}

#[tokio::test]
async fn deletes_carry_the_uid_and_resource_version_the_plan_saw() {
    let api = FakeApi::default();
    let pass = Pass::new();
    pass.write(&api, &plan(&[], &[], &["web-a"])).await.unwrap();
    let expected = Preconditions {
        uid: Some("uid-web-a".into()),
        resource_version: Some(PLANNED_VERSION.into()),
    };
    assert_eq!(api.delete_preconditions("web-a"), [expected]);
}

#[tokio::test]
async fn late_delete_of_an_ended_term_cannot_remove_a_slice_the_new_leader_rewrote() {
    // The old leader planned the delete of web-a at PLANNED_VERSION; meanwhile the new
    // leader rewrote web-a (same object, same uid, newer resourceVersion).
    let server = SliceServer::new(Duration::ZERO);
    let mut stored = slice("web-", true);
    stored.metadata.uid = None;
    let stored = server.create(NAMESPACE, &stored).unwrap();
    let name = stored.metadata.name.clone().unwrap();
    let rewritten = server.replace(NAMESPACE, &stored).unwrap();
    let mut late = rewritten.clone();
    late.metadata.resource_version = stored.metadata.resource_version.clone();
    let plan = SlicePlan {
        deletes: vec![late],
        ..SlicePlan::default()
    };

    let api = FakeApi::backed_by(server.clone());
    let pass = Pass::new();
    let error = pass.write(&api, &plan).await;
    assert!(
        matches!(error, Err(WriteError::Conflict { .. })),
        "{error:?}"
    );
    let kept = server.slices_of(NAMESPACE, "web");
    assert_eq!(kept.len(), 1, "the rewritten slice is still there");
    assert_eq!(kept[0].metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(
        kept[0].metadata.resource_version,
        rewritten.metadata.resource_version
    );

    // Planned again from the version the cache now shows, the delete goes through.
    let plan = SlicePlan {
        deletes: vec![rewritten],
        ..SlicePlan::default()
    };
    assert_eq!(pass.write(&api, &plan).await.unwrap().deleted, 1);
    assert!(server.slices_of(NAMESPACE, "web").is_empty());
}

#[tokio::test]
async fn failed_delete_stops_the_pass() {
    let api = FakeApi::failing(&[("delete web-a", 500)]);
    let pass = Pass::new();
    let error = pass.write(&api, &plan(&[], &[], &["web-a", "web-b"])).await;
    assert!(matches!(error, Err(WriteError::Api { .. })), "{error:?}");
    assert_eq!(api.calls(), ["delete web-a"]);
    assert!(
        !pass
            .tracker
            .lock()
            .is_expected_delete(&cached("web-a", false))
    );
}

#[tokio::test]
async fn term_ending_mid_pass_fences_every_later_call() {
    let pass = Pass::new();
    let api = FakeApi::ending_term_after(1, &pass.term);
    let plan = plan(&["web-"], &["web-a"], &["web-b"]);
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

#[tokio::test]
async fn refusal_by_the_fencing_policy_is_a_fenced_write_that_stops_the_pass() {
    let api = FakeApi::default();
    api.deny_as_not_holder("replace web-a");
    let pass = Pass::new();
    let plan = plan(&[], &["web-a", "web-b"], &["web-c"]);
    let error = pass.write(&api, &plan).await.unwrap_err();
    assert!(
        matches!(error, WriteError::Fenced(Fenced::RefusedByApiServer { .. })),
        "{error:?}"
    );
    assert_eq!(api.calls(), ["replace web-a"], "nothing sent after it");
}

#[tokio::test]
async fn rbac_refusal_is_an_api_error_not_a_fenced_write() {
    let api = FakeApi::failing(&[("replace web-a", 403)]);
    let pass = Pass::new();
    let error = pass.write(&api, &plan(&[], &["web-a"], &[])).await;
    assert!(matches!(error, Err(WriteError::Api { .. })), "{error:?}");
}

#[tokio::test]
async fn delete_refused_by_the_fencing_policy_is_a_fenced_write() {
    let api = FakeApi::default();
    api.deny_as_not_holder("delete web-a");
    let pass = Pass::new();
    let error = pass.write(&api, &plan(&[], &[], &["web-a", "web-b"])).await;
    assert!(
        matches!(
            error,
            Err(WriteError::Fenced(Fenced::RefusedByApiServer { .. }))
        ),
        "{error:?}"
    );
    assert_eq!(api.calls(), ["delete web-a"]);
    assert!(
        !pass
            .tracker
            .lock()
            .is_expected_delete(&cached("web-a", false))
    );
}

/// A client of an API server that accepts connections and never answers (as one whose
/// storage is down may); the listener thread holds every connection open.
fn silent_api_server() -> Client {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap()
}

#[tokio::test]
async fn a_write_the_api_server_never_answers_fails_after_the_call_timeout() {
    let reporter = Reporter {
        controller: "test".into(),
        instance: None,
    };
    let timeout = std::time::Duration::from_millis(200);
    let api = KubeWrites::new(silent_api_server(), reporter).with_call_timeout(timeout);
    let pass = Pass::new();
    let plan = plan(&[], &["web-a"], &[]);
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
}
