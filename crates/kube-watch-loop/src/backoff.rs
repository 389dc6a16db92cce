//! Exponential backoff between failed attempts.

use std::time::Duration;

/// A delay that doubles after each failure up to a cap, and starts over after a success. The
/// watch loop uses one (200 ms doubling to 30 s); an app may use its own for other retries.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

// === impl Backoff ===

impl Backoff {
    /// Starts at `first`, doubling to `cap`.
    pub fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap,
            next: first,
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.cap);
        delay
    }

    /// After a success: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_its_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        assert_eq!(backoff.next_delay(), Duration::from_millis(200));
        assert_eq!(backoff.next_delay(), Duration::from_millis(400));
        for _ in 0..20 {
            backoff.next_delay();
        }
        assert_eq!(backoff.next_delay(), Duration::from_secs(30));
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(200));
    }
}
