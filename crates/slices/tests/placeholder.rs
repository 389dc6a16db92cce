//! The placeholder rule of docs/slices.md ("Packing", step 4; issue 37): a Service that still
//! selects workloads keeps one empty slice per address family when the last endpoint of that
//! family leaves, instead of losing its last slice; it never gets one from nothing.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use api::v1beta1::ExternalWorkload;
use common::{Case, converge, existing_names, names, on_port_9090, plan, ports, run, workloads_in};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{SliceStore, vm, web};
use slices::{Config, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, IDENTITY_DIGEST_ANNOTATION};

fn max(n: usize) -> Config {
    Config::new(n, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX).unwrap()
}

/// A workload `web` selects with an IPv4 and an IPv6 address.
fn dual(name: &str, v4: &str, v6: &str) -> ExternalWorkload {
    vm(name, v4).ip(v6).build()
}

/// Whether `slice` is a placeholder: no endpoints, no ports, the digest of no endpoints.
fn is_placeholder(slice: &EndpointSlice) -> bool {
    let digest = slice
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IDENTITY_DIGEST_ANNOTATION));
    slice.endpoints.as_deref().unwrap_or_default().is_empty()
        && ports(slice).is_empty()
        && digest.is_some()
}

/// Plans `service` over `store`, applies the plan, and checks that planning again writes nothing.
fn step(
    store: &mut SliceStore,
    service: &Service,
    workloads: &[ExternalWorkload],
) -> slices::SlicePlan {
    let planned = plan(service, workloads, &store.slices(), &Config::default());
    store.apply(&planned);
    let again = plan(service, workloads, &store.slices(), &Config::default());
    assert!(again.is_empty(), "second plan: {again:#?}");
    planned
}

#[test]
fn placeholder_rules() {
    run(vec![
        Case::new(
            "removing_the_last_workload_empties_the_last_slice_instead_of_deleting_it",
            web(),
            vec![],
            |p, existing| {
                ensure!(existing.len() == 1, "setup: one slice");
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "no create, no delete"
                );
                ensure!(
                    names(&p.updates) == existing_names(existing),
                    "the existing slice is updated"
                );
                ensure!(is_placeholder(&p.updates[0]), "to a placeholder");
                Ok(())
            },
        )
        .after(web(), vec![vm("a", "10.0.0.1").build()]),
        Case::new(
            "a_service_that_never_selected_a_workload_gets_no_placeholder",
            web(),
            vec![vm("other", "10.0.0.1").label("app", "api").build()],
            |p, _| {
                ensure!(p.is_empty(), "no placeholder from nothing");
                Ok(())
            },
        ),
        Case::new(
            "a_workload_without_usable_addresses_gives_no_placeholder_from_nothing",
            web(),
            vec![vm("bad", "not-an-ip").build()],
            |p, _| {
                ensure!(p.creates.is_empty() && p.updates.is_empty(), "no slice");
                Ok(())
            },
        ),
        Case::new(
            "several_slices_keep_one_placeholder_and_the_rest_are_deleted",
            web(),
            vec![],
            |p, existing| {
                ensure!(existing.len() == 3, "setup: three slices");
                ensure!(p.creates.is_empty(), "no create");
                ensure!(
                    p.updates.len() == 1 && is_placeholder(&p.updates[0]),
                    "one placeholder"
                );
                ensure!(
                    names(&p.updates) == existing_names(&existing[..1]),
                    "the first by name is kept"
                );
                ensure!(p.deletes.len() == 2, "the other two go");
                Ok(())
            },
        )
        .after(
            web(),
            vec![
                vm("a", "10.0.0.1").build(),
                vm("b", "10.0.0.2").build(),
                vm("c", "10.0.0.3").build(),
            ],
        )
        .config(max(1)),
        Case::new(
            "a_dual_stack_service_keeps_one_placeholder_per_family",
            web(),
            vec![],
            |p, existing| {
                ensure!(existing.len() == 2, "setup: IPv4 and IPv6 slices");
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "nothing deleted"
                );
                let families: Vec<&str> =
                    p.updates.iter().map(|s| s.address_type.as_str()).collect();
                ensure!(families == ["IPv4", "IPv6"], "got {families:?}");
                ensure!(p.updates.iter().all(is_placeholder), "both empty");
                Ok(())
            },
        )
        .after(web(), vec![dual("a", "10.0.0.1", "fd00::1")]),
        Case::new(
            "the_last_workload_of_one_family_leaves_a_placeholder_of_that_family",
            web(),
            vec![vm("b", "10.0.0.2").build()],
            |p, existing| {
                ensure!(existing.len() == 2, "setup: IPv4 and IPv6 slices");
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "nothing deleted"
                );
                let v6: Vec<&EndpointSlice> = p
                    .updates
                    .iter()
                    .filter(|s| s.address_type == "IPv6")
                    .collect();
                ensure!(v6.len() == 1 && is_placeholder(v6[0]), "IPv6 emptied");
                let v4: Vec<&EndpointSlice> = p
                    .updates
                    .iter()
                    .filter(|s| s.address_type == "IPv4")
                    .collect();
                ensure!(
                    v4.len() == 1 && workloads_in(v4[0]) == ["b"],
                    "IPv4 keeps b only"
                );
                Ok(())
            },
        )
        .after(
            web(),
            vec![
                dual("a", "10.0.0.1", "fd00::1"),
                vm("b", "10.0.0.2").build(),
            ],
        ),
        Case::new(
            "port_groups_that_all_empty_leave_one_placeholder",
            web(),
            vec![],
            |p, existing| {
                ensure!(existing.len() == 2, "setup: two port groups");
                ensure!(
                    p.updates.len() == 1 && is_placeholder(&p.updates[0]),
                    "one placeholder"
                );
                ensure!(
                    p.deletes.len() == 1 && p.creates.is_empty(),
                    "the other goes"
                );
                Ok(())
            },
        )
        .after(
            web(),
            vec![vm("a", "10.0.0.1").build(), on_port_9090("b", "10.0.0.2")],
        ),
        Case::new(
            "a_placeholder_is_never_kept_in_a_family_the_service_no_longer_has",
            web().families(&["IPv4"]),
            vec![],
            |p, existing| {
                ensure!(existing.len() == 2, "setup: IPv4 and IPv6 slices");
                let deleted: Vec<&str> =
                    p.deletes.iter().map(|s| s.address_type.as_str()).collect();
                ensure!(deleted == ["IPv6"], "IPv6 deleted, got {deleted:?}");
                ensure!(
                    p.updates.len() == 1 && is_placeholder(&p.updates[0]),
                    "IPv4 kept empty"
                );
                Ok(())
            },
        )
        .after(web(), vec![dual("a", "10.0.0.1", "fd00::1")]),
        Case::new(
            "a_slice_owned_by_an_earlier_service_of_that_name_is_never_the_placeholder",
            web().uid("uid-svc-web-2"),
            vec![],
            |p, existing| {
                ensure!(
                    p.deletes.len() == existing.len() && !existing.is_empty(),
                    "the earlier Service's slice is deleted"
                );
                ensure!(p.creates.is_empty() && p.updates.is_empty(), "nothing else");
                Ok(())
            },
        )
        .after(web(), vec![vm("a", "10.0.0.1").build()]),
    ]);
}

