//! Coordinated Leader Election (KEP-4355, `coordination.k8s.io/v1beta1` LeaseCandidate).
//!
//! In this mode the API server's election controller (in kube-apiserver, behind the
//! `CoordinatedLeaderElection` feature gate) picks the holder; candidates never take the Lease
//! themselves:
//!
//! ```text
//!  replica ──creates, renews, answers pings──► LeaseCandidate <identity> (leaseName, versions, strategy)
//!                                                  │ watched by
//!  kube-apiserver's election controller ◄──────────┘
//!     ├─ writes the Lease naming the candidate with the oldest emulation version (then the
//!     │  oldest binary version, then the oldest candidate) when it has no holder or expired
//!     └─ sets spec.preferredHolder when a better candidate joins
//!  replica named holder ──renews the Lease (fenced terms as usual)──► leads
//!  replica with preferredHolder ≠ itself ──reads that LeaseCandidate──► strictly older versions?
//!     ├─ yes: ends its term, clears the holder ──► controller names the other
//!     └─ no (same versions, newer, gone): keeps renewing
//! ```
//!
//! What stays the same as the competing elector: every Lease write is guarded by
//! resourceVersion, a term starts only after a successful write of ours naming us, the renewal
//! grace (RenewDeadline) and the prompt step-down on a record without us, and the [`Fence`].
//! What changes: a candidate waits to be named (it never creates a missing Lease nor takes a free
//! or expired one), and a leader asked to make way for an older version ends its term before
//! clearing the holder (see [`preference`] for why a preference among equals is declined).
//! On release (graceful shutdown) the LeaseCandidate is deleted first, so that the controller
//! does not wait for this replica to answer a ping, then the Lease is released.
//!
//! [`Fence`]: crate::Fence

mod preference;
mod publisher;
mod store;
#[cfg(test)]
mod tests;

use k8s_openapi::{
    api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub(super) use self::preference::{CandidateVersions, Preferences, Weighed};
pub(super) use self::publisher::Publisher;
pub use self::store::{KubeLeaseCandidateStore, LeaseCandidateStore};
use super::{ElectorError, config::LeaseConfig, record, run::Candidate};
use crate::store::LeaseStore;

/// The only strategy the election controller implements (and the one this crate announces).
pub const OLDEST_EMULATION_VERSION: &str = "OldestEmulationVersion";

/// What a replica announces in its LeaseCandidate: its binary and emulation versions.
///
/// The election controller prefers the lowest emulation version, then the lowest binary
/// version, then the oldest candidate: during a rolling upgrade the replicas of the old version
/// keep leading until the last of them is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CandidateConfig {
    binary_version: String,
    emulation_version: String,
    /// Both, parsed: compared with the candidate the election controller prefers.
    versions: CandidateVersions,
}

/// Why a [`CandidateConfig`] cannot be built or used.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CandidateError {
    /// A version is not a semantic version `MAJOR.MINOR.PATCH` (the API server rejects it).
    /// Not retryable: fix the configuration.
    #[error("{which} version {version:?} is not a semantic version (MAJOR.MINOR.PATCH)")]
    InvalidVersion {
        /// `binary` or `emulation`.
        which: &'static str,
        /// The rejected value.
        version: String,
    },
    /// The emulation version is newer than the binary version (the API server rejects it).
    /// Not retryable: fix the configuration.
    #[error("emulation version {emulation} must not be newer than binary version {binary}")]
    EmulationNewerThanBinary {
        /// The binary version.
        binary: String,
        /// The emulation version.
        emulation: String,
    },
    /// The identity cannot name a LeaseCandidate (letters, digits, `-`, `_`, `.`; at most 253).
    /// Not retryable: fix the identity.
    #[error("identity {0:?} cannot name a LeaseCandidate (letters, digits, '-', '_', '.')")]
    InvalidIdentity(String),
}

/// How a candidate becomes leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::elector) enum Mode {
    /// Take the lease when it is free or expired (client-go's algorithm).
    Compete,
    /// Wait to be named holder by the API server's election controller.
    Coordinated,
}

/// What a candidate does with a lease record that is not held by another (unexpired) holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::elector) enum Decision {
    /// Take or renew it.
    Claim,
    /// Leave it: the election controller has not named us.
    Wait,
    /// It names us, but the election controller prefers another: weigh the preference
    /// ([`Preferences::weigh`]) and make way or keep it.
    OtherPreferred,
}

/// The coordinated part of an elector, until it is spawned.
pub(in crate::elector) struct Coordination {
    pub(in crate::elector) config: CandidateConfig,
    pub(in crate::elector) store: Box<dyn LeaseCandidateStore>,
}

// === impl CandidateConfig ===

