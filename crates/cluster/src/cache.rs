//! Warm caches of watched objects, kept on every replica at all times.
//!
//! Objects are indexed by namespace, then by a group (the `kubernetes.io/service-name` label for
//! slices, nothing for the other kinds), then by name, so that a reconcile reads only what its
//! Service needs: at 10k Services in one namespace, a scan of the namespace per Service would
//! cost 10^8 steps per resync.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use kube::ResourceExt;
use parking_lot::RwLock;

/// How a cache derives an object's group inside its namespace.
pub type GroupOf<K> = fn(&K) -> String;

/// How a cache derives the label pairs it indexes an object under.
pub type PairsOf<K> = fn(&K) -> Vec<LabelPair>;

/// One `key=value` label pair.
pub type LabelPair = (String, String);

/// One change applied to a cache: `old` is what the cache held before, `new` what it holds now.
#[derive(Debug)]
pub struct Change<K> {
    /// The object before the change (None for an add).
    pub old: Option<Arc<K>>,
    /// The object after the change (None for a delete).
    pub new: Option<Arc<K>>,
}

/// A re-list in progress (see [`Cache::relist`]).
pub struct Relist<K> {
    fresh: Namespaces<K>,
    listed: Vec<Arc<K>>,
}

impl<K> Relist<K> {
    /// Objects listed so far.
    pub fn len(&self) -> usize {
        self.listed.len()
    }

    /// Whether nothing was listed yet.
    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }
}

/// A namespaced cache with a per-namespace group index.
pub struct Cache<K> {
    index: Index<K>,
    inner: RwLock<Namespaces<K>>,
}

/// What a cache indexes by, besides namespace and name.
struct Index<K> {
    group_of: GroupOf<K>,
    pairs_of: Option<PairsOf<K>>,
}

struct Namespaces<K> {
    namespaces: HashMap<String, Namespace<K>>,
    len: usize,
}

struct Namespace<K> {
    /// name → group, to find an object's previous group when its labels change. Names and
    /// groups are shared `Arc<str>`s: one allocation per name however many indexes hold it
    /// (at 50k workloads, separate copies cost about 10 MB).
    groups_by_name: HashMap<Arc<str>, Arc<str>>,
    /// group → name → object.
    groups: HashMap<Arc<str>, BTreeMap<Arc<str>, Arc<K>>>,
    /// label pair → names (only with a label index).
    labels: HashMap<LabelPair, BTreeSet<Arc<str>>>,
}

// === impl Cache ===

impl<K: kube::Resource> Cache<K> {
    /// A cache whose objects all share one group per namespace.
    pub fn new() -> Self {
        Self::grouped(|_| String::new())
    }

    /// A cache grouped by `group_of`.
    pub fn grouped(group_of: GroupOf<K>) -> Self {
        Self {
            index: Index {
                group_of,
                pairs_of: None,
            },
            inner: RwLock::new(Namespaces {
                namespaces: HashMap::new(),
                len: 0,
            }),
        }
    }

