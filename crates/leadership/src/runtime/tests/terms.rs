//! Terms shared by several runtimes under one Lease, and terms given up, in paused time on the
//! in-memory Lease.

use std::sync::atomic::AtomicBool;

use super::*;

/// What one runtime saw: the terms it built state for, its replays, and each reconcile as
/// (the term its state was built for, the term of its fence).
#[derive(Debug, Default)]
struct Seen {
    started: Mutex<Vec<u64>>,
    replays: AtomicU64,
    reconciled: Mutex<Vec<(u64, u64)>>,
}

/// A runtime whose per-term state is the id of the term it was built for; its replay queues one
/// key, and its reconcile writes (fenced) after `work` and records what it saw.
fn recording_runtime(work: Duration) -> (Runtime<u32, u64, Fenced>, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let (started, replayed, reconciled) = (seen.clone(), seen.clone(), seen.clone());
    let runtime = Runtime::new(
        RuntimeConfig::default(),
        app(
            move |term: &Term| {
                started.started.lock().push(term.id());
                term.id()
            },
            move |context: &TermContext<u32, u64>| {
                replayed.replays.fetch_add(1, Ordering::SeqCst);
                context.enqueue(1);
            },
            move |_key: u32, context: TermContext<u32, u64>| {
                let seen = reconciled.clone();
                async move {
                    sleep(work).await;
                    context.fence().check()?;
                    let entry = (**context.state(), context.fence().term().id());
                    seen.reconciled.lock().push(entry);
                    Ok::<_, Fenced>(Action::Done)
                }
            },
        ),
    );
    (runtime, seen)
}

/// The term `leadership` shows, once it shows one.
async fn first_term(leadership: &mut Leadership) -> Term {
    within_bound("a term", leadership.wait_for(Option::is_some))
        .await
        .expect("leadership")
        .clone()
        .expect("leading")
}

/// Two handles on one elector of "a" (one per runtime), once "a" leads.
async fn two_handles_leading(store: &MemoryLeaseStore) -> (ElectorHandle, ElectorHandle) {
    let first = elector(store, "a");
    let second = first.share();
    within_bound("a leads", first.leadership().wait_for(Option::is_some))
        .await
        .expect("a leads");
    (first, second)
}

#[tokio::test(start_paused = true)]
async fn two_runtimes_under_one_lease_stop_at_a_terms_end_and_start_fresh_at_the_next() {
    let store = MemoryLeaseStore::new();
    let first = elector(&store, "a");
    let second = first.share();
    let mut leadership = first.leadership();
    let term1 = first_term(&mut leadership).await;
    let (slices, slices_seen) = recording_runtime(Duration::from_millis(10));
    let (routes, routes_seen) = recording_runtime(Duration::from_millis(10));
    let (slices_gate, routes_gate) = (slices.gate(), routes.gate());
    let shutdown = CancellationToken::new();
    let slices_run = tokio::spawn(slices.run(first, shutdown.clone()));
    let routes_run = tokio::spawn(routes.run(second, shutdown.clone()));
    let both_in = |term: Option<u64>| {
        let (slices_gate, routes_gate) = (slices_gate.clone(), routes_gate.clone());
        move || slices_gate.registered_term() == term && routes_gate.registered_term() == term
    };
    assert!(eventually(Duration::from_millis(100), both_in(Some(term1.id()))).await);

    // The term ends (another holder takes the Lease): both runtimes stop it.
    store.put(Some(with_holder(&store, Some("b"))));
    assert!(eventually(Duration::from_millis(50), both_in(None)).await);

    // The next term: both start it with fresh state and replay.
    store.put(Some(with_holder(&store, None)));
    let term2 = within_bound(
        "a new term",
        leadership.wait_for(|term| term.as_ref().is_some_and(|term| term != &term1)),
    )
    .await
    .expect("leadership")
    .clone()
    .expect("a leads again");
    assert!(eventually(Duration::from_millis(100), both_in(Some(term2.id()))).await);
    for seen in [&slices_seen, &routes_seen] {
        assert!(
            eventually(Duration::from_millis(100), || seen.reconciled.lock().len()
                == 2)
            .await
        );
        assert_eq!(*seen.started.lock(), vec![term1.id(), term2.id()]);
        assert_eq!(seen.replays.load(Ordering::SeqCst), 2);
        assert_eq!(
            *seen.reconciled.lock(),
            vec![(term1.id(), term1.id()), (term2.id(), term2.id())],
            "each term's work ran with that term's fresh state"
        );
    }

    shutdown.cancel();
    shuts_down(slices_run).await;
    shuts_down(routes_run).await;
    assert_eq!(holder(&store), None, "released once both runtimes stopped");
}

