//! The storage: one global revision, every object's current version, and the history of
//! changes since the last compaction (etcd's model), with the open watches fed on every write.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

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

/// An open watch: what it selects, and where its events go (one JSON line per message).
pub struct Watcher {
    /// The resource and version it was opened on.
    pub resource: Resource,
    /// Its namespace, if it was opened on one.
    pub namespace: Option<String>,
    /// Its label selector.
    pub labels: LabelSelector,
    /// Its field selector.
    pub fields: FieldSelector,
    /// Where its events go.
    pub sender: mpsc::UnboundedSender<Bytes>,
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
    history: VecDeque<Change>,
    watchers: Vec<Watcher>,
    uids: u64,
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
            watchers: Vec::new(),
            uids: 0,
            random: seed,
        }
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
            self.random = self.random.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.random;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            suffix.push(char::from(ALPHABET[(z % ALPHABET.len() as u64) as usize]));
        }
        suffix
    }

    /// Writes `new` (or deletes, with `None`) at the next revision, feeds the watches, and
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
        let change = Change {
            revision,
            key,
            old: old.clone(),
            new: new.clone(),
        };
        self.feed(&change);
        self.history.push_back(change);
        while self.history.len() as u64 > self.window {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.revision;
            }
        }
        (revision, old, new)
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

    /// The changes of `storage` after `revision`, in order (`None` if compacted away).
    pub fn since(&self, storage: (&str, &str), revision: u64) -> Option<Vec<Change>> {
        if revision < self.compacted {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|change| {
                    change.revision > revision && (change.key.0, change.key.1) == storage
                })
                .cloned()
                .collect(),
        )
    }

    /// Adds an open watch: it gets every change committed from now on that it selects.
    pub fn watch(&mut self, watcher: Watcher) {
        self.watchers.push(watcher);
    }

    fn feed(&mut self, change: &Change) {
        self.watchers.retain(|watcher| {
            if (watcher.resource.group, watcher.resource.plural) != (change.key.0, change.key.1) {
                return !watcher.sender.is_closed();
            }
            match event_for(watcher, change) {
                Some(line) => watcher.sender.send(line).is_ok(),
                None => !watcher.sender.is_closed(),
            }
        });
    }
}

/// Whether `watcher` selects `object`.
pub fn selects(watcher: &Watcher, key: &Key, object: &Value) -> bool {
    watcher
        .namespace
        .as_ref()
        .is_none_or(|namespace| *namespace == key.2)
        && watcher.labels.matches(&labels_of(object))
        && watcher.fields.matches(object)
}

/// The watch event `change` makes for `watcher`, as one JSON line: an object entering its
/// selection is ADDED, leaving it DELETED.
pub fn event_for(watcher: &Watcher, change: &Change) -> Option<Bytes> {
    let before = change
        .old
        .as_ref()
        .is_some_and(|old| selects(watcher, &change.key, old));
    let after = change
        .new
        .as_ref()
        .is_some_and(|new| selects(watcher, &change.key, new));
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
    Some(line(kind, watcher.resource.served(object)))
}

/// One watch event line.
pub fn line(kind: &str, object: Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}
