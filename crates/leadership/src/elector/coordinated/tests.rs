//! Coordinated mode against the in-memory stores, in paused time. The tests play the API
//! server's election controller by writing the Lease and the LeaseCandidate as it does.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use k8s_openapi::{
    api::coordination::{
        v1::{Lease, LeaseSpec},
        v1beta1::{LeaseCandidate, LeaseCandidateSpec},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{Timestamp, ToSpan},
};
use tokio::time::{sleep, timeout};

use super::{publisher::pinged, store::MemoryLeaseCandidateStore, *};
use crate::{
    FenceMetrics,
    elector::{ElectorHandle, LeaseElector, LeaseTimings},
    fence::{Fence, Fenced},
    store::MemoryLeaseStore,
    term::Term,
};

const PROMPTLY: Duration = Duration::from_millis(100);

fn coordinated(
    leases: &MemoryLeaseStore,
    candidates: &MemoryLeaseCandidateStore,
    identity: &str,
) -> ElectorHandle {
    let config = LeaseConfig::new("lease", "ns", identity, LeaseTimings::default()).unwrap();
    LeaseElector::new(config, leases.clone())
        .coordinated(
            CandidateConfig::new("1.1.0", "1.0.0").unwrap(),
            candidates.clone(),
        )
        .spawn()
}

/// The Lease as the election controller writes it: holder, strategy, 5 s, no acquireTime.
fn elected(holder: Option<&str>, preferred: Option<&str>, renewed: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("lease".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(Into::into),
            preferred_holder: preferred.map(Into::into),
            strategy: Some(OLDEST_EMULATION_VERSION.into()),
            lease_duration_seconds: Some(5),
            renew_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }),
    }
}

/// Another candidate's LeaseCandidate for "lease", as its publisher writes it.
fn other_candidate(name: &str, binary: &str, emulation: &str) -> LeaseCandidate {
    LeaseCandidate {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        spec: LeaseCandidateSpec {
            lease_name: "lease".into(),
            binary_version: binary.into(),
            emulation_version: Some(emulation.into()),
            strategy: OLDEST_EMULATION_VERSION.into(),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseCandidateSpec::default()
        },
    }
}

/// Marks the current Lease as the controller does when it prefers `preferred`, under `strategy`.
fn prefer(leases: &MemoryLeaseStore, preferred: &str, strategy: &str) {
    let mut marked = leases.current().unwrap();
    let spec = marked.spec.as_mut().unwrap();
    spec.preferred_holder = Some(preferred.into());
    spec.strategy = Some(strategy.into());
    leases.put(Some(marked));
}

/// `a` (binary 1.1.0, emulating 1.0.0, as [`coordinated`] builds it) named holder and leading.
async fn a_leading(
    leases: &MemoryLeaseStore,
    candidates: &MemoryLeaseCandidateStore,
) -> (ElectorHandle, Term) {
    let a = coordinated(&leases.connect(), candidates, "a");
    leases.put(Some(elected(Some("a"), None, Timestamp::now())));
    let term = wait_leading(&a, true).await.unwrap();
    (a, term)
}

/// Over a while (well past RenewDeadline), `a` keeps `term` and renews the Lease, which keeps
/// naming it with the controller's preference left as it was.
async fn keeps_leading(a: &ElectorHandle, term: &Term, leases: &MemoryLeaseStore, preferred: &str) {
    let writes = leases.writes().len();
    sleep(Duration::from_secs(30)).await;
    assert_eq!(current(a).as_ref(), Some(term), "a kept its term");
    let spec = spec(leases);
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.preferred_holder.as_deref(), Some(preferred));
    assert_eq!(spec.lease_transitions, Some(1), "no new term");
    assert!(
        leases.writes().len() >= writes + 14,
        "renewed every RetryPeriod"
    );
}

