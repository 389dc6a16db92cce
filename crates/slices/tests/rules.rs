//! One named case per planner rule of docs/slices.md: selection, address families and
//! ports. Endpoints and metadata are in `metadata.rs`, packing in `packing.rs`.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use common::{Case, addresses, on_port_9090, ports, run, workloads_in};
use slices::Problem;
use slices::testing::{Svc, Workload, vm, web};

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
                on_port_9090("b", "10.0.0.2"),
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
