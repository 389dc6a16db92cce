//! Sustained load: a client changes workloads at a fixed rate (readiness, address, zone label
//! in turn) spread over the workloads of a set of Services, while a separate watch of the
//! managed slices records when each change becomes visible in a slice.
//!
//! A workload has at most one change in flight, so "visible" is exact: the first slice event
//! showing the workload's endpoint with the changed state. Latency is from the moment the
//! client had the API's answer to its PATCH (the change is stored) to that slice event; a slice
//! event that arrived before the answer was processed counts as 0. At the end, every change
//! must have become visible, and every Service's slices must be what the planner computes from
//! the objects then in the API.

#[path = "slow.rs"]
mod slow;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use api::v1beta1::ExternalWorkload;
use futures::StreamExt;
use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use parking_lot::Mutex;
use slices::{Config, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, plan_slices};
use tokio::{sync::Semaphore, time::Instant};

use harness::{
    Replica,
    report::{Table, load_average, progress},
};

/// How hard and how long.
pub struct Settings {
    /// Changes per second.
    pub rate: usize,
    /// Duration of the load.
    pub seconds: usize,
    /// Services whose workloads are changed (spread over the namespaces).
    pub services: usize,
    /// Workloads per Service.
    pub per_service: usize,
}

/// What the load measured.
pub struct LoadResult {
    changes: usize,
    failed: usize,
    latencies: Vec<f64>,
    lost: usize,
    unconverged: Vec<String>,
    cpu: f64,
    elapsed: f64,
    load_before: String,
    load_after: String,
}

/// What a workload's endpoint shows: address, ready, zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    pub ip: String,
    pub ready: bool,
    pub zone: Option<String>,
}

/// One change in flight.
struct InFlight {
    expected: Shown,
    acked: Option<Instant>,
    visible: Option<Instant>,
}

#[derive(Default)]
struct Tracking {
    in_flight: HashMap<(String, String), InFlight>,
    latencies: Vec<f64>,
    /// Changes that took longer than [`SLOW`] to show: the workload, when its change was
    /// stored, and the latency; printed with the leader's log lines around them.
    slow: Vec<((String, String), Instant, f64)>,
}

/// A change slower than this is reported by name (the p99 is well under it).
pub const SLOW: f64 = 5.0;

/// A small deterministic generator (xorshift64*): the bench needs spread, not randomness.
pub struct Spread(pub u64);

impl Spread {
    pub fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % below.max(1)
    }
}

/// The state a workload shows now (from the API object).
pub fn shown(workload: &ExternalWorkload) -> Shown {
    Shown {
        ip: workload
            .spec
            .workload_ips
            .first()
            .map(|i| i.ip.clone())
            .unwrap_or_default(),
        ready: workload.is_ready(),
        zone: workload.zone().map(str::to_string),
    }
}

