use std::time::Duration;

use kube::core::{Status, response::StatusDetails};
use proptest::prelude::*;
use tokio::time::Instant;

use super::*;

const FAST: Duration = Duration::from_millis(5);

fn config(initial: usize, max: usize) -> LimitConfig {
    LimitConfig { initial, max }
}

/// A call sent now with the limit in use.
fn busy(aimd: &Aimd) -> Sent {
    aimd.sent(aimd.limit())
}

fn api_error(code: u16, retry_after_seconds: u32) -> kube::Error {
    let mut status = Status::failure("no", "TooManyRequests").with_code(code);
    if retry_after_seconds > 0 {
        status = status.with_details(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds,
        });
    }
    kube::Error::Api(status.boxed())
}

#[tokio::test(start_paused = true)]
async fn steady_answers_while_the_limit_is_in_use_add_one_write_per_round_up_to_the_cap() {
    let mut aimd = Aimd::new(config(4, 6));
    // About one round: each answer adds 1/limit (4 answers add 0.92, the fifth makes it 5).
    for _ in 0..4 {
        aimd.answered(busy(&aimd), Answer::Answered(FAST));
    }
    assert_eq!(aimd.limit(), 4);
    {
        aimd.answered(busy(&aimd), Answer::Answered(FAST));
    }
    assert_eq!(aimd.limit(), 5);
    for _ in 0..100 {
        aimd.answered(busy(&aimd), Answer::Answered(FAST));
    }
    assert_eq!(aimd.limit(), 6, "never above the cap");
}

#[tokio::test(start_paused = true)]
async fn a_limit_nobody_uses_does_not_grow() {
    let mut aimd = Aimd::new(config(4, 32));
    for _ in 0..1000 {
        // One call in flight at a time: a quarter of the limit.
        let sent = aimd.sent(1);
        assert_eq!(aimd.answered(sent, Answer::Answered(FAST)), None);
    }
    assert_eq!(aimd.limit(), 4);
}

