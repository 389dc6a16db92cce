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
        match write {
            Write::Create(slice) => match api.create(namespace, slice).await {
                Ok(created) => {
                    tracker.lock().record_write(key, &created);
                    metrics.count_write(Operation::Create);
                    written.created += 1;
                    tracing::debug!(
                        slice = %slice_name(&created),
                        version = created.metadata.resource_version.as_deref(),
                        "created slice"
                    );
                }
                Err(error) => {
                    metrics.count_write_error(Operation::Create);
                    first_error.get_or_insert(WriteError::from_api(slice, error));
                }
            },
            Write::Update(slice) => match api.replace(namespace, slice).await {
                Ok(updated) => {
                    tracker.lock().record_write(key, &updated);
                    metrics.count_write(Operation::Update);
                    written.updated += 1;
                    tracing::debug!(
                        slice = %slice_name(&updated),
                        version = updated.metadata.resource_version.as_deref(),
                        "updated slice"
                    );
                }
                Err(error) => {
                    metrics.count_write_error(Operation::Update);
                    first_error.get_or_insert(WriteError::from_api(slice, error));
                }
            },
            Write::Delete(slice) => {
                let name = slice_name(slice);
                let uid = slice.metadata.uid.as_deref();
                match api.delete(namespace, &name, uid).await {
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
                written.deleted += 1;
                tracing::debug!(slice = %name, "deleted slice");
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(written),
    }
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
