//! Planner benchmarks (docs/benchmarks.md): 1,000 workloads ≤ 0.5 ms, no-op ≤ 0.2 ms, a full
//! resync of 10k Services × 10 workloads ≤ 200 ms of CPU. Run: `cargo bench -p slices --bench plan`.
//!
//! Measured in CPU time of the benchmarking thread, not wall time: the targets are CPU budgets,
//! and on a shared machine wall time mostly measures the neighbours. Inputs are the cached forms
//! the controller's caches hold (`plan_cached`), made once before measuring, as the caches make
//! them once per watch event.
#![allow(missing_docs)] // criterion_main! generates an undocumented main

use std::hint::black_box;
use std::time::Duration;

use api::v1beta1::ExternalWorkload;
use cpu_time::ThreadTime;
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{SliceStore, Svc, Workload, time};
use slices::{CachedService, CachedSlice, CachedWorkload, Config, plan_cached, plan_slices};

fn service(namespace: &str) -> Service {
    web(namespace).build()
}

fn web(namespace: &str) -> Svc {
    Svc::named("web")
        .namespace(namespace)
        .selector("app", "web")
        .port("http", 80, "http")
}

fn cached_workloads(workloads: &[ExternalWorkload]) -> Vec<CachedWorkload> {
    workloads.iter().map(CachedWorkload::from).collect()
}

fn cached_slices(slices: &[EndpointSlice]) -> Vec<CachedSlice> {
    slices.iter().map(CachedSlice::from).collect()
}

/// `count` workloads in a scrambled order, as a cache hands them out (7919 is prime, so
/// `j * 7919 mod count` visits every index once).
fn workloads(namespace: &str, count: usize) -> Vec<ExternalWorkload> {
    (0..count)
        .map(|j| (j * 7919) % count)
        .map(|i| {
            Workload::named(&format!("vm-{i:05}"))
                .namespace(namespace)
                .label("app", "web")
                .zone("z1")
                .ip(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
                .port("http", 8080)
                .ready()
                .build()
        })
        .collect()
}

/// The slices a converged controller would have for this state.
fn converged(service: &Service, workloads: &[ExternalWorkload]) -> Vec<EndpointSlice> {
    let refs: Vec<_> = workloads.iter().collect();
    let plan = plan_slices(service, &refs, &[], &Config::default(), &time(1));
    let mut store = SliceStore::default();
    store.apply(&plan);
    store.slices().into_iter().cloned().collect()
}

fn per_service(c: &mut Criterion<ThreadCpu>) {
    let config = Config::default();
    let now = time(2);
    let mut group = c.benchmark_group("plan");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for count in [1, 100, 1_000, 10_000] {
        let full = service("default");
        let svc = CachedService::from(&full);
        let workloads = workloads("default", count);
        let cached = cached_workloads(&workloads);
        let refs: Vec<_> = cached.iter().collect();
        group.bench_with_input(BenchmarkId::new("cold", count), &count, |b, _| {
            b.iter(|| black_box(plan_cached(&svc, &refs, &[], &config, &now)))
        });
        let slices = cached_slices(&converged(&full, &workloads));
        let existing: Vec<_> = slices.iter().collect();
        group.bench_with_input(BenchmarkId::new("noop", count), &count, |b, _| {
            b.iter(|| {
                let plan = plan_cached(&svc, &refs, &existing, &config, &now);
                debug_assert!(plan.is_empty());
                black_box(plan)
            })
        });
    }

    // trafficDistribution set: every endpoint carries a zone hint to build and compare.
    let full = web("default")
        .traffic_distribution("PreferSameZone")
        .build();
    let svc = CachedService::from(&full);
    let zoned = workloads("default", 1_000);
    let cached = cached_workloads(&zoned);
    let refs: Vec<_> = cached.iter().collect();
    group.bench_function("cold_zone_hints_1000", |b| {
        b.iter(|| black_box(plan_cached(&svc, &refs, &[], &config, &now)))
    });
    let slices = cached_slices(&converged(&full, &zoned));
    let existing: Vec<_> = slices.iter().collect();
    group.bench_function("noop_zone_hints_1000", |b| {
        b.iter(|| {
            let plan = plan_cached(&svc, &refs, &existing, &config, &now);
            debug_assert!(plan.is_empty());
            black_box(plan)
        })
    });

    let full = service("default");
    let svc = CachedService::from(&full);
    let mut workloads = workloads("default", 1_000);
    let slices = cached_slices(&converged(&full, &workloads));
    let changed = workloads
        .iter()
        .position(|w| w.metadata.name.as_deref() == Some("vm-00500"))
        .unwrap_or_default();
    workloads[changed] = Workload::named("vm-00500")
        .label("app", "web")
        .ip("10.0.1.244")
        .port("http", 8080)
        .not_ready()
        .build();
    let cached = cached_workloads(&workloads);
    let refs: Vec<_> = cached.iter().collect();
    let existing: Vec<_> = slices.iter().collect();
    group.bench_function("one_changed_of_1000", |b| {
        b.iter(|| black_box(plan_cached(&svc, &refs, &existing, &config, &now)))
    });
    group.finish();
}

fn full_resync(c: &mut Criterion<ThreadCpu>) {
    let config = Config::default();
    let now = time(2);
    let states: Vec<(CachedService, Vec<CachedWorkload>, Vec<CachedSlice>)> = (0..10_000)
        .map(|i| {
            let namespace = format!("ns-{i:05}");
            let svc = service(&namespace);
            let workloads = workloads(&namespace, 10);
            let slices = converged(&svc, &workloads);
            (
                CachedService::from(&svc),
                cached_workloads(&workloads),
                cached_slices(&slices),
            )
        })
        .collect();
    let mut group = c.benchmark_group("resync");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    group.bench_function("10k_services_x10_workloads_noop", |b| {
        b.iter(|| {
            let mut writes = 0;
            for (svc, workloads, slices) in &states {
                let refs: Vec<_> = workloads.iter().collect();
                let existing: Vec<_> = slices.iter().collect();
                writes += plan_cached(svc, &refs, &existing, &config, &now).write_count();
            }
            assert_eq!(writes, 0);
        })
    });
    group.finish();
}

/// CPU time of the current thread.
struct ThreadCpu;

/// Formats nanoseconds of CPU time.
struct CpuFormatter;

impl Measurement for ThreadCpu {
    type Intermediate = ThreadTime;
    type Value = Duration;

    fn start(&self) -> ThreadTime {
        ThreadTime::now()
    }

    fn end(&self, started: ThreadTime) -> Duration {
        started.elapsed()
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if typical < 1e3 {
            (1.0, "ns cpu")
        } else if typical < 1e6 {
            (1e-3, "µs cpu")
        } else if typical < 1e9 {
            (1e-6, "ms cpu")
        } else {
            (1e-9, "s cpu")
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        // Only element counts are used here; any throughput reads as a count per second.
        let per = match throughput {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => *n,
            _ => 1,
        } as f64;
        values.iter_mut().for_each(|v| *v = per * 1e9 / *v);
        "elem/s cpu"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = per_service, full_resync
}
criterion_main!(benches);