#[test]
fn a_workload_that_returns_is_written_into_the_placeholder() {
    let service = web().build();
    let mut store = converge(&service, &[vm("a", "10.0.0.1").build()], &Config::default());
    step(&mut store, &service, &[]);
    let placeholder = names(&store.slices().into_iter().cloned().collect::<Vec<_>>());

    let back = step(&mut store, &service, &[vm("b", "10.0.0.2").build()]);

    assert!(
        back.creates.is_empty() && back.deletes.is_empty(),
        "{back:#?}"
    );
    assert_eq!(
        names(&back.updates),
        placeholder,
        "the placeholder is reused"
    );
    assert_eq!(workloads_in(&back.updates[0]), ["b"]);
    assert_eq!(
        ports(&back.updates[0]),
        [("http".to_owned(), 8080, "TCP".to_owned())]
    );
}

#[test]
fn the_placeholder_goes_when_the_service_stops_being_ours() {
    let stops: [(&str, Service); 2] = [
        ("selector removed", web().no_selector().build()),
        ("type ExternalName", web().external_name().build()),
    ];
    for (why, stopped) in stops {
        let mut store = converge(
            &web().build(),
            &[vm("a", "10.0.0.1").build()],
            &Config::default(),
        );
        step(&mut store, &web().build(), &[]);
        assert_eq!(store.slices().len(), 1, "{why}: the placeholder");

        let gone = step(&mut store, &stopped, &[]);

        assert_eq!(gone.deletes.len(), 1, "{why}: {gone:#?}");
        assert!(store.slices().is_empty(), "{why}");
    }
}

#[test]
fn a_placeholder_deleted_by_someone_else_is_not_recreated() {
    // Never created from nothing: with no slice of ours left there is no placeholder to keep,
    // and the Service is then like one that never selected a workload.
    let service = web().build();
    let mut store = converge(&service, &[vm("a", "10.0.0.1").build()], &Config::default());
    step(&mut store, &service, &[]);
    let everything = slices::SlicePlan {
        deletes: store.slices().into_iter().cloned().collect(),
        ..slices::SlicePlan::default()
    };
    store.apply(&everything);

    let after = plan(&service, &[], &store.slices(), &Config::default());

    assert!(after.is_empty(), "{after:#?}");
}
