//! The pure EndpointSlice planner for Services that select ExternalWorkloads.
//!
//! Given a Service, the workloads of its namespace, the slices we already manage for it and the
//! configuration, [`plan_cached`] returns the creates, updates and deletes that make the cluster
//! match docs/slices.md. No tokio, no kube client, no I/O: the compiler keeps decisions apart
//! from the writer, and everything here is tested with plain values.
//!
//! The planner reads the compact cached form of each kind ([`CachedService`], [`CachedWorkload`],
//! [`CachedSlice`]), which the controller's caches hold instead of API objects (docs/benchmarks.md,
//! scale and memory); [`plan_slices`] takes API objects and projects them first.
//!
//! ```text
//! Service ─┐
//! workloads ─┼─► plan_slices ──► SlicePlan { creates, updates, deletes, diagnostics }
//! existing slices ─┘
//! watch events ──► affected::{for_service, for_workload, for_slice} ──► ServiceKey
//! ```
//!
//! Guarantees:
//! - planning is deterministic (sorted output) and never mutates its inputs;
//! - planning over the result of a plan gives an empty plan (no write on a no-op resync), and the
//!   trigger time alone never causes an update;
//! - a value that cannot be sent to the API (a non-IP address, an unresolvable named port) is left
//!   out for that workload and reported as a [`Diagnostic`], never sent: one bad workload does not
//!   make the API reject a whole slice;
//! - a Service that selected workloads keeps one empty slice per address family when its last
//!   endpoint of that family leaves (a placeholder, never created from nothing), and each slice
//!   carries a digest of its endpoints' mesh identities ([`IDENTITY_DIGEST_ANNOTATION`]), so
//!   consumers that copy them at slice time see every change (issue 37);
//! - a [`Tracker`] (one per leadership term) recognises our writes when they come back through
//!   the watch, and remembers the Services whose last write had an unknown outcome.
#![deny(missing_docs)]

pub mod affected;
mod config;
mod desired;
mod diagnostic;
mod digest;
mod labels;
mod model;
mod pack;
mod plan;
mod service_key;
mod text;
mod tracker;

#[cfg(feature = "testing")]
pub mod testing;

pub use config::{
    Config, ConfigError, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, MAX_ENDPOINTS_LIMIT,
};
pub use desired::Family;
pub use diagnostic::{Diagnostic, Problem, ProblemKind};
pub use digest::IDENTITY_DIGEST_ANNOTATION;
pub use labels::{
    HEADLESS_LABEL, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, MANAGED_BY_LABEL, SERVICE_NAME_LABEL,
    selects,
};
pub use model::{
    CachedEndpoint, CachedOwner, CachedService, CachedServicePort, CachedSlice, CachedSlicePort,
    CachedTarget, CachedWorkload, CachedWorkloadPort, Conditions,
    DEPRECATED_TOPOLOGY_HINTS_ANNOTATION, Families, SliceAddress, TOPOLOGY_MODE_ANNOTATION,
    TargetPort, TrafficDistribution, WorkloadAddress,
};
pub use plan::{SlicePlan, Write, plan_cached, plan_slices};
pub use service_key::ServiceKey;
pub use text::{Intern, Labels, NoIntern, Text, Token};
pub use tracker::Tracker;
