//! Exponential backoff between failed attempts, shared by the watches and the acquisition
//! barrier (each with its own first delay and cap).

use std::time::Duration;

/// A delay that doubles after each failure up to a cap, and starts over after a success.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

// === impl Backoff ===

impl Backoff {
    /// Starts at `first`, doubling to `cap`.
    pub(crate) fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap,
            next: first,
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.cap);
        delay
    }

    /// After a success: the next failure waits the first delay again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_its_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        assert_eq!(backoff.next(), Duration::from_millis(200));
        assert_eq!(backoff.next(), Duration::from_millis(400));
        for _ in 0..20 {
            backoff.next();
        }
        assert_eq!(backoff.next(), Duration::from_secs(30));
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(200));
    }
}
