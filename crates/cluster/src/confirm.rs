//! Clause 3's reads (docs/architecture.md, "A fresh view"): the Service of a pass that adds, and
//! the added workloads ([`crate::view`]), are read from the API server, and the addition is
//! written only if they agree with the view (unless the caches vouch for it:
//! [`crate::view::View::caches_vouch`]).
//!
//! - the Service (a GET), always: a selector change the Service watch has not delivered could
//!   make the addition wrong (the selector changed, then the workload's labels matched the old
//!   one). It must still exist with the same uid and selector.
//! - each added workload (a GET each, up to [`list_above`]; above that, one LIST by the
//!   Service's selector, so a replay of many additions costs one read): a selector change could
//!   re-select a workload deleted just before it, or a relabel the workload watch has not
//!   delivered could have taken it out. Each must still exist with the same uid and be selected.
//!
//! A GET or LIST without a resourceVersion is a consistent read (served from etcd, or once the
//! API server's cache has caught up with it), so it shows every change made before it. When a
//! read disagrees with the view, nothing is written: the reconcile looks again shortly, when the
//! lagging watch has delivered more. Passes that add nothing (readiness, addresses, removals, a
//! replay that finds the slices right) read nothing, nor does a Service's addition before the
//! term's first write of its slices when the caches show it at one point (a new term's replay
//! over quiet caches: an initial publish costs one create per slice).
//!
//! Between the read and the write the world can move on again (a workload deleted a moment after
//! the GET). That is an ordinary race: the removal is published by this leader after its write,
//! not before it, so nothing published comes back.

use std::collections::HashMap;

use api::v1beta1::ExternalWorkload;
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::Service;
use slices::{CachedService, CachedSlice, CachedWorkload, SlicePlan, Token, selects};

use crate::writer::KubeReadWrite;

/// Added workloads are read one GET each up to at least this many (see [`list_above`]).
pub const GET_AT_MOST: usize = 3;

/// How many of a namespace's workloads one LIST costs as much as one GET: a LIST by label
/// selector makes the API server pass over every workload of the namespace and filter them (and
/// API Priority and Fairness charges it about one seat per hundred objects, up to ten), where a
/// GET reads one key.
const NAMESPACE_WORKLOADS_PER_GET: usize = 100;

/// Up to how many added workloads are read by one GET each, in a namespace of
/// `namespace_workloads` cached workloads; more are read by one LIST by the Service's selector.
/// Few GETs are cheaper than a LIST in a small namespace only up to [`GET_AT_MOST`] (each takes
/// a slot of the write path's calls in flight: at 8, a publish of Services of 5 workloads sent 6
/// reads per create). In a large one the LIST is the dear read: at 10,000 Services of 5
/// workloads in 4 namespaces, a LIST per Service (12,500 workloads filtered each time) held a
/// first leader's publish to 34 Services/s (failover bench, 3654a91); GETs up to a hundredth of
/// the namespace keep each read near the cost of one key.
pub fn list_above(namespace_workloads: usize) -> usize {
    GET_AT_MOST.max(namespace_workloads / NAMESPACE_WORKLOADS_PER_GET)
}

/// Whether the API server agrees with the view: the Service (if `read_service`) exists with
/// the same uid and selector, and each of `workloads` exists with the same uid and is selected.
/// `namespace_workloads` is how many workloads the Service's namespace holds (cached), which
/// decides between GETs and a LIST ([`list_above`]).
pub async fn confirm(
    api: &KubeReadWrite,
    service: &CachedService,
    read_service: bool,
    workloads: &[&CachedWorkload],
    namespace_workloads: usize,
) -> Result<bool, kube::Error> {
    // The workloads first, the Service last: the Service's selector decides membership, so its
    // read is the one kept nearest the write (simulation seed 9982: a Service read answered
    // before slow workload reads vouched for a selector changed 2.7 s before the write).
    if !workloads.is_empty()
        && !workloads_agree(api, service, workloads, namespace_workloads).await?
    {
        return Ok(false);
    }
    if read_service {
        let fresh: Option<Service> = api.read(&service.namespace, &service.name).await?;
        return Ok(fresh
            .as_ref()
            .map(CachedService::from)
            .is_some_and(|fresh| fresh.uid == service.uid && fresh.selector == service.selector));
    }
    Ok(true)
}

