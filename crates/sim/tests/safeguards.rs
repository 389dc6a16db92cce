//! Each safeguard has teeth: with it switched off (a test-only switch, absent from the binary),
//! and without the API server's fence behind it, the simulation finds a violation within a
//! bounded number of seeds. The seed and the check it
//! breaks are printed (docs/benchmarks.md keeps the table).
//!
//! The drain before release is found out by the faults that strike with a slice write on the
//! wire (`Options::during_write`): a graceful stop while a write is held (without the drain, the
//! Lease is released first, and the write lands in the next holder's term). Version-fenced
//! deletes are shown by a scripted scenario instead (see below).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use sim::{
    Options, Safeguard, Setup,
    sweep::{sweep, threads, write_trace},
};

/// Seeds searched per safeguard before the test gives up: `default`, or `SIM_SEARCH`.
fn search(default: u64) -> u64 {
    std::env::var("SIM_SEARCH")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(default)
}

fn finds_a_violation_without(off: Safeguard) {
    finds_a_violation_within(off, 400);
}

/// As [`finds_a_violation_without`], searching up to `seeds` seeds (the sweep stops at the
/// first failing one).
fn finds_a_violation_within(off: Safeguard, seeds: u64) {
    let setup = Setup::without(off);
    let (options, _) = Options::from_env();
    let result = sweep(1..=search(seeds), &options, setup, threads(), true);
    let first = result
        .failures
        .first()
        .unwrap_or_else(|| panic!("{off:?} off: no violation in {} seeds", result.seeds));
    // The violation that failed the seed (the first one outside the documented limitations).
    let violation = first
        .violations
        .iter()
        .find(|violation| violation.known.is_none())
        .expect("a failed seed has a violation outside the documented limitations");
    let trace = write_trace(first, setup);
    println!(
        "{off:?} off: seed {} breaks {:?} ({} seeds run): {violation}\n  replay: {}\n  trace: {trace:?}",
        first.seed,
        violation.check,
        result.seeds,
        first.replay_command(setup),
    );
}

#[test]
fn without_the_write_fence() {
    finds_a_violation_without(Safeguard::Fence);
}

/// The seeded schedules meet the barrier's case rarely: it needs a leader change while one
/// kind's view lags another's and a change in that gap (found at 586, 521 and 117 as the
/// schedules changed; 3,818 with the API server's lagging caches and the Lease deleted under a
/// cut-off leader). The scripted scenario `without_the_barrier_a_new_term_writes_back_an_address_
/// its_held_watch_missed` (tests/scenarios/barrier.rs) shows it every time.
#[test]
fn without_the_acquisition_barrier() {
    finds_a_violation_within(Safeguard::Barrier, 4_000);
}

#[test]
fn without_the_stall_bound() {
    finds_a_violation_without(Safeguard::StallBound);
}

// The wait after a deleted Lease (`Safeguard::DeletedLeaseWait`) is shown by the scripted
// scenario `without_the_wait_a_follower_leads_beside_a_deleted_leases_last_holder`
// (tests/scenarios/lease.rs). The seeded sweep never showed it reliably: the overlap it prevents
// is one check (b) excuses after any outside change of the Lease (`ForcedLeaseChange`), a
// deletion included, so the violations it found were far downstream of the Lease's re-creation
// (seed 207 with one API server instance, a convergence failure) and vanished as timings moved
// (with the barrier's proof by version read, 400 seeds find none).

// A fresh tracker per term (`Safeguard::FreshTracker`): no longer found out here. Since the
// fresh-view rule's clause 2 puts our own answers into the cache and resolves a write of unknown
// outcome by a read, the tracker holds nothing a later term could wait on (tests/scenarios keeps
// the stale-tracker scenario; the runtime still builds the state fresh every term).

#[test]
fn without_own_writes() {
    finds_a_violation_without(Safeguard::OwnWrites);
}

#[test]
fn without_the_drain_before_release() {
    finds_a_violation_without(Safeguard::Drain);
}

// Version-fenced deletes (`Safeguard::VersionFencedDeletes`) are shown by the scripted scenario
// `without_version_fenced_deletes_a_changed_slice_is_deleted` (tests/scenarios). The seeded
// sweep no longer finds them out: since issue 37 a selecting Service keeps its last slice of a
// family as an empty placeholder instead of deleting it, so the planner deletes a slice only when
// the Service stops selecting (its selector removed, or ExternalName), a family or port group
// goes, or packing compacts; the schedules never remove a selector, and with the safeguard off
// 4,000 seeds found no violation (it was first found at seed 588 before).

/// Clause 3 (additions follow from a view at least as new as what they follow from) guards
/// against one watch running behind another. Before the simulation lagged one kind of a
/// replica's watches on its own (`Fault::LagKind`), only five seeds of a 20,000-seed sweep met
/// it; now a search finds it.
#[test]
fn without_additions() {
    finds_a_violation_within(Safeguard::Additions, 800);
}

// A lost watch needs no guard of its own: its watermark stays where it was until it catches up,
// so clause 3 reads the API server for what it cannot vouch for (tests/scenarios:
// `a_lost_workload_watch_does_not_put_back_a_deleted_workload`, and
// `without_additions_a_lost_workload_watch_puts_back_a_deleted_workload`).
