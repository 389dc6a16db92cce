//! Releasing: a leader's release hands the Lease over at once to a follower watching it; a
//! follower's release makes no request; dropping the last handle stops the elector without one.

use super::*;

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
async fn follower_release_makes_no_request() {
    let store = MemoryLeaseStore::new();
    let _a = leading_candidate(&store.connect(), "a").await;
    let b_conn = store.connect();
    let b = candidate(&b_conn, "b");
    sleep(Duration::from_millis(700)).await;
    let writes = store.writes().len();
    let calls = b_conn.calls();
    b.release().await.expect("stopped");
    assert_eq!(store.writes().len(), writes);
    // Not named by the record it last read, a follower has nothing to release: it stops
    // without reading the Lease again (the release's read is for a holder).
    assert_eq!(b_conn.calls(), calls);
    assert_eq!(spec(&store).holder_identity.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_shared_handle_keeps_the_elector_and_dropping_the_last_stops_it_unreleased() {
    let store = MemoryLeaseStore::new();
    let a = leading_candidate(&store.connect(), "a").await;
    let shared = a.share();
    drop(a);
    let writes = store.writes().len();
    sleep(RETRY * 3 + Duration::from_millis(1)).await;
    assert_eq!(
        store.writes().len(),
        writes + 3,
        "the other handle keeps it renewing"
    );
    assert!(current(&shared).is_some());

    drop(shared);
    let writes = store.writes().len();
    sleep(RETRY * 3).await;
    assert_eq!(store.writes().len(), writes, "no renewal, and no release");
    assert_eq!(
        spec(&store).holder_identity.as_deref(),
        Some("a"),
        "left to expire"
    );
}