#[tokio::test(start_paused = true)]
async fn a_shared_lease_is_released_only_once_every_runtime_has_drained() {
    let store = MemoryLeaseStore::new();
    let (first, second) = two_handles_leading(&store).await;
    let (quick, _) = recording_runtime(Duration::from_millis(10));
    let (slow, slow_seen) = recording_runtime(Duration::from_secs(2));
    let shutdown = CancellationToken::new();
    let quick_run = tokio::spawn(quick.run(first, shutdown.clone()));
    let slow_run = tokio::spawn(slow.run(second, shutdown.clone()));
    sleep(Duration::from_millis(100)).await; // both started the term; the slow one is writing
    shutdown.cancel();

    shuts_down(quick_run).await;
    assert_eq!(
        holder(&store).as_deref(),
        Some("a"),
        "still held: the other runtime is draining"
    );
    shuts_down(slow_run).await;
    assert_eq!(
        slow_seen.reconciled.lock().len(),
        1,
        "its write passed the fence"
    );
    assert_eq!(holder(&store), None, "released after the last drain");
}

/// With several runtimes under one Lease, a panicking reconcile in one of them must not leave
/// the others leading beside a released (or still held) Lease: the term is given up for all,
/// and a standby takes over at once.
#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_ends_the_term_for_every_runtime_under_the_lease() {
    let store = MemoryLeaseStore::new();
    let (first, second) = two_handles_leading(&store).await;
    let standby = elector(&store, "b");
    sleep(Duration::from_millis(700)).await; // b has polled and watches the Lease
    let panicking = Runtime::new(RuntimeConfig::default(), panicking_app());
    let (healthy, _) = recording_runtime(Duration::from_millis(10));
    let healthy_gate = healthy.gate();
    let shutdown = CancellationToken::new();
    let healthy_run = tokio::spawn(healthy.run(second, shutdown.clone()));
    ends_with_a_failed_worker(panicking, first, shutdown.clone()).await;
    leads_within_100_ms(&standby, "the standby takes over at once").await;
    assert_eq!(holder(&store).as_deref(), Some("b"));
    assert_eq!(
        healthy_gate.registered_term(),
        None,
        "the other runtime follows"
    );

    shutdown.cancel();
    shuts_down(healthy_run).await;
    assert_eq!(holder(&store).as_deref(), Some("b"), "b's Lease untouched");
}

/// [`Prepared`] whose first term's preparation never finishes (a cache that never catches up)
/// and whose later ones finish at once.
fn stuck_once(
    replays: Arc<AtomicU64>,
) -> impl Reconciler<Key = u32, TermState = (), Error = Fenced> {
    let stuck = AtomicBool::new(true);
    Prepared {
        prepare: move || {
            let stuck = stuck.swap(false, Ordering::SeqCst);
            async move {
                if stuck {
                    std::future::pending::<()>().await;
                }
            }
        },
        replays,
    }
}

/// A preparation that never finishes used to hold the Lease forever with nothing published;
/// then it ended the process. Now the term is given up in-process: the Lease is released (a
/// standby leads at once), the give-up is counted, and the replica follows, competing again only
/// after LeaseDuration.
#[tokio::test(start_paused = true)]
async fn a_preparation_past_the_prepare_timeout_gives_the_term_up_and_competes_again_later() {
    let store = MemoryLeaseStore::new();
    let leader = elector(&store, "a");
    let metrics = leader.metrics();
    let mut leading = leader.leadership();
    within_bound("a leads", leading.wait_for(Option::is_some))
        .await
        .expect("a leads");
    let acquired_at = Instant::now();
    let standby = elector(&store, "b");
    let replays = Arc::new(AtomicU64::new(0));
    let runtime = Runtime::new(
        RuntimeConfig::builder()
            .prepare_timeout(Duration::from_secs(5))
            .build()
            .expect("valid"),
        stuck_once(replays.clone()),
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime.run(leader, shutdown.clone()));

    // Given up at the prepare timeout: the standby leads at once; `a` keeps running.
    let mut standby_leading = standby.leadership();
    within_bound(
        "the standby takes over",
        standby_leading.wait_for(Option::is_some),
    )
    .await
    .expect("the standby takes over");
    let given_up_at = Instant::now();
    assert!(given_up_at - acquired_at >= Duration::from_secs(5));
    assert!(given_up_at - acquired_at < Duration::from_secs(5) + Duration::from_millis(100));
    assert_eq!(holder(&store).as_deref(), Some("b"));
    assert_eq!(metrics.terms_given_up(), 1);
    assert_eq!(metrics.step_downs(), 0, "a give-up is not a step-down");
    assert_eq!(replays.load(Ordering::SeqCst), 0, "never replayed");
    assert!(leading.borrow().is_none());
    assert!(!run.is_finished(), "the runtime follows");

    // The standby leaves at once; `a` holds off for LeaseDuration after the give-up...
    standby.release().await.expect("released");
    let lease_duration = LeaseTimings::default().lease_duration();
    sleep_until(given_up_at + lease_duration - Duration::from_millis(100)).await;
    assert!(leading.borrow().is_none(), "holding off");
    assert_eq!(holder(&store), None);
    // ...then competes again, and its next term starts and replays.
    timeout(
        LeaseTimings::default().retry_period() + Duration::from_millis(200),
        leading.wait_for(Option::is_some),
    )
    .await
    .expect("competes again after the hold-off")
    .expect("leadership");
    assert!(
        eventually(Duration::from_millis(100), || replays
            .load(Ordering::SeqCst)
            == 1)
        .await
    );
    assert_eq!(metrics.terms_given_up(), 1);

    shutdown.cancel();
    shuts_down(run).await;
    assert_eq!(holder(&store), None);
}

