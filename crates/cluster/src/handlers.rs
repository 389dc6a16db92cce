//! Handlers: what a change seen by a watch means for the queue, while leading; and the state a
//! term carries, which the handlers and the reconciles of that term share.
//!
//! The watches call these on every replica, always; [`Dispatcher::dispatch`] runs the closure only
//! while this replica leads, under the runtime's registration lock, so a handler never runs on a
//! follower.
//!
//! A watch's route to the queue is named by types, not closures: the watch hands each change to
//! its [`ChangeSink`], a [`Dispatch`] of the kind's [`Handler`] ([`OnService`], [`OnWorkload`],
//! [`OnSlice`]).
//!
//! This module depends on the caches only: the reconcile (which uses [`replay`] and
//! [`TermState`]) sits above it, the wiring above both.

use std::sync::Arc;

use leadership::{Dispatcher, TermContext};
use parking_lot::Mutex;
use slices::{CachedService, CachedSlice, CachedWorkload, ServiceKey, Tracker, affected};
use tokio::time::Instant;

use crate::{
    caches::Caches,
    store::Change,
    timing::{Stage, Timing, TimingMetrics},
    watch::ChangeSink,
};

/// The dispatch-only handle of this controller's handlers.
pub type ServiceDispatcher = Dispatcher<ServiceKey, TermState>;

/// The context handlers and reconciles get.
pub type Context = TermContext<ServiceKey, TermState>;

/// Per-term state: built fresh for every term (the stale-tracker scenario, docs/slices.md).
pub struct TermState {
    /// What this term wrote and deleted: the slice handler skips our own writes coming back;
    /// a Service whose write had an unknown outcome is read back before it is planned again.
    pub tracker: Mutex<Tracker>,
    /// Each queued key's trigger and the time it spends in each stage.
    pub timing: Timing,
}

// === impl TermState ===

impl TermState {
    /// Fresh state for a term, timing into `metrics`.
    pub fn new(metrics: TimingMetrics) -> Self {
        Self {
            tracker: Mutex::default(),
            timing: Timing::new(metrics),
        }
    }
}

/// What a change of one kind means for the queue, while leading.
pub trait Handler<C>: Send + 'static {
    /// Queues what `change` affects in the term of `context`.
    fn handle(&self, context: &Context, change: &Change<C>);
}

/// Services: [`on_service`].
pub struct OnService;

/// Workloads: [`on_workload`], reading the caches.
pub struct OnWorkload(pub Arc<Caches>);

/// Managed slices: [`on_slice`], with the slice settings.
pub struct OnSlice(pub slices::Config);

/// A watch's changes through `handler`, while leading (the dispatcher runs nothing on a
/// follower), timing each from its event to its keys.
pub struct Dispatch<H> {
    /// The dispatcher of the runtime.
    pub dispatcher: ServiceDispatcher,
    /// The kind's handler.
    pub handler: H,
}

// === impl Handler ===

impl Handler<CachedService> for OnService {
    fn handle(&self, context: &Context, change: &Change<CachedService>) {
        on_service(context, change);
    }
}

impl Handler<CachedWorkload> for OnWorkload {
    fn handle(&self, context: &Context, change: &Change<CachedWorkload>) {
        on_workload(context, &self.0, change);
    }
}

impl Handler<CachedSlice> for OnSlice {
    fn handle(&self, context: &Context, change: &Change<CachedSlice>) {
        on_slice(context, &self.0, change);
    }
}

// === impl Dispatch ===

impl<C: Send + Sync + 'static, H: Handler<C>> ChangeSink<C> for Dispatch<H> {
    fn send(&mut self, change: Change<C>, received: Instant) {
        let handler = &self.handler;
        self.dispatcher.dispatch(|context| {
            handler.handle(context, &change);
            let timing = context.state().timing.metrics();
            timing.observe(Stage::event_to_key, received.elapsed());
        });
    }
}

/// Queues `key` for a change seen now.
fn trigger(context: &Context, key: ServiceKey) {
    context.state().timing.triggered(&key, Instant::now());
    context.enqueue(key);
}

/// A Service change names that Service (add, update and delete alike).
pub fn on_service(context: &Context, change: &Change<CachedService>) {
    if let Some(service) = change.new.as_ref().or(change.old.as_ref()) {
        trigger(context, affected::for_service(service));
    }
}

/// A workload change names the Services that select its old or new version, when something the
/// slices show changed.
pub fn on_workload(context: &Context, caches: &Caches, change: &Change<CachedWorkload>) {
    let mut candidates: Vec<Arc<CachedService>> = Vec::new();
    for workload in change.old.iter().chain(change.new.iter()) {
        candidates.extend(caches.candidate_services(workload));
    }
    let services = candidates.iter().map(Arc::as_ref);
    for key in affected::for_workload(change.old.as_deref(), change.new.as_deref(), services) {
        trigger(context, key);
    }
}

/// A managed slice change names its Service, unless it is this term's own write coming back
/// (the cache already holds its answer: nothing waits for the echo).
pub fn on_slice(context: &Context, config: &slices::Config, change: &Change<CachedSlice>) {
    let keys = {
        let mut tracker = context.state().tracker.lock();
        tracker.observe(change.old.as_deref(), change.new.as_deref());
        affected::for_slice(
            change.old.as_deref(),
            change.new.as_deref(),
            config,
            &tracker,
        )
    };
    if keys.is_empty() {
        if let Some(slice) = change.new.as_deref().or(change.old.as_deref()) {
            context.state().timing.echoed(&slice.namespace, &slice.name);
        }
        return;
    }
    for key in keys {
        trigger(context, key);
    }
}

/// Passes every cached Service and slice through the handlers, from the caches (no API LIST):
/// run when a term starts and on each periodic resync.
///
/// The workloads are not passed (issue 34: at 50,000 workloads they were most of the replay's
/// work): a workload names only Services of the Service cache that select it, and the Service
/// loop has queued every one of those already. The slices are passed: a slice can name a Service
/// the cache no longer has (its pass forgets it), and the tracker observes each.
pub fn replay(context: &Context, caches: &Caches, config: &slices::Config) {
    for service in caches.services.all() {
        on_service(
            context,
            &Change {
                old: None,
                new: Some(service),
            },
        );
    }
    for slice in caches.slices.all() {
        on_slice(
            context,
            config,
            &Change {
                old: None,
                new: Some(slice),
            },
        );
    }
}
