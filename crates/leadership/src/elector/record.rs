//! What the elector knows about the Lease record, and the edits it makes to it.
//!
//! Expiry is judged by the LOCAL time at which this process observed the record change, never by
//! comparing the remote `renewTime` with the local clock (clocks of replicas and the API server
//! may disagree; durations measured locally do not depend on that).

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use tokio::time::Instant;

use super::config::LeaseConfig;

/// The last lease record observed, and when it was first seen in this form.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) lease: Lease,
    /// Local time at which holder, renewTime or resourceVersion last changed.
    pub(crate) changed_at: Instant,
}

// === impl Observed ===

impl Observed {
    /// Folds a freshly read record into what was observed before: the observation time moves only
    /// when the record changed.
    pub(crate) fn update(previous: Option<Observed>, lease: Lease, now: Instant) -> Observed {
        let changed_at = match previous {
            Some(previous) if same_record(&previous.lease, &lease) => previous.changed_at,
            _ => now,
        };
        Observed { lease, changed_at }
    }

    /// The holder, with an empty string meaning none (a released lease).
    pub(crate) fn holder(&self) -> Option<&str> {
        holder(&self.lease)
    }

    /// When the record expires for us: observation time + the record's own leaseDurationSeconds
    /// (ours when the record has none).
    pub(crate) fn expires_at(&self, config: &LeaseConfig) -> Instant {
        let seconds = self
            .lease
            .spec
            .as_ref()
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|seconds| *seconds > 0);
        let duration = seconds.map_or(config.timings().lease_duration(), Duration::from_secs);
        self.changed_at + duration
    }

    /// Whether someone other than `identity` holds an unexpired lease.
    pub(crate) fn held_by_other(&self, config: &LeaseConfig, now: Instant) -> bool {
        match self.holder() {
            Some(holder) => holder != config.identity() && now < self.expires_at(config),
            None => false,
        }
    }

    /// Whether the record names `identity` as holder.
    pub(crate) fn held_by(&self, identity: &str) -> bool {
        self.holder() == Some(identity)
    }
}

/// The holder of a lease; an empty string means none.
pub(crate) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .filter(|holder| !holder.is_empty())
}

fn same_record(a: &Lease, b: &Lease) -> bool {
    let renew_time = |lease: &Lease| lease.spec.as_ref().and_then(|spec| spec.renew_time.clone());
    holder(a) == holder(b)
        && renew_time(a) == renew_time(b)
        && a.metadata.resource_version == b.metadata.resource_version
}

/// A new lease held by us.
pub(crate) fn new_lease(config: &LeaseConfig) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(config.name().to_owned()),
            namespace: Some(config.namespace().to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity().to_owned()),
            lease_duration_seconds: Some(config.timings().lease_duration_seconds()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// Takes or renews the lease we read, editing only the fields we own: fields we do not own
/// (`preferredHolder`, `strategy`, labels, annotations, ...) and the resourceVersion that guards
/// the write are kept as read.
pub(crate) fn claim(lease: Lease, config: &LeaseConfig) -> Lease {
    let taking_over = holder(&lease) != Some(config.identity());
    claim_with(lease, config, taking_over)
}

/// Takes a lease that names us but was last written by an earlier process of ours (one that
/// crashed and was restarted under the same identity): a new term, as a take-over, so that its
/// acquireTime and leaseTransitions (the fencing token) differ from the earlier process's.
pub(crate) fn claim_from_earlier_process(lease: Lease, config: &LeaseConfig) -> Lease {
    claim_with(lease, config, true)
}

fn claim_with(mut lease: Lease, config: &LeaseConfig, taking_over: bool) -> Lease {
    let now = MicroTime(Timestamp::now());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if taking_over {
        spec.holder_identity = Some(config.identity().to_owned());
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(config.timings().lease_duration_seconds());
    lease
}

/// Gives the lease up (like client-go's ReleaseOnCancel): no holder, one-second duration so that
/// candidates that only look at expiry take over quickly too.
pub(crate) fn release(mut lease: Lease) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    lease
}
