//! Elector tests against the in-memory store, in paused time.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::*;
use crate::{store::MemoryLeaseStore, term::Term};

const RETRY: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const LEASE_DURATION: Duration = Duration::from_secs(15);

fn candidate(store: &MemoryLeaseStore, identity: &str) -> ElectorHandle {
    let config = LeaseConfig::new("lease", "ns", identity, LeaseTimings::default());
    LeaseElector::new(config.expect("valid config"), store.clone()).spawn()
}

fn current(handle: &ElectorHandle) -> Option<Term> {
    handle.leadership().borrow().clone()
}

fn spec(store: &MemoryLeaseStore) -> LeaseSpec {
    store
        .current()
        .and_then(|lease| lease.spec)
        .expect("lease exists")
}

fn holder_lease(holder: &str, renewed: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("lease".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            acquire_time: Some(MicroTime(renewed)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// Waits (in paused time) until `handle` leads or not, failing after `within`.
async fn wait_leading(handle: &ElectorHandle, leading: bool, within: Duration) -> Instant {
    let mut leadership = handle.leadership();
    timeout(
        within,
        leadership.wait_for(|term| term.is_some() == leading),
    )
    .await
    .unwrap_or_else(|_| panic!("leading={leading} not reached within {within:?}"))
    .expect("elector alive");
    Instant::now()
}

/// A candidate `identity` on `store`, once it leads: alone, it does within 10 ms.
async fn leading_candidate(store: &MemoryLeaseStore, identity: &str) -> ElectorHandle {
    let handle = candidate(store, identity);
    wait_leading(&handle, true, Duration::from_millis(10)).await;
    handle
}

/// "a" leading on a connection of its own to `store`, then "b" on another, given a RetryPeriod
/// to see a's Lease: (a's connection, b's connection, a, b).
async fn a_leads_b_follows(
    store: &MemoryLeaseStore,
) -> (
    MemoryLeaseStore,
    MemoryLeaseStore,
    ElectorHandle,
    ElectorHandle,
) {
    let (a_conn, b_conn) = (store.connect(), store.connect());
    let a = leading_candidate(&a_conn, "a").await;
    let b = candidate(&b_conn, "b");
    sleep(RETRY).await;
    (a_conn, b_conn, a, b)
}

/// Waits until `store` has been written once more (in paused time, polling every 10 ms).
async fn next_write(store: &MemoryLeaseStore) {
    let writes = store.writes().len();
    while store.writes().len() == writes {
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn lone_candidate_creates_the_lease_and_leads() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    let spec = spec(&store);
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(a.metrics().acquisitions(), 1);

    // Renews every RetryPeriod, same term.
    let term = current(&a).expect("leading");
    let writes = store.writes().len();
    sleep(RETRY * 5 + Duration::from_millis(1)).await;
    assert_eq!(current(&a), Some(term));
    assert_eq!(store.writes().len(), writes + 5);
}

#[tokio::test(start_paused = true)]
async fn two_candidates_never_both_lead() {
    let store = MemoryLeaseStore::new();
    let (a_conn, b_conn) = (store.connect(), store.connect());
    let a = candidate(&a_conn, "a");
    let b = candidate(&b_conn, "b");
    let (a_fence_rx, b_fence_rx) = (a.leadership(), b.leadership());

    let mut leaders_seen = Vec::new();
    let started = Instant::now();
    for step in 0..3000u32 {
        // A storm of faults: a cut (hang) for each in turn, sporadic failures, conflicts.
        let at = Instant::now() - started;
        match step {
            200 => a_conn.hang(true),
            600 => a_conn.hang(false),
            800 => b_conn.hang(true),
            1300 => b_conn.hang(false),
            1500 => a_conn.fail_next(3),
            1700 => b_conn.fail_next(6),
            2000 => {
                let holder = store
                    .current()
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity);
                let loser = if holder.as_deref() == Some("a") {
                    &a_conn
                } else {
                    &b_conn
                };
                loser.hang(true);
            }
            2400 => {
                a_conn.hang(false);
                b_conn.hang(false);
            }
            _ => {}
        }
        sleep(Duration::from_millis(50)).await;
        let a_leads = a_fence_rx.borrow().is_some();
        let b_leads = b_fence_rx.borrow().is_some();
        assert!(!(a_leads && b_leads), "both lead at {at:?}");
        let leader = [(a_leads, "a"), (b_leads, "b")]
            .into_iter()
            .find_map(|(leads, name)| leads.then_some(name));
        if leader.is_some() && leaders_seen.last().copied() != leader {
            leaders_seen.extend(leader);
        }
        // The lease record agrees with whoever believes it leads.
        if a_leads || b_leads {
            let holder = spec(&store).holder_identity;
            assert_eq!(holder.as_deref(), Some(if a_leads { "a" } else { "b" }));
        }
    }
    // Leadership moved across the cuts, and someone leads at the end.
    assert!(leaders_seen.len() >= 2, "leaders: {leaders_seen:?}");
    assert!(current(&a).is_some() || current(&b).is_some());
}

#[tokio::test(start_paused = true)]
async fn one_failed_renewal_does_not_step_down() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store, "a").await;
    let term = current(&a).expect("leading");

    store.fail_next(1);
    sleep(RETRY * 3).await;
    assert_eq!(current(&a), Some(term.clone()), "no churn on one failure");
    assert_eq!(a.metrics().renew_failures(), 1);
    assert_eq!(a.metrics().step_downs(), 0);

    // Failures in a row, as long as a renewal succeeds within RenewDeadline: still no churn
    // (three failed attempts = 6 s without renewal, plus up to one RetryPeriod before).
    store.fail_next(3);
    sleep(RETRY * 6).await;
    assert_eq!(current(&a), Some(term));
    assert_eq!(a.metrics().step_downs(), 0);
}

#[tokio::test(start_paused = true)]
async fn renew_deadline_without_renewal_steps_down_before_others_can_take_over() {
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    let a = leading_candidate(&a_conn, "a").await;
    let b = candidate(&store.connect(), "b");
    sleep(Duration::from_millis(4100)).await;
    let term = current(&a).expect("leading");
    let last_renewal = term.last_renewed_at();

    // A's API calls now hang: no error, no answer.
    a_conn.hang(true);
    let margin = Duration::from_secs(1);
    let fence = crate::Fence::new(
        term.clone(),
        a.leadership(),
        margin,
        crate::FenceMetrics::default(),
    );
    sleep_until(last_renewal + RENEW_DEADLINE - margin - Duration::from_millis(1)).await;
    assert_eq!(fence.check(), Ok(()), "still safely held");
    sleep(Duration::from_millis(1)).await;
    assert!(
        fence.check().is_err(),
        "writes stop a margin before the step-down"
    );
    let stepped_down = wait_leading(&a, false, RENEW_DEADLINE + RETRY).await;
    assert!(
        stepped_down <= last_renewal + RENEW_DEADLINE,
        "stepped down {:?} after the last renewal",
        stepped_down - last_renewal
    );
    assert_eq!(a.metrics().step_downs(), 1);

    // B takes over only once the lease expired in B's observation: after A stopped acting.
    let taken_over = wait_leading(&b, true, LEASE_DURATION + RETRY * 2).await;
    assert!(taken_over >= last_renewal + LEASE_DURATION);
    assert!(taken_over > stepped_down + (LEASE_DURATION - RENEW_DEADLINE) - RETRY);

    // A's connection comes back: it sees B and follows.
    a_conn.hang(false);
    sleep(RETRY * 3).await;
    assert!(current(&a).is_none());
    assert!(current(&b).is_some());
}

#[tokio::test(start_paused = true)]
async fn renewals_that_hang_past_their_bound_count_as_renew_failures() {
    // Found by the chaos tests: a blackholed leader stepped down at RenewDeadline with zero
    // renew failures counted, because timed-out requests were not counted.
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    let a = leading_candidate(&a_conn, "a").await;
    a_conn.hang(true);
    sleep(RETRY * 2 + Duration::from_millis(100)).await;
    assert!(current(&a).is_some(), "still within the grace");
    assert!(a.metrics().renew_failures() >= 1);
    a_conn.hang(false);
    sleep(RETRY * 2).await;
    assert!(current(&a).is_some(), "renewed after the hang");
    assert_eq!(a.metrics().step_downs(), 0);
}

#[tokio::test(start_paused = true)]
async fn slow_api_server_within_renew_deadline_does_not_leave_the_cluster_without_a_leader() {
    // Found by the control-plane chaos tests: with every request slow enough that a read and a
    // write together outlast RetryPeriod (yet far within RenewDeadline), every renewal and every
    // acquisition was cut off at RetryPeriod, and nobody led for as long as the API was slow.
    let store = MemoryLeaseStore::new();
    let (a_conn, b_conn, a, b) = a_leads_b_follows(&store).await;
    let term = current(&a).expect("leading");

    let latency = RETRY.mul_f64(0.6); // an attempt (read + write) takes 1.2 × RetryPeriod
    a_conn.latency(latency);
    b_conn.latency(latency);
    sleep(LEASE_DURATION * 3).await;
    assert_eq!(current(&a), Some(term), "the slow leader keeps its term");
    assert!(current(&b).is_none());
    assert_eq!(a.metrics().step_downs(), 0);
    assert!(
        a.metrics().renew_failures() >= 1,
        "renewals slower than RetryPeriod are counted"
    );

    // The other candidate, on the same slow API server, acquires once the lease is free (the
    // release itself may be too slow to land: then once it expires).
    let _ = a.release().await;
    let took_over = wait_leading(&b, true, LEASE_DURATION + RETRY * 3).await;
    assert!(current(&b).is_some(), "took over at {took_over:?}");
}

#[tokio::test(start_paused = true)]
async fn leader_that_sees_another_holder_through_its_watch_steps_down_at_once() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    sleep(Duration::from_millis(500)).await;

    let mut intruder = store.current().expect("lease");
    intruder.spec.as_mut().expect("spec").holder_identity = Some("intruder".into());
    store.put(Some(intruder));
    // Within a few milliseconds, far before the next renewal (RetryPeriod) or RenewDeadline.
    wait_leading(&a, false, Duration::from_millis(5)).await;
    assert_eq!(a.metrics().step_downs(), 1);
}

