//! The Lease deleted from outside, scripted: its last holder may not know yet, so a follower
//! that sees it gone waits out that holder's claim before it creates a Lease of its own.

use leadership::LeaseTimings;
use sim::Safeguard;
use tokio::time::Instant;

use crate::driver::{Scripted, run, wait_until};

/// The competing holder renews the Lease, then someone deletes it. The holder may have renewed
/// up to the deletion and acts until RenewDeadline after its last renewal, unaware (its watch
/// lagging, its next renewal not due). The replica, following, sees the Lease gone and leads
/// only once RenewDeadline has passed since it saw the deletion.
#[test]
fn a_follower_waits_out_a_deleted_leases_last_holder() {
    deleted_under_its_holder(None);
}

/// Without the wait, the replica creates the Lease at its next attempt and leads while the last
/// holder may still act: two leaders. The seeded sweep does not show this reliably, as check
/// (b) excuses writes in RenewDeadline after an outside change of the Lease (`ForcedLeaseChange`),
/// a deletion included.
#[test]
#[should_panic(expected = "led beside the deleted Lease's last holder")]
fn without_the_wait_a_follower_leads_beside_a_deleted_leases_last_holder() {
    deleted_under_its_holder(Some(Safeguard::DeletedLeaseWait));
}

fn deleted_under_its_holder(off: Option<Safeguard>) {
    run(|| async {
        let scripted = Scripted::start(off).await;
        // The holder renews; the deletion comes right after.
        scripted.follow().await;
        scripted.delete_lease().await;
        let deleted = Instant::now();
        wait_until("the replica leads", || scripted.term().is_some()).await;
        let waited = deleted.elapsed();
        let renew_deadline = LeaseTimings::default().renew_deadline();
        assert!(
            waited >= renew_deadline,
            "led beside the deleted Lease's last holder: {waited:?} after the deletion, \
             within its RenewDeadline ({renew_deadline:?})"
        );
        scripted.stop().await;
    });
}
