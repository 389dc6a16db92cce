//! Fixture builders that read like prose, for this crate's tests and other crates' tests
//! (feature `testing`):
//!
//! ```
//! use slices::testing::{Svc, Workload};
//! let web = Svc::named("web").selector("app", "web").port("http", 80, "http").build();
//! let vm = Workload::named("vm-1").label("app", "web").ip("10.0.0.1").port("http", 8080).ready().build();
//! ```
//!
//! [`web`] and [`vm`] are that Service and such a workload, the fixtures most tests start from.
//!
//! [`SliceStore`] plays the API server for plans: it names created slices and bumps
//! resourceVersion and generation the way the server does.
//!
//! [`WorkloadShape`] and [`ServiceShape`] are a workload and a Service's options as property
//! tests generate them, field by field.

use std::collections::BTreeMap;

use api::v1beta1::{
    Condition, ExternalWorkload, ExternalWorkloadSpec, ExternalWorkloadStatus, MeshTls, PortSpec,
    WorkloadIp,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use crate::{Config, SlicePlan, Write};

/// Namespace the builders use unless told otherwise.
pub const NAMESPACE: &str = "default";

/// A point in time, `seconds` after the Unix epoch.
pub fn time(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The Service most tests use: `web`, selecting `app=web`, port `http` 80 → the workloads' port
/// named `http`.
pub fn web() -> Svc {
    Svc::named("web")
        .selector("app", "web")
        .port("http", 80, "http")
}

/// A ready workload that [`web`] selects: label `app=web`, address `ip`, port `http` 8080.
pub fn vm(name: &str, ip: &str) -> Workload {
    Workload::named(name)
        .label("app", "web")
        .ip(ip)
        .port("http", 8080)
        .ready()
}

/// Builds a Service.
#[derive(Clone, Debug)]
#[must_use]
pub struct Svc(Service);

/// Builds an ExternalWorkload.
#[derive(Clone, Debug)]
#[must_use]
pub struct Workload(ExternalWorkload);

/// A Service targetPort: a number or a name.
#[derive(Clone, Debug)]
pub struct Target(IntOrString);

/// Plays the API server for slices: applies plans, naming, versioning and generating as it does.
#[derive(Clone, Debug, Default)]
pub struct SliceStore {
    slices: BTreeMap<String, EndpointSlice>,
    counter: u64,
}

// === impl Target ===

impl From<i32> for Target {
    fn from(number: i32) -> Self {
        Target(IntOrString::Int(number))
    }
}

impl From<&str> for Target {
    fn from(name: &str) -> Self {
        Target(IntOrString::String(name.to_owned()))
    }
}

// === impl Svc ===

impl Svc {
    /// A ClusterIP Service in [`NAMESPACE`] with uid `uid-svc-<name>`, no selector, no ports.
    pub fn named(name: &str) -> Self {
        Svc(Service {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                uid: Some(format!("uid-svc-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".to_owned()),
                cluster_ip: Some("10.96.0.10".to_owned()),
                ..ServiceSpec::default()
            }),
            status: None,
        })
    }

    fn spec(&mut self) -> &mut ServiceSpec {
        self.0.spec.get_or_insert_with(ServiceSpec::default)
    }

    /// In this namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// With this uid (a Service re-created under the same name has another).
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_owned());
        self
    }

    /// Selecting workloads with this label (adds to the selector).
    pub fn selector(mut self, key: &str, value: &str) -> Self {
        self.spec()
            .selector
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Without any selector.
    pub fn no_selector(mut self) -> Self {
        self.spec().selector = None;
        self
    }

    /// With this label on the Service itself.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// A TCP port `name` (empty for unnamed) on `port`, targeting `target`.
    pub fn port(mut self, name: &str, port: i32, target: impl Into<Target>) -> Self {
        let port = ServicePort {
            name: (!name.is_empty()).then(|| name.to_owned()),
            port,
            protocol: Some("TCP".to_owned()),
            target_port: Some(target.into().0),
            ..ServicePort::default()
        };
        self.spec().ports.get_or_insert_with(Vec::new).push(port);
        self
    }

    /// The last added port uses this protocol.
    pub fn protocol(mut self, protocol: &str) -> Self {
        if let Some(last) = self.spec().ports.as_mut().and_then(|p| p.last_mut()) {
            last.protocol = Some(protocol.to_owned());
        }
        self
    }

    /// Headless: clusterIP `None`.
    pub fn headless(mut self) -> Self {
        self.spec().cluster_ip = Some("None".to_owned());
        self
    }

    /// Type ExternalName.
    pub fn external_name(mut self) -> Self {
        let spec = self.spec();
        spec.type_ = Some("ExternalName".to_owned());
        spec.external_name = Some("example.com".to_owned());
        spec.cluster_ip = None;
        self
    }

    /// With these `ipFamilies` (`IPv4`, `IPv6`).
    pub fn families(mut self, families: &[&str]) -> Self {
        self.spec().ip_families = Some(families.iter().map(|f| (*f).to_owned()).collect());
        self
    }

    /// With `publishNotReadyAddresses: true`.
    pub fn publish_not_ready(mut self) -> Self {
        self.spec().publish_not_ready_addresses = Some(true);
        self
    }

    /// Being deleted (deletionTimestamp set).
    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(time(1));
        self
    }

    /// With `trafficDistribution` set to `value` (`PreferSameZone`, `PreferClose`,
    /// `PreferSameNode`).
    pub fn traffic_distribution(mut self, value: &str) -> Self {
        self.spec().traffic_distribution = Some(value.to_owned());
        self
    }

    /// With this annotation on the Service.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// The Service.
    pub fn build(self) -> Service {
        self.0
    }
}

