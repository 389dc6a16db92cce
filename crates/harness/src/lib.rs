//! The process harness of the controller's tests and benches: real `external-endpoints`
//! processes against the testbed's real kube-apiserver, the API helpers to change objects and
//! wait for slices to converge, proxies to strike faults on one replica's traffic (an
//! HTTP-aware one that stalls watches and holds requests, a TCP one), the chaos world and its
//! faults, and the benches' fixtures and tables.
//!
//! ```text
//!  test or bench ──► Replica (the binary it was built with: Binary(env!(...)))
//!       │               └─ admin server: /ready, /metrics (metrics::Metrics)
//!       ├──► Cluster (one namespace: create, apply, wait_converged)
//!       └──► chaos::World (Cluster + Churn + Members, some behind a proxy::HttpProxy)
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`poll`](mod@poll) | [`eventually`] / [`poll()`]: wait for a condition, never a sleep |
//! | [`replica`] | [`Replica`]: one controller process; [`ReplicaSpec`] for the benches; [`closed_port_kubeconfig`], [`exit_within`], [`wait_for_stderr_line`] |
//! | [`metrics`] | [`Metrics`], [`sum_metric`]: Prometheus text |
//! | [`http`] | [`http_get`]: a plain HTTP/1.1 GET |
//! | [`cluster`] | [`Cluster`]: the objects of one test namespace |
//! | [`proxy`] | [`proxy::HttpProxy`] (sees each request: watches stalled, requests held) and [`proxy::Proxy`] (TCP) in front of the API server |
//! | [`chaos`] | the chaos tests' and the soak's world, faults and audits |
//! | [`fencing`] | the API server's fencing policy of `deploy/fencing.yaml`, bound to a test's users and Lease |
//! | [`fixtures`] | bulk Services and workloads of the benches |
//! | [`report`] | `bench_main`, knobs from the environment, progress lines, result tables |
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the failure report

pub mod chaos;
pub mod cluster;
pub mod fencing;
pub mod fixtures;
pub mod http;
pub mod metrics;
pub mod poll;
pub mod proxy;
pub mod replica;
pub mod report;

pub use cluster::Cluster;
pub use http::http_get;
pub use metrics::{Metrics, sum_metric};
pub use poll::{CONVERGE, eventually, poll};
pub use replica::{
    Binary, LEASE, LEASE_ARGS, Replica, ReplicaSpec, closed_port_kubeconfig, exit_within,
    wait_for_stderr_line,
};