/// Whether each of `workloads` exists with the same uid and is selected by `service`, as the
/// API server has them now.
async fn workloads_agree(
    api: &KubeReadWrite,
    service: &CachedService,
    workloads: &[&CachedWorkload],
    namespace_workloads: usize,
) -> Result<bool, kube::Error> {
    let fresh: Vec<Option<CachedWorkload>> = if workloads.len() <= list_above(namespace_workloads) {
        try_join_all(workloads.iter().map(|workload| async {
            let fresh: Option<ExternalWorkload> =
                api.read(&workload.namespace, &workload.name).await?;
            Ok::<_, kube::Error>(fresh.as_ref().map(CachedWorkload::from))
        }))
        .await?
    } else {
        let selector = label_selector(service);
        let listed: HashMap<String, CachedWorkload> = api
            .list_workloads(&service.namespace, &selector)
            .await?
            .iter()
            .map(|workload| {
                let cached = CachedWorkload::from(workload);
                (cached.name.to_string(), cached)
            })
            .collect();
        workloads
            .iter()
            .map(|workload| listed.get(&*workload.name).cloned())
            .collect()
    };
    Ok(workloads.iter().zip(&fresh).all(|(cached, fresh)| {
        fresh
            .as_ref()
            .is_some_and(|fresh| fresh.uid == cached.uid && selects(service, fresh))
    }))
}

/// The `workloads` whose endpoints `plan` writes into slices where none of the Service's
/// `existing` slices holds them (by name, and by uid where both have one).
pub fn added<'a>(
    plan: &SlicePlan,
    existing: &[&CachedSlice],
    workloads: &[&'a CachedWorkload],
) -> Vec<&'a CachedWorkload> {
    let mut held: HashMap<&str, Option<&Token>> = HashMap::new();
    for target in existing
        .iter()
        .flat_map(|slice| slice.endpoints.iter())
        .filter_map(|endpoint| endpoint.target.as_ref())
    {
        if let Some(name) = target.name.as_deref() {
            held.insert(name, target.uid.as_ref());
        }
    }
    let by_name: HashMap<&str, &'a CachedWorkload> = workloads
        .iter()
        .map(|workload| (&*workload.name, *workload))
        .collect();
    let mut added: Vec<&'a CachedWorkload> = plan
        .creates
        .iter()
        .chain(&plan.updates)
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter_map(|endpoint| {
            let target = endpoint.target_ref.as_ref()?;
            let name = target.name.as_deref()?;
            // A missing uid on either side never makes two workloads of one name differ.
            let is_held = match held.get(name) {
                None => false,
                Some(Some(held)) => target.uid.as_deref().is_none_or(|uid| held.is(uid)),
                Some(None) => true,
            };
            (!is_held).then(|| by_name.get(name).copied()).flatten()
        })
        .collect();
    added.sort_by(|a, b| a.name.cmp(&b.name));
    added.dedup_by(|a, b| a.name == b.name);
    added
}

