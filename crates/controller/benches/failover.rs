//! Fail-over benchmark on the testbed (real kube-apiserver + etcd, real controller processes):
//!
//! 1. graceful hand-over (quiet, then with a client changing the other workloads at
//!    `FAILOVER_CHURN_RATE`/s, 20 by default): SIGTERM the leader, change a workload at once, and time the change
//!    appearing in the EndpointSlice (seen through a watch), and the follower's "acquired the
//!    lease" log line;
//! 2. crash fail-over: the same with SIGKILL (bounded by the lease duration);
//! 3. acquisition with correct slices in place: from the new leader's acquisition until every
//!    Service has been reconciled and the queue is empty, and how many writes it made (must be 0),
//!    at 1k and 10k Services.
//!
//! `cargo bench -p external-endpoints --bench failover`. Knobs (environment):
//! `FAILOVER_ROUNDS` (5), `FAILOVER_ACQUIRE_SIZES` (`1000,10000`), `FAILOVER_ACQUIRE_ROUNDS` (5),
//! `FAILOVER_PER_SERVICE` (5 workloads per Service), `FAILOVER_HANDOVER_SERVICES` (0: Services of
//! `FAILOVER_PER_SERVICE` workloads each beside the hand-over's own, so that its barrier and
//! replay have that many to go through).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, SystemTime},
};

use api::v1beta1::ExternalWorkload;
use futures::StreamExt;
use harness::{
    Metrics, Replica, ReplicaSpec,
    fixtures::populate,
    poll,
    report::{Table, bench_main, env_list, env_usize, progress, seconds_between},
};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use slices::testing::{Svc, Workload};
use tokio::{sync::watch, time::Instant};

const MANAGED_BY: &str =
    "endpointslice.kubernetes.io/managed-by=linkerd-external-workloads-controller";
const LEASE: &str = "bench-lease";

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

fn main() {
    bench_main("failover", run);
}

async fn run() {
    let started = Instant::now();
    let rounds = env_usize("FAILOVER_ROUNDS", 5);
    let sizes = env_list("FAILOVER_ACQUIRE_SIZES", &[1000, 10000]);
    let acquire_rounds = env_usize("FAILOVER_ACQUIRE_ROUNDS", 5);
    let per_service = env_usize("FAILOVER_PER_SERVICE", 5);

    let testbed = testbed::Testbed::start(testbed::Options::default())
        .await
        .unwrap();
    let client = testbed.client().await.unwrap();
    progress(started, "testbed up");

    let mut table = Table::default();
    if rounds > 0 {
        let beside = env_usize("FAILOVER_HANDOVER_SERVICES", 0);
        handover(
            &testbed,
            &client,
            (rounds, beside, per_service),
            started,
            &mut table,
        )
        .await;
        table.print("fail-over (partial results)");
    }
    for &services in &sizes {
        acquire(
            &testbed,
            &client,
            services,
            per_service,
            acquire_rounds,
            started,
            &mut table,
        )
        .await;
        table.print("fail-over (partial results)");
    }
    table.print(&format!(
        "fail-over: lease 15s/10s/2s (defaults), {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ));
    progress(started, "done");
}

/// The new leader's acquisition barrier, from its metric (0 when not read).
async fn barrier_seconds(replica: &Replica) -> f64 {
    replica
        .metric("external_endpoints_acquire_barrier_seconds", "")
        .await
        .unwrap_or(0.0)
}

/// Changes the IPs of vm-1..vm-4 in turn, `rate` times a second, until aborted.
fn churn_workloads(workloads: Api<ExternalWorkload>, rate: usize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1) as u32);
        for n in 0u64.. {
            tick.tick().await;
            let vm = 1 + n % 4;
            let ip = format!("10.2.{}.{}", vm, 1 + (n / 4) % 250);
            let patch = serde_json::json!({"spec": {"workloadIPs": [{"ip": ip}]}});
            let _ = workloads
                .patch(
                    &format!("vm-{vm}"),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await;
        }
    })
}

