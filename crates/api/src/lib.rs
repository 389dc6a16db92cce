//! ExternalWorkload types (`workload.linkerd.io`) and their CustomResourceDefinition.
//!
//! Schema-compatible with Linkerd's CRD: `v1beta1` is served and stored (spec field `meshTLS`),
//! `v1alpha1` is served only (spec field `meshTls`, one IP at most).
//!
//! Guarantee: decoding an object never fails because of a bad value. The controller watches every
//! workload of the cluster, and one object a looser CRD let in must not stop that watch; so IPs
//! stay text, ports are wide integers, and a field of the wrong shape decodes to its default.
//! Validation lives in the generated schema (ranges, enums, `isIP()` CEL rules) and, for objects
//! that got past an older schema, in the planner, which skips and reports what it cannot use.
//!
//! ```text
//! types (v1alpha1, v1beta1) ──► crd() ──► deploy/crds/externalworkloads.yaml (gen-crd)
//! ```
#![deny(missing_docs)]

mod lenient;
mod schema;
mod types;

pub mod crd;
pub mod v1alpha1;
pub mod v1beta1;

pub use crd::{CrdError, crd, crd_yaml};
pub use types::{READY_CONDITION, ZONE_LABEL};
pub use v1beta1::ExternalWorkload;
