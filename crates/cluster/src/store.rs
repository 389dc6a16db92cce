//! The indexed store of one watched kind ([`Store`]); the controller's three stores together
//! are [`crate::caches::Caches`]. Kept on every replica at all times.
//!
//! Objects are indexed by namespace, then by a group (the `kubernetes.io/service-name` label for
//! slices, nothing for the other kinds), then by name, so that a reconcile reads only what its
//! Service needs: at 10k Services in one namespace, a scan of the namespace per Service would
//! cost 10^8 steps per resync. The objects are the compact cached forms of `slices` (one `Arc`
//! each, shared by every index and by work in flight); names, namespaces and groups are the
//! objects' own shared strings, so an index entry allocates no string.
//!
//! A store only moves forward (read your own writes): an object older than the one it holds
//! (by resourceVersion, when both are numbers) is ignored, and so is an object the store holds
//! a tombstone for (deleted by us, or found gone by a consistent read) at or below that
//! tombstone's version. So the answer to our own write can enter the cache at once
//! ([`Store::apply`] from the writer), and the watch's later echo of an older version, or of
//! the object we deleted, changes nothing (docs/architecture.md, "A fresh view").
//!
//! The store's parts: its read path (`read`: lookups by name, group and label), its write path
//! (`write`: what the watch and the writer's answers apply, guarded by versions and tombstones)
//! and the re-list of a whole kind (`relist`). This file holds the data and its indexes.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    hash::{BuildHasherDefault, DefaultHasher},
    sync::Arc,
    time::Duration,
};

use parking_lot::RwLock;
use slices::{CachedService, CachedSlice, CachedWorkload, Text, Token};
use tokio::time::Instant;

mod read;
mod relist;
#[cfg(test)]
mod tests;
mod write;

pub use self::relist::Relist;

/// Maps and sets with a fixed hash seed: iteration order (the order of a replay, of the deletes
/// a re-list finds) is then the same in every run of the same inputs, which the simulation
/// needs to replay a seed exactly. The keys are object names and labels from the API server.
type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<DefaultHasher>>;
type HashSet<K> = std::collections::HashSet<K, BuildHasherDefault<DefaultHasher>>;

/// What a cached object must tell the cache.
pub trait Cached: Send + Sync + 'static {
    /// Namespace.
    fn namespace(&self) -> &Text;
    /// Name.
    fn name(&self) -> &Text;
    /// resourceVersion, to skip unchanged and older objects.
    fn resource_version(&self) -> Option<&Token>;
    /// uid, to tell an object from another of the same name.
    fn uid(&self) -> Option<&Token>;
}

/// How a cache derives an object's group inside its namespace (`None`: the namespace's one
/// group).
pub type GroupOf<K> = fn(&K) -> Option<Text>;

/// How a cache derives the label pairs it indexes an object under.
pub type PairsOf<K> = fn(&K) -> Vec<LabelPair>;

/// One `key=value` label pair.
pub type LabelPair = (Text, Text);

/// One change applied to a cache: `old` is what the cache held before, `new` what it holds now.
#[derive(Debug)]
pub struct Change<K> {
    /// The object before the change (None for an add).
    pub old: Option<Arc<K>>,
    /// The object after the change (None for a delete).
    pub new: Option<Arc<K>>,
}

/// The store of one kind: namespaced, with a per-namespace group index and an optional label
/// index.
pub struct Store<K> {
    index: Index<K>,
    inner: RwLock<Namespaces<K>>,
    /// How long a delete seen through the watch is remembered (see
    /// [`Store::remembering_deletes`]); not at all when `None`.
    remember_deletes: Option<Duration>,
}

/// What a cache indexes by, besides namespace and name.
struct Index<K> {
    group_of: GroupOf<K>,
    pairs_of: Option<PairsOf<K>>,
    /// The group of objects `group_of` gives none.
    no_group: Text,
}

struct Namespaces<K> {
    namespaces: HashMap<Text, Namespace<K>>,
    len: usize,
    /// Tombstones that expire, oldest first, to drop them in order.
    expiring: VecDeque<(Instant, (Text, Text))>,
    /// `(namespace, name)` → the object gone: its uid, and the version at or below which any
    /// report of it is older than its deletion.
    tombstones: HashMap<(Text, Text), Tombstone>,
}

