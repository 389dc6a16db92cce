//! A term's preparation (`Reconciler::prepare_term`): the term registers and replays only once
//! it is done, and a term lost meanwhile never starts; the prepare timeout's default.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_term_registers_and_replays_only_once_its_preparation_is_done() {
    let (leadership, receiver) = watch::channel(None);
    let ready = Arc::new(Notify::new());
    let replays = Arc::new(AtomicU64::new(0));
    let runtime = Runtime::new(
        RuntimeConfig::default(),
        prepared_on(ready.clone(), replays.clone()),
    );
    let gate = runtime.gate();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(ElectorHandle::external(receiver), shutdown.clone()));

    // A term lost while preparing never registers: its preparation is dropped.
    leadership.send_replace(Some(Term::unbounded()));
    sleep(Duration::from_secs(5)).await;
    assert_eq!(gate.registered_term(), None, "still preparing");
    leadership.send_replace(None);
    sleep(Duration::from_millis(1)).await;
    ready.notify_waiters();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(gate.registered_term(), None, "the lost term never starts");
    assert_eq!(replays.load(Ordering::SeqCst), 0);

    // The next term starts once prepared.
    let term = Term::unbounded();
    leadership.send_replace(Some(term.clone()));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(gate.registered_term(), None, "still preparing");
    ready.notify_waiters();
    assert!(
        eventually(Duration::from_millis(50), || gate.registered_term()
            == Some(term.id()))
        .await
    );
    assert_eq!(
        replays.load(Ordering::SeqCst),
        1,
        "replayed after the preparation"
    );

    shutdown.cancel();
    shuts_down(run).await;
}

#[test]
fn prepare_timeout_defaults_to_30_seconds() {
    assert_eq!(
        RuntimeConfig::default().prepare_timeout,
        Duration::from_secs(30)
    );
}
