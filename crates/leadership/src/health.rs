//! A healthz-style check of the leader's renewals, for a liveness probe.

use std::time::Duration;

use tokio::time::Instant;

use crate::term::Leadership;

/// A liveness check of leadership, like client-go's `HealthzAdaptor`: healthy while following,
/// and while leading as long as the last successful renewal plus RenewDeadline plus `tolerance`
/// is in the future. The elector steps down once renewals have failed for RenewDeadline, so a
/// failing check means the election itself is stuck (a hung task, a starved runtime): restart
/// the process. Cheap to clone; answers without I/O.
#[derive(Clone, Debug)]
pub struct LeaderHealth {
    leadership: Leadership,
    tolerance: Duration,
}

/// Why [`LeaderHealth::check`] failed: this process still leads a term whose Lease has not been
/// renewed for longer than RenewDeadline plus the tolerance. Not retryable in place.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("leading term {term}, but its lease was last renewed {since_renewal:?} ago")]
pub struct LeaderUnhealthy {
    /// The term still published as current.
    term: u64,
    /// How long ago its last successful renewal was sent.
    since_renewal: Duration,
}

// === impl LeaderHealth ===

impl LeaderHealth {
    /// Checks `leadership`, allowing renewals to be `tolerance` late past RenewDeadline
    /// (client-go's adaptor is usually given 20 s).
    pub fn new(leadership: Leadership, tolerance: Duration) -> Self {
        Self {
            leadership,
            tolerance,
        }
    }

    /// `Ok` while following or while the leader's renewals are on time.
    pub fn check(&self) -> Result<(), LeaderUnhealthy> {
        let Some(term) = self.leadership.borrow().clone() else {
            return Ok(());
        };
        let now = Instant::now();
        match term.safely_held_until(Duration::ZERO) {
            Some(until) if until + self.tolerance < now => Err(LeaderUnhealthy {
                term: term.id(),
                since_renewal: now.saturating_duration_since(term.last_renewed_at()),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::term::Term;
    use tokio::{sync::watch, time::advance};

    const RENEW_DEADLINE: Duration = Duration::from_secs(10);
    const TOLERANCE: Duration = Duration::from_secs(20);

    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewals_stopped_past_the_deadline_and_tolerance_is_unhealthy() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (tx, rx) = watch::channel(Some(term.clone()));
        let health = LeaderHealth::new(rx, TOLERANCE);
        assert_eq!(health.check(), Ok(()));

        advance(RENEW_DEADLINE + TOLERANCE).await;
        assert_eq!(
            health.check(),
            Ok(()),
            "exactly at the bound: still healthy"
        );
        advance(Duration::from_millis(1)).await;
        assert_eq!(
            health.check(),
            Err(LeaderUnhealthy {
                term: term.id(),
                since_renewal: RENEW_DEADLINE + TOLERANCE + Duration::from_millis(1)
            })
        );

        // A renewal makes it healthy again; following is always healthy.
        term.record_renewal(Instant::now());
        assert_eq!(health.check(), Ok(()));
        tx.send_replace(None);
        advance(Duration::from_secs(3600)).await;
        assert_eq!(health.check(), Ok(()));
    }
}