/// An object known gone: before the watch says so (our own delete, a consistent read), or
/// since the watch said so (for a while: an answer to our own write may still be on its way).
#[derive(Clone, Debug)]
struct Tombstone {
    uid: Option<Token>,
    version: u64,
    /// `None`: kept until the watch's delete of it, or a re-list past it.
    expires: Option<Instant>,
}

struct Namespace<K> {
    /// name → group, to find an object's previous group when its labels change.
    groups_by_name: HashMap<Text, Text>,
    /// group → name → object.
    groups: HashMap<Text, BTreeMap<Text, Arc<K>>>,
    /// label pair → names (only with a label index).
    labels: HashMap<LabelPair, BTreeSet<Text>>,
}

// === impl Cached ===

/// The three cached forms carry their namespace, name and resourceVersion in fields of those
/// names.
macro_rules! impl_cached {
    ($($cached:ty),*) => {$(
        impl Cached for $cached {
            fn namespace(&self) -> &Text {
                &self.namespace
            }
            fn name(&self) -> &Text {
                &self.name
            }
            fn resource_version(&self) -> Option<&Token> {
                self.resource_version.as_ref()
            }
            fn uid(&self) -> Option<&Token> {
                self.uid.as_ref()
            }
        }
    )*};
}

impl_cached!(CachedService, CachedWorkload, CachedSlice);

// === impl Store ===

impl<K: Cached> Store<K> {
    /// A cache whose objects all share one group per namespace.
    pub fn new() -> Self {
        Self::grouped(|_| None)
    }

    /// A cache grouped by `group_of`.
    pub fn grouped(group_of: GroupOf<K>) -> Self {
        Self {
            index: Index {
                group_of,
                pairs_of: None,
                no_group: Text::from(""),
            },
            inner: RwLock::new(Namespaces {
                namespaces: HashMap::default(),
                len: 0,
                expiring: VecDeque::new(),
                tombstones: HashMap::default(),
            }),
            remember_deletes: None,
        }
    }

    /// Remembers each delete seen through the watch for `ttl`, so that an older report of the
    /// object arriving after it (the answer to our own write of it, late) cannot bring it back.
    /// `ttl` must outlast any write's answer: the writer's call timeout.
    #[must_use]
    pub fn remembering_deletes(mut self, ttl: Duration) -> Self {
        self.remember_deletes = Some(ttl);
        self
    }

    /// Also indexes objects by the label pairs `pairs_of` gives, for [`Store::with_label`].
    #[must_use]
    pub fn label_indexed(mut self, pairs_of: PairsOf<K>) -> Self {
        self.index.pairs_of = Some(pairs_of);
        self
    }
}

impl<K: Cached> Default for Store<K> {
    fn default() -> Self {
        Self::new()
    }
}

// === impl Namespace ===

impl<K> Namespace<K> {
    fn get(&self, name: &str) -> Option<Arc<K>> {
        let group = self.groups_by_name.get(name)?;
        self.groups.get(group)?.get(name).cloned()
    }
}

// === impl Namespaces ===

impl<K: Cached> Namespaces<K> {
    fn insert(&mut self, index: &Index<K>, object: Arc<K>) -> Option<Arc<K>> {
        let namespace = object.namespace().clone();
        let name = object.name().clone();
        let group = (index.group_of)(&object).unwrap_or_else(|| index.no_group.clone());
        let old = self.remove(index, &namespace, &name);
        let ns = self
            .namespaces
            .entry(namespace)
            .or_insert_with(|| Namespace {
                groups_by_name: HashMap::default(),
                groups: HashMap::default(),
                labels: HashMap::default(),
            });
        if let Some(pairs_of) = index.pairs_of {
            for pair in pairs_of(&object) {
                ns.labels.entry(pair).or_default().insert(name.clone());
            }
        }
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

/// A resourceVersion as a number, when it is one.
fn number(version: Option<&Token>) -> Option<u64> {
    match version {
        Some(Token::Number(number)) => Some(*number),
        _ => None,
    }
}

/// Whether `object` is newer than `version` (a version that is not a number counts as newer:
/// it is never taken as read).
fn newer_than<K: Cached>(object: &K, version: u64) -> bool {
    number(object.resource_version()).is_none_or(|number| number > version)
}

/// Whether two uids name the same object (a missing uid matches any).
fn same_uid(a: Option<&Token>, b: Option<&Token>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}
