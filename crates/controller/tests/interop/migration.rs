//! The migration of docs/operations.md ("Migrating from Linkerd's built-in controller"), end to
//! end, with the client-go contender standing in for Linkerd's destination service:
//!
//! 1. Linkerd's state: its controller holds the shared Lease; its slices are in place.
//! 2. Our replicas join on the shared Lease: ready followers, writing nothing, even while objects
//!    change.
//! 3. Linkerd's destination pod stops (SIGTERM: it exits without releasing, as Linkerd's
//!    process does); with no Linkerd replica running, the operator deletes the Lease: ours take
//!    over at once, and rewrite only what changed meanwhile (plus the identity digest, once per
//!    slice: Linkerd writes none). A new destination pod competes but stays a follower.
//! 4. Linkerd's controller is turned off for good; ours keep every slice correct, across a crash
//!    of their leader too.
//! 5. Optional move to a Lease of our own: scale to 0, change `--lease-name`, scale up; nothing is
//!    rewritten.
//! 6. The way back: scale ours to 0, turn Linkerd's controller on again: it takes the shared
//!    Lease, and finds every slice as it would write it.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use slices::testing::Svc;

use super::{
    adoption::{create_linkerd_slices, create_web, selected, slices_by_name, versions_of, vm},
    contender::{Contender, Ours, SHORT},
    linkerd,
    timeline::{LeaseLog, assert_never_together, contender_intervals, our_intervals},
};
use harness::{CONVERGE, Cluster, eventually};

/// The Services of the migration.
const SERVICES: [&str; 2] = ["web", "db"];

