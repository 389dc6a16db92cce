//! Leadership for Kubernetes controllers that must lose nothing when the leader changes.
//!
//! This crate knows nothing of any particular resource. It elects one writer among replicas with
//! a `coordination.k8s.io/v1` Lease ([`LeaseElector`]), publishes leadership as a value
//! ([`Leadership`]: the current [`Term`] or none), runs the app's event handlers only while
//! leading ([`Dispatcher`]), queues and retries work per term, fences every write ([`Fence`]),
//! and shuts down without dropping work ([`Runtime`]).
//!
//! ```text
//!  watches (every replica, always)      Dispatcher              queue of term t       workers
//!  caches ──events──► dispatch(|ctx| …) ─► handlers run only ─► keys (dedup, retry) ─► reconcile(key, ctx)
//!                                          while leading                                   │
//!                                                                          ctx.fence().check()
//!                                                                          right before each write
//!  Lease ◄──► LeaseElector ──Leadership (Option<Term>)──► Runtime: prepare, start, stop terms
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
//! - **Watch-based take-over.** Followers watch the Lease, so a released Lease is taken within
//!   one API round trip, not at the next poll; a crashed leader's Lease is taken LeaseDuration
//!   after the last change a follower observed.
//! - **Handlers only while leading.** The [`Dispatcher`] runs an event handler only while a term
//!   is registered, with that term's [`TermContext`]; it can queue keys for the current term and
//!   nothing else. Start and stop are ordered by term id and idempotent, so a late "started" can
//!   never leave handlers registered on a follower.
//! - **Fresh state and a full replay every term.** A term first awaits
//!   [`Reconciler::prepare_term`] (bring caches up to date), then, under one lock, builds new
//!   per-term state ([`Reconciler::start_term`]: an app's stale-cache tracker lives there),
//!   registers the handlers and replays every cached object ([`Reconciler::replay`]). When the
//!   term ends, its queued and retrying keys are dropped. State carried over from an earlier term
//!   can be wrong about what happened while following; a fresh one cannot.
//! - **Drain, then release.** On shutdown the [`Runtime`] stops intake, drains queued and
//!   in-flight work (still fenced) within a deadline, then releases the Lease (holder cleared),
//!   and a follower takes over at once.
//! - **No key dropped for failing.** Keys are deduplicated, one worker at a time per key,
//!   retried with per-key exponential backoff under a global rate limit, and past the cap they
//!   keep retrying (counted in [`QueueMetrics`]). Keys belong to a term: when it ends, its queued
//!   and retrying keys are dropped with it, and the next term replays every cached object.
//! - **No silent hang, no silent death.** A term whose preparation outlasts
//!   [`RuntimeConfigBuilder::prepare_timeout`] is given up ([`ElectorHandle::give_up`]: the Lease
//!   released, counted in [`ElectorMetrics::terms_given_up`], competing again after
//!   LeaseDuration) while `run` goes on as a follower. If the elector task ends on its own,
//!   [`Runtime::run`] returns [`RuntimeError::ElectorLost`]; the run future, its result,
//!   [`ElectorHandle`] and [`Runtime`] are `#[must_use]`.
//! - **One Lease, several controllers.** [`ElectorHandle::share`] gives each [`Runtime`] its own
//!   handle on one elector: they start and stop with the same terms, and the Lease is released
//!   after the last of them has drained. An app that keeps kube-runtime's `Controller` takes a
//!   [`Fence`] per term ([`Fence::current`]) and stops the term's work on [`Fence::ended`].
//!
//! # Wiring
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use leadership::{
//!     Action, CancellationToken, LeaseConfig, LeaseElector, LeaseTimings, Reconciler, Runtime,
//!     RuntimeConfig, RuntimeError, Term, TermContext,
//! };
//!
//! #[derive(Default)]
//! struct Tracker; // what this term wrote: fresh every term
//!
//! struct App;
//!
//! impl Reconciler for App {
//!     type Key = String;
//!     type TermState = Tracker;
//!     type Error = leadership::Fenced;
//!
//!     fn start_term(&self, _term: &Term) -> Tracker {
//!         Tracker::default()
//!     }
//!
//!     fn replay(&self, context: &TermContext<String, Tracker>) {
//!         context.enqueue("ns/name".to_string()); // every cached key, from the app's caches
//!     }
//!
//!     fn reconcile(
//!         &self,
//!         key: String,
//!         context: TermContext<String, Tracker>,
//!     ) -> impl Future<Output = Result<Action, leadership::Fenced>> + Send + 'static {
//!         async move {
//!             context.fence().check()?; // immediately before each write
//!             let _ = (key, context.state());
//!             Ok(Action::Done)
//!         }
//!     }
//! }
//!
//! # async fn example(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let lease = LeaseConfig::new("my-controller", "my-namespace", "pod-0", LeaseTimings::default())?;
//! let runtime = Runtime::new(RuntimeConfig::builder().workers(4).build()?, App);
//!
//! // In each watch stream (every replica, always), after updating the cache:
//! let dispatcher = runtime.dispatcher();
//! dispatcher.dispatch(|context| context.enqueue("ns/name".to_string()));
//!
//! // Join the election only once the caches are ready (a replica that won before they had
//! // synced would replay an empty cache): see the README's example.
//! let elector = LeaseElector::for_client(client, lease).spawn();
//! let shutdown = CancellationToken::new(); // cancel on SIGTERM
//! match runtime.run(elector, shutdown).await {
//!     Ok(()) => {} // drained and released
//!     // Not something to log and carry on from: exit non-zero so the process is restarted.
//!     Err(RuntimeError::ElectorLost(error)) => return Err(error.into()),
//!     Err(error) => return Err(error.into()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A complete controller is in `examples/namespace_labels.rs` (it copies a Namespace label onto
//! the namespace's ConfigMaps); its test runs two replicas on a real API server through a
//! graceful hand-over, a crash, and a leader that loses and regains the Lease.
//!
//! # Watches
//!
//! The elector's Lease watch runs on the watch loop of the `kube-watch-loop` crate (published
//! beside this one): list (streaming when offered), watch from the list's version, resume from
//! the last version read, re-list after 410, back off on errors, and restart a stream silent past
//! a bound. An app may run its own watches on it too, so that every watch of a process reconnects
//! by the same rules; nothing here requires it.
//!
//! # TLS
//!
//! The crate depends on `kube` without a TLS stack; the application enables one (`kube`'s
//! `rustls-tls` or `openssl-tls` feature) for its own client.
//!
//! # Features
//!
//! - `test-util`: the `testing` module: hand-driven terms and fences, for an app's own
//!   paused-time tests.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod api_fence;
mod elector;
mod fence;
mod gate;
mod health;
mod queue;
mod runtime;
mod safeguards;
mod store;
mod term;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

/// The token [`Runtime::run`] stops on (`tokio_util::sync::CancellationToken`), re-exported so
/// that an app needs no `tokio-util` dependency of its own.
pub use tokio_util::sync::CancellationToken;

/// The README's example, compiled by the doc tests so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use self::{
    api_fence::{FENCING_POLICY_DENIAL, FENCING_POLICY_TEMPLATE, is_fencing_policy_denial},
    elector::{
        CandidateConfig, CandidateError, ElectorError, ElectorHandle, ElectorMetrics, LeaseConfig,
        LeaseConfigError, LeaseElector, LeaseTimings,
    },
    fence::{Fence, FenceMetrics, Fenced},
    gate::{Dispatcher, TermContext},
    health::{LeaderHealth, LeaderUnhealthy},
    queue::{QueueKey, QueueMetrics},
    runtime::{
        Action, Reconciler, Runtime, RuntimeConfig, RuntimeConfigBuilder, RuntimeConfigError,
        RuntimeError,
    },
    safeguards::Safeguards,
    term::{FencingToken, Leadership, Term},
};
