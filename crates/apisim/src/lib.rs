//! An in-memory Kubernetes API server for the deterministic simulation (test support only; no
//! product binary depends on it).
//!
//! It is a tower `Service`, so `kube::Client::new(server.service("caller"), "default")` talks
//! to it with no sockets, and it serves what external-endpoints and its elector use, with the
//! API server's semantics: one global resourceVersion over an etcd-like history; paged LIST
//! (`limit`/`continue`, label and field selectors, a consistent read when no version is given,
//! the metadata-only form); WATCH from a version with ordered events, bookmarks,
//! `timeoutSeconds`, streaming lists (`sendInitialEvents`), and `410 Gone` for a version older
//! than the kept history; GET, CREATE (`generateName`), UPDATE (resourceVersion precondition;
//! one that changes nothing is answered and not written), PATCH (merge, JSON, strategic without
//! lists) and DELETE (uid and resourceVersion preconditions; finalizers hold an object, marked
//! deleting, until the last is removed), with `409 Conflict`, `404 NotFound` and
//! `409 AlreadyExists`; the `status` subresource. Kinds: Services, Namespaces, EndpointSlices,
//! Leases, Events (core and events.k8s.io, one storage), ExternalWorkloads (v1beta1 stored,
//! v1alpha1 converted with no webhook). Anything else is answered `404` (an unknown resource)
//! or `405`/`415` (an unsupported verb or patch type, server-side apply among them), never a
//! silent success.
//!
//! ```text
//!  client ─► ApiService ─(seeded pick, or pinned)─► instance i ─► verbs ─► Store (etcd)
//!                                                       │                    │ feed
//!                                                       └─ watch caches ◄────┘ (lag per
//!                                                          instance and resource)
//! ```
//!
//! **Watch caches.** Each instance ([`Instance`]) keeps one cache per resource, shared by all its
//! clients, each `lag` behind the store (seeded with [`Instance::seeded`], or set). Watches,
//! `resourceVersion=0` reads and `NotOlderThan` reads are served from the cache; consistent
//! reads from the store. Bookmarks carry the cache's version, never below the watch's start (a
//! watch resumed on a lagging instance hears nothing until its cache passes the start; a
//! streaming list waits three seconds for it, then fails with 504). The fencing policy (the admission
//! hook, [`ApiServer::admit`]) reads the Lease through [`WriteRequest::cache`], as lagging as the
//! serving instance's cache. With the default config (one instance, no lag) every read is
//! current, as before the caches.
//!
//! **Faults it produces** (`faults.rs`): a watch closed by the server
//! ([`ApiServer::close_watches`]); a write applied but its answer lost
//! ([`ApiServer::lose_answer`]); a change racing a confirming read ([`ApiServer::race_read`]); a
//! delete and re-create under one name hidden by compaction
//! ([`ApiServer::recreate_behind_compaction`]); one kind lagging (an [`Instance`] lag for one
//! resource).
//!
//! It is deterministic under tokio's paused time: timestamps are a fixed date plus the
//! runtime's elapsed time, uids count up, generated names and the instance of each request come
//! from seeded generators, and nothing iterates a hash map. Every request is logged
//! ([`ApiServer::log`]) and the log's hash ([`ApiServer::log_hash`]) is a run's fingerprint.
//!
//! # Fidelity, and deliberate simplifications
//!
//! `tests/fidelity` sends two request sequences to this server and to the testbed's
//! kube-apiserver 1.37.2 and requires the same normalised answers: a hand-written script over
//! EndpointSlices (creates with generateName, paged and selector lists, stale and current
//! updates, preconditioned deletes, a watch from a version, a streaming list) and a seeded
//! differential trace of 600 requests over every kind (`tests/fidelity/trace.rs`: creates, gets,
//! paged and selected lists, updates current, stale and unchanged, the three patch types,
//! `/status`, finalizers, invalid bodies, one watch per kind and version throughout, a bookmark,
//! an expiry). The trace found, and this server now follows: Event groups in one storage with
//! Go's empty fields; ExternalWorkload versions pruning each other's `meshTLS` spelling and
//! ratcheted validation; Service and port defaults; immediate deletes answered with a `Status`
//! (Services with the object at its deletion version); no-op updates not written (with
//! [`ServerConfig::skip_unchanged_writes`]: by default they are still written, for the callers
//! that rely on it); PUT creating
//! a missing Lease, Event or Service (409 when it names a version); pages walked over the keys as etcd does (a page may continue with
//! nothing left that matches); validation before the name is looked up, preconditions before
//! validation. What it does not hold this server to:
//!
//! - Validation is shallow: names, required fields (a Lease's duration, a slice's
//!   `addressType`, a workload's mesh identity, an events.k8s.io Event's reporter, what an
//!   events.k8s.io update may not change), the IPs of workloads and slices, Service ports and
//!   load-balancer status. Other schema rules, CEL rules, and admission plugins other than the
//!   hook are not applied.
//! - Namespaces need not exist: objects can be created in any namespace (the real server's
//!   NamespaceLifecycle admission refuses a missing one).
//! - The garbage collector is off unless [`ServerConfig::garbage_collection`] gives it a delay
//!   (the simulation deletes dependents itself; the testbed runs without kube-controller-manager
//!   by default). It collects in the background policy only: `propagationPolicy` Orphan and
//!   Foreground add their finalizers, which nothing then removes.
//! - Cluster IPs come from 10.96.0.0/16 in order (the real server picks at random; the trace
//!   compares them as "allocated"). The real server's cluster IP repair loop writes Events of
//!   its own (`ClusterIPNotAllocated`) about Services; this server has no background loops, and
//!   the trace leaves such Events out and lists Events unpaged.
//! - Strategic merge patches with a list are refused (415): a list's merge key comes from Go
//!   struct tags that are not modelled. Server-side apply is refused (415).
//! - Event versions: on the real server a write through events.k8s.io of an Event last written
//!   through the core group makes a new resourceVersion even when nothing served changes (the
//!   stored bytes differ); here a write that changes nothing served is never written. The trace
//!   compares Event versions as "not compared" and leaves out a MODIFIED that repeats the last.
//! - Expiry: a watch from a version older than the history is answered with an ERROR event of
//!   code 410 on an open stream, and a continue token from a compacted revision is a 410
//!   answer. kube-apiserver 1.37 serves both from its watch cache and list snapshots after etcd
//!   was compacted (the trace saw it), so it answers 410 later than this server does. Harsher
//!   here on purpose: the simulation's `Expire` fault exercises the re-list path; the trace
//!   checks this server's 410s apart.
//! - Bookmarks come every `bookmark_interval` and two seconds before a watch's timeout (as the
//!   watch cache schedules them); the real server's exact times vary (the trace checks that one
//!   comes before a 6-second timeout, at a version no older than the newest write).
//! - A cached read at a version the cache has not reached is answered at that version at once
//!   (the real server waits up to three seconds for its cache, then answers 504); a watch from
//!   a version newer than its cache waits for the cache, with no time limit.
//! - A watch that falls behind what the caches keep (`compaction_window` changes) is ended; the
//!   real server ends a watcher whose buffer fills, at other thresholds.

