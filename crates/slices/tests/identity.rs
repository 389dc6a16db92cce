//! The identity digest of docs/slices.md ("Identity digest"; issue 37): every slice we write
//! carries a digest of what consumers copy from its workloads (mesh identity and server name),
//! so a change of either rewrites the slices holding that workload, and nothing else does.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

mod common;

use api::v1beta1::ExternalWorkload;
use common::{Case, converge, existing_names, names, plan, run, workloads_in};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{vm, web};
use slices::{Config, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX, IDENTITY_DIGEST_ANNOTATION};

fn max(n: usize) -> Config {
    Config::new(n, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX).unwrap()
}

fn digest(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .annotations
        .as_ref()?
        .get(IDENTITY_DIGEST_ANNOTATION)
        .map(String::as_str)
}

/// `a` and `b`, one per slice with a maximum of 1.
fn two() -> Vec<ExternalWorkload> {
    vec![vm("a", "10.0.0.1").build(), vm("b", "10.0.0.2").build()]
}

#[test]
fn identity_digest_rules() {
    run(vec![
        Case::new(
            "every_written_slice_carries_the_digest_annotation",
            web(),
            two(),
            |p, _| {
                ensure!(p.creates.len() == 1, "one slice");
                let value = digest(&p.creates[0]).unwrap_or_default();
                ensure!(
                    value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()),
                    "16 hex digits, got {value:?}"
                );
                Ok(())
            },
        ),
        Case::new(
            "an_identity_change_rewrites_only_the_slice_holding_that_workload",
            web(),
            vec![
                vm("a", "10.0.0.1").identity("rotated.identity").build(),
                vm("b", "10.0.0.2").build(),
            ],
            |p, existing| {
                ensure!(
                    p.creates.is_empty() && p.deletes.is_empty(),
                    "only an update"
                );
                ensure!(p.updates.len() == 1, "one update, got {}", p.updates.len());
                ensure!(workloads_in(&p.updates[0]) == ["a"], "a's slice");
                let before = existing
                    .iter()
                    .find(|s| s.metadata.name == p.updates[0].metadata.name)
                    .and_then(|s| digest(s));
                ensure!(
                    before.is_some() && before != digest(&p.updates[0]),
                    "the digest changes"
                );
                ensure!(
                    p.updates[0].endpoints
                        == existing
                            .iter()
                            .find(|s| s.metadata.name == p.updates[0].metadata.name)
                            .and_then(|s| s.endpoints.clone()),
                    "the endpoints do not"
                );
                Ok(())
            },
        )
        .after(web(), two())
        .config(max(1)),
        Case::new(
            "a_server_name_change_rewrites_the_slice",
            web(),
            vec![vm("a", "10.0.0.1").server_name("rotated.server").build()],
            |p, existing| {
                ensure!(
                    p.creates.is_empty()
                        && p.deletes.is_empty()
                        && names(&p.updates) == existing_names(existing),
                    "one update of the slice"
                );
                Ok(())
            },
        )
        .after(web(), vec![vm("a", "10.0.0.1").build()]),
        Case::new(
            "unchanged_identities_write_nothing",
            web(),
            two(),
            |p, _| {
                ensure!(p.is_empty(), "no write");
                Ok(())
            },
        )
        .after(web(), two()),
    ]);
}

#[test]
fn digest_depends_on_identities_not_on_endpoint_order_or_slice_layout() {
    // The same workloads and identities give the same digest whatever order they were listed in.
    let forward = converge(&web().build(), &two(), &Config::default());
    let mut reversed = two();
    reversed.reverse();
    let backward = converge(&web().build(), &reversed, &Config::default());
    let digests = |store: &slices::testing::SliceStore| -> Vec<String> {
        store
            .slices()
            .iter()
            .filter_map(|s| digest(s).map(str::to_owned))
            .collect()
    };
    assert_eq!(digests(&forward), digests(&backward));
    assert_eq!(digests(&forward).len(), 1);
}

#[test]
fn a_slice_without_the_digest_is_rewritten_once() {
    // Slices written before the digest existed (or by Linkerd's controller) get it on the first
    // pass, once: a consumer could otherwise hold an identity we cannot vouch for.
    let workloads = two();
    let store = converge(&web().build(), &workloads, &Config::default());
    let stripped: Vec<EndpointSlice> = store
        .slices()
        .into_iter()
        .cloned()
        .map(|mut slice| {
            if let Some(annotations) = slice.metadata.annotations.as_mut() {
                annotations.remove(IDENTITY_DIGEST_ANNOTATION);
            }
            slice
        })
        .collect();
    let mut store = slices::testing::SliceStore::with(stripped);

    let first = plan(
        &web().build(),
        &workloads,
        &store.slices(),
        &Config::default(),
    );
    assert_eq!(first.updates.len(), 1, "{first:#?}");
    assert!(first.creates.is_empty() && first.deletes.is_empty());
    assert_eq!(
        first.updates[0].endpoints,
        store.slices()[0].endpoints,
        "only the annotation changes"
    );
    store.apply(&first);

    let second = plan(
        &web().build(),
        &workloads,
        &store.slices(),
        &Config::default(),
    );
    assert!(second.is_empty(), "{second:#?}");
}

#[test]
fn a_rewrite_for_the_digest_keeps_the_slice_port_order() {
    // Linkerd writes ports in the Service's order, ours sorted: adding the digest to Linkerd's
    // slice must not change anything a reader of the ports sees.
    let service = web().port("admin", 81, "admin").build();
    let workload = || vm("a", "10.0.0.1").port("admin", 9000);
    let store = converge(&service, &[workload().build()], &Config::default());
    let reordered: Vec<EndpointSlice> = store
        .slices()
        .into_iter()
        .cloned()
        .map(|mut slice| {
            slice.ports.as_mut().unwrap().reverse();
            slice
        })
        .collect();
    let order = reordered[0].ports.clone();
    let mut store = slices::testing::SliceStore::with(reordered);

    let rotated = [workload().identity("rotated").build()];
    let p = plan(&service, &rotated, &store.slices(), &Config::default());

    assert_eq!(p.updates.len(), 1, "{p:#?}");
    assert_eq!(p.updates[0].ports, order, "the slice's own order");
    store.apply(&p);
    assert!(plan(&service, &rotated, &store.slices(), &Config::default()).is_empty());
}
