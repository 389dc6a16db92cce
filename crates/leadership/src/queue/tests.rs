//! Work queue tests, in paused time.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio::time::{Instant, sleep, timeout};

use super::*;

const TERM: u64 = 7;

fn queue() -> WorkQueue<&'static str> {
    let queue = WorkQueue::new(&QueueConfig::default());
    queue.begin_term(TERM);
    queue
}

async fn next_now<K: QueueKey>(queue: &WorkQueue<K>) -> Option<WorkItem<K>> {
    timeout(Duration::from_millis(1), queue.next())
        .await
        .ok()
        .flatten()
}

#[tokio::test(start_paused = true)]
async fn a_key_is_queued_once() {
    let queue = queue();
    for _ in 0..3 {
        queue.add(TERM, "a");
    }
    queue.add(TERM, "b");
    assert_eq!(queue.depth(), 2);
    assert_eq!(queue.adds(), 4);
    let first = next_now(&queue).await.expect("a");
    let second = next_now(&queue).await.expect("b");
    assert_eq!((*first.key(), *second.key()), ("a", "b"));
    assert!(next_now(&queue).await.is_none());
    queue.done(first);
    queue.done(second);
}

#[tokio::test(start_paused = true)]
async fn a_key_is_never_processed_by_two_workers_and_is_requeued_after() {
    let queue = queue();
    queue.add(TERM, "a");
    let item = next_now(&queue).await.expect("a");
    // Re-added while processing: not handed to another worker now...
    queue.add(TERM, "a");
    queue.add(TERM, "a");
    assert!(next_now(&queue).await.is_none());
    assert_eq!(queue.in_flight(), 1);
    // ...but once, right after the first worker is done.
    queue.done(item);
    let again = next_now(&queue).await.expect("requeued");
    assert_eq!(*again.key(), "a");
    queue.done(again);
    assert!(next_now(&queue).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn concurrent_workers_never_share_a_key() {
    let queue: WorkQueue<u32> = WorkQueue::new(&QueueConfig::default());
    queue.begin_term(TERM);
    let busy = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let processed = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (queue, busy, processed) = (queue.clone(), busy.clone(), processed.clone());
        workers.spawn(async move {
            while let Some(item) = queue.next().await {
                assert!(
                    busy.lock().insert(*item.key()),
                    "two workers on {:?}",
                    item.key()
                );
                sleep(Duration::from_millis(u64::from(*item.key() % 3) + 1)).await;
                busy.lock().remove(item.key());
                processed.fetch_add(1, Ordering::Relaxed);
                queue.done(item);
            }
        });
    }
    for round in 0..50u32 {
        for key in 0..5 {
            queue.add(TERM, (key + round) % 5);
        }
        sleep(Duration::from_millis(1)).await;
    }
    queue.wait_idle().await;
    queue.close();
    while let Some(result) = workers.join_next().await {
        result.expect("worker ok");
    }
    assert!(processed.load(Ordering::Relaxed) >= 5);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_and_success_resets() {
    let queue = queue();
    let start = Instant::now();
    let mut delays = Vec::new();
    queue.add(TERM, "a");
    for _ in 0..4 {
        let item = queue.next().await.expect("a");
        delays.push(Instant::now() - start);
        queue.add_rate_limited(TERM, "a");
        queue.done(item);
    }
    let gaps: Vec<_> = delays.windows(2).map(|w| w[1] - w[0]).collect();
    let ms = Duration::from_millis;
    assert_eq!(gaps, vec![ms(5), ms(10), ms(20)]);
    assert_eq!(queue.failures(&"a"), 4);
    assert_eq!(queue.retries(), 4);

    queue.forget(&"a");
    assert_eq!(queue.failures(&"a"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_key_failing_forever_keeps_retrying_at_the_cap_and_is_counted() {
    let config = QueueConfig {
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
        ..QueueConfig::default()
    };
    let queue: WorkQueue<&str> = WorkQueue::new(&config);
    queue.begin_term(TERM);
    queue.add(TERM, "poison");
    let mut last = Instant::now();
    for attempt in 1..=20u32 {
        let item = timeout(Duration::from_secs(2), queue.next())
            .await
            .expect("never dropped")
            .expect("open");
        if attempt > 6 {
            assert_eq!(Instant::now() - last, Duration::from_secs(1), "at the cap");
        }
        last = Instant::now();
        queue.add_rate_limited(TERM, "poison");
        queue.done(item);
    }
    // 100ms·2^n reaches the 1s cap at the 5th failure.
    assert_eq!(queue.capped_retries(), 16);
}

#[tokio::test(start_paused = true)]
async fn retries_are_paced_by_the_global_rate_limit() {
    let config = QueueConfig {
        base_delay: Duration::from_millis(1),
        retry_qps: 10.0,
        retry_burst: 2,
        ..QueueConfig::default()
    };
    let queue: WorkQueue<u32> = WorkQueue::new(&config);
    queue.begin_term(TERM);
    for key in 0..4 {
        queue.add_rate_limited(TERM, key);
    }
    // Burst of 2 after the 1 ms backoff, then one per 100 ms.
    let start = Instant::now();
    let mut at = Vec::new();
    for _ in 0..4 {
        let item = queue.next().await.expect("open");
        at.push(Instant::now() - start);
        queue.done(item);
    }
    let ms = Duration::from_millis;
    assert_eq!(at, vec![ms(1), ms(1), ms(100), ms(200)]);
}

#[tokio::test(start_paused = true)]
async fn add_after_delays_and_the_earliest_time_wins() {
    let queue = queue();
    queue.add_after(TERM, "a", Duration::from_secs(5));
    queue.add_after(TERM, "a", Duration::from_secs(1));
    queue.add_after(TERM, "a", Duration::from_secs(3));
    assert_eq!(queue.waiting(), 1);
    let start = Instant::now();
    let item = queue.next().await.expect("a");
    assert_eq!(Instant::now() - start, Duration::from_secs(1));
    queue.done(item);
    assert!(next_now(&queue).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn keys_of_a_lost_term_are_dropped_and_its_adds_ignored() {
    let queue = queue();
    queue.add(TERM, "queued");
    queue.add_after(TERM, "delayed", Duration::from_secs(1));
    queue.add_rate_limited(TERM, "retrying");
    queue.add(TERM, "in-flight");
    let in_flight = loop {
        let item = next_now(&queue).await.expect("item");
        if *item.key() == "in-flight" {
            break item;
        }
        queue.add(TERM, *item.key()); // dirty: requeued after done
        queue.done(item);
    };
    queue.add(TERM, "in-flight"); // dirty

    queue.end_term(TERM);
    assert!(
        !queue.add(TERM, "late"),
        "adds of the lost term are ignored"
    );
    assert_eq!((queue.depth(), queue.waiting()), (0, 0));

    // The in-flight key stays exclusive until done, even when a new term queues it.
    let next_term = queue.begin_term(TERM + 1);
    next_term.add("in-flight");
    assert!(next_now(&queue).await.is_none());
    queue.done(in_flight);
    let item = next_now(&queue).await.expect("requeued in the new term");
    assert_eq!((*item.key(), item.term()), ("in-flight", TERM + 1));
    queue.done(item);
    sleep(Duration::from_secs(2)).await;
    assert!(
        next_now(&queue).await.is_none(),
        "nothing of the old term survives"
    );
    assert!(queue.dropped() >= 3);
    assert_eq!(queue.failures(&"retrying"), 0);
}

#[tokio::test(start_paused = true)]
async fn wait_idle_waits_for_queued_and_in_flight_keys_but_hands_over_delayed_ones() {
    let queue = queue();
    queue.add(TERM, "a");
    queue.add(TERM, "b");
    queue.add_after(TERM, "later", Duration::from_secs(60));
    let item = next_now(&queue).await.expect("a");
    let idle = tokio::spawn({
        let queue = queue.clone();
        async move { queue.wait_idle().await }
    });
    sleep(Duration::from_millis(10)).await;
    assert!(!idle.is_finished(), "a key is in flight and one is queued");
    queue.done(item);
    let b = next_now(&queue).await.expect("b");
    // A stale-cache requeue or a retry scheduled by the last in-flight key: handed over.
    queue.add_after(TERM, "soon", Duration::from_millis(100));
    sleep(Duration::from_millis(10)).await;
    assert!(!idle.is_finished(), "b is in flight");
    queue.done(b);
    timeout(Duration::from_millis(1), idle)
        .await
        .expect("idle: only delayed keys are left, and the drain hands them over")
        .expect("task");
    assert_eq!(
        queue.waiting(),
        2,
        "the delayed keys are still there for the term"
    );
}

#[tokio::test(start_paused = true)]
async fn close_wakes_waiting_workers() {
    let queue = queue();
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.next().await.is_none() }
    });
    sleep(Duration::from_millis(5)).await;
    queue.close();
    assert!(worker.await.expect("task"));
    assert!(!queue.add(TERM, "a"));
}
