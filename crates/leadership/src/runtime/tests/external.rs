//! Terms from an external leadership source (`ElectorHandle::external`): a replay on acquiring
//! and a periodic resync while leading, none while following; a dropped source means following.

use super::*;

#[tokio::test(start_paused = true)]
async fn terms_driven_externally_and_periodic_resync_replays_while_leading() {
    let (leadership, receiver) = watch::channel(None);
    let replays = Arc::new(AtomicU64::new(0));
    let config = RuntimeConfig {
        resync_period: Some(Duration::from_secs(60)),
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(
        config,
        app(
            |_term: &Term| (),
            {
                let replays = replays.clone();
                move |_context: &TermContext<u32, ()>| {
                    replays.fetch_add(1, Ordering::SeqCst);
                }
            },
            |_key: u32, _context: TermContext<u32, ()>| async { Ok::<_, Fenced>(Action::Done) },
        ),
    );
    let gate = runtime.gate();
    let shutdown = CancellationToken::new();
    let run: JoinHandle<_> =
        tokio::spawn(runtime.run(ElectorHandle::external(receiver), shutdown.clone()));

    sleep(Duration::from_secs(90)).await;
    assert_eq!(
        replays.load(Ordering::SeqCst),
        0,
        "no replay while following"
    );
    leadership.send_replace(Some(Term::unbounded()));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(replays.load(Ordering::SeqCst), 1, "replay on acquiring");
    sleep(Duration::from_secs(100)).await;
    assert!(replays.load(Ordering::SeqCst) >= 2, "resync while leading");
    leadership.send_replace(None);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(gate.registered_term(), None);

    shutdown.cancel();
    shuts_down(run).await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_external_leadership_source_means_following() {
    let (leadership, receiver) = watch::channel(Some(Term::unbounded()));
    let runtime = Runtime::new(RuntimeConfig::default(), idle_app());
    let gate = runtime.gate();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(ElectorHandle::external(receiver), shutdown.clone()));
    assert_registered(&gate, true, Duration::from_millis(50)).await;
    drop(leadership);
    assert_registered(&gate, false, Duration::from_millis(50)).await;
    shutdown.cancel();
    returns_cleanly_within(run, Duration::from_millis(1), "returned at once").await;
}
