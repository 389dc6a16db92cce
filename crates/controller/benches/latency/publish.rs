//! Initial publish at scale: Services and workloads in a namespace with no slices; a leader
//! started on it creates every slice. Timed from the leader's "acquired the lease" log line to
//! the last create answered (its metrics polled every 10 ms), at each `--write-qps`; the
//! baseline is the API server's own create rate: the bench creates the same slices (the
//! planner's output for the same objects, under another managed-by label) with as many
//! requests in flight as the controller has workers (`--workers`, the cap of the controller's
//! calls in flight: the same allowance). `LATENCY_PUBLISH_RUNS` runs of each, in turn.

use std::time::{Duration, SystemTime};

use api::v1beta1::ExternalWorkload;
use futures::StreamExt;
use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use slices::{Config, MANAGED_BY_LABEL, Write, plan_slices};
use tokio::time::Instant;

use harness::{
    Metrics, ReplicaSpec, poll,
    report::{Table, progress, seconds_between},
};

use crate::BINARY;

/// The managed-by label of the baseline's slices (the controller does not watch them).
const RAW_MANAGED_BY: &str = "bench-raw-publish";

/// One publish measurement.
pub struct Published {
    /// Slices created.
    pub slices: f64,
    /// Seconds to create them all.
    pub seconds: f64,
}

/// What to publish and how.
pub struct Settings<'a> {
    pub client: &'a Client,
    pub kubeconfig: &'a std::path::Path,
    pub namespace: &'a str,
    pub services: usize,
    pub workers: usize,
    /// Runs of the baseline and of each leader, in turn.
    pub runs: usize,
    pub started: Instant,
}

/// Measures the baseline and a leader's publish at each of `qps_list`, `runs` times in turn,
/// and adds the rows: min / median / max of the runs, and the median rates' ratio (issue 34's
/// target: ours ≥ 90% of the raw create rate, both with `workers` requests in flight).
pub async fn measure(settings: &Settings<'_>, qps_list: &[usize], table: &mut Table) {
    let at = format!("initial publish, {} Services", settings.services);
    let mut raw_runs: Vec<Published> = Vec::new();
    let mut our_runs: Vec<Vec<Published>> = qps_list.iter().map(|_| Vec::new()).collect();
    for run in 1..=settings.runs {
        let raw = raw_creates(settings).await;
        progress(
            settings.started,
            format!(
                "{at}, run {run}: raw creates: {} slices in {:.2}s ({:.0}/s)",
                raw.slices,
                raw.seconds,
                raw.slices / raw.seconds
            ),
        );
        raw_runs.push(raw);
        for (&qps, runs) in qps_list.iter().zip(&mut our_runs) {
            let ours = controller_publish(settings, qps).await;
            progress(
                settings.started,
                format!(
                    "{at}, run {run}: leader, --write-qps {qps}: {} slices in {:.2}s ({:.0}/s)",
                    ours.slices,
                    ours.seconds,
                    ours.slices / ours.seconds
                ),
            );
            runs.push(ours);
        }
    }
    let seconds = |runs: &[Published]| runs.iter().map(|r| r.seconds).collect::<Vec<_>>();
    let rates = |runs: &[Published]| {
        runs.iter()
            .map(|r| r.slices / r.seconds)
            .collect::<Vec<_>>()
    };
    table.row(
        &format!(
            "{at}: raw client, {} creates in flight: all slices created",
            settings.workers
        ),
        "s",
        &seconds(&raw_runs),
        "baseline",
    );
    table.row(
        &format!("{at}: raw client: creates per second"),
        "",
        &rates(&raw_runs),
        "",
    );
    let raw_rate = median(&rates(&raw_runs));
    for (&qps, runs) in qps_list.iter().zip(&our_runs) {
        table.row(
            &format!(
                "{at}: leader (--workers {}, --write-qps {qps}): acquired → all slices written",
                settings.workers
            ),
            "s",
            &seconds(runs),
            "",
        );
        table.row(
            &format!("{at}: leader (--write-qps {qps}): writes per second"),
            "",
            &rates(runs),
            "",
        );
        table.row(
            &format!("{at}: leader (--write-qps {qps}): % of the raw create rate (medians)"),
            "",
            &[100.0 * median(&rates(runs)) / raw_rate],
            "≥ 90",
        );
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The slices the planner creates for every Service of the namespace, with no slice in place.
async fn planned(client: &Client, namespace: &str) -> Vec<EndpointSlice> {
    let services: Vec<Service> = Api::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let workloads: Vec<ExternalWorkload> = Api::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut by_app: std::collections::HashMap<String, Vec<&ExternalWorkload>> =
        std::collections::HashMap::new();
    for workload in &workloads {
        let app = workload.labels().get("app").cloned().unwrap_or_default();
        by_app.entry(app).or_default().push(workload);
    }
    let config = Config::new(100, RAW_MANAGED_BY.to_string(), "raw-".to_string()).unwrap();
    let now = Time(Timestamp::now());
    let mut slices = Vec::new();
    for service in &services {
        let app = service
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.get("app"))
            .cloned()
            .unwrap_or_default();
        let candidates = by_app.get(&app).cloned().unwrap_or_default();
        let plan = plan_slices(service, &candidates, &[], &config, &now);
        for write in plan.writes() {
            if let Write::Create(slice) = write {
                slices.push(slice.clone());
            }
        }
    }
    slices
}

/// The baseline: the planned slices created by the bench, `workers` requests in flight; then
/// deleted again.
async fn raw_creates(settings: &Settings<'_>) -> Published {
    let slices = planned(settings.client, settings.namespace).await;
    let count = slices.len();
    let api: Api<EndpointSlice> = Api::namespaced(settings.client.clone(), settings.namespace);
    let begun = Instant::now();
    futures::stream::iter(slices)
        .for_each_concurrent(settings.workers, |slice| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &slice).await.unwrap();
            }
        })
        .await;
    let seconds = begun.elapsed().as_secs_f64();
    delete_slices(settings, RAW_MANAGED_BY).await;
    Published {
        slices: count as f64,
        seconds,
    }
}

