//! The storage: one global revision, every object's current version, and the history of
//! changes since the last compaction (etcd's model), and the feed the watch caches read from
//! (the changes with the instant each was committed, kept apart from the history, so a
//! compaction of etcd does not cut the open watches short, as on the real server).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    kinds::Resource,
    selector::{FieldSelector, LabelSelector, labels_of},
};

/// Where an object is stored: group, plural, namespace ("" for cluster objects), name.
pub type Key = (&'static str, &'static str, String, String);

/// One change, kept for watches that resume from an older revision.
#[derive(Clone, Debug)]
pub struct Change {
    /// The revision the change made.
    pub revision: u64,
    /// The object.
    pub key: Key,
    /// Before (`None` for a create).
    pub old: Option<Value>,
    /// After (`None` for a delete).
    pub new: Option<Value>,
}

/// What a list or a watch selects.
pub struct Selection {
    /// The resource and version it was asked in.
    pub resource: Resource,
    /// Its namespace, if it was asked in one.
    pub namespace: Option<String>,
    /// Its label selector.
    pub labels: LabelSelector,
    /// Its field selector.
    pub fields: FieldSelector,
}

/// A committed change and when it was committed: what the watch caches are fed.
#[derive(Clone, Debug)]
pub struct Fed {
    /// When it was committed.
    pub at: Instant,
    /// The change.
    pub change: Arc<Change>,
}

/// The storage (see the module docs).
pub struct Store {
    /// The newest revision.
    pub revision: u64,
    /// History holds every change after this revision; older versions are gone (410).
    pub compacted: u64,
    /// How many changes the history keeps at most.
    pub window: u64,
    /// Current objects, in their stored form.
    pub objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    /// Every change, with its commit instant, for the watch caches (at most `window` kept).
    feed: VecDeque<Fed>,
    uids: u64,
    cluster_ips: u64,
    random: u64,
}

// === impl Store ===

impl Store {
    /// An empty store keeping `window` changes, naming objects from `seed`.
    pub fn new(window: u64, seed: u64) -> Self {
        Self {
            revision: 1,
            compacted: 1,
            window: window.max(1),
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            feed: VecDeque::new(),
            uids: 0,
            cluster_ips: 10,
            random: seed,
        }
    }

    /// A cluster IP for a new Service, from 10.96.0.0/16 (the testbed's range), in order.
    pub fn next_cluster_ip(&mut self) -> String {
        self.cluster_ips += 1;
        format!(
            "10.96.{}.{}",
            (self.cluster_ips >> 8) & 0xff,
            self.cluster_ips & 0xff
        )
    }

