//! Faults the server itself produces, armed by a test or the simulation:
//!
//! - a write applied but its answer lost ([`ApiServer::lose_answer`]): the connection is reset
//!   after the commit, so the client cannot tell whether it happened;
//! - a change racing a confirming read ([`ApiServer::race_read`]): right after a matching read
//!   is answered, and before the reader can act on it, another writer changes an object;
//! - a delete and re-create under one name hidden by compaction
//!   ([`ApiServer::recreate_behind_compaction`]): the history is compacted and the open watches
//!   of the resource closed, so a client that resumes gets 410 and, re-listing, sees only the new
//!   object (another uid) and never the deletion.
//!
//! A watch closed by the server is [`ApiServer::close_watches`]; a kind lagging is a watch
//! cache's lag, configured ([`crate::Instance`]) or raised for a while
//! ([`ApiServer::lag_cache`]).

use std::{sync::Arc, time::Duration};

use serde_json::Value;

use crate::{
    ApiServer, Inner, Verb,
    http::{commit_and_announce, record, timestamp},
    kinds::{self, RESOURCES, Resource},
    patch::merge,
};

/// A write whose answer is lost: the next one that matches.
#[derive(Clone, Debug)]
pub struct LostAnswer {
    /// Callers whose name starts with this.
    pub caller: String,
    /// The resource written (`"endpointslices.discovery.k8s.io"`).
    pub resource: String,
    /// The kind of write, or any.
    pub verb: Option<Verb>,
}

/// A change that follows the next matching read, before its reader can act.
#[derive(Clone, Debug)]
pub struct ReadRace {
    /// Readers whose name starts with this.
    pub caller: String,
    /// The resource read (`"services"`).
    pub resource: String,
    /// The namespace read.
    pub namespace: String,
    /// The object read (a GET of it), or `None` for any read of the resource (lists too).
    pub name: Option<String>,
    /// The object changed (of the same resource, in the same namespace).
    pub target: String,
    /// The change: a merge patch of `target`.
    pub patch: Value,
}

/// The faults armed, each used once.
#[derive(Default)]
pub struct Faults {
    lost: Vec<LostAnswer>,
    races: Vec<ReadRace>,
}

/// The name races and re-creations write under.
pub(crate) const FAULT_CALLER: &str = "apisim:fault";

// === impl ApiServer ===

impl ApiServer {
    /// Loses the answer to the next write that matches `lost`: it is applied, and the client
    /// gets a transport error instead of the answer.
    pub fn lose_answer(&self, lost: LostAnswer) {
        self.inner.faults.lock().lost.push(lost);
    }

    /// After the next read that matches `race` is answered, applies its change (as another
    /// writer, through admission and the observers, as any write).
    pub fn race_read(&self, race: ReadRace) {
        self.inner.faults.lock().races.push(race);
    }

    /// Forgets every fault armed and not yet used (the lost answers and the races).
    pub fn disarm(&self) {
        *self.inner.faults.lock() = Faults::default();
    }

    /// Makes instance `instance`'s watch cache of `resource` (a qualified name: `"services"`,
    /// `"endpointslices.discovery.k8s.io"`) lag `lag` behind the store from now on, as a
    /// kube-apiserver cache falling behind does: it stands still until the lag is made up, then
    /// follows `lag` late. A lag shorter than the configured one changes nothing.
    ///
    /// # Panics
    ///
    /// If no served resource has that name (a fault that silently did nothing would pass any
    /// test).
    pub fn lag_cache(&self, instance: usize, resource: &str, lag: Duration) {
        let storage = served(resource);
        let floor = self.inner.seen_until(instance, storage);
        self.inner
            .raised
            .lock()
            .insert((instance, storage), (lag, floor));
        self.wake_watches();
    }

    /// Ends the lag [`ApiServer::lag_cache`] raised on instance `instance`'s cache of
    /// `resource`: it catches up at once, to its configured lag.
    ///
    /// # Panics
    ///
    /// If no served resource has that name.
    pub fn unlag_cache(&self, instance: usize, resource: &str) {
        let storage = served(resource);
        self.inner.raised.lock().remove(&(instance, storage));
        self.wake_watches();
    }

    /// Ends every lag [`ApiServer::lag_cache`] raised.
    pub fn unlag_caches(&self) {
        self.inner.raised.lock().clear();
        self.wake_watches();
    }

