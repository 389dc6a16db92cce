//! Elector configuration, validated once when it is built.
//!
//! Both types can only be built through their checking constructors, so everything downstream
//! (the elector loop, the Lease record) takes them as valid and has no fallbacks.

use std::time::Duration;

use crate::Safeguards;

/// LeaseDuration, RenewDeadline and RetryPeriod, checked to satisfy
/// LeaseDuration > RenewDeadline > 1.2 × RetryPeriod > 0.
///
/// The default is client-go's: LeaseDuration 15 s, RenewDeadline 10 s, RetryPeriod 2 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    /// LeaseDuration in the Lease's whole seconds, rounded up (it fits, by construction).
    lease_duration_seconds: i32,
}

/// Which lease to compete for, under which identity, with which timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    name: String,
    namespace: String,
    identity: String,
    timings: LeaseTimings,
    /// Only the deleted-Lease wait is read here; always on outside tests.
    safeguards: Safeguards,
}

/// Why a [`LeaseTimings`] or [`LeaseConfig`] cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LeaseConfigError {
    /// The identity is empty. Not retryable: fix the configuration.
    #[error("lease identity must not be empty")]
    EmptyIdentity,
    /// The lease name or namespace is empty. Not retryable: fix the configuration.
    #[error("lease name and namespace must not be empty")]
    EmptyName,
    /// LeaseDuration ≤ RenewDeadline: a leader could still act after followers may take over.
    /// Not retryable: fix the configuration.
    #[error(
        "renew deadline ({renew_deadline:?}) must be shorter than lease duration ({lease_duration:?})"
    )]
    LeaseDurationTooShort {
        /// The configured LeaseDuration.
        lease_duration: Duration,
        /// The configured RenewDeadline.
        renew_deadline: Duration,
    },
    /// RenewDeadline ≤ 1.2 × RetryPeriod: a single slow renewal would already cost leadership.
    /// Not retryable: fix the configuration.
    #[error(
        "renew deadline ({renew_deadline:?}) must be longer than 1.2 × retry period ({retry_period:?})"
    )]
    RenewDeadlineTooShort {
        /// The configured RenewDeadline.
        renew_deadline: Duration,
        /// The configured RetryPeriod.
        retry_period: Duration,
    },
    /// RetryPeriod is zero. Not retryable: fix the configuration.
    #[error("retry period must be greater than zero")]
    ZeroRetryPeriod,
    /// LeaseDuration does not fit the Lease's whole-seconds field.
    /// Not retryable: fix the configuration.
    #[error("lease duration ({0:?}) must fit the lease's i32 seconds")]
    LeaseDurationOutOfRange(Duration),
}

// === impl LeaseTimings ===

impl LeaseTimings {
    /// Checks LeaseDuration > RenewDeadline > 1.2 × RetryPeriod > 0, and that LeaseDuration fits
    /// the Lease's `leaseDurationSeconds`.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, LeaseConfigError> {
        if retry_period.is_zero() {
            return Err(LeaseConfigError::ZeroRetryPeriod);
        }
        if lease_duration <= renew_deadline {
            return Err(LeaseConfigError::LeaseDurationTooShort {
                lease_duration,
                renew_deadline,
            });
        }
        if renew_deadline <= retry_period.mul_f64(1.2) {
            return Err(LeaseConfigError::RenewDeadlineTooShort {
                renew_deadline,
                retry_period,
            });
        }
        let lease_duration_seconds = i32::try_from(lease_duration.as_millis().div_ceil(1000))
            .map_err(|_| LeaseConfigError::LeaseDurationOutOfRange(lease_duration))?;
        Ok(Self {
            lease_duration,
            renew_deadline,
            retry_period,
            lease_duration_seconds,
        })
    }

    /// How long followers wait, from the last change they observed, before taking over.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// How long a leader keeps leading without a successful renewal.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// How often the leader renews and followers poll (followers also watch).
    pub fn retry_period(&self) -> Duration {
        self.retry_period
    }

    /// How long the lease watch may deliver nothing before it is restarted: twice LeaseDuration.
    ///
    /// A healthy watch is never silent that long. While anyone holds the lease it is renewed
    /// every RetryPeriod; a free lease is taken by a polling candidate within RetryPeriod; an
    /// abandoned one is taken over once LeaseDuration has passed. Restarting a watch that was
    /// merely idle costs one request; a watch frozen without an error (a proxy or NAT that lost
    /// the connection) would otherwise hide a release or a deletion of the lease until the API
    /// server's own watch timeout, or for ever.
    pub(crate) fn watch_stall_bound(&self) -> Duration {
        self.lease_duration * 2
    }

    /// LeaseDuration as written into the Lease (whole seconds, rounded up).
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        self.lease_duration_seconds
    }
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            lease_duration_seconds: 15,
        }
    }
}

