//! The read path of a store: one object by name, the objects of a group or under a label pair,
//! every object (for a replay), and how many there are. Reads take the store's lock shared.

use std::sync::Arc;

use super::{Cached, LabelPair, Store};

// === impl Store ===

impl<K: Cached> Store<K> {
    /// The objects of a namespace indexed under `pair`, sorted by name (empty without a label
    /// index).
    pub fn with_label(&self, namespace: &str, pair: &LabelPair) -> Vec<Arc<K>> {
        let inner = self.inner.read();
        let Some(ns) = inner.namespaces.get(namespace) else {
            return Vec::new();
        };
        let Some(names) = ns.labels.get(pair) else {
            return Vec::new();
        };
        names.iter().filter_map(|name| ns.get(name)).collect()
    }

    /// The object `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.inner.read().namespaces.get(namespace)?.get(name)
    }

    /// The cached objects of one group of a namespace, sorted by name.
    pub fn in_group(&self, namespace: &str, group: &str) -> Vec<Arc<K>> {
        let inner = self.inner.read();
        inner
            .namespaces
            .get(namespace)
            .and_then(|ns| ns.groups.get(group))
            .map(|objects| objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every cached object (used to replay the cache into a new term).
    pub fn all(&self) -> Vec<Arc<K>> {
        let inner = self.inner.read();
        inner
            .namespaces
            .values()
            .flat_map(|ns| ns.groups.values().flat_map(|g| g.values().cloned()))
            .collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.inner.read().len
    }

    /// Number of cached objects in `namespace`.
    pub fn len_in(&self, namespace: &str) -> usize {
        self.inner
            .read()
            .namespaces
            .get(namespace)
            .map_or(0, |ns| ns.groups_by_name.len())
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