    /// Also indexes objects by the label pairs `pairs_of` gives, for [`Cache::with_label`].
    #[must_use]
    pub fn label_indexed(mut self, pairs_of: PairsOf<K>) -> Self {
        self.index.pairs_of = Some(pairs_of);
        self
    }

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
        names
            .iter()
            .filter_map(|name| {
                let group = ns.groups_by_name.get(name)?;
                ns.groups.get(group)?.get(name).cloned()
            })
            .collect()
    }

    /// The object `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let inner = self.inner.read();
        let ns = inner.namespaces.get(namespace)?;
        let group = ns.groups_by_name.get(name)?;
        ns.groups.get(group)?.get(name).cloned()
    }

    /// Every cached object of a namespace, sorted by group then name.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let inner = self.inner.read();
        let Some(ns) = inner.namespaces.get(namespace) else {
            return Vec::new();
        };
        let mut groups: Vec<_> = ns.groups.iter().collect();
        groups.sort_by(|a, b| a.0.cmp(b.0));
        groups
            .into_iter()
            .flat_map(|(_, objects)| objects.values().cloned())
            .collect()
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

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `object`, returning the change.
    pub fn apply(&self, object: K) -> Change<K> {
        let new = Arc::new(object);
        let old = self.inner.write().insert(&self.index, new.clone());
        Change {
            old,
            new: Some(new),
        }
    }

    /// Forgets `object`, returning the change (with the cached version as `old` when there was one).
    pub fn delete(&self, object: K) -> Change<K> {
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let old = self.inner.write().remove(&self.index, &namespace, &name);
        Change {
            old: old.or_else(|| Some(Arc::new(object))),
            new: None,
        }
    }

    /// Starts a re-list: objects go into a new content with [`Cache::relist_insert`] as they
    /// arrive (no buffered copy of the list), and [`Cache::finish_relist`] swaps it in.
    pub fn relist(&self) -> Relist<K> {
        Relist {
            fresh: Namespaces {
                namespaces: HashMap::new(),
                len: 0,
            },
            listed: Vec::new(),
        }
    }

    /// Adds one listed object to a re-list in progress; the cache itself is unchanged.
    pub fn relist_insert(&self, relist: &mut Relist<K>, object: K) {
        let object = Arc::new(object);
        // A name listed twice keeps its last version, like a cache apply.
        if relist.fresh.insert(&self.index, object.clone()).is_some() {
            let name = object.name_any();
            let namespace = object.namespace();
            relist
                .listed
                .retain(|o| o.name_any() != name || o.namespace() != namespace);
        }
        relist.listed.push(object);
    }

    /// Replaces the whole content with the re-list, returning the changes it amounts to: adds
    /// and updates for listed objects (unchanged ones, by resourceVersion, are left out) and
    /// deletes for cached objects that the list no longer holds.
    pub fn finish_relist(&self, relist: Relist<K>) -> Vec<Change<K>> {
        let Relist { fresh, listed } = relist;
        let mut previous = std::mem::replace(&mut *self.inner.write(), fresh);
        let mut changes = Vec::new();
        for new in listed {
            let namespace = new.namespace().unwrap_or_default();
            let old = previous.remove(&self.index, &namespace, &new.name_any());
            let unchanged = old.as_ref().is_some_and(|old| {
                old.meta().resource_version.is_some()
                    && old.meta().resource_version == new.meta().resource_version
            });
            if !unchanged {
                changes.push(Change {
                    old,
                    new: Some(new),
                });
            }
        }
        for ns in previous.namespaces.into_values() {
            for group in ns.groups.into_values() {
                for old in group.into_values() {
                    changes.push(Change {
                        old: Some(old),
                        new: None,
                    });
                }
            }
        }
        changes
    }

    /// Replaces the whole content with `objects` (a re-list in one call).
    pub fn replace(&self, objects: Vec<K>) -> Vec<Change<K>> {
        let mut relist = self.relist();
        for object in objects {
            self.relist_insert(&mut relist, object);
        }
        self.finish_relist(relist)
    }
}

impl<K: kube::Resource> Default for Cache<K> {
    fn default() -> Self {
        Self::new()
    }
}

// === impl Namespaces ===

impl<K: kube::Resource> Namespaces<K> {
    fn insert(&mut self, index: &Index<K>, object: Arc<K>) -> Option<Arc<K>> {
        let namespace = object.namespace().unwrap_or_default();
        let name: Arc<str> = Arc::from(object.name_any());
        let group = (index.group_of)(&object);
        let old = self.remove(index, &namespace, &name);
        let ns = self
            .namespaces
            .entry(namespace)
            .or_insert_with(|| Namespace {
                groups_by_name: HashMap::new(),
                groups: HashMap::new(),
                labels: HashMap::new(),
            });
        if let Some(pairs_of) = index.pairs_of {
            for pair in pairs_of(&object) {
                ns.labels.entry(pair).or_default().insert(name.clone());
            }
        }
        // Objects of one group share the group's name.
        let group: Arc<str> = match ns.groups.get_key_value(group.as_str()) {
            Some((shared, _)) => shared.clone(),
            None => Arc::from(group),
        };
        ns.groups_by_name.insert(name.clone(), group.clone());
        ns.groups.entry(group).or_default().insert(name, object);
        self.len += 1;
        old
    }

