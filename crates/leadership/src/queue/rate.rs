//! Retry pacing: per-key exponential backoff and a global token bucket.

use std::time::Duration;

use tokio::time::Instant;

/// Per-key exponential backoff: `base × 2^(failures − 1)`, capped at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

/// A token bucket shared by all retries (like client-go's `BucketRateLimiter`): `qps` tokens per
/// second, at most `burst` saved. Reservations may go into debt; the debt is the delay.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    updated_at: Instant,
}

// === impl Backoff ===

impl Backoff {
    /// The delay after the `failures`-th consecutive failure (1-based), and whether it is capped.
    pub(crate) fn delay(&self, failures: u32) -> (Duration, bool) {
        let exponent = failures.saturating_sub(1).min(63);
        let factor = 1u64 << exponent;
        let nanos = self.base.as_nanos().saturating_mul(u128::from(factor));
        if nanos >= self.max.as_nanos() {
            (self.max, true)
        } else {
            // Below `max`, which is a Duration, so it fits.
            (
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)),
                false,
            )
        }
    }
}

// === impl TokenBucket ===

impl TokenBucket {
    pub(crate) fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: if qps > 0.0 { qps } else { f64::INFINITY },
            burst,
            tokens: burst,
            updated_at: now,
        }
    }

    /// Takes one token; returns how long to wait until it is really available.
    pub(crate) fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.updated_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.updated_at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let backoff = Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        };
        assert_eq!(backoff.delay(1), (Duration::from_millis(5), false));
        assert_eq!(backoff.delay(2), (Duration::from_millis(10), false));
        assert_eq!(backoff.delay(10), (Duration::from_millis(2560), false));
        assert_eq!(
            backoff.delay(19),
            (Duration::from_millis(1_310_720).min(backoff.max), true)
        );
        assert_eq!(backoff.delay(u32::MAX), (Duration::from_secs(1000), true));
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_paces() {
        let mut bucket = TokenBucket::new(10.0, 3, Instant::now());
        for _ in 0..3 {
            assert_eq!(bucket.reserve(Instant::now()), Duration::ZERO);
        }
        assert_eq!(bucket.reserve(Instant::now()), Duration::from_millis(100));
        assert_eq!(bucket.reserve(Instant::now()), Duration::from_millis(200));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(bucket.reserve(Instant::now()), Duration::ZERO);
    }
}