/// Graceful (SIGTERM, quiet and under churn) and crash (SIGKILL) hand-overs of one Service and a
/// few workloads, with `beside` other Services in the namespace.
async fn handover(
    testbed: &testbed::Testbed,
    client: &Client,
    (rounds, beside, per_service): (usize, usize, usize),
    started: Instant,
    table: &mut Table,
) {
    let namespace = testbed.fresh_namespace("bench-failover").await.unwrap();
    populate(client, &namespace, beside, per_service, started).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let workloads: Api<ExternalWorkload> = Api::namespaced(client.clone(), &namespace);
    let mut service: Service = Svc::named("web")
        .namespace(&namespace)
        .selector("app", "web")
        .port("http", 80, "http")
        .build();
    service.metadata.uid = None;
    service.spec.as_mut().unwrap().cluster_ip = None;
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    for i in 0..5 {
        let mut workload: ExternalWorkload = Workload::named(&format!("vm-{i}"))
            .namespace(&namespace)
            .label("app", "web")
            .ip(&format!("10.0.0.{}", i + 1))
            .port("http", 8080)
            .build();
        workload.metadata.uid = None;
        workloads
            .create(&PostParams::default(), &workload)
            .await
            .unwrap();
    }
    let seen = watch_slice_addresses(client.clone(), &namespace);

    let spec = ReplicaSpec {
        watch_namespace: Some(namespace.clone()),
        lease_namespace: namespace.clone(),
        lease_name: LEASE.to_string(),
        extra: Vec::new(),
    };
    let kubeconfig = testbed.kubeconfig_path();
    let mut next_id = 0;
    let mut spawn = |kubeconfig: &Path| {
        next_id += 1;
        let identity = format!("r{next_id}");
        let spec = spec.clone();
        let kubeconfig = kubeconfig.to_path_buf();
        async move { spec.start(BINARY, &kubeconfig, &identity).await }
    };
    let mut leader = spawn(kubeconfig).await;
    leader.wait_leading(Duration::from_secs(60)).await;
    let mut follower = spawn(kubeconfig).await;
    follower.wait_ready(Duration::from_secs(60)).await;
    wait_seen(&seen, "10.0.0.5", Duration::from_secs(60)).await;
    wait_checked(&leader, beside + 1, Duration::from_secs(300)).await;
    progress(
        started,
        format!(
            "hand-over: 2 replicas up, slices of {} Services written",
            beside + 1
        ),
    );

    // Graceful rounds quiet, then under churn (a client changing the other workloads at
    // `FAILOVER_CHURN_RATE`/s), then crashes.
    let churn_rate = env_usize("FAILOVER_CHURN_RATE", 20);
    for (crash, churn) in [(false, false), (false, true), (true, false)] {
        let kind = match (crash, churn) {
            (true, _) => "SIGKILL".to_string(),
            (false, false) => "SIGTERM".to_string(),
            (false, true) => format!("SIGTERM under {churn_rate}/s churn"),
        };
        let kind = if beside > 0 {
            format!("{kind}, {} Services", beside + 1)
        } else {
            kind
        };
        let churning = churn.then(|| churn_workloads(workloads.clone(), churn_rate));
        let mut barriers = Vec::new();
        let mut to_write = Vec::new();
        let mut to_acquire = Vec::new();
        let mut acquire_to_write = Vec::new();
        let mut to_release = Vec::new();
        for round in 0..rounds {
            // Let the follower settle (caches synced, watching the Lease) and, for a crash, the
            // leader renew at a random phase.
            tokio::time::sleep(Duration::from_millis(1500 + 317 * round as u64)).await;
            // An address no earlier round (nor the churn, 10.2.*) used.
            let ip = format!(
                "10.{}.{}.{}",
                1 + 2 * u8::from(churn),
                u8::from(crash),
                round + 1
            );
            let signalled = SystemTime::now();
            if crash {
                leader.kill();
            } else {
                leader.terminate();
            }
            workloads
                .patch(
                    "vm-0",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"spec": {"workloadIPs": [{"ip": ip}]}})),
                )
                .await
                .unwrap();
            let written = wait_seen(&seen, &ip, Duration::from_secs(60)).await;
            let acquired = poll(
                "the follower's acquisition log line",
                Duration::from_secs(30),
                Duration::from_millis(20),
                || async { follower.logged_at("acquired the lease") },
            )
            .await;
            leader.wait_exit(Duration::from_secs(30)).await;
            // The slice can be seen through the watch before the writer has counted the
            // accepted write: give the counter a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut writes = 0.0;
            while writes < 1.0 && Instant::now() < deadline {
                writes = follower.metrics().await.map_or(0.0, |m| m.writes());
                if writes < 1.0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let release = leader.logged_at("released the lease");
            let line = format!(
                "{kind} round {}: acquired +{:.3}s, slice updated +{:.3}s, new leader's writes {writes}{}",
                round + 1,
                seconds_between(signalled, acquired),
                seconds_between(signalled, written),
                release.map_or(String::new(), |r| format!(
                    ", old leader released +{:.3}s",
                    seconds_between(signalled, r)
                )),
            );
            progress(started, &line);
            if writes < 1.0 {
                // The change reached the old leader before it stopped intake: this sample does
                // not time the new leader's first write.
                progress(started, "  (written by the old leader; sample discarded)");
            } else {
                to_write.push(seconds_between(signalled, written));
                acquire_to_write.push(seconds_between(acquired, written));
            }
            to_acquire.push(seconds_between(signalled, acquired));
            barriers.push(barrier_seconds(&follower).await);
            if let Some(release) = release {
                to_release.push(seconds_between(signalled, release));
            }
            std::mem::swap(&mut leader, &mut follower);
            follower = spawn(kubeconfig).await;
            follower.wait_ready(Duration::from_secs(60)).await;
        }
        if let Some(churning) = churning {
            churning.abort();
        }
        table.row(&format!("{kind}: acquisition barrier"), "s", &barriers, "");
        if crash {
            table.row("crash: SIGKILL → new leader acquired", "s", &to_acquire, "");
            table.row(
                "crash: SIGKILL → new leader's first write seen",
                "s",
                &to_write,
                "≤ 16 s (LeaseDuration + 1 s)",
            );
        } else {
            table.row(
                &format!("graceful ({kind}) → old leader released the lease"),
                "s",
                &to_release,
                "",
            );
            table.row(
                &format!("graceful ({kind}) → new leader acquired"),
                "s",
                &to_acquire,
                "",
            );
            table.row(
                &format!("graceful ({kind}) → new leader's first write seen"),
                "s",
                &to_write,
                "≤ 1 s",
            );
        }
        table.row(
            &format!("{kind}: acquisition → first write seen"),
            "s",
            &acquire_to_write,
            "",
        );
    }
    leader.kill();
    follower.kill();
}

