//! The checked-in CRD matches the types, and decoding survives objects a looser CRD let in.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on broken fixtures

use api::v1beta1::ExternalWorkload;

#[test]
fn checked_in_crd_is_not_stale() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(api::crd::CRD_PATH);
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = api::crd_yaml().expect("CRD generates");
    assert!(
        checked_in == generated,
        "{} is stale or missing; regenerate it with `{}`",
        api::crd::CRD_PATH,
        api::crd::REGENERATE_COMMAND
    );
}

#[test]
fn crd_serves_both_versions_and_stores_v1beta1() {
    let crd = api::crd().expect("CRD generates");
    let versions: Vec<_> = crd
        .spec
        .versions
        .iter()
        .map(|v| {
            (
                v.name.as_str(),
                v.served,
                v.storage,
                v.subresources.is_some(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        [
            ("v1beta1", true, true, true),
            ("v1alpha1", true, false, true)
        ]
    );
    assert_eq!(crd.spec.names.plural, "externalworkloads");
    assert_eq!(crd.spec.scope, "Namespaced");
}

#[test]
fn decodes_a_linkerd_v1beta1_object() {
    let ew: ExternalWorkload = serde_json::from_value(serde_json::json!({
        "apiVersion": "workload.linkerd.io/v1beta1",
        "kind": "ExternalWorkload",
        "metadata": {"name": "vm-1", "namespace": "ns", "labels": {"app": "web", "topology.kubernetes.io/zone": "z1"}},
        "spec": {
            "meshTLS": {"identity": "vm-1.ns.serviceaccount.identity.linkerd.cluster.local", "serverName": "vm-1.ns.cluster.local"},
            "ports": [{"port": 8080, "name": "http"}, {"port": 53, "protocol": "UDP"}],
            "workloadIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
    }))
    .expect("decodes");
    assert!(ew.is_ready());
    assert_eq!(ew.zone(), Some("z1"));
    assert_eq!(ew.spec.ports[1].protocol.as_deref(), Some("UDP"));
    assert_eq!(ew.spec.workload_ips[1].ip, "fd00::1");
    assert_eq!(ew.spec.mesh_tls.server_name, "vm-1.ns.cluster.local");
}

#[test]
fn decoding_never_fails_on_values_a_looser_crd_let_in() {
    let ew: ExternalWorkload = serde_json::from_value(serde_json::json!({
        "apiVersion": "workload.linkerd.io/v1beta1",
        "kind": "ExternalWorkload",
        "metadata": {"name": "weird", "namespace": "ns"},
        "spec": {
            "meshTls": {"identity": "spelled the v1alpha1 way"},
            "ports": [{"port": "8080"}, {"port": 99999999999i64}, {"port": true}, "not-an-object", {"port": 80, "protocol": 6, "name": ["x"]}],
            "workloadIPs": [{"ip": "not-an-ip"}, {"ip": 42}, null, {"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]
        },
        "status": {"conditions": [{"type": "Ready", "status": true, "lastTransitionTime": "yesterday"}, 7]}
    }))
    .expect("decodes despite bad values");
    let ports: Vec<_> = ew.spec.ports.iter().map(|p| p.port).collect();
    assert_eq!(ports, [8080, 0, 0, 80]);
    assert_eq!(ew.spec.ports[3].protocol.as_deref(), Some("6"));
    assert_eq!(ew.spec.ports[3].name, None);
    let ips: Vec<_> = ew.spec.workload_ips.iter().map(|w| w.ip.as_str()).collect();
    assert_eq!(ips, ["not-an-ip", "", "10.0.0.1", "10.0.0.2"]);
    assert_eq!(ew.spec.mesh_tls.identity, "");
    assert!(
        !ew.is_ready(),
        "status `true` (a boolean) is not the string True"
    );
}

#[test]
fn decoding_survives_a_missing_or_mistyped_spec_sections() {
    let ew: ExternalWorkload = serde_json::from_value(serde_json::json!({
        "apiVersion": "workload.linkerd.io/v1beta1",
        "kind": "ExternalWorkload",
        "metadata": {"name": "bare", "namespace": "ns"},
        "spec": {"ports": {"port": 80}, "workloadIPs": "10.0.0.1", "meshTLS": "x"},
        "status": {"conditions": "Ready"}
    }))
    .expect("decodes");
    assert!(ew.spec.ports.is_empty());
    assert!(ew.spec.workload_ips.is_empty());
    assert!(!ew.is_ready());
}

#[test]
fn v1alpha1_spells_mesh_tls_differently() {
    let alpha: api::v1alpha1::ExternalWorkload = serde_json::from_value(serde_json::json!({
        "apiVersion": "workload.linkerd.io/v1alpha1",
        "kind": "ExternalWorkload",
        "metadata": {"name": "vm-1", "namespace": "ns"},
        "spec": {"meshTls": {"identity": "id", "serverName": "sn"}, "workloadIPs": [{"ip": "10.0.0.1"}]}
    }))
    .expect("decodes");
    let beta: api::v1beta1::ExternalWorkloadSpec = alpha.spec.into();
    assert_eq!(beta.mesh_tls.identity, "id");
    let json = serde_json::to_value(&beta).expect("encodes");
    assert_eq!(json["meshTLS"]["serverName"], "sn");
}