/// Waits up to [`PROMPTLY`] for the Lease's holder to be cleared (a yield's write); `what`
/// names the failure.
async fn holder_cleared_promptly(leases: &MemoryLeaseStore, what: &str) {
    timeout(PROMPTLY, async {
        while spec(leases)
            .holder_identity
            .is_some_and(|holder| !holder.is_empty())
        {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

fn spec(leases: &MemoryLeaseStore) -> LeaseSpec {
    leases
        .current()
        .and_then(|lease| lease.spec)
        .expect("lease")
}

fn current(handle: &ElectorHandle) -> Option<Term> {
    handle.leadership().borrow().clone()
}

async fn wait_leading(handle: &ElectorHandle, leading: bool) -> Option<Term> {
    let mut leadership = handle.leadership();
    timeout(
        PROMPTLY,
        leadership.wait_for(|term| term.is_some() == leading),
    )
    .await
    .unwrap_or_else(|_| panic!("leading={leading} not reached promptly"))
    .expect("elector alive")
    .clone()
}

async fn wait_candidate(
    candidates: &MemoryLeaseCandidateStore,
    what: &str,
    done: impl Fn(Option<&LeaseCandidate>) -> bool,
) {
    timeout(PROMPTLY, async {
        while !done(candidates.current().as_ref()) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} not reached promptly"));
}

#[tokio::test(start_paused = true)]
async fn candidate_publishes_itself_and_never_takes_the_lease() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let a = coordinated(&leases.connect(), &candidates, "a");
    wait_candidate(&candidates, "candidate created", |c| c.is_some()).await;
    let published = candidates.current().unwrap();
    assert_eq!(published.metadata.name.as_deref(), Some("a"));
    assert_eq!(published.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(published.spec.lease_name, "lease");
    assert_eq!(published.spec.binary_version, "1.1.0");
    assert_eq!(published.spec.emulation_version.as_deref(), Some("1.0.0"));
    assert_eq!(published.spec.strategy, OLDEST_EMULATION_VERSION);
    assert!(published.spec.renew_time.is_some());

    // No lease: the competing elector would create it; this one waits for the controller.
    sleep(Duration::from_secs(60)).await;
    assert!(leases.current().is_none(), "a candidate created the lease");
    assert!(current(&a).is_none());

    // A free lease and an expired one are left alone as well.
    leases.put(Some(elected(None, None, Timestamp::now())));
    sleep(Duration::from_secs(30)).await;
    leases.put(Some(elected(
        Some("gone"),
        None,
        Timestamp::now() - 1.hour(),
    )));
    sleep(Duration::from_secs(60)).await;
    assert!(current(&a).is_none());
    assert_eq!(spec(&leases).holder_identity.as_deref(), Some("gone"));
    assert!(leases.writes().is_empty(), "a candidate wrote the lease");
}

#[tokio::test(start_paused = true)]
async fn named_candidate_renews_at_once_and_leads_fenced_terms() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let a = coordinated(&leases.connect(), &candidates, "a");
    sleep(Duration::from_secs(1)).await;

    leases.put(Some(elected(Some("a"), None, Timestamp::now())));
    let term = wait_leading(&a, true).await.unwrap();
    // Our own renewal started the term: our duration, an acquisition, the controller's strategy.
    let spec = spec(&leases);
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert!(spec.acquire_time.is_some());
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(spec.strategy.as_deref(), Some(OLDEST_EMULATION_VERSION));

    // Renews every RetryPeriod within the same term, like the competing elector.
    let writes = leases.writes().len();
    sleep(Duration::from_secs(20)).await;
    assert_eq!(current(&a), Some(term));
    assert!(leases.writes().len() >= writes + 9);
}

#[tokio::test(start_paused = true)]
async fn leader_yields_when_a_strictly_older_candidate_is_preferred() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, term) = a_leading(&leases, &candidates).await;
    // b emulates the same version but runs an older binary: the controller prefers it.
    candidates.put_other(other_candidate("b", "1.0.0", "1.0.0"));
    let fence = Fence::new(
        term.clone(),
        a.leadership(),
        Duration::from_secs(1),
        FenceMetrics::default(),
    );
    assert_eq!(fence.check(), Ok(()));

    // The controller marks the end of the term: a better candidate joined.
    prefer(&leases, "b", OLDEST_EMULATION_VERSION);
    wait_leading(&a, false).await;
    assert_eq!(fence.check(), Err(Fenced::TermEnded { term: term.id() }));

    // The holder is cleared (so the controller names b at once); fields we do not own stay.
    holder_cleared_promptly(&leases, "holder cleared promptly").await;
    let spec = spec(&leases);
    assert_eq!(spec.holder_identity.as_deref(), Some(""));
    assert_eq!(spec.preferred_holder.as_deref(), Some("b"));
    assert_eq!(spec.strategy.as_deref(), Some(OLDEST_EMULATION_VERSION));
    assert_eq!(a.metrics().step_downs(), 0, "a yield is not a failure");
    assert_eq!(a.metrics().preferences_declined(), 0);

    // The controller names b; a stays a follower.
    leases.put(Some(elected(Some("b"), None, Timestamp::now())));
    sleep(Duration::from_secs(30)).await;
    assert!(current(&a).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_yield_whose_write_fails_is_tried_again_at_once() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let a_conn = leases.connect();
    let a = coordinated(&a_conn, &candidates, "a");
    leases.put(Some(elected(Some("a"), None, Timestamp::now())));
    wait_leading(&a, true).await;
    candidates.put_other(other_candidate("b", "1.0.0", "1.0.0"));

    // The write that clears the holder fails: a has stopped leading, and looks again at once
    // rather than at its next RetryPeriod, so the controller can name b promptly.
    a_conn.fail_next(1);
    prefer(&leases, "b", OLDEST_EMULATION_VERSION);
    wait_leading(&a, false).await;
    holder_cleared_promptly(&leases, "holder cleared promptly, by a second write").await;
    assert_eq!(spec(&leases).preferred_holder.as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn leader_keeps_the_lease_when_a_candidate_of_the_same_versions_is_preferred() {
    // Issue 27: candidates of one version created in the same second tie in the controller's
    // order, which it breaks at random in each reconcile; yielding to each swapped the Lease.
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, term) = a_leading(&leases, &candidates).await;
    candidates.put_other(other_candidate("b", "1.1.0", "1.0.0"));
    candidates.put_other(other_candidate("c", "1.1.0", "1.0.0"));

    prefer(&leases, "b", OLDEST_EMULATION_VERSION);
    keeps_leading(&a, &term, &leases, "b").await;
    // Counted once per term and preferred candidate, not at each renewal.
    assert_eq!(a.metrics().preferences_declined(), 1);

    // The next reconcile breaks the tie another way: declined as well.
    prefer(&leases, "c", OLDEST_EMULATION_VERSION);
    keeps_leading(&a, &term, &leases, "c").await;
    assert_eq!(a.metrics().preferences_declined(), 2);
    assert_eq!(a.metrics().step_downs(), 0);
    assert_eq!(a.metrics().renew_failures(), 0);
}

#[tokio::test(start_paused = true)]
async fn leader_keeps_the_lease_when_a_newer_candidate_is_preferred() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, term) = a_leading(&leases, &candidates).await;
    // Newer by emulation version (binary older than ours), then by binary version alone.
    candidates.put_other(other_candidate("b", "1.0.5", "1.0.1"));
    candidates.put_other(other_candidate("c", "1.2.0", "1.0.0"));
    prefer(&leases, "b", OLDEST_EMULATION_VERSION);
    keeps_leading(&a, &term, &leases, "b").await;
    prefer(&leases, "c", OLDEST_EMULATION_VERSION);
    keeps_leading(&a, &term, &leases, "c").await;
    assert_eq!(a.metrics().preferences_declined(), 2);
}

#[tokio::test(start_paused = true)]
async fn leader_keeps_the_lease_when_the_preferred_candidate_is_gone() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, term) = a_leading(&leases, &candidates).await;
    // No LeaseCandidate "b" (deleted on its shutdown, or garbage-collected): nobody to yield to.
    let (reads, writes) = (candidates.named_reads(), leases.writes().len());
    prefer(&leases, "b", OLDEST_EMULATION_VERSION);
    keeps_leading(&a, &term, &leases, "b").await;
    assert_eq!(a.metrics().preferences_declined(), 1);
    // Weighed when the preference appeared, then once a renewal: the echoes of our own
    // renewals on the watch add no reads.
    let (reads, renewals) = (
        candidates.named_reads() - reads,
        leases.writes().len() - writes,
    );
    assert!(
        reads <= renewals as u64 + 1,
        "{reads} reads of the preferred candidate over {renewals} renewals"
    );
}