#[tokio::test(start_paused = true)]
async fn giving_up_a_term_that_is_already_over_does_nothing() {
    let store = MemoryLeaseStore::new();
    let leader = elector(&store, "a");
    let metrics = leader.metrics();
    let mut leading = leader.leadership();
    let term1 = first_term(&mut leading).await;
    store.put(Some(with_holder(&store, Some("b"))));
    within_bound("a steps down", leading.wait_for(Option::is_none))
        .await
        .expect("a steps down");
    store.put(Some(with_holder(&store, None)));
    within_bound("a leads a new term", leading.wait_for(Option::is_some))
        .await
        .expect("a leads a new term");

    leader.give_up(&term1);
    sleep(Duration::from_secs(1)).await;
    assert!(leading.borrow().is_some(), "the new term goes on");
    assert_eq!(holder(&store).as_deref(), Some("a"));
    assert_eq!(metrics.terms_given_up(), 0);
    leader.release().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn every_shared_handle_learns_that_the_elector_was_lost() {
    let store = MemoryLeaseStore::new();
    let connection = store.connect();
    let mut first = LeaseElector::new(lease_config("a"), connection.clone()).spawn();
    let mut second = first.share();
    within_bound("a leads", first.leadership().wait_for(Option::is_some))
        .await
        .expect("a leads");
    connection.panic_next(); // the next renewal panics the elector task
    let (first_lost, second_lost) = timeout(Duration::from_secs(5), async {
        tokio::join!(first.lost(), second.lost())
    })
    .await
    .expect("both learn of it");
    assert!(
        matches!(first_lost, ElectorError::Panicked(_)),
        "{first_lost:?}"
    );
    assert!(
        matches!(second_lost, ElectorError::Panicked(_)),
        "{second_lost:?}"
    );
    assert!(
        first.leadership().borrow().is_none(),
        "nobody believes it leads"
    );
    assert!(
        second.release().await.is_err(),
        "not the last handle: reports the loss"
    );
    assert!(first.release().await.is_err(), "the last: reports the loss");
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_stops_with_work_still_running_keeps_a_shared_lease_from_being_released() {
    let store = MemoryLeaseStore::new();
    let (first, second) = two_handles_leading(&store).await;
    let (quick, _) = recording_runtime(Duration::from_millis(10));
    // Its reconcile outlasts the drain timeout (10 s): a call hanging on the wire.
    let (hanging, _) = recording_runtime(Duration::from_secs(3_600));
    let hanging_queue = hanging.queue();
    let (stop_quick, stop_hanging) = (CancellationToken::new(), CancellationToken::new());
    let quick_run = tokio::spawn(quick.run(first, stop_quick.clone()));
    let hanging_run = tokio::spawn(hanging.run(second, stop_hanging.clone()));
    assert!(
        eventually(Duration::from_millis(100), || hanging_queue.in_flight()
            == 1)
        .await
    );

    // The hanging runtime stops first (at its drain timeout), then the other releases its
    // handle last: the Lease is still not released.
    stop_hanging.cancel();
    shuts_down(hanging_run).await;
    assert_eq!(holder(&store).as_deref(), Some("a"), "still held");
    stop_quick.cancel();
    shuts_down(quick_run).await;
    assert_eq!(
        holder(&store).as_deref(),
        Some("a"),
        "left to expire: the hanging work may still write"
    );
    let renewals = store.writes().len();
    sleep(Duration::from_secs(30)).await;
    assert_eq!(
        store.writes().len(),
        renewals,
        "the elector renews nothing more"
    );
}