/// Acquisition with correct slices already in place: `services` Services × `per_service`
/// workloads; a first leader converges, then hand-overs are timed from the new leader's
/// acquisition until every Service is checked and its queue is empty.
async fn acquire(
    testbed: &testbed::Testbed,
    client: &Client,
    services: usize,
    per_service: usize,
    rounds: usize,
    started: Instant,
    table: &mut Table,
) {
    let namespace = testbed
        .fresh_namespace(&format!("bench-acquire-{services}"))
        .await
        .unwrap();
    progress(
        started,
        format!(
            "acquire {services}: creating {services} Services and {} workloads",
            services * per_service
        ),
    );
    populate(client, &namespace, services, per_service, started).await;

    let spec = ReplicaSpec {
        watch_namespace: Some(namespace.clone()),
        lease_namespace: namespace.clone(),
        lease_name: LEASE.to_string(),
        extra: Vec::new(),
    };
    let kubeconfig = testbed.kubeconfig_path();
    let mut next_id = 0;
    let mut spawn = || {
        next_id += 1;
        let identity = format!("a{next_id}");
        let spec = spec.clone();
        async move { spec.start(BINARY, kubeconfig, &identity).await }
    };
    let mut leader = spawn().await;
    leader.wait_leading(Duration::from_secs(300)).await;
    let acquired = leader.logged_at("acquired the lease").unwrap();
    let metrics = wait_checked(&leader, services, Duration::from_secs(1800)).await;
    let converged = seconds_between(acquired, SystemTime::now());
    progress(
        started,
        format!(
            "acquire {services}: first leader converged {converged:.1}s after acquiring, {} creates",
            metrics.writes_of("Create")
        ),
    );
    table.row(
        &format!("{services} Services: first leader, empty slices → converged"),
        "s",
        &[converged],
        "",
    );
    let mut follower = spawn().await;
    follower.wait_ready(Duration::from_secs(300)).await;

    let mut checked = Vec::new();
    let mut from_signal = Vec::new();
    let mut cpu_used = Vec::new();
    let mut writes = Vec::new();
    let mut barriers = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_before = follower.metrics().await.map_or(0.0, |m| m.cpu_seconds());
        let signalled = SystemTime::now();
        leader.terminate();
        let metrics = wait_checked(&follower, services, Duration::from_secs(120)).await;
        let cpu = metrics.cpu_seconds() - cpu_before;
        let done = SystemTime::now();
        let acquired = follower.logged_at("acquired the lease").unwrap();
        let reconciles = metrics.reconciles();
        let round_writes = metrics.writes();
        progress(
            started,
            format!(
                "acquire {services} round {}: all checked {:.3}s after acquiring ({:.3}s after SIGTERM, {cpu:.2}s CPU), {reconciles} reconciles, {} queue adds, {round_writes} writes",
                round + 1,
                seconds_between(acquired, done),
                seconds_between(signalled, done),
                metrics.queue_adds(),
            ),
        );
        barriers.push(barrier_seconds(&follower).await);
        checked.push(seconds_between(acquired, done));
        from_signal.push(seconds_between(signalled, done));
        cpu_used.push(cpu);
        writes.push(round_writes);
        leader.wait_exit(Duration::from_secs(60)).await;
        std::mem::swap(&mut leader, &mut follower);
        follower = spawn().await;
        follower.wait_ready(Duration::from_secs(300)).await;
    }
    let target = if services >= 10_000 { "≤ 2 s" } else { "" };
    let each: Vec<String> = checked.iter().map(|s| format!("{s:.3}")).collect();
    let within = checked.iter().filter(|s| **s <= 2.0).count();
    progress(
        started,
        format!(
            "acquire {services}: acquired → all checked, every round: {} s; {within} of {} rounds ≤ 2 s",
            each.join(", "),
            checked.len(),
        ),
    );
    table.row(
        &format!("{services} Services: acquired → all checked, queue empty"),
        "s",
        &checked,
        target,
    );
    table.row(
        &format!("{services} Services: acquisition barrier (acquired → caches shown fresh)"),
        "s",
        &barriers,
        "",
    );
    table.row(
        &format!("{services} Services: SIGTERM → all checked by the new leader"),
        "s",
        &from_signal,
        "",
    );
    table.row(
        &format!("{services} Services: new leader's CPU time, SIGTERM → all checked"),
        "s",
        &cpu_used,
        "",
    );
    table.row(
        &format!("{services} Services: writes by the new leader"),
        "",
        &writes,
        "0",
    );
    leader.kill();
    follower.kill();
}

