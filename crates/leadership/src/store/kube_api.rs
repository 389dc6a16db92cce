//! [`LeaseStore`] for the real API server.

use std::time::Duration;

use futures::{FutureExt, StreamExt, future::BoxFuture, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::PostParams};
use tracing::Instrument;

use super::{LeaseStore, StoreError};
use kube_watch_loop::{Event, WatchConfig, WatchLoop};

/// The named Lease in one namespace, through `kube::Api<Lease>`.
#[derive(Clone)]
pub struct KubeLeaseStore {
    api: Api<Lease>,
    name: String,
    /// The stall bound of the lease watch.
    stall_bound: Duration,
}

// === impl KubeLeaseStore ===

impl KubeLeaseStore {
    /// The lease `name` in `namespace`; its watch is stalled when silent for `stall_bound`.
    pub fn new(client: Client, namespace: &str, name: &str, stall_bound: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            stall_bound,
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
        watch_named(self.api.clone(), &self.name, self.stall_bound)
    }
}

/// Changes of the one object `name` of `api` (`None` when it is deleted), for the elector's
/// stores: the Lease and, in coordinated mode, this replica's LeaseCandidate. The stream runs
/// on the watch loop of the `kube-watch-loop` crate, so it resumes, re-lists and backs off by
/// the same rules as every other watch, and never ends or fails: errors are retried inside it.
pub(crate) fn watch_named<K>(
    api: Api<K>,
    name: &str,
    stall_bound: Duration,
) -> BoxStream<'static, Result<Option<K>, StoreError>>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    let config = WatchConfig::new(stall_bound).fields(format!("metadata.name={name}"));
    let watch = WatchLoop::new(api, config, ());
    // Every line the loop logs names the kind, as the app's watches do.
    let span = tracing::info_span!("watch", kind = %K::kind(&K::DynamicType::default()));
    futures::stream::unfold(watch, move |mut watch| {
        let span = span.clone();
        async move {
            let event = watch.next().instrument(span).await;
            Some((event, watch))
        }
    })
    .filter_map(|event| {
        std::future::ready(match event {
            Event::Apply(object) | Event::Listed(object) => Some(Ok(Some(object))),
            Event::Delete(_) => Some(Ok(None)),
            Event::ListStart | Event::ListDone(_) | Event::Progress(_) => None,
        })
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
