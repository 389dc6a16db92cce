//! One measured phase: changes at a fixed rate to the workloads of a set of Services, either
//! through the controller (a workload PATCH; the leader publishes it) or by the bench alone (the
//! raw baseline: the same workload PATCH, then the slice update the controller would make, with
//! no controller running, so both kinds of phase ask the API server for the same writes). A
//! separate watch of the managed slices times each change from the client's receipt of the
//! workload PATCH's answer to the first slice event showing it (an event that came first counts
//! as 0). A workload has at most one change in flight, so "showing it" is exact.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
};
use parking_lot::Mutex;
use slices::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use tokio::{sync::Semaphore, time::Instant};

use harness::report::{load_average, progress};

use crate::{
    load::{Shown, Spread},
    measure::{Cpu, Processes},
};

/// Who publishes the changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Workload PATCHes; the controller writes the slices.
    Controller,
    /// The workload PATCH, then the slice update, both by the bench; no controller runs.
    Raw,
}

/// What one phase measured.
pub struct PhaseResult {
    pub sent: usize,
    pub failed: usize,
    /// Changes never shown within the drain bound.
    pub lost: usize,
    /// Answer → slice event, seconds, sorted.
    pub latencies: Vec<f64>,
    /// The workload PATCH's request → answer, seconds, sorted.
    pub requests: Vec<f64>,
    /// The raw client's slice update request → answer, seconds, sorted (empty for the
    /// controller, whose own updates its `write` stage times).
    pub updates: Vec<f64>,
    /// Seconds it took to send every change (the rate was kept when close to the phase length).
    pub issued: f64,
    /// CPU over the phase (sending and the wait for the last change).
    pub cpu: Cpu,
    pub load_before: String,
    pub load_after: String,
}

/// A workload's place: (namespace, workload name).
type Id = (String, String);

/// One change in flight.
struct InFlight {
    expected: Shown,
    acked: Option<Instant>,
    visible: Option<Instant>,
}

#[derive(Default)]
struct Tracking {
    in_flight: HashMap<Id, InFlight>,
    latencies: Vec<f64>,
    requests: Vec<f64>,
    updates: Vec<f64>,
}

/// Numbers every change's new address and zone: unique across phases, so no change is a no-op.
static NEXT_CHANGE: AtomicUsize = AtomicUsize::new(0);

/// The managed slices, by (namespace, Service).
async fn managed_slices(client: &Client) -> HashMap<Id, EndpointSlice> {
    let api: Api<EndpointSlice> = Api::all(client.clone());
    let selector = format!("{MANAGED_BY_LABEL}={}", slices::DEFAULT_MANAGED_BY);
    api.list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|slice| {
            let service = slice.labels().get(SERVICE_NAME_LABEL)?.clone();
            Some(((slice.namespace().unwrap_or_default(), service), slice))
        })
        .collect()
}

/// What each endpoint of `slice` shows, by workload.
fn shown_in(slice: &EndpointSlice) -> impl Iterator<Item = (String, Shown)> + '_ {
    slice.endpoints.iter().flatten().filter_map(|endpoint| {
        let name = endpoint.target_ref.as_ref()?.name.clone()?;
        let shown = Shown {
            ip: endpoint.addresses.first().cloned().unwrap_or_default(),
            ready: endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(false),
            zone: endpoint.zone.clone(),
        };
        Some((name, shown))
    })
}

