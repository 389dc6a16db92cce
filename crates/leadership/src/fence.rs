//! The fence: the check a writer makes immediately before every API call.
//!
//! A deposed leader must write nothing. Checking leadership once, then waiting (in a queue, on a
//! slow reconcile), then writing is exactly the window in which two replicas write at once, so the
//! writer calls [`Fence::check`] right before each request, and the check answers from local state
//! without any I/O.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::term::{Leadership, Term};

/// Permission to write on behalf of one term. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Fence {
    term: Term,
    leadership: Leadership,
    margin: Duration,
    metrics: FenceMetrics,
    /// `false` only in tests that switch the fence off ([`Safeguards`](crate::Safeguards)).
    enforced: bool,
}

/// Counts of writes the fences refused; shared by all fences made from one runtime
/// ([`Runtime::fence_metrics`](crate::Runtime::fence_metrics)).
#[derive(Clone, Debug, Default)]
pub struct FenceMetrics {
    fenced: Arc<AtomicU64>,
}

/// Why a write was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Fenced {
    /// The fence's term is no longer the current term: leadership was lost (and maybe regained
    /// under a newer term). Not retryable within this term: drop the work, the new term replays.
    #[error("term {term} is over")]
    TermEnded {
        /// The term the refused write belonged to.
        term: u64,
    },
    /// The term is current but its last successful renewal is too old to be sure no one else has
    /// taken the lease. Retryable: a renewal may succeed shortly, or the term will end.
    #[error("lease of term {term} is not safely held (no renewal for too long)")]
    LeaseNotSafelyHeld {
        /// The term the refused write belonged to.
        term: u64,
    },
    /// The API server refused the write because this process is not the Lease's holder as the
    /// server sees it ([`FENCING_POLICY_TEMPLATE`](crate::FENCING_POLICY_TEMPLATE)), while this process still holds the term:
    /// either the server's cache of the Lease has not yet seen this term's acquisition (a few
    /// milliseconds) or this process was deposed and has not seen it yet. Stop the pass; look
    /// again after a pause only while the term is still current (the fence is checked first).
    #[error("the API server refused a write of term {term}: not the Lease's holder")]
    RefusedByApiServer {
        /// The term the refused write belonged to.
        term: u64,
    },
}

// === impl Fence ===

impl Fence {
    /// A fence for `term`, valid while `leadership` names that term and the last renewal plus
    /// RenewDeadline minus `margin` is in the future.
    pub(crate) fn new(
        term: Term,
        leadership: Leadership,
        margin: Duration,
        metrics: FenceMetrics,
    ) -> Self {
        Self {
            term,
            leadership,
            margin,
            metrics,
            enforced: true,
        }
    }

    /// A fence for the term `leadership` names now, or `None` while following: for an app that
    /// keeps its own controller loop (kube-runtime's `Controller`) instead of
    /// [`Runtime`](crate::Runtime). Take one per reconcile, at its start, and call [`Fence::check`]
    /// immediately before each write: it refuses once that term is over or its lease is not
    /// safely held (last renewal + RenewDeadline − `margin` passed). Refusals are counted in
    /// `metrics` (share one [`FenceMetrics`] across reconciles).
    ///
    /// ```
    /// # use leadership::{Fence, FenceMetrics, Leadership};
    /// # fn example(leadership: &Leadership, metrics: &FenceMetrics) {
    /// // The elector's `ElectorHandle::leadership()`, cloned into the reconcile's context.
    /// let Some(fence) = Fence::current(leadership, std::time::Duration::from_secs(1), metrics)
    /// else {
    ///     return; // following: write nothing, requeue or do nothing
    /// };
    /// if fence.check().is_ok() {
    ///     // send the write
    /// }
    /// # }
    /// ```
    pub fn current(
        leadership: &Leadership,
        margin: Duration,
        metrics: &FenceMetrics,
    ) -> Option<Self> {
        let term = leadership.borrow().clone()?;
        Some(Self::new(term, leadership.clone(), margin, metrics.clone()))
    }

    /// This fence, letting every write through unless `enforced` (tests that switch the fence
    /// off through [`Safeguards`](crate::Safeguards)).
    pub(crate) fn enforced(mut self, enforced: bool) -> Self {
        self.enforced = enforced;
        self
    }

