//! One Lease shared with a real client-go elector (the contender, configured like Linkerd's):
//! crashed holders waited out for the lease duration they wrote, either way; graceful releases
//! handed over; Linkerd exiting without a release, waited out unless the Lease is deleted;
//! network cuts of either side. Never two leaders at once.

use std::time::Duration;

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};

use super::{
    SLACK,
    contender::{Contender, LEASE_NAME, LINKERD, Ours, SHORT, proxy},
    delete_lease,
    timeline::{
        LeaseLog, Record, assert_markers_within, assert_never_together, between,
        contender_intervals, our_intervals,
    },
};
use harness::{CONVERGE, Cluster, eventually};

/// A client-go holder (Linkerd's 30 s lease) that crashes is waited out for its own 30 s by
/// our replica, whose own lease is 9 s; then our holder crashes and a client-go contender with
/// Linkerd's settings waits out our 9 s. The client-go record's fields are read and kept.
#[tokio::test(flavor = "multi_thread")]
async fn crashed_holders_are_waited_out_for_the_lease_duration_they_wrote_either_way() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(binary) = Contender::binary(testbed) else {
        return;
    };
    let cluster = Cluster::new(testbed, "interop-crash").await;
    let ns = cluster.namespace.clone();
    let lease = LeaseLog::start(&cluster).await;

    let mut linkerd = Contender::start(
        &binary,
        testbed,
        &ns,
        "linkerd-destination-a",
        LINKERD,
        None,
    )
    .await;
    linkerd.wait_event("started leading", 1).await;
    let first = lease.wait_holder(&linkerd.identity, 0, CONVERGE).await;
    assert_eq!(
        first.duration_seconds,
        Some(30),
        "client-go writes its 30 s"
    );
    assert_eq!(first.transitions, Some(0));
    assert_micro_time(&cluster).await;

    let mut ours = Ours::start(testbed, &ns, "ours-a", SHORT, false).await;
    ours.replica.wait_ready(CONVERGE).await;
    // Two renewals of the client-go holder later, ours has seen it hold and stays a follower.
    let seen = lease.len();
    lease
        .wait_holder(&linkerd.identity, seen + 1, CONVERGE)
        .await;
    assert!(
        !ours.replica.is_leader().await,
        "ours leads under a held lease"
    );
    let renewals = client_go_renewals(&lease, &linkerd.identity);
    assert!(
        renewals.windows(2).all(|pair| pair[0] < pair[1]),
        "renewTime grows with each renewal: {renewals:?}"
    );

    let before = lease.len();
    linkerd.kill();
    let (_, killed) = linkerd.wait_exit().await;
    let taken = lease
        .wait_holder(&ours.replica.identity, before, Duration::from_secs(90))
        .await;
    let index = index_of(&lease, &taken);
    let last = lease.last_of(&linkerd.identity, index);
    let waited = between(last.renew_time.unwrap(), taken.acquire_time.unwrap());
    eprintln!(
        "client-go (30 s) crashed: ours took over {:?} after the kill, {waited:?} after the last renewal",
        between(killed, taken.seen)
    );
    assert!(
        waited >= LINKERD.lease_duration,
        "ours took the lease {waited:?} after the holder's last renewal, before its 30 s"
    );
    assert!(
        waited <= LINKERD.lease_duration + SHORT.retry_period + SLACK,
        "ours took {waited:?} after the last renewal"
    );
    assert_eq!(
        taken.duration_seconds,
        Some(SHORT.lease_duration.as_secs() as i32),
        "ours writes its own duration"
    );
    assert_eq!(taken.transitions, Some(1), "ours counts the transition");

    // The way back: a contender with Linkerd's settings waits out our 9 s after we crash.
    let linkerd_b = Contender::start(
        &binary,
        testbed,
        &ns,
        "linkerd-destination-b",
        LINKERD,
        None,
    )
    .await;
    linkerd_b.wait_event("new leader", 1).await;
    assert!(
        !linkerd_b.is_leading(),
        "client-go leads under our held lease"
    );
    let before = lease.len();
    ours.replica.kill();
    ours.replica.wait_exit(CONVERGE).await;
    let killed_ours = Timestamp::now();
    let taken_b = lease
        .wait_holder(&linkerd_b.identity, before, Duration::from_secs(60))
        .await;
    let index = index_of(&lease, &taken_b);
    let last = lease.last_of(&ours.replica.identity, index);
    let waited = between(last.renew_time.unwrap(), taken_b.acquire_time.unwrap());
    eprintln!(
        "ours (9 s) crashed: client-go took over {:?} after the kill, {waited:?} after our last renewal",
        between(killed_ours, taken_b.seen)
    );
    assert!(waited >= SHORT.lease_duration, "client-go took {waited:?}");
    assert!(
        waited <= SHORT.lease_duration + LINKERD.client_go_poll() + SLACK,
        "client-go took {waited:?} after our last renewal"
    );
    assert_eq!(taken_b.duration_seconds, Some(30));
    assert_eq!(
        taken_b.transitions,
        Some(2),
        "client-go counts on from ours"
    );
    linkerd_b.wait_event("marker written", 1).await;

    let mut intervals = contender_intervals(&linkerd, Some(killed));
    intervals.extend(our_intervals(&ours, Some(killed_ours)));
    let b_intervals = contender_intervals(&linkerd_b, None);
    intervals.extend(b_intervals.clone());
    let gaps = assert_never_together(&intervals, &lease);
    eprintln!("gaps between leaders: {gaps:?}");
    assert!(assert_markers_within(&linkerd, &intervals) > 0);
    assert!(assert_markers_within(&linkerd_b, &b_intervals) > 0);
    lease.assert_transitions_kept();
}