/// The Service's selector as a label selector (`k=v,k2=v2`).
fn label_selector(service: &CachedService) -> String {
    service
        .selector
        .iter()
        .flat_map(|selector| selector.iter())
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, DeleteParams, PostParams};
    use slices::{
        Config, plan_slices,
        testing::{NAMESPACE, time, vm, web},
    };

    use super::*;
    use crate::test_api::TestApi;
    use crate::view::{Admission, Marks, View, admit};

    /// A plan for `service` and `workloads` over `existing`, and the workloads to read with the
    /// Service to confirm it (`None`: nothing to confirm).
    fn needs(
        service: &Service,
        workloads: &[ExternalWorkload],
        existing: &[EndpointSlice],
    ) -> Option<Vec<String>> {
        let config = Config::default();
        let refs: Vec<&ExternalWorkload> = workloads.iter().collect();
        let slices: Vec<&EndpointSlice> = existing.iter().collect();
        let plan = plan_slices(service, &refs, &slices, &config, &time(1));
        let cached: Vec<CachedWorkload> = workloads.iter().map(CachedWorkload::from).collect();
        let cached: Vec<&CachedWorkload> = cached.iter().collect();
        let held: Vec<CachedSlice> = existing.iter().map(CachedSlice::from).collect();
        let held: Vec<&CachedSlice> = held.iter().collect();
        let view = View {
            unresolved_write: false,
            added: added(&plan, &held, &cached),
            // No watermark: the caches vouch for nothing here.
            marks: Marks::default(),
            service_version: None,
            written: true,
        };
        match admit(&view) {
            Admission::Write => None,
            Admission::ReadBack => panic!("nothing unresolved"),
            Admission::Confirm { workloads, .. } => Some(
                workloads
                    .iter()
                    .map(|workload| workload.name.to_string())
                    .collect(),
            ),
        }
    }

    /// The slices planned for `service` and `workloads` from nothing, named as if created.
    fn published(service: &Service, workloads: &[ExternalWorkload]) -> Vec<EndpointSlice> {
        let refs: Vec<&ExternalWorkload> = workloads.iter().collect();
        let plan = plan_slices(service, &refs, &[], &Config::default(), &time(1));
        plan.creates
            .into_iter()
            .enumerate()
            .map(|(index, mut slice)| {
                slice.metadata.name = Some(format!("web-{index}"));
                slice.metadata.resource_version = Some("5".into());
                slice
            })
            .collect()
    }

    fn versioned(mut service: Service, version: &str) -> Service {
        service.metadata.resource_version = Some(version.into());
        service
    }

    #[test]
    fn only_a_plan_that_adds_a_workload_is_confirmed_with_the_workloads_it_adds() {
        let one = [vm("vm-1", "10.0.0.1").build()];
        let two = [
            vm("vm-1", "10.0.0.1").build(),
            vm("vm-2", "10.0.0.2").build(),
        ];
        let service = versioned(web().build(), "50");
        let held = published(&service, &one);
        // (workloads planned, what is read: None, or the Service and these workloads)
        type Case<'a> = (&'a [ExternalWorkload], Option<Vec<String>>);
        let cases: [Case; 4] = [
            // vm-2 is new to the slices: the Service and vm-2 are read.
            (&two, Some(vec!["vm-2".into()])),
            // Nothing new: the slices are right.
            (&one, None),
            // A removal adds nothing.
            (&[], None),
            // vm-1 changes address: an update of a held endpoint adds nothing.
            (&[vm("vm-1", "10.0.0.9").build()], None),
        ];
        for (index, (workloads, expected)) in cases.into_iter().enumerate() {
            assert_eq!(needs(&service, workloads, &held), expected, "case {index}");
        }
    }

    #[test]
    fn a_workload_recreated_under_its_name_is_an_addition() {
        let service = web().build();
        let held = published(&service, &[vm("vm-1", "10.0.0.1").build()]);
        let recreated = [vm("vm-1", "10.0.0.1").uid("uid-ew-vm-1-again").build()];
        assert_eq!(
            needs(&service, &recreated, &held),
            Some(vec!["vm-1".into()])
        );
    }

    /// The API server's copies of `web` (selecting `app=web`) and of `workloads`.
    async fn stored(
        test: &TestApi,
        workloads: &[ExternalWorkload],
    ) -> (CachedService, Vec<CachedWorkload>) {
        let client = test.server.client("other");
        let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
        let service = services
            .create(&PostParams::default(), &web().build())
            .await
            .unwrap();
        let api: Api<ExternalWorkload> = Api::namespaced(client, NAMESPACE);
        let mut cached = Vec::new();
        for workload in workloads {
            let stored = api.create(&PostParams::default(), workload).await.unwrap();
            cached.push(CachedWorkload::from(&stored));
        }
        (CachedService::from(&service), cached)
    }

    fn workloads_api(test: &TestApi) -> Api<ExternalWorkload> {
        Api::namespaced(test.server.client("other"), NAMESPACE)
    }

    /// Confirms in a namespace holding only `read` (a small one: GETs up to [`GET_AT_MOST`]).
    async fn confirmed(test: &TestApi, service: &CachedService, read: &[&CachedWorkload]) -> bool {
        confirm(&test.writes, service, true, read, read.len())
            .await
            .unwrap()
    }

    #[test]
    fn a_list_replaces_gets_only_above_a_hundredth_of_the_namespace() {
        for (namespace_workloads, list_above) in [
            (0, GET_AT_MOST),
            (5, GET_AT_MOST),
            (399, GET_AT_MOST),
            (400, 4),
            (12_500, 125),
        ] {
            assert_eq!(
                super::list_above(namespace_workloads),
                list_above,
                "a namespace of {namespace_workloads} workloads"
            );
        }
    }

    #[tokio::test]
    async fn an_addition_is_confirmed_only_while_the_api_server_agrees() {
        let test = TestApi::new();
        let (service, workloads) = stored(&test, &[vm("vm-2", "10.0.0.2").build()]).await;
        let vm_2 = &workloads[0];
        assert!(confirmed(&test, &service, &[vm_2]).await, "as cached");

        // Relabelled out of the Service.
        let api = workloads_api(&test);
        let mut relabelled = api.get("vm-2").await.unwrap();
        relabelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("app".into(), "db".into());
        api.replace("vm-2", &PostParams::default(), &relabelled)
            .await
            .unwrap();
        assert!(!confirmed(&test, &service, &[vm_2]).await, "relabelled");

        // Deleted, then created again under its name: another workload (another uid).
        api.delete("vm-2", &DeleteParams::default()).await.unwrap();
        assert!(!confirmed(&test, &service, &[vm_2]).await, "deleted");
        api.create(&PostParams::default(), &vm("vm-2", "10.0.0.2").build())
            .await
            .unwrap();
        assert!(!confirmed(&test, &service, &[vm_2]).await, "recreated");
        let gets: Vec<String> = test
            .calls()
            .into_iter()
            .filter(|call| call.starts_with("GET"))
            .collect();
        assert_eq!(
            gets.len(),
            5,
            "a GET of the workload per confirmation, then one of the Service only when the \
             workloads agree: {gets:?}"
        );
        assert!(
            gets[0].contains("externalworkloads") && gets[1].contains("services"),
            "the Service is read last, nearest the write: {gets:?}"
        );
    }

    #[tokio::test]
    async fn a_service_whose_selector_changed_or_that_was_deleted_confirms_nothing() {
        let test = TestApi::new();
        let (service, _) = stored(&test, &[]).await;
        assert!(confirmed(&test, &service, &[]).await, "as cached");
        let services: Api<Service> = Api::namespaced(test.server.client("other"), NAMESPACE);
        let mut changed = services.get("web").await.unwrap();
        changed
            .spec
            .get_or_insert_default()
            .selector
            .get_or_insert_default()
            .insert("app".into(), "api".into());
        services
            .replace("web", &PostParams::default(), &changed)
            .await
            .unwrap();
        assert!(!confirmed(&test, &service, &[]).await, "selector changed");
        services
            .delete("web", &DeleteParams::default())
            .await
            .unwrap();
        assert!(!confirmed(&test, &service, &[]).await, "deleted");
    }

    /// One workload more than [`GET_AT_MOST`].
    fn more_than_get_at_most() -> Vec<ExternalWorkload> {
        (0..=GET_AT_MOST)
            .map(|index| vm(&format!("vm-{index}"), &format!("10.0.0.{}", index + 1)).build())
            .collect()
    }

    /// How many of `calls` listed workloads, and how many read one.
    fn workload_reads(calls: &[String]) -> (usize, usize) {
        let lists = calls
            .iter()
            .filter(|call| call.ends_with("/externalworkloads"))
            .count();
        let gets = calls
            .iter()
            .filter(|call| call.contains("externalworkloads/"))
            .count();
        (lists, gets)
    }

    #[tokio::test]
    async fn many_added_workloads_are_read_by_one_list() {
        let test = TestApi::new();
        let many = more_than_get_at_most();
        let (service, workloads) = stored(&test, &many).await;
        let read: Vec<&CachedWorkload> = workloads.iter().collect();
        assert!(confirmed(&test, &service, &read).await, "as cached");
        workloads_api(&test)
            .delete("vm-3", &DeleteParams::default())
            .await
            .unwrap();
        assert!(!confirmed(&test, &service, &read).await, "one deleted");
        let calls = test.calls();
        let (lists, gets) = workload_reads(&calls);
        assert_eq!((lists, gets), (2, 0), "{calls:?}");
    }

    #[tokio::test]
    async fn in_a_large_namespace_the_same_additions_are_read_by_gets() {
        let test = TestApi::new();
        let many = more_than_get_at_most();
        let (service, workloads) = stored(&test, &many).await;
        let read: Vec<&CachedWorkload> = workloads.iter().collect();
        // As if the namespace held 1,000 workloads: a LIST would filter all of them.
        let agrees = confirm(&test.writes, &service, true, &read, 1_000)
            .await
            .unwrap();
        assert!(agrees, "as cached");
        let calls = test.calls();
        let (lists, gets) = workload_reads(&calls);
        assert_eq!((lists, gets), (0, read.len()), "{calls:?}");
    }
}
