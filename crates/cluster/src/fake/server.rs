//! A stand-in for the API server's EndpointSlices and for one replica's watch of them.
//!
//! Writes are checked the way the API server checks them: a replace must carry the stored
//! resourceVersion, a delete's uid and resourceVersion preconditions must match, and every
//! accepted change gets a new resourceVersion (and a new generation when the content changed).
//! Every change then reaches the replica's slice watch after a delay the test sets, or is held
//! back until the test releases it: a watch lagging behind our own writes, or stalled.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Preconditions;
use parking_lot::Mutex;
use slices::SERVICE_NAME_LABEL;
use tokio::{
    sync::watch,
    time::{Instant, sleep_until},
};

use super::status;

/// The API server's EndpointSlices, and the watch that tells one replica about their changes.
pub struct SliceServer {
    state: Mutex<State>,
    /// Bumped whenever the watch has something new to look at (a change, a new delay).
    wake: watch::Sender<u64>,
}

/// A change as the slice watch delivers it.
#[derive(Clone, Debug)]
pub enum SliceEvent {
    /// Created or updated: the stored object.
    Applied(EndpointSlice),
    /// Deleted: the object as it was last stored.
    Deleted(EndpointSlice),
}

struct State {
    /// `(namespace, name)` → the stored slice.
    slices: BTreeMap<(String, String), EndpointSlice>,
    /// The last resourceVersion given out (one counter for every object, as etcd's revision).
    version: u64,
    /// Changes the watch has not delivered yet, with the time each was made.
    undelivered: VecDeque<(Instant, SliceEvent)>,
    /// How long the watch takes to deliver a change; `None`: held back until released.
    delay: Option<Duration>,
}

// === impl SliceServer ===

