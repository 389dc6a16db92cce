//! The fresh-view rule under a per-kind watch lag, on the testbed (real kube-apiserver + etcd, a
//! real controller process): kube-apiserver keeps one watch cache per resource, and one can fall
//! behind the others. docs/architecture.md, "A fresh view".
//!
//! The leader talks to the API server through the harness's HTTP proxy, which delays every frame
//! of one resource's watches by D (in order; the other watches and every read and write pass at
//! once). Per case (the lagging resource and D, and a baseline with no lag, in the same run), a
//! fresh leader publishes one Service; then, `LAG_ROUNDS` times:
//!
//! - **after our own write**: a readiness flip (the leader writes the slice), and as soon as that
//!   write is visible through the API server, a new workload: change → its address in the slice.
//!   With the slice watch lagging this is the case the rule must keep fast (no wait for the echo).
//! - then the new workload is deleted again, and the next round starts once it is gone.
//!
//! Targets (issue 32): when only our own slices lag, each change within 2 s; when the workload
//! watch lags, within D + 2 s (the lagging kind must be read); when the Service watch lags, the
//! addition is confirmed by a GET of the Service, so it is fast too.
//!
//! `cargo bench -p external-endpoints --bench lag`. Knobs: `LAG_SECONDS` (5,25: the lags D),
//! `LAG_ROUNDS` (5), `LAG_KINDS` (all: a comma-separated subset of `none`, `endpointslices`,
//! `externalworkloads`, `services`). The bench prints the load average first; run it alone on the machine.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

use std::time::Duration;

use harness::{
    Cluster, Replica, poll,
    proxy::HttpProxy,
    report::{Table, bench_main, env_list, env_usize, load_average, progress},
};
use slices::testing::{Svc, Workload};
use tokio::time::Instant;

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// The resources whose watch lags, in the table's order ("" is the baseline with no lag).
const KINDS: [&str; 4] = ["", "endpointslices", "externalworkloads", "services"];

fn main() {
    bench_main("lag", run);
}

async fn run() {
    let started = Instant::now();
    println!("load average before: {}", load_average());
    let lags = env_list("LAG_SECONDS", &[5, 25]);
    let rounds = env_usize("LAG_ROUNDS", 5);
    let testbed = testbed::Testbed::start(testbed::Options::default())
        .await
        .unwrap();
    progress(started, "testbed up");
    let only: Option<Vec<String>> = std::env::var("LAG_KINDS").ok().map(|kinds| {
        kinds
            .split(',')
            .map(|kind| kind.trim().to_string())
            .collect()
    });
    let mut table = Table::default();
    for kind in KINDS {
        let name = if kind.is_empty() { "none" } else { kind };
        if only
            .as_ref()
            .is_some_and(|only| !only.iter().any(|k| k == name))
        {
            continue;
        }
        let cases: Vec<u64> = if kind.is_empty() {
            vec![0]
        } else {
            lags.iter().map(|&lag| lag as u64).collect()
        };
        for lag in cases {
            let lag = Duration::from_secs(lag);
            let samples = case(&testbed, kind, lag, rounds).await;
            let what = if kind.is_empty() {
                "no lag: change after our own write → published".to_string()
            } else {
                format!("{kind} watch {lag:?} behind: change after our own write → published")
            };
            let target = match kind {
                "" | "endpointslices" | "services" => "≤ 2 s".to_string(),
                _ => format!("≤ {:?}", lag + Duration::from_secs(2)),
            };
            table.row(&what, "s", &samples, &target);
            progress(started, &what);
            table.print("lag (partial results)");
        }
    }
    table.print(&format!(
        "fresh view under one kind's watch lag ({} rounds per case; load average after: {})",
        rounds,
        load_average()
    ));
}

/// One case: a leader behind a proxy lagging `kind`'s watches by `lag`; the latency of a new
/// workload added right after the leader's own write, `rounds` times.
async fn case(testbed: &testbed::Testbed, kind: &str, lag: Duration, rounds: usize) -> Vec<f64> {
    let cluster = Cluster::new(testbed, "lag").await;
    cluster
        .create_service(
            Svc::named("web")
                .selector("app", "web")
                .port("http", 80, 8080),
        )
        .await;
    cluster.apply_workload(vm("vm-0", "10.0.0.1").ready()).await;
    let proxy = HttpProxy::start(&testbed.kubeconfig_for("lag-bench", 0).unwrap()).await;
    if !kind.is_empty() {
        proxy.lag_watches_of(kind, lag);
    }
    let kubeconfig = proxy.kubeconfig();
    let args = harness::replica::e2e_args(&cluster.namespace, &[]);
    let leader = Replica::start_with(BINARY, kubeconfig.path(), "lag-leader", &args).await;
    leader.wait_leading(Duration::from_secs(60) + lag).await;
    let settle = Duration::from_secs(30) + lag * 2;
    poll(
        "vm-0 published",
        settle,
        Duration::from_millis(20),
        || async {
            cluster
                .endpoints_of("web")
                .await
                .contains_key("vm-0")
                .then_some(())
        },
    )
    .await;

    let mut samples = Vec::new();
    for round in 0..rounds {
        // Our own write: vm-0's readiness flips, and the leader writes the slice.
        let ready = round % 2 == 1;
        let flip = if ready {
            vm("vm-0", "10.0.0.1").ready()
        } else {
            vm("vm-0", "10.0.0.1").not_ready()
        };
        cluster.apply_workload(flip).await;
        poll(
            "the flip published",
            settle,
            Duration::from_millis(5),
            || async {
                let endpoints = cluster.endpoints_of("web").await;
                (endpoints.get("vm-0").map(|(_, r)| *r) == Some(ready)).then_some(())
            },
        )
        .await;
        // Right after it: a new workload.
        let name = format!("vm-{}", round + 1);
        let changed = Instant::now();
        cluster
            .apply_workload(vm(&name, &format!("10.0.1.{}", round + 1)).ready())
            .await;
        poll(
            "the new workload published",
            settle,
            Duration::from_millis(5),
            || async {
                cluster
                    .endpoints_of("web")
                    .await
                    .contains_key(&name)
                    .then_some(())
            },
        )
        .await;
        samples.push(changed.elapsed().as_secs_f64());
        cluster.delete_workload(&name).await;
        poll(
            "the workload gone",
            settle,
            Duration::from_millis(20),
            || async { (!cluster.endpoints_of("web").await.contains_key(&name)).then_some(()) },
        )
        .await;
    }
    leader.terminate();
    samples
}

fn vm(name: &str, ip: &str) -> Workload {
    Workload::named(name)
        .label("app", "web")
        .ip(ip)
        .port("http", 8080)
}
