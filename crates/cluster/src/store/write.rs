//! The write path of a store: what the watch and the writer's answers apply to it. A store only
//! moves forward: an object no newer than the one held, or than a tombstone of its name, changes
//! nothing, so the answer to our own write can enter at once and the watch's later echo of an
//! older version cannot undo it.

use std::sync::Arc;

use slices::{Text, Token};
use tokio::time::Instant;

use super::{Cached, Change, HashSet, Namespaces, Store, Tombstone, newer_than, number, same_uid};

// === impl Store ===

impl<K: Cached> Store<K> {
    /// Stores `object`, returning the change; `None` when the store already holds this version
    /// or a newer one, or the object was deleted at or after this version (a tombstone).
    pub fn apply(&self, object: K) -> Option<Change<K>> {
        let mut inner = self.inner.write();
        if !inner.is_newer(&object) {
            return None;
        }
        let new = Arc::new(object);
        let old = inner.insert(&self.index, new.clone());
        Some(Change {
            old,
            new: Some(new),
        })
    }

    /// Forgets `object`, returning the change (with the cached version as `old` when there was
    /// one); `None` when the store holds a newer object of that name (another uid), or the
    /// delete is of an object already gone by a tombstone (our own delete, echoed).
    pub fn delete(&self, object: K) -> Option<Change<K>> {
        let mut inner = self.inner.write();
        let key = (object.namespace().clone(), object.name().clone());
        if let Some(tombstone) = inner.tombstones.get(&key)
            && same_uid(tombstone.uid.as_ref(), object.uid())
        {
            inner.tombstones.remove(&key);
            return None;
        }
        let cached = inner
            .namespaces
            .get(object.namespace().as_ref())
            .and_then(|ns| ns.get(object.name()));
        if let Some(cached) = cached
            && !same_uid(cached.uid(), object.uid())
        {
            return None;
        }
        let old = inner.remove(&self.index, object.namespace(), object.name());
        if let Some(ttl) = self.remember_deletes {
            let now = Instant::now();
            inner.expire_tombstones(now);
            let expires = now + ttl;
            let version = number(object.resource_version()).unwrap_or(u64::MAX);
            inner.expiring.push_back((expires, key.clone()));
            inner.tombstones.insert(
                key,
                Tombstone {
                    uid: object.uid().cloned(),
                    version,
                    expires: Some(expires),
                },
            );
        }
        Some(Change {
            old: old.or_else(|| Some(Arc::new(object))),
            new: None,
        })
    }

    /// Forgets `namespace/name` (of `uid`) at once, known gone as of `version` (our own delete,
    /// answered; or a consistent read that no longer holds it): a later report of it at or
    /// below `version` is ignored, and the watch's delete of it changes nothing.
    pub fn remove_known_gone(
        &self,
        namespace: &Text,
        name: &Text,
        uid: Option<Token>,
        version: u64,
    ) -> Option<Arc<K>> {
        let mut inner = self.inner.write();
        let old = inner.remove(&self.index, namespace, name);
        inner.tombstones.insert(
            (namespace.clone(), name.clone()),
            Tombstone {
                uid,
                version,
                expires: None,
            },
        );
        old
    }

    /// Puts a consistent read of one group in place (read at `version`): stores each of `listed`
    /// (unless the store holds it newer), and forgets as gone, tombstoned at `version`, the
    /// group's cached objects the read no longer holds, but not those newer than the read (our
    /// own answers since), as [`Store::finish_relist`] does for a whole kind.
    pub fn read_group(&self, namespace: &str, group: &str, listed: Vec<K>, version: u64) {
        let names: HashSet<Text> = listed.iter().map(|object| object.name().clone()).collect();
        for object in listed {
            drop(self.apply(object));
        }
        for cached in self.in_group(namespace, group) {
            if !names.contains(cached.name()) && (version == 0 || !newer_than(&*cached, version)) {
                self.remove_known_gone(
                    cached.namespace(),
                    cached.name(),
                    cached.uid().cloned(),
                    version,
                );
            }
        }
    }
}

// === impl Namespaces ===

impl<K: Cached> Namespaces<K> {
    /// Drops the tombstones of watch deletes whose time is up (each still the one queued: a
    /// later tombstone of the same name stays).
    fn expire_tombstones(&mut self, now: Instant) {
        while let Some((expires, _)) = self.expiring.front()
            && *expires <= now
        {
            let Some((expires, key)) = self.expiring.pop_front() else {
                break;
            };
            if self
                .tombstones
                .get(&key)
                .is_some_and(|tombstone| tombstone.expires == Some(expires))
            {
                self.tombstones.remove(&key);
            }
        }
    }

    /// Whether `object` moves the store forward: not a version it holds already or an older
    /// one, and not an object it holds a tombstone for at or above this version.
    pub(super) fn is_newer(&mut self, object: &K) -> bool {
        let key = (object.namespace().clone(), object.name().clone());
        if let Some(tombstone) = self.tombstones.get(&key) {
            if same_uid(tombstone.uid.as_ref(), object.uid())
                && !newer_than(object, tombstone.version)
            {
                return false;
            }
            // Another object of that name, or a version past the deletion: the tombstone has
            // served.
            self.tombstones.remove(&key);
        }
        let Some(cached) = self
            .namespaces
            .get(object.namespace().as_ref())
            .and_then(|ns| ns.get(object.name()))
        else {
            return true;
        };
        if !same_uid(cached.uid(), object.uid()) {
            return true;
        }
        match (
            number(cached.resource_version()),
            number(object.resource_version()),
        ) {
            (Some(cached), Some(new)) => new > cached,
            _ => {
                cached.resource_version().is_none()
                    || cached.resource_version() != object.resource_version()
            }
        }
    }
}