    fn remove(&mut self, index: &Index<K>, namespace: &str, name: &str) -> Option<Arc<K>> {
        let ns = self.namespaces.get_mut(namespace)?;
        let group = ns.groups_by_name.remove(name)?;
        let objects = ns.groups.get_mut(&group)?;
        let old = objects.remove(name);
        if objects.is_empty() {
            ns.groups.remove(&group);
        }
        if let (Some(pairs_of), Some(old)) = (index.pairs_of, old.as_ref()) {
            for pair in pairs_of(old) {
                if let Some(names) = ns.labels.get_mut(&pair) {
                    names.remove(name);
                    if names.is_empty() {
                        ns.labels.remove(&pair);
                    }
                }
            }
        }
        if ns.groups.is_empty() {
            self.namespaces.remove(namespace);
        }
        if old.is_some() {
            self.len -= 1;
        }
        old
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::ObjectMeta;

    use super::*;

    fn slice(name: &str, service: &str, rv: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: Some([("kubernetes.io/service-name".into(), service.into())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: None,
            ports: None,
        }
    }

    fn by_service(slice: &EndpointSlice) -> String {
        slice
            .labels()
            .get("kubernetes.io/service-name")
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn apply_moves_an_object_between_groups_when_its_label_changes() {
        let cache = Cache::grouped(by_service);
        assert!(cache.apply(slice("s1", "web", "1")).old.is_none());
        let change = cache.apply(slice("s1", "api", "2"));
        assert_eq!(
            change.old.unwrap().metadata.resource_version.as_deref(),
            Some("1")
        );
        assert!(cache.in_group("ns", "web").is_empty());
        assert_eq!(cache.in_group("ns", "api").len(), 1);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn replace_reports_adds_updates_and_deletes_but_not_unchanged_objects() {
        let cache = Cache::grouped(by_service);
        cache.apply(slice("kept", "web", "1"));
        cache.apply(slice("changed", "web", "1"));
        cache.apply(slice("gone", "web", "1"));
        let changes = cache.replace(vec![
            slice("kept", "web", "1"),
            slice("changed", "web", "2"),
            slice("added", "web", "1"),
        ]);
        let mut summary: Vec<_> = changes
            .iter()
            .map(|c| {
                let name = c.new.as_ref().or(c.old.as_ref()).unwrap().name_any();
                (name, c.old.is_some(), c.new.is_some())
            })
            .collect();
        summary.sort();
        assert_eq!(
            summary,
            vec![
                ("added".into(), false, true),
                ("changed".into(), true, true),
                ("gone".into(), true, false),
            ]
        );
        assert_eq!(cache.len(), 3);
    }

    fn label_pairs(slice: &EndpointSlice) -> Vec<LabelPair> {
        slice.labels().clone().into_iter().collect()
    }

    #[test]
    fn label_index_follows_label_changes_and_deletes() {
        let cache = Cache::new().label_indexed(label_pairs);
        let web = ("kubernetes.io/service-name".to_string(), "web".to_string());
        let api = ("kubernetes.io/service-name".to_string(), "api".to_string());
        cache.apply(slice("s1", "web", "1"));
        cache.apply(slice("s2", "web", "1"));
        assert_eq!(cache.with_label("ns", &web).len(), 2);
        cache.apply(slice("s1", "api", "2"));
        assert_eq!(cache.with_label("ns", &web).len(), 1);
        assert_eq!(cache.with_label("ns", &api)[0].name_any(), "s1");
        cache.delete(slice("s2", "web", "3"));
        assert!(cache.with_label("ns", &web).is_empty());
        assert!(cache.with_label("other", &web).is_empty());
    }

    #[test]
    fn delete_of_an_unknown_object_still_reports_it() {
        let cache: Cache<EndpointSlice> = Cache::grouped(by_service);
        let change = cache.delete(slice("x", "web", "5"));
        assert!(change.old.is_some() && change.new.is_none());
        assert!(cache.is_empty());
    }
}
