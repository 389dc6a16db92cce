//! Elector configuration and its validation.

use std::time::Duration;

/// Which lease to compete for, under which identity, with which timings.
///
/// Defaults follow client-go: LeaseDuration 15 s, RenewDeadline 10 s, RetryPeriod 2 s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Name of the Lease object.
    pub name: String,
    /// Namespace of the Lease object.
    pub namespace: String,
    /// This candidate's identity (the pod name); must be unique among candidates.
    pub identity: String,
    /// How long followers wait, from the last change they observed, before taking over.
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the leader renews and followers poll (followers also watch).
    pub retry_period: Duration,
}

/// Why a [`LeaseConfig`] is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The identity is empty. Not retryable: fix the configuration.
    #[error("lease identity must not be empty")]
    EmptyIdentity,
    /// The lease name or namespace is empty. Not retryable: fix the configuration.
    #[error("lease name and namespace must not be empty")]
    EmptyName,
    /// LeaseDuration ≤ RenewDeadline: a leader could still act after followers may take over.
    /// Not retryable: fix the configuration.
    #[error(
        "lease duration ({lease_duration:?}) must be greater than renew deadline ({renew_deadline:?})"
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
        "renew deadline ({renew_deadline:?}) must be greater than 1.2 × retry period ({retry_period:?})"
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

// === impl LeaseConfig ===

impl LeaseConfig {
    /// A configuration with client-go's default timings.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks LeaseDuration > RenewDeadline > 1.2 × RetryPeriod and a non-empty identity.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.identity.is_empty() {
            return Err(ConfigError::EmptyIdentity);
        }
        if self.name.is_empty() || self.namespace.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        if self.retry_period.is_zero() {
            return Err(ConfigError::ZeroRetryPeriod);
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseDurationTooShort {
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return Err(ConfigError::RenewDeadlineTooShort {
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            });
        }
        if self.lease_duration_seconds().is_none() {
            return Err(ConfigError::LeaseDurationOutOfRange(self.lease_duration));
        }
        Ok(())
    }

    /// LeaseDuration in the Lease's whole seconds (rounded up), if it fits.
    pub(crate) fn lease_duration_seconds(&self) -> Option<i32> {
        let millis = self.lease_duration.as_millis();
        let seconds = millis.div_ceil(1000);
        if seconds == 0 {
            return None;
        }
        i32::try_from(seconds).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaseConfig {
        LeaseConfig::new("lease", "ns", "me")
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
        assert_eq!(config().lease_duration_seconds(), Some(15));
    }

    #[test]
    fn rejects_bad_orderings_and_identity() {
        type Mutation = fn(&mut LeaseConfig);
        let cases: Vec<(Mutation, &str)> = vec![
            (|c| c.identity.clear(), "identity"),
            (|c| c.name.clear(), "name"),
            (|c| c.lease_duration = c.renew_deadline, "lease duration"),
            (
                |c| c.renew_deadline = Duration::from_millis(2400),
                "renew deadline",
            ),
            (|c| c.retry_period = Duration::ZERO, "retry period"),
            (
                |c| c.lease_duration = Duration::from_secs(1 << 40),
                "lease duration range",
            ),
        ];
        for (mutate, what) in cases {
            let mut c = config();
            mutate(&mut c);
            assert!(c.validate().is_err(), "{what} should be rejected");
        }
        let mut ok = config();
        ok.renew_deadline = Duration::from_millis(2401);
        assert_eq!(ok.validate(), Ok(()));
    }
}
