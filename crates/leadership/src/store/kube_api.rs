//! [`LeaseStore`] for the real API server.

use futures::{FutureExt, StreamExt, TryStreamExt, future::BoxFuture, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};

use super::{LeaseStore, StoreError};

/// The named Lease in one namespace, through `kube::Api<Lease>`.
#[derive(Clone)]
pub struct KubeLeaseStore {
    api: Api<Lease>,
    name: String,
}

// === impl KubeLeaseStore ===

impl KubeLeaseStore {
    /// The lease `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Debug for KubeLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LeaseStore for KubeLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        async move { self.api.get_opt(&self.name).await.map_err(api_error) }.boxed()
    }

    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        async move {
            self.api
                .create(&PostParams::default(), &lease)
                .await
                .map_err(api_error)
        }
        .boxed()
    }

    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        // `replace` is a PUT that carries metadata.resourceVersion, so the API server rejects it
        // with 409 if anyone wrote the lease since we read it.
        async move {
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
                .map_err(api_error)
        }
        .boxed()
    }

    fn changes(&self) -> BoxStream<'static, Result<Option<Lease>, StoreError>> {
        watch_named(self.api.clone(), &self.name)
    }
}

/// Changes of the one object `name` of `api` (`None` when it is deleted), for the elector's
/// stores: the Lease and, in coordinated mode, this replica's LeaseCandidate.
pub(crate) fn watch_named<K>(
    api: Api<K>,
    name: &str,
) -> BoxStream<'static, Result<Option<K>, StoreError>>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let fields = format!("metadata.name={name}");
    watcher(api, watcher::Config::default().fields(&fields))
        .default_backoff()
        .map_err(|error| StoreError::Watch(Box::new(error)))
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    Some(Ok(Some(object)))
                }
                Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                Err(error) => Some(Err(error)),
            }
        })
        .boxed()
}

/// A 409 is a lost optimistic-concurrency race; anything else an API failure.
pub(crate) fn api_error(error: kube::Error) -> StoreError {
    match &error {
        kube::Error::Api(status) if status.code == 409 => StoreError::Conflict,
        _ => StoreError::Api(Box::new(error)),
    }
}