impl SliceServer {
    /// No slices; the watch delivers each change `delay` after it was made.
    pub fn new(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                slices: BTreeMap::new(),
                version: 0,
                undelivered: VecDeque::new(),
                delay: Some(delay),
            }),
            wake: watch::Sender::new(0),
        })
    }

    /// Creates `slice` under a name made from its generateName, as the API server does.
    pub fn create(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let mut state = self.state.lock();
        let version = state.next_version();
        let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
        let name = format!("{prefix}{version:05}");
        let mut created = slice.clone();
        created.metadata.name = Some(name.clone());
        created.metadata.namespace = Some(namespace.to_string());
        created.metadata.uid = Some(format!("uid-{name}"));
        created.metadata.generation = Some(1);
        created.metadata.resource_version = Some(version.to_string());
        state.store(namespace, created.clone());
        drop(state);
        self.wake();
        Ok(created)
    }

    /// Replaces the slice of the same name, only if `slice` carries its current resourceVersion
    /// (409 otherwise, 404 when there is no such slice).
    pub fn replace(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mut state = self.state.lock();
        let stored = state.get(namespace, &name).ok_or_else(|| status(404))?;
        if slice.metadata.resource_version != stored.metadata.resource_version {
            return Err(status(409));
        }
        let replaced = state.update(namespace, stored, slice.clone());
        drop(state);
        self.wake();
        Ok(replaced)
    }

    /// Deletes the slice `name` if `preconditions` hold (409 otherwise, 404 when it is gone).
    pub fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<(), kube::Error> {
        let mut state = self.state.lock();
        let stored = state.get(namespace, name).ok_or_else(|| status(404))?;
        let holds =
            |wanted: &Option<String>, actual: &Option<String>| wanted.is_none() || wanted == actual;
        if !holds(&preconditions.uid, &stored.metadata.uid)
            || !holds(
                &preconditions.resource_version,
                &stored.metadata.resource_version,
            )
        {
            return Err(status(409));
        }
        state.remove(namespace, name);
        drop(state);
        self.wake();
        Ok(())
    }

    /// Another party changes the slice `name` (no precondition): `change` edits the stored
    /// object; it then gets a new resourceVersion, like any write.
    pub fn edit_by_other(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut EndpointSlice),
    ) {
        let mut state = self.state.lock();
        let stored = state.get(namespace, name).expect("the slice exists");
        let mut edited = stored.clone();
        change(&mut edited);
        state.update(namespace, stored, edited);
        drop(state);
        self.wake();
    }

    /// Another party deletes the slice `name`.
    pub fn delete_by_other(&self, namespace: &str, name: &str) {
        let removed = self.state.lock().remove(namespace, name);
        assert!(removed, "the slice {namespace}/{name} exists");
        self.wake();
    }

    /// The stored slices of Service `namespace/service` (by their service-name label), by name.
    pub fn slices_of(&self, namespace: &str, service: &str) -> Vec<EndpointSlice> {
        let state = self.state.lock();
        state
            .slices
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, slice)| slice)
            .filter(|slice| {
                let labels = slice.metadata.labels.as_ref();
                labels
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == Some(service)
            })
            .cloned()
            .collect()
    }

    /// Holds back every change from now on, and those not delivered yet, until
    /// [`release_watch`](Self::release_watch).
    pub fn hold_watch(&self) {
        self.state.lock().delay = None;
        self.wake();
    }

    /// Delivers each change `delay` after it was made (held changes older than that at once).
    pub fn release_watch(&self, delay: Duration) {
        self.state.lock().delay = Some(delay);
        self.wake();
    }

    /// Changes the watch has not delivered yet.
    pub fn undelivered(&self) -> usize {
        self.state.lock().undelivered.len()
    }

    /// Plays the replica's slice watch for ever: hands each change to `deliver`, in the order
    /// the changes were made, once its delay has passed.
    pub async fn run_watch(self: Arc<Self>, mut deliver: impl FnMut(SliceEvent)) {
        let mut woken = self.wake.subscribe();
        loop {
            woken.borrow_and_update();
            let due = {
                let state = self.state.lock();
                match (state.undelivered.front(), state.delay) {
                    (Some((made, _)), Some(delay)) => Some(*made + delay),
                    _ => None,
                }
            };
            match due {
                Some(due) if due <= Instant::now() => {
                    let event = self.state.lock().undelivered.pop_front();
                    if let Some((_, event)) = event {
                        deliver(event);
                    }
                }
                Some(due) => {
                    tokio::select! {
                        () = sleep_until(due) => {}
                        _ = woken.changed() => {}
                    }
                }
                None => {
                    if woken.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn wake(&self) {
        self.wake.send_modify(|count| *count += 1);
    }
}

// === impl State ===

impl State {
    fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    fn get(&self, namespace: &str, name: &str) -> Option<EndpointSlice> {
        let key = (namespace.to_string(), name.to_string());
        self.slices.get(&key).cloned()
    }

    /// Stores `new` in place of `stored`: same name and uid, a new resourceVersion, and a new
    /// generation when the content (endpoints, ports, address type) changed.
    fn update(
        &mut self,
        namespace: &str,
        stored: EndpointSlice,
        mut new: EndpointSlice,
    ) -> EndpointSlice {
        let content_changed = stored.endpoints != new.endpoints
            || stored.ports != new.ports
            || stored.address_type != new.address_type;
        let generation = stored.metadata.generation.unwrap_or(1);
        new.metadata.uid = stored.metadata.uid;
        new.metadata.generation = Some(generation + i64::from(content_changed));
        new.metadata.resource_version = Some(self.next_version().to_string());
        self.store(namespace, new.clone());
        new
    }

    fn store(&mut self, namespace: &str, slice: EndpointSlice) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.slices
            .insert((namespace.to_string(), name), slice.clone());
        self.undelivered
            .push_back((Instant::now(), SliceEvent::Applied(slice)));
    }

    fn remove(&mut self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let Some(mut removed) = self.slices.remove(&key) else {
            return false;
        };
        removed.metadata.resource_version = Some(self.next_version().to_string());
        self.undelivered
            .push_back((Instant::now(), SliceEvent::Deleted(removed)));
        true
    }
}
