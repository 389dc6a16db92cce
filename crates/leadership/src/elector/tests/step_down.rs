//! Renewing and stepping down: failed, hanging or slow renewals within RenewDeadline keep the
//! term; no renewal for RenewDeadline, another holder (seen through the watch, a lost write
//! race, a cleared holder), a deletion (learnt late, or through a restarted frozen watch) or a
//! lost elector task end it.

use super::*;

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
async fn a_renewal_that_hangs_until_the_step_down_counts_as_one_renew_failure() {
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    let a = leading_candidate(&a_conn, "a").await;
    a_conn.hang(true);
    wait_leading(&a, false, RENEW_DEADLINE + RETRY).await;
    // Counted when it outlasted RetryPeriod, and not again when the step-down cut it.
    assert_eq!(a.metrics().renew_failures(), 1);
    assert_eq!(a.metrics().step_downs(), 1);
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
async fn a_leader_whose_lease_is_deleted_steps_down_and_re_creates_it_at_its_next_poll() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    let first = current(&a).expect("leading");
    store.put(None);
    wait_leading(&a, false, Duration::from_millis(1)).await;
    // The record a last saw named a, and a led: nobody else's claim can run, so a need not
    // wait out RenewDeadline as a follower must.
    wait_leading(&a, true, RETRY + Duration::from_millis(10)).await;
    assert_ne!(
        current(&a).map(|term| term.id()),
        Some(first.id()),
        "a new term"
    );
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn a_former_leader_still_named_by_a_deleted_lease_waits_out_a_claim_it_may_not_have_seen() {
    // Its renewals failed until its term ended; the last record it saw still names it. Someone
    // may have taken the Lease since, unseen, and may still act (simulation seed 779): a waits
    // RenewDeadline from the deletion, as any follower does.
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    let a = leading_candidate(&a_conn, "a").await;
    a_conn.fail_next(1_000);
    wait_leading(&a, false, RENEW_DEADLINE + RETRY).await;
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("a"));
    a_conn.fail_next(0);
    deletion_waited_out(&store, &a, RETRY + Duration::from_millis(20)).await;
}

#[tokio::test(start_paused = true)]
async fn a_deletion_watched_after_our_create_is_confirmed_by_a_read_and_keeps_the_term() {
    // A watch delivers events in order, so an event from before our own write can arrive after
    // the write returned. Here another party creates and deletes the lease while a's create is
    // on its way; a's watch delivers that deletion once a leads. The record a wrote since still
    // names it: one read confirms that, and the term goes on.
    let store = MemoryLeaseStore::new();
    let a_conn = store.connect();
    a_conn.ordered_watches(true);
    let latency = Duration::from_millis(100);
    a_conn.latency(latency);
    let a = candidate(&a_conn, "a");

    // a's get answers at 100 ms (no lease); its create is served at 200 ms.
    sleep(latency + latency / 2).await;
    store.put(Some(holder_lease("x", Timestamp::now())));
    store.put(None);
    wait_leading(&a, true, latency).await;
    let term = current(&a).expect("leading");

    // The deletion comes next on a's watch: a reads the lease (100 ms) instead of stepping down.
    sleep(latency * 2).await;
    assert_eq!(a_conn.calls(), 3, "get, create, and the confirming get");
    assert_eq!(a.metrics().step_downs(), 0, "the read showed a as holder");
    sleep(RETRY * 3).await;
    assert_eq!(current(&a), Some(term), "the same term goes on");
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("a"));
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