mod cache;
mod convert;
mod faults;
mod gc;
mod http;
mod kinds;
mod log;
mod patch;
mod selector;
mod store;

use std::{
    collections::BTreeMap,
    fmt,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::{sync::watch, time::Instant};

use crate::{faults::Faults, kinds::Resource, store::Store};
pub use crate::{
    faults::{LostAnswer, ReadRace},
    http::{ApiService, Body},
    log::LogEntry,
};

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Seeds generated names.
    pub seed: u64,
    /// Changes kept in the history; a watch or continued list from before them is 410.
    pub compaction_window: u64,
    /// How often an open watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// The API server instances behind the one address, each with its own watch caches (at
    /// least one; an empty list is one instance with no lag). A request goes to one of them,
    /// picked by the seed, unless its service is pinned ([`ApiServer::service_on`]); a watch
    /// stays on the instance it was opened on.
    pub instances: Vec<Instance>,
    /// How long after an owner is deleted the garbage collector deletes its dependents (or
    /// removes the reference, when another owner lives); `None`: no collector.
    pub garbage_collection: Option<Duration>,
    /// Whether an update that changes nothing is answered without a write, as kube-apiserver
    /// does (the fidelity trace runs so). Off by default: existing callers (the simulation's
    /// safeguard sample, `cluster`'s TestApi::rewrite) rely on a rewrite of the same content
    /// making a new resourceVersion.
    pub skip_unchanged_writes: bool,
}

/// One API server instance: how far behind the store each of its watch caches is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instance {
    /// The lag of the caches not named in `lags`.
    pub lag: Duration,
    /// The lag of named caches, by resource (`"leases.coordination.k8s.io"`, `"services"`).
    pub lags: BTreeMap<String, Duration>,
}

