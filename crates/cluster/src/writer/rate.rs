//! The client-side write rate: a token bucket of slice writes per second (`--write-qps`),
//! shared by every worker and waited for before each write.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The client-side limit of slice writes per second, shared by every worker (a token bucket
/// holding one second of writes: a burst of `qps`, then `qps` per second). Unlimited when
/// built with 0.
#[derive(Debug)]
pub struct WriteRate {
    qps: f64,
    bucket: Mutex<(f64, Instant)>,
}

// === impl WriteRate ===

impl WriteRate {
    /// At most `qps` writes per second (0: no limit).
    pub fn new(qps: u32) -> Self {
        let qps = f64::from(qps);
        Self {
            qps,
            bucket: Mutex::new((qps, Instant::now())),
        }
    }

    /// No limit.
    #[cfg(test)]
    pub fn unlimited() -> Self {
        Self::new(0)
    }

    /// Waits until one more write is allowed; returns how long it waited.
    pub async fn acquire(&self) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let debt = {
            let now = Instant::now();
            let mut bucket = self.bucket.lock();
            let (tokens, updated_at) = &mut *bucket;
            let refill = now.saturating_duration_since(*updated_at).as_secs_f64() * self.qps;
            *tokens = (*tokens + refill).min(self.qps.max(1.0)) - 1.0;
            *updated_at = now;
            *tokens
        };
        if debt >= 0.0 {
            return Duration::ZERO;
        }
        let wait = Duration::from_secs_f64(-debt / self.qps);
        tokio::time::sleep(wait).await;
        wait
    }
}
