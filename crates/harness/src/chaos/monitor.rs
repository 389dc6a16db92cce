//! [`LeaderMonitor`]: samples every replica's `external_endpoints_leader` gauge, to find two
//! leaders in one sample and the longest stretch with none.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio::{task::JoinHandle, time::Instant};

use crate::{Replica, sum_metric};

/// Samples the leader gauge of every replica it was given, every 100 ms.
pub struct LeaderMonitor {
    replicas: Arc<Mutex<Vec<(String, SocketAddr)>>>,
    state: Arc<Mutex<MonitorState>>,
    task: JoinHandle<()>,
}

/// What the monitor saw.
#[derive(Clone, Debug, Default)]
pub struct MonitorState {
    /// Samples taken.
    pub samples: usize,
    /// Samples in which two or more replicas led, with who.
    pub overlaps: Vec<Vec<String>>,
    /// The longest stretch without a leader.
    pub longest_leaderless: Duration,
    /// Since when nobody leads (None while someone does).
    leaderless_since: Option<Instant>,
}

impl LeaderMonitor {
    /// Starts sampling (no replicas yet: see [`LeaderMonitor::add`]).
    pub fn start() -> LeaderMonitor {
        let replicas: Arc<Mutex<Vec<(String, SocketAddr)>>> = Arc::default();
        let state: Arc<Mutex<MonitorState>> = Arc::default();
        let task = {
            let (replicas, state) = (replicas.clone(), state.clone());
            tokio::spawn(async move {
                loop {
                    let targets = replicas.lock().clone();
                    let mut leading = Vec::new();
                    for (identity, admin) in targets {
                        if is_leader(admin).await {
                            leading.push(identity);
                        }
                    }
                    let now = Instant::now();
                    {
                        let mut state = state.lock();
                        state.samples += 1;
                        if leading.len() > 1 {
                            state.overlaps.push(leading.clone());
                        }
                        if leading.is_empty() {
                            let since = *state.leaderless_since.get_or_insert(now);
                            state.longest_leaderless = state.longest_leaderless.max(now - since);
                        } else {
                            state.leaderless_since = None;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        LeaderMonitor {
            replicas,
            state,
            task,
        }
    }

    /// Samples `replica` too, from now on (a replica that exits counts as not leading).
    pub fn add(&self, replica: &Replica) {
        let mut replicas = self.replicas.lock();
        if replicas
            .iter()
            .all(|(identity, _)| *identity != replica.identity)
        {
            replicas.push((replica.identity.clone(), replica.admin()));
        }
    }

    /// Stops sampling every replica but `replicas`. Call it once the others have exited and
    /// before new replicas start: a new admin server may get the port of one that exited, and
    /// would then be sampled under two names.
    pub fn retain(&self, replicas: &[&Replica]) {
        self.replicas
            .lock()
            .retain(|(identity, _)| replicas.iter().any(|r| r.identity == *identity));
    }

    /// What it saw so far.
    pub fn state(&self) -> MonitorState {
        self.state.lock().clone()
    }

    /// Forgets the longest leaderless stretch (a new round starts).
    pub fn reset_longest(&self) {
        self.state.lock().longest_leaderless = Duration::ZERO;
    }
}

impl Drop for LeaderMonitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn is_leader(admin: SocketAddr) -> bool {
    let scrape = tokio::time::timeout(Duration::from_secs(2), crate::http_get(admin, "/metrics"));
    match scrape.await {
        Ok(Ok((_, body))) => sum_metric(&body, "external_endpoints_leader", "") == Some(1.0),
        _ => false,
    }
}
