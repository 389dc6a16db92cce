//! Check (f), ready means caught up: a replica's `/ready` does not answer 200 while one of its
//! watch streams has been silenced past the stall bound.

use std::time::Duration;

use tokio::time::Instant;

use super::{Check, Checks};

// === impl Checks ===

impl Checks {
    /// Check (f): replica `replica`'s `/ready` answered `ready`; it may not be ready while a
    /// stream of its has been silenced for longer than the stall bound plus `notice`.
    pub fn check_ready(&self, replica: usize, ready: bool, notice: Duration) {
        let mut state = self.state.lock();
        let Some(since) = state.replicas[replica].cache_stalled else {
            return;
        };
        let silent = Instant::now() - since;
        if ready && silent > self.judge.stall_bound + notice {
            let detail = format!(
                "{} ready with a watch silenced {:.1}s ago (stall bound {}s)",
                state.replicas[replica].identity,
                silent.as_secs_f64(),
                self.judge.stall_bound.as_secs()
            );
            self.violate(&mut state, Check::ReadyWhileStalled, detail);
        }
    }
}
