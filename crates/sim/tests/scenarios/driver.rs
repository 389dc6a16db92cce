//! The scripted driver of the scenarios: one replica of the production controller (built as
//! the binary builds it, by [`sim::replica`]) against the in-memory API, on a current-thread
//! runtime in paused time, driven step by step by the test.
//!
//! ```text
//!  test ──changes (driver client)──► in-memory API ◄── Link (held/lagged slice watch, held answer)
//!   │                                  │  ▲                         ▲
//!   │   Lease held by "intruder" ──────┘  └── replica-0: Controller::new(kube::Client(Link))
//!   └── asserts: stored slices, request log, the replica's /metrics, the simulation's checks
//! ```
//!
//! Everything the replica sees comes from the API as a real answer: a competing holder of the
//! Lease ends and starts its terms ([`Scripted::follow`], [`Scripted::lead`]), another writer's
//! edit makes its stale write a 409, the link holds or lags its slice watch or the answer to
//! one write. The checks of the simulation (no write from an ended term, nothing deleted comes
//! back) run all along and every scenario ends by asserting they held ([`Scripted::stop`]).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{future::Future, sync::Arc, time::Duration};

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::api::{Api, DeleteParams, PostParams};
use leadership::{LeaseTimings, RuntimeConfig};
use sim::{
    Safeguard,
    checks::{Checks, Judge},
    link::Link,
    replica::{self, LEASE_NAME, LEASE_NAMESPACE, Replica},
    rng::Rng,
};
use slices::{SERVICE_NAME_LABEL, testing::NAMESPACE};
use tokio::time::{Instant, sleep};

/// The one replica's identity.
const IDENTITY: &str = "replica-0";

/// The competing holder of the Lease while the replica is to follow.
const INTRUDER: &str = "intruder";

/// How late the replica's slice watch shows each change, unless a scenario holds it: a watch
/// is never instant, and a scenario about a cache behind our own write needs it late.
pub const WATCH_LAG: Duration = Duration::from_millis(20);

/// The resource whose watch the scenarios hold and lag.
const SLICES: &str = "endpointslices";

/// The qualified name of that resource, for the API server's own watch cache.
const SLICES_QUALIFIED: &str = "endpointslices.discovery.k8s.io";

/// How long [`wait_until`] waits (in paused time) before failing the test.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// One replica and the API, running: see the module docs.
pub struct Scripted {
    server: apisim::ApiServer,
    driver: kube::Client,
    checks: Arc<Checks>,
    replica: Replica,
    _exits: tokio::sync::mpsc::UnboundedReceiver<(usize, sim::link::AtWrite)>,
}

// === impl Scripted ===

impl Scripted {
    /// Starts the replica as a follower (the Lease held by another) with empty caches, its slice
    /// watch lagging [`WATCH_LAG`]; the safeguard `off`, if any, is switched off. Waits until its
    /// caches have synced.
    pub async fn start(off: Option<Safeguard>) -> Self {
        Self::start_with(off, |_| {}).await
    }

    /// As [`Scripted::start`], with `edit` applied to the replica's configuration last (to switch
    /// a second controller safeguard off beside `off`).
    pub async fn start_with(
        off: Option<Safeguard>,
        edit: impl FnOnce(&mut cluster::ControllerConfig),
    ) -> Self {
        let server = apisim::ApiServer::new(apisim::ServerConfig::default());
        let driver = server.client("driver");
        let judge = Judge {
            renew_deadline: LeaseTimings::default().renew_deadline(),
            stall_bound: sim::replica::STALL_BOUND,
            margin: RuntimeConfig::default().fence_margin(),
            fence: off != Some(Safeguard::Fence),
        };
        let checks = Arc::new(Checks::new(vec![IDENTITY.to_string()], judge));
        let observed = checks.clone();
        server.observe(move |applied| observed.applied(applied));
        let (exits_sender, exits) = tokio::sync::mpsc::unbounded_channel();
        let link = Link::new(0, Rng::new(0), exits_sender);
        link.lag_watches_of(SLICES, WATCH_LAG);
        let mut scripted = Self {
            server,
            driver,
            checks,
            replica: Replica::new(0, IDENTITY.to_string(), link),
            _exits: exits,
        };
        scripted.take_lease().await;
        let mut config = replica::config(IDENTITY, off);
        edit(&mut config);
        scripted
            .replica
            .start(&scripted.server, config, &scripted.checks);
        wait_until("the caches synced", || scripted.caches_ready()).await;
        scripted
    }

