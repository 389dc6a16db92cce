//! Clause 1 of the fresh-view rule, the acquisition barrier, scripted: a new term plans from
//! caches at least as new as a point read after the acquisition, whatever its watches showed.

use std::time::Duration;

use sim::Safeguard;
use slices::testing::vm;
use tokio::time::{Instant, sleep};

use crate::{
    driver::run, following_with_web, following_with_web_configured, lead_until_web_publishes_both,
    remove_endpoint,
};

/// Clause 1, the acquisition barrier: a follower whose workload watch is held (a stalled or
/// lagging stream) takes the Lease after another leader published vm-2's new address. The new
/// term re-lists the workloads before its replay, so it keeps the new address.
#[test]
fn a_new_term_does_not_write_back_an_address_its_held_watch_missed() {
    held_workload_watch_at_acquisition(None);
}

/// Without the barrier, the replay plans from the held cache and writes the old address back:
/// clause 3 lets it through, as it follows from the version of vm-2 the cache holds.
#[test]
#[should_panic(expected = "the old address was written back")]
fn without_the_barrier_a_new_term_writes_back_an_address_its_held_watch_missed() {
    held_workload_watch_at_acquisition(Some(Safeguard::Barrier));
}

fn held_workload_watch_at_acquisition(off: Option<Safeguard>) {
    run(|| async {
        let scripted = following_with_web(off).await;
        lead_until_web_publishes_both(&scripted).await;
        scripted.settle().await;
        scripted.follow().await;
        scripted.link().hold_watches_of("externalworkloads");
        // Another leader's work, which the held watch does not show: vm-2 moves, and its slice
        // follows.
        scripted
            .apply_workload(vm("vm-2", "10.0.0.9").build())
            .await;
        let slice = scripted.only_slice("web");
        scripted
            .edit_slice(&slice, |stored| {
                for endpoint in stored.endpoints.get_or_insert_default() {
                    if endpoint.addresses == ["10.0.0.2"] {
                        endpoint.addresses = vec!["10.0.0.9".to_string()];
                    }
                }
            })
            .await;
        scripted.lead().await;
        sleep(Duration::from_secs(5)).await;
        let published = scripted.published("web");
        assert!(
            !published.contains(&"10.0.0.2".to_string()),
            "the old address was written back: {published:?}"
        );
        assert!(published.contains(&"10.0.0.9".to_string()), "{published:?}");
        scripted.link().release_watches();
        scripted.settle().await;
        scripted.stop().await;
    });
}

/// Clause 1 against a lagging watch cache, with the barrier's probe (the form for large caches):
/// the API server's slice cache lags 20 s, so the probe's stream, though started after the
/// version read at acquisition, shows a past older than that version. Someone took vm-1 out of
/// web's slice while the replica followed. The new term waits until its watch has read the
/// version (or re-lists once the probe wait is over), and puts vm-1 back long before the
/// lagging cache shows the edit; taking the stream's bookmark for the present, it planned from
/// the slice as it was and wrote nothing until the cache caught up (simulation seed 13843).
#[test]
fn a_new_term_does_not_take_a_lagging_caches_bookmark_for_the_present() {
    run(|| async {
        let scripted = following_with_web_configured(None, |config| {
            config.safeguards = config.safeguards.with_barrier_relisting_at_most(0);
        })
        .await;
        lead_until_web_publishes_both(&scripted).await;
        scripted.settle().await;
        scripted.follow().await;
        scripted.lag_slice_cache(Duration::from_secs(20));
        // The cache stands where it was at this instant; the edit comes after.
        sleep(Duration::from_secs(1)).await;
        remove_endpoint(&scripted, &scripted.only_slice("web"), "10.0.0.1").await;
        let acquired = Instant::now();
        lead_until_web_publishes_both(&scripted).await;
        let took = acquired.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "vm-1 came back only after {took:?}: the term planned from the lagging cache"
        );
        scripted.stop().await;
    });
}