/// Graceful stops, two rounds each way: a client-go holder that releases is taken over by ours
/// at once (through our watch); ours releasing is taken over at client-go's next poll. Never
/// two leaders at once.
#[tokio::test(flavor = "multi_thread")]
async fn graceful_releases_hand_over_at_once_to_ours_and_at_the_next_poll_to_client_go() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(binary) = Contender::binary(testbed) else {
        return;
    };
    let cluster = Cluster::new(testbed, "interop-graceful").await;
    let ns = cluster.namespace.clone();
    let lease = LeaseLog::start(&cluster).await;
    let mut intervals = Vec::new();
    let mut markers = 0;

    let mut linkerd = Contender::start(&binary, testbed, &ns, "linkerd-0", SHORT, None).await;
    linkerd.wait_event("started leading", 1).await;
    lease.wait_holder(&linkerd.identity, 0, CONVERGE).await;
    for round in 0..2 {
        let mut ours = Ours::start(testbed, &ns, &format!("ours-{round}"), SHORT, false).await;
        ours.replica.wait_ready(CONVERGE).await;

        let before = lease.len();
        linkerd.terminate();
        let released = wait_released(&lease, before).await;
        let taken = lease
            .wait_holder(&ours.replica.identity, before, CONVERGE)
            .await;
        let (status, _) = linkerd.wait_exit().await;
        assert!(status.success(), "the contender exits 0 after SIGTERM");
        let to_ours = between(released.seen, taken.seen);
        eprintln!("round {round}: client-go released; ours took over {to_ours:?} later");
        assert!(
            to_ours <= SLACK,
            "ours took {to_ours:?} to take a released lease"
        );
        intervals.extend(contender_intervals(&linkerd, None));
        markers += assert_markers_within(&linkerd, &contender_intervals(&linkerd, None));

        linkerd = Contender::start(
            &binary,
            testbed,
            &ns,
            &format!("linkerd-{}", round + 1),
            SHORT,
            None,
        )
        .await;
        linkerd.wait_event("new leader", 1).await;
        let before = lease.len();
        ours.replica.terminate();
        let released = wait_released(&lease, before).await;
        let taken = lease.wait_holder(&linkerd.identity, before, CONVERGE).await;
        assert!(ours.replica.wait_exit(CONVERGE).await.success());
        let to_client_go = between(released.seen, taken.seen);
        eprintln!("round {round}: ours released; client-go took over {to_client_go:?} later");
        assert!(
            to_client_go <= SHORT.client_go_poll() + SLACK,
            "client-go took {to_client_go:?} to take a released lease"
        );
        intervals.extend(our_intervals(&ours, None));
    }
    linkerd.wait_event("started leading", 1).await;
    intervals.extend(contender_intervals(&linkerd, None));
    let gaps = assert_never_together(&intervals, &lease);
    eprintln!("gaps between leaders: {gaps:?}");
    assert!(markers > 0, "the contender wrote its marker while leading");
    lease.assert_transitions_kept();
}

