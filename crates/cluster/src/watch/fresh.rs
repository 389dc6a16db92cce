//! The acquisition barrier, clause 1 of the fresh-view rule (docs/architecture.md, "A fresh
//! view"): a new term plans from caches at least as new as a point read from the API server after
//! the acquisition. It raises the same watermarks the rule reads ([`KindHealth::read_version`]).
//!
//! A follower's watch may have been silent (a stalled connection) when it wins the Lease; its
//! replay would then plan from a frozen cache, and every change made meanwhile would be lost
//! until the stall was noticed. So before the replay, for each kind at once:
//!
//! - a kind with at most [`RELIST_AT_MOST`] cached objects is re-listed with plain paged LIST
//!   requests without a resourceVersion (consistent reads): fresh by construction, and faster
//!   than a probe at that size;
//! - a larger kind, where a re-list costs seconds, is shown up to date by its watch:
//!
//! 1. a consistent read of the kind's current resourceVersion (a LIST of one object, no
//!    resourceVersion: served once the API server's own cache has caught up with etcd);
//! 2. if the watch has already read that version, the cache is up to date;
//! 3. otherwise the watch restarts from its last version with a three-second server timeout: the
//!    server sends the events since that version, then a bookmark about a second later carrying
//!    its watch cache's version; the cache is up to date once the watch has read step 1's
//!    version (an event or a bookmark at or past it). A stream merely started after step 1
//!    proves nothing: behind one address, another API server instance whose watch cache lags
//!    may serve it (simulation seed 13843). Three seconds is the least timeout that gets a
//!    bookmark ([`PROBE_TIMEOUT_SECONDS`](kube_watch_loop::PROBE_TIMEOUT_SECONDS)), sent on the
//!    server's next bookmark tick (about every second): a probe waits 1–2.25 s, whatever the
//!    kind's size;
//! 4. a watch that does not read that version within [`PROBE_WAIT`] (every watch connection
//!    stalled, a lagging instance, a version that is not a number) re-lists with plain paged
//!    LIST requests instead.
//!
//! The barrier runs until the caches are up to date or the term ends (the runtime then drops it).

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;
use kube_watch_loop::Backoff;
use tokio::time::Instant;

use super::health::{Command, KindHealth};

/// How long a probe may take before the kind is re-listed instead.
pub const PROBE_WAIT: Duration = Duration::from_secs(5);

/// Kinds with at most this many cached objects are re-listed rather than probed. A probe waits
/// for the server's next bookmark: 0.9–1.4 s (barrier with every kind probed, 10k Services) and
/// up to 2.0 s in the failover bench on the testbed. Re-listing 1,000 Services, 5,000 workloads
/// and 1,000 slices took 0.44–0.60 s; re-listing 10,000 Services and 10,000 slices took longer
/// than probing them (barrier 1.2–1.6 s, 1.1 s of CPU). So a kind is re-listed up to 5,000
/// objects, and a graceful hand-over in a small cluster is not slowed by a bookmark wait.
pub const RELIST_AT_MOST: usize = 5_000;

/// Reads the current resourceVersion of a kind by a consistent read.
pub type ReadVersion = Arc<dyn Fn() -> BoxFuture<'static, kube::Result<u64>> + Send + Sync>;

/// Counts the objects a kind's cache holds.
pub type CachedCount = Arc<dyn Fn() -> usize + Send + Sync>;

/// One watched kind as the barrier sees it.
#[derive(Clone)]
pub struct Kind {
    /// Its watch.
    pub health: Arc<KindHealth>,
    /// How to read its current version.
    pub read: ReadVersion,
    /// How many objects its cache holds.
    pub cached: CachedCount,
}

/// The watched kinds, and how to read each one's current version.
#[derive(Clone)]
pub struct Barrier {
    kinds: Vec<Kind>,
    /// Kinds with at most this many cached objects are re-listed ([`RELIST_AT_MOST`]).
    relist_at_most: usize,
}

/// How a kind was shown up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The watch had already read the current version.
    AlreadyRead,
    /// A probe's stream reached it.
    Probed,
    /// A paged re-list.
    Relisted,
}

// === impl Barrier ===

impl Barrier {
    /// A barrier over `kinds`.
    pub fn new(kinds: Vec<Kind>) -> Self {
        Self {
            kinds,
            relist_at_most: RELIST_AT_MOST,
        }
    }