    /// Checks, without I/O, that the write about to be sent may be sent. Call it immediately
    /// before every API call; refusals are counted in [`FenceMetrics`].
    pub fn check(&self) -> Result<(), Fenced> {
        let result = self.evaluate(Instant::now());
        if result.is_err() {
            self.metrics.fenced.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// [`Fence::check`], except that a lease not safely held *right now* is waited for rather
    /// than refused: until a renewal makes it safe again (then `Ok`, with how long it waited),
    /// the term ends ([`Fenced::TermEnded`]), or the renewal deadline passes
    /// ([`Fenced::LeaseNotSafelyHeld`]). The wait is at most the fence's margin: the elector ends
    /// a term whose lease was not renewed within RenewDeadline.
    ///
    /// Use it where a write is about to be sent after reads that took time: a renewal that takes
    /// longer than RetryPeriod leaves the lease safely held only in short windows, and a write
    /// checked at a fixed delay after its reads can fall into step with the renewals and miss
    /// every window.
    pub async fn wait_until_safe(&self) -> Result<Duration, Fenced> {
        let started = Instant::now();
        loop {
            let now = Instant::now();
            let result = self.evaluate(now);
            let deadline = self
                .term
                .safely_held_until(Duration::ZERO)
                .filter(|deadline| now < *deadline);
            match (result, deadline) {
                (Err(Fenced::LeaseNotSafelyHeld { .. }), Some(deadline)) => {
                    let last = self.term.last_renewed_at();
                    tokio::select! {
                        biased;
                        () = self.ended() => {}
                        () = self.term.renewed_after(last) => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                (Ok(()), _) => return Ok(started.elapsed()),
                (Err(fenced), _) => {
                    self.metrics.fenced.fetch_add(1, Ordering::Relaxed);
                    return Err(fenced);
                }
            }
        }
    }

    /// Records that the API server refused a write of this term because this process does not
    /// hold the Lease ([`is_fencing_policy_denial`](crate::is_fencing_policy_denial)):
    /// counted in [`FenceMetrics`] like a refusal of [`Fence::check`]. Returns the refusal to
    /// stop the pass with: [`Fenced::TermEnded`] when the term is over by now, else
    /// [`Fenced::RefusedByApiServer`].
    pub fn refused_by_api_server(&self) -> Fenced {
        self.metrics.fenced.fetch_add(1, Ordering::Relaxed);
        let term = self.term.id();
        if self.is_current() {
            Fenced::RefusedByApiServer { term }
        } else {
            Fenced::TermEnded { term }
        }
    }

    /// Whether the term is still current, without counting a refusal.
    pub(crate) fn is_current(&self) -> bool {
        self.leadership
            .borrow()
            .as_ref()
            .is_some_and(|current| current.id() == self.term.id())
    }

    /// The term this fence guards.
    pub fn term(&self) -> &Term {
        &self.term
    }

    /// Completes once this fence's term is over (lost, released or given up; at once if it
    /// already is): the signal to stop work started for the term, e.g. kube-runtime's
    /// `Controller::graceful_shutdown_on(fence.ended())`. Writes still in flight then are
    /// refused by [`Fence::check`].
    pub fn ended(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut leadership = self.leadership.clone();
        let term = self.term.id();
        async move {
            // An error means nobody can publish leadership any more: the term is over too.
            let _ = leadership
                .wait_for(|current| current.as_ref().map(Term::id) != Some(term))
                .await;
        }
    }

    fn evaluate(&self, now: Instant) -> Result<(), Fenced> {
        if !self.enforced {
            return Ok(());
        }
        let term = self.term.id();
        if !self.is_current() {
            return Err(Fenced::TermEnded { term });
        }
        match self.term.safely_held_until(self.margin) {
            Some(until) if until <= now => Err(Fenced::LeaseNotSafelyHeld { term }),
            _ => Ok(()),
        }
    }
}

// === impl FenceMetrics ===

impl FenceMetrics {
    /// How many writes were refused so far.
    pub fn fenced(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::{sync::watch, time::advance};

    const RENEW_DEADLINE: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn refuses_after_the_term_is_lost() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (tx, rx) = watch::channel(Some(term.clone()));
        let metrics = FenceMetrics::default();
        let fence = Fence::new(term.clone(), rx, MARGIN, metrics.clone());
        assert_eq!(fence.check(), Ok(()));

        tx.send_replace(None);
        assert_eq!(fence.check(), Err(Fenced::TermEnded { term: term.id() }));

        // Regaining leadership under a new term does not revive the old term's fence.
        let next = Term::new(Instant::now(), RENEW_DEADLINE);
        tx.send_replace(Some(next));
        assert_eq!(fence.check(), Err(Fenced::TermEnded { term: term.id() }));
        assert_eq!(metrics.fenced(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_after_renew_deadline_minus_margin() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (_tx, rx) = watch::channel(Some(term.clone()));
        let fence = Fence::new(term.clone(), rx, MARGIN, FenceMetrics::default());

        advance(RENEW_DEADLINE - MARGIN - Duration::from_millis(1)).await;
        assert_eq!(fence.check(), Ok(()));
        advance(Duration::from_millis(1)).await;
        assert_eq!(
            fence.check(),
            Err(Fenced::LeaseNotSafelyHeld { term: term.id() })
        );

        // A renewal makes it safe again.
        term.record_renewal(Instant::now());
        assert_eq!(fence.check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_for_the_next_renewal_rather_than_being_refused() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (_tx, rx) = watch::channel(Some(term.clone()));
        let metrics = FenceMetrics::default();
        let fence = Fence::new(term.clone(), rx, MARGIN, metrics.clone());
        // Safely held: no wait.
        assert_eq!(fence.wait_until_safe().await, Ok(Duration::ZERO));

        // Past RenewDeadline − margin, a renewal 300 ms later makes it safe again.
        advance(RENEW_DEADLINE - MARGIN).await;
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.wait_until_safe().await }
        });
        tokio::task::yield_now().await; // the write starts waiting now
        advance(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "no renewal yet: still waiting");
        term.record_renewal(Instant::now());
        assert_eq!(waiting.await.expect("task"), Ok(Duration::from_millis(300)));
        assert_eq!(metrics.fenced(), 0, "a write that waited was not refused");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_write_is_refused_when_no_renewal_comes_or_the_term_ends() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (tx, rx) = watch::channel(Some(term.clone()));
        let metrics = FenceMetrics::default();
        let fence = Fence::new(term.clone(), rx, MARGIN, metrics.clone());

        // No renewal: refused at RenewDeadline, after waiting at most the margin.
        advance(RENEW_DEADLINE - MARGIN).await;
        let started = Instant::now();
        assert_eq!(
            fence.wait_until_safe().await,
            Err(Fenced::LeaseNotSafelyHeld { term: term.id() })
        );
        assert_eq!(Instant::now() - started, MARGIN);

        // Past RenewDeadline it is not waited for at all.
        assert_eq!(
            fence.wait_until_safe().await,
            Err(Fenced::LeaseNotSafelyHeld { term: term.id() })
        );
        assert_eq!(Instant::now() - started, MARGIN);

        // The term ends while a write waits: refused at once as over. (A renewal sent 500 ms
        // after the term began: not safely held now, yet not past RenewDeadline either.)
        term.record_renewal(started - (RENEW_DEADLINE - MARGIN) + Duration::from_millis(500));
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.wait_until_safe().await }
        });
        advance(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished());
        tx.send_replace(None);
        assert_eq!(
            waiting.await.expect("task"),
            Err(Fenced::TermEnded { term: term.id() })
        );
        assert_eq!(metrics.fenced(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn unbounded_term_is_fenced_only_by_leadership() {
        let term = Term::unbounded();
        let (tx, rx) = watch::channel(Some(term.clone()));
        let fence = Fence::new(term, rx, MARGIN, FenceMetrics::default());
        advance(Duration::from_secs(3600)).await;
        assert_eq!(fence.check(), Ok(()));
        tx.send_replace(None);
        assert!(fence.check().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_of_the_current_term_for_apps_with_their_own_controller_loop() {
        let (tx, rx) = watch::channel(None);
        let metrics = FenceMetrics::default();
        assert!(Fence::current(&rx, MARGIN, &metrics).is_none(), "following");

        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        tx.send_replace(Some(term.clone()));
        let fence = Fence::current(&rx, MARGIN, &metrics).expect("leading");
        assert_eq!(fence.term(), &term);
        assert_eq!(fence.check(), Ok(()));
        advance(RENEW_DEADLINE - MARGIN).await;
        assert_eq!(
            fence.check(),
            Err(Fenced::LeaseNotSafelyHeld { term: term.id() })
        );
        tx.send_replace(None);
        assert_eq!(fence.check(), Err(Fenced::TermEnded { term: term.id() }));
        assert_eq!(metrics.fenced(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn ended_completes_when_the_term_is_over_and_not_before() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (tx, rx) = watch::channel(Some(term.clone()));
        let fence = Fence::current(&rx, MARGIN, &FenceMetrics::default()).expect("leading");
        let ended = tokio::spawn(fence.ended());
        advance(Duration::from_secs(1)).await;
        term.record_renewal(Instant::now()); // renewals do not end it
        tx.send_replace(Some(term.clone()));
        tokio::task::yield_now().await;
        assert!(!ended.is_finished());

        // A new term replaces it (a loss and re-acquisition seen at once): over.
        tx.send_replace(Some(Term::new(Instant::now(), RENEW_DEADLINE)));
        tokio::time::timeout(Duration::from_millis(1), ended)
            .await
            .expect("completed")
            .expect("task");
        // Already over: at once. The elector gone: over too.
        fence.ended().await;
        let (tx, rx) = watch::channel(Some(term.clone()));
        let fence = Fence::current(&rx, MARGIN, &FenceMetrics::default()).expect("leading");
        drop(tx);
        fence.ended().await;
    }

    #[tokio::test(start_paused = true)]
    async fn refusal_by_the_api_server_is_counted_and_names_the_term() {
        let term = Term::new(Instant::now(), RENEW_DEADLINE);
        let (tx, rx) = watch::channel(Some(term.clone()));
        let metrics = FenceMetrics::default();
        let fence = Fence::new(term.clone(), rx, MARGIN, metrics.clone());
        assert_eq!(
            fence.refused_by_api_server(),
            Fenced::RefusedByApiServer { term: term.id() }
        );
        tx.send_replace(None);
        assert_eq!(
            fence.refused_by_api_server(),
            Fenced::TermEnded { term: term.id() }
        );
        assert_eq!(metrics.fenced(), 2);
    }
}
