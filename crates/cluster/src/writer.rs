//! The fenced writer: sends a plan's writes, checking the fence immediately before each call.
//!
//! Order: creates, then updates, then deletes, so endpoints are never missing between two calls;
//! no delete once a create or update of the same pass failed; NotFound on delete is success.
//! Each accepted write is recorded in the term's tracker, so the watch echo of our own write
//! triggers nothing and a reconcile waits until the cache shows it.

use std::future::Future;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use leadership::{Fence, Fenced};
use parking_lot::Mutex;
use slices::{ServiceKey, SlicePlan, Tracker, Write};

use crate::metrics::{Metrics, Operation};

/// The API calls the writer makes. The Kubernetes implementation is [`KubeSlices`]; tests
/// substitute one that injects faults at exact points.
pub trait SliceApi: Send + Sync + 'static {
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
    /// Deletes the slice `name` (only the object with `uid`, when given).
    fn delete(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
}

/// [`SliceApi`] through the Kubernetes API.
#[derive(Clone)]
pub struct KubeSlices {
    client: Client,
}

/// Why a pass of writes stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The fence refused a write: the term is over (not retryable in this term; the next term
    /// replays) or the lease is not safely held right now (retryable shortly).
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// Another writer changed a slice first (409). Retryable soon: the cache will catch up.
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
    /// Slices deleted (NotFound included).
    pub deleted: usize,
}

// === impl KubeSlices ===

impl KubeSlices {
    /// Writes through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn api(&self, namespace: &str) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl SliceApi for KubeSlices {
    async fn create(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        self.api(namespace)
            .create(&PostParams::default(), slice)
            .await
    }

