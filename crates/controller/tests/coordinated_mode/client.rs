//! The client of the coordinated mode tests: it keeps changing workloads and Services at a
//! chosen rate until stopped, and remembers when each change was accepted.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::{sync::watch, task::JoinHandle};

use harness::{
    CONVERGE,
    chaos::{
        churn::{Change, Model},
        world::World,
    },
};

/// The mean pause between two changes of a client at a modest rate (about 8 changes per second
/// with the API's own time).
pub const MODEST: Duration = Duration::from_millis(100);

/// The mean pause between two changes of a brisk client (a change every few tens of
/// milliseconds: some land within any window of about 100 ms).
pub const BRISK: Duration = Duration::from_millis(20);

/// A client that keeps changing workloads and Services until stopped.
pub struct Client {
    stop: watch::Sender<bool>,
    progress: watch::Receiver<usize>,
    task: JoinHandle<Finished>,
}

/// What a stopped [`Client`] wrote.
pub struct Finished {
    model: Model,
    last: Option<Change>,
    /// When each change was accepted, in order.
    pub times: Vec<Timestamp>,
}

// === impl Client ===

impl Client {
    /// Starts changing objects from the world's model, pausing 0..2×`pause` between changes.
    pub fn start(world: &mut World<'_>, pause: Duration) -> Client {
        let cluster = world.cluster.clone();
        let (mut model, mut rng) = (world.model.clone(), world.rng.fork());
        let (stop, stopped) = watch::channel(false);
        let (done, progress) = watch::channel(0);
        let task = tokio::spawn(async move {
            let (mut last, mut times) = (None, Vec::new());
            while !*stopped.borrow() {
                let change = model.random_change(&mut rng);
                model.apply(&cluster, &change).await;
                times.push(Timestamp::now());
                last = Some(change);
                done.send_replace(times.len());
                let jitter = rng.below(2000) as u32;
                tokio::time::sleep(pause * jitter / 1000).await;
            }
            Finished { model, last, times }
        });
        Client {
            stop,
            progress,
            task,
        }
    }

    /// Waits until `count` more changes were written.
    pub async fn wait_more(&mut self, count: usize) {
        let target = *self.progress.borrow() + count;
        tokio::time::timeout(CONVERGE, self.progress.wait_for(|done| *done >= target))
            .await
            .unwrap_or_else(|_| panic!("{target} client changes not made within {CONVERGE:?}"))
            .expect("the client task ended");
    }

    /// Stops after the change under way.
    pub async fn stop(self) -> Finished {
        self.stop.send_replace(true);
        self.task.await.expect("the client task failed")
    }
}

// === impl Finished ===

impl Finished {
    /// Waits until the slices show every change (the last one included), and makes the
    /// client's model the world's.
    pub async fn published(&self, world: &mut World<'_>) {
        world.model = self.model.clone();
        world.changes += self.times.len();
        let model = world.model.clone();
        model
            .wait_reflected(&world.cluster, self.last.as_ref())
            .await;
    }

    /// Changes accepted between `from` and `to`.
    pub fn made_between(&self, from: Timestamp, to: Timestamp) -> usize {
        let within = |time: &&Timestamp| **time > from && **time < to;
        self.times.iter().filter(within).count()
    }
}
