//! The Lease record's own judgements, as tables: how long a record we observed stays valid.

use super::*;
use crate::elector::record::Observed;

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