impl From<Svc> for Service {
    fn from(builder: Svc) -> Self {
        builder.0
    }
}

// === impl Workload ===

impl Workload {
    /// A workload in [`NAMESPACE`] with uid `uid-ew-<name>`, no labels, IPs, ports or status.
    pub fn named(name: &str) -> Self {
        Workload(ExternalWorkload {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                uid: Some(format!("uid-ew-{name}")),
                ..ObjectMeta::default()
            },
            spec: ExternalWorkloadSpec {
                mesh_tls: MeshTls {
                    identity: format!(
                        "{name}.{NAMESPACE}.serviceaccount.identity.linkerd.cluster.local"
                    ),
                    server_name: format!("{name}.{NAMESPACE}.cluster.local"),
                },
                ..ExternalWorkloadSpec::default()
            },
            status: None,
        })
    }

    /// In this namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// With this uid.
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_owned());
        self
    }

    /// With this label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// In this zone (`topology.kubernetes.io/zone`).
    pub fn zone(self, zone: &str) -> Self {
        self.label(api::ZONE_LABEL, zone)
    }

    /// With this address (any text: invalid ones are for tests of invalid data).
    pub fn ip(mut self, ip: &str) -> Self {
        self.0
            .spec
            .workload_ips
            .push(WorkloadIp { ip: ip.to_owned() });
        self
    }

    /// With this mesh identity (`spec.meshTLS.identity`).
    pub fn identity(mut self, identity: &str) -> Self {
        self.0.spec.mesh_tls.identity = identity.to_owned();
        self
    }

    /// With this mesh server name (`spec.meshTLS.serverName`).
    pub fn server_name(mut self, server_name: &str) -> Self {
        self.0.spec.mesh_tls.server_name = server_name.to_owned();
        self
    }

    /// With a TCP port; `name` empty for unnamed.
    pub fn port(self, name: &str, port: i32) -> Self {
        self.port_with_protocol(name, port, None)
    }

    /// With a port of this protocol.
    pub fn port_with_protocol(mut self, name: &str, port: i32, protocol: Option<&str>) -> Self {
        self.0.spec.ports.push(PortSpec {
            port,
            name: (!name.is_empty()).then(|| name.to_owned()),
            protocol: protocol.map(str::to_owned),
        });
        self
    }

    fn condition(mut self, status: &str) -> Self {
        let conditions = &mut self
            .0
            .status
            .get_or_insert_with(ExternalWorkloadStatus::default)
            .conditions;
        conditions.retain(|c| c.type_ != api::READY_CONDITION);
        conditions.push(Condition {
            type_: api::READY_CONDITION.to_owned(),
            status: status.to_owned(),
            ..Condition::default()
        });
        self
    }

    /// Ready condition `True`.
    pub fn ready(self) -> Self {
        self.condition("True")
    }

    /// Ready condition `False`.
    pub fn not_ready(self) -> Self {
        self.condition("False")
    }

    /// Being deleted (deletionTimestamp set).
    pub fn terminating(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(time(1));
        self
    }

    /// The workload.
    pub fn build(self) -> ExternalWorkload {
        self.0
    }
}

impl From<Workload> for ExternalWorkload {
    fn from(builder: Workload) -> Self {
        builder.0
    }
}

/// A workload as property tests generate it: its `app` label decides selection, the rest its
/// endpoint. [`WorkloadShape::build`] makes the workload.
#[derive(Clone, Debug)]
pub struct WorkloadShape {
    /// The value of its `app` label.
    pub app: &'static str,
    /// In the namespace `elsewhere` rather than [`NAMESPACE`].
    pub other_namespace: bool,
    /// Its addresses, in order (any text: invalid ones are for tests of invalid data).
    pub ips: Vec<&'static str>,
    /// Its ports: (name, port, protocol).
    pub ports: Vec<(&'static str, i32, Option<&'static str>)>,
    /// Ready condition `True`, else `False`.
    pub ready: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Its zone, if any.
    pub zone: Option<&'static str>,
    /// A mesh identity other than the name-derived default (a rotation).
    pub identity: Option<&'static str>,
}

// === impl WorkloadShape ===

impl WorkloadShape {
    /// The workload `name` of this shape.
    pub fn build(&self, name: &str) -> ExternalWorkload {
        let mut builder = Workload::named(name).label("app", self.app);
        if self.other_namespace {
            builder = builder.namespace("elsewhere");
        }
        for ip in &self.ips {
            builder = builder.ip(ip);
        }
        for (port_name, port, protocol) in &self.ports {
            builder = builder.port_with_protocol(port_name, *port, *protocol);
        }
        builder = if self.ready {
            builder.ready()
        } else {
            builder.not_ready()
        };
        if self.terminating {
            builder = builder.terminating();
        }
        if let Some(zone) = self.zone {
            builder = builder.zone(zone);
        }
        if let Some(identity) = self.identity {
            builder = builder.identity(identity);
        }
        builder.build()
    }
}

