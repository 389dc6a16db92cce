//! Drop-in next to Linkerd: our replicas and a real client-go leader elector (the contender,
//! `testbed/contender`, configured like Linkerd's destination service) on one Lease, against the
//! real API server; Linkerd-format slices adopted with no churn; the migration of
//! docs/operations.md end to end; the container image built and run as operators run it.
//!
//! "Never lead at the same moment" is judged from timestamps: each side logs when it starts and
//! stops leading (see `interop/timeline.rs` for why comparing them needs no clock-skew
//! allowance: one machine, one clock), and the Lease's history names the holders in the same
//! order. Timing bounds allow [`SLACK`] for a loaded machine; none depends on a sleep.
//!
//! Timings: Linkerd's own (30 s / 10 s / 2 s) for the contender where the point is that its
//! 30 s lease is waited out in full; elsewhere both sides run [`contender::SHORT`]
//! (9 s / 3 s / 1 s) so each test stays under a minute.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

#[path = "interop/adoption.rs"]
mod adoption;
#[path = "interop/contender.rs"]
mod contender;
#[path = "interop/handover.rs"]
mod handover;
#[path = "interop/image.rs"]
mod image;
#[path = "interop/image_files.rs"]
mod image_files;
#[path = "interop/linkerd.rs"]
mod linkerd;
#[path = "interop/migration.rs"]
mod migration;
#[path = "interop/oci.rs"]
mod oci;
#[path = "interop/timeline.rs"]
mod timeline;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};

use contender::{Contender, LEASE_NAME, Ours, SHORT};
use harness::{CONVERGE, Cluster, eventually};
use slices::testing;

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

/// Allowance on timing bounds for scheduling on a loaded 2-core machine.
pub const SLACK: Duration = Duration::from_secs(2);

// === tests ===

#[tokio::test(flavor = "multi_thread")]
async fn adopting_linkerd_slices_adds_only_the_digest_to_correct_ones_and_fixes_only_differences() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    adoption::run(testbed).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migration_from_linkerd_and_back_keeps_every_slice_correct() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    let Some(binary) = Contender::binary(testbed) else {
        return;
    };
    migration::run(testbed, &binary).await;
}

/// Linkerd's controller ignores Service events in `kube-system`; ours makes no exception: a
/// Service there gets slices, and a change of the Service reaches them.
#[tokio::test(flavor = "multi_thread")]
async fn services_in_kube_system_get_slices_like_any_other() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    // The only test of this binary in kube-system (each run has its own testbed).
    let cluster = Cluster {
        client: testbed.client().await.unwrap(),
        namespace: "kube-system".into(),
    };
    let ours = Ours::start(
        testbed,
        &cluster.namespace,
        "ours-kube-system",
        SHORT,
        false,
    )
    .await;
    ours.replica.wait_leading(CONVERGE).await;
    cluster.create_service(testing::web()).await;
    cluster
        .apply_workload(testing::vm("vm-1", "10.0.0.1"))
        .await;
    cluster.wait_converged().await;
    assert_eq!(cluster.slices_of("web").await.len(), 1);
    cluster
        .update_service(testing::web().label("team", "platform"))
        .await;
    eventually("the Service's new label on its slice", CONVERGE, || async {
        let slices = cluster.slices_of("web").await;
        let labels: Vec<_> = slices
            .iter()
            .map(|s| s.labels().get("team").cloned())
            .collect();
        (labels == [Some("platform".to_string())])
            .then_some(())
            .ok_or_else(|| format!("{labels:?}"))
    })
    .await;
}

#[test]
fn image_built_by_the_script_holds_what_the_dockerfile_copies_and_no_debug_info() {
    image_files::check_files();
}

#[tokio::test(flavor = "multi_thread")]
async fn image_runs_under_runc_as_65532_read_only_leads_drains_releases_and_hands_over() {
    let testbed = testbed::require!();
    let _logs = testbed.log_guard();
    image::run(testbed).await;
}

// === helpers ===

/// The operator's step: `kubectl delete lease` (the testbed's kubectl; the API when there is
/// none).
async fn delete_lease(testbed: &testbed::Testbed, namespace: &str) {
    match &testbed.binaries().kubectl {
        Some(kubectl) => {
            let output = tokio::process::Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(testbed.kubeconfig_path())
                .args(["--namespace", namespace, "delete", "lease", LEASE_NAME])
                .output()
                .await
                .unwrap();
            assert!(
                output.status.success(),
                "kubectl delete lease: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        None => {
            let client = testbed.client().await.unwrap();
            let leases: Api<Lease> = Api::namespaced(client, namespace);
            leases
                .delete(LEASE_NAME, &Default::default())
                .await
                .unwrap();
        }
    }
}