#[tokio::test(start_paused = true)]
async fn leader_yields_under_a_strategy_it_does_not_know() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, _) = a_leading(&leases, &candidates).await;
    // Same versions, even: under another strategy whoever set the preference is the authority.
    candidates.put_other(other_candidate("b", "1.1.0", "1.0.0"));
    prefer(&leases, "b", "SomeThirdPartyStrategy");
    wait_leading(&a, false).await;
    timeout(PROMPTLY, async {
        while spec(&leases).holder_identity.as_deref() != Some("") {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("holder cleared promptly");
    assert_eq!(a.metrics().preferences_declined(), 0);
}

#[tokio::test(start_paused = true)]
async fn unreadable_preferred_candidate_fails_the_renewal_and_is_weighed_again() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, term) = a_leading(&leases, &candidates).await;
    candidates.put_other(other_candidate("b", "1.0.0", "1.0.0"));
    candidates.fail_reads_of_others(true);
    prefer(&leases, "b", OLDEST_EMULATION_VERSION);

    // Neither yielded nor renewed: failed renewals within the grace of RenewDeadline (10 s).
    let writes = leases.writes().len();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(current(&a), Some(term.clone()), "kept within RenewDeadline");
    assert_eq!(spec(&leases).holder_identity.as_deref(), Some("a"));
    assert_eq!(
        leases.writes().len(),
        writes,
        "no renewal while the candidate is unread"
    );
    assert!(a.metrics().renew_failures() >= 2);

    // Readable again: the next renewal weighs it and yields to the older candidate.
    candidates.fail_reads_of_others(false);
    sleep(Duration::from_secs(3)).await;
    assert!(current(&a).is_none(), "yielded at the next renewal");
    assert_eq!(spec(&leases).holder_identity.as_deref(), Some(""));
    assert_eq!(a.metrics().step_downs(), 0, "a yield, not a lost lease");

    // Never readable: the term ends at RenewDeadline, and the record expires for the controller.
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let (a, _) = a_leading(&leases, &candidates).await;
    candidates.fail_reads_of_others(true);
    prefer(&leases, "b", OLDEST_EMULATION_VERSION);
    sleep(Duration::from_secs(11)).await;
    assert!(current(&a).is_none(), "stepped down at RenewDeadline");
    assert_eq!(a.metrics().step_downs(), 1);
}

