//! Runtime tests: the elector, gate, queue and workers together, in paused time.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

mod external;
mod failures;
mod fresh_state;
mod prepare;
mod shutdown;
mod terms;

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
};

use k8s_openapi::api::coordination::v1::Lease;
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::{sleep, timeout},
};

use super::*;
use crate::{
    elector::{LeaseConfig, LeaseElector, LeaseTimings},
    fence::Fenced,
    store::MemoryLeaseStore,
};

fn lease_config(identity: &str) -> LeaseConfig {
    LeaseConfig::new("lease", "ns", identity, LeaseTimings::default()).expect("valid config")
}

fn elector(store: &MemoryLeaseStore, identity: &str) -> ElectorHandle {
    LeaseElector::new(lease_config(identity), store.connect()).spawn()
}

/// How long a test waits for a change of leadership that must come. Generous, because paused
/// time makes it cost nothing; a bound at all, because a wait that never ends would otherwise
/// hang the tests in real time (the electors' timers keep paused time advancing) instead of
/// failing them.
const LEADERSHIP_WAIT: Duration = Duration::from_secs(30);

/// `wait`, failing the test with `what` if it has not ended within [`LEADERSHIP_WAIT`].
async fn within_bound<T>(what: &str, wait: impl Future<Output = T>) -> T {
    timeout(LEADERSHIP_WAIT, wait)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {LEADERSHIP_WAIT:?}"))
}

/// Marks the types the closures of [`Closures`] produce and take (no values held).
type Types<T> = std::marker::PhantomData<fn() -> T>;

/// The three parts of a [`Reconciler`] given as closures, so each test shows its app inline.
struct Closures<F, P, R, Fut, K, S> {
    start_term: F,
    replay: P,
    reconcile: R,
    _types: Types<(Fut, K, S)>,
}

fn app<F, P, R, Fut, K, S, E>(
    start_term: F,
    replay: P,
    reconcile: R,
) -> Closures<F, P, R, Fut, K, S>
where
    F: Fn(&Term) -> S + Send + Sync + 'static,
    P: Fn(&TermContext<K, S>) + Send + Sync + 'static,
    R: Fn(K, TermContext<K, S>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    Closures {
        start_term,
        replay,
        reconcile,
        _types: std::marker::PhantomData,
    }
}

impl<F, P, R, Fut, K, S, E> Reconciler for Closures<F, P, R, Fut, K, S>
where
    K: QueueKey,
    S: Send + Sync + 'static,
    E: std::fmt::Display + Send + 'static,
    F: Fn(&Term) -> S + Send + Sync + 'static,
    P: Fn(&TermContext<K, S>) + Send + Sync + 'static,
    R: Fn(K, TermContext<K, S>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    type Key = K;
    type TermState = S;
    type Error = E;

    fn start_term(&self, term: &Term) -> S {
        (self.start_term)(term)
    }

    fn replay(&self, context: &TermContext<K, S>) {
        (self.replay)(context)
    }

    fn reconcile(
        &self,
        key: K,
        context: TermContext<K, S>,
    ) -> impl Future<Output = Result<Action, E>> + Send + 'static {
        (self.reconcile)(key, context)
    }
}

fn holder(store: &MemoryLeaseStore) -> Option<String> {
    store
        .current()
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.holder_identity)
        .filter(|holder| !holder.is_empty())
}

fn with_holder(store: &MemoryLeaseStore, holder: Option<&str>) -> Lease {
    let mut lease = store.current().expect("lease exists");
    lease.spec.as_mut().expect("spec").holder_identity = holder.map(str::to_string);
    lease
}

async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        sleep(Duration::from_millis(10)).await;
    }
    condition()
}

/// Asserts that within `within` `gate` has a term registered (`registered`) or none.
async fn assert_registered<K: QueueKey, S: Send + Sync + 'static>(
    gate: &Gate<K, S>,
    registered: bool,
    within: Duration,
) {
    assert!(
        eventually(within, || gate.registered_term().is_some() == registered).await,
        "registered term: {:?}",
        gate.registered_term()
    );
}

