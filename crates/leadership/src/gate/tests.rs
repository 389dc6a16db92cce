//! Gate tests: registration only while leading, ordered by term, fresh state, replay.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::{
    collections::HashSet,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::*;
use crate::{fence::FenceMetrics, queue::QueueConfig};

/// Per-term state that remembers which term built it.
#[derive(Debug)]
struct TermState {
    built_for: u64,
    seen: Mutex<Vec<&'static str>>,
}

struct Fixture {
    gate: Gate<&'static str, TermState>,
    queue: WorkQueue<&'static str>,
    built: Arc<Mutex<Vec<u64>>>,
    cache: Arc<Mutex<Vec<&'static str>>>,
    terms: Vec<Term>,
    leadership: watch::Sender<Option<Term>>,
}

fn fixture(terms: usize) -> Fixture {
    fixture_with(terms, true)
}

/// `fresh_state: false` is the switch `Safeguards::without_fresh_state` turns.
fn fixture_with(terms: usize, fresh_state: bool) -> Fixture {
    let queue = WorkQueue::new(&QueueConfig::default());
    let built = Arc::new(Mutex::new(Vec::new()));
    let cache = Arc::new(Mutex::new(vec!["svc-a", "svc-b"]));
    let factory: StateFactory<TermState> = {
        let built = built.clone();
        Arc::new(move |term: &Term| {
            built.lock().push(term.id());
            TermState {
                built_for: term.id(),
                seen: Mutex::new(Vec::new()),
            }
        })
    };
    let replay: Replay<&'static str, TermState> = {
        let cache = cache.clone();
        Arc::new(move |context: &TermContext<&'static str, TermState>| {
            for key in cache.lock().iter() {
                context.enqueue(key);
            }
        })
    };
    Fixture {
        gate: Gate::new(queue.clone(), factory, replay, fresh_state),
        queue,
        built,
        cache,
        terms: (0..terms).map(|_| Term::unbounded()).collect(),
        leadership: watch::channel(None).0,
    }
}

impl Fixture {
    fn fence(&self, term: &Term) -> Fence {
        Fence::new(
            term.clone(),
            self.leadership.subscribe(),
            Duration::from_secs(1),
            FenceMetrics::default(),
        )
    }

    fn start(&self, index: usize) -> bool {
        let term = self.terms[index].clone();
        self.gate.start(term.clone(), self.fence(&term))
    }

    fn stop(&self, index: usize) -> bool {
        self.gate.stop(self.terms[index].id())
    }
}

#[test]
fn handlers_run_only_while_a_term_is_registered() {
    let f = fixture(1);
    assert_eq!(
        f.gate.dispatch(|ctx| ctx.enqueue("svc-x")),
        None,
        "follower"
    );
    assert_eq!(f.queue.depth(), 0);

    assert!(f.start(0));
    assert_eq!(f.gate.dispatch(|ctx| ctx.enqueue("svc-x")), Some(true));
    assert!(f.stop(0));
    assert_eq!(f.gate.dispatch(|ctx| ctx.enqueue("svc-y")), None);
    assert_eq!(f.queue.depth(), 0, "stopping dropped the term's keys");
}

#[test]
fn start_builds_fresh_state_then_replays_the_cache() {
    let f = fixture(2);
    assert!(f.start(0));
    assert_eq!(f.queue.depth(), 2, "replay enqueued every cached key");
    f.gate
        .dispatch(|ctx| ctx.state().seen.lock().push("written in term 1"))
        .expect("registered");
    assert!(f.stop(0));

    f.cache.lock().push("svc-c");
    assert!(f.start(1));
    let state = f
        .gate
        .dispatch(|ctx| ctx.state().clone())
        .expect("registered");
    assert_eq!(state.built_for, f.terms[1].id());
    assert!(
        state.seen.lock().is_empty(),
        "nothing carried over from term 1"
    );
    assert_eq!(f.queue.depth(), 3);
    assert_eq!(*f.built.lock(), vec![f.terms[0].id(), f.terms[1].id()]);
}

