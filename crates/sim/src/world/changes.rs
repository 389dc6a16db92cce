//! The schedule's changes, made through the world's own client (the objects it starts from,
//! workloads and Services created, edited, deleted), and what the cluster does beside the
//! controller: the garbage collector.

use std::collections::BTreeMap;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use slices::{
    MANAGED_BY_LABEL,
    testing::{Svc, Workload},
};

use super::{Later, World};
use crate::schedule::{APPS, Change, NAMESPACES, SERVICES, WorkloadSpec, ZONES};

// === impl World ===

impl World {
    /// The Services of every namespace and the initial workloads.
    pub(super) async fn populate(&self, initial: &[WorkloadSpec]) {
        for namespace in 0..NAMESPACES.len() {
            for service in 0..SERVICES.len() {
                self.create_service(namespace, service).await;
            }
        }
        for spec in initial {
            self.create_workload(spec).await;
        }
    }

    pub(super) async fn change(&mut self, change: &Change) {
        match change {
            Change::CreateWorkload(spec) => self.create_workload(spec).await,
            Change::DeleteWorkload { namespace, name } => {
                let _ = self
                    .workloads(*namespace)
                    .delete(name, &DeleteParams::default())
                    .await;
            }
            Change::RecreateWorkload { namespace, name } => {
                let api = self.workloads(*namespace);
                let Ok(old) = api.get(name).await else {
                    return;
                };
                let _ = api.delete(name, &DeleteParams::default()).await;
                let mut new = old.clone();
                new.metadata = kube::api::ObjectMeta {
                    name: old.metadata.name.clone(),
                    namespace: old.metadata.namespace.clone(),
                    labels: old.metadata.labels.clone(),
                    ..Default::default()
                };
                let ready = ready_of(&old);
                if let Ok(created) = api.create(&PostParams::default(), &new).await {
                    self.set_ready(*namespace, created, ready).await;
                }
            }
            Change::Relabel {
                namespace,
                name,
                app,
            } => {
                self.edit_workload(*namespace, name, |workload| {
                    workload
                        .metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert("app".to_string(), APPS[*app].to_string());
                })
                .await;
            }
            Change::Readdress {
                namespace,
                name,
                ip,
            } => {
                self.edit_workload(*namespace, name, |workload| {
                    if let Some(first) = workload.spec.workload_ips.first_mut() {
                        first.ip = format!("10.{}.0.{ip}", namespace + 1);
                    }
                })
                .await;
            }
            Change::Readiness {
                namespace,
                name,
                ready,
            } => {
                if let Ok(workload) = self.workloads(*namespace).get(name).await {
                    self.set_ready(*namespace, workload, *ready).await;
                }
            }
            Change::Rezone {
                namespace,
                name,
                zone,
            } => {
                self.edit_workload(*namespace, name, |workload| {
                    workload
                        .metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert(
                            "topology.kubernetes.io/zone".to_string(),
                            ZONES[*zone].to_string(),
                        );
                })
                .await;
            }
            Change::Reselect {
                namespace,
                service,
                app,
            } => {
                self.edit_service(*namespace, *service, |spec| {
                    spec.selector = Some(BTreeMap::from([(
                        "app".to_string(),
                        APPS[*app].to_string(),
                    )]));
                })
                .await;
            }
            Change::Retarget {
                namespace,
                service,
                numeric,
            } => {
                let target = if *numeric {
                    IntOrString::Int(8080)
                } else {
                    IntOrString::String("http".to_string())
                };
                self.edit_service(*namespace, *service, |spec| {
                    if let Some(port) = spec.ports.as_mut().and_then(|ports| ports.first_mut()) {
                        port.target_port = Some(target.clone());
                    }
                })
                .await;
            }
            Change::RecreateService {
                namespace,
                service,
                after,
            } => {
                self.delete_service(*namespace, *service).await;
                self.after(
                    *after,
                    Later::CreateService {
                        namespace: *namespace,
                        service: *service,
                    },
                );
            }
        }
    }

    fn workloads(&self, namespace: usize) -> Api<ExternalWorkload> {
        Api::namespaced(self.driver.clone(), NAMESPACES[namespace])
    }

    fn services(&self, namespace: usize) -> Api<Service> {
        Api::namespaced(self.driver.clone(), NAMESPACES[namespace])
    }

