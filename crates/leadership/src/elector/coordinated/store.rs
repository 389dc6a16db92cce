//! Access to this replica's own LeaseCandidate, and reads of the others of its namespace.

use std::time::Duration;

use futures::{FutureExt, future::BoxFuture, stream::BoxStream};
use k8s_openapi::api::coordination::v1beta1::LeaseCandidate;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};

use crate::store::{
    StoreError,
    kube_api::{api_error, watch_named},
};

/// Reads and writes one named LeaseCandidate, with the same optimistic-concurrency rules as
/// [`LeaseStore`](crate::LeaseStore): [`replace`](LeaseCandidateStore::replace) fails with
/// [`StoreError::Conflict`] when the resourceVersion is not the stored one, and
/// [`create`](LeaseCandidateStore::create) when the object exists.
pub trait LeaseCandidateStore: Send + Sync + 'static {
    /// Reads the candidate; `Ok(None)` when it does not exist.
    fn get(&self) -> BoxFuture<'_, Result<Option<LeaseCandidate>, StoreError>>;

    /// Reads the LeaseCandidate `name` of the same namespace (another candidate: the one the
    /// election controller prefers); `Ok(None)` when it does not exist.
    fn get_named<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseCandidate>, StoreError>>;

    /// Creates the candidate; [`StoreError::Conflict`] when it already exists.
    fn create(
        &self,
        candidate: LeaseCandidate,
    ) -> BoxFuture<'_, Result<LeaseCandidate, StoreError>>;

    /// Replaces the candidate if its resourceVersion is still the stored one.
    fn replace(
        &self,
        candidate: LeaseCandidate,
    ) -> BoxFuture<'_, Result<LeaseCandidate, StoreError>>;

    /// Deletes the candidate; a missing one is not an error.
    fn delete(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Changes of the candidate as they happen (`None` when it is deleted). The stream may end
    /// or yield errors; the publisher then asks for a new stream at its next renewal.
    fn changes(&self) -> BoxStream<'static, Result<Option<LeaseCandidate>, StoreError>>;
}

/// The named LeaseCandidate in one namespace, through `kube::Api<LeaseCandidate>`.
#[derive(Clone)]
pub struct KubeLeaseCandidateStore {
    api: Api<LeaseCandidate>,
    name: String,
    /// The stall bound of the candidate's watch.
    stall_bound: Duration,
}

// === impl KubeLeaseCandidateStore ===

impl KubeLeaseCandidateStore {
    /// The LeaseCandidate `name` (the candidate's identity) in `namespace` (the Lease's); its
    /// watch is stalled when silent for `stall_bound`.
    pub fn new(client: Client, namespace: &str, name: &str, stall_bound: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            stall_bound,
        }
    }
}

impl std::fmt::Debug for KubeLeaseCandidateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseCandidateStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LeaseCandidateStore for KubeLeaseCandidateStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<LeaseCandidate>, StoreError>> {
        self.get_named(&self.name)
    }

    fn get_named<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseCandidate>, StoreError>> {
        async move { self.api.get_opt(name).await.map_err(api_error) }.boxed()
    }

    fn create(
        &self,
        candidate: LeaseCandidate,
    ) -> BoxFuture<'_, Result<LeaseCandidate, StoreError>> {
        async move {
            self.api
                .create(&PostParams::default(), &candidate)
                .await
                .map_err(api_error)
        }
        .boxed()
    }

    fn replace(
        &self,
        candidate: LeaseCandidate,
    ) -> BoxFuture<'_, Result<LeaseCandidate, StoreError>> {
        async move {
            self.api
                .replace(&self.name, &PostParams::default(), &candidate)
                .await
                .map_err(api_error)
        }
        .boxed()
    }

    fn delete(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            match self.api.delete(&self.name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                Err(error) => Err(api_error(error)),
            }
        }
        .boxed()
    }

    fn changes(&self) -> BoxStream<'static, Result<Option<LeaseCandidate>, StoreError>> {
        watch_named(self.api.clone(), &self.name, self.stall_bound)
    }
}

#[cfg(test)]
pub(super) use self::memory::MemoryLeaseCandidateStore;

#[cfg(test)]
mod memory {
    //! An in-memory LeaseCandidate with the API server's concurrency rules, for paused-time
    //! tests. Clones share the object, as the election controller and the replica share it.

    use std::{
        collections::BTreeMap,
        sync::{
            Arc,
            atomic::{AtomicBool, AtomicU64, Ordering},
        },
    };

    use futures::{FutureExt, StreamExt, future::BoxFuture, stream::BoxStream};
    use k8s_openapi::api::coordination::v1beta1::LeaseCandidate;
    use parking_lot::Mutex;
    use tokio::sync::watch;

    use super::LeaseCandidateStore;
    use crate::store::StoreError;

