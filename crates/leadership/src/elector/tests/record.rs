//! The Lease record's own judgements, as tables: when a record we observed changed, and how long
//! it stays valid after that.

use super::*;
use crate::elector::record::{self, Observed};

fn observed_with_duration(seconds: Option<i32>, changed_at: Instant) -> Observed {
    let mut lease = holder_lease("b", Timestamp::now());
    lease.spec.as_mut().expect("spec").lease_duration_seconds = seconds;
    Observed { lease, changed_at }
}

#[test]
fn a_record_expires_after_its_own_duration_and_after_ours_when_it_states_none_that_counts() {
    let config = LeaseConfig::new("lease", "ns", "a", LeaseTimings::default()).expect("valid");
    let ours = LEASE_DURATION;
    let seen = Instant::now();
    let cases = [
        (
            Some(60),
            Duration::from_secs(60),
            "a longer duration of the holder's own",
        ),
        (
            Some(1),
            Duration::from_secs(1),
            "a released record's one second",
        ),
        (Some(15), ours, "the same as ours"),
        (Some(0), ours, "zero is no duration: ours"),
        (Some(-5), ours, "a negative duration: ours"),
        (None, ours, "none stated: ours"),
    ];
    for (seconds, valid_for, case) in cases {
        let observed = observed_with_duration(seconds, seen);
        assert_eq!(observed.expires_at(&config), seen + valid_for, "{case}");
    }
}

#[test]
fn the_observation_time_moves_only_when_holder_renew_time_or_version_changes() {
    let first_seen = Instant::now();
    let later = first_seen + RETRY;
    let renewed = Timestamp::now();
    let lease_of = |holder: &str, renew: Timestamp, version: &str| {
        let mut lease = holder_lease(holder, renew);
        lease.metadata.resource_version = Some(version.into());
        lease
    };
    let previous = lease_of("b", renewed, "7");
    let cases = [
        (
            lease_of("b", renewed, "7"),
            first_seen,
            "the same record read again",
        ),
        (lease_of("c", renewed, "7"), later, "another holder"),
        (
            lease_of("b", renewed + Duration::from_secs(2), "7"),
            later,
            "a new renewTime",
        ),
        (lease_of("b", renewed, "8"), later, "a new resourceVersion"),
    ];
    for (lease, changed_at, case) in cases {
        let before = Observed {
            lease: previous.clone(),
            changed_at: first_seen,
        };
        let observed = Observed::update(Some(before), lease, later);
        assert_eq!(observed.changed_at, changed_at, "{case}");
    }
    assert_eq!(
        Observed::update(None, previous, later).changed_at,
        later,
        "a first observation"
    );
}

#[test]
fn a_new_lease_carries_every_field_that_other_clients_read() {
    // client-go's elector and kubectl read these: the holder, its duration, when it was
    // acquired and renewed, and how often it changed hands (our fencing token).
    let config = LeaseConfig::new("lease", "ns", "a", LeaseTimings::default()).expect("valid");
    let lease = record::new_lease(&config);
    assert_eq!(lease.metadata.name.as_deref(), Some("lease"));
    assert_eq!(lease.metadata.namespace.as_deref(), Some("ns"));
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    let acquired = spec.acquire_time.expect("acquireTime");
    assert_eq!(spec.renew_time, Some(acquired), "renewed when acquired");
}
