//! The fenced writer: sends a plan's writes, checking the fence immediately before each call.
//! Everything the controller writes to the API (slices and Events) goes through [`WriteApi`].
//!
//! Order: creates, then updates, then deletes, so endpoints are never missing between two calls;
//! no delete once a create or update of the same pass failed; NotFound on delete is success.
//! Each accepted write is recorded in the term's tracker, so the watch echo of our own write
//! triggers nothing and a reconcile waits until the cache shows it.
//!
//! Every write is guarded by the version the plan was made from: updates by resourceVersion
//! (a replace), deletes by uid and resourceVersion (preconditions). A write that was planned on
//! a version someone has since changed (a late write of an ended term racing the new leader's
//! rewrite, another writer) is refused with 409 and reported as [`WriteError::Conflict`]: the
//! Service is planned again once the cache shows the newer version (issue 16).

use std::{future::Future, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams, Preconditions},
    runtime::events::{Event, Recorder, Reporter},
};
use leadership::{Fence, Fenced};
use parking_lot::Mutex;
use slices::{ServiceKey, SlicePlan, Tracker, Write};

use crate::metrics::{Metrics, Operation};

/// The API calls the controller writes with. The Kubernetes implementation is [`KubeWrites`];
/// tests substitute one that records calls and injects faults at exact points.
pub trait WriteApi: Send + Sync + 'static {
    /// Creates `slice` (which has a generateName) in `namespace`.
    fn create(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> impl Future<Output = Result<EndpointSlice, kube::Error>> + Send;
    /// Replaces the slice of the same name, guarded by its resourceVersion.
    fn replace(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> impl Future<Output = Result<EndpointSlice, kube::Error>> + Send;
    /// Deletes the slice `name`, only while it still matches `preconditions` (its uid and
    /// resourceVersion as the plan saw them); a mismatch is answered 409.
    fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Publishes `event` about the object `regarding`.
    fn publish_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
}

/// How long one API write may take before the writer gives up on it and the reconcile is
/// retried with backoff. A write the API server never answers (its storage down, a response lost)
/// would otherwise hold a worker until the client's read timeout (295 s); the server itself gives
/// up on its storage after 60 s (`--request-timeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// [`WriteApi`] through the Kubernetes API.
#[derive(Clone)]
pub struct KubeWrites {
    client: Client,
    events: Recorder,
    call_timeout: Duration,
}

/// A write the API server did not answer within the call timeout.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the API server within {0:?}")]
pub struct CallTimedOut(Duration);

/// Why a pass of writes stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The fence refused a write: the term is over (not retryable in this term; the next term
    /// replays) or the lease is not safely held right now (retryable shortly).
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The slice changed since the plan saw it (409 on an update, or on a delete whose uid or
    /// resourceVersion precondition failed). Retryable soon: re-plan once the cache catches up.
    #[error("conflict writing slice {slice}: {source}")]
    Conflict {
        /// The slice name (or generateName).
        slice: String,
        /// The API error.
        source: kube::Error,
    },
    /// The API refused or failed a write. Retryable with backoff.
    #[error("writing slice {slice} failed: {source}")]
    Api {
        /// The slice name (or generateName).
        slice: String,
        /// The API error.
        source: kube::Error,
    },
}

/// What a pass wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Slices created.
    pub created: usize,
    /// Slices updated.
    pub updated: usize,
    /// Slices deleted (NotFound included; a conflict is not a delete).
    pub deleted: usize,
}

// === impl KubeWrites ===

impl KubeWrites {
    /// Writes through `client`; Events name `reporter` as their source.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            events: Recorder::new(client.clone(), reporter),
            client,
            call_timeout: CALL_TIMEOUT,
        }
    }

    /// Gives up on each call after `call_timeout` instead of [`CALL_TIMEOUT`].
    #[cfg(test)]
    fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.call_timeout = call_timeout;
        self
    }

    /// Runs `call`, or fails with [`CallTimedOut`] when it takes longer than the call timeout
    /// (the call is dropped; the server may still apply it, which the next pass sees).
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(Box::new(CallTimedOut(
                self.call_timeout,
            )))),
        }
    }

    fn api(&self, namespace: &str) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl WriteApi for KubeWrites {
    async fn create(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let api = self.api(namespace);
        self.bounded(api.create(&PostParams::default(), slice))
            .await
    }

    async fn replace(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        let api = self.api(namespace);
        self.bounded(api.replace(name, &PostParams::default(), slice))
            .await
    }

    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: Some(preconditions.clone()),
            ..DeleteParams::default()
        };
        let api = self.api(namespace);
        self.bounded(api.delete(name, &params)).await.map(|_| ())
    }

    async fn publish_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.bounded(self.events.publish(event, regarding)).await
    }
}