    #[derive(Clone, Debug)]
    pub(in crate::elector) struct MemoryLeaseCandidateStore {
        object: Arc<watch::Sender<Option<LeaseCandidate>>>,
        next_version: Arc<AtomicU64>,
        /// Every successful write, in order (`None` for a delete).
        writes: Arc<Mutex<Vec<Option<LeaseCandidate>>>>,
        /// The other candidates of the namespace, by name.
        others: Arc<Mutex<BTreeMap<String, LeaseCandidate>>>,
        /// Whether reads of the other candidates fail.
        failing_reads: Arc<AtomicBool>,
        /// How many reads of a named candidate were made.
        named_reads: Arc<AtomicU64>,
    }

    impl MemoryLeaseCandidateStore {
        pub(in crate::elector) fn new() -> Self {
            Self {
                object: Arc::new(watch::channel(None).0),
                next_version: Arc::new(AtomicU64::new(1)),
                writes: Arc::default(),
                others: Arc::default(),
                failing_reads: Arc::default(),
                named_reads: Arc::default(),
            }
        }

        /// Puts another candidate (named in its metadata) beside ours, or replaces it.
        pub(in crate::elector) fn put_other(&self, candidate: LeaseCandidate) {
            let name = candidate.metadata.name.clone().unwrap_or_default();
            self.others.lock().insert(name, candidate);
        }

        /// Makes the reads of the other candidates fail (or succeed again).
        pub(in crate::elector) fn fail_reads_of_others(&self, failing: bool) {
            self.failing_reads.store(failing, Ordering::SeqCst);
        }

        /// How many reads of a named candidate were made (each preference weighed is one).
        pub(in crate::elector) fn named_reads(&self) -> u64 {
            self.named_reads.load(Ordering::SeqCst)
        }

        pub(in crate::elector) fn current(&self) -> Option<LeaseCandidate> {
            self.object.borrow().clone()
        }

        pub(in crate::elector) fn writes(&self) -> Vec<Option<LeaseCandidate>> {
            self.writes.lock().clone()
        }

        /// Writes as another party (the election controller) would, ignoring resourceVersion.
        pub(in crate::elector) fn put(&self, candidate: LeaseCandidate) {
            let stamped = self.stamp(candidate);
            self.object.send_replace(Some(stamped));
        }

        fn stamp(&self, mut candidate: LeaseCandidate) -> LeaseCandidate {
            let version = self.next_version.fetch_add(1, Ordering::SeqCst);
            candidate.metadata.resource_version = Some(version.to_string());
            candidate
        }

        fn write(
            &self,
            candidate: LeaseCandidate,
            allowed: impl Fn(&Option<LeaseCandidate>) -> bool,
        ) -> Result<LeaseCandidate, StoreError> {
            let mut written = None;
            self.object.send_if_modified(|current| {
                if !allowed(current) {
                    return false;
                }
                let stamped = self.stamp(candidate.clone());
                self.writes.lock().push(Some(stamped.clone()));
                *current = Some(stamped.clone());
                written = Some(stamped);
                true
            });
            written.ok_or(StoreError::Conflict)
        }
    }

    impl LeaseCandidateStore for MemoryLeaseCandidateStore {
        fn get(&self) -> BoxFuture<'_, Result<Option<LeaseCandidate>, StoreError>> {
            async move { Ok(self.current()) }.boxed()
        }

        fn get_named<'a>(
            &'a self,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<LeaseCandidate>, StoreError>> {
            async move {
                self.named_reads.fetch_add(1, Ordering::SeqCst);
                if self.failing_reads.load(Ordering::SeqCst) {
                    return Err(StoreError::Injected);
                }
                let own = self
                    .current()
                    .filter(|own| own.metadata.name.as_deref() == Some(name));
                Ok(own.or_else(|| self.others.lock().get(name).cloned()))
            }
            .boxed()
        }

        fn create(
            &self,
            candidate: LeaseCandidate,
        ) -> BoxFuture<'_, Result<LeaseCandidate, StoreError>> {
            async move { self.write(candidate, Option::is_none) }.boxed()
        }

        fn replace(
            &self,
            candidate: LeaseCandidate,
        ) -> BoxFuture<'_, Result<LeaseCandidate, StoreError>> {
            let version = candidate.metadata.resource_version.clone();
            async move {
                self.write(candidate, |current| {
                    current
                        .as_ref()
                        .is_some_and(|stored| stored.metadata.resource_version == version)
                })
            }
            .boxed()
        }

        fn delete(&self) -> BoxFuture<'_, Result<(), StoreError>> {
            async move {
                if self.object.send_replace(None).is_some() {
                    self.writes.lock().push(None);
                }
                Ok(())
            }
            .boxed()
        }

        fn changes(&self) -> BoxStream<'static, Result<Option<LeaseCandidate>, StoreError>> {
            let mut receiver = self.object.subscribe();
            receiver.mark_changed();
            futures::stream::unfold(receiver, |mut receiver| async move {
                receiver.changed().await.ok()?;
                let candidate = receiver.borrow_and_update().clone();
                Some((Ok(candidate), receiver))
            })
            .boxed()
        }
    }
}