    /// Open watches look again at their cache (its version may have moved without a commit).
    fn wake_watches(&self) {
        self.inner.revisions.send_modify(|_| {});
    }

    /// Deletes `namespace/name` of `resource`, creates `replacement` under the same name (a new
    /// uid), compacts the history and closes the resource's open watches: a client that was not
    /// connected at that moment never sees the deletion. Returns whether the object existed.
    pub fn recreate_behind_compaction(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        replacement: Value,
    ) -> bool {
        let Some(served) = RESOURCES
            .into_iter()
            .find(|served| served.qualified() == resource)
        else {
            return false;
        };
        let storage = served.storage();
        let key = (
            storage.0,
            storage.1,
            namespace.to_string(),
            name.to_string(),
        );
        if !self.inner.store.lock().objects.contains_key(&key) {
            return false;
        }
        commit_and_announce(
            &self.inner,
            FAULT_CALLER,
            Verb::Delete,
            served,
            key.clone(),
            None,
        );
        let mut object = served.stored(replacement);
        {
            let mut store = self.inner.store.lock();
            let metadata = &mut object["metadata"];
            metadata["name"] = Value::from(name);
            if served.namespaced {
                metadata["namespace"] = Value::from(namespace);
            }
            metadata["uid"] = Value::from(store.next_uid());
            metadata["creationTimestamp"] = Value::from(timestamp(&self.inner));
            if served.generation {
                metadata["generation"] = Value::from(1);
            }
        }
        commit_and_announce(
            &self.inner,
            FAULT_CALLER,
            Verb::Create,
            served,
            key,
            Some(object),
        );
        self.inner.store.lock().compact();
        record(
            &self.inner,
            FAULT_CALLER,
            "RECREATE",
            format!("{resource}/{namespace}/{name} (history compacted)"),
            200,
            0,
        );
        self.close_watches(Some(resource));
        true
    }
}

/// The storage of the served resource named `resource` (qualified).
///
/// # Panics
///
/// If no served resource has that name: a fault or a question about a resource the server does
/// not serve would otherwise silently do nothing.
pub(crate) fn served(resource: &str) -> (&'static str, &'static str) {
    kinds::storage_named(resource)
        .unwrap_or_else(|| panic!("no served resource is named {resource:?}"))
}

/// Whether the write just applied (by `caller`, of `resource`, a `verb`) is to lose its answer.
pub fn take_lost_answer(inner: &Inner, caller: &str, resource: Resource, verb: Verb) -> bool {
    let mut faults = inner.faults.lock();
    let found = faults.lost.iter().position(|lost| {
        caller.starts_with(&lost.caller)
            && lost.resource == resource.qualified()
            && lost.verb.is_none_or(|wanted| wanted == verb)
    });
    found.map(|index| faults.lost.remove(index)).is_some()
}

/// Applies the race armed for a read just answered, if one matches.
pub fn after_read(
    inner: &Arc<Inner>,
    caller: &str,
    read: &(Resource, Option<String>, Option<String>),
) {
    let (resource, namespace, name) = read;
    let race = {
        let mut faults = inner.faults.lock();
        let found = faults.races.iter().position(|race| {
            caller.starts_with(&race.caller)
                && race.resource == resource.qualified()
                && namespace.as_deref() == Some(race.namespace.as_str())
                && race
                    .name
                    .as_ref()
                    .is_none_or(|wanted| name.as_ref() == Some(wanted))
        });
        found.map(|index| faults.races.remove(index))
    };
    let Some(race) = race else {
        return;
    };
    let Some(storage) = kinds::storage_named(&race.resource) else {
        return;
    };
    let key = (
        storage.0,
        storage.1,
        race.namespace.clone(),
        race.target.clone(),
    );
    let Some(mut object) = inner.store.lock().objects.get(&key).cloned() else {
        return;
    };
    merge(&mut object, &race.patch);
    record(
        inner,
        FAULT_CALLER,
        "PATCH",
        format!(
            "{}/{}/{} after {caller}'s read",
            race.resource, race.namespace, race.target
        ),
        200,
        crate::log::body_hash(race.patch.to_string().as_bytes()),
    );
    commit_and_announce(
        inner,
        FAULT_CALLER,
        Verb::Patch,
        *resource,
        key,
        Some(object),
    );
}
