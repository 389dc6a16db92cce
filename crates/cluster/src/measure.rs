//! The controller's caches on their own, to measure what they hold: the scale benchmark puts
//! listed objects through [`StandaloneCaches`] and reads the process's memory before and after.
//! Same projection, string pool, indexes and re-list as the watches use; no client, no watch.

use std::marker::PhantomData;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::{caches::Caches, store, watch::Project};

/// A kind the controller caches: Service, ExternalWorkload or EndpointSlice.
pub trait Kind: Sized {
    /// Which of the three it is.
    const KIND: CachedKind;

    /// The object, tagged with its kind.
    fn into_object(self) -> Object;
}

/// The three cached kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedKind {
    /// `v1/Service`.
    Service,
    /// `workload.linkerd.io/v1beta1/ExternalWorkload`.
    ExternalWorkload,
    /// `discovery.k8s.io/v1/EndpointSlice` (the managed ones).
    EndpointSlice,
}

/// One object of a cached kind.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // lives only between its list page and its projection
pub enum Object {
    /// A Service.
    Service(Service),
    /// An ExternalWorkload.
    ExternalWorkload(ExternalWorkload),
    /// An EndpointSlice.
    EndpointSlice(EndpointSlice),
}

/// The three caches and their string pool, filled by hand.
#[derive(Default)]
pub struct StandaloneCaches {
    caches: Caches,
}

/// A re-list of one kind in progress (see [`StandaloneCaches::relist`]).
pub struct Relist<'a, K> {
    caches: &'a Caches,
    relist: store::Relist,
    kind: PhantomData<K>,
}

// === impl Kind ===

impl Kind for Service {
    const KIND: CachedKind = CachedKind::Service;

    fn into_object(self) -> Object {
        Object::Service(self)
    }
}

impl Kind for ExternalWorkload {
    const KIND: CachedKind = CachedKind::ExternalWorkload;

    fn into_object(self) -> Object {
        Object::ExternalWorkload(self)
    }
}

impl Kind for EndpointSlice {
    const KIND: CachedKind = CachedKind::EndpointSlice;

    fn into_object(self) -> Object {
        Object::EndpointSlice(self)
    }
}

// === impl StandaloneCaches ===

impl StandaloneCaches {
    /// Empty caches.
    pub fn new() -> Self {
        Self::default()
    }

    /// Projects `object` and stores it, as a watch event does; the object is dropped.
    pub fn apply(&self, object: impl Kind) {
        let caches = &self.caches;
        let interner = &caches.interner;
        match object.into_object() {
            Object::Service(o) => drop(caches.services.apply(o.project(interner))),
            Object::ExternalWorkload(o) => drop(caches.workloads.apply(o.project(interner))),
            Object::EndpointSlice(o) => drop(caches.slices.apply(o.project(interner))),
        }
    }

    /// Starts a re-list of `K`'s cache, as a watch does after its watch expired: listed objects
    /// update the cache in place, and [`Relist::finish`] removes what the list did not hold.
    pub fn relist<K: Kind>(&self) -> Relist<'_, K> {
        let caches = &self.caches;
        let relist = match K::KIND {
            CachedKind::Service => caches.services.relist(),
            CachedKind::ExternalWorkload => caches.workloads.relist(),
            CachedKind::EndpointSlice => caches.slices.relist(),
        };
        Relist {
            caches,
            relist,
            kind: PhantomData,
        }
    }

    /// Cached Services, workloads and slices.
    pub fn len(&self) -> (usize, usize, usize) {
        self.caches.summary()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0, 0)
    }

    /// Distinct strings in the pool the cached objects share.
    pub fn pooled_strings(&self) -> usize {
        self.caches.interner.len()
    }
}

// === impl Relist ===

impl<K: Kind> Relist<'_, K> {
    /// Stores one listed object of the re-list.
    pub fn apply(&mut self, object: K) {
        let caches = self.caches;
        let interner = &caches.interner;
        let relist = &mut self.relist;
        // `K` fixed the kind when the re-list started, so the object goes to that kind's cache.
        match object.into_object() {
            Object::Service(o) => drop(caches.services.relist_apply(relist, o.project(interner))),
            Object::ExternalWorkload(o) => {
                drop(caches.workloads.relist_apply(relist, o.project(interner)));
            }
            Object::EndpointSlice(o) => {
                drop(caches.slices.relist_apply(relist, o.project(interner)));
            }
        }
    }

    /// Ends the re-list: removes what it did not hold.
    pub fn finish(self) {
        let caches = self.caches;
        match K::KIND {
            CachedKind::Service => drop(caches.services.finish_relist(self.relist, 0)),
            CachedKind::ExternalWorkload => drop(caches.workloads.finish_relist(self.relist, 0)),
            CachedKind::EndpointSlice => drop(caches.slices.finish_relist(self.relist, 0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slices::testing::{Svc, Workload};

    fn vm(name: &str, ip: &str) -> ExternalWorkload {
        Workload::named(name)
            .namespace("ns")
            .label("app", "web")
            .ip(ip)
            .build()
    }

    #[test]
    fn relist_keeps_what_is_listed_and_removes_the_rest() {
        let caches = StandaloneCaches::new();
        caches.apply(
            Svc::named("web")
                .namespace("ns")
                .selector("app", "web")
                .build(),
        );
        caches.apply(vm("vm-1", "10.0.0.1"));
        caches.apply(vm("vm-2", "10.0.0.2"));
        assert_eq!(caches.len(), (1, 2, 0));

        let mut relist = caches.relist::<ExternalWorkload>();
        relist.apply(vm("vm-2", "10.0.0.3"));
        // Until the re-list is finished, nothing is removed.
        assert_eq!(caches.len(), (1, 2, 0));
        relist.finish();
        assert_eq!(caches.len(), (1, 1, 0));
        assert!(caches.pooled_strings() > 0);
    }
}
