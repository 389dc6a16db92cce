//! Pipelined writes and a server that pushes back (issue 34), over the in-memory API server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use leadership::Fenced;
use tokio::time::Instant;

use super::{
    WriteError, Written,
    tests::{NAMESPACE, Pass, plan, stored},
};
use crate::{limit::DEFAULT_RETRY_AFTER, test_api::TestApi};

#[tokio::test(start_paused = true)]
async fn the_writes_of_passes_for_different_services_are_in_flight_together() {
    let timeout = Duration::from_secs(1);
    let api = TestApi::new().with_call_timeout(timeout);
    let names = ["web-x-", "web-y-", "web-z-"];
    for name in names {
        api.hang(&format!("create {name}"));
    }
    // One pass each (the queue never runs two passes of one Service at once).
    let passes: Vec<Pass> = names.iter().map(|_| Pass::new()).collect();
    let plans: Vec<_> = names
        .iter()
        .map(|name| plan(&[name], Vec::new(), Vec::new()))
        .collect();
    let started = Instant::now();
    let written = futures::future::join_all(
        passes
            .iter()
            .zip(&plans)
            .map(|(pass, plan)| pass.write(&api, plan)),
    )
    .await;
    assert!(
        written
            .iter()
            .all(|result| matches!(result, Err(WriteError::Api { .. }))),
        "{written:?}"
    );
    let mut calls = api.calls();
    calls.sort();
    assert_eq!(calls, ["create web-x-", "create web-y-", "create web-z-"]);
    assert_eq!(
        started.elapsed(),
        timeout,
        "the three waited for their answers at the same time, not one after the other"
    );
}

#[tokio::test(start_paused = true)]
async fn a_create_answered_429_is_sent_again_after_the_retry_after_and_lands_once() {
    let api = TestApi::new().failing(&[("create web-", 429)]);
    let pass = Pass::new();
    let plan = plan(&["web-"], Vec::new(), Vec::new());
    let started = Instant::now();
    // The server throttles the first three tries (t = 0, 1, 2 s) and lets the fourth through.
    let (written, ()) = tokio::join!(pass.write(&api, &plan), async {
        tokio::time::sleep(DEFAULT_RETRY_AFTER * 5 / 2).await;
        api.heal("create web-");
    });
    let expected = Written {
        created: 1,
        ..Written::default()
    };
    assert_eq!(
        written.unwrap(),
        expected,
        "no error for a 429: it backs off"
    );
    assert_eq!(api.calls(), ["create web-"; 4]);
    assert_eq!(started.elapsed(), DEFAULT_RETRY_AFTER * 3);
    assert_eq!(
        api.slices(NAMESPACE).len(),
        1,
        "nothing lost, nothing twice"
    );
    assert!(
        !pass.must_read_back(),
        "a 429 was not applied: nothing to read back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_sent_again_after_a_429_goes_through_the_fence() {
    let api = TestApi::new().failing(&[("create web-", 429)]);
    let existing = stored(&api, &["web-a"]).await;
    let pass = Pass::new();
    // The term ends while the write waits out the Retry-After.
    api.end_term_after(1, &pass.term);
    let error = pass
        .write(&api, &plan(&["web-"], existing, Vec::new()))
        .await
        .unwrap_err();
    assert!(
        matches!(error, WriteError::Fenced(Fenced::TermEnded { .. })),
        "{error:?}"
    );
    assert_eq!(
        api.calls(),
        ["create web-"],
        "nothing sent after the term ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_throttled_until_the_call_timeout_gives_up_with_the_429() {
    let timeout = DEFAULT_RETRY_AFTER * 3;
    let api = TestApi::new()
        .with_call_timeout(timeout)
        .failing(&[("create web-", 429)]);
    let pass = Pass::new();
    let started = Instant::now();
    let error = pass
        .write(&api, &plan(&["web-"], Vec::new(), Vec::new()))
        .await
        .unwrap_err();
    assert!(matches!(error, WriteError::Api { .. }), "{error:?}");
    // Tries at 0, 1 and 2 s; the one answered at 3 s, the call timeout, is the last.
    assert_eq!(api.calls(), ["create web-"; 4]);
    assert_eq!(started.elapsed(), timeout);
    assert!(api.slices(NAMESPACE).is_empty());
}