/// The in-memory API server. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

/// A write's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
}

/// A write about to be applied, for the admission hook.
#[derive(Clone, Debug)]
pub struct WriteRequest {
    /// Who sent it.
    pub caller: String,
    /// What it does.
    pub verb: Verb,
    /// The API group ("" for core).
    pub group: String,
    /// The plural resource name.
    pub plural: String,
    /// Its namespace.
    pub namespace: Option<String>,
    /// The object's name (for a create with generateName, the name it will get).
    pub name: String,
    /// The object as it will be stored (`None` for a delete).
    pub object: Option<Value>,
    /// The watch caches of the instance that serves it: what its admission policies see (a
    /// fencing policy reads the Lease from there, as lagging as that cache is).
    pub cache: CacheView,
}

/// The watch caches of one instance, for reading objects as that instance currently sees them.
#[derive(Clone)]
pub struct CacheView {
    inner: Weak<Inner>,
    instance: usize,
}

/// A write that was applied, for observers.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The revision it made.
    pub revision: u64,
    /// Who sent it.
    pub caller: String,
    /// What it did.
    pub verb: Verb,
    /// The API group ("" for core).
    pub group: String,
    /// The plural resource name.
    pub plural: String,
    /// Its namespace.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// The object before (stored form).
    pub old: Option<Value>,
    /// The object after (stored form; `None` for a delete).
    pub new: Option<Value>,
}

/// Watches closed by the server: of one storage (or all), those with an id below.
type Closure = (Option<Storage>, u64);
/// A resource's storage: group and plural.
type Storage = (&'static str, &'static str);
type Observer = Arc<dyn Fn(&Applied) + Send + Sync>;
type Admission = Arc<dyn Fn(&WriteRequest) -> Result<(), kube::core::Status> + Send + Sync>;

struct Inner {
    store: Mutex<Store>,
    config: ServerConfig,
    observers: Mutex<Vec<Observer>>,
    admission: Mutex<Option<Admission>>,
    log: Mutex<Vec<LogEntry>>,
    started: Instant,
    /// The newest revision, sent on every commit: open watches wake on it.
    revisions: watch::Sender<u64>,
    /// Counts [`ApiServer::close_watches`] calls: open watches wake on it and look whether
    /// they were closed.
    closures: watch::Sender<u64>,
    /// Watches closed by the server: of one resource (or all), those with an id below.
    closed: Mutex<Vec<Closure>>,
    /// The id of the next watch opened.
    next_watch: AtomicU64,
    /// The faults armed for coming requests.
    faults: Mutex<Faults>,
    /// Picks the instance of each request (when there are several).
    balance: Mutex<u64>,
    /// Lags raised while the server runs ([`ApiServer::lag_cache`]), by instance and storage:
    /// the lag, and how far the cache had seen when it was raised (a cache never goes back).
    raised: Mutex<BTreeMap<(usize, Storage), (Duration, Instant)>>,
}

// === impl ServerConfig ===

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            compaction_window: 100_000,
            bookmark_interval: Duration::from_secs(60),
            instances: vec![Instance::default()],
            garbage_collection: None,
            skip_unchanged_writes: false,
        }
    }
}

// === impl Instance ===

impl Instance {
    /// An instance whose caches all lag by `lag`.
    pub fn lagging(lag: Duration) -> Self {
        Self {
            lag,
            lags: BTreeMap::new(),
        }
    }

    /// The same, with the cache of `resource` (`"leases.coordination.k8s.io"`) lagging by `lag`.
    #[must_use]
    pub fn with_lag(mut self, resource: &str, lag: Duration) -> Self {
        self.lags.insert(resource.to_string(), lag);
        self
    }

    /// An instance whose every cache lags by its own amount up to `max`, drawn from `seed`.
    pub fn seeded(seed: u64, max: Duration) -> Self {
        let mut random = seed;
        let mut lags = BTreeMap::new();
        for resource in kinds::RESOURCES {
            let name = resource.qualified();
            if lags.contains_key(&name) {
                continue;
            }
            let draw = store::splitmix(&mut random);
            let millis = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
            lags.insert(name, Duration::from_millis(draw % millis.saturating_add(1)));
        }
        Self {
            lag: Duration::ZERO,
            lags,
        }
    }

    fn lag_of(&self, storage: (&str, &str)) -> Duration {
        let name = if storage.0.is_empty() {
            storage.1.to_string()
        } else {
            format!("{}.{}", storage.1, storage.0)
        };
        self.lags.get(&name).copied().unwrap_or(self.lag)
    }
}

