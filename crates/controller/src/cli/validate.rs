//! Validation of the flags: the lease and planner configurations are built from them (their
//! constructors check every rule), the identity is resolved, and each error names the flags at
//! fault.

use std::time::Duration;

use leadership::{
    CandidateConfig, CandidateError, LeaseConfig, LeaseConfigError, LeaseTimings, RuntimeConfig,
};

use super::Args;

/// The longest a failing key waits before its next retry (per-key backoff doubles from 5 ms up to
/// this; docs/operations.md, "Slices stop following changes").
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Settings after validation: the flags, and the library configurations built (and so checked)
/// from them.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Parsed flags.
    pub args: Args,
    /// The Lease, its holder identity (resolved from the flag or the environment) and timings.
    pub lease: LeaseConfig,
    /// The planner's settings.
    pub slices: slices::Config,
    /// The leadership runtime's settings (workers, drain, fence margin, resync).
    pub runtime: RuntimeConfig,
    /// The versions announced in the LeaseCandidate, with `--coordinated-election`.
    pub coordinated: Option<CandidateConfig>,
}

// === impl Args ===

impl Args {
    /// Builds the lease and planner configurations, whose constructors check every rule, and
    /// resolves the identity. `hostname` is the `HOSTNAME` fallback, passed in so tests need not
    /// touch the process environment. The error names the flags at fault.
    pub fn validate(self, hostname: Option<String>) -> Result<Settings, String> {
        let non_empty = |id: String| Some(id.trim().to_string()).filter(|id| !id.is_empty());
        let identity = (self.identity.clone().and_then(non_empty))
            .or_else(|| hostname.and_then(non_empty))
            .ok_or("no identity: pass --identity or set POD_NAME or HOSTNAME")?;
        if self.resync_period.is_zero() {
            return Err("--resync-period must be greater than zero".into());
        }
        if self.watch_stall_timeout < Duration::from_secs(6) {
            // The server timeout asked of each watch is a sixth of it (at least 3 s), and its
            // bookmark comes two seconds before that timeout: below 6 s a healthy watch could
            // look stalled.
            return Err("--watch-stall-timeout must be at least 6s".into());
        }
        let timings =
            LeaseTimings::new(self.lease_duration, self.renew_deadline, self.retry_period)
                .map_err(|error| lease_flags_error(&error))?;
        let lease = LeaseConfig::new(
            self.lease_name.clone(),
            self.lease_namespace.clone(),
            identity,
            timings,
        )
        .map_err(|error| lease_flags_error(&error))?;
        let slices = slices::Config::new(
            self.max_endpoints_per_slice,
            self.managed_by.clone(),
            self.slice_prefix.clone(),
        )
        .map_err(|error| slice_flags_error(&error))?;
        let coordinated = self.candidate_config(&lease)?;
        let runtime = RuntimeConfig::builder()
            .workers(self.workers.get().into())
            .drain_timeout(self.drain_timeout)
            // Stop writing half a retry period before the renew deadline would end the term.
            .fence_margin(self.retry_period / 2)
            .resync_period(Some(self.resync_period))
            // A key whose reconciles failed while the API server was unavailable is retried
            // within this of its recovery (the global retry rate and the write limit still pace
            // a server in trouble); client-go's 1000 s would leave a Service behind for minutes.
            .retry_backoff(Duration::from_millis(5), MAX_RETRY_DELAY)
            .build()
            // Every rule is checked above (workers ≥ 1, resync > 0); this names the flags anyway.
            .map_err(|error| format!("--workers, --resync-period: {error}"))?;
        Ok(Settings {
            args: self,
            lease,
            slices,
            coordinated,
            runtime,
        })
    }

    /// The LeaseCandidate versions: the binary version is this build's, the emulation version
    /// the flag's or the same.
    fn candidate_config(&self, lease: &LeaseConfig) -> Result<Option<CandidateConfig>, String> {
        if !self.coordinated_election {
            return match self.emulation_version {
                Some(_) => Err("--emulation-version needs --coordinated-election".into()),
                None => Ok(None),
            };
        }
        let binary = env!("CARGO_PKG_VERSION");
        let emulation = self.emulation_version.as_deref().unwrap_or(binary);
        let config = CandidateConfig::new(binary, emulation).map_err(|error| match error {
            CandidateError::InvalidVersion { .. }
            | CandidateError::EmulationNewerThanBinary { .. } => {
                format!("--emulation-version: {error}")
            }
            CandidateError::InvalidIdentity(_) => format!("--identity: {error}"),
        })?;
        config
            .check_identity(lease.identity())
            .map_err(|error| format!("--identity: {error}"))?;
        Ok(Some(config))
    }
}

/// The library's reason, phrased with the flags an operator sets.
fn lease_flags_error(error: &LeaseConfigError) -> String {
    let format = |d: &Duration| humantime::format_duration(*d).to_string();
    match error {
        LeaseConfigError::LeaseDurationTooShort {
            lease_duration,
            renew_deadline,
        } => format!(
            "--renew-deadline ({}) must be shorter than --lease-duration ({})",
            format(renew_deadline),
            format(lease_duration)
        ),
        LeaseConfigError::RenewDeadlineTooShort {
            renew_deadline,
            retry_period,
        } => format!(
            "--renew-deadline ({}) must be longer than 1.2 x --retry-period ({})",
            format(renew_deadline),
            format(retry_period)
        ),
        LeaseConfigError::ZeroRetryPeriod => "--retry-period must be greater than zero".into(),
        LeaseConfigError::LeaseDurationOutOfRange(_) => format!("--lease-duration: {error}"),
        LeaseConfigError::EmptyName => {
            "--lease-name and --lease-namespace must not be empty".into()
        }
        LeaseConfigError::EmptyIdentity => {
            "no identity: pass --identity or set POD_NAME or HOSTNAME".into()
        }
    }
}

/// The planner's reason, with the flag it comes from.
fn slice_flags_error(error: &slices::ConfigError) -> String {
    let flag = match error {
        slices::ConfigError::MaxEndpointsOutOfRange(_) => "--max-endpoints-per-slice",
        slices::ConfigError::InvalidManagedBy(_) => "--managed-by",
        slices::ConfigError::InvalidNamePrefix(_) => "--slice-prefix",
    };
    format!("{flag}: {error}")
}
