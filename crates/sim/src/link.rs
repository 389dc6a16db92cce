//! Each replica's link to the API server, where network and process faults are placed: a tower
//! layer between the replica's `kube::Client` and the in-memory API.
//!
//! ```text
//!  replica's kube::Client ─► LinkService (cut? paused? 503? slow?) ─► in-memory API
//!                       ◄── FaultBody (watch frames: lagged, held, stalled, broken) ◄──
//! ```
//!
//! Every slice write the API applies for this replica is reported to the [`Checks`] with the
//! process incarnation that sent it (each start of the replica's process gets a
//! [`LinkService`] of its own), so a write from an ended tenure is caught at the instant it
//! lands; Lease writes carry their incarnation to the checks' record of the Lease the same way.
//!
//! This module holds the link's faults, switched on and off by the world or a script; `service`
//! carries one request through them, `body` an answer's frames.

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

pub use self::{body::FaultBody, service::LinkService};
use crate::{checks::Checks, rng::Rng};

mod body;
mod service;

/// Errors crossing the link.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One replica's link: its faults, and how to reach the world.
pub struct Link {
    replica: usize,
    state: Mutex<LinkState>,
    changed: watch::Sender<u64>,
    exits: mpsc::UnboundedSender<(usize, AtWrite)>,
}

/// What a fault armed on the link's next slice write did, for the world to follow up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtWrite {
    /// The write was applied and the process is to be killed now.
    Crash,
    /// The write is on the wire (held) and the process is to be asked to stop.
    Stop,
    /// The link is paused with the write on the wire; the world ends the pause.
    Pause,
}

/// A fault waiting for the link's next slice write.
#[derive(Clone, Copy, Debug)]
enum Armed {
    /// Hold the write this long, and have the process asked to stop as it goes out.
    Stop(Duration),
    /// Pause the link as the write goes out (the write waits with everything else).
    Pause,
}

#[derive(Default)]
struct LinkState {
    cut: bool,
    paused: bool,
    error_percent: u64,
    slow: Duration,
    lag: Duration,
    /// Streams with an id below this are silent for good.
    stalled_below: u64,
    /// The resource (plural name) whose watch frames are held until released (scripted runs).
    held: Option<String>,
    /// The resource whose watch frames arrive this much later again (scripted runs).
    lagging: Option<(String, Duration)>,
    /// Frames read from the API and not yet delivered, over every open stream.
    undelivered: usize,
    /// Whether the answer to the next applied slice write is to be held (scripted runs).
    hold_answer: bool,
    /// Whether an applied slice write's answer is held now.
    answer_held: bool,
    /// How many of the next applied slice writes lose their answer.
    lose_answers: u32,
    /// Streams with an id below this end (with an error when `broken`).
    ended_below: u64,
    next_stream: u64,
    crash_after_write: bool,
    /// A fault waiting for the next slice write.
    armed: Option<Armed>,
    /// Writes handed to the link that the API has neither applied nor refused yet.
    writes_in_flight: usize,
    /// Requests other than watches handed to the link whose answer has not reached the replica
    /// yet (held by a fault on the way there or back).
    exchanges_in_flight: usize,
    rng: Option<Rng>,
    /// Watch streams still open (not dropped by the replica), with their resource, and the
    /// last stream opened of each resource.
    open: std::collections::BTreeMap<u64, String>,
    latest: std::collections::BTreeMap<String, u64>,
    /// Each cached kind whose last stream is silenced and still open, with when it became so.
    /// Per kind: a kind's blindness ends when its loop opens another stream, even while another
    /// kind's goes on.
    blind_since: std::collections::BTreeMap<String, tokio::time::Instant>,
    checks: Option<Arc<Checks>>,
}

// === impl Link ===

impl Link {
    /// The link of replica `replica`; `exits` receives the replica's number when a fault armed
    /// on a write ends its process.
    pub fn new(
        replica: usize,
        rng: Rng,
        exits: mpsc::UnboundedSender<(usize, AtWrite)>,
    ) -> Arc<Self> {
        Arc::new(Self {
            replica,
            state: Mutex::new(LinkState {
                rng: Some(rng),
                ..LinkState::default()
            }),
            changed: watch::channel(0).0,
            exits,
        })
    }

