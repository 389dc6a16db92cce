//! Leadership for Kubernetes controllers that must lose nothing when the leader changes.
//!
//! This crate knows nothing of any particular resource. It elects one writer among replicas with
//! a `coordination.k8s.io/v1` Lease, publishes leadership as a value ([`Leadership`]: the current
//! [`Term`] or none), runs the app's event handlers only while leading, queues and retries work
//! per term, fences every write, and shuts down without dropping work.
//!
//! ```text
//!  watches (every replica, always)         Gate                    WorkQueue        workers
//!  caches ──events──► gate.dispatch(|ctx| …) ─► handlers on only ─► keys of term t ─► reconcile(key, ctx)
//!                                               while leading         (dedup, retry)        │
//!                                                                                      ctx.fence().check()
//!                                                                                      right before each write
//!  Lease ◄──► LeaseElector ──Leadership (Option<Term>)──► Runtime: start(t) / stop(t) on the Gate
//! ```
//!
//! # Guarantees
//!
//! - **At most one leader.** Every Lease write is a replace guarded by resourceVersion, and
//!   expiry is judged by the local time the record was seen to change (never by comparing clocks),
//!   as in client-go. A leader keeps leading through failed renewals only until RenewDeadline
//!   (< LeaseDuration) has passed without a success, and steps down at once when it sees another
//!   holder with an unexpired lease.
//! - **A deposed leader writes nothing.** [`Fence::check`], called immediately before every API
//!   call, passes only while the work's term is the current term and the last successful renewal
//!   plus RenewDeadline minus a margin is in the future.
//! - **Fresh state and a full replay every term.** When term t starts, the [`Gate`] builds new
//!   per-term state (an app's stale-cache tracker lives there), registers the handlers and replays
//!   every cached object, under one lock; when t ends, it deregisters and drops t's queued and
//!   retrying keys. Start/stop are ordered by term id and idempotent, so a late "started" can never
//!   leave handlers registered on a follower.
//! - **Nothing lost on hand-over.** On shutdown the [`Runtime`] stops intake, drains queued and
//!   in-flight work (still fenced) within a deadline, then releases the Lease (holder cleared), and
//!   followers, which watch the Lease, take over at once.
//! - **No key dropped for failing.** The [`WorkQueue`] deduplicates keys, gives a key to one
//!   worker at a time, retries with per-key exponential backoff under a global rate limit, and
//!   keeps retrying at the cap (counted) instead of giving up.
//! - **Failures are visible.** If the elector task ends on its own, [`Runtime::run`] returns an
//!   error; it never keeps running without an election.
//!
//! # Wiring
//!
//! ```no_run
//! use leadership::{
//!     Action, LeaseConfig, LeaseElector, LeaseTimings, Reconciler, Runtime, RuntimeConfig, Term,
//!     TermContext,
//! };
//! use tokio_util::sync::CancellationToken;
//!
//! struct Tracker;
//! struct App;
//!
//! impl Reconciler for App {
//!     type Key = String;
//!     type TermState = Tracker;
//!     type Error = String;
//!
//!     fn start_term(&self, _term: &Term) -> Tracker {
//!         Tracker // fresh per-term state
//!     }
//!
//!     fn replay(&self, context: &TermContext<String, Tracker>) {
//!         context.enqueue("ns/svc".to_string()); // every cached key
//!     }
//!
//!     fn reconcile(
//!         &self,
//!         key: String,
//!         context: TermContext<String, Tracker>,
//!     ) -> impl Future<Output = Result<Action, String>> + Send + 'static {
//!         async move {
//!             context.fence().check().map_err(|fenced| fenced.to_string())?; // before each write
//!             let _ = (key, context.state());
//!             Ok(Action::Done)
//!         }
//!     }
//! }
//!
//! # async fn example(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let config = LeaseConfig::new("my-controller", "my-namespace", "pod-0", LeaseTimings::default())?;
//! let elector = LeaseElector::for_client(client, config).spawn();
//!
//! let runtime = Runtime::new(RuntimeConfig::default(), App);
//! let gate = runtime.gate();
//! // In each watch stream, on every event: gate.dispatch(|context| context.enqueue(key));
//! # let _ = gate;
//! let shutdown = CancellationToken::new();
//! runtime.run(elector, shutdown).await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod elector;
pub mod fence;
pub mod gate;
pub mod queue;
pub mod runtime;
pub mod store;
pub mod term;

pub use self::{
    elector::{
        CandidateConfig, CandidateError, ConfigError, ElectorError, ElectorHandle, ElectorMetrics,
        KubeLeaseCandidateStore, LeaseCandidateStore, LeaseConfig, LeaseElector, LeaseTimings,
    },
    fence::{Fence, FenceMetrics, Fenced},
    gate::{Gate, TermContext},
    queue::{QueueConfig, QueueKey, TermQueue, WorkItem, WorkQueue},
    runtime::{Action, Reconciler, Runtime, RuntimeConfig, RuntimeError},
    store::{KubeLeaseStore, LeaseStore, MemoryLeaseStore, StoreError},
    term::{Leadership, LeadershipSender, Term, fixed_leadership},
};