/// The options of a Service as property tests generate them; [`ServiceShape::apply`] sets them
/// on a Service's builder (its name, selector and ports are each test's own).
#[derive(Clone, Debug)]
pub struct ServiceShape {
    /// Its `ipFamilies`; none set when empty.
    pub families: Vec<&'static str>,
    /// Headless (`clusterIP: None`).
    pub headless: bool,
    /// `publishNotReadyAddresses: true`.
    pub publish_not_ready: bool,
    /// With the label `team: a` (labels are copied to the slices).
    pub team_label: bool,
    /// Its `trafficDistribution`, if any.
    pub traffic_distribution: Option<&'static str>,
    /// Its `service.kubernetes.io/topology-mode` annotation, if any.
    pub topology_mode: Option<&'static str>,
    /// `"none"`: its selector removed; `"external-name"`: type ExternalName; else as built.
    pub selection: &'static str,
}

// === impl ServiceShape ===

impl ServiceShape {
    /// `service` with these options set.
    pub fn apply(&self, mut service: Svc) -> Svc {
        if !self.families.is_empty() {
            service = service.families(&self.families);
        }
        if self.headless {
            service = service.headless();
        }
        if self.publish_not_ready {
            service = service.publish_not_ready();
        }
        if self.team_label {
            service = service.label("team", "a");
        }
        if let Some(distribution) = self.traffic_distribution {
            service = service.traffic_distribution(distribution);
        }
        if let Some(mode) = self.topology_mode {
            service = service.annotation(crate::TOPOLOGY_MODE_ANNOTATION, mode);
        }
        match self.selection {
            "none" => service.no_selector(),
            "external-name" => service.external_name(),
            _ => service,
        }
    }
}

// === impl SliceStore ===

impl SliceStore {
    /// A store holding these slices as they are.
    pub fn with(slices: impl IntoIterator<Item = EndpointSlice>) -> Self {
        let mut store = Self::default();
        for slice in slices {
            let name = slice.metadata.name.clone().unwrap_or_default();
            store.slices.insert(name, slice);
        }
        store
    }

    /// The slices the planner writes from scratch for `service` and `workloads` under `config`
    /// (at [`time`] 1), less those whose flag in `lost` is set: someone else deleted them.
    /// Slices past the end of `lost` are kept.
    pub fn converged_less_lost(
        service: &Service,
        workloads: &[ExternalWorkload],
        config: &Config,
        lost: &[bool],
    ) -> Vec<EndpointSlice> {
        let workloads: Vec<&ExternalWorkload> = workloads.iter().collect();
        let mut store = Self::default();
        store.apply(&crate::plan_slices(
            service,
            &workloads,
            &[],
            config,
            &time(1),
        ));
        store
            .slices()
            .into_iter()
            .zip(lost.iter().chain(std::iter::repeat(&false)))
            .filter(|(_, lost)| !**lost)
            .map(|(slice, _)| slice.clone())
            .collect()
    }

    /// The slices, by name.
    pub fn slices(&self) -> Vec<&EndpointSlice> {
        self.slices.values().collect()
    }

    /// Applies the plan in write order and returns the server's responses, one per write
    /// (a delete answers with the deleted slice).
    pub fn apply(&mut self, plan: &SlicePlan) -> Vec<EndpointSlice> {
        plan.writes().map(|write| self.write(write)).collect()
    }

    /// Applies one write as the API server would.
    pub fn write(&mut self, write: Write<'_>) -> EndpointSlice {
        self.counter += 1;
        let mut slice = write.slice().clone();
        let version = self.counter.to_string();
        match write {
            Write::Create(_) => {
                let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
                let mut name = format!("{prefix}{:05}", self.counter);
                while self.slices.contains_key(&name) {
                    self.counter += 1;
                    name = format!("{prefix}{:05}", self.counter);
                }
                slice.metadata.name = Some(name.clone());
                slice.metadata.uid = Some(format!("uid-{name}"));
                slice.metadata.generation = Some(1);
                slice.metadata.resource_version = Some(version);
                self.slices.insert(name, slice.clone());
            }
            Write::Update(_) => {
                let name = slice.metadata.name.clone().unwrap_or_default();
                let old = self.slices.get(&name);
                let generation = old.and_then(|o| o.metadata.generation).unwrap_or(1);
                let content_changed =
                    old.is_none_or(|o| o.endpoints != slice.endpoints || o.ports != slice.ports);
                slice.metadata.generation = Some(generation + i64::from(content_changed));
                slice.metadata.resource_version = Some(version);
                self.slices.insert(name, slice.clone());
            }
            Write::Delete(_) => {
                let name = slice.metadata.name.clone().unwrap_or_default();
                self.slices.remove(&name);
            }
        }
        slice
    }
}
