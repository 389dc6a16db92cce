//! Failures: a lost elector ends the runtime with an error; a panicking reconcile ends it
//! visibly, and releases the Lease so a standby takes over at once; work in flight when its
//! term is lost is fenced at its next write, and its retry dropped.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_lost_elector_ends_the_runtime_with_an_error() {
    let store = MemoryLeaseStore::new();
    let connection = store.connect();
    let runtime = Runtime::new(RuntimeConfig::default(), idle_app());
    let elector = LeaseElector::new(lease_config("a"), connection.clone()).spawn();
    connection.panic_next();
    let result = timeout(
        Duration::from_secs(5),
        runtime.run(elector, CancellationToken::new()),
    )
    .await
    .expect("returned");
    assert!(
        matches!(result, Err(RuntimeError::ElectorLost(_))),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn in_flight_work_of_a_lost_term_is_fenced_at_its_next_write() {
    let store = MemoryLeaseStore::new();
    let proceed = Arc::new(Notify::new());
    let outcome: Arc<Mutex<Option<Result<(), Fenced>>>> = Arc::default();
    let runtime = Runtime::new(
        RuntimeConfig::default(),
        replaying_key_1({
            let (proceed, outcome) = (proceed.clone(), outcome.clone());
            move |_key, context: TermContext<u32, ()>| {
                let (proceed, outcome) = (proceed.clone(), outcome.clone());
                async move {
                    if outcome.lock().is_some() {
                        return Ok(Action::Done);
                    }
                    proceed.notified().await;
                    let result = context.fence().check();
                    *outcome.lock() = Some(result.clone());
                    result.map(|()| Action::Done)
                }
            }
        }),
    );
    let (queue, gate, fenced) = (runtime.queue(), runtime.gate(), runtime.fence_metrics());
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(elector(&store, "a"), shutdown.clone()));
    assert!(eventually(Duration::from_millis(100), || queue.in_flight() == 1).await);
    let term = gate.registered_term().expect("leading");

    store.put(Some(with_holder(&store, Some("b"))));
    assert_registered(&gate, false, Duration::from_millis(50)).await;
    let retries = queue.retries();
    proceed.notify_one();
    assert!(eventually(Duration::from_millis(50), || outcome.lock().is_some()).await);
    assert_eq!(*outcome.lock(), Some(Err(Fenced::TermEnded { term })));
    assert_eq!(fenced.fenced(), 1);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        queue.depth() + queue.waiting(),
        0,
        "no retry queued for the lost term"
    );
    assert_eq!(
        queue.retries(),
        retries,
        "the lost term's retry was ignored"
    );
    shutdown.cancel();
    shuts_down(run).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_ends_the_runtime_visibly() {
    let (_leadership, receiver) = watch::channel(Some(Term::unbounded()));
    let runtime = Runtime::new(RuntimeConfig::default(), panicking_app());
    let elector = ElectorHandle::external(receiver);
    ends_with_a_failed_worker(runtime, elector, CancellationToken::new()).await;
}

/// A panicking reconcile used to end `run` without releasing the Lease: a standby then waited a
/// full LeaseDuration (15 s by default) for it to expire.
#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_releases_the_lease_so_a_standby_takes_over_at_once() {
    let store = MemoryLeaseStore::new();
    let leader = elector(&store, "a");
    let mut leading = leader.leadership();
    within_bound("a leads", leading.wait_for(Option::is_some))
        .await
        .expect("a leads");
    let standby = elector(&store, "b");
    sleep(Duration::from_millis(700)).await; // b has polled and watches the Lease
    let other_key_done = Arc::new(AtomicU64::new(0));
    let done = other_key_done.clone();
    let runtime = Runtime::new(
        RuntimeConfig::builder().workers(2).build().expect("valid"),
        app(
            |_term: &Term| (),
            |context: &TermContext<u32, ()>| {
                context.enqueue(1);
                context.enqueue(2);
            },
            move |key: u32, _context: TermContext<u32, ()>| {
                let done = done.clone();
                async move {
                    if key == 1 {
                        panic!("bug in reconcile");
                    }
                    // The other worker's in-flight reconcile finishes before the release.
                    sleep(Duration::from_millis(50)).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Fenced>(Action::Done)
                }
            },
        ),
    );
    ends_with_a_failed_worker(runtime, leader, CancellationToken::new()).await;
    let returned_at = Instant::now();
    assert_eq!(other_key_done.load(Ordering::SeqCst), 1);
    leads_within_100_ms(
        &standby,
        "the standby takes over well within a LeaseDuration",
    )
    .await;
    assert_eq!(holder(&store).as_deref(), Some("b"));
    println!(
        "take-over after the panic: {:?} after run returned",
        Instant::now() - returned_at
    );
}
