//! Stale-cache protection (docs/slices.md, "Stale-cache protection"). One per leadership term.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::ServiceKey;
use crate::labels::SERVICE_NAME_LABEL;
use crate::model::CachedSlice;
use crate::text::Token;

/// Our writes per Service, so that planning never runs on a cache older than them.
///
/// Create a new one every leadership term: records of an earlier term describe writes whose
/// effects others may have changed since, and would keep a reacquired leader stuck on "cache out
/// of date" (the stale-tracker scenario, docs/slices.md).
#[derive(Debug, Default)]
pub struct Tracker {
    services: HashMap<ServiceKey, Expectations>,
}

/// Whether the cache is recent enough to plan on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// The cache reflects all our writes for this Service.
    Fresh,
    /// The cache is behind our writes: retry shortly, do not write.
    Stale(StaleReason),
}

/// Why the cache is behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StaleReason {
    /// The cache holds an older generation of a slice we wrote.
    OlderGeneration {
        /// Slice name.
        slice: String,
    },
    /// The cache still holds a slice we deleted.
    DeletedStillCached {
        /// Slice name.
        slice: String,
    },
    /// The cache lacks a slice we created or updated.
    MissingWrite {
        /// Slice name.
        slice: String,
    },
}

#[derive(Debug, Default)]
struct Expectations {
    /// Slice name → what our last write of it returned.
    written: BTreeMap<String, Written>,
    /// Slice uid (or name when it has none) → name, of slices we deleted.
    deleted: BTreeMap<Token, String>,
}

#[derive(Debug)]
struct Written {
    uid: Option<Token>,
    generation: i64,
    resource_version: Option<Token>,
    /// The cache has shown this write: from now on its absence means someone deleted it.
    seen: bool,
}

// === impl StaleReason ===

impl StaleReason {
    /// A bounded reason for metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            StaleReason::OlderGeneration { .. } => "older_generation",
            StaleReason::DeletedStillCached { .. } => "deleted_still_cached",
            StaleReason::MissingWrite { .. } => "missing_write",
        }
    }
}

// === impl Tracker ===

impl Tracker {
    /// An empty tracker, for a new leadership term.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a create or update of `slice`, as returned by the API.
    pub fn record_write(&mut self, key: &ServiceKey, slice: &EndpointSlice) {
        let Some(name) = slice.metadata.name.clone() else {
            return;
        };
        let expectations = self.services.entry(key.clone()).or_default();
        expectations.written.insert(
            name,
            Written {
                uid: slice.metadata.uid.as_deref().map(Token::parse),
                generation: slice.metadata.generation.unwrap_or_default(),
                resource_version: slice.metadata.resource_version.as_deref().map(Token::parse),
                seen: false,
            },
        );
    }

    /// Records a delete of `slice` (NotFound included).
    pub fn record_delete(&mut self, key: &ServiceKey, slice: &EndpointSlice) {
        let Some(name) = slice.metadata.name.clone() else {
            return;
        };
        let expectations = self.services.entry(key.clone()).or_default();
        expectations.written.remove(&name);
        let id = Token::parse(slice.metadata.uid.as_deref().unwrap_or(&name));
        expectations.deleted.insert(id, name);
    }

    /// Whether `cached` (this Service's managed slices in the cache) reflects our writes.
    ///
    /// Settles what the cache has caught up with, so a record claims staleness only until the
    /// cache shows it once: after that, a missing slice means someone else deleted it, and the
    /// plan must re-create it rather than wait.
    pub fn check(&mut self, key: &ServiceKey, cached: &[&CachedSlice]) -> Freshness {
        let Some(expectations) = self.services.get_mut(key) else {
            return Freshness::Fresh;
        };
        let by_name: HashMap<&str, &CachedSlice> = cached.iter().map(|s| (&*s.name, *s)).collect();
        let mut stale = None;
        for (name, written) in expectations.written.iter_mut().filter(|(_, w)| !w.seen) {
            match by_name.get(name.as_str()) {
                None => {
                    stale.get_or_insert(StaleReason::MissingWrite {
                        slice: name.clone(),
                    });
                }
                // Same name, another object: someone replaced ours; nothing to wait for.
                Some(c) if c.uid.is_some() && c.uid != written.uid => {
                    written.seen = true;
                }
                Some(c) if c.generation.unwrap_or_default() < written.generation => {
                    stale.get_or_insert(StaleReason::OlderGeneration {
                        slice: name.clone(),
                    });
                }
                Some(_) => written.seen = true,
            }
        }
        let cached_ids: HashMap<Token, ()> = cached.iter().map(|s| (slice_id(s), ())).collect();
        // A deleted slice gone from the cache needs no more waiting.
        expectations
            .deleted
            .retain(|id, _| cached_ids.contains_key(id));
        if let Some(name) = expectations.deleted.values().next() {
            stale.get_or_insert(StaleReason::DeletedStillCached {
                slice: name.clone(),
            });
        }
        match stale {
            Some(reason) => Freshness::Stale(reason),
            None => Freshness::Fresh,
        }
    }

    /// Settles expectations from a watch event of a slice (call it for every managed slice
    /// event): a delete by someone else of a slice we wrote ends the wait for it, even if the
    /// cache never showed our write.
    pub fn observe(&mut self, old: Option<&CachedSlice>, new: Option<&CachedSlice>) {
        let (Some(gone), None) = (old, new) else {
            return;
        };
        let Some(expectations) = service_key(gone).and_then(|k| self.services.get_mut(&k)) else {
            return;
        };
        expectations.written.remove(&*gone.name);
    }

    /// Whether this slice, seen through the watch, is exactly what our last write returned.
    pub fn is_own_write(&self, slice: &CachedSlice) -> bool {
        let Some(version) = slice.resource_version.as_ref() else {
            return false;
        };
        service_key(slice)
            .and_then(|k| self.services.get(&k))
            .and_then(|e| e.written.get(&*slice.name))
            .is_some_and(|w| w.resource_version.as_ref() == Some(version))
    }

    /// Whether a delete event of this slice is one we made.
    pub fn is_expected_delete(&self, slice: &CachedSlice) -> bool {
        let id = slice_id(slice);
        service_key(slice)
            .and_then(|k| self.services.get(&k))
            .is_some_and(|e| e.deleted.contains_key(&id))
    }

    /// Forgets a Service (deleted: its slices go by garbage collection).
    pub fn forget(&mut self, key: &ServiceKey) {
        self.services.remove(key);
    }

    /// Number of Services with records (for tests and metrics).
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether no Service has records.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// The Service a slice belongs to, from its namespace and service-name label.
pub(crate) fn service_key(slice: &CachedSlice) -> Option<ServiceKey> {
    Some(ServiceKey::new(
        &*slice.namespace,
        slice.labels.get(SERVICE_NAME_LABEL)?,
    ))
}

/// A slice's uid, or its name when it has none.
fn slice_id(slice: &CachedSlice) -> Token {
    match &slice.uid {
        Some(uid) => uid.clone(),
        None => Token::parse(&slice.name),
    }
}