#[tokio::test(start_paused = true)]
async fn candidate_named_with_a_tied_preference_leads() {
    // The controller may name a holder and prefer another of the same versions in one record
    // (a reconcile between our renewals): the named one leads instead of clearing the holder.
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let a = coordinated(&leases.connect(), &candidates, "a");
    candidates.put_other(other_candidate("b", "1.1.0", "1.0.0"));
    sleep(Duration::from_secs(1)).await;
    leases.put(Some(elected(Some("a"), Some("b"), Timestamp::now())));
    let term = wait_leading(&a, true).await.unwrap();
    keeps_leading(&a, &term, &leases, "b").await;
}

#[tokio::test(start_paused = true)]
async fn ping_is_answered_at_once() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let _a = coordinated(&leases.connect(), &candidates, "a");
    wait_candidate(&candidates, "candidate created", |c| c.is_some()).await;
    sleep(Duration::from_secs(60)).await;

    let mut ping = candidates.current().unwrap();
    ping.spec.ping_time = Some(MicroTime(Timestamp::now() + 1.second()));
    candidates.put(ping);
    assert!(pinged(&candidates.current().unwrap()));
    wait_candidate(&candidates, "ping answered", |c| {
        c.is_some_and(|c| !pinged(c))
    })
    .await;
    // The ping time stays: the controller compares the two.
    assert!(candidates.current().unwrap().spec.ping_time.is_some());
}