impl CandidateConfig {
    /// A candidate of `binary_version` emulating `emulation_version`; both must be semantic
    /// versions (`1.4.0`), the emulation version not newer than the binary version.
    pub fn new(
        binary_version: impl Into<String>,
        emulation_version: impl Into<String>,
    ) -> Result<Self, CandidateError> {
        let (binary_version, emulation_version) = (binary_version.into(), emulation_version.into());
        let binary = semantic_version("binary", &binary_version)?;
        let emulation = semantic_version("emulation", &emulation_version)?;
        if binary.cmp_precedence(&emulation).is_lt() {
            return Err(CandidateError::EmulationNewerThanBinary {
                binary: binary_version,
                emulation: emulation_version,
            });
        }
        Ok(Self {
            versions: CandidateVersions::new(emulation, binary),
            binary_version,
            emulation_version,
        })
    }

    /// The version of the running binary.
    pub(crate) fn binary_version(&self) -> &str {
        &self.binary_version
    }

    /// The version whose behaviour the binary keeps (the oldest one leads).
    pub(crate) fn emulation_version(&self) -> &str {
        &self.emulation_version
    }

    /// The versions, parsed.
    pub(in crate::elector) fn versions(&self) -> &CandidateVersions {
        &self.versions
    }

    /// Checks that `identity` can name this replica's LeaseCandidate (the election controller
    /// names the Lease holder after the candidate): letters, digits, `-`, `_`, `.`, at most 253.
    pub fn check_identity(&self, identity: &str) -> Result<(), CandidateError> {
        if valid_candidate_name(identity) {
            Ok(())
        } else {
            Err(CandidateError::InvalidIdentity(identity.to_owned()))
        }
    }
}

// === impl Mode ===

impl Mode {
    /// What to do with `lease` (read or watched), which no other holder holds unexpired.
    pub(in crate::elector) fn decide(self, lease: &Lease, identity: &str) -> Decision {
        if self == Mode::Compete {
            return Decision::Claim;
        }
        if record::holder(lease) != Some(identity) {
            return Decision::Wait;
        }
        match preferred_holder(lease) {
            Some(preferred) if preferred != identity => Decision::OtherPreferred,
            _ => Decision::Claim,
        }
    }

    /// Gives the lease up ([`record::release`]). In coordinated mode the holder is written as
    /// an empty string, as client-go does, never left out: kube-apiserver 1.37's election
    /// controller dereferences `spec.holderIdentity` without a nil check when it compares
    /// holders (leaderelection_controller.go, `expiredAndNewHolder` / `differentHolder`), and a
    /// Lease without the field crashes the whole API server at its next election.
    pub(in crate::elector) fn release(self, lease: Lease) -> Lease {
        let mut lease = record::release(lease);
        if self == Mode::Coordinated
            && let Some(spec) = lease.spec.as_mut()
        {
            spec.holder_identity = Some(String::new());
        }
        lease
    }
}

// === impl Coordination ===

impl std::fmt::Debug for Coordination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordination")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Renews a lease the election controller named us holder of. Starting a term (`starting`), it
/// records the acquisition as a take-over would (the controller writes no acquireTime and keeps
/// leaseTransitions), so the record reads the same in both modes.
pub(in crate::elector) fn claim_named(lease: Lease, config: &LeaseConfig, starting: bool) -> Lease {
    let mut lease = record::claim(lease, config);
    if starting && let Some(spec) = lease.spec.as_mut() {
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    lease
}

/// Runs the elector in coordinated mode with its LeaseCandidate publisher until `stop`; then
/// deletes the LeaseCandidate first (so the election controller stops counting on this replica),
/// and only then stops the elector, which releases the Lease if held.
pub(in crate::elector) async fn run<S: LeaseStore>(
    candidate: Candidate<S>,
    publisher: Publisher,
    stop: CancellationToken,
) -> Result<(), ElectorError> {
    publisher.check_identity()?;
    let elector_stop = CancellationToken::new();
    let elector = candidate.run(elector_stop.clone());
    let publishing = publisher.run(stop.clone());
    let mut elector = std::pin::pin!(elector);
    tokio::select! {
        biased;
        result = &mut elector => {
            // The elector ends only when asked to; report it as the competing elector would.
            warn!("the elector ended before its LeaseCandidate publisher");
            return result.and(Err(ElectorError::Exited));
        }
        () = publishing => {}
    }
    elector_stop.cancel();
    elector.await
}

/// The `preferredHolder` of `lease`, if set and not empty.
pub(in crate::elector) fn preferred_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.preferred_holder.as_deref())
        .filter(|preferred| !preferred.is_empty())
}

/// `version` as a semantic version (`1.2.3`, optionally `-pre` / `+build`), as the API server's
/// validation requires: three numbers, no leading zeros.
fn semantic_version(which: &'static str, version: &str) -> Result<semver::Version, CandidateError> {
    semver::Version::parse(version).map_err(|_| CandidateError::InvalidVersion {
        which,
        version: version.to_owned(),
    })
}

/// Whether `identity` can name a LeaseCandidate (the API server checks names as ConfigMap keys).
fn valid_candidate_name(identity: &str) -> bool {
    !identity.is_empty()
        && identity.len() <= 253
        && identity
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && identity != "."
        && identity != ".."
}