/// Linkerd's destination process exits on SIGTERM without releasing its Lease: ours, a
/// follower, waits out Linkerd's 30 s as after a crash. The documented way to take over at once
/// (docs/operations.md, migration): once no Linkerd replica runs, `kubectl delete lease`; ours
/// recreates the Lease through its watch and leads.
#[tokio::test(flavor = "multi_thread")]
async fn linkerd_exiting_without_a_release_is_waited_out_unless_the_lease_is_deleted() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(binary) = Contender::binary(testbed) else {
        return;
    };
    let cluster = Cluster::new(testbed, "interop-no-release").await;
    let ns = cluster.namespace.clone();
    let lease = LeaseLog::start(&cluster).await;

    // Waited out: Linkerd's 30 s after its last renewal.
    let mut linkerd =
        Contender::start_without_release(&binary, testbed, &ns, "linkerd-destination-a", LINKERD)
            .await;
    linkerd.wait_event("started leading", 1).await;
    lease.wait_holder(&linkerd.identity, 0, CONVERGE).await;
    let mut ours_a = Ours::start(testbed, &ns, "ours-a", SHORT, false).await;
    ours_a.replica.wait_ready(CONVERGE).await;
    let before = lease.len();
    linkerd.terminate();
    let (status, exited) = linkerd.wait_exit().await;
    assert!(status.success(), "the contender exits 0 after SIGTERM");
    let taken = lease
        .wait_holder(&ours_a.replica.identity, before, Duration::from_secs(90))
        .await;
    let index = index_of(&lease, &taken);
    assert!(
        lease.records()[before..index]
            .iter()
            .all(|r| r.holder.is_some()),
        "no release record: {:?}",
        lease.holders()
    );
    let last = lease.last_of(&linkerd.identity, index);
    let waited = between(last.renew_time.unwrap(), taken.acquire_time.unwrap());
    let after_exit = between(exited, taken.seen);
    eprintln!(
        "client-go (30 s) exited without a release: ours took over {after_exit:?} after the exit, \
         {waited:?} after its last renewal"
    );
    assert!(waited >= LINKERD.lease_duration, "ours took {waited:?}");
    let mut intervals = contender_intervals(&linkerd, Some(exited));

    // Linkerd leads again (ours releases to it), then exits without a release; once no Linkerd
    // replica runs, the operator deletes the Lease; ours takes over once RenewDeadline has
    // passed since Linkerd's last renewal (not its whole lease duration).
    let mut linkerd_b =
        Contender::start_without_release(&binary, testbed, &ns, "linkerd-destination-b", LINKERD)
            .await;
    linkerd_b.wait_event("new leader", 1).await;
    let before = lease.len();
    ours_a.replica.terminate();
    assert!(ours_a.replica.wait_exit(CONVERGE).await.success());
    intervals.extend(our_intervals(&ours_a, None));
    lease
        .wait_holder(&linkerd_b.identity, before, CONVERGE)
        .await;
    linkerd_b.wait_event("started leading", 1).await;
    // A follower of ours joins while Linkerd leads.
    let ours_b = Ours::start(testbed, &ns, "ours-b", SHORT, false).await;
    ours_b.replica.wait_ready(CONVERGE).await;
    let before = lease.len();
    linkerd_b.terminate();
    let (status, exited_b) = linkerd_b.wait_exit().await;
    assert!(status.success());
    assert_eq!(
        cluster
            .leases()
            .get(LEASE_NAME)
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some(linkerd_b.identity.as_str()),
        "the exited contender still holds the Lease"
    );
    delete_lease(testbed, &ns).await;
    let taken = lease
        .wait_holder(&ours_b.replica.identity, before, CONVERGE)
        .await;
    // From the deletion as the Lease's watch delivered it.
    let deleted = lease.records()[before..]
        .iter()
        .find(|record| record.deleted)
        .map(|record| record.seen)
        .expect("the deletion seen");
    let after_delete = between(deleted, taken.seen);
    eprintln!("Lease deleted: ours took over {after_delete:?} later");
    // The deleted record's claim stands until RenewDeadline after ours last saw it renewed
    // (Linkerd's last renewal, at most its RetryPeriod before its exit).
    assert!(
        after_delete <= SHORT.renew_deadline + SHORT.retry_period + SLACK,
        "ours took {after_delete:?} to recreate a deleted Lease"
    );
    intervals.extend(contender_intervals(&linkerd_b, Some(exited_b)));
    // Its log says so a moment after the Lease does.
    let led = eventually("ours-b to log its leading", CONVERGE, || async {
        let led = our_intervals(&ours_b, None);
        (!led.is_empty())
            .then_some(led)
            .ok_or("not yet".to_string())
    })
    .await;
    intervals.extend(led);
    let gaps = assert_never_together(&intervals, &lease);
    eprintln!("gaps between leaders: {gaps:?}");
}