    async fn create_workload(&self, spec: &WorkloadSpec) {
        let namespace = NAMESPACES[spec.namespace];
        let mut builder = Workload::named(&spec.name)
            .namespace(namespace)
            .label("app", APPS[spec.app])
            .zone(ZONES[spec.zone])
            .ip(&format!("10.{}.0.{}", spec.namespace + 1, spec.ip))
            .port("http", 8080);
        if spec.dual_stack {
            builder = builder.ip(&format!("fd00:{}::{:x}", spec.namespace + 1, spec.ip));
        }
        let mut workload = builder.build();
        workload.metadata.uid = None;
        workload.status = None;
        let api = self.workloads(spec.namespace);
        if let Ok(created) = api.create(&PostParams::default(), &workload).await {
            self.set_ready(spec.namespace, created, spec.ready).await;
        }
    }

    async fn set_ready(&self, namespace: usize, mut workload: ExternalWorkload, ready: bool) {
        let builder = Workload::named("status");
        let with_status = if ready {
            builder.ready()
        } else {
            builder.not_ready()
        }
        .build();
        workload.status = with_status.status;
        let name = workload.metadata.name.clone().unwrap_or_default();
        let _ = self
            .workloads(namespace)
            .replace_status(&name, &PostParams::default(), &workload)
            .await;
    }

    async fn edit_workload(
        &self,
        namespace: usize,
        name: &str,
        edit: impl FnOnce(&mut ExternalWorkload),
    ) {
        let api = self.workloads(namespace);
        let Ok(mut workload) = api.get(name).await else {
            return;
        };
        edit(&mut workload);
        let _ = api.replace(name, &PostParams::default(), &workload).await;
    }

    pub(super) async fn create_service(&self, namespace: usize, service: usize) {
        let name = SERVICES[service];
        let mut builder = Svc::named(name)
            .namespace(NAMESPACES[namespace])
            .selector("app", APPS[service])
            .port("http", 80, "http");
        if name == "db" {
            builder = builder.families(&["IPv4", "IPv6"]);
        }
        let mut object = builder.build();
        object.metadata.uid = None;
        if let Some(spec) = object.spec.as_mut() {
            spec.cluster_ip = None;
        }
        let _ = self
            .services(namespace)
            .create(&PostParams::default(), &object)
            .await;
    }

    async fn edit_service(
        &self,
        namespace: usize,
        service: usize,
        edit: impl FnOnce(&mut k8s_openapi::api::core::v1::ServiceSpec),
    ) {
        let api = self.services(namespace);
        let name = SERVICES[service];
        let Ok(mut object) = api.get(name).await else {
            return;
        };
        if let Some(spec) = object.spec.as_mut() {
            edit(spec);
        }
        let _ = api.replace(name, &PostParams::default(), &object).await;
    }

    /// The garbage collector: deletes managed slices whose owner Service no longer exists (a
    /// write planned before the Service's deletion can land after it, and the real collector
    /// removes such a slice too, by its owner reference).
    pub(super) async fn collect_garbage(&self) {
        let services: Vec<String> = self
            .server
            .objects::<Service>()
            .into_iter()
            .filter_map(|service| service.metadata.uid)
            .collect();
        for slice in self.managed_slices() {
            let orphan = slice
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|owners| {
                    owners
                        .iter()
                        .any(|owner| owner.kind == "Service" && !services.contains(&owner.uid))
                });
            if orphan {
                let namespace = slice.metadata.namespace.clone().unwrap_or_default();
                let name = slice.metadata.name.clone().unwrap_or_default();
                let slices: Api<EndpointSlice> = Api::namespaced(self.driver.clone(), &namespace);
                let _ = slices.delete(&name, &DeleteParams::default()).await;
            }
        }
    }

    /// Deletes a Service and, as the garbage collector would, the slices it owns.
    async fn delete_service(&self, namespace: usize, service: usize) {
        let api = self.services(namespace);
        let name = SERVICES[service];
        let Ok(object) = api.get(name).await else {
            return;
        };
        let _ = api.delete(name, &DeleteParams::default()).await;
        let uid = object.metadata.uid.unwrap_or_default();
        let slices: Api<EndpointSlice> =
            Api::namespaced(self.driver.clone(), NAMESPACES[namespace]);
        for slice in self.managed_slices() {
            let owned = slice
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|owners| owners.iter().any(|owner| owner.uid == uid));
            if owned {
                let name = slice.metadata.name.unwrap_or_default();
                let _ = slices.delete(&name, &DeleteParams::default()).await;
            }
        }
    }

    pub(super) fn managed_slices(&self) -> Vec<EndpointSlice> {
        self.server
            .objects::<EndpointSlice>()
            .into_iter()
            .filter(|slice| {
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|labels| labels.contains_key(MANAGED_BY_LABEL))
            })
            .collect()
    }
}

fn ready_of(workload: &ExternalWorkload) -> bool {
    workload.status.as_ref().is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
    })
}