    /// The replica's link to the API (its faults).
    pub fn link(&self) -> &Link {
        &self.replica.link
    }

    // --- leadership ---

    /// The replica's current term, if it leads.
    pub fn term(&self) -> Option<u64> {
        let leadership = self.replica.leadership()?;
        leadership.borrow().as_ref().map(leadership::Term::id)
    }

    /// Publishes a free Lease (the competing holder releases it), without waiting.
    async fn release_lease(&self) {
        self.edit_lease(|lease| {
            let spec = lease.spec.get_or_insert_default();
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        })
        .await;
    }

    /// The competing holder takes the Lease for an hour; the replica follows once it sees that.
    async fn take_lease(&self) {
        self.edit_lease(|lease| {
            let spec = lease.spec.get_or_insert_default();
            let now = MicroTime(Timestamp::now());
            spec.holder_identity = Some(INTRUDER.to_string());
            spec.lease_duration_seconds = Some(3_600);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        })
        .await;
    }

    /// The Lease is released and the replica acquires a new term; returns its id once the
    /// replica leads.
    pub async fn lead(&self) -> u64 {
        let before = self.term();
        self.release_lease().await;
        wait_until("a new term", || {
            self.term().is_some() && self.term() != before
        })
        .await;
        self.term().expect("leading")
    }

    /// Another holder takes the Lease; waits until the replica follows.
    pub async fn follow(&self) {
        self.take_lease().await;
        wait_until("the replica follows", || self.term().is_none()).await;
    }

    /// Someone deletes the Lease, its holder not told.
    pub async fn delete_lease(&self) {
        let leases: Api<Lease> = Api::namespaced(self.driver.clone(), LEASE_NAMESPACE);
        leases
            .delete(LEASE_NAME, &DeleteParams::default())
            .await
            .expect("the Lease deleted");
    }

    /// Reads, edits and writes back the Lease (creating it when missing), again on a conflict
    /// with the replica's own renewals.
    async fn edit_lease(&self, edit: impl Fn(&mut Lease)) {
        let leases: Api<Lease> = Api::namespaced(self.driver.clone(), LEASE_NAMESPACE);
        loop {
            let written = match leases.get_opt(LEASE_NAME).await.expect("a Lease read") {
                Some(mut lease) => {
                    edit(&mut lease);
                    leases
                        .replace(LEASE_NAME, &PostParams::default(), &lease)
                        .await
                }
                None => {
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(LEASE_NAME.to_string()),
                            namespace: Some(LEASE_NAMESPACE.to_string()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(Default::default()),
                    };
                    edit(&mut lease);
                    leases.create(&PostParams::default(), &lease).await
                }
            };
            match written {
                Ok(_) => return,
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => panic!("writing the Lease: {error}"),
            }
        }
    }

    // --- changes by others ---

    /// Creates `service`, or replaces its spec and labels.
    pub async fn apply_service(&self, service: Service) {
        let api: Api<Service> = Api::namespaced(self.driver.clone(), NAMESPACE);
        let name = service.metadata.name.clone().expect("a name");
        match api.get_opt(&name).await.expect("a Service read") {
            Some(mut stored) => {
                stored.metadata.labels = service.metadata.labels;
                stored.spec = service.spec;
                api.replace(&name, &PostParams::default(), &stored)
                    .await
                    .expect("a Service replaced");
            }
            None => {
                let mut service = service;
                service.metadata.uid = None;
                api.create(&PostParams::default(), &service)
                    .await
                    .expect("a Service created");
            }
        }
    }