#[tokio::test(start_paused = true)]
async fn leader_that_loses_a_write_race_steps_down_at_once() {
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    a_conn.blind(true); // no watch: only the 409 can tell
    let a = leading_candidate(&a_conn, "a").await;

    let mut intruder = store.current().expect("lease");
    intruder.spec.as_mut().expect("spec").holder_identity = Some("intruder".into());
    a_conn.intrude_before_next_replace(intruder);
    let renewal_at = Instant::now() + RETRY;
    let stepped_down = wait_leading(&a, false, RETRY + Duration::from_millis(5)).await;
    assert!(stepped_down <= renewal_at + Duration::from_millis(5));
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("intruder"));
}

#[tokio::test(start_paused = true)]
async fn release_lets_a_watching_follower_take_over_immediately() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    let b = candidate(&store.connect(), "b");
    sleep(Duration::from_millis(700)).await; // B has polled once and is waiting on its watch
    let transitions = spec(&store).lease_transitions;

    let released_at = Instant::now();
    a.release().await.expect("released");
    // Much sooner than B's next poll (RetryPeriod).
    let taken_over = wait_leading(&b, true, Duration::from_millis(10)).await;
    assert!(taken_over - released_at < Duration::from_millis(10));

    let release = store
        .writes()
        .into_iter()
        .find(|lease| {
            lease
                .spec
                .as_ref()
                .is_some_and(|s| s.holder_identity.is_none())
        })
        .expect("a release write");
    let release = release.spec.expect("spec");
    assert_eq!(release.lease_duration_seconds, Some(1));
    assert_eq!(release.lease_transitions, transitions);
    let spec = spec(&store);
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, transitions.map(|t| t + 1));
}