/// Network cuts (through a TCP proxy in front of each side): the cut-off client-go leader stops
/// within RetryPeriod + RenewDeadline and ours takes over only after the record's duration; then
/// the cut-off leader of ours stops within RenewDeadline and client-go takes over after ours'
/// duration. Back on the network, neither leads again while the other holds.
#[tokio::test(flavor = "multi_thread")]
async fn network_cuts_of_either_side_never_give_two_leaders() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(binary) = Contender::binary(testbed) else {
        return;
    };
    let cluster = Cluster::new(testbed, "interop-cut").await;
    let ns = cluster.namespace.clone();
    let lease = LeaseLog::start(&cluster).await;

    let linkerd_proxy = proxy(testbed).await;
    let linkerd = Contender::start(
        &binary,
        testbed,
        &ns,
        "linkerd-cut",
        SHORT,
        Some(&linkerd_proxy),
    )
    .await;
    linkerd.wait_event("started leading", 1).await;
    lease.wait_holder(&linkerd.identity, 0, CONVERGE).await;
    let ours = Ours::start(testbed, &ns, "ours-cut", SHORT, true).await;
    ours.replica.wait_ready(CONVERGE).await;

    // Client-go cut off.
    let before = lease.len();
    linkerd_proxy.cut();
    let cut = Timestamp::now();
    let stopped = linkerd.wait_event("stopped leading", 1).await;
    let took = between(cut, stopped);
    eprintln!("client-go cut off: stopped leading {took:?} after the cut");
    // Renewals fail for RenewDeadline, then the release is tried for up to RenewDeadline.
    assert!(took <= SHORT.retry_period + SHORT.renew_deadline * 2 + SLACK);
    let taken = lease
        .wait_holder(&ours.replica.identity, before, CONVERGE)
        .await;
    let last = lease.last_of(&linkerd.identity, index_of(&lease, &taken));
    let waited = between(last.renew_time.unwrap(), taken.acquire_time.unwrap());
    eprintln!(
        "client-go cut off: ours took over {:?} after the cut, {waited:?} after its last renewal",
        between(cut, taken.seen)
    );
    assert!(waited >= SHORT.lease_duration);
    // Its release attempt (which fails, cut off) is over: back on the network, it follows.
    linkerd.wait_event("elector stopped", 1).await;
    let reported = linkerd.times("new leader").len();
    linkerd_proxy.restore();
    let holder = eventually("client-go to see our holder", CONVERGE, || async {
        let events = linkerd.events();
        let news: Vec<_> = events.iter().filter(|e| e.name == "new leader").collect();
        match news.get(reported) {
            Some(event) => Ok(event.fields["holder"]
                .as_str()
                .unwrap_or_default()
                .to_string()),
            None => Err("no new report".to_string()),
        }
    })
    .await;
    assert_eq!(holder, ours.replica.identity);

    // Ours cut off.
    let proxy_ours = ours.proxy.as_ref().unwrap();
    let before = lease.len();
    proxy_ours.cut();
    let cut = Timestamp::now();
    let stop = eventually("ours to stop leading", CONVERGE, || async {
        ours.events()
            .into_iter()
            .find(|e| e.name == "stopped leading")
            .map(|e| e.time)
            .ok_or_else(|| "still leading".to_string())
    })
    .await;
    let took = between(cut, stop);
    eprintln!("ours cut off: stopped leading {took:?} after the cut");
    assert!(took <= SHORT.renew_deadline + SLACK);
    let taken = lease.wait_holder(&linkerd.identity, before, CONVERGE).await;
    let last = lease.last_of(&ours.replica.identity, index_of(&lease, &taken));
    let waited = between(last.renew_time.unwrap(), taken.acquire_time.unwrap());
    eprintln!(
        "ours cut off: client-go took over {:?} after the cut, {waited:?} after our last renewal",
        between(cut, taken.seen)
    );
    assert!(waited >= SHORT.lease_duration);
    let forwarded = proxy_ours.forwarded();
    proxy_ours.restore();
    eventually("ours to reconnect", CONVERGE, || async {
        (proxy_ours.forwarded() > forwarded)
            .then_some(())
            .ok_or_else(|| "no new connection".to_string())
    })
    .await;
    // Two renewals of the client-go holder after ours is back: ours still follows.
    let seen = lease.len();
    lease
        .wait_holder(&linkerd.identity, seen + 1, CONVERGE)
        .await;
    assert!(!ours.replica.is_leader().await);

    let mut intervals = contender_intervals(&linkerd, None);
    let markers = assert_markers_within(&linkerd, &intervals);
    intervals.extend(our_intervals(&ours, None));
    let gaps = assert_never_together(&intervals, &lease);
    eprintln!("gaps between leaders: {gaps:?}; {markers} markers");
    lease.assert_transitions_kept();
}

