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

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits of `count` writes asked for one after the other.
    async fn waits(rate: &WriteRate, count: usize) -> Vec<Duration> {
        let mut waits = Vec::new();
        for _ in 0..count {
            waits.push(rate.acquire().await);
        }
        waits
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_one_seconds_writes_then_one_write_every_one_over_qps() {
        let rate = WriteRate::new(4);
        let started = Instant::now();
        let quarter = Duration::from_millis(250);
        assert_eq!(
            waits(&rate, 8).await,
            [Duration::ZERO; 4]
                .into_iter()
                .chain([quarter; 4])
                .collect::<Vec<_>>(),
            "four at once (the bucket holds a second of writes), then one every 250 ms"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_up_to_one_seconds_writes_and_no_more() {
        let rate = WriteRate::new(2);
        waits(&rate, 2).await;
        // Half a second of rest earns one write.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            waits(&rate, 2).await,
            [Duration::ZERO, Duration::from_millis(500)]
        );
        // Ten seconds of rest earn a second's worth (two), not twenty.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            waits(&rate, 3).await,
            [Duration::ZERO, Duration::ZERO, Duration::from_millis(500)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn writers_in_debt_wait_in_turn() {
        let rate = WriteRate::new(2);
        waits(&rate, 2).await;
        // Three writers at once, the bucket empty: each waits behind the one before.
        let (a, b, c) = tokio::join!(rate.acquire(), rate.acquire(), rate.acquire());
        let mut waited = [a, b, c];
        waited.sort();
        assert_eq!(
            waited,
            [500, 1000, 1500].map(Duration::from_millis),
            "a steady two a second"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_is_no_limit() {
        let rate = WriteRate::unlimited();
        assert_eq!(waits(&rate, 1000).await, vec![Duration::ZERO; 1000]);
    }
}
