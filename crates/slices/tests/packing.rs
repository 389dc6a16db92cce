//! One named case per packing rule of docs/slices.md ("Packing", steps 1 to 5), plus the plan-wide
//! guarantees: write order, no creates while the Service is deleted, determinism, no mutation,
//! and no write when only the trigger time differs.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use api::v1beta1::ExternalWorkload;
use common::{Case, converge, existing_names, names, on_port_9090, plan, ports, run, workloads_in};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{SliceStore, Svc, Workload, time, vm, web};
use slices::{Config, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, Write, plan_slices};

/// Workloads `names`, with addresses 10.0.0.<index+1>.
fn vms(names: &[&str]) -> Vec<ExternalWorkload> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| vm(n, &format!("10.0.0.{}", i + 1)).build())
        .collect()
}

fn max(n: usize) -> Config {
    Config::new(n, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX).unwrap()
}

fn sizes(slices: &[EndpointSlice]) -> Vec<usize> {
    slices
        .iter()
        .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
        .collect()
}

#[test]
fn packing_rules() {
    run(vec![
        Case::new(
            "step1_unchanged_state_writes_nothing",
            web(),
            vms(&["a", "b"]),
            |p, _| {
                ensure!(p.is_empty(), "no writes");
                Ok(())
            },
        )
        .after(web(), vms(&["a", "b"])),
        Case::new(
            "step1_changed_endpoint_is_updated_in_its_slice",
            web(),
            vec![vm("a", "10.0.0.9").build()],
            |p, existing| {
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "only an update"
                );
                ensure!(names(&p.updates) == existing_names(existing), "same slice");
                ensure!(
                    p.updates[0].metadata.resource_version.is_some(),
                    "carries resourceVersion"
                );
                Ok(())
            },
        )
        .after(web(), vec![vm("a", "10.0.0.1").build()]),
        Case::new(
            "step1_slice_left_with_no_desired_endpoint_is_deleted",
            web(),
            vms(&["a", "b"]),
            |p, existing| {
                ensure!(existing.len() == 2, "setup: two slices");
                ensure!(
                    p.deletes.len() == 1 && workloads_in(&p.deletes[0]) == ["c"],
                    "slice of c deleted"
                );
                ensure!(p.creates.is_empty() && p.updates.is_empty(), "nothing else");
                Ok(())
            },
        )
        .after(web(), vms(&["a", "b", "c"]))
        .config(max(2)),
        Case::new(
            "step1_label_only_change_updates_every_slice",
            web().label("team", "a"),
            vms(&["a", "b", "c"]),
            |p, existing| {
                ensure!(
                    p.updates.len() == existing.len()
                        && p.creates.is_empty()
                        && p.deletes.is_empty(),
                    "all updated"
                );
                ensure!(
                    sizes(&p.updates) == [2, 1],
                    "endpoints untouched: {:?}",
                    sizes(&p.updates)
                );
                Ok(())
            },
        )
        .after(web(), vms(&["a", "b", "c"]))
        .config(max(2)),
        Case::new(
            "step2_new_endpoints_top_up_slices_already_being_updated_fullest_first",
            web(),
            {
                // a removed (first slice 3 left), f changed (second slice updated, 2), g and h new.
                let mut now = vms(&["b", "c", "d", "e"]);
                now.push(vm("f", "10.0.0.99").build());
                now.extend([vm("g", "10.0.1.1").build(), vm("h", "10.0.1.2").build()]);
                now
            },
            |p, _| {
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "no create or delete"
                );
                let contents: Vec<_> = p.updates.iter().map(workloads_in).collect();
                ensure!(
                    contents == [vec!["b", "c", "d", "g"], vec!["e", "f", "h"]],
                    "got {contents:?}"
                );
                Ok(())
            },
        )
        .after(web(), vms(&["a", "b", "c", "d", "e", "f"]))
        .config(max(4)),
        Case::new(
            "step3_remaining_endpoints_fill_an_unchanged_slice_that_can_take_them_all",
            web(),
            vms(&["a", "b", "c", "d", "e", "f", "g", "h"]),
            |p, _| {
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "no create or delete"
                );
                ensure!(
                    p.updates.len() == 1 && workloads_in(&p.updates[0]) == ["f", "g", "h"],
                    "h joins f,g: {:?}",
                    p.updates.iter().map(workloads_in).collect::<Vec<_>>()
                );
                Ok(())
            },
        )
        .after(web(), vms(&["a", "b", "c", "d", "e", "f", "g"]))
        .config(max(5)),
        Case::new(
            "step3_otherwise_new_slices_are_created",
            web(),
            vms(&["a", "b", "c"]),
            |p, _| {
                ensure!(
                    p.updates.is_empty() && p.deletes.is_empty(),
                    "the unchanged slice stays"
                );
                ensure!(
                    p.creates.len() == 1 && workloads_in(&p.creates[0]) == ["b", "c"],
                    "b and c in a new slice"
                );
                Ok(())
            },
        )
        .after(web(), vms(&["a"]))
        .config(max(2)),
        Case::new(
            "step4_slices_of_a_port_group_no_longer_desired_are_deleted",
            web(),
            vms(&["a"]),
            |p, _| {
                ensure!(p.creates.is_empty() && p.updates.is_empty(), "nothing else");
                ensure!(
                    p.deletes.len() == 1 && ports(&p.deletes[0])[0].1 == 9090,
                    "9090 group's slice deleted"
                );
                Ok(())
            },
        )
        .after(
            web(),
            vec![vm("a", "10.0.0.1").build(), on_port_9090("b", "10.0.0.2")],
        ),
        Case::new(
            "step4_no_placeholder_for_a_service_that_never_selected_a_workload",
            web(),
            vec![],
            |p, _| {
                ensure!(p.is_empty(), "no placeholder from nothing");
                Ok(())
            },
        ),
        Case::new(
            "step5_a_create_and_a_delete_of_the_same_family_become_an_update",
            web(),
            vec![vm("a", "10.0.0.1").port("http", 9090).build()],
            |p, existing| {
                // Port 8080 group gone, 9090 group new: one update of the old slice, not create+delete.
                ensure!(p.creates.is_empty() && p.deletes.is_empty(), "recycled");
                ensure!(
                    names(&p.updates) == existing_names(existing),
                    "same slice name"
                );
                ensure!(
                    ports(&p.updates[0])[0].1 == 8080,
                    "new port list (first declared http wins)"
                );
                Ok(())
            },
        )
        .after(
            web(),
            vec![
                Workload::named("a")
                    .label("app", "web")
                    .ip("10.0.0.1")
                    .port("http", 7070)
                    .build(),
            ],
        ),
        Case::new(
            "no_slice_holds_more_than_the_maximum",
            web(),
            vms(&["a", "b", "c", "d", "e"]),
            |p, _| {
                ensure!(
                    sizes(&p.creates) == [2, 2, 1],
                    "got {:?}",
                    sizes(&p.creates)
                );
                Ok(())
            },
        )
        .config(max(2)),
        Case::new(
            "no_creates_for_a_service_being_deleted",
            web().deleting(),
            vms(&["a"]),
            |p, _| {
                ensure!(p.creates.is_empty(), "no create");
                Ok(())
            },
        ),
    ]);
}