    /// The checks, to tell whether a stalled stream is open (set at each start).
    pub fn attach(&self, checks: Arc<Checks>) {
        self.update(|state| state.checks = Some(checks));
    }

    /// Requests fail and open streams break, until [`Link::heal`].
    pub fn cut(&self) {
        self.update(|state| {
            state.cut = true;
            state.ended_below = state.next_stream;
        });
    }

    /// Requests are held and streams deliver nothing, until [`Link::heal`].
    pub fn pause(&self) {
        self.update(|state| state.paused = true);
    }

    /// `percent` of requests are answered 503.
    pub fn errors(&self, percent: u64) {
        self.update(|state| state.error_percent = percent);
    }

    /// Answers arrive `delay` late, and each request reaches the API server up to `delay` late
    /// (a random share of it: requests overtake one another, as on separate connections or in
    /// the server's own handlers).
    pub fn slow(&self, delay: Duration) {
        self.update(|state| state.slow = delay);
    }

    /// Watch events arrive `lag` late.
    pub fn lag(&self, lag: Duration) {
        self.update(|state| state.lag = lag);
    }

    /// The streams open now go silent for good (the replica must notice and reconnect).
    pub fn stall(&self) {
        self.update(|state| state.stalled_below = state.next_stream);
    }

    /// The streams open now end (the replica resumes, or lists again).
    pub fn end_streams(&self) {
        self.update(|state| state.ended_below = state.next_stream);
    }

    /// The replica crashes right after its next slice write is applied.
    pub fn crash_after_next_write(&self) {
        self.update(|state| state.crash_after_write = true);
    }

    /// The replica's next slice write is held on the wire for `hold`, and the replica is asked
    /// to stop (SIGTERM) as it is sent: a graceful stop with a write in flight.
    pub fn stop_during_next_write(&self, hold: Duration) {
        self.update(|state| state.armed = Some(Armed::Stop(hold)));
    }

    /// The link pauses as the replica's next slice write goes out, so that write is held on the
    /// wire with everything else until the world ends the pause.
    pub fn pause_at_next_write(&self) {
        self.update(|state| state.armed = Some(Armed::Pause));
    }

    /// Watch frames of `resource` (a plural name, `endpointslices`), on open streams and on any
    /// opened later, are held until [`Link::release_watches`]: a watch that does not show what
    /// the API stored, then catches up in order.
    pub fn hold_watches_of(&self, resource: &str) {
        self.update(|state| state.held = Some(resource.to_string()));
    }

    /// Held watch frames go through.
    pub fn release_watches(&self) {
        self.update(|state| state.held = None);
    }

    /// Watch frames of `resource` read from now on arrive `lag` late (on top of [`Link::lag`]).
    pub fn lag_watches_of(&self, resource: &str, lag: Duration) {
        self.update(|state| state.lagging = Some((resource.to_string(), lag)));
    }

    /// Watch frames of the lagging resource read from now on arrive on time again.
    pub fn unlag_watches(&self) {
        self.update(|state| state.lagging = None);
    }

    /// The replica's next `count` slice writes that the API applies lose their answers: the
    /// writer sees a broken connection, and cannot tell whether the write was applied.
    pub fn lose_next_answers(&self, count: u32) {
        self.update(|state| state.lose_answers += count);
    }

    /// Frames the API sent on watch streams that the replica has not received yet (held,
    /// lagged, paused).
    pub fn undelivered_frames(&self) -> usize {
        self.state.lock().undelivered
    }

    /// The answer to the replica's next slice write that the API applies is held until
    /// [`Link::release_answer`]: the write is stored, the writer still waits.
    pub fn hold_next_answer(&self) {
        self.update(|state| state.hold_answer = true);
    }

    /// Whether an applied slice write's answer is being held.
    pub fn answer_held(&self) -> bool {
        self.state.lock().answer_held
    }

    /// The held answer goes to the replica.
    pub fn release_answer(&self) {
        self.update(|state| state.answer_held = false);
    }

    /// The cut ends.
    pub fn uncut(&self) {
        self.update(|state| state.cut = false);
    }

    /// The pause ends: held requests and frames go through.
    pub fn unpause(&self) {
        self.update(|state| state.paused = false);
    }