/// Waits for the runtime's task `run` to return `Ok` within `within`; `what` says why it must.
async fn returns_cleanly_within(
    run: JoinHandle<Result<(), RuntimeError>>,
    within: Duration,
    what: &str,
) {
    timeout(within, run)
        .await
        .expect(what)
        .expect("task")
        .expect("clean shutdown");
}

/// Waits for the runtime's task `run` to return `Ok` once its shutdown began, failing the test
/// after [`LEADERSHIP_WAIT`] (a runtime that never returns fails the test instead of hanging it).
async fn shuts_down(run: JoinHandle<Result<(), RuntimeError>>) {
    returns_cleanly_within(
        run,
        LEADERSHIP_WAIT,
        "the runtime returns after its shutdown",
    )
    .await;
}

/// An app that replays nothing; its reconcile (never called) does nothing.
fn idle_app() -> impl Reconciler<Key = u32, TermState = (), Error = Fenced> {
    app(
        |_term: &Term| (),
        |_context: &TermContext<u32, ()>| {},
        |_key: u32, _context: TermContext<u32, ()>| async { Ok::<_, Fenced>(Action::Done) },
    )
}

/// An app without per-term state whose replay queues key 1, reconciled by `reconcile`.
fn replaying_key_1<R, Fut>(
    reconcile: R,
) -> impl Reconciler<Key = u32, TermState = (), Error = Fenced>
where
    R: Fn(u32, TermContext<u32, ()>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, Fenced>> + Send + 'static,
{
    app(
        |_term: &Term| (),
        |context: &TermContext<u32, ()>| {
            context.enqueue(1);
        },
        reconcile,
    )
}

/// An app whose replay queues key 1 and whose reconcile panics.
fn panicking_app() -> impl Reconciler<Key = u32, TermState = (), Error = Fenced> {
    replaying_key_1(|_key, _context| async {
        panic!("bug in reconcile");
        #[allow(unreachable_code)]
        Ok::<_, Fenced>(Action::Done)
    })
}

/// Runs `runtime` on `elector` and expects it to end within 1 s with
/// [`RuntimeError::WorkerFailed`]: a reconcile panicked.
async fn ends_with_a_failed_worker(
    runtime: Runtime<u32, (), Fenced>,
    elector: ElectorHandle,
    shutdown: CancellationToken,
) {
    let result = timeout(Duration::from_secs(1), runtime.run(elector, shutdown))
        .await
        .expect("returned");
    assert!(
        matches!(result, Err(RuntimeError::WorkerFailed(_))),
        "{result:?}"
    );
}

/// Waits up to 100 ms for `standby` to lead; `what` says why it must.
async fn leads_within_100_ms(standby: &ElectorHandle, what: &str) {
    let mut leading = standby.leadership();
    timeout(
        Duration::from_millis(100),
        leading.wait_for(Option::is_some),
    )
    .await
    .expect(what)
    .expect("leadership");
}

/// An app that counts its replays and does nothing else, whose terms are first prepared by
/// `prepare`: the acquisition barrier of an app whose caches must catch up with the API server
/// before its replay.
struct Prepared<P> {
    prepare: P,
    replays: Arc<AtomicU64>,
}

impl<P, Fut> Reconciler for Prepared<P>
where
    P: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    type Key = u32;
    type TermState = ();
    type Error = Fenced;

    fn prepare_term(&self, _term: &Term) -> impl Future<Output = ()> + Send + 'static {
        (self.prepare)()
    }

    fn start_term(&self, _term: &Term) {}

    fn replay(&self, _context: &TermContext<u32, ()>) {
        self.replays.fetch_add(1, Ordering::SeqCst);
    }

    #[allow(clippy::manual_async_fn)] // the trait asks for a future that does not borrow `self`
    fn reconcile(
        &self,
        _key: u32,
        _context: TermContext<u32, ()>,
    ) -> impl Future<Output = Result<Action, Fenced>> + Send + 'static {
        async { Ok(Action::Done) }
    }
}

/// [`Prepared`] whose every preparation waits until `ready` is notified.
fn prepared_on(
    ready: Arc<Notify>,
    replays: Arc<AtomicU64>,
) -> impl Reconciler<Key = u32, TermState = (), Error = Fenced> {
    Prepared {
        prepare: move || {
            let ready = ready.clone();
            async move { ready.notified().await }
        },
        replays,
    }
}