/// Deletes the slices of the namespace labelled managed-by `managed_by` and waits until none is
/// listed.
async fn delete_slices(settings: &Settings<'_>, managed_by: &str) {
    let api: Api<EndpointSlice> = Api::namespaced(settings.client.clone(), settings.namespace);
    let selector = format!("{MANAGED_BY_LABEL}={managed_by}");
    let params = ListParams::default().labels(&selector);
    api.delete_collection(&DeleteParams::default(), &params)
        .await
        .unwrap();
    poll(
        "the slices deleted",
        Duration::from_secs(300),
        Duration::from_millis(100),
        || async {
            let left = api.list_metadata(&params.clone().limit(1)).await.ok()?;
            left.items.is_empty().then_some(())
        },
    )
    .await;
}

/// A leader with `--write-qps qps` on the namespace with no slice of ours: acquired → every
/// slice created.
async fn controller_publish(settings: &Settings<'_>, qps: usize) -> Published {
    delete_slices(settings, slices::DEFAULT_MANAGED_BY).await;
    let spec = ReplicaSpec {
        watch_namespace: Some(settings.namespace.to_string()),
        lease_namespace: settings.namespace.to_string(),
        lease_name: format!("bench-publish-{qps}"),
        extra: vec![
            "--write-qps".to_string(),
            qps.to_string(),
            "--workers".to_string(),
            settings.workers.to_string(),
        ],
    };
    let mut leader = spec
        .start(
            BINARY,
            settings.kubeconfig,
            &format!("publish-{}-{qps}", settings.services),
        )
        .await;
    leader.wait_ready(Duration::from_secs(900)).await;
    leader.wait_leading(Duration::from_secs(120)).await;
    let services = settings.services;
    let metrics: Metrics = poll(
        "every slice created",
        Duration::from_secs(1800),
        Duration::from_millis(10),
        || async {
            let metrics = leader.metrics().await.ok()?;
            (metrics.all_checked(services) && metrics.writes_of("Create") >= services as f64)
                .then_some(metrics)
        },
    )
    .await;
    let done = SystemTime::now();
    let acquired = leader.logged_at("acquired the lease").unwrap();
    // How the calls in flight adapted (cluster::limit): where the limit ended and why it moved.
    let changes = |reason: &str| {
        metrics.sum(
            "external_endpoints_write_limit_changes_total",
            &format!("reason=\"{reason}\""),
        )
    };
    progress(
        settings.started,
        format!(
            "  leader's write limit at the end {}: {} steady rises, {} latency, {} throttled, {} server-error decreases; {} 429s",
            metrics.sum("external_endpoints_write_limit", ""),
            changes("steady"),
            changes("latency"),
            changes("throttled"),
            changes("server_error"),
            metrics.sum("external_endpoints_write_throttled_total", ""),
        ),
    );
    let mean_ms = |stage: &str| {
        let labels = format!("stage=\"{stage}\"");
        1000.0 * metrics.sum("external_endpoints_stage_seconds_sum", &labels)
            / metrics
                .sum("external_endpoints_stage_seconds_count", &labels)
                .max(1.0)
    };
    progress(
        settings.started,
        format!(
            "  leader's barrier {:.3} s; mean per key: queued {:.1} ms, plan {:.2} ms; per write: slot and rate {:.1} ms, write {:.1} ms",
            metrics.sum("external_endpoints_acquire_barrier_seconds", ""),
            mean_ms("queued"),
            mean_ms("plan"),
            mean_ms("rate_limited"),
            mean_ms("write"),
        ),
    );
    leader.terminate();
    leader.wait_exit(Duration::from_secs(60)).await;
    Published {
        slices: metrics.writes_of("Create"),
        seconds: seconds_between(acquired, done),
    }
}
