//! Acquiring: a lone candidate creates the Lease; a held Lease is taken once its record has not
//! changed for LeaseDuration in local observation (a crashed holder's, a restarted process's
//! own), a deleted or unseen one once its last holder can no longer act; a failing candidate
//! waits between attempts; each acquisition starts a new term with its fencing token.

use super::*;

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
async fn a_candidate_writes_and_keeps_the_timings_it_was_given() {
    let secs = Duration::from_secs;
    let timings = LeaseTimings::new(secs(30), secs(20), secs(5)).expect("valid timings");
    let config = |identity| LeaseConfig::new("lease", "ns", identity, timings).expect("valid");
    let store = MemoryLeaseStore::new();
    let a = LeaseElector::new(config("a"), store.connect()).spawn();
    wait_leading(&a, true, Duration::from_millis(10)).await;
    assert_eq!(spec(&store).lease_duration_seconds, Some(30));
    let writes = store.writes().len();
    sleep(secs(20) + Duration::from_millis(1)).await;
    assert_eq!(store.writes().len(), writes + 4, "renewed every 5 s");

    // A follower takes the Lease over 30 s after it last changed, not 15.
    let b = LeaseElector::new(config("b"), store.connect()).spawn();
    sleep(Duration::from_millis(1)).await;
    drop(a);
    let last_renewed = Instant::now();
    let led = wait_leading(&b, true, secs(40)).await;
    assert!(
        led >= last_renewed + secs(25) && led <= last_renewed + secs(31),
        "b led {:?} after a's last renewal",
        led - last_renewed
    );
}

#[tokio::test(start_paused = true)]
async fn the_metrics_taken_before_spawning_count_what_the_spawned_elector_does() {
    let config = LeaseConfig::new("lease", "ns", "a", LeaseTimings::default());
    let elector = LeaseElector::new(config.expect("valid config"), MemoryLeaseStore::new());
    let metrics = elector.metrics();
    let a = elector.spawn();
    wait_leading(&a, true, Duration::from_millis(10)).await;
    assert_eq!(metrics.acquisitions(), 1);
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
    // "old" may have renewed after a last saw it, and may not know of the deletion yet: it
    // acts until RenewDeadline after its last renewal, which came before the deletion. So its
    // claim stands until RenewDeadline after a saw the deletion.
    deletion_waited_out(&store, &a, Duration::from_millis(20)).await;
}

#[tokio::test(start_paused = true)]
async fn without_the_deleted_lease_wait_a_deleted_lease_is_recreated_at_once() {
    let store = MemoryLeaseStore::new();
    store.put(Some(holder_lease("old", Timestamp::now())));
    let config = LeaseConfig::new("lease", "ns", "a", LeaseTimings::default())
        .expect("valid config")
        .with_safeguards(crate::Safeguards::default().without_deleted_lease_wait());
    let a = LeaseElector::new(config, store.connect()).spawn();
    sleep(Duration::from_millis(500)).await;
    assert!(current(&a).is_none());
    store.put(None);
    // The switch the simulation turns off to show the wait is needed: it does switch it off.
    wait_leading(&a, true, Duration::from_millis(20)).await;
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