// === impl LeaseConfig ===

impl LeaseConfig {
    /// The Lease `namespace/name`, competed for as `identity` with `timings`; the three names
    /// must not be empty.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
        timings: LeaseTimings,
    ) -> Result<Self, LeaseConfigError> {
        let (name, namespace, identity) = (name.into(), namespace.into(), identity.into());
        if identity.is_empty() {
            return Err(LeaseConfigError::EmptyIdentity);
        }
        if name.is_empty() || namespace.is_empty() {
            return Err(LeaseConfigError::EmptyName);
        }
        Ok(Self {
            name,
            namespace,
            identity,
            timings,
            safeguards: Safeguards::default(),
        })
    }

    /// Switches the deleted-Lease wait off, for tests that show what notices its absence.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    #[must_use]
    pub fn with_safeguards(mut self, safeguards: Safeguards) -> Self {
        self.safeguards = safeguards;
        self
    }

    /// Whether a deleted Lease's last holder keeps its claim until its RenewDeadline.
    pub(crate) fn waits_after_a_deleted_lease(&self) -> bool {
        self.safeguards.deleted_lease_wait
    }

    /// Name of the Lease object.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Namespace of the Lease object.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// This candidate's identity (the pod name); must be unique among candidates.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The lease timings.
    pub(crate) fn timings(&self) -> LeaseTimings {
        self.timings
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn default_timings_are_client_gos_and_valid() {
        let default = LeaseTimings::default();
        assert_eq!(LeaseTimings::new(secs(15), secs(10), secs(2)), Ok(default));
        assert_eq!(default.lease_duration_seconds(), 15);
    }

    #[test]
    fn lease_duration_seconds_round_up() {
        let timings = LeaseTimings::new(Duration::from_millis(3500), secs(3), secs(1)).unwrap();
        assert_eq!(timings.lease_duration_seconds(), 4);
    }

    #[test]
    fn rejects_bad_orderings() {
        let cases = [
            (
                (secs(10), secs(10), secs(2)),
                "lease duration = renew deadline",
            ),
            (
                (secs(15), Duration::from_millis(2400), secs(2)),
                "renew deadline = 1.2 × retry",
            ),
            ((secs(15), secs(10), Duration::ZERO), "zero retry period"),
            (
                (secs(1 << 40), secs(10), secs(2)),
                "lease duration out of range",
            ),
        ];
        for ((lease, renew, retry), what) in cases {
            assert!(LeaseTimings::new(lease, renew, retry).is_err(), "{what}");
        }
        assert!(LeaseTimings::new(secs(15), Duration::from_millis(2401), secs(2)).is_ok());
    }

    #[test]
    fn rejects_empty_names() {
        let timings = LeaseTimings::default();
        assert_eq!(
            LeaseConfig::new("lease", "ns", "", timings),
            Err(LeaseConfigError::EmptyIdentity)
        );
        assert_eq!(
            LeaseConfig::new("", "ns", "me", timings),
            Err(LeaseConfigError::EmptyName)
        );
        assert_eq!(
            LeaseConfig::new("lease", "", "me", timings),
            Err(LeaseConfigError::EmptyName)
        );
        assert!(LeaseConfig::new("lease", "ns", "me", timings).is_ok());
    }
}