    /// Creates `workload` (then writes its status, as the workload's agent does), or replaces
    /// its spec and labels and, when it changed, its status.
    pub async fn apply_workload(&self, workload: ExternalWorkload) {
        let api = self.workloads();
        let name = workload.metadata.name.clone().expect("a name");
        let mut stored = match api.get_opt(&name).await.expect("a workload read") {
            Some(mut stored) => {
                stored.metadata.labels = workload.metadata.labels.clone();
                stored.spec = workload.spec.clone();
                api.replace(&name, &PostParams::default(), &stored)
                    .await
                    .expect("a workload replaced")
            }
            None => {
                let mut new = workload.clone();
                new.metadata.uid = None;
                new.status = None;
                api.create(&PostParams::default(), &new)
                    .await
                    .expect("a workload created")
            }
        };
        if stored.status != workload.status {
            stored.status = workload.status;
            api.replace_status(&name, &PostParams::default(), &stored)
                .await
                .expect("a workload status written");
        }
    }

    /// Deletes the workload `name`.
    pub async fn delete_workload(&self, name: &str) {
        self.workloads()
            .delete(name, &DeleteParams::default())
            .await
            .expect("a workload deleted");
    }

    /// Another party changes the slice `name` (no precondition but its own read).
    pub async fn edit_slice(&self, name: &str, edit: impl FnOnce(&mut EndpointSlice)) {
        let api = self.slices();
        let mut slice = api.get(name).await.expect("the slice exists");
        edit(&mut slice);
        api.replace(name, &PostParams::default(), &slice)
            .await
            .expect("the slice replaced");
    }

    /// Another party deletes the slice `name`.
    pub async fn delete_slice(&self, name: &str) {
        self.slices()
            .delete(name, &DeleteParams::default())
            .await
            .expect("the slice deleted");
    }

