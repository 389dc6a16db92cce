//! The reads of the write path ([`KubeReadWrite::list_slices`], [`KubeReadWrite::read`]) and
//! the retry of a throttled call ([`KubeReadWrite::limited`]), over the in-memory API server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use slices::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, ServiceKey};
use tokio::time::Instant;

use super::tests::NAMESPACE;
use crate::{limit::DEFAULT_RETRY_AFTER, test_api::TestApi};

const OURS: &str = "external-endpoints";

/// A slice named `name` of Service `service`, managed by `managed_by`.
fn slice(name: &str, service: &str, managed_by: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(
                [
                    (SERVICE_NAME_LABEL.to_owned(), service.to_owned()),
                    (MANAGED_BY_LABEL.to_owned(), managed_by.to_owned()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        ..EndpointSlice::default()
    }
}

fn web() -> ServiceKey {
    ServiceKey {
        namespace: NAMESPACE.into(),
        name: "web".into(),
    }
}

/// The path of the consistent LIST of a Service's slices, as [`TestApi::calls`] names it.
fn list_call() -> String {
    format!("GET /apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices")
}

#[tokio::test]
async fn the_read_back_lists_the_services_slices_that_we_manage_and_the_version_read_at() {
    let api = TestApi::new();
    let ours = api.store(&slice("web-a", "web", OURS)).await;
    api.store(&slice("web-theirs", "web", "someone-else")).await;
    api.store(&slice("api-a", "api", OURS)).await;

    let (listed, version) = api.writes.list_slices(&web(), OURS).await.unwrap();

    let names: Vec<_> = listed.iter().map(|s| s.metadata.name.as_deref()).collect();
    assert_eq!(names, [ours.metadata.name.as_deref()], "{listed:?}");
    let stored_at: u64 = ours.metadata.resource_version.unwrap().parse().unwrap();
    assert!(
        version > stored_at,
        "the list is read at the server's version, past the slices' own ({version} ≤ {stored_at})"
    );
}

#[tokio::test]
async fn a_read_of_an_object_that_does_not_exist_is_none() {
    let api = TestApi::new();
    let read: Option<Service> = api.writes.read(NAMESPACE, "web").await.unwrap();
    assert!(read.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_throttled_read_is_read_again_after_the_retry_after() {
    let api = TestApi::new()
        .with_call_timeout(Duration::from_secs(10))
        .failing(&[(&list_call(), 429)]);
    api.store(&slice("web-a", "web", OURS)).await;
    let key = web();
    let started = Instant::now();
    let (listed, ()) = tokio::join!(api.writes.list_slices(&key, OURS), async {
        tokio::time::sleep(DEFAULT_RETRY_AFTER * 3 / 2).await;
        api.heal(&list_call());
    });
    assert_eq!(listed.unwrap().0.len(), 1, "read again, and answered");
    assert_eq!(api.calls(), vec![list_call(); 3]);
    assert_eq!(started.elapsed(), DEFAULT_RETRY_AFTER * 2);
}

#[tokio::test(start_paused = true)]
async fn a_read_throttled_until_the_call_timeout_gives_up_with_the_429() {
    let timeout = DEFAULT_RETRY_AFTER * 3;
    let api = TestApi::new()
        .with_call_timeout(timeout)
        .failing(&[(&list_call(), 429)]);
    let started = Instant::now();
    let error = api.writes.list_slices(&web(), OURS).await.unwrap_err();
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 429),
        "{error:?}"
    );
    // Tries at 0, 1 and 2 s; the one answered at 3 s, the call timeout, is the last.
    assert_eq!(api.calls(), vec![list_call(); 4]);
    assert_eq!(started.elapsed(), timeout);
}