// === impl WriteError ===

impl WriteError {
    fn from_api(slice: &EndpointSlice, source: kube::Error) -> Self {
        let slice = slice_name(slice);
        if status_code(&source) == Some(409) {
            WriteError::Conflict { slice, source }
        } else {
            WriteError::Api { slice, source }
        }
    }
}

/// Sends `plan`'s writes for `key`, fenced, recording each accepted write in `tracker`.
///
/// Returns the first error after sending every create and update it could; deletes are skipped
/// once anything failed. A fenced write stops the pass at once.
pub async fn write_plan<W: WriteApi>(
    api: &W,
    key: &ServiceKey,
    plan: &SlicePlan,
    fence: &Fence,
    tracker: &Mutex<Tracker>,
    metrics: &Metrics,
) -> Result<Written, WriteError> {
    let namespace = key.namespace.as_str();
    let mut written = Written::default();
    let mut first_error = None;
    for write in plan.writes() {
        if first_error.is_some() && matches!(write, Write::Delete(_)) {
            break;
        }
        // Immediately before the call: a deposed leader writes nothing.
        fence.check()?;
        let (operation, slice, sent, count) = match write {
            Write::Create(slice) => (
                Operation::Create,
                slice,
                api.create(namespace, slice).await,
                &mut written.created,
            ),
            Write::Update(slice) => (
                Operation::Update,
                slice,
                api.replace(namespace, slice).await,
                &mut written.updated,
            ),
            Write::Delete(slice) => {
                delete(api, key, slice, tracker, metrics).await?;
                written.deleted += 1;
                continue;
            }
        };
        match sent {
            Ok(stored) => {
                tracker.lock().record_write(key, &stored);
                metrics.count_write(operation);
                *count += 1;
                tracing::debug!(
                    slice = %slice_name(&stored),
                    version = stored.metadata.resource_version.as_deref(),
                    ?operation,
                    "wrote slice"
                );
            }
            Err(error) => {
                metrics.count_write_error(operation);
                first_error.get_or_insert(WriteError::from_api(slice, error));
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(written),
    }
}

/// Deletes `slice`, only that object in the version the plan saw (uid and resourceVersion
/// preconditions); gone already counts as deleted.
///
/// The resourceVersion precondition is what fences a late delete: a delete planned in an ended
/// term, arriving after the new leader rewrote the slice (same uid, newer version), is refused
/// with 409 instead of removing the new leader's endpoints. A 409 is a [`WriteError::Conflict`]
/// (re-plan), never a success: the slice is still there, perhaps with endpoints to keep.
async fn delete<W: WriteApi>(
    api: &W,
    key: &ServiceKey,
    slice: &EndpointSlice,
    tracker: &Mutex<Tracker>,
    metrics: &Metrics,
) -> Result<(), WriteError> {
    let name = slice_name(slice);
    let preconditions = Preconditions {
        uid: slice.metadata.uid.clone(),
        resource_version: slice.metadata.resource_version.clone(),
    };
    match api.delete(&key.namespace, &name, &preconditions).await {
        Ok(()) => {}
        // Already gone: success.
        Err(error) if status_code(&error) == Some(404) => {}
        Err(error) => {
            metrics.count_write_error(Operation::Delete);
            return Err(WriteError::from_api(slice, error));
        }
    }
    tracker.lock().record_delete(key, slice);
    metrics.count_write(Operation::Delete);
    tracing::debug!(slice = %name, "deleted slice");
    Ok(())
}

fn slice_name(slice: &EndpointSlice) -> String {
    slice
        .metadata
        .name
        .clone()
        .or_else(|| slice.metadata.generate_name.clone())
        .unwrap_or_default()
}

/// The HTTP status of an API error, if it is one.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    //! The write path against a fake [`WriteApi`] that fails or ends the term at exact calls.
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
    }

    impl Pass {
        fn new() -> Self {
            Self {
                term: TestTerm::new(),
                tracker: Mutex::new(Tracker::new()),
                metrics: Metrics::register(&mut Registry::default()),
            }
        }

        async fn write(
            &self,
            api: &impl WriteApi,
            plan: &SlicePlan,
        ) -> Result<Written, WriteError> {
            let key = ServiceKey::new(NAMESPACE, "web");
            let fence = &self.term.fence;
            write_plan(api, &key, plan, fence, &self.tracker, &self.metrics).await
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
}