/// Polls (every 10 ms) until `replica` leads and has reconciled at least `services` keys with
/// nothing queued or in flight.
async fn wait_checked(replica: &Replica, services: usize, timeout: Duration) -> Metrics {
    poll(
        &format!("{} to check {services} Services", replica.identity),
        timeout,
        Duration::from_millis(10),
        || async {
            let metrics = replica.metrics().await.ok()?;
            metrics.all_checked(services).then_some(metrics)
        },
    )
    .await
}

/// Watches the namespace's managed slices; the map holds, per endpoint address, when a slice
/// holding it was first seen.
fn watch_slice_addresses(
    client: Client,
    namespace: &str,
) -> watch::Receiver<HashMap<String, SystemTime>> {
    let (sender, receiver) = watch::channel(HashMap::new());
    let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().labels(MANAGED_BY);
    tokio::spawn(async move {
        let stream = watcher(api, config).default_backoff().applied_objects();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let Ok(slice) = event else { continue };
            let now = SystemTime::now();
            sender.send_modify(|seen| {
                for endpoint in slice.endpoints.iter().flatten() {
                    for address in &endpoint.addresses {
                        seen.entry(address.clone()).or_insert(now);
                    }
                }
            });
        }
    });
    receiver
}

/// Waits until `address` has been seen in a slice; returns when.
async fn wait_seen(
    seen: &watch::Receiver<HashMap<String, SystemTime>>,
    address: &str,
    timeout: Duration,
) -> SystemTime {
    let mut seen = seen.clone();
    let found = tokio::time::timeout(timeout, seen.wait_for(|map| map.contains_key(address)))
        .await
        .unwrap_or_else(|_| panic!("{address} not in a slice within {timeout:?}"))
        .unwrap();
    found[address]
}
