//! One named case per planner rule of design.md section 4: selection, address families, ports,
//! endpoints and slice metadata. Packing is in `packing.rs`.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use common::{Case, addresses, only_endpoint, ports, run, workloads_in};
use slices::testing::{Svc, Workload};
use slices::{
    HEADLESS_LABEL, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, MANAGED_BY_LABEL, Problem,
    SERVICE_NAME_LABEL,
};

/// The Service most cases use: selects `app=web`, port `http` 80 → targetPort named `http`.
fn web() -> Svc {
    Svc::named("web")
        .selector("app", "web")
        .port("http", 80, "http")
}

/// A ready workload selected by [`web`], listening on `http` 8080.
fn vm(name: &str, ip: &str) -> Workload {
    Workload::named(name)
        .label("app", "web")
        .ip(ip)
        .port("http", 8080)
        .ready()
}

#[test]
fn selection_rules() {
    run(vec![
        Case::new(
            "service_without_selector_gets_no_slices",
            web().no_selector(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(p.is_empty(), "expected no writes");
                Ok(())
            },
        ),
        Case::new(
            "external_name_service_gets_no_slices",
            web().external_name(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(p.is_empty(), "expected no writes");
                Ok(())
            },
        ),
        Case::new(
            "workloads_are_selected_by_exact_label_equality",
            web().selector("tier", "front"),
            vec![
                vm("both-labels", "10.0.0.1")
                    .label("tier", "front")
                    .label("extra", "x")
                    .build(),
                vm("wrong-value", "10.0.0.2").label("tier", "back").build(),
                vm("missing-label", "10.0.0.3").build(),
                Workload::named("prefix-value")
                    .label("app", "web-2")
                    .label("tier", "front")
                    .ip("10.0.0.4")
                    .build(),
            ],
            |p, _| {
                ensure!(
                    p.creates.len() == 1 && workloads_in(&p.creates[0]) == ["both-labels"],
                    "only both-labels selected"
                );
                Ok(())
            },
        ),
        Case::new(
            "workloads_of_other_namespaces_are_never_selected",
            web(),
            vec![
                vm("same-ns", "10.0.0.1").build(),
                vm("other-ns", "10.0.0.2").namespace("elsewhere").build(),
            ],
            |p, _| {
                ensure!(
                    addresses(&p.creates) == ["10.0.0.1"],
                    "only same-ns selected"
                );
                Ok(())
            },
        ),
        Case::new(
            "service_that_loses_its_selector_deletes_our_slices",
            web().no_selector(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, existing| {
                ensure!(
                    p.creates.is_empty() && p.updates.is_empty(),
                    "no creates or updates"
                );
                ensure!(
                    p.deletes.len() == existing.len() && !existing.is_empty(),
                    "all {} slices deleted",
                    existing.len()
                );
                Ok(())
            },
        )
        .after(web(), vec![vm("vm-1", "10.0.0.1").build()]),
        Case::new(
            "service_that_becomes_external_name_deletes_our_slices",
            web().external_name(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, existing| {
                ensure!(
                    p.deletes.len() == existing.len() && !existing.is_empty(),
                    "all slices deleted"
                );
                ensure!(p.creates.is_empty() && p.updates.is_empty(), "nothing else");
                Ok(())
            },
        )
        .after(web(), vec![vm("vm-1", "10.0.0.1").build()]),
        Case::new(
            "workloads_with_no_ip_are_skipped",
            web(),
            vec![
                vm("with-ip", "10.0.0.1").build(),
                Workload::named("no-ip")
                    .label("app", "web")
                    .port("http", 8080)
                    .ready()
                    .build(),
            ],
            |p, _| {
                ensure!(
                    p.creates.len() == 1 && workloads_in(&p.creates[0]) == ["with-ip"],
                    "no-ip skipped"
                );
                ensure!(p.diagnostics.is_empty(), "no IP is not a problem to report");
                Ok(())
            },
        ),
    ]);
}

#[test]
fn address_family_rules() {
    run(vec![
        Case::new(
            "families_come_from_ip_families",
            web().families(&["IPv6"]),
            vec![vm("dual", "10.0.0.1").ip("fd00::1").build()],
            |p, _| {
                ensure!(
                    p.creates.len() == 1 && p.creates[0].address_type == "IPv6",
                    "only an IPv6 slice"
                );
                ensure!(
                    addresses(&p.creates) == ["fd00::1"],
                    "only the IPv6 address"
                );
                Ok(())
            },
        ),
        Case::new(
            "no_ip_families_listed_means_both",
            web(),
            vec![vm("v4", "10.0.0.1").build(), vm("v6", "fd00::2").build()],
            |p, _| {
                let families: Vec<_> = p.creates.iter().map(|s| s.address_type.as_str()).collect();
                ensure!(
                    families == ["IPv4", "IPv6"],
                    "one slice per family, got {families:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "a_dual_stack_workload_gives_one_endpoint_per_family_slice",
            web().families(&["IPv4", "IPv6"]),
            vec![vm("dual", "10.0.0.1").ip("fd00::1").build()],
            |p, _| {
                ensure!(p.creates.len() == 2, "two slices");
                ensure!(
                    p.creates
                        .iter()
                        .all(|s| s.endpoints.as_ref().map(Vec::len) == Some(1)),
                    "one endpoint each"
                );
                ensure!(
                    addresses(&p.creates) == ["10.0.0.1", "fd00::1"],
                    "each holds its family's address"
                );
                Ok(())
            },
        ),
        Case::new(
            "slices_of_a_family_the_service_no_longer_has_are_deleted",
            web().families(&["IPv4"]),
            vec![vm("dual", "10.0.0.1").ip("fd00::1").build()],
            |p, existing| {
                ensure!(existing.len() == 2, "setup: two families");
                ensure!(
                    p.deletes.len() == 1 && p.deletes[0].address_type == "IPv6",
                    "IPv6 slice deleted"
                );
                ensure!(
                    p.creates.is_empty() && p.updates.is_empty(),
                    "IPv4 slice unchanged"
                );
                Ok(())
            },
        )
        .after(web(), vec![vm("dual", "10.0.0.1").ip("fd00::1").build()]),
        Case::new(
            "addresses_are_written_in_canonical_text",
            web(),
            vec![vm("long-v6", "FD00:0:0:0:0:0:0:0001").build()],
            |p, _| {
                ensure!(
                    addresses(&p.creates) == ["fd00::1"],
                    "canonical form, got {:?}",
                    addresses(&p.creates)
                );
                Ok(())
            },
        ),
        Case::new(
            "a_non_ip_string_is_skipped_reported_and_other_endpoints_still_published",
            web(),
            vec![
                vm("bad", "not-an-ip").build(),
                vm("half-bad", "10.0.0.2").ip("10.0.0.300").build(),
                vm("good", "10.0.0.1").build(),
            ],
            |p, _| {
                ensure!(
                    addresses(&p.creates) == ["10.0.0.1", "10.0.0.2"],
                    "good addresses published, got {:?}",
                    addresses(&p.creates)
                );
                let reported: Vec<_> = p
                    .diagnostics
                    .iter()
                    .map(|d| (d.workload.as_str(), d.problem.reason()))
                    .collect();
                ensure!(
                    reported == [("bad", "invalid_ip"), ("half-bad", "invalid_ip")],
                    "both reported, got {reported:?}"
                );
                ensure!(
                    matches!(&p.diagnostics[0].problem, Problem::InvalidIp { value } if value == "not-an-ip"),
                    "value kept for the Event"
                );
                Ok(())
            },
        ),
    ]);
}

#[test]
fn port_rules() {
    run(vec![
        Case::new(
            "named_target_port_resolves_to_the_workload_port_with_that_name_and_protocol",
            Svc::named("dns")
                .selector("app", "dns")
                .port("dns", 53, "dns")
                .protocol("UDP"),
            vec![
                Workload::named("vm-1")
                    .label("app", "dns")
                    .ip("10.0.0.1")
                    .port("dns", 5353)
                    .port_with_protocol("dns", 5354, Some("UDP"))
                    .build(),
            ],
            |p, _| {
                ensure!(
                    ports(&p.creates[0]) == [("dns".into(), 5354, "UDP".into())],
                    "UDP port chosen, got {:?}",
                    ports(&p.creates[0])
                );
                Ok(())
            },
        ),
        Case::new(
            "numeric_target_port_is_used_as_is_even_if_the_workload_does_not_declare_it",
            Svc::named("web")
                .selector("app", "web")
                .port("metrics", 9090, 9091),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(
                    ports(&p.creates[0]) == [("metrics".into(), 9091, "TCP".into())],
                    "9091 used"
                );
                Ok(())
            },
        ),
        Case::new(
            "unresolved_named_port_is_left_out_for_that_workload_and_reported",
            web().port("admin", 9000, "admin"),
            vec![
                vm("no-admin", "10.0.0.1").build(),
                vm("with-admin", "10.0.0.2").port("admin", 9990).build(),
            ],
            |p, _| {
                let lists: Vec<_> = p.creates.iter().map(ports).collect();
                ensure!(lists.len() == 2, "two port groups, got {lists:?}");
                ensure!(
                    lists.contains(&vec![("http".into(), 8080, "TCP".into())]),
                    "no-admin has only http"
                );
                ensure!(
                    p.diagnostics.len() == 1 && p.diagnostics[0].workload == "no-admin",
                    "no-admin reported"
                );
                ensure!(
                    matches!(&p.diagnostics[0].problem, Problem::UnresolvedPort { port_name, .. } if port_name == "admin"),
                    "names the port"
                );
                Ok(())
            },
        ),
        Case::new(
            "slice_port_has_service_port_name_resolved_number_and_service_protocol",
            Svc::named("web")
                .selector("app", "web")
                .port("web", 80, "http")
                .protocol("SCTP"),
            vec![
                Workload::named("vm-1")
                    .label("app", "web")
                    .ip("10.0.0.1")
                    .port_with_protocol("http", 8080, Some("SCTP"))
                    .build(),
            ],
            |p, _| {
                ensure!(
                    ports(&p.creates[0]) == [("web".into(), 8080, "SCTP".into())],
                    "got {:?}",
                    ports(&p.creates[0])
                );
                Ok(())
            },
        ),
        Case::new(
            "workloads_are_grouped_by_resolved_port_list",
            web(),
            vec![
                vm("a", "10.0.0.1").build(),
                Workload::named("b")
                    .label("app", "web")
                    .ip("10.0.0.2")
                    .port("http", 9090)
                    .build(),
                vm("c", "10.0.0.3").build(),
            ],
            |p, _| {
                let groups: Vec<_> = p
                    .creates
                    .iter()
                    .map(|s| (ports(s)[0].1, workloads_in(s)))
                    .collect();
                ensure!(
                    groups
                        == [
                            (8080, vec!["a".to_owned(), "c".to_owned()]),
                            (9090, vec!["b".to_owned()])
                        ],
                    "got {groups:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "headless_service_without_ports_gives_slices_without_ports",
            Svc::named("web").selector("app", "web").headless(),
            vec![vm("vm-1", "10.0.0.1").build()],
            |p, _| {
                ensure!(
                    p.creates.len() == 1 && ports(&p.creates[0]).is_empty(),
                    "one slice, no ports"
                );
                Ok(())
            },
        ),
    ]);
}

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
