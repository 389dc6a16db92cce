//! This term's own writes, per Service (docs/architecture.md, "A fresh view", clause 2). One per
//! leadership term.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::ServiceKey;
use crate::labels::SERVICE_NAME_LABEL;
use crate::model::CachedSlice;
use crate::text::Token;

/// What this term wrote, per Service: which slice versions are our own (so their echo through
/// the watch triggers nothing), and which Services had a write whose outcome is unknown (a
/// timeout, a lost connection, a 409), whose slices must be read back from the API server before
/// the Service is planned again.
///
/// The answers themselves go into the slice cache at once (read your own writes, in the
/// controller's cache); the tracker only remembers what was ours. Create a new one every
/// leadership term: a record of an earlier term describes writes whose effects others may have
/// changed since (the stale-tracker scenario, docs/slices.md).
#[derive(Debug, Default)]
pub struct Tracker {
    services: HashMap<ServiceKey, OwnWrites>,
    /// Services whose last write's outcome is unknown: planned again only after a consistent
    /// read of their slices.
    unresolved: BTreeSet<ServiceKey>,
}

#[derive(Debug, Default)]
struct OwnWrites {
    /// Slice name → the resourceVersion our last write of it returned.
    written: BTreeMap<String, Option<Token>>,
    /// Slice uid (or name when it has none) → name, of slices we deleted.
    deleted: BTreeMap<Token, String>,
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
        let version = slice.metadata.resource_version.as_deref().map(Token::parse);
        let own = self.services.entry(key.clone()).or_default();
        own.written.insert(name, version);
    }

    /// Records a delete of `slice` (NotFound included).
    pub fn record_delete(&mut self, key: &ServiceKey, slice: &EndpointSlice) {
        let Some(name) = slice.metadata.name.clone() else {
            return;
        };
        let own = self.services.entry(key.clone()).or_default();
        own.written.remove(&name);
        let id = Token::parse(slice.metadata.uid.as_deref().unwrap_or(&name));
        own.deleted.insert(id, name);
    }

    /// Records a write for `key` whose outcome is unknown: it may or may not have been applied
    /// (no answer), or the slice was not what the plan saw (409). The Service's slices must be
    /// read back before it is planned again ([`Tracker::needs_read_back`]).
    pub fn record_unknown_outcome(&mut self, key: &ServiceKey) {
        self.unresolved.insert(key.clone());
        // It may have landed: the Service counts as written ([`Tracker::has_written`]).
        self.services.entry(key.clone()).or_default();
    }

    /// Whether this term has written `key`'s slices: a write answered, or sent with an outcome
    /// unknown. Until then, nothing this term published for the Service can have removed an
    /// endpoint (docs/architecture.md, "A fresh view", clause 3).
    pub fn has_written(&self, key: &ServiceKey) -> bool {
        self.services.contains_key(key)
    }

    /// Whether `key` had a write of unknown outcome not yet resolved by a read.
    pub fn needs_read_back(&self, key: &ServiceKey) -> bool {
        self.unresolved.contains(key)
    }

    /// A consistent read of `key`'s slices is in the cache: its writes are resolved.
    pub fn read_back(&mut self, key: &ServiceKey) {
        self.unresolved.remove(key);
    }

    /// Settles records from a watch event of a slice (call it for every managed slice event):
    /// a slice deleted by someone else is no longer ours.
    pub fn observe(&mut self, old: Option<&CachedSlice>, new: Option<&CachedSlice>) {
        let (Some(gone), None) = (old, new) else {
            return;
        };
        let Some(own) = service_key(gone).and_then(|k| self.services.get_mut(&k)) else {
            return;
        };
        own.written.remove(&*gone.name);
    }

    /// Whether this slice, seen through the watch, is exactly what our last write returned.
    pub fn is_own_write(&self, slice: &CachedSlice) -> bool {
        let Some(version) = slice.resource_version.as_ref() else {
            return false;
        };
        service_key(slice)
            .and_then(|k| self.services.get(&k))
            .and_then(|own| own.written.get(&*slice.name))
            .is_some_and(|written| written.as_ref() == Some(version))
    }

    /// Whether a delete event of this slice is one we made.
    pub fn is_expected_delete(&self, slice: &CachedSlice) -> bool {
        let id = slice_id(slice);
        service_key(slice)
            .and_then(|k| self.services.get(&k))
            .is_some_and(|own| own.deleted.contains_key(&id))
    }

    /// Forgets a Service (deleted: its slices go by garbage collection).
    pub fn forget(&mut self, key: &ServiceKey) {
        self.services.remove(key);
        self.unresolved.remove(key);
    }

    /// Number of Services with records (for tests and metrics).
    pub fn len(&self) -> usize {
        self.services.len().max(self.unresolved.len())
    }

    /// Whether no Service has records.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.unresolved.is_empty()
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
