//! What the controller caches of each kind: the fields the planner, the event mapping and the
//! writer read, and nothing else (docs/benchmarks.md, scale and memory).
//!
//! Each is made once per watch event from the API object ([`CachedWorkload::new`] and so on,
//! with an [`Intern`] so that names and labels repeated across objects share one allocation).
//! Addresses are parsed once, readiness and conditions are flags, label maps are sorted arrays.

mod service;
mod slice;
mod workload;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub(crate) use self::slice::zone_hints;
pub use self::{
    service::{
        CachedService, CachedServicePort, DEPRECATED_TOPOLOGY_HINTS_ANNOTATION, Families,
        TOPOLOGY_MODE_ANNOTATION, TargetPort, TrafficDistribution,
    },
    slice::{
        CachedEndpoint, CachedOwner, CachedSlice, CachedSlicePort, CachedTarget, Conditions,
        SliceAddress,
    },
    workload::{CachedWorkload, CachedWorkloadPort, WorkloadAddress},
};
use crate::text::{Intern, Text, Token};

pub(super) fn text(value: Option<&String>, intern: &impl Intern) -> Option<Text> {
    value.map(|v| intern.intern(v))
}

pub(super) fn token(value: Option<&String>) -> Option<Token> {
    value.map(|v| Token::parse(v))
}

/// Name and namespace of an object (empty when missing).
pub(super) fn identity(meta: &ObjectMeta, intern: &impl Intern) -> (Text, Text) {
    (
        intern.intern(meta.name.as_deref().unwrap_or_default()),
        intern.intern(meta.namespace.as_deref().unwrap_or_default()),
    )
}
