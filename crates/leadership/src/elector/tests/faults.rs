//! Never two leaders under storms of faults: two candidates through cuts, failures and
//! conflicts; three through seeded random faults, with holders cleared and the Lease deleted by
//! hand.

use super::*;

#[tokio::test(start_paused = true)]
async fn two_candidates_never_both_lead() {
    let store = MemoryLeaseStore::new();
    let (a_conn, b_conn) = (store.connect(), store.connect());
    let a = candidate(&a_conn, "a");
    let b = candidate(&b_conn, "b");
    let (a_fence_rx, b_fence_rx) = (a.leadership(), b.leadership());

    let mut leaders_seen = Vec::new();
    let started = Instant::now();
    for step in 0..3000u32 {
        // A storm of faults: a cut (hang) for each in turn, sporadic failures, conflicts.
        let at = Instant::now() - started;
        match step {
            200 => a_conn.hang(true),
            600 => a_conn.hang(false),
            800 => b_conn.hang(true),
            1300 => b_conn.hang(false),
            1500 => a_conn.fail_next(3),
            1700 => b_conn.fail_next(6),
            2000 => {
                let holder = store
                    .current()
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity);
                let loser = if holder.as_deref() == Some("a") {
                    &a_conn
                } else {
                    &b_conn
                };
                loser.hang(true);
            }
            2400 => {
                a_conn.hang(false);
                b_conn.hang(false);
            }
            _ => {}
        }
        sleep(Duration::from_millis(50)).await;
        let a_leads = a_fence_rx.borrow().is_some();
        let b_leads = b_fence_rx.borrow().is_some();
        assert!(!(a_leads && b_leads), "both lead at {at:?}");
        let leader = [(a_leads, "a"), (b_leads, "b")]
            .into_iter()
            .find_map(|(leads, name)| leads.then_some(name));
        if leader.is_some() && leaders_seen.last().copied() != leader {
            leaders_seen.extend(leader);
        }
        // The lease record agrees with whoever believes it leads.
        if a_leads || b_leads {
            let holder = spec(&store).holder_identity;
            assert_eq!(holder.as_deref(), Some(if a_leads { "a" } else { "b" }));
        }
    }
    // Leadership moved across the cuts, and someone leads at the end.
    assert!(leaders_seen.len() >= 2, "leaders: {leaders_seen:?}");
    assert!(current(&a).is_some() || current(&b).is_some());
}

/// A tiny deterministic generator, so that fault schedules are reproducible by seed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(start_paused = true)]
async fn three_candidates_with_random_faults_never_both_lead() {
    for seed in 1..=25u64 {
        let store = MemoryLeaseStore::new();
        let connections: Vec<_> = (0..3).map(|_| store.connect()).collect();
        let names = ["a", "b", "c"];
        let handles: Vec<_> = connections
            .iter()
            .zip(names)
            .map(|(connection, name)| candidate(connection, name))
            .collect();
        let mut random = Lcg(seed);
        let mut led = [false; 3];
        for _ in 0..2400 {
            let who = usize::try_from(random.below(3)).expect("small");
            match random.below(40) {
                0 => connections[who].hang(true),
                1 | 2 => connections[who].hang(false),
                3 => connections[who].fail_next(usize::try_from(random.below(4)).expect("small")),
                4 if random.below(4) == 0 => {
                    // Someone clears the holder (or, below, deletes the lease) by hand.
                    if let Some(mut lease) = store.current() {
                        lease.spec.as_mut().expect("spec").holder_identity = None;
                        store.put(Some(lease));
                    }
                }
                5 if random.below(8) == 0 => {
                    store.put(None);
                }
                _ => {}
            }
            sleep(Duration::from_millis(50)).await;
            let leaders: Vec<_> = (0..3).filter(|i| current(&handles[*i]).is_some()).collect();
            assert!(leaders.len() <= 1, "seed {seed}: {leaders:?} lead at once");
            for &i in &leaders {
                led[i] = true;
                assert_eq!(
                    spec(&store).holder_identity.as_deref(),
                    Some(names[i]),
                    "seed {seed}"
                );
            }
        }
        assert!(
            led.iter().filter(|l| **l).count() >= 2,
            "seed {seed}: leadership moved: {led:?}"
        );
        for connection in &connections {
            connection.hang(false);
        }
    }
}