#[tokio::test(start_paused = true)]
async fn candidate_is_renewed_periodically_and_recreated_when_deleted() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let _a = coordinated(&leases.connect(), &candidates, "a");
    wait_candidate(&candidates, "candidate created", |c| c.is_some()).await;
    sleep(Duration::from_secs(11 * 60)).await;
    let writes = candidates.writes();
    assert_eq!(writes.len(), 3, "created, then renewed every 5 minutes");

    // The controller's garbage collector (or an admin) deleted it: it comes back.
    candidates.delete().await.unwrap();
    wait_candidate(&candidates, "candidate re-created", |c| c.is_some()).await;
}

#[tokio::test(start_paused = true)]
async fn release_deletes_the_candidate_before_releasing_the_lease() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let a_conn = leases.connect();
    let a = coordinated(&a_conn, &candidates, "a");
    leases.put(Some(elected(Some("a"), None, Timestamp::now())));
    wait_leading(&a, true).await;

    // Hold the lease writes so that the order can be seen.
    a_conn.hang(true);
    let release = tokio::spawn(a.release());
    wait_candidate(&candidates, "candidate deleted", |c| c.is_none()).await;
    assert_eq!(spec(&leases).holder_identity.as_deref(), Some("a"));

    a_conn.hang(false);
    release.await.unwrap().unwrap();
    // Cleared as client-go clears it: an empty holder, never a missing field (which crashes
    // kube-apiserver 1.37's election controller).
    assert_eq!(spec(&leases).holder_identity.as_deref(), Some(""));
    assert!(candidates.current().is_none());
}

#[test]
fn decisions_follow_holder_and_preferred_holder() {
    let now = Timestamp::now();
    let cases = [
        (Mode::Compete, None, None, Decision::Claim),
        (Mode::Compete, Some("b"), Some("b"), Decision::Claim),
        (Mode::Coordinated, None, None, Decision::Wait),
        (Mode::Coordinated, Some("b"), None, Decision::Wait),
        (Mode::Coordinated, Some("a"), None, Decision::Claim),
        (Mode::Coordinated, Some("a"), Some("a"), Decision::Claim),
        (Mode::Coordinated, Some("a"), Some(""), Decision::Claim),
        (
            Mode::Coordinated,
            Some("a"),
            Some("b"),
            Decision::OtherPreferred,
        ),
    ];
    for (mode, holder, preferred, expected) in cases {
        let lease = elected(holder, preferred, now);
        assert_eq!(
            mode.decide(&lease, "a"),
            expected,
            "{mode:?} holder={holder:?} preferred={preferred:?}"
        );
    }
}

#[test]
fn versions_are_checked_as_the_api_server_does() {
    assert!(CandidateConfig::new("0.1.0", "0.1.0").is_ok());
    assert!(CandidateConfig::new("1.10.0", "1.9.3").is_ok());
    assert!(CandidateConfig::new("1.2.3-rc.1+abc", "1.2.0").is_ok());
    for bad in [
        "", "1", "1.2", "v1.2.3", "1.2.3.4", "01.2.3", "1.2.x", "1.2.3-",
    ] {
        assert!(
            matches!(
                CandidateConfig::new(bad, "0.0.1"),
                Err(CandidateError::InvalidVersion {
                    which: "binary",
                    ..
                })
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        CandidateConfig::new("1.2.0", "1.10.0"),
        Err(CandidateError::EmulationNewerThanBinary {
            binary: "1.2.0".into(),
            emulation: "1.10.0".into()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn identity_that_cannot_name_a_candidate_ends_the_elector_visibly() {
    let candidate = CandidateConfig::new("1.0.0", "1.0.0").unwrap();
    assert!(candidate.check_identity("controller-7d9f_x.1").is_ok());
    assert!(candidate.check_identity("pod/0").is_err());

    let config = LeaseConfig::new("lease", "ns", "pod/0", LeaseTimings::default()).unwrap();
    let mut elector = LeaseElector::new(config, MemoryLeaseStore::new())
        .coordinated(candidate, MemoryLeaseCandidateStore::new())
        .spawn();
    let error = timeout(PROMPTLY, elector.lost())
        .await
        .expect("ends at once");
    assert!(
        matches!(error, ElectorError::Candidate(CandidateError::InvalidIdentity(ref id)) if id == "pod/0"),
        "{error}"
    );
}
