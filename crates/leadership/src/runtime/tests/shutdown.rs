//! Shutdown: drain, then release; leave the Lease to expire while work still runs; a follower,
//! a lost term and a term still preparing end at once. In paused time on the in-memory Lease.

use super::*;

#[tokio::test(start_paused = true)]
async fn shutdown_drains_queued_and_in_flight_work_then_releases_the_lease() {
    let store = MemoryLeaseStore::new();
    /// Per processed key: the lease holder and the fence's answer when it finished.
    type Done = Vec<(u32, Option<String>, Result<(), Fenced>)>;
    let done: Arc<Mutex<Done>> = Arc::default();
    let config = RuntimeConfig {
        workers: std::num::NonZeroUsize::MIN,
        drain_timeout: Duration::from_secs(60),
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(
        config,
        app(
            |_term: &Term| (),
            |context: &TermContext<u32, ()>| {
                for key in 0..15 {
                    context.enqueue(key);
                }
            },
            {
                let (store, done) = (store.clone(), done.clone());
                move |key: u32, context: TermContext<u32, ()>| {
                    let (store, done) = (store.clone(), done.clone());
                    async move {
                        sleep(Duration::from_secs(1)).await;
                        let fence = context.fence().check();
                        done.lock().push((key, holder(&store), fence));
                        Ok::<_, Fenced>(Action::Done)
                    }
                }
            },
        ),
    );
    let gate = runtime.gate();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(elector(&store, "a"), shutdown.clone()));
    assert_registered(&gate, true, Duration::from_millis(100)).await;

    let started = Instant::now();
    shutdown.cancel();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        gate.dispatch(|context| context.enqueue(99)),
        None,
        "intake stopped"
    );
    shuts_down(run).await;

    // 15 s of work: longer than RenewDeadline, so the lease was renewed while draining.
    assert!(Instant::now() - started >= Duration::from_secs(14));
    let done = done.lock();
    assert_eq!(done.len(), 15, "every queued key was processed");
    for (key, holder, fence) in done.iter() {
        assert_eq!(
            holder.as_deref(),
            Some("a"),
            "key {key} ran after the release"
        );
        assert_eq!(fence, &Ok(()), "key {key} was fenced while draining");
    }
    assert_eq!(holder(&store), None, "released after the drain");
}

#[tokio::test(start_paused = true)]
async fn shutdown_leaves_the_lease_to_expire_when_work_still_hangs_at_the_drain_timeout() {
    let store = MemoryLeaseStore::new();
    let config = RuntimeConfig {
        drain_timeout: Duration::from_secs(3),
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(
        config,
        replaying_key_1(|_key, _context| async {
            std::future::pending::<()>().await;
            Ok::<_, Fenced>(Action::Done)
        }),
    );
    let queue = runtime.queue();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(elector(&store, "a"), shutdown.clone()));
    assert!(eventually(Duration::from_millis(100), || queue.in_flight() == 1).await);

    let started = Instant::now();
    shutdown.cancel();
    shuts_down(run).await;
    assert_eq!(Instant::now() - started, Duration::from_secs(3));
    // The hanging call may still land: a standby waits for the Lease to expire, as after a
    // crash, rather than start before it.
    assert_eq!(holder(&store).as_deref(), Some("a"), "not released");
}

#[tokio::test(start_paused = true)]
async fn a_follower_shuts_down_at_once_and_writes_nothing() {
    let store = MemoryLeaseStore::new();
    let leader = elector(&store, "b");
    let mut leading = leader.leadership();
    within_bound("b leads", leading.wait_for(Option::is_some))
        .await
        .expect("b leads");
    let writes = store.writes().len();

    let runtime = Runtime::new(RuntimeConfig::default(), idle_app());
    let shutdown = CancellationToken::new();
    let follower = elector(&store, "a");
    let run = tokio::spawn(runtime.run(follower, shutdown.clone()));
    sleep(Duration::from_millis(500)).await;
    let writes_before = store.writes().len();
    let started = Instant::now();
    shutdown.cancel();
    shuts_down(run).await;
    assert_eq!(Instant::now(), started, "returned at once");
    assert_eq!(store.writes().len(), writes_before);
    assert!(writes_before <= writes + 1, "only b's renewals");
    assert_eq!(holder(&store).as_deref(), Some("b"));
    drop(leader);
}

/// A runtime on a leadership `receiver` whose replay queues key 1 and whose reconcile of it
/// hangs (a write on a dead connection), started: its task, and its shutdown token once the
/// reconcile has begun.
async fn running_with_a_hanging_write(
    receiver: watch::Receiver<Option<Term>>,
) -> (JoinHandle<Result<(), RuntimeError>>, CancellationToken) {
    let started = Arc::new(Notify::new());
    let runtime = Runtime::new(
        RuntimeConfig::default(),
        replaying_key_1({
            let started = started.clone();
            move |_key, _context| {
                let started = started.clone();
                async move {
                    started.notify_one();
                    std::future::pending::<()>().await;
                    Ok::<_, Fenced>(Action::Done)
                }
            }
        }),
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(ElectorHandle::external(receiver), shutdown.clone()));
    within_bound("the reconcile starts", started.notified()).await;
    (run, shutdown)
}

#[tokio::test(start_paused = true)]
async fn shutdown_after_the_term_is_lost_does_not_wait_for_hanging_work() {
    let (leadership, receiver) = watch::channel(Some(Term::unbounded()));
    let (run, shutdown) = running_with_a_hanging_write(receiver).await;

    // SIGTERM, and the term is lost (renew deadline passed) while the write hangs: nothing of
    // that term can write any more, so the exit must not wait for the drain deadline (10 s).
    shutdown.cancel();
    leadership.send_replace(None);
    returns_cleanly_within(
        run,
        Duration::from_secs(1),
        "returned well before the drain deadline",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_of_a_follower_whose_lost_term_left_a_write_hanging_does_not_drain() {
    let (leadership, receiver) = watch::channel(Some(Term::unbounded()));
    let (run, shutdown) = running_with_a_hanging_write(receiver).await;

    // The term is lost first; the replica follows with that write still in flight. Its
    // shutdown has no term to drain for: it must not wait for the drain deadline either.
    leadership.send_replace(None);
    sleep(Duration::from_millis(10)).await;
    shutdown.cancel();
    returns_cleanly_within(
        run,
        Duration::from_secs(1),
        "a follower returns well before the drain deadline",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_while_preparing_releases_at_once() {
    let (_leadership, receiver) = watch::channel(Some(Term::unbounded()));
    let runtime = Runtime::new(
        RuntimeConfig::default(),
        prepared_on(Arc::new(Notify::new()), Arc::new(AtomicU64::new(0))),
    );
    let gate = runtime.gate();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(ElectorHandle::external(receiver), shutdown.clone()));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(gate.registered_term(), None);
    shutdown.cancel();
    returns_cleanly_within(
        run,
        Duration::from_millis(1),
        "nothing to drain: returned at once",
    )
    .await;
}
