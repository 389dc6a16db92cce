//! Coordinated mode against the in-memory stores, in paused time. The tests play the API
//! server's election controller by writing the Lease and the LeaseCandidate as it does.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use k8s_openapi::{
    api::coordination::{
        v1::{Lease, LeaseSpec},
        v1beta1::LeaseCandidate,
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
async fn leader_yields_when_another_holder_is_preferred() {
    let (leases, candidates) = (MemoryLeaseStore::new(), MemoryLeaseCandidateStore::new());
    let a = coordinated(&leases.connect(), &candidates, "a");
    leases.put(Some(elected(Some("a"), None, Timestamp::now())));
    let term = wait_leading(&a, true).await.unwrap();
    let fence = Fence::new(
        term.clone(),
        a.leadership(),
        Duration::from_secs(1),
        FenceMetrics::default(),
    );
    assert_eq!(fence.check(), Ok(()));

    // The controller marks the end of the term: a better candidate joined.
    let mut marked = leases.current().unwrap();
    marked.spec.as_mut().unwrap().preferred_holder = Some("b".into());
    leases.put(Some(marked));
    wait_leading(&a, false).await;
    assert_eq!(fence.check(), Err(Fenced::TermEnded { term: term.id() }));

    // The holder is cleared (so the controller names b at once); fields we do not own stay.
    timeout(PROMPTLY, async {
        while spec(&leases)
            .holder_identity
            .is_some_and(|holder| !holder.is_empty())
        {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("holder cleared promptly");
    let spec = spec(&leases);
    assert_eq!(spec.holder_identity.as_deref(), Some(""));
    assert_eq!(spec.preferred_holder.as_deref(), Some("b"));
    assert_eq!(spec.strategy.as_deref(), Some(OLDEST_EMULATION_VERSION));
    assert_eq!(a.metrics().step_downs(), 0, "a yield is not a failure");

    // The controller names b; a stays a follower.
    leases.put(Some(elected(Some("b"), None, Timestamp::now())));
    sleep(Duration::from_secs(30)).await;
    assert!(current(&a).is_none());
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
        (Mode::Coordinated, Some("a"), Some("b"), Decision::Yield),
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