    /// Every fault of this link ends (stalled streams stay stalled: the replica replaces them).
    pub fn heal(&self) {
        self.update(|state| {
            state.cut = false;
            state.paused = false;
            state.error_percent = 0;
            state.slow = Duration::ZERO;
            state.lag = Duration::ZERO;
            state.crash_after_write = false;
            state.armed = None;
            state.held = None;
            state.lagging = None;
            state.hold_answer = false;
            state.answer_held = false;
            state.lose_answers = 0;
        });
    }

    /// Writes handed to the link that the API has not answered yet (held, delayed).
    pub fn writes_in_flight(&self) -> usize {
        self.state.lock().writes_in_flight
    }

    /// Requests (watches aside) handed to the link whose answer the replica has not received:
    /// a read whose answer a slow link still holds can still make the replica write.
    pub fn exchanges_in_flight(&self) -> usize {
        self.state.lock().exchanges_in_flight
    }

    /// Whether the replica's requests reach the API server now (no cut, no pause).
    pub fn reachable(&self) -> bool {
        let state = self.state.lock();
        !state.cut && !state.paused
    }

    /// Whether any fault is in force: one set on the link, a watch stream still stalled (the
    /// replica has not yet replaced it: within the stall bound, its cache cannot see what others
    /// write), a lagging kind, or answers to be lost.
    pub fn faulty(&self) -> bool {
        let state = self.state.lock();
        state.cut
            || state.paused
            || state.error_percent > 0
            || !state.slow.is_zero()
            || !state.lag.is_zero()
            || state.lagging.is_some()
            || state.held.is_some()
            || state.lose_answers > 0
            || state.open.keys().any(|id| *id < state.stalled_below)
    }

    fn update(&self, change: impl FnOnce(&mut LinkState)) {
        {
            let mut state = self.state.lock();
            change(&mut state);
            state.report_stalls(self.replica);
        }
        self.changed.send_modify(|generation| *generation += 1);
    }

    async fn answer_released(&self) {
        let mut changed = self.changed.subscribe();
        while self.state.lock().answer_held {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    async fn unpaused(&self) {
        let mut changed = self.changed.subscribe();
        while self.state.lock().paused {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    fn roll_error(&self) -> bool {
        let mut state = self.state.lock();
        let percent = state.error_percent;
        percent > 0 && state.rng.as_mut().is_some_and(|rng| rng.chance(percent))
    }

    /// How late the next request reaches the API server.
    fn roll_delay(&self) -> Duration {
        let mut state = self.state.lock();
        let slow = u64::try_from(state.slow.as_millis()).unwrap_or(u64::MAX);
        match state.rng.as_mut() {
            Some(rng) if slow > 0 => Duration::from_millis(rng.below(slow + 1)),
            _ => Duration::ZERO,
        }
    }

    fn open_stream(&self, resource: &str) -> u64 {
        let mut state = self.state.lock();
        state.next_stream += 1;
        let id = state.next_stream - 1;
        state.open.insert(id, resource.to_string());
        state.latest.insert(resource.to_string(), id);
        state.report_stalls(self.replica);
        id
    }

    fn close_stream(&self, id: u64) {
        let mut state = self.state.lock();
        state.open.remove(&id);
        state.report_stalls(self.replica);
    }
}

// === impl LinkState ===

impl LinkState {
    /// Tells the checks whether a stream a fault silenced is still open.
    fn report_stalls(&mut self, replica: usize) {
        let silenced = |id: &u64| *id < self.stalled_below;
        let stalled = self.open.keys().any(silenced);
        // A cached kind is blind while the last stream its loop opened is silenced and still
        // open (once the loop opened another, it has noticed, even if it still holds the
        // silenced one); the elector's Lease watch is no cache.
        let blind: Vec<String> = self
            .latest
            .iter()
            .filter(|(resource, id)| {
                resource.as_str() != "leases" && silenced(id) && self.open.contains_key(id)
            })
            .map(|(resource, _)| resource.clone())
            .collect();
        let now = tokio::time::Instant::now();
        self.blind_since
            .retain(|resource, _| blind.contains(resource));
        for resource in blind {
            self.blind_since.entry(resource).or_insert(now);
        }
        // The kind blind the longest: another kind going blind later does not reset it, and its
        // recovery does not hide the other's.
        let blind_since = self.blind_since.values().min().copied();
        if let Some(checks) = &self.checks {
            checks.set_stalled(replica, stalled, blind_since);
        }
    }
}
