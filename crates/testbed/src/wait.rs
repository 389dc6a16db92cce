//! Waiting for conditions with a wall-clock deadline.

use std::future::Future;
use std::time::Duration;

use crate::TestbedError;

/// How often conditions are polled.
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// The longest a single probe may take before it counts as "not yet".
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A wall-clock deadline for start-up.
///
/// This deliberately uses `std::time::Instant`, not tokio's: start-up waits for real processes,
/// and a test that paused tokio's clock must not see the deadline pass instantly.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::disallowed_types)] // wall-clock wait for real processes, see above
pub(crate) struct Deadline {
    at: std::time::Instant,
    budget: Duration,
}

// === impl Deadline ===

impl Deadline {
    #[allow(clippy::disallowed_types)] // wall-clock wait for real processes, see the type doc
    pub(crate) fn after(budget: Duration) -> Self {
        Self {
            at: std::time::Instant::now() + budget,
            budget,
        }
    }

    #[allow(clippy::disallowed_types)] // wall-clock wait for real processes, see the type doc
    pub(crate) fn passed(&self) -> bool {
        std::time::Instant::now() >= self.at
    }

    pub(crate) fn timeout(&self, what: &str) -> TestbedError {
        TestbedError::Timeout {
            what: what.to_string(),
            after: self.budget,
        }
    }
}

/// Polls `probe` (each call bounded by [`PROBE_TIMEOUT`]) until it returns true or the
/// deadline passes.
pub(crate) async fn poll_until<F, Fut>(
    deadline: Deadline,
    what: &str,
    mut probe: F,
) -> Result<(), TestbedError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        if probe_once(&mut probe).await {
            return Ok(());
        }
        if deadline.passed() {
            return Err(deadline.timeout(what));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One bounded call of `probe`; a probe that hangs counts as false.
pub(crate) async fn probe_once<F, Fut>(probe: &mut F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::time::timeout(PROBE_TIMEOUT, probe())
        .await
        .unwrap_or(false)
}