/// The stored Lease's renewTime is a MicroTime: RFC 3339 with six fractional digits.
async fn assert_micro_time(cluster: &Cluster) {
    let resource = ApiResource::erase::<Lease>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), &cluster.namespace, &resource);
    let lease = api.get(LEASE_NAME).await.unwrap();
    for field in ["renewTime", "acquireTime"] {
        let text = lease.data["spec"][field].as_str().unwrap().to_string();
        let fraction = text
            .trim_end_matches('Z')
            .rsplit_once('.')
            .map(|(_, digits)| digits.len());
        assert_eq!(fraction, Some(6), "{field} {text} is a MicroTime");
    }
}

/// The renewTimes the client-go holder wrote, in order.
fn client_go_renewals(lease: &LeaseLog, holder: &str) -> Vec<Timestamp> {
    lease
        .records()
        .into_iter()
        .filter(|record| record.holder.as_deref() == Some(holder))
        .filter_map(|record| record.renew_time)
        .collect()
}

/// Index of `record` in the log (by the time it was seen).
fn index_of(lease: &LeaseLog, record: &Record) -> usize {
    lease
        .records()
        .iter()
        .position(|r| r.seen == record.seen && r.holder == record.holder)
        .unwrap()
}

/// Waits for a released record (no holder) after the first `after`.
async fn wait_released(lease: &LeaseLog, after: usize) -> Record {
    eventually("a release", CONVERGE, || async {
        lease
            .records()
            .into_iter()
            .skip(after)
            .find(|record| record.holder.is_none())
            .ok_or_else(|| format!("holders {:?}", lease.holders()))
    })
    .await
}
