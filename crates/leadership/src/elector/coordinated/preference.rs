//! Whether the holder makes way for the candidate the election controller prefers.
//!
//! The controller orders the candidates of `OldestEmulationVersion` by emulation version, then
//! binary version, then `creationTimestamp`. That timestamp has second precision, and a tie falls
//! to the order of the controller's cache, which changes from one reconcile to the next: replicas
//! of one version started within the same second were preferred in turn, and a holder that
//! yielded to every `preferredHolder` handed the Lease round and round (issue 27: five hand-overs
//! in 220 ms at start; eight in 40 s after a crash, each a new term with its barrier and replay).
//!
//! So the holder reads the preferred candidate's LeaseCandidate (named as the controller names the
//! holder: after the candidate) and yields only when its versions are strictly older than ours.
//! A rolling upgrade or a rollback still moves the Lease to the older version at once; a
//! preference among equals (random), for a newer version, or for a candidate that is gone is
//! declined. Declining is safe: the controller never takes a held, unexpired Lease, it only asks.

use std::{cmp::Ordering, sync::Arc};

use k8s_openapi::api::coordination::{v1::Lease, v1beta1::LeaseCandidateSpec};
use tracing::{debug, info};

use super::{LeaseCandidateStore, OLDEST_EMULATION_VERSION};
use crate::{elector::ElectorMetrics, store::StoreError};

/// A candidate's place in the `OldestEmulationVersion` order, short of its creation time: the
/// emulation version, then the binary version, in semantic version precedence (pre-releases
/// before their release, build metadata ignored), as the controller compares them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::elector) struct CandidateVersions {
    emulation: semver::Version,
    binary: semver::Version,
}

/// What the holder does about a preferred holder other than itself.
#[derive(Debug)]
pub(in crate::elector) enum Weighed {
    /// Make way: the preferred candidate is strictly older, or the Lease's strategy is not one
    /// this crate knows (whoever set the preference is the authority then).
    Yield,
    /// Keep the Lease (renew it): the preference does not follow from the versions.
    Keep,
    /// The preferred candidate could not be read: neither renew nor yield this round (a failed
    /// renewal), and weigh again at the next attempt.
    Unread(StoreError),
}

/// Why a preference was declined (a log field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Declined {
    /// Same emulation and binary versions: the controller's choice among equals is random.
    SameVersions,
    /// The preferred candidate is newer: the controller would not prefer it for its versions.
    NewerVersions,
    /// Its LeaseCandidate is gone (or now belongs to another Lease): nobody to yield to.
    Gone,
    /// Its versions are not semantic versions: the controller would not elect it.
    Unordered,
}

/// Weighs the election controller's preferences for one candidate.
pub(in crate::elector) struct Preferences {
    own: CandidateVersions,
    lease_name: String,
    candidates: Arc<dyn LeaseCandidateStore>,
    /// The last preference declined: in which term, for whom. Logged at info once per term and
    /// preferred candidate (the controller's preference stays on the Lease while we renew).
    declined: Option<(Option<u64>, String)>,
}

// === impl CandidateVersions ===

impl CandidateVersions {
    pub(super) fn new(emulation: semver::Version, binary: semver::Version) -> Self {
        Self { emulation, binary }
    }

    /// Parses both versions; `None` if either is not a semantic version.
    fn parse(emulation: &str, binary: &str) -> Option<Self> {
        Some(Self::new(
            semver::Version::parse(emulation).ok()?,
            semver::Version::parse(binary).ok()?,
        ))
    }

    /// The versions a LeaseCandidate announces; `None` if they cannot be ordered (the
    /// controller leaves such a candidate out of an `OldestEmulationVersion` election).
    fn of(spec: &LeaseCandidateSpec) -> Option<Self> {
        Self::parse(spec.emulation_version.as_deref()?, &spec.binary_version)
    }

    /// Compares in the controller's order: `Less` is older, so preferred.
    fn order(&self, other: &Self) -> Ordering {
        self.emulation
            .cmp_precedence(&other.emulation)
            .then_with(|| self.binary.cmp_precedence(&other.binary))
    }
}

// === impl Preferences ===

