//! One worker of the runtime: takes keys from the queue and reconciles them in their term's
//! context, then forgets, requeues or retries each as the reconcile answered.

use std::fmt::Display;

use tracing::{Instrument, debug, warn};

use super::{Action, ReconcileFn};
use crate::{
    gate::Gate,
    queue::{QueueKey, WorkItem, WorkQueue},
};

/// One worker: takes keys from the queue and reconciles them in their term's context.
pub(super) struct Worker<K, S, E> {
    pub(super) queue: WorkQueue<K>,
    pub(super) gate: Gate<K, S>,
    pub(super) reconcile: ReconcileFn<K, S, E>,
}

// === impl Worker ===

impl<K, S, E> Worker<K, S, E>
where
    K: QueueKey,
    S: Send + Sync + 'static,
    E: Display + Send + 'static,
{
    pub(super) async fn run(self) {
        while let Some(item) = self.queue.next().await {
            self.process(&item).await;
            self.queue.done(item);
        }
    }

    async fn process(&self, item: &WorkItem<K>) {
        let term = item.term();
        let Some(context) = self.gate.context(term) else {
            debug!(key = ?item.key(), term, "term over; dropping key");
            return;
        };
        let span = tracing::info_span!("reconcile", key = ?item.key(), term);
        let key = item.key().clone();
        match (self.reconcile)(key.clone(), context)
            .instrument(span)
            .await
        {
            Ok(Action::Done) => self.queue.forget(&key),
            Ok(Action::RequeueAfter(delay)) => {
                self.queue.forget(&key);
                self.queue.add_after(term, key, delay);
            }
            Err(error) => {
                warn!(key = ?key, term, %error, "reconcile failed; retrying with backoff");
                self.queue.add_rate_limited(term, key);
            }
        }
    }
}