    fn workloads(&self) -> Api<ExternalWorkload> {
        Api::namespaced(self.driver.clone(), NAMESPACE)
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.driver.clone(), NAMESPACE)
    }

    // --- the slice watch ---

    /// Holds back the replica's slice watch: what the API stores from now on (and what it has
    /// not delivered yet) stays unseen until [`Scripted::release_slice_watch`].
    pub fn hold_slice_watch(&self) {
        self.link().hold_watches_of(SLICES);
    }

    /// The slice watch delivers again (each change [`WATCH_LAG`] after it was read, as before).
    pub fn release_slice_watch(&self) {
        self.link().release_watches();
    }

    /// The API server's own watch cache of slices lags `lag` behind its store from now on (as a
    /// kube-apiserver cache falling behind): watches and their bookmarks show the past, while
    /// consistent reads show the present.
    pub fn lag_slice_cache(&self, lag: Duration) {
        self.server.lag_cache(0, SLICES_QUALIFIED, lag);
    }

    /// Waits until every watch frame the API sent has reached the replica, and a moment for
    /// the replica to take it in.
    pub async fn watch_caught_up(&self) {
        wait_until("the watch caught up", || {
            self.link().undelivered_frames() == 0
        })
        .await;
        sleep(Duration::from_millis(10)).await;
    }

    // --- what the API holds and saw ---

    /// The stored slices of Service `service` (by their service-name label).
    pub fn slices_of(&self, service: &str) -> Vec<EndpointSlice> {
        self.server
            .objects::<EndpointSlice>()
            .into_iter()
            .filter(|slice| slice.metadata.namespace.as_deref() == Some(NAMESPACE))
            .filter(|slice| {
                let labels = slice.metadata.labels.as_ref();
                labels
                    .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == Some(service)
            })
            .collect()
    }

    /// The name of the one slice Service `service` has.
    pub fn only_slice(&self, service: &str) -> String {
        let slices = self.slices_of(service);
        assert_eq!(slices.len(), 1, "{slices:?}");
        slices[0].metadata.name.clone().expect("a name")
    }

    /// Every address the stored slices of Service `service` publish, each as often as
    /// published, sorted.
    pub fn published(&self, service: &str) -> Vec<String> {
        let mut addresses: Vec<String> = self
            .slices_of(service)
            .into_iter()
            .flat_map(|slice| slice.endpoints.unwrap_or_default())
            .flat_map(|endpoint| endpoint.addresses)
            .collect();
        addresses.sort();
        addresses
    }

    /// Waits until the stored slices of Service `service` publish exactly `addresses`, each
    /// once.
    pub async fn wait_published(&self, service: &str, addresses: &[&str]) {
        let mut expected: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        expected.sort();
        wait_until(&format!("{service} publishes {addresses:?}"), || {
            self.published(service) == expected
        })
        .await;
    }

    /// The replica's slice writes the API answered, in order, as `"<METHOD> <name> <status>"`
    /// (`"POST - 201"` for a create, `"DELETE web-abcde 409"`).
    pub fn slice_writes(&self) -> Vec<String> {
        self.server
            .log()
            .into_iter()
            .filter(|entry| entry.caller == IDENTITY && entry.method != "GET")
            .filter_map(|entry| {
                let path = entry.uri.split('?').next().unwrap_or_default().to_string();
                let (_, rest) = path.split_once("/endpointslices")?;
                let name = rest.trim_start_matches('/');
                let name = if name.is_empty() { "-" } else { name };
                Some(format!("{} {name} {}", entry.method, entry.status))
            })
            .collect()
    }

    /// How many single objects of `resource` (`"services"`) the replica read by a GET.
    pub fn object_reads(&self, resource: &str) -> usize {
        let collection = format!("/{resource}/");
        self.server
            .log()
            .into_iter()
            .filter(|entry| entry.caller == IDENTITY && entry.method == "GET")
            .filter(|entry| {
                let path = entry.uri.split('?').next().unwrap_or_default();
                path.split_once(&collection)
                    .is_some_and(|(_, name)| !name.is_empty())
            })
            .count()
    }

    /// The replica's slice writes whose line starts with `prefix` (`"POST"`, `"PUT"`).
    pub fn writes_of(&self, prefix: &str) -> usize {
        let writes = self.slice_writes();
        writes
            .iter()
            .filter(|write| write.starts_with(prefix))
            .count()
    }

    // --- the replica's metrics ---

    /// The value of `series` (a metric name with its labels, as `/metrics` prints it).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.replica.metrics();
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
    }

    /// Whether every cache is ready (`cache_ready` of each kind is 1).
    pub fn caches_ready(&self) -> bool {
        let text = self.replica.metrics();
        let ready: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("cache_ready{"))
            .collect();
        ready.len() == 3 && ready.iter().all(|line| line.ends_with(" 1"))
    }

    /// Reconciles that ended with `outcome` (`"Ok"`, `"Waited"`, `"Fenced"`, `"Conflict"`,
    /// `"Error"`), so far.
    pub fn outcomes(&self, outcome: &str) -> u64 {
        let series = format!("reconcile_duration_seconds_count{{outcome=\"{outcome}\"}}");
        self.metric(&series).unwrap_or(0.0) as u64
    }

    /// Whether the replica has nothing left to do: no key queued, waiting or in flight, no
    /// write on the wire, every watch frame delivered.
    pub fn is_idle(&self) -> bool {
        self.metric("queue_depth") == Some(0.0)
            && self.metric("queue_in_flight") == Some(0.0)
            && self.link().writes_in_flight() == 0
            && self.link().undelivered_frames() == 0
    }

    /// Waits until [`is_idle`](Self::is_idle).
    pub async fn settle(&self) {
        wait_until("the replica to be idle", || self.is_idle()).await;
    }

    /// Stops the replica as on SIGTERM, checks that it stopped cleanly, and that every check of
    /// the simulation held throughout.
    pub async fn stop(mut self) {
        self.replica.stop();
        wait_until("the replica stopped", || !self.replica.running()).await;
        let ended = self.replica.reap(&self.checks);
        assert_eq!(ended, None, "a clean stop");
        let violations = self.checks.violations();
        assert!(violations.is_empty(), "{violations:#?}");
    }
}

/// Waits (in paused time, polling every millisecond) until `condition` holds; fails the test
/// after [`WAIT_LIMIT`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_LIMIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(1)).await;
    }
}

/// Runs `scenario` on a current-thread runtime in paused time, as the simulation runs a seed.
pub fn run<F: Future<Output = ()>>(scenario: impl FnOnce() -> F) {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&[0; 8]));
    let runtime = builder.build().expect("a current-thread runtime");
    runtime.block_on(scenario());
}