    /// The same, re-listing kinds of at most `objects` objects instead of [`RELIST_AT_MOST`]
    /// (0: every kind is probed).
    #[must_use]
    pub fn relisting_at_most(mut self, objects: usize) -> Self {
        self.relist_at_most = objects;
        self
    }

    /// Waits until every cache is at least as new as a version read from the API server after
    /// this call started; returns how long it took and how each kind was shown up to date.
    pub async fn bring_up_to_date(&self) -> (Duration, Vec<(&'static str, Proof)>) {
        let started = Instant::now();
        let proofs = futures::future::join_all(self.kinds.iter().map(|kind| async move {
            (
                kind.health.kind(),
                up_to_date(kind, self.relist_at_most).await,
            )
        }))
        .await;
        (started.elapsed(), proofs)
    }
}

async fn up_to_date(kind: &Kind, relist_at_most: usize) -> Proof {
    let health = &kind.health;
    if (kind.cached)() <= relist_at_most {
        return relisted(health).await;
    }
    let read = &kind.read;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let version = loop {
        match read().await {
            Ok(version) => break version,
            Err(error) => {
                tracing::warn!(kind = health.kind(), %error, "cannot read the current version; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    };
    if version == 0 {
        tracing::warn!(
            kind = health.kind(),
            "the current version is not a number; re-listing with paged lists"
        );
        return relisted(health).await;
    }
    if health.read_version() >= version {
        return Proof::AlreadyRead;
    }
    health.request(Command::Probe);
    if tokio::time::timeout(PROBE_WAIT, health.reached(version))
        .await
        .is_ok()
    {
        return Proof::Probed;
    }
    tracing::warn!(
        kind = health.kind(),
        wait = ?PROBE_WAIT,
        "watch did not read the current version; re-listing with paged lists"
    );
    relisted(health).await
}

/// Re-lists the kind with plain paged LIST requests (consistent reads, fresh by construction).
async fn relisted(health: &KindHealth) -> Proof {
    let relist = health.request(Command::Relist);
    health.answered(relist).await;
    Proof::Relisted
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use futures::FutureExt;
    use tokio::sync::mpsc;

    use super::*;

    fn reading(version: u64) -> ReadVersion {
        Arc::new(move || async move { Ok(version) }.boxed())
    }

    fn kind(name: &'static str) -> (Arc<KindHealth>, mpsc::UnboundedReceiver<Command>) {
        let (health, commands) = KindHealth::new(name, Duration::from_secs(30));
        (Arc::new(health), commands)
    }

    /// A kind too large to re-list at each acquisition.
    fn large(health: Arc<KindHealth>, read: ReadVersion) -> Kind {
        Kind {
            health,
            read,
            cached: Arc::new(|| RELIST_AT_MOST + 1),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_already_read_the_current_version_is_not_probed() {
        let (health, mut commands) = kind("Service");
        health.seen(Some(42));
        let barrier = Barrier::new(vec![large(health, reading(42))]);
        let (took, proofs) = barrier.bring_up_to_date().await;
        assert_eq!(proofs, vec![("Service", Proof::AlreadyRead)]);
        assert_eq!(took, Duration::ZERO);
        assert!(commands.try_recv().is_err(), "no command sent");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_behind_is_probed_and_the_barrier_waits_for_its_answer() {
        let (health, mut commands) = kind("ExternalWorkload");
        health.seen(Some(10));
        let barrier = Barrier::new(vec![large(health.clone(), reading(50))]);
        let answering = tokio::spawn(async move {
            let Some(Command::Probe(id)) = commands.recv().await else {
                panic!("a probe")
            };
            tokio::time::sleep(Duration::from_millis(800)).await;
            // The probe's stream: a bookmark at a newer version.
            health.seen(Some(51));
            health.answer(id);
        });
        let (took, proofs) = barrier.bring_up_to_date().await;
        assert_eq!(proofs, vec![("ExternalWorkload", Proof::Probed)]);
        assert_eq!(took, Duration::from_millis(800));
        answering.await.expect("answered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_watch_is_relisted_after_the_probe_wait() {
        let (health, mut commands) = kind("EndpointSlice");
        let barrier = Barrier::new(vec![large(health.clone(), reading(7))]);
        let answering = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(command) = commands.recv().await {
                seen.push(command);
                if let Command::Relist(id) = command {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    health.answer(id);
                    return seen;
                }
                // A probe on a stalled connection: no answer.
            }
            seen
        });
        let (took, proofs) = barrier.bring_up_to_date().await;
        assert_eq!(proofs, vec![("EndpointSlice", Proof::Relisted)]);
        assert_eq!(took, PROBE_WAIT + Duration::from_secs(2));
        let seen = answering.await.expect("answered");
        assert!(matches!(seen[..], [Command::Probe(_), Command::Relist(_)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_answered_below_the_version_read_is_no_proof() {
        // Another API server instance, its watch cache lagging, serves the probe's stream: the
        // stream starts after the read, but its bookmark is older than the version read.
        let (health, mut commands) = kind("EndpointSlice");
        health.seen(Some(208));
        let barrier = Barrier::new(vec![large(health.clone(), reading(212))]);
        let answering = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(command) = commands.recv().await {
                seen.push(command);
                match command {
                    Command::Probe(id) => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        health.seen(Some(209));
                        health.answer(id);
                    }
                    Command::Relist(id) => {
                        health.seen(Some(213));
                        health.answer(id);
                        return seen;
                    }
                }
            }
            seen
        });
        let (took, proofs) = barrier.bring_up_to_date().await;
        assert_eq!(proofs, vec![("EndpointSlice", Proof::Relisted)]);
        assert_eq!(took, PROBE_WAIT);
        let seen = answering.await.expect("answered");
        assert!(matches!(seen[..], [Command::Probe(_), Command::Relist(_)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_version_that_is_not_a_number_is_relisted_without_a_probe() {
        let (health, mut commands) = kind("Service");
        let barrier = Barrier::new(vec![large(health.clone(), reading(0))]);
        let answering = tokio::spawn(async move {
            let Some(Command::Relist(id)) = commands.recv().await else {
                panic!("a re-list, not a probe")
            };
            health.answer(id);
        });
        let (_, proofs) = barrier.bring_up_to_date().await;
        assert_eq!(proofs, vec![("Service", Proof::Relisted)]);
        answering.await.expect("answered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_version_read_is_retried() {
        let (health, _commands) = kind("Service");
        health.seen(Some(9));
        let calls = Arc::new(AtomicU64::new(0));
        let read: ReadVersion = {
            let calls = calls.clone();
            Arc::new(move || {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if call < 2 {
                        Err(kube::Error::Api(Box::new(
                            kube::core::Status::failure("unavailable", "ServiceUnavailable")
                                .with_code(503),
                        )))
                    } else {
                        Ok(9)
                    }
                }
                .boxed()
            })
        };
        let (_, proofs) = Barrier::new(vec![large(health, read)])
            .bring_up_to_date()
            .await;
        assert_eq!(proofs, vec![("Service", Proof::AlreadyRead)]);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_cache_is_relisted_without_reading_a_version_first() {
        let (health, mut commands) = kind("Service");
        let kind = Kind {
            health: health.clone(),
            read: Arc::new(|| panic!("a small cache needs no version read")),
            cached: Arc::new(|| 12),
        };
        let answering = tokio::spawn(async move {
            let Some(Command::Relist(id)) = commands.recv().await else {
                panic!("a re-list")
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            health.answer(id);
        });
        let (took, proofs) = Barrier::new(vec![kind]).bring_up_to_date().await;
        assert_eq!(proofs, vec![("Service", Proof::Relisted)]);
        assert_eq!(took, Duration::from_millis(20));
        answering.await.expect("answered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_relist_threshold_probes_a_small_cache() {
        let (health, mut commands) = kind("Service");
        health.seen(Some(3));
        let kind = Kind {
            health: health.clone(),
            read: reading(5),
            cached: Arc::new(|| 12),
        };
        let answering = tokio::spawn(async move {
            let Some(Command::Probe(id)) = commands.recv().await else {
                panic!("a probe, not a re-list")
            };
            health.seen(Some(6));
            health.answer(id);
        });
        let (_, proofs) = Barrier::new(vec![kind])
            .relisting_at_most(0)
            .bring_up_to_date()
            .await;
        assert_eq!(proofs, vec![("Service", Proof::Probed)]);
        answering.await.expect("answered");
    }
}