    /// A new uid.
    pub fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }

    /// Five characters for a `generateName`, as the API server appends (seeded, so a run
    /// repeats).
    pub fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut suffix = String::with_capacity(5);
        for _ in 0..5 {
            let z = splitmix(&mut self.random);
            suffix.push(char::from(ALPHABET[(z % ALPHABET.len() as u64) as usize]));
        }
        suffix
    }

    /// Writes `new` (or deletes, with `None`) at the next revision, feeds the watch caches, and
    /// returns the revision. `new` gets that revision as its resourceVersion; a deleted object is
    /// announced with it too.
    pub fn commit(&mut self, key: Key, new: Option<Value>) -> (u64, Option<Value>, Option<Value>) {
        self.revision += 1;
        let revision = self.revision;
        let old = match &new {
            Some(object) => {
                let mut object = object.clone();
                object["metadata"]["resourceVersion"] = Value::from(revision.to_string());
                self.objects.insert(key.clone(), object)
            }
            None => self.objects.remove(&key),
        };
        let new = self.objects.get(&key).cloned();
        let change = Arc::new(Change {
            revision,
            key,
            old: old.clone(),
            new: new.clone(),
        });
        self.feed.push_back(Fed {
            at: Instant::now(),
            change: change.clone(),
        });
        while self.feed.len() as u64 > self.window {
            self.feed.pop_front();
        }
        self.history.push_back(change);
        while self.history.len() as u64 > self.window {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.revision;
            }
        }
        (revision, old, new)
    }

    /// The newest revision committed at or before `at` (the version a cache that sees the
    /// store as of `at` is at), and when the next change after it was committed.
    pub fn version_at(&self, at: Instant) -> (u64, Option<Instant>) {
        let mut next = None;
        for fed in self.feed.iter().rev() {
            if fed.at <= at {
                return (fed.change.revision, next);
            }
            next = Some(fed.at);
        }
        // Nothing fed is that old: the cache is at the oldest revision it can know.
        let oldest = self
            .feed
            .front()
            .map_or(self.revision, |fed| fed.change.revision - 1);
        (oldest, next)
    }

    /// The fed changes of `storage` after revision `after` up to `upto`, in order; `None` when
    /// the feed no longer reaches back to `after` (the watch fell too far behind).
    pub fn fed(&self, storage: (&str, &str), after: u64, upto: u64) -> Option<Vec<Arc<Change>>> {
        let oldest = self
            .feed
            .front()
            .map_or(self.revision, |fed| fed.change.revision - 1);
        if after < oldest {
            return None;
        }
        // The feed holds consecutive revisions: the first one after `after` is found by place.
        let skip = usize::try_from(after - oldest)
            .unwrap_or(usize::MAX)
            .min(self.feed.len());
        Some(
            self.feed
                .range(skip..)
                .map(|fed| &fed.change)
                .take_while(|change| change.revision <= upto)
                .filter(|change| (change.key.0, change.key.1) == storage)
                .cloned()
                .collect(),
        )
    }

    /// Forgets the whole history: a watch or a continued list from any older revision is 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.revision;
    }

    /// The objects of `storage` as they were at `revision` (`None` if compacted away).
    pub fn at(&self, storage: (&str, &str), revision: u64) -> Option<BTreeMap<Key, Value>> {
        if revision < self.compacted {
            return None;
        }
        let mut objects: BTreeMap<Key, Value> = self
            .objects
            .iter()
            .filter(|(key, _)| (key.0, key.1) == storage)
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        for change in self
            .history
            .iter()
            .rev()
            .take_while(|change| change.revision > revision)
        {
            if (change.key.0, change.key.1) != storage {
                continue;
            }
            match &change.old {
                Some(old) => objects.insert(change.key.clone(), old.clone()),
                None => objects.remove(&change.key),
            };
        }
        Some(objects)
    }

    /// The objects of `storage` as a watch cache at `revision` holds them: rebuilt from the feed,
    /// which a compaction of the history does not shorten (from older than the feed reaches,
    /// the oldest state it can rebuild).
    pub fn cached_at(&self, storage: (&str, &str), revision: u64) -> BTreeMap<Key, Value> {
        let mut objects: BTreeMap<Key, Value> = self
            .objects
            .iter()
            .filter(|(key, _)| (key.0, key.1) == storage)
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        for fed in self
            .feed
            .iter()
            .rev()
            .take_while(|fed| fed.change.revision > revision)
        {
            let change = &fed.change;
            if (change.key.0, change.key.1) != storage {
                continue;
            }
            match &change.old {
                Some(old) => objects.insert(change.key.clone(), old.clone()),
                None => objects.remove(&change.key),
            };
        }
        objects
    }

    /// The uids of the objects deleted after revision `after`, in order (as far back as the
    /// feed reaches).
    pub fn deleted_uids(&self, after: u64) -> Vec<String> {
        self.feed
            .iter()
            .map(|fed| &fed.change)
            .filter(|change| change.revision > after && change.new.is_none())
            .filter_map(|change| {
                change
                    .old
                    .as_ref()?
                    .pointer("/metadata/uid")?
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    }

    /// Whether the history still holds every change after `revision` (a watch or a continued
    /// list from it is served; otherwise it is 410).
    pub fn holds(&self, revision: u64) -> bool {
        revision >= self.compacted
    }
}

// === impl Selection ===

impl Selection {
    /// Whether it selects `object`, stored under `key`.
    pub fn selects(&self, key: &Key, object: &Value) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|namespace| *namespace == key.2)
            && self.labels.matches(&labels_of(object))
            && self.fields.matches(object)
    }
}

/// The next number of a splitmix64 sequence kept in `state`.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The watch event `change` makes for `selection`, as one JSON line: an object entering the
/// selection is ADDED, leaving it DELETED.
pub fn event_for(selection: &Selection, change: &Change) -> Option<Bytes> {
    if selection.resource.storage() != (change.key.0, change.key.1) {
        return None;
    }
    let before = change
        .old
        .as_ref()
        .is_some_and(|old| selection.selects(&change.key, old));
    let after = change
        .new
        .as_ref()
        .is_some_and(|new| selection.selects(&change.key, new));
    let (kind, object) = match (before, after, &change.new, &change.old) {
        (false, true, Some(new), _) => ("ADDED", new.clone()),
        (true, true, Some(new), _) => ("MODIFIED", new.clone()),
        (true, false, Some(new), _) => ("DELETED", new.clone()),
        (true, false, None, Some(old)) => {
            let mut old = old.clone();
            old["metadata"]["resourceVersion"] = Value::from(change.revision.to_string());
            ("DELETED", old)
        }
        _ => return None,
    };
    Some(line(kind, selection.resource.served(object)))
}

/// One watch event line.
pub fn line(kind: &str, object: Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}