#[tokio::test(start_paused = true)]
async fn follower_release_writes_nothing() {
    let store = MemoryLeaseStore::new();
    let _a = leading_candidate(&store.connect(), "a").await;
    let b = candidate(&store.connect(), "b");
    sleep(Duration::from_millis(700)).await;
    let writes = store.writes().len();
    b.release().await.expect("stopped");
    assert_eq!(store.writes().len(), writes);
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn expiry_is_judged_by_local_observation_and_foreign_fields_are_kept() {
    let store = MemoryLeaseStore::new();
    // Held by a crashed replica whose renewTime is long past (or skewed): that is not expiry.
    let mut old = holder_lease("old", Timestamp::UNIX_EPOCH);
    old.metadata.labels = Some([("team".to_string(), "mesh".to_string())].into());
    let spec_mut = old.spec.as_mut().expect("spec");
    spec_mut.lease_transitions = Some(3);
    spec_mut.preferred_holder = Some("b".into());
    spec_mut.strategy = Some("OldestEmulationVersion".into());
    store.put(Some(old));

    let a = candidate(&store.connect(), "a");
    sleep(LEASE_DURATION - Duration::from_millis(100)).await;
    assert!(
        current(&a).is_none(),
        "took over before LeaseDuration of local observation"
    );
    wait_leading(&a, true, RETRY).await;

    sleep(RETRY * 3).await; // a few renewals
    let lease = store.current().expect("lease");
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(
        spec.lease_transitions,
        Some(4),
        "incremented once, kept on renewals"
    );
    assert_eq!(spec.preferred_holder.as_deref(), Some("b"));
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    assert_eq!(
        lease.metadata.labels.and_then(|l| l.get("team").cloned()),
        Some("mesh".into())
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_process_waits_for_the_lease_its_earlier_process_held_to_expire() {
    // A replica crashed while leading and was restarted under the same identity: the Lease
    // still names it, and writes of the earlier process may still be on their way. The new
    // process takes the Lease as it would take anyone else's: once the record has not changed
    // for LeaseDuration, as a take-over (a new acquireTime and leaseTransitions).
    let store = MemoryLeaseStore::new();
    store.put(Some(holder_lease("a", Timestamp::now())));
    let started = Instant::now();
    let a = candidate(&store.connect(), "a");
    let leading = wait_leading(&a, true, LEASE_DURATION + RETRY).await;
    assert!(
        leading - started >= LEASE_DURATION,
        "led {:?} after starting, before the earlier process's record expired",
        leading - started
    );
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("a"));
    assert_eq!(
        spec(&store).lease_transitions,
        Some(1),
        "a new term of the same identity is a transition (a new fencing token)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_candidate_blind_for_a_while_waits_renew_deadline_before_creating_a_missing_lease() {
    // Its requests hung for 8 s (a cut): a Lease may have been created, held and deleted in
    // that time without its seeing any of it, and that holder may still act for RenewDeadline
    // after the deletion. So finding no Lease after being blind is treated as seeing it deleted.
    let store = MemoryLeaseStore::new();
    let connection = store.connect();
    connection.blind(true);
    connection.hang(true);
    let a = candidate(&connection, "a");
    sleep(Duration::from_secs(8)).await;
    connection.hang(false);
    let seen = Instant::now();
    let leading = wait_leading(&a, true, RENEW_DEADLINE + RETRY * 2).await;
    assert!(
        leading - seen >= RENEW_DEADLINE,
        "created the Lease {:?} after its first answer in 8 s",
        leading - seen
    );
}

#[tokio::test(start_paused = true)]
async fn a_deleted_lease_is_recreated_once_its_last_holder_has_stopped_acting() {
    let store = MemoryLeaseStore::new();
    store.put(Some(holder_lease("old", Timestamp::now())));
    let a = candidate(&store.connect(), "a");
    sleep(Duration::from_millis(500)).await;
    assert!(current(&a).is_none());
    store.put(None);
    let deleted = Instant::now();
    // "old" may have renewed after a last saw it, and may not know of the deletion yet: it
    // acts until RenewDeadline after its last renewal, which came before the deletion. So its
    // claim stands until RenewDeadline after a saw the deletion.
    sleep_until(deleted + RENEW_DEADLINE - Duration::from_millis(10)).await;
    assert!(
        current(&a).is_none(),
        "a waited out the deleted record's claim"
    );
    let led = wait_leading(&a, true, Duration::from_millis(20)).await;
    assert!(led >= deleted + RENEW_DEADLINE);
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_learns_of_a_deletion_late_never_leads_beside_a_follower() {
    let store = MemoryLeaseStore::new();
    let (a_conn, _, a, b) = a_leads_b_follows(&store).await;

    // The leader's watch passes nothing (within its bound) when the lease is deleted right
    // after a renewal: it learns of it at its next poll, a RetryPeriod later. The follower
    // learns at once and must not lead meanwhile.
    a_conn.freeze_watches();
    next_write(&store).await;
    store.put(None);
    let deleted = Instant::now();
    while Instant::now() < deleted + LEASE_DURATION * 2 {
        assert!(
            current(&a).is_none() || current(&b).is_none(),
            "a and b led at once {:?} after the deletion",
            Instant::now() - deleted
        );
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        a.metrics().step_downs(),
        1,
        "a stopped leading at its next poll"
    );
    let holder = spec(&store)
        .holder_identity
        .expect("the lease was re-created");
    let leader = if holder == "a" { &a } else { &b };
    assert!(current(leader).is_some(), "{holder} leads");
}

#[tokio::test(start_paused = true)]
async fn a_frozen_lease_watch_is_restarted_so_a_deletion_ends_the_term_at_once() {
    let store = MemoryLeaseStore::new();
    let (a_conn, _, a, b) = a_leads_b_follows(&store).await;
    assert!(current(&b).is_none(), "b follows");

    // The leader's watch connection stays open but passes nothing; its renewals (separate
    // requests) still work, so only the bound can find out.
    a_conn.freeze_watches();
    assert_eq!(
        LeaseTimings::default().watch_stall_bound(),
        LEASE_DURATION * 2
    );
    sleep(LEASE_DURATION * 2 + RETRY).await;
    assert!(current(&a).is_some(), "a kept renewing");
    assert_eq!(
        a.metrics().watch_stalls(),
        1,
        "a's frozen watch was restarted once"
    );
    assert_eq!(b.metrics().watch_stalls(), 0, "b saw every renewal of a");

    // Delete the lease right after a renewal, when a's next poll is as far away as it gets.
    next_write(&store).await;
    store.put(None);
    // Within a millisecond, not at a's next poll (a RetryPeriod later): the restarted watch
    // delivered the deletion, as the follower's did.
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        a.metrics().step_downs(),
        1,
        "a stopped leading at the deletion"
    );
    let leaders = [&a, &b]
        .iter()
        .filter(|handle| current(handle).is_some())
        .count();
    assert!(leaders <= 1, "at most one leader after the deletion");
}

#[tokio::test(start_paused = true)]
async fn each_acquisition_starts_a_new_term() {
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    let a = leading_candidate(&a_conn, "a").await;
    let first = current(&a).expect("leading");

    a_conn.hang(true);
    wait_leading(&a, false, RENEW_DEADLINE + RETRY).await;
    a_conn.hang(false);
    // Nobody else took it: A renews its own record and starts a new, newer term.
    wait_leading(&a, true, RETRY * 2).await;
    let second = current(&a).expect("leading");
    assert!(second.id() > first.id());
    assert_eq!(a.metrics().acquisitions(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_lost_elector_task_is_reported() {
    let store = MemoryLeaseStore::new();
    let mut a = leading_candidate(&store, "a").await;
    store.panic_next();
    let error = timeout(RETRY * 2, a.lost()).await.expect("reported");
    assert!(matches!(error, ElectorError::Panicked(_)), "{error}");
    assert!(
        current(&a).is_none(),
        "nobody believes a dead elector leads"
    );
}

#[tokio::test(start_paused = true)]
async fn leader_whose_holder_is_cleared_by_someone_else_ends_its_term_at_once() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    let first = current(&a).expect("leading");
    let mut leadership = a.leadership();
    leadership.borrow_and_update();

    let mut cleared = store.current().expect("lease");
    cleared.spec.as_mut().expect("spec").holder_identity = None;
    store.put(Some(cleared));
    // The term ends at once (a follower may be taking the free lease right now)...
    timeout(Duration::from_millis(5), leadership.changed())
        .await
        .expect("changed at once")
        .expect("alive");
    assert!(leadership.borrow_and_update().is_none());
    // ...and a new term starts only through a guarded write.
    let second = timeout(RETRY * 2, leadership.wait_for(Option::is_some))
        .await
        .expect("re-acquired")
        .expect("alive")
        .clone()
        .expect("term");
    assert!(second.id() > first.id());
}

/// A tiny deterministic generator, so that fault schedules are reproducible by seed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(start_paused = true)]
async fn three_candidates_with_random_faults_never_both_lead() {
    for seed in 1..=25u64 {
        let store = MemoryLeaseStore::new();
        let connections: Vec<_> = (0..3).map(|_| store.connect()).collect();
        let names = ["a", "b", "c"];
        let handles: Vec<_> = connections
            .iter()
            .zip(names)
            .map(|(connection, name)| candidate(connection, name))
            .collect();
        let mut random = Lcg(seed);
        let mut led = [false; 3];
        for _ in 0..2400 {
            let who = usize::try_from(random.below(3)).expect("small");
            match random.below(40) {
                0 => connections[who].hang(true),
                1 | 2 => connections[who].hang(false),
                3 => connections[who].fail_next(usize::try_from(random.below(4)).expect("small")),
                4 if random.below(4) == 0 => {
                    // Someone clears the holder (or, below, deletes the lease) by hand.
                    if let Some(mut lease) = store.current() {
                        lease.spec.as_mut().expect("spec").holder_identity = None;
                        store.put(Some(lease));
                    }
                }
                5 if random.below(8) == 0 => {
                    store.put(None);
                }
                _ => {}
            }
            sleep(Duration::from_millis(50)).await;
            let leaders: Vec<_> = (0..3).filter(|i| current(&handles[*i]).is_some()).collect();
            assert!(leaders.len() <= 1, "seed {seed}: {leaders:?} lead at once");
            for &i in &leaders {
                led[i] = true;
                assert_eq!(
                    spec(&store).holder_identity.as_deref(),
                    Some(names[i]),
                    "seed {seed}"
                );
            }
        }
        assert!(
            led.iter().filter(|l| **l).count() >= 2,
            "seed {seed}: leadership moved: {led:?}"
        );
        for connection in &connections {
            connection.hang(false);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn candidate_whose_requests_fail_at_once_after_the_lease_expired_waits_between_attempts() {
    // Found by the simulation: a follower that saw a holder whose lease then expired, and whose
    // requests all fail at once (a refused connection), retried in a loop without waiting. The
    // clock is moved by hand (a spinning task would keep paused time from advancing on its own).
    let store = MemoryLeaseStore::new();
    store.put(Some(holder_lease("gone", Timestamp::now())));
    let connection = store.connect();
    let b = candidate(&connection, "b");
    tokio::time::advance(Duration::from_millis(10)).await;
    connection.fail_next(usize::MAX);
    let step = Duration::from_millis(100);
    let mut moved = Duration::ZERO;
    while moved < LEASE_DURATION + 10 * RETRY {
        tokio::time::advance(step).await;
        moved += step;
    }
    let calls = connection.calls();
    assert!(
        calls <= 20,
        "{calls} attempts in {moved:?}: a failing candidate must wait between attempts"
    );
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(connection.calls(), calls, "attempts without time passing");
    assert!(current(&b).is_none());
}

#[tokio::test(start_paused = true)]
async fn each_term_carries_the_holder_and_transition_count_it_wrote_as_its_fencing_token() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    let first = current(&a).expect("leading");
    let token = first
        .fencing_token()
        .expect("a Lease-backed term has a token");
    assert_eq!(token.holder_identity, "a");
    assert_eq!(
        Some(token.lease_transitions),
        spec(&store).lease_transitions
    );

    let b = candidate(&store.connect(), "b");
    sleep(Duration::from_millis(700)).await;
    a.release().await.expect("released");
    wait_leading(&b, true, Duration::from_millis(10)).await;
    let second = current(&b).expect("leading");
    let next = second.fencing_token().expect("token");
    assert_eq!(next.holder_identity, "b");
    assert_eq!(next.lease_transitions, token.lease_transitions + 1);
    assert_eq!(
        next.to_string(),
        format!("b@{}", token.lease_transitions + 1)
    );
}