/// Runs the load against `leader`.
pub async fn run(
    client: &Client,
    namespaces: &[String],
    leader: &Replica,
    settings: &Settings,
    started: Instant,
) -> LoadResult {
    // The changed workloads: those of the first Services of each namespace.
    let per_namespace = settings.services.div_ceil(namespaces.len());
    let mut current: HashMap<(String, String), Shown> = HashMap::new();
    for namespace in namespaces {
        let api: Api<ExternalWorkload> = Api::namespaced(client.clone(), namespace);
        let wanted: HashSet<String> = (0..per_namespace)
            .flat_map(|i| (0..settings.per_service).map(move |j| format!("svc-{i}-vm-{j}")))
            .collect();
        for workload in api.list(&ListParams::default()).await.unwrap().items {
            if wanted.contains(&workload.name_any()) {
                current.insert((namespace.clone(), workload.name_any()), shown(&workload));
            }
        }
    }
    let ids: Vec<(String, String)> = {
        let mut ids: Vec<_> = current.keys().cloned().collect();
        ids.sort();
        ids
    };
    progress(
        started,
        format!(
            "load: {} workloads of {} Services, {} changes/s for {} s",
            ids.len(),
            settings.services,
            settings.rate,
            settings.seconds
        ),
    );

    // The slice watch, synced before the first change.
    let tracking = Arc::new(Mutex::new(Tracking::default()));
    let watch = {
        let tracking = tracking.clone();
        watch_slices(client, move |slice| observe(&tracking, slice)).await
    };

    let cpu_before = leader.metrics().await.map_or(0.0, |m| m.cpu_seconds());
    let load_before = load_average();
    let begun = Instant::now();
    let permits = Arc::new(Semaphore::new(64));
    let mut spread = Spread(0x9e37_79b9_7f4a_7c15);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / settings.rate as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = settings.rate * settings.seconds;
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(total);
    let mut last_report = Instant::now();
    for seq in 0..total {
        ticker.tick().await;
        // A workload with no change in flight (waiting, not spinning, when every one has).
        let id = loop {
            let id = &ids[spread.next(ids.len())];
            let busy = {
                let tracking = tracking.lock();
                if !tracking.in_flight.contains_key(id) {
                    break id.clone();
                }
                tracking.in_flight.len() * 2 > ids.len()
            };
            if busy {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let (expected, patch) = next_change(&current[&id], seq);
        current.insert(id.clone(), expected.clone());
        tracking.lock().in_flight.insert(
            id.clone(),
            InFlight {
                expected,
                acked: None,
                visible: None,
            },
        );
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (client, shared, failed) = (client.clone(), tracking.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let result = patch.send(&client, &id.0, &id.1).await;
            drop(permit);
            let now = Instant::now();
            let mut tracking = shared.lock();
            match result {
                Ok(()) => {
                    let done = match tracking.in_flight.get_mut(&id) {
                        Some(change) => {
                            change.acked = Some(now);
                            change.visible.is_some()
                        }
                        None => false,
                    };
                    if done {
                        // Seen in a slice before this answer was processed.
                        tracking.in_flight.remove(&id);
                        tracking.latencies.push(0.0);
                    }
                }
                Err(error) => {
                    eprintln!("load: change of {}/{} failed: {error}", id.0, id.1);
                    tracking.in_flight.remove(&id);
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
        if last_report.elapsed() > Duration::from_secs(15) {
            last_report = Instant::now();
            let tracking = tracking.lock();
            progress(
                started,
                format!(
                    "  load: {} changes sent, {} visible, {} in flight",
                    seq + 1,
                    tracking.latencies.len(),
                    tracking.in_flight.len()
                ),
            );
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let issued = begun.elapsed().as_secs_f64();
    // Every change must become visible; 60 s is far beyond any latency seen.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tracking.lock().in_flight.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = begun.elapsed().as_secs_f64();
    let cpu = leader.metrics().await.map_or(0.0, |m| m.cpu_seconds()) - cpu_before;
    let load_after = load_average();
    watch.abort();
    let (lost, latencies) = {
        let tracking = tracking.lock();
        (tracking.in_flight.len(), tracking.latencies.clone())
    };
    progress(
        started,
        format!(
            "load: {total} changes sent in {issued:.1}s, {} visible, {lost} not visible after 60 s",
            latencies.len()
        ),
    );
    slow::report(&tracking.lock().slow, leader, begun, started);
    let unconverged = unconverged(client).await;
    LoadResult {
        changes: total,
        failed: failed.load(std::sync::atomic::Ordering::Relaxed),
        latencies,
        lost,
        unconverged,
        cpu,
        elapsed,
        load_before,
        load_after,
    }
}

/// One workload change.
pub enum Change {
    Ready(bool),
    Ip(String),
    Zone(String),
}

impl Change {
    pub async fn send(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let api: Api<ExternalWorkload> = Api::namespaced(client.clone(), namespace);
        let params = PatchParams::default();
        match self {
            Change::Ready(ready) => {
                let status = if *ready { "True" } else { "False" };
                let patch = serde_json::json!({
                    "status": {"conditions": [{"type": "Ready", "status": status}]}
                });
                api.patch_status(name, &params, &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            Change::Ip(ip) => {
                let patch = serde_json::json!({"spec": {"workloadIPs": [{"ip": ip}]}});
                api.patch(name, &params, &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            Change::Zone(zone) => {
                let patch = serde_json::json!({
                    "metadata": {"labels": {api::ZONE_LABEL: zone}}
                });
                api.patch(name, &params, &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
        }
    }
}

/// Marks the changes a slice event shows as visible.
fn observe(tracking: &Mutex<Tracking>, slice: &EndpointSlice) {
    let now = Instant::now();
    let namespace = slice.namespace().unwrap_or_default();
    let mut tracking = tracking.lock();
    if tracking.in_flight.is_empty() {
        return;
    }
    for endpoint in slice.endpoints.iter().flatten() {
        let Some(name) = endpoint.target_ref.as_ref().and_then(|t| t.name.clone()) else {
            continue;
        };
        let id = (namespace.clone(), name);
        let Some(change) = tracking.in_flight.get_mut(&id) else {
            continue;
        };
        let shown = Shown {
            ip: endpoint.addresses.first().cloned().unwrap_or_default(),
            ready: endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(false),
            zone: endpoint.zone.clone(),
        };
        if shown != change.expected || change.visible.is_some() {
            continue;
        }
        match change.acked {
            Some(acked) => {
                let latency = now.duration_since(acked).as_secs_f64();
                tracking.in_flight.remove(&id);
                tracking.latencies.push(latency);
                if latency > SLOW {
                    tracking.slow.push((id, acked, latency));
                }
            }
            None => change.visible = Some(now),
        }
    }
}

/// The Services whose slices are not what the planner computes from the objects now in the
/// API (empty: nothing lost).
pub async fn unconverged(client: &Client) -> Vec<String> {
    let services: Vec<Service> = Api::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let workloads: Vec<ExternalWorkload> = Api::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let slices: Vec<EndpointSlice> = Api::all(client.clone())
        .list(&ListParams::default().labels(&format!(
            "{MANAGED_BY_LABEL}={}",
            slices::DEFAULT_MANAGED_BY
        )))
        .await
        .unwrap()
        .items;
    // Candidates by (namespace, app label): the bench's Services select `app` only.
    let mut by_app: HashMap<(String, String), Vec<&ExternalWorkload>> = HashMap::new();
    for workload in &workloads {
        let app = workload.labels().get("app").cloned().unwrap_or_default();
        by_app
            .entry((workload.namespace().unwrap_or_default(), app))
            .or_default()
            .push(workload);
    }
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in &slices {
        let service = slice
            .labels()
            .get(SERVICE_NAME_LABEL)
            .cloned()
            .unwrap_or_default();
        by_service
            .entry((slice.namespace().unwrap_or_default(), service))
            .or_default()
            .push(slice);
    }
    let config = Config::default();
    let now = Time(Timestamp::now());
    let mut wrong = Vec::new();
    for service in &services {
        let namespace = service.namespace().unwrap_or_default();
        let app = service
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.get("app"))
            .cloned()
            .unwrap_or_default();
        let candidates = by_app
            .get(&(namespace.clone(), app))
            .cloned()
            .unwrap_or_default();
        let existing = by_service
            .get(&(namespace.clone(), service.name_any()))
            .cloned()
            .unwrap_or_default();
        if !plan_slices(service, &candidates, &existing, &config, &now).is_empty() {
            wrong.push(format!("{namespace}/{}", service.name_any()));
        }
    }
    wrong
}

/// The `q` quantile (0..=1) of sorted samples.
/// Watches the managed slices on a task of its own, calling `observe` for every applied slice;
/// returns once the watch has listed them all.
pub async fn watch_slices(
    client: &Client,
    observe: impl Fn(&EndpointSlice) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<()>();
    let api: Api<EndpointSlice> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&format!(
        "{MANAGED_BY_LABEL}={}",
        slices::DEFAULT_MANAGED_BY
    ));
    let watch = tokio::spawn(async move {
        let mut synced_tx = Some(synced_tx);
        let stream = watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(slice)) => observe(&slice),
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = synced_tx.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    synced_rx.await.unwrap();
    watch
}

/// The `n`th change of a run to a workload shown as `before`: readiness, address and zone in
/// turn (addresses unique per `n`). Returns what the slices should show after it, and the change.
pub fn next_change(before: &Shown, n: usize) -> (Shown, Change) {
    let mut expected = before.clone();
    let change = match n % 3 {
        0 => {
            expected.ready = !before.ready;
            Change::Ready(expected.ready)
        }
        1 => {
            let k = 1_000_000 + n;
            expected.ip = format!(
                "10.{}.{}.{}",
                200 + k / 65536 % 50,
                (k / 256) % 256,
                k % 256
            );
            Change::Ip(expected.ip.clone())
        }
        _ => {
            expected.zone = Some(format!("zone-{n}"));
            Change::Zone(format!("zone-{n}"))
        }
    };
    (expected, change)
}

pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index]
}

// === impl LoadResult ===

impl LoadResult {
    /// Adds the load's rows.
    pub fn rows(&self, table: &mut Table, settings: &Settings, workers: usize) {
        let mut sorted = self.latencies.clone();
        sorted.sort_by(f64::total_cmp);
        let at = format!(
            "load {}/s × {} s over {} Services, {workers} workers",
            settings.rate, settings.seconds, settings.services
        );
        table.row(
            &format!("{at}: changes sent (failed)"),
            "",
            &[self.changes as f64, self.failed as f64],
            "",
        );
        table.row(
            &format!("{at}: event → slice visible, p50"),
            "s",
            &[quantile(&sorted, 0.5)],
            "",
        );
        table.row(
            &format!("{at}: event → slice visible, p99"),
            "s",
            &[quantile(&sorted, 0.99)],
            "",
        );
        table.row(
            &format!("{at}: event → slice visible, max"),
            "s",
            &[sorted.last().copied().unwrap_or(f64::NAN)],
            "",
        );
        table.row(
            &format!(
                "{at}: leader CPU over {:.0} s (load average before: {}; after: {})",
                self.elapsed, self.load_before, self.load_after
            ),
            "s",
            &[self.cpu],
            "",
        );
        table.row(
            &format!("{at}: changes never visible"),
            "",
            &[self.lost as f64],
            "0",
        );
        table.row(
            &format!(
                "{at}: Services whose slices differ from the plan of the final objects{}",
                if self.unconverged.is_empty() {
                    String::new()
                } else {
                    format!(" (e.g. {})", self.unconverged[0])
                }
            ),
            "",
            &[self.unconverged.len() as f64],
            "0",
        );
    }
}
