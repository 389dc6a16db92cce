//! The re-list of a whole kind: listed objects enter the store one by one as they arrive, then
//! what the list no longer holds is removed, and the tombstones the list has passed are dropped.

use slices::Text;

use super::{Cached, Change, HashSet, Store, newer_than};

/// A re-list in progress (see [`Store::relist`]).
pub struct Relist {
    /// `(namespace, name)` of every listed object, to find what the list no longer holds;
    /// `None` when the cache was empty at the start (nothing can be missing).
    seen: Option<HashSet<(Text, Text)>>,
    listed: usize,
}

impl Relist {
    /// Objects listed so far.
    pub fn listed(&self) -> usize {
        self.listed
    }
}

// === impl Store ===

impl<K: Cached> Store<K> {
    /// Starts a re-list. Listed objects go into the cache one by one as they arrive
    /// ([`Store::relist_apply`]), so a re-list never holds a second copy of the content;
    /// [`Store::finish_relist`] then removes what the list did not hold. Until then the cache
    /// mixes listed objects with older ones, as it would while a watch catches up.
    pub fn relist(&self) -> Relist {
        Relist {
            seen: (!self.is_empty()).then(HashSet::default),
            listed: 0,
        }
    }

    /// Stores one listed object; returns the change, or `None` when the cache already held this
    /// version (same resourceVersion), which is kept.
    pub fn relist_apply(&self, relist: &mut Relist, object: K) -> Option<Change<K>> {
        relist.listed += 1;
        if let Some(seen) = relist.seen.as_mut() {
            seen.insert((object.namespace().clone(), object.name().clone()));
        }
        self.apply(object)
    }

    /// Ends a re-list whose list was read at `version`: removes the cached objects the list did
    /// not hold (but not those newer than the list: our own writes' answers, applied since),
    /// returning their deletes, and drops the tombstones the list has passed.
    pub fn finish_relist(&self, relist: Relist, version: u64) -> Vec<Change<K>> {
        let mut inner = self.inner.write();
        if version > 0 {
            inner
                .tombstones
                .retain(|_, tombstone| tombstone.version >= version);
        }
        let Some(seen) = relist.seen else {
            return Vec::new();
        };
        let gone: Vec<(Text, Text)> = inner
            .namespaces
            .iter()
            .flat_map(|(namespace, ns)| {
                ns.groups_by_name
                    .keys()
                    .map(move |name| (namespace.clone(), name.clone()))
            })
            .filter(|key| !seen.contains(key))
            .filter(|(namespace, name)| {
                let cached = inner.namespaces.get(namespace).and_then(|ns| ns.get(name));
                version == 0 || cached.is_none_or(|cached| !newer_than(cached.as_ref(), version))
            })
            .collect();
        gone.into_iter()
            .filter_map(|(namespace, name)| inner.remove(&self.index, &namespace, &name))
            .map(|old| Change {
                old: Some(old),
                new: None,
            })
            .collect()
    }
}