#[test]
fn with_fresh_state_switched_off_every_term_reuses_the_first_state() {
    // The switch exists so that an app's tests can show what fresh state prevents; it must
    // really carry the state over, or such a test proves nothing.
    let f = fixture_with(3, false);
    for index in 0..3 {
        assert!(f.start(index));
        f.gate
            .dispatch(|ctx| ctx.state().seen.lock().push("written"))
            .expect("registered");
        assert!(f.stop(index));
    }
    assert_eq!(*f.built.lock(), vec![f.terms[0].id()], "built once");
    let state = f.gate.inner.registration.read().previous_state.clone();
    let state = state.expect("kept for the next term");
    assert_eq!(state.built_for, f.terms[0].id());
    assert_eq!(
        state.seen.lock().len(),
        3,
        "every term wrote into the same state"
    );
}

#[test]
fn replay_racing_events_only_double_enqueue_into_a_deduplicating_queue() {
    let f = fixture(1);
    assert!(f.start(0));
    // The event for svc-a that was already in the cache when the replay read it.
    f.gate.dispatch(|ctx| ctx.enqueue("svc-a"));
    assert_eq!(f.queue.depth(), 2);
}

/// Every interleaving of start/stop for three terms, as leadership callbacks may deliver them
/// late or out of order, leaves nothing registered once all terms stopped, never registers a
/// stopped term again, and builds each term's state at most once.
#[test]
fn late_start_after_stop_never_leaves_handlers_on_a_follower() {
    let events: Vec<(bool, usize)> = (0..3).flat_map(|t| [(true, t), (false, t)]).collect();
    let mut order: Vec<usize> = (0..events.len()).collect();
    let mut checked = 0;
    permutations(&mut order, 0, &mut |order| {
        let f = fixture(3);
        let mut stopped = HashSet::new();
        for &index in order.iter() {
            let (start, term) = events[index];
            if start {
                f.start(term);
            } else {
                f.stop(term);
                stopped.insert(f.terms[term].id());
            }
            if let Some(registered) = f.gate.registered_term() {
                assert!(
                    !stopped.contains(&registered),
                    "stopped term registered: {order:?}"
                );
            }
        }
        assert_eq!(
            f.gate.registered_term(),
            None,
            "handlers left on a follower: {order:?}"
        );
        assert_eq!(f.gate.dispatch(|_| ()), None);
        let built = f.built.lock().clone();
        let unique: HashSet<_> = built.iter().collect();
        assert_eq!(unique.len(), built.len(), "a term built twice: {order:?}");
        checked += 1;
    });
    assert_eq!(checked, 720);
}

#[test]
fn repeated_start_registers_once_and_older_terms_cannot_start() {
    let f = fixture(2);
    assert!(f.start(1));
    assert!(!f.start(1), "duplicate start");
    assert!(!f.start(0), "older term");
    assert_eq!(f.built.lock().len(), 1);
    assert_eq!(f.gate.registered_term(), Some(f.terms[1].id()));
    assert!(!f.stop(0), "stopping an older term leaves the newer one");
    assert_eq!(f.gate.registered_term(), Some(f.terms[1].id()));
}

#[test]
fn racing_threads_leave_nothing_registered_after_the_last_stop() {
    for _ in 0..50 {
        let f = Arc::new(fixture(8));
        let done = Arc::new(AtomicU64::new(0));
        std::thread::scope(|scope| {
            for term in 0..8 {
                let (stopper, done) = (f.clone(), done.clone());
                scope.spawn(move || {
                    stopper.stop(term);
                    done.fetch_add(1, Ordering::SeqCst);
                });
                let starter = f.clone();
                scope.spawn(move || {
                    starter.start(term);
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 8);
        assert_eq!(f.gate.registered_term(), None);
    }
}

#[test]
fn closed_intake_refuses_events_but_keeps_the_context_for_draining() {
    let f = fixture(2);
    assert!(f.start(0));
    f.gate.close_intake();
    assert_eq!(f.gate.dispatch(|ctx| ctx.enqueue("svc-x")), None);
    assert!(f.gate.context(f.terms[0].id()).is_some());
    assert!(!f.start(1), "no new term while shutting down");
    assert!(!f.gate.resync(f.terms[0].id()));
}

fn permutations(items: &mut Vec<usize>, k: usize, visit: &mut impl FnMut(&[usize])) {
    if k == items.len() {
        visit(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, visit);
        items.swap(k, i);
    }
}
