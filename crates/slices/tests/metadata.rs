//! One named case per planner rule of docs/slices.md: endpoints and slice metadata.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use common::{Case, only_endpoint, run};
use slices::testing::{vm, web};
use slices::{
    HEADLESS_LABEL, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, MANAGED_BY_LABEL, SERVICE_NAME_LABEL,
};

#[test]
fn endpoint_rules() {
    run(vec![
        Case::new(
            "target_ref_is_the_external_workload",
            web(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                let target = only_endpoint(p)?.target_ref.clone().unwrap_or_default();
                ensure!(target.kind.as_deref() == Some("ExternalWorkload"), "kind");
                ensure!(
                    target.namespace.as_deref() == Some("default")
                        && target.name.as_deref() == Some("vm-1"),
                    "namespace and name"
                );
                ensure!(target.uid.as_deref() == Some("uid-ew-vm-1"), "uid");
                Ok(())
            },
        ),
        Case::new(
            "zone_comes_from_the_topology_label",
            web(),
            vec![vm("vm-1", "10.0.0.1").zone("eu-west-1a").build()],
            |p, _| {
                ensure!(
                    only_endpoint(p)?.zone.as_deref() == Some("eu-west-1a"),
                    "zone"
                );
                Ok(())
            },
        ),
        Case::new(
            "hostname_is_the_workload_name_for_headless_services",
            web().headless(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(
                    only_endpoint(p)?.hostname.as_deref() == Some("vm-1"),
                    "hostname"
                );
                Ok(())
            },
        ),
        Case::new(
            "no_hostname_for_services_with_a_cluster_ip",
            web(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(only_endpoint(p)?.hostname.is_none(), "no hostname");
                Ok(())
            },
        ),
        Case::new(
            "ready_workload_is_serving_and_ready",
            web(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                let c = only_endpoint(p)?.conditions.clone().unwrap_or_default();
                ensure!(
                    (c.ready, c.serving, c.terminating) == (Some(true), Some(true), Some(false)),
                    "got {c:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "workload_without_ready_true_is_neither_serving_nor_ready",
            web(),
            vec![vm("vm-1", "10.0.0.1").not_ready().build()],
            |p, _| {
                let c = only_endpoint(p)?.conditions.clone().unwrap_or_default();
                ensure!(
                    (c.ready, c.serving, c.terminating) == (Some(false), Some(false), Some(false)),
                    "got {c:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "terminating_workload_is_terminating_and_not_ready_but_still_serving",
            web(),
            vec![vm("vm-1", "10.0.0.1").terminating().build()],
            |p, _| {
                let c = only_endpoint(p)?.conditions.clone().unwrap_or_default();
                ensure!(
                    (c.ready, c.serving, c.terminating) == (Some(false), Some(true), Some(true)),
                    "got {c:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "publish_not_ready_addresses_makes_every_endpoint_ready",
            web().publish_not_ready(),
            vec![vm("vm-1", "10.0.0.1").not_ready().build()],
            |p, _| {
                let c = only_endpoint(p)?.conditions.clone().unwrap_or_default();
                ensure!(
                    c.ready == Some(true) && c.serving == Some(false),
                    "got {c:?}"
                );
                Ok(())
            },
        ),
    ]);
}

#[test]
fn slice_metadata_rules() {
    run(vec![
        Case::new(
            "created_slice_uses_generate_name_namespace_and_controller_owner_reference",
            web().namespace("shop"),
            vec![vm("vm-1", "10.0.0.1").namespace("shop").build()],
            |p, _| {
                let meta = &p.creates[0].metadata;
                ensure!(
                    meta.generate_name.as_deref() == Some("linkerd-external-web-")
                        && meta.name.is_none(),
                    "generateName"
                );
                ensure!(meta.namespace.as_deref() == Some("shop"), "namespace");
                let owners = meta.owner_references.clone().unwrap_or_default();
                ensure!(
                    owners.len() == 1
                        && owners[0].kind == "Service"
                        && owners[0].uid == "uid-svc-web"
                        && owners[0].controller == Some(true),
                    "owner {owners:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "slice_labels_are_service_labels_minus_reserved_plus_ours",
            web()
                .label("team", "a")
                .label(SERVICE_NAME_LABEL, "spoof")
                .label(MANAGED_BY_LABEL, "spoof")
                .label(HEADLESS_LABEL, "spoof"),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                let labels = p.creates[0].metadata.labels.clone().unwrap_or_default();
                let expected = [
                    ("team", "a"),
                    (SERVICE_NAME_LABEL, "web"),
                    (MANAGED_BY_LABEL, "linkerd-external-workloads-controller"),
                ];
                ensure!(
                    labels.len() == 3
                        && expected
                            .iter()
                            .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v)),
                    "got {labels:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "headless_service_slices_carry_the_headless_label",
            web().headless(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                let labels = p.creates[0].metadata.labels.clone().unwrap_or_default();
                ensure!(
                    labels.get(HEADLESS_LABEL).map(String::as_str) == Some(""),
                    "got {labels:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "labels_removed_from_the_service_disappear_from_its_slices",
            web(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(
                    p.updates.len() == 1 && p.creates.is_empty() && p.deletes.is_empty(),
                    "one update"
                );
                let labels = p.updates[0].metadata.labels.clone().unwrap_or_default();
                ensure!(!labels.contains_key("team"), "team label gone: {labels:?}");
                Ok(())
            },
        )
        .after(
            web().label("team", "a"),
            vec![vm("vm-1", "10.0.0.1").build()],
        ),
        Case::new(
            "written_slices_carry_the_last_change_trigger_time",
            web(),
            vec![
                vm("vm-1", "10.0.0.1").build(),
                vm("vm-2", "10.0.0.2").build(),
            ],
            |p, _| {
                let annotations = p.updates[0]
                    .metadata
                    .annotations
                    .clone()
                    .unwrap_or_default();
                ensure!(
                    annotations
                        .get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)
                        .map(String::as_str)
                        == Some("1970-01-01T00:01:40Z"),
                    "got {annotations:?}"
                );
                Ok(())
            },
        )
        .after(web(), vec![vm("vm-1", "10.0.0.1").build()]),
        Case::new(
            "slice_with_our_labels_not_owned_by_this_service_uid_is_deleted",
            web().uid("uid-svc-web-recreated"),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, existing| {
                ensure!(
                    p.deletes.len() == 1 && p.deletes[0].metadata.name == existing[0].metadata.name,
                    "old slice deleted"
                );
                ensure!(
                    p.creates.len() == 1 && p.updates.is_empty(),
                    "new slice created, not recycled from a foreign one"
                );
                let owners = p.creates[0]
                    .metadata
                    .owner_references
                    .clone()
                    .unwrap_or_default();
                ensure!(
                    owners[0].uid == "uid-svc-web-recreated",
                    "owned by the new uid"
                );
                Ok(())
            },
        )
        .after(web(), vec![vm("vm-1", "10.0.0.1").build()]),
    ]);
}