// === impl Inner ===

impl Inner {
    /// How far instance `instance`'s cache of `storage` lags.
    fn lag(&self, instance: usize, storage: (&str, &str)) -> Duration {
        let configured = self
            .config
            .instances
            .get(instance)
            .map_or(Duration::ZERO, |config| config.lag_of(storage));
        self.raised(instance, storage)
            .map_or(configured, |(lag, _)| lag.max(configured))
    }

    /// The lag raised on instance `instance`'s cache of `storage`, and how far that cache had
    /// seen when it was raised ([`ApiServer::lag_cache`]).
    fn raised(&self, instance: usize, storage: (&str, &str)) -> Option<(Duration, Instant)> {
        self.raised
            .lock()
            .iter()
            .find(|((at, raised), _)| *at == instance && *raised == storage)
            .map(|(_, raised)| *raised)
    }

    /// How far instance `instance`'s cache of `storage` has seen the store: `lag` ago, but
    /// never before where it was when a lag was raised.
    fn seen_until(&self, instance: usize, storage: (&str, &str)) -> Instant {
        // Before the server's start when the lag is longer than its life: nothing seen yet.
        let lagging = Instant::now()
            .checked_sub(self.lag(instance, storage))
            .unwrap_or(self.started);
        self.raised(instance, storage)
            .map_or(lagging, |(_, floor)| lagging.max(floor))
    }

    /// The version instance `instance`'s cache of `storage` is at now, and when the change
    /// after it was committed (the cache reaches it `lag` later).
    fn cache_version(&self, instance: usize, storage: (&str, &str)) -> (u64, Option<Instant>) {
        let seen_until = self.seen_until(instance, storage);
        self.store.lock().version_at(seen_until)
    }

    /// Whether the watch `id` of `resource` was closed by the server.
    fn watch_closed(&self, id: u64, resource: Resource) -> bool {
        self.closed.lock().iter().any(|(storage, below)| {
            id < *below && storage.is_none_or(|storage| storage == resource.storage())
        })
    }

    /// The instance of the next request.
    fn pick_instance(&self) -> usize {
        let count = self.config.instances.len();
        if count <= 1 {
            return 0;
        }
        let draw = store::splitmix(&mut self.balance.lock());
        (draw % count as u64) as usize
    }
}

// === impl CacheView ===

impl CacheView {
    /// The object `namespace/name` of kind `K` as this instance's cache holds it now (`None`
    /// when the cache does not hold it).
    pub fn get<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let inner = self.inner.upgrade()?;
        let storage = kinds::storage_named(&kinds::qualified_of(&K::group(&()), &K::plural(&())))?;
        let (version, _) = inner.cache_version(self.instance, storage);
        let store = inner.store.lock();
        let objects = store.cached_at(storage, version);
        let key = (
            storage.0,
            storage.1,
            namespace.to_string(),
            name.to_string(),
        );
        objects
            .get(&key)
            .and_then(|object| serde_json::from_value(object.clone()).ok())
    }

    /// The instance it reads.
    pub fn instance(&self) -> usize {
        self.instance
    }
}

impl fmt::Debug for CacheView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheView")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

// === impl ApiServer ===