impl Preferences {
    /// Preferences weighed for a candidate of `own` versions standing for `lease_name`, reading
    /// the other candidates through `candidates`.
    pub(in crate::elector) fn new(
        own: CandidateVersions,
        lease_name: &str,
        candidates: Arc<dyn LeaseCandidateStore>,
    ) -> Self {
        Self {
            own,
            lease_name: lease_name.to_owned(),
            candidates,
            declined: None,
        }
    }

    /// Whether to make way for `preferred`, the `preferredHolder` of `lease` (which names us).
    /// `term` is ours (if leading); a declined preference is logged at info and counted in
    /// `metrics` once per term and preferred candidate.
    pub(in crate::elector) async fn weigh(
        &mut self,
        lease: &Lease,
        preferred: &str,
        term: Option<u64>,
        metrics: &ElectorMetrics,
    ) -> Weighed {
        let strategy = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.strategy.as_deref());
        if strategy != Some(OLDEST_EMULATION_VERSION) {
            debug!(
                ?strategy,
                preferred, "preference under a strategy we do not know"
            );
            return Weighed::Yield;
        }
        let candidate = match self.candidates.get_named(preferred).await {
            Ok(candidate) => candidate,
            Err(error) => return Weighed::Unread(error),
        };
        let declined = match candidate {
            None => Declined::Gone,
            Some(candidate) if candidate.spec.lease_name != self.lease_name => Declined::Gone,
            Some(candidate) => match CandidateVersions::of(&candidate.spec) {
                None => Declined::Unordered,
                Some(theirs) => match theirs.order(&self.own) {
                    Ordering::Less => return Weighed::Yield,
                    Ordering::Equal => Declined::SameVersions,
                    Ordering::Greater => Declined::NewerVersions,
                },
            },
        };
        self.record_declined(preferred, declined, term, metrics);
        Weighed::Keep
    }

    fn record_declined(
        &mut self,
        preferred: &str,
        reason: Declined,
        term: Option<u64>,
        metrics: &ElectorMetrics,
    ) {
        let key = (term, preferred.to_owned());
        if self.declined.as_ref() == Some(&key) {
            debug!(
                preferred,
                ?reason,
                "keeping the lease; the preferred holder is not older"
            );
            return;
        }
        ElectorMetrics::count(&metrics.counters.preferences_declined);
        info!(
            term,
            preferred,
            ?reason,
            "keeping the lease: the election controller prefers a candidate that is not older"
        );
        self.declined = Some(key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    fn versions(emulation: &str, binary: &str) -> CandidateVersions {
        CandidateVersions::parse(emulation, binary).unwrap()
    }

    #[test]
    fn versions_order_as_the_election_controller_orders_them() {
        use Ordering::{Equal, Greater, Less};
        let cases = [
            (("1.0.0", "1.0.0"), ("1.0.0", "1.0.0"), Equal),
            // Emulation version first, then binary version.
            (("1.0.0", "1.2.0"), ("1.1.0", "1.1.0"), Less),
            (("1.1.0", "1.1.0"), ("1.1.0", "1.2.0"), Less),
            (("1.1.0", "1.3.0"), ("1.1.0", "1.2.0"), Greater),
            // Numeric, not textual.
            (("1.9.0", "1.9.0"), ("1.10.0", "1.10.0"), Less),
            // A pre-release precedes its release; build metadata does not count.
            (("1.1.0-rc.1", "1.1.0"), ("1.1.0", "1.1.0"), Less),
            (("1.1.0-rc.2", "1.1.0"), ("1.1.0-rc.10", "1.1.0"), Less),
            (("1.1.0", "1.1.0+abc"), ("1.1.0", "1.1.0+def"), Equal),
        ];
        for ((e1, b1), (e2, b2), expected) in cases {
            assert_eq!(
                versions(e1, b1).order(&versions(e2, b2)),
                expected,
                "({e1}, {b1}) vs ({e2}, {b2})"
            );
        }
        assert!(CandidateVersions::parse("v1.0.0", "1.0.0").is_none());
        assert!(CandidateVersions::parse("1.0.0", "1.0").is_none());
    }
}
