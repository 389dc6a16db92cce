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

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    hash::{BuildHasherDefault, DefaultHasher},
    sync::Arc,
    time::Duration,
};

use parking_lot::RwLock;
use slices::{CachedService, CachedSlice, CachedWorkload, Text, Token};
use tokio::time::Instant;

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

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

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
    fn is_newer(&mut self, object: &K) -> bool {
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::ObjectMeta;

    use super::*;

    fn slice(name: &str, service: &str, rv: &str) -> CachedSlice {
        CachedSlice::from(&EndpointSlice {
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
        })
    }

    /// A re-list in one call: the changes it amounts to.
    fn replace<K: Cached>(store: &Store<K>, objects: Vec<K>) -> Vec<Change<K>> {
        let mut relist = store.relist();
        let mut changes: Vec<Change<K>> = objects
            .into_iter()
            .filter_map(|object| store.relist_apply(&mut relist, object))
            .collect();
        changes.extend(store.finish_relist(relist, 0));
        changes
    }

    fn by_service(slice: &CachedSlice) -> Option<Text> {
        slice
            .labels
            .iter()
            .find(|(k, _)| &***k == "kubernetes.io/service-name")
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn apply_moves_an_object_between_groups_when_its_label_changes() {
        let cache = Store::grouped(by_service);
        assert!(cache.apply(slice("s1", "web", "1")).unwrap().old.is_none());
        let change = cache.apply(slice("s1", "api", "2")).unwrap();
        assert_eq!(
            change.old.unwrap().resource_version,
            Some(Token::parse("1"))
        );
        assert!(cache.in_group("ns", "web").is_empty());
        assert_eq!(cache.in_group("ns", "api").len(), 1);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn relist_reports_adds_updates_and_deletes_but_not_unchanged_objects() {
        let cache = Store::grouped(by_service);
        cache.apply(slice("kept", "web", "1"));
        cache.apply(slice("changed", "web", "1"));
        cache.apply(slice("gone", "web", "1"));
        let changes = replace(
            &cache,
            vec![
                slice("kept", "web", "1"),
                slice("changed", "web", "2"),
                slice("added", "web", "1"),
            ],
        );
        let mut summary: Vec<_> = changes
            .iter()
            .map(|c| {
                let name = c.new.as_ref().or(c.old.as_ref()).unwrap().name.to_string();
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

    fn label_pairs(slice: &CachedSlice) -> Vec<LabelPair> {
        slice
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    #[test]
    fn label_index_follows_label_changes_and_deletes() {
        let cache = Store::new().label_indexed(label_pairs);
        let web: LabelPair = ("kubernetes.io/service-name".into(), "web".into());
        let api: LabelPair = ("kubernetes.io/service-name".into(), "api".into());
        cache.apply(slice("s1", "web", "1"));
        cache.apply(slice("s2", "web", "1"));
        assert_eq!(cache.with_label("ns", &web).len(), 2);
        cache.apply(slice("s1", "api", "2"));
        assert_eq!(cache.with_label("ns", &web).len(), 1);
        assert_eq!(&*cache.with_label("ns", &api)[0].name, "s1");
        cache.delete(slice("s2", "web", "3"));
        assert!(cache.with_label("ns", &web).is_empty());
        assert!(cache.with_label("other", &web).is_empty());
    }

    #[test]
    fn delete_of_an_unknown_object_still_reports_it() {
        let cache: Store<CachedSlice> = Store::grouped(by_service);
        let change = cache.delete(slice("x", "web", "5")).unwrap();
        assert!(change.old.is_some() && change.new.is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn an_older_or_equal_version_changes_nothing() {
        let cache = Store::grouped(by_service);
        cache.apply(slice("s1", "web", "5"));
        assert!(
            cache.apply(slice("s1", "web", "5")).is_none(),
            "the same version"
        );
        assert!(
            cache.apply(slice("s1", "web", "4")).is_none(),
            "an older version"
        );
        assert_eq!(
            cache.get("ns", "s1").unwrap().resource_version,
            Some(Token::parse("5"))
        );
        assert!(cache.apply(slice("s1", "web", "6")).is_some());
        let mut relist = cache.relist();
        assert!(
            cache
                .relist_apply(&mut relist, slice("s1", "web", "3"))
                .is_none()
        );
    }

    #[test]
    fn an_object_known_gone_does_not_come_back_through_an_older_report() {
        let cache = Store::grouped(by_service);
        cache.apply(slice("s1", "web", "5"));
        let gone = cache.remove_known_gone(&"ns".into(), &"s1".into(), None, 5);
        assert!(gone.is_some());
        assert!(
            cache.apply(slice("s1", "web", "5")).is_none(),
            "the watch's echo"
        );
        assert!(cache.is_empty());
        assert!(
            cache.delete(slice("s1", "web", "7")).is_none(),
            "the watch's delete of it changes nothing"
        );
        assert!(
            cache.apply(slice("s1", "web", "5")).is_some(),
            "the tombstone served once"
        );
    }

    #[test]
    fn a_relist_keeps_objects_newer_than_its_list() {
        let cache = Store::grouped(by_service);
        cache.apply(slice("old", "web", "3"));
        let mut relist = cache.relist();
        cache.relist_apply(&mut relist, slice("listed", "web", "9"));
        // Our own create, answered after the list was read at 10.
        cache.apply(slice("ours", "web", "12"));
        let gone = cache.finish_relist(relist, 10);
        let names: Vec<_> = gone
            .iter()
            .map(|change| change.old.as_ref().unwrap().name.to_string())
            .collect();
        assert_eq!(names, ["old"]);
        assert!(cache.get("ns", "ours").is_some());
    }

    #[test]
    fn a_delete_of_another_object_of_the_same_name_changes_nothing() {
        let cache = Store::grouped(by_service);
        let mut first = slice("s1", "web", "3");
        first.uid = Some(Token::parse("a"));
        let mut second = slice("s1", "web", "8");
        second.uid = Some(Token::parse("b"));
        cache.apply(second);
        assert!(cache.delete(first).is_none());
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_seen_is_remembered_against_a_late_answer_for_a_while() {
        let ttl = Duration::from_secs(60);
        let cache = Store::grouped(by_service).remembering_deletes(ttl);
        cache.apply(slice("s1", "web", "5"));
        // Someone deletes it; the watch says so at version 9.
        assert!(cache.delete(slice("s1", "web", "9")).is_some());
        // The answer to our own update of it (version 7) arrives late: it stays gone.
        assert!(cache.apply(slice("s1", "web", "7")).is_none());
        assert!(cache.is_empty());
        tokio::time::advance(ttl + Duration::from_secs(1)).await;
        cache.delete(slice("other", "web", "12"));
        assert!(
            cache.apply(slice("s1", "web", "7")).is_some(),
            "forgotten once no answer can still come"
        );
    }

    #[test]
    fn a_read_of_one_group_forgets_what_it_no_longer_holds_but_not_newer_answers() {
        let cache = Store::grouped(by_service);
        cache.apply(slice("gone", "web", "3"));
        cache.apply(slice("kept", "web", "4"));
        cache.apply(slice("ours", "web", "12"));
        cache.apply(slice("other", "api", "2"));
        cache.read_group("ns", "web", vec![slice("kept", "web", "9")], 10);
        let names: Vec<String> = cache
            .in_group("ns", "web")
            .iter()
            .map(|slice| slice.name.to_string())
            .collect();
        assert_eq!(names, ["kept", "ours"]);
        assert_eq!(
            cache.in_group("ns", "api").len(),
            1,
            "another group untouched"
        );
        assert!(
            cache.apply(slice("gone", "web", "3")).is_none(),
            "the watch's late report of it changes nothing"
        );
    }
}