pub async fn run(testbed: &'static testbed::Testbed, binary: &Path) {
    let cluster = Cluster::new(testbed, "interop-migration").await;
    let ns = cluster.namespace.clone();
    let lease = LeaseLog::start(&cluster).await;

    // 1. Linkerd's state.
    let mut linkerd_0 =
        Contender::start_without_release(binary, testbed, &ns, "linkerd-destination-0", SHORT)
            .await;
    linkerd_0.wait_event("started leading", 1).await;
    create_web(&cluster).await;
    cluster
        .create_service(Svc::named("db").selector("app", "db").headless())
        .await;
    cluster
        .apply_workload(vm("db-1", "app", "db").ip("10.3.0.1").ready())
        .await;
    create_linkerd_slices(&cluster, &SERVICES).await;
    let linkerd_state = slices_by_name(&cluster).await;

    // 2. Ours join: ready followers that write nothing.
    let mut a = Ours::start(testbed, &ns, "ours-a", SHORT, false).await;
    let mut b = Ours::start(testbed, &ns, "ours-b", SHORT, false).await;
    a.replica.wait_ready(CONVERGE).await;
    b.replica.wait_ready(CONVERGE).await;
    cluster
        .apply_workload(vm("web-2", "app", "web").ip("10.1.0.2").ready())
        .await;
    // Two renewals by Linkerd's holder after the change: ours have had time to act, and did not.
    let seen = lease.len();
    lease
        .wait_holder(&linkerd_0.identity, seen + 1, CONVERGE)
        .await;
    for ours in [&a, &b] {
        assert!(
            !ours.replica.is_leader().await,
            "{} leads",
            ours.replica.identity
        );
        assert_eq!(writes(ours).await, 0.0, "{} wrote", ours.replica.identity);
    }
    assert_eq!(
        slices_by_name(&cluster).await,
        linkerd_state,
        "a slice changed"
    );

    // 3. Linkerd's destination pod stops without releasing; the Lease is deleted; ours take
    // over at once.
    let before = lease.len();
    linkerd_0.terminate();
    assert!(linkerd_0.wait_exit().await.0.success());
    crate::delete_lease(testbed, &ns).await;
    let (index, _) = eventually("ours to lead", CONVERGE, || async {
        for (index, ours) in [&a, &b].iter().enumerate() {
            if ours.replica.is_leader().await {
                return Ok((index, ()));
            }
        }
        Err("nobody leads".to_string())
    })
    .await;
    let leader = if index == 0 { &a } else { &b };
    lease
        .wait_holder(&leader.replica.identity, before, CONVERGE)
        .await;
    cluster.wait_converged().await;
    let after = slices_by_name(&cluster).await;
    // db's slices said what ours would: only the identity digest is added (Linkerd writes none,
    // docs/operations.md), endpoints untouched.
    let db = versions_of(&linkerd_state, "db");
    for name in db.keys() {
        assert_eq!(
            after[name].endpoints, linkerd_state[name].endpoints,
            "db's endpoints did not change"
        );
        assert!(
            after[name]
                .annotations()
                .contains_key(slices::IDENTITY_DIGEST_ANNOTATION),
            "db's digest added"
        );
    }
    assert_ne!(
        versions_of(&after, "web"),
        versions_of(&linkerd_state, "web"),
        "web's change is applied"
    );
    let expected = (versions_of(&linkerd_state, "web").len() + db.len()) as f64;
    eventually("the leader's writes: one per slice", CONVERGE, || async {
        match writes(leader).await {
            n if n == expected => Ok(()),
            n => Err(format!("{n} writes, expected {expected}")),
        }
    })
    .await;
    // A new destination pod competes, and follows.
    let linkerd_1 =
        Contender::start(binary, testbed, &ns, "linkerd-destination-1", SHORT, None).await;
    linkerd_1.wait_event("new leader", 1).await;
    let seen = lease.len();
    lease
        .wait_holder(&leader.replica.identity, seen + 1, CONVERGE)
        .await;
    assert!(
        !linkerd_1.is_leading(),
        "Linkerd's new pod leads while ours hold the Lease"
    );

    // 4. Linkerd's controller is turned off; ours keep everything correct, across a crash.
    let mut linkerd_1 = linkerd_1;
    linkerd_1.terminate();
    assert!(linkerd_1.wait_exit().await.0.success());
    cluster
        .apply_workload(vm("web-3", "app", "web").ip("10.1.0.3").ready())
        .await;
    cluster.wait_converged().await;
    let (crashed, survivor) = if index == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    crashed.replica.kill();
    crashed.replica.wait_exit(CONVERGE).await;
    let crashed_at = Timestamp::now();
    survivor.replica.wait_leading(CONVERGE).await;
    cluster.delete_workload("web-1").await;
    cluster
        .apply_workload(vm("db-2", "app", "db").ip("10.3.0.2").ready())
        .await;
    cluster.wait_converged().await;
    let mut intervals = contender_intervals(&linkerd_0, None);
    intervals.extend(contender_intervals(&linkerd_1, None));
    intervals.extend(our_intervals(crashed, Some(crashed_at)));
    survivor.replica.terminate();
    assert!(survivor.replica.wait_exit(CONVERGE).await.success());
    intervals.extend(our_intervals(survivor, None));

    // 5. A Lease of our own: scaled to 0 above; same flags but --lease-name; nothing rewritten.
    let settled = slices_by_name(&cluster).await;
    let own: Vec<Ours> = vec![
        Ours::start_on(
            testbed,
            &ns,
            "external-endpoints-write",
            "ours-c",
            SHORT,
            false,
        )
        .await,
        Ours::start_on(
            testbed,
            &ns,
            "external-endpoints-write",
            "ours-d",
            SHORT,
            false,
        )
        .await,
    ];
    eventually("ours to lead on their own Lease", CONVERGE, || async {
        for ours in &own {
            if ours.replica.is_leader().await {
                return Ok(());
            }
        }
        Err("nobody leads".to_string())
    })
    .await;
    cluster.wait_converged().await;
    for ours in &own {
        assert_eq!(
            writes(ours).await,
            0.0,
            "{} rewrote a slice",
            ours.replica.identity
        );
    }
    assert_eq!(slices_by_name(&cluster).await, settled);

    // 6. The way back: ours scaled to 0, then Linkerd's controller on the shared Lease.
    let mut stopped_at = Vec::new();
    for mut ours in own {
        ours.replica.terminate();
        assert!(ours.replica.wait_exit(CONVERGE).await.success());
        stopped_at.push(Timestamp::now());
    }
    let before = lease.len();
    let linkerd_2 =
        Contender::start(binary, testbed, &ns, "linkerd-destination-2", SHORT, None).await;
    let started = linkerd_2.wait_event("started leading", 1).await;
    lease
        .wait_holder(&linkerd_2.identity, before, CONVERGE)
        .await;
    assert!(stopped_at.iter().all(|stopped| *stopped < started));
    intervals.extend(contender_intervals(&linkerd_2, None));
    let gaps = assert_never_together(&intervals, &lease);
    eprintln!("migration: gaps between leaders on the shared Lease: {gaps:?}");
    lease.assert_transitions_kept();
    for name in SERVICES {
        let service = cluster.services().get(name).await.unwrap();
        let workloads = selected(&cluster, &service).await;
        let slices = cluster.slices_of(name).await;
        assert!(
            slices.iter().all(|slice| slice
                .name_any()
                .starts_with(&format!("linkerd-external-{name}-"))),
            "{name}: slice names follow Linkerd's pattern"
        );
        linkerd::keeps(&service, &workloads, &slices).unwrap();
    }
    assert_eq!(
        slices_by_name(&cluster).await,
        settled,
        "nothing changed on the way back"
    );
}

async fn writes(ours: &Ours) -> f64 {
    ours.replica
        .metric("external_endpoints_slice_writes_total", "")
        .await
        .unwrap()
}
