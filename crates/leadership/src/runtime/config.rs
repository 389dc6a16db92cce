//! The runtime's settings: what an app may tune (workers, drain, fence margin, resync, retry
//! pacing, prepare timeout), the builder that validates them, and why a setting is refused.

use std::{num::NonZeroUsize, time::Duration};

#[cfg(doc)]
use crate::{ElectorHandle, Fence, Reconciler};
use crate::{queue::QueueConfig, safeguards::Safeguards};

/// Runtime settings, validated when built ([`RuntimeConfig::builder`]); the default is 4
/// workers, a 10 s drain, a 1 s fence margin, a 10 min resync and client-go's retry pacing.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeConfig {
    /// Concurrent reconciles (distinct keys).
    pub(crate) workers: NonZeroUsize,
    /// How long shutdown waits for queued and in-flight work before releasing the lease anyway.
    pub(crate) drain_timeout: Duration,
    /// Safety margin of the fence: writes stop this long before RenewDeadline would end the term.
    pub(crate) fence_margin: Duration,
    /// Full replay of the caches while leading, as a safety net; `None` disables it.
    pub(crate) resync_period: Option<Duration>,
    /// Queue pacing.
    pub(crate) queue: QueueConfig,
    /// The fence, the drain and fresh state per term: always on outside tests.
    pub(crate) safeguards: Safeguards,
    /// How long a term may wait for [`Reconciler::prepare_term`] before it is given up.
    pub(crate) prepare_timeout: Duration,
}

/// Builds a [`RuntimeConfig`]; every setting starts at its default.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RuntimeConfigBuilder {
    config: RuntimeConfig,
    workers: usize,
}

/// Why a [`RuntimeConfig`] cannot be built. None is retryable: fix the configuration.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum RuntimeConfigError {
    /// Zero workers would never reconcile anything.
    #[error("workers must be at least 1")]
    ZeroWorkers,
    /// A resync period of zero would replay the caches in a loop.
    #[error("resync period must be greater than zero (or disabled)")]
    ZeroResyncPeriod,
    /// The first retry delay is zero or longer than the longest one.
    #[error("retry backoff must satisfy 0 < base ({base:?}) ≤ max ({max:?})")]
    RetryBackoff {
        /// The first retry delay.
        base: Duration,
        /// The longest retry delay.
        max: Duration,
    },
    /// The global retry rate is not a positive number, or the burst is zero.
    #[error(
        "retry rate must be positive and finite and the burst at least 1 (got {per_second}/s, burst {burst})"
    )]
    RetryRate {
        /// Retries per second.
        per_second: f64,
        /// Retries in a burst.
        burst: u32,
    },
}

// === impl RuntimeConfig ===

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            workers: NonZeroUsize::MIN.saturating_add(3), // 4
            drain_timeout: Duration::from_secs(10),
            fence_margin: Duration::from_secs(1),
            prepare_timeout: Duration::from_secs(30),
            resync_period: Some(Duration::from_secs(600)),
            queue: QueueConfig::default(),
            safeguards: Safeguards::default(),
        }
    }
}

impl RuntimeConfig {
    /// This configuration with some protections switched off, for tests that show what
    /// notices their absence (e.g. `Safeguards::default().without_fence()`: a replica that
    /// writes past its term, as one paused past its lease would without the fence).
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    #[must_use]
    pub fn with_safeguards(mut self, safeguards: Safeguards) -> Self {
        self.safeguards = safeguards;
        self
    }

    /// A builder starting from the defaults.
    pub fn builder() -> RuntimeConfigBuilder {
        let config = Self::default();
        RuntimeConfigBuilder {
            workers: config.workers.get(),
            config,
        }
    }

    /// Concurrent reconciles (of distinct keys): also the cap an app gives its own limits of
    /// work in flight (the controller's writes in flight).
    pub fn workers(&self) -> NonZeroUsize {
        self.workers
    }

    /// How long before RenewDeadline would end a term its fence stops writes: the margin to
    /// give [`Fence::current`] for a fence of the app's own that agrees with the runtime's.
    pub fn fence_margin(&self) -> Duration {
        self.fence_margin
    }
}

// === impl RuntimeConfigBuilder ===

impl RuntimeConfigBuilder {
    /// Concurrent reconciles (distinct keys; one key is never reconciled twice at once).
    /// Default 4.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// How long shutdown waits for queued and in-flight work (still fenced) before releasing
    /// the lease anyway. Default 10 s; keep it below the pod's termination grace period.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config.drain_timeout = timeout;
        self
    }

    /// Writes stop this long before RenewDeadline would end the term (clock drift, request
    /// latency). Default 1 s; keep it well below the lease's RenewDeadline.
    pub fn fence_margin(mut self, margin: Duration) -> Self {
        self.config.fence_margin = margin;
        self
    }

    /// Full replay of the caches every `period` while leading, as a safety net; `None`
    /// disables it. Default 10 min.
    pub fn resync_period(mut self, period: Option<Duration>) -> Self {
        self.config.resync_period = period;
        self
    }

    /// Retry delays after a failure: `base` doubled per consecutive failure of a key, up to
    /// `max`, where a key failing forever keeps retrying. Default 5 ms to 1000 s.
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.config.queue.base_delay = base;
        self.config.queue.max_delay = max;
        self
    }

    /// Retries allowed across all keys: `per_second` on average, `burst` at once. Default 10/s,
    /// burst 100.
    pub fn retry_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.config.queue.retry_qps = per_second;
        self.config.queue.retry_burst = burst;
        self
    }

    /// How long a newly acquired term may wait for [`Reconciler::prepare_term`] (e.g. caches
    /// catching up with the API server) before the runtime gives the term up
    /// ([`ElectorHandle::give_up`]): the Lease is released so another replica can lead, the
    /// give-up is logged and counted ([`ElectorMetrics::terms_given_up`](crate::ElectorMetrics::terms_given_up)),
    /// and this replica keeps running as a follower and competes again after LeaseDuration.
    /// Default 30 s.
    pub fn prepare_timeout(mut self, timeout: Duration) -> Self {
        self.config.prepare_timeout = timeout;
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<RuntimeConfig, RuntimeConfigError> {
        let Self {
            mut config,
            workers,
        } = self;
        config.workers = NonZeroUsize::new(workers).ok_or(RuntimeConfigError::ZeroWorkers)?;
        if config.resync_period.is_some_and(|period| period.is_zero()) {
            return Err(RuntimeConfigError::ZeroResyncPeriod);
        }
        let QueueConfig {
            base_delay,
            max_delay,
            retry_qps,
            retry_burst,
        } = config.queue;
        if base_delay.is_zero() || base_delay > max_delay {
            return Err(RuntimeConfigError::RetryBackoff {
                base: base_delay,
                max: max_delay,
            });
        }
        if !(retry_qps.is_finite() && retry_qps > 0.0) || retry_burst == 0 {
            return Err(RuntimeConfigError::RetryRate {
                per_second: retry_qps,
                burst: retry_burst,
            });
        }
        Ok(config)
    }
}
