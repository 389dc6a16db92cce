//! Waiting for a condition: poll it until it holds, fail with its last answer after a timeout.
//! A wait here is always for a condition; no test or bench relies on a sleep being long enough.
//!
//! One loop ([`poll_every`]); [`eventually`] polls a `Result` check every [`EVERY`], [`poll()`]
//! an `Option` check at the caller's pace (the benches time with it).

use std::time::Duration;

use tokio::time::Instant;

/// How long a test waits for a condition before failing.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// How often [`eventually`] checks.
pub const EVERY: Duration = Duration::from_millis(100);

/// Polls `check` every `every` until it returns `Ok` and returns its value; panics with the
/// last error after `timeout`.
pub async fn poll_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(error) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}: {error}")
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Waits until `check` succeeds, polling every [`EVERY`]; fails with the last error after
/// `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll_every(what, timeout, EVERY, check).await
}

/// Polls `check` every `every` until it returns `Some`, or panics after `timeout`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_every(what, timeout, every, || {
        let answer = check();
        async move { answer.await.ok_or_else(|| "not yet".to_string()) }
    })
    .await
}