#[test]
fn step3_fills_the_unchanged_slice_that_ends_closest_to_full() {
    let config = max(5);
    let ten = vms(&["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]);
    let mut store = converge(&web().build(), &ten, &config);
    // Leave the first slice with 3 and the second with 4: both unchanged next time.
    let fewer: Vec<_> = ten
        .iter()
        .filter(|w| !["a", "b", "f"].contains(&w.metadata.name.as_deref().unwrap()))
        .cloned()
        .collect();
    let second = plan(&web().build(), &fewer, &store.slices(), &config);
    store.apply(&second);
    let mut more = fewer.clone();
    more.push(vm("k", "10.0.1.1").build());
    let third = plan(&web().build(), &more, &store.slices(), &config);
    let contents: Vec<_> = third.updates.iter().map(workloads_in).collect();
    assert_eq!(
        contents,
        [vec!["g", "h", "i", "j", "k"]],
        "k goes where the slice ends full"
    );
    assert!(third.creates.is_empty() && third.deletes.is_empty());
}

#[test]
fn writes_come_in_order_creates_then_updates_then_deletes() {
    let config = max(1);
    let store = converge(
        &web().families(&["IPv4", "IPv6"]).build(),
        &[vm("a", "10.0.0.1").ip("fd00::1").build()],
        &config,
    );
    // Drop IPv6 (delete), change a (update), add b (create).
    let now = [vm("a", "10.0.0.9").build(), vm("b", "10.0.0.2").build()];
    let p = plan(
        &web().families(&["IPv4"]).build(),
        &now,
        &store.slices(),
        &config,
    );
    let order: Vec<&str> = p
        .writes()
        .map(|w| match w {
            Write::Create(_) => "create",
            Write::Update(_) => "update",
            Write::Delete(_) => "delete",
        })
        .collect();
    assert_eq!(order, ["create", "update", "delete"]);
}

#[test]
fn trigger_time_alone_never_causes_an_update() {
    let workloads = vms(&["a", "b"]);
    let store = converge(&web().build(), &workloads, &Config::default());
    let refs: Vec<&ExternalWorkload> = workloads.iter().collect();
    let later = plan_slices(
        &web().build(),
        &refs,
        &store.slices(),
        &Config::default(),
        &time(999_999),
    );
    assert!(later.is_empty(), "{later:#?}");
}

#[test]
fn planning_does_not_depend_on_input_order_and_does_not_mutate_inputs() {
    let config = max(3);
    let service = web().families(&["IPv4", "IPv6"]).build();
    let mut workloads = vms(&["e", "b", "a", "d", "c"]);
    workloads.push(vm("x", "fd00::1").build());
    let store = converge(&service, &vms(&["a", "z"]), &config);
    let existing: Vec<EndpointSlice> = store.slices().into_iter().cloned().collect();
    let (service_before, workloads_before, existing_before) =
        (service.clone(), workloads.clone(), existing.clone());

    let forward: Vec<&ExternalWorkload> = workloads.iter().collect();
    let backward: Vec<&ExternalWorkload> = workloads.iter().rev().collect();
    let existing_forward: Vec<&EndpointSlice> = existing.iter().collect();
    let existing_backward: Vec<&EndpointSlice> = existing.iter().rev().collect();
    let one = plan_slices(&service, &forward, &existing_forward, &config, &time(5));
    let two = plan_slices(&service, &backward, &existing_backward, &config, &time(5));
    assert_eq!(one, two);
    assert_eq!(
        (service, workloads, existing),
        (service_before, workloads_before, existing_before)
    );
}

#[test]
fn slices_of_other_services_or_managers_are_never_touched() {
    let config = Config::default();
    let mut foreign = SliceStore::default();
    foreign.apply(&plan(
        &Svc::named("other")
            .selector("app", "web")
            .port("http", 80, "http")
            .build(),
        &vms(&["a"]),
        &[],
        &config,
    ));
    let other_manager = Config::new(100, "someone-else", DEFAULT_NAME_PREFIX).unwrap();
    foreign.apply(&plan(&web().build(), &vms(&["a"]), &[], &other_manager));
    let p = plan(&web().build(), &[], &foreign.slices(), &config);
    assert!(p.is_empty(), "{p:#?}");
}

#[test]
fn a_lowered_maximum_splits_overfull_slices() {
    let workloads = vms(&["a", "b", "c", "d"]);
    let mut store = converge(&web().build(), &workloads, &max(4));
    let p = plan(&web().build(), &workloads, &store.slices(), &max(2));
    assert_eq!((sizes(&p.updates), sizes(&p.creates)), (vec![2], vec![2]));
    store.apply(&p);
    assert!(plan(&web().build(), &workloads, &store.slices(), &max(2)).is_empty());
}
