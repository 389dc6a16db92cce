//! Access to the one Lease object the elector competes for.
//!
//! [`LeaseStore`] is the small surface the elector needs (get, create, replace guarded by
//! resourceVersion, and a stream of changes). [`KubeLeaseStore`] implements it with `kube::Api`;
//! `MemoryLeaseStore` (this crate's tests) implements it in memory with the API server's
//! optimistic-concurrency semantics and fault injection, for the elector's paused-time tests.
//!
//! The trait is crate-private: an app picks a store through [`LeaseElector`]'s constructors
//! (`LeaseElector::for_client`).
//!
//! [`LeaseElector`]: crate::LeaseElector

pub(crate) mod kube_api;
#[cfg(test)]
mod memory;

use futures::{future::BoxFuture, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;

pub use self::kube_api::KubeLeaseStore;
#[cfg(test)]
pub use self::memory::MemoryLeaseStore;

/// Reads and writes one named Lease.
///
/// Writes are optimistic: [`replace`](LeaseStore::replace) must fail with
/// [`StoreError::Conflict`] when the lease's `metadata.resourceVersion` is not the stored one, and
/// [`create`](LeaseStore::create) when the lease already exists.
pub trait LeaseStore: Send + Sync + 'static {
    /// Reads the lease; `Ok(None)` when it does not exist.
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>>;

    /// Creates the lease; [`StoreError::Conflict`] when it already exists.
    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>>;

    /// Replaces the lease if its resourceVersion is still the stored one;
    /// [`StoreError::Conflict`] otherwise.
    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>>;

    /// Changes of the lease as they happen (`None` when it is deleted or missing). The stream may
    /// end or yield errors; the elector then keeps polling and asks for a new stream later.
    fn changes(&self) -> BoxStream<'static, Result<Option<Lease>, StoreError>>;
}

impl LeaseStore for Box<dyn LeaseStore> {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        (**self).get()
    }

    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        (**self).create(lease)
    }

    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, StoreError>> {
        (**self).replace(lease)
    }

    fn changes(&self) -> BoxStream<'static, Result<Option<Lease>, StoreError>> {
        (**self).changes()
    }
}

/// Why a lease request failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The write lost an optimistic-concurrency race (409: resourceVersion changed, or the lease
    /// already exists). Retryable after re-reading the lease.
    #[error("lease was changed concurrently (conflict)")]
    Conflict,
    /// The API answered with another error (e.g. 403, 500, 503). Retryable: the elector retries
    /// every RetryPeriod; a persistent 403 means RBAC is missing.
    #[error("lease API request failed: {0}")]
    Api(#[source] Box<kube::Error>),
    /// A failure injected by `MemoryLeaseStore` in tests. Retryable.
    #[cfg(test)]
    #[error("injected failure")]
    Injected,
}