    async fn replace(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        self.api(namespace)
            .replace(name, &PostParams::default(), slice)
            .await
    }

    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: uid.map(|uid| kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.api(namespace).delete(name, &params).await.map(|_| ())
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
pub async fn write_plan<W: SliceApi>(
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

/// Deletes `slice` (only that object, by UID); gone already counts as deleted.
async fn delete<W: SliceApi>(
    api: &W,
    key: &ServiceKey,
    slice: &EndpointSlice,
    tracker: &Mutex<Tracker>,
    metrics: &Metrics,
) -> Result<(), WriteError> {
    let name = slice_name(slice);
    let uid = slice.metadata.uid.as_deref();
    match api.delete(&key.namespace, &name, uid).await {
        Ok(()) => {}
        // Already gone (or replaced by another object of that name): success.
        Err(error) if matches!(status_code(&error), Some(404 | 409)) => {}
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
    //! The write path against a fake [`SliceApi`] that fails or ends the term at exact calls.
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use std::collections::HashMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::core::Status;
    use leadership::{FenceMetrics, LeadershipSender, Term, fixed_leadership};
    use prometheus_client::registry::Registry;
    use slices::{CachedSlice, SERVICE_NAME_LABEL};
    use tokio::time::Instant;

    use super::*;

    const NAMESPACE: &str = "ns";

    /// Records every call as `"create <generateName>"`, `"replace <name>"` or `"delete <name>"`;
    /// answers a call listed in `failures` with that HTTP status, and after `end_term_after`
    /// calls ends the term (as a lost lease would, between two calls of one pass).
    #[derive(Default)]
    struct FakeSlices {
        calls: Mutex<Vec<String>>,
        failures: HashMap<String, u16>,
        end_term_after: Option<(usize, LeadershipSender)>,
    }

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

    fn failing(calls: &[(&str, u16)]) -> FakeSlices {
        FakeSlices {
            failures: calls
                .iter()
                .map(|(call, code)| ((*call).into(), *code))
                .collect(),
            ..FakeSlices::default()
        }
    }

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            Status::failure("injected", "Injected")
                .with_code(code)
                .boxed(),
        )
    }

    /// The parts one pass needs: a fence of a term that lasts, a tracker, metrics.
    struct Pass {
        fence: Fence,
        sender: LeadershipSender,
        tracker: Mutex<Tracker>,
        metrics: Metrics,
    }

    impl Pass {
        fn new() -> Self {
            let term = Term::new(Instant::now(), std::time::Duration::from_secs(3600));
            let (sender, leadership) = fixed_leadership(term.clone());
            let fence = Fence::new(
                term,
                leadership,
                std::time::Duration::ZERO,
                FenceMetrics::default(),
            );
            Self {
                fence,
                sender,
                tracker: Mutex::new(Tracker::new()),
                metrics: Metrics::register(&mut Registry::default()),
            }
        }

        async fn write(&self, api: &FakeSlices, plan: &SlicePlan) -> Result<Written, WriteError> {
            let key = ServiceKey::new(NAMESPACE, "web");
            write_plan(api, &key, plan, &self.fence, &self.tracker, &self.metrics).await
        }
    }

    impl FakeSlices {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().clone()
        }

        fn answer(&self, call: String) -> Result<(), kube::Error> {
            let failure = self.failures.get(&call).copied();
            let count = {
                let mut calls = self.calls.lock();
                calls.push(call);
                calls.len()
            };
            if let Some((after, sender)) = &self.end_term_after
                && count == *after
            {
                sender.send_replace(None);
            }
            failure.map_or(Ok(()), |code| Err(status(code)))
        }
    }

    impl SliceApi for FakeSlices {
        async fn create(
            &self,
            _namespace: &str,
            slice: &EndpointSlice,
        ) -> Result<EndpointSlice, kube::Error> {
            let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
            self.answer(format!("create {prefix}"))?;
            let mut created = slice.clone();
            created.metadata.name = Some(format!("{prefix}x1"));
            created.metadata.generation = Some(1);
            created.metadata.resource_version = Some("1".into());
            Ok(created)
        }

        async fn replace(
            &self,
            _namespace: &str,
            slice: &EndpointSlice,
        ) -> Result<EndpointSlice, kube::Error> {
            self.answer(format!("replace {}", slice_name(slice)))?;
            let mut updated = slice.clone();
            updated.metadata.generation = Some(2);
            updated.metadata.resource_version = Some("2".into());
            Ok(updated)
        }

        async fn delete(
            &self,
            _namespace: &str,
            name: &str,
            uid: Option<&str>,
        ) -> Result<(), kube::Error> {
            assert_eq!(uid, Some(format!("uid-{name}").as_str()), "delete by UID");
            self.answer(format!("delete {name}"))
        }
    }

    #[tokio::test]
    async fn writes_creates_then_updates_then_deletes_and_records_each() {
        let api = FakeSlices::default();
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
        let api = failing(&[("create web-", 500)]);
        let pass = Pass::new();
        let plan = plan(&["web-"], &["web-a"], &["web-b", "web-c"]);
        let error = pass.write(&api, &plan).await.unwrap_err();
        assert!(matches!(error, WriteError::Api { .. }), "{error:?}");
        assert_eq!(api.calls(), ["create web-", "replace web-a"]);
    }

    #[tokio::test]
    async fn conflicting_update_is_reported_as_conflict_and_blocks_the_deletes() {
        let api = failing(&[("replace web-a", 409)]);
        let pass = Pass::new();
        let plan = plan(&[], &["web-a", "web-b"], &["web-c"]);
        let error = pass.write(&api, &plan).await.unwrap_err();
        assert!(matches!(error, WriteError::Conflict { .. }), "{error:?}");
        assert_eq!(api.calls(), ["replace web-a", "replace web-b"]);
    }

    #[tokio::test]
    async fn delete_answered_not_found_or_conflict_counts_as_deleted() {
        let api = failing(&[("delete web-a", 404), ("delete web-b", 409)]);
        let pass = Pass::new();
        let written = pass.write(&api, &plan(&[], &[], &["web-a", "web-b"])).await;
        assert_eq!(written.unwrap().deleted, 2);
        let tracker = pass.tracker.lock();
        assert!(tracker.is_expected_delete(&cached("web-a", false)));
        assert!(tracker.is_expected_delete(&cached("web-b", false)));
    }

    #[tokio::test]
    async fn failed_delete_stops_the_pass() {
        let api = failing(&[("delete web-a", 500)]);
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
        let api = FakeSlices {
            end_term_after: Some((1, pass.sender.clone())),
            ..FakeSlices::default()
        };
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
}
