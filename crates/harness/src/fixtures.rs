//! The benches' objects in bulk: Service `svc-<i>` and its workloads `svc-<i>-vm-<j>`, created
//! with many requests in flight.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use api::v1beta1::ExternalWorkload;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client, api::PostParams};
use slices::testing::{Svc, Workload};
use tokio::time::Instant;

use crate::report::progress;

/// Requests in flight while populating the cluster.
pub const CREATE_CONCURRENCY: usize = 32;

/// Service `i` of a namespace: headless (no cluster IP to allocate), selecting `app=svc-<i>`,
/// one named port.
pub fn service(namespace: &str, i: usize) -> Service {
    let name = format!("svc-{i}");
    let mut service: Service = Svc::named(&name)
        .namespace(namespace)
        .selector("app", &name)
        .port("http", 80, "http")
        .headless()
        .build();
    service.metadata.uid = None;
    service
}

/// Workload `j` of Service `i`: one IPv4 address unique in the namespace, labels selecting it.
pub fn workload(namespace: &str, i: usize, j: usize, per_service: usize) -> ExternalWorkload {
    let n = i * per_service + j;
    let ip = format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256);
    let mut workload: ExternalWorkload = Workload::named(&format!("svc-{i}-vm-{j}"))
        .namespace(namespace)
        .label("app", &format!("svc-{i}"))
        .ip(&ip)
        .port("http", 8080)
        .build();
    workload.metadata.uid = None;
    workload
}

/// Creates `services` Services and `per_service` workloads for each in `namespace`, with
/// [`CREATE_CONCURRENCY`] requests in flight; a request that fails is retried a few times.
pub async fn populate(
    client: &Client,
    namespace: &str,
    services: usize,
    per_service: usize,
    started: Instant,
) {
    populate_range(client, namespace, 0..services, per_service, started).await
}

/// Like [`populate`], for Services `range` (`svc-<i>` for `i` in it) and their workloads.
pub async fn populate_range(
    client: &Client,
    namespace: &str,
    range: std::ops::Range<usize>,
    per_service: usize,
    started: Instant,
) {
    let service_api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let workload_api: Api<ExternalWorkload> = Api::namespaced(client.clone(), namespace);
    let total = range.len() * (1 + per_service);
    let done = Arc::new(AtomicUsize::new(0));
    let begun = Instant::now();
    let reporter = {
        let done = done.clone();
        let namespace = namespace.to_string();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let n = done.load(Ordering::Relaxed);
                progress(
                    started,
                    format!(
                        "  {namespace}: {n}/{total} objects ({:.0}/s)",
                        n as f64 / begun.elapsed().as_secs_f64()
                    ),
                );
            }
        })
    };
    let jobs = range.flat_map(|i| (0..=per_service).map(move |j| (i, j)));
    futures::stream::iter(jobs)
        .for_each_concurrent(CREATE_CONCURRENCY, |(i, j)| {
            let (service_api, workload_api, done) =
                (service_api.clone(), workload_api.clone(), done.clone());
            async move {
                for attempt in 0.. {
                    let result = if j == 0 {
                        service_api
                            .create(&PostParams::default(), &service(namespace, i))
                            .await
                            .map(drop)
                    } else {
                        workload_api
                            .create(
                                &PostParams::default(),
                                &workload(namespace, i, j - 1, per_service),
                            )
                            .await
                            .map(drop)
                    };
                    match result {
                        Ok(()) => break,
                        Err(kube::Error::Api(status)) if status.code == 409 => break,
                        Err(error) if attempt < 10 => {
                            eprintln!("create {i}/{j} failed (retrying): {error}");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(error) => panic!("create {i}/{j} failed: {error}"),
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
        .await;
    reporter.abort();
    progress(
        started,
        format!(
            "  {namespace}: {total} objects created in {:.1}s",
            begun.elapsed().as_secs_f64()
        ),
    );
}