/// Runs one phase of `seconds` at `rate` changes/s over the workloads of `services` ((namespace,
/// Service) pairs, each with one slice in place).
pub async fn run(
    client: &Client,
    services: &[Id],
    mode: Mode,
    rate: usize,
    seconds: usize,
    processes: Processes,
    started: Instant,
) -> PhaseResult {
    let slices = managed_slices(client).await;
    // The workloads and what they show now; in a raw phase also their slice, behind a lock per
    // Service (one update of a slice at a time, like the controller's one reconcile per key).
    let mut current: HashMap<Id, Shown> = HashMap::new();
    let mut owner: HashMap<Id, Id> = HashMap::new();
    let mut raw_slices: HashMap<Id, Arc<tokio::sync::Mutex<EndpointSlice>>> = HashMap::new();
    for service in services {
        let Some(slice) = slices.get(service) else {
            panic!("{}/{} has no slice to change", service.0, service.1);
        };
        for (workload, shown) in shown_in(slice) {
            let id = (service.0.clone(), workload);
            current.insert(id.clone(), shown);
            owner.insert(id, service.clone());
        }
        raw_slices.insert(
            service.clone(),
            Arc::new(tokio::sync::Mutex::new(slice.clone())),
        );
    }
    let ids: Vec<Id> = {
        let mut ids: Vec<Id> = current.keys().cloned().collect();
        ids.sort();
        ids
    };

    // The slice watch, synced before the first change.
    let tracking = Arc::new(Mutex::new(Tracking::default()));
    let watch = {
        let tracking = tracking.clone();
        crate::load::watch_slices(client, move |slice| observe(&tracking, slice)).await
    };

    let cpu_before = processes.cpu();
    let load_before = load_average();
    let begun = Instant::now();
    let permits = Arc::new(Semaphore::new(64));
    let mut spread = Spread(0x9e37_79b9_7f4a_7c15 ^ NEXT_CHANGE.load(Ordering::Relaxed) as u64);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = rate * seconds;
    let failed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(total);
    for _ in 0..total {
        ticker.tick().await;
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
        let n = NEXT_CHANGE.fetch_add(1, Ordering::Relaxed);
        let (expected, change) = crate::load::next_change(&current[&id], n);
        current.insert(id.clone(), expected.clone());
        tracking.lock().in_flight.insert(
            id.clone(),
            InFlight {
                expected: expected.clone(),
                acked: None,
                visible: None,
            },
        );
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (client, shared, failed) = (client.clone(), tracking.clone(), failed.clone());
        let slice = raw_slices[&owner[&id]].clone();
        tasks.push(tokio::spawn(async move {
            let sending = Instant::now();
            let mut result = change.send(&client, &id.0, &id.1).await;
            if result.is_ok() {
                acked(&shared, &id, sending);
                if mode == Mode::Raw {
                    let updating = Instant::now();
                    result = update_slice(&client, &slice, &id.1, &expected).await;
                    let took = updating.elapsed().as_secs_f64();
                    shared.lock().updates.push(took);
                }
            }
            drop(permit);
            if let Err(error) = result {
                eprintln!("{mode:?}: change of {}/{} failed: {error}", id.0, id.1);
                shared.lock().in_flight.remove(&id);
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let issued = begun.elapsed().as_secs_f64();
    // Every change must show; 30 s is far beyond any latency seen at a rate the server keeps.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tracking.lock().in_flight.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = processes.cpu().since(&cpu_before);
    let load_after = load_average();
    watch.abort();
    let (lost, mut latencies, mut requests, mut updates) = {
        let tracking = tracking.lock();
        (
            tracking.in_flight.len(),
            tracking.latencies.clone(),
            tracking.requests.clone(),
            tracking.updates.clone(),
        )
    };
    latencies.sort_by(f64::total_cmp);
    requests.sort_by(f64::total_cmp);
    updates.sort_by(f64::total_cmp);
    progress(
        started,
        format!(
            "  {mode:?} {rate}/s: {total} changes sent in {issued:.1}s, {} shown, {lost} not shown after 30 s",
            latencies.len()
        ),
    );
    PhaseResult {
        sent: total,
        failed: failed.load(Ordering::Relaxed),
        lost,
        latencies,
        requests,
        updates,
        issued,
        cpu,
        load_before,
        load_after,
    }
}

/// The workload PATCH of the change of `id`, sent at `sending`, was answered: the latency of
/// the change counts from now (or is 0 if a slice event already showed it).
fn acked(tracking: &Mutex<Tracking>, id: &Id, sending: Instant) {
    let now = Instant::now();
    let mut tracking = tracking.lock();
    tracking.requests.push((now - sending).as_secs_f64());
    let done = match tracking.in_flight.get_mut(id) {
        Some(change) => {
            change.acked = Some(now);
            change.visible.is_some()
        }
        None => false,
    };
    if done {
        tracking.in_flight.remove(id);
        tracking.latencies.push(0.0);
    }
}

/// The raw baseline's slice update: `workload`'s endpoint in its Service's slice set to `expected`,
/// one update (guarded by the resourceVersion of the bench's last answer; re-read on a
/// conflict).
async fn update_slice(
    client: &Client,
    slice: &tokio::sync::Mutex<EndpointSlice>,
    workload: &str,
    expected: &Shown,
) -> Result<(), kube::Error> {
    let mut slice = slice.lock().await;
    let namespace = slice.namespace().unwrap_or_default();
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    for attempt in 0.. {
        let mut changed = slice.clone();
        for endpoint in changed.endpoints.iter_mut().flatten() {
            if endpoint.target_ref.as_ref().and_then(|t| t.name.as_deref()) == Some(workload) {
                endpoint.addresses = vec![expected.ip.clone()];
                endpoint.zone = expected.zone.clone();
                let conditions = endpoint
                    .conditions
                    .get_or_insert_with(EndpointConditions::default);
                conditions.ready = Some(expected.ready);
                conditions.serving = Some(expected.ready);
            }
        }
        match api
            .replace(&changed.name_any(), &PostParams::default(), &changed)
            .await
        {
            Ok(stored) => {
                *slice = stored;
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < 3 => {
                *slice = api.get(&slice.name_any()).await?;
            }
            Err(error) => return Err(error),
        }
    }
    unreachable!("the loop returns")
}

/// Marks the changes a slice event shows.
fn observe(tracking: &Mutex<Tracking>, slice: &EndpointSlice) {
    let now = Instant::now();
    let namespace = slice.namespace().unwrap_or_default();
    let mut tracking = tracking.lock();
    if tracking.in_flight.is_empty() {
        return;
    }
    for (name, shown) in shown_in(slice) {
        let id = (namespace.clone(), name);
        let Some(change) = tracking.in_flight.get_mut(&id) else {
            continue;
        };
        if shown != change.expected || change.visible.is_some() {
            continue;
        }
        match change.acked {
            Some(acked) => {
                let latency = now.duration_since(acked).as_secs_f64();
                tracking.in_flight.remove(&id);
                tracking.latencies.push(latency);
            }
            None => change.visible = Some(now),
        }
    }
}