#[tokio::test(start_paused = true)]
async fn each_hard_signal_shrinks_the_limit_by_its_own_factor_and_names_its_reason() {
    let cases = [
        (
            Answer::Throttled(Some(Duration::from_secs(2))),
            16,
            8,
            LimitChange::throttled,
        ),
        (Answer::Throttled(None), 16, 8, LimitChange::throttled),
        (Answer::Overloaded, 16, 8, LimitChange::server_error),
        (Answer::Overloaded, 1, 1, LimitChange::server_error),
    ];
    for (answer, from, to, reason) in cases {
        let mut aimd = Aimd::new(config(from, 32));
        let change = aimd.answered(busy(&aimd), answer);
        assert_eq!(aimd.limit(), to, "{answer:?} from {from}");
        let expected = (from != to).then_some(reason);
        assert_eq!(change, expected, "{answer:?} from {from}");
    }
    // Neither an answer of another kind nor a connection error shrinks it.
    let mut aimd = Aimd::new(config(16, 32));
    aimd.answered(busy(&aimd), Answer::Other);
    assert_eq!(aimd.limit(), 16);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_429s_to_calls_already_in_flight_halves_the_limit_once() {
    let mut aimd = Aimd::new(config(16, 32));
    let in_flight: Vec<Sent> = (1..=16).map(|n| aimd.sent(n)).collect();
    for sent in in_flight {
        aimd.answered(sent, Answer::Throttled(None));
    }
    assert_eq!(aimd.limit(), 8);
    // A call sent after the decrease and throttled again halves it again.
    aimd.answered(busy(&aimd), Answer::Throttled(None));
    assert_eq!(aimd.limit(), 4);
}

#[test]
fn writes_slowing_down_past_the_bound_shrink_the_limit_and_a_steady_pace_does_not() {
    // (latency after 100 writes at 5 ms, shrinks?): the bound is max(2 × long, long + 50 ms)
    // against the short average, so only a rise of tens of milliseconds counts.
    let cases = [
        (Duration::from_millis(5), false),
        (Duration::from_millis(40), false),
        (Duration::from_millis(300), true),
    ];
    for (latency, shrinks) in cases {
        let mut aimd = Aimd::new(config(20, 32));
        for _ in 0..100 {
            aimd.answered(aimd.sent(1), Answer::Answered(FAST));
        }
        let before = aimd.limit();
        let mut change = None;
        for _ in 0..20 {
            change = change.or(aimd.answered(busy(&aimd), Answer::Answered(latency)));
            if change == Some(LimitChange::latency) {
                break;
            }
        }
        if shrinks {
            assert_eq!(change, Some(LimitChange::latency), "{latency:?}");
            assert_eq!(aimd.limit(), before * 9 / 10, "{latency:?}");
        } else {
            assert!(aimd.limit() >= before, "{latency:?}: {}", aimd.limit());
        }
    }
}

#[test]
fn a_server_that_stays_slow_becomes_the_baseline_and_stops_shrinking_the_limit() {
    let mut aimd = Aimd::new(config(30, 32));
    for _ in 0..100 {
        aimd.answered(aimd.sent(1), Answer::Answered(FAST));
    }
    let slow = Duration::from_millis(200);
    let mut shrank = 0;
    for _ in 0..500 {
        if aimd.answered(busy(&aimd), Answer::Answered(slow)) == Some(LimitChange::latency) {
            shrank += 1;
        }
    }
    let baseline = aimd.baseline().unwrap();
    assert!(baseline > slow * 9 / 10, "{baseline:?}");
    assert!(shrank >= 1, "the rise shrank it");
    // A loaded machine is not congestion of ours: at a steady slow pace it grows again.
    let after_rise = aimd.limit();
    for _ in 0..200 {
        aimd.answered(busy(&aimd), Answer::Answered(slow));
    }
    assert!(aimd.limit() > after_rise, "{} ≤ {after_rise}", aimd.limit());
}

#[test]
fn a_read_answer_is_steady_whatever_its_latency() {
    let mut aimd = Aimd::new(config(4, 32));
    for _ in 0..10 {
        assert_ne!(
            aimd.answered(busy(&aimd), Answer::Served),
            Some(LimitChange::latency)
        );
    }
    assert!(aimd.limit() > 4);
    assert_eq!(aimd.baseline(), None, "reads say nothing of write latency");
}

#[test]
fn answers_are_read_from_the_api_error() {
    let latency = Duration::from_millis(7);
    let ok: Result<(), kube::Error> = Ok(());
    assert_eq!(Answer::of(&ok, latency), Answer::Answered(latency));
    let cases = [
        (
            api_error(429, 3),
            Answer::Throttled(Some(Duration::from_secs(3))),
        ),
        (api_error(429, 0), Answer::Throttled(None)),
        (api_error(503, 0), Answer::Overloaded),
        (api_error(500, 0), Answer::Overloaded),
        (api_error(409, 0), Answer::Answered(latency)),
        (api_error(404, 0), Answer::Answered(latency)),
        (
            kube::Error::Service(Box::new(crate::writer::CallTimedOut(Duration::from_secs(
                30,
            )))),
            Answer::Overloaded,
        ),
    ];
    for (error, expected) in cases {
        let result: Result<(), kube::Error> = Err(error);
        assert_eq!(Answer::of(&result, latency), expected, "{result:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_429_holds_every_new_write_until_its_retry_after() {
    let limit = WriteLimit::new(config(4, 4), LimitMetrics::default());
    let permit = limit.acquire().await;
    assert!(permit.answered::<()>(&Err(api_error(429, 3))));
    let started = Instant::now();
    let permit = limit.acquire().await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    // Without a Retry-After, the hold is a second.
    assert!(permit.answered::<()>(&Err(api_error(429, 0))));
    let started = Instant::now();
    drop(limit.acquire().await);
    assert_eq!(started.elapsed(), DEFAULT_RETRY_AFTER);
    assert_eq!(limit.metrics.throttled.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_write_waits_for_a_free_slot_and_gets_the_one_freed() {
    let limit = WriteLimit::new(config(2, 2), LimitMetrics::default());
    let first = limit.acquire().await;
    let _second = limit.acquire().await;
    assert_eq!(limit.metrics.in_flight.get(), 2);
    let third = limit.acquire();
    tokio::pin!(third);
    assert!(
        futures::poll!(third.as_mut()).is_pending(),
        "no slot while 2 of 2 are in flight"
    );
    drop(first);
    let _third = third.await;
    assert_eq!(limit.metrics.in_flight.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_metrics_show_the_limit_and_each_change_with_its_reason() {
    let limit = WriteLimit::new(config(4, 8), LimitMetrics::default());
    assert_eq!(limit.metrics.limit.get(), 4);
    for _ in 0..4 {
        let permits: Vec<_> = futures::future::join_all((0..4).map(|_| limit.acquire())).await;
        for permit in permits {
            permit.answered::<()>(&Ok(()));
        }
    }
    assert!(limit.limit() > 4);
    assert_eq!(limit.metrics.limit.get(), limit.limit() as i64);
    let grew = limit
        .metrics
        .changes
        .get_or_create(&ChangeLabels {
            reason: LimitChange::steady,
        })
        .get();
    assert_eq!(grew, limit.limit() as u64 - 4);
    let permit = limit.acquire().await;
    permit.answered::<()>(&Err(api_error(503, 0)));
    let shrank = limit
        .metrics
        .changes
        .get_or_create(&ChangeLabels {
            reason: LimitChange::server_error,
        })
        .get();
    assert_eq!(shrank, 1);
    assert_eq!(limit.metrics.in_flight.get(), 0);
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        (0u64..2_000).prop_map(|ms| Answer::Answered(Duration::from_millis(ms))),
        (0u64..5).prop_map(|s| Answer::Throttled((s > 0).then(|| Duration::from_secs(s)))),
        Just(Answer::Served),
        Just(Answer::Overloaded),
        Just(Answer::Other),
    ]
}

proptest! {
    /// Whatever the server answers, the limit stays within 1 and the cap, and only a hard
    /// signal or a slow answer shrinks it.
    #[test]
    fn the_limit_stays_within_one_and_the_cap(
        max in 1usize..64,
        steps in proptest::collection::vec((answer(), 1usize..70), 1..200),
    ) {
        let mut aimd = Aimd::new(LimitConfig::capped_at(max));
        for (answer, in_flight) in steps {
            let before = aimd.limit();
            let sent = aimd.sent(in_flight);
            let change = aimd.answered(sent, answer);
            prop_assert!((1..=max).contains(&aimd.limit()));
            if aimd.limit() < before {
                prop_assert!(matches!(
                    change,
                    Some(LimitChange::latency | LimitChange::throttled | LimitChange::server_error)
                ));
            }
            if aimd.limit() > before {
                prop_assert_eq!(change, Some(LimitChange::steady));
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_backlog_answered_steadily_raises_the_limit_to_the_cap() {
    let limit = WriteLimit::new(config(4, 32), LimitMetrics::default());
    // 64 callers with work always waiting (an initial publish), each call answered in 20 ms.
    let callers = (0..64).map(|_| async {
        for _ in 0..40 {
            let permit = limit.acquire().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            permit.answered::<()>(&Ok(()));
        }
    });
    let started = Instant::now();
    futures::future::join_all(callers).await;
    assert_eq!(limit.limit(), 32);
    // 2,560 calls: at 4 in flight they would take 12.8 s; at the cap, under 2 s.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