impl ApiServer {
    /// An empty server. Needs a tokio runtime (its clock).
    pub fn new(mut config: ServerConfig) -> Self {
        if config.instances.is_empty() {
            config.instances.push(Instance::default());
        }
        let collection = config.garbage_collection;
        let server = Self {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::new(config.compaction_window, config.seed)),
                balance: Mutex::new(config.seed ^ 0xA5A5_A5A5_A5A5_A5A5),
                config,
                observers: Mutex::new(Vec::new()),
                admission: Mutex::new(None),
                log: Mutex::new(Vec::new()),
                started: Instant::now(),
                revisions: watch::Sender::new(1),
                closures: watch::Sender::new(0),
                closed: Mutex::new(Vec::new()),
                next_watch: AtomicU64::new(0),
                faults: Mutex::new(Faults::default()),
                raised: Mutex::new(BTreeMap::new()),
            }),
        };
        if let Some(delay) = collection {
            gc::start(&server.inner, delay);
        }
        server
    }

    /// A client whose requests are attributed to `caller`.
    pub fn client(&self, caller: &str) -> kube::Client {
        kube::Client::new(self.service(caller), "default")
    }

    /// The tower service behind [`ApiServer::client`], to wrap in layers. Its requests go to
    /// the instances behind the address as the seed picks.
    pub fn service(&self, caller: &str) -> ApiService {
        ApiService::new(self.inner.clone(), caller, None)
    }

    /// A service whose requests all go to instance `instance` (as a client that reaches one
    /// API server directly).
    pub fn service_on(&self, caller: &str, instance: usize) -> ApiService {
        ApiService::new(self.inner.clone(), caller, Some(instance))
    }

    /// What instance `instance`'s watch caches hold now.
    pub fn cache(&self, instance: usize) -> CacheView {
        CacheView {
            inner: Arc::downgrade(&self.inner),
            instance,
        }
    }

    /// Whether every instance's watch cache of `resource` (a qualified name) holds every change
    /// of it the store has: a watch of it, opened or open on any instance, can show the present.
    ///
    /// # Panics
    ///
    /// If no served resource has that name.
    pub fn cache_caught_up(&self, resource: &str) -> bool {
        let storage = faults::served(resource);
        let newest = self.revision();
        (0..self.inner.config.instances.len().max(1)).all(|instance| {
            let (version, _) = self.inner.cache_version(instance, storage);
            self.inner
                .store
                .lock()
                .fed(storage, version, newest)
                .is_some_and(|changes| changes.is_empty())
        })
    }

    /// The newest resourceVersion.
    pub fn revision(&self) -> u64 {
        self.inner.store.lock().revision
    }

    /// Forgets the history: watches and continued lists from older versions get 410. Open
    /// watches go on (the watch caches keep their own feed, as on the real server).
    pub fn compact(&self) {
        self.inner.store.lock().compact();
    }

    /// Ends the open watches of `resource` (`"endpointslices.discovery.k8s.io"`), or of every
    /// resource with `None`, as the server does when it shuts a watch (a timeout it chose, a
    /// cache re-initialised): the stream ends cleanly and the client must resume.
    pub fn close_watches(&self, resource: Option<&str>) {
        let storage = resource.and_then(kinds::storage_named);
        http::record(
            &self.inner,
            faults::FAULT_CALLER,
            "CLOSE",
            format!("watches of {}", resource.unwrap_or("every resource")),
            200,
            0,
        );
        let below = self.inner.next_watch.load(Ordering::SeqCst);
        self.inner.closed.lock().push((storage, below));
        self.inner.closures.send_modify(|count| *count += 1);
    }

    /// Every current object of kind `K`, all namespaces, sorted by namespace and name.
    pub fn objects<K>(&self) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        self.find::<K>(|_, _| true)
    }

    /// The object `namespace/name` of kind `K`, if it exists.
    pub fn get<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        self.find::<K>(|ns, object| ns == namespace && object == name)
            .into_iter()
            .next()
    }

    /// The current objects of kind `K` whose namespace and name `wanted` accepts, in order.
    fn find<K>(&self, wanted: impl Fn(&str, &str) -> bool) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let (group, version, plural) = (K::group(&()), K::version(&()), K::plural(&()));
        // Served in K's version (both Event groups share one storage).
        let Some(resource) = kinds::RESOURCES.into_iter().find(|resource| {
            resource.group == group && resource.plural == plural && resource.version == version
        }) else {
            return Vec::new();
        };
        let storage = resource.storage();
        let store = self.inner.store.lock();
        store
            .objects
            .iter()
            .filter(|(key, _)| (key.0, key.1) == storage && wanted(&key.2, &key.3))
            .filter_map(|(_, value)| serde_json::from_value(resource.served(value.clone())).ok())
            .collect()
    }

    /// Calls `observer` for every applied write, after it is stored and before it is answered.
    pub fn observe(&self, observer: impl Fn(&Applied) + Send + Sync + 'static) {
        self.inner.observers.lock().push(Arc::new(observer));
    }

    /// Calls `admission` before every write; an error is the answer, and nothing is written.
    pub fn admit(
        &self,
        admission: impl Fn(&WriteRequest) -> Result<(), kube::core::Status> + Send + Sync + 'static,
    ) {
        *self.inner.admission.lock() = Some(Arc::new(admission));
    }

    /// Every request so far, in order.
    pub fn log(&self) -> Vec<LogEntry> {
        self.inner.log.lock().clone()
    }

    /// A stable hash (FNV-1a) of the log, request bodies included: equal logs, equal hashes.
    pub fn log_hash(&self) -> u64 {
        log::hash(&self.inner.log.lock())
    }
}
