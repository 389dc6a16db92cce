//! The objects of one test namespace through the real API: create and change Services and
//! workloads from fixtures, read the managed slices, wait for them to converge.

use std::collections::BTreeMap;

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use slices::{Config, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, plan_slices};

use crate::{
    poll::{CONVERGE, eventually},
    replica::LEASE,
};

/// The objects of one test namespace, through the real API.
#[derive(Clone)]
pub struct Cluster {
    /// Admin client.
    pub client: Client,
    /// The test's namespace.
    pub namespace: String,
}

// === impl Cluster ===

impl Cluster {
    /// A fresh namespace on the shared testbed.
    pub async fn new(testbed: &testbed::Testbed, test: &str) -> Cluster {
        let client = testbed.client().await.unwrap();
        let namespace = testbed.fresh_namespace(test).await.unwrap();
        Cluster { client, namespace }
    }

    /// Services of the namespace.
    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// ExternalWorkloads of the namespace.
    pub fn workloads(&self) -> Api<ExternalWorkload> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// EndpointSlices of the namespace.
    pub fn slices_api(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Leases of the namespace.
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a Service from a fixture (server-assigned uid and cluster IP).
    pub async fn create_service(&self, service: impl Into<Service>) -> Service {
        let mut service = service.into();
        service.metadata.namespace = Some(self.namespace.clone());
        service.metadata.uid = None;
        if let Some(spec) = service.spec.as_mut()
            && spec.cluster_ip.as_deref() != Some("None")
        {
            spec.cluster_ip = None;
        }
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .unwrap()
    }

    /// Replaces a Service's spec and labels with the fixture's.
    pub async fn update_service(&self, service: impl Into<Service>) -> Service {
        self.try_update_service(service).await.unwrap()
    }

    /// [`Cluster::update_service`], failing instead of panicking.
    pub async fn try_update_service(
        &self,
        service: impl Into<Service>,
    ) -> Result<Service, kube::Error> {
        let wanted = service.into();
        let name = wanted.name_any();
        let mut current = self.services().get(&name).await?;
        current.metadata.labels = wanted.metadata.labels;
        let cluster_ip = current.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        let cluster_ips = current.spec.as_ref().and_then(|s| s.cluster_ips.clone());
        let mut spec = wanted.spec.unwrap_or_default();
        spec.cluster_ip = cluster_ip;
        spec.cluster_ips = cluster_ips;
        current.spec = Some(spec);
        self.services()
            .replace(&name, &PostParams::default(), &current)
            .await
    }

    /// Creates or replaces a workload from a fixture, status included.
    pub async fn apply_workload(&self, workload: impl Into<ExternalWorkload>) -> ExternalWorkload {
        self.try_apply_workload(workload).await.unwrap()
    }

    /// [`Cluster::apply_workload`], failing instead of panicking (safe to retry).
    pub async fn try_apply_workload(
        &self,
        workload: impl Into<ExternalWorkload>,
    ) -> Result<ExternalWorkload, kube::Error> {
        let mut workload = workload.into();
        workload.metadata.namespace = Some(self.namespace.clone());
        workload.metadata.uid = None;
        let status = workload.status.clone();
        let name = workload.name_any();
        let api = self.workloads();
        let mut stored = match api.get_opt(&name).await? {
            Some(current) => {
                workload.metadata.resource_version = current.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &workload)
                    .await?
            }
            None => api.create(&PostParams::default(), &workload).await?,
        };
        if status.is_some() {
            stored.status = status;
            stored = api
                .replace_status(&name, &PostParams::default(), &stored)
                .await?;
        }
        Ok(stored)
    }

    /// Deletes a workload.
    pub async fn delete_workload(&self, name: &str) {
        self.try_delete_workload(name).await.unwrap()
    }

    /// Deletes a workload; one already gone counts as deleted (a retry after a lost answer).
    pub async fn try_delete_workload(&self, name: &str) -> Result<(), kube::Error> {
        match self
            .workloads()
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// The managed slices of the namespace (our managed-by label), sorted by name.
    pub async fn slices(&self) -> Vec<EndpointSlice> {
        let params = ListParams::default().labels(&format!(
            "{MANAGED_BY_LABEL}={}",
            Config::default().managed_by()
        ));
        let mut slices = self.slices_api().list(&params).await.unwrap().items;
        slices.sort_by_key(|s| s.name_any());
        slices
    }

    /// The managed slices of one Service.
    pub async fn slices_of(&self, service: &str) -> Vec<EndpointSlice> {
        self.slices()
            .await
            .into_iter()
            .filter(|s| s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(service))
            .collect()
    }

    /// Endpoints of a Service's slices: workload name → (addresses, ready).
    pub async fn endpoints_of(&self, service: &str) -> BTreeMap<String, (Vec<String>, bool)> {
        let mut endpoints = BTreeMap::new();
        for slice in self.slices_of(service).await {
            for endpoint in slice.endpoints.unwrap_or_default() {
                let name = endpoint.target_ref.and_then(|r| r.name).unwrap_or_default();
                let ready = endpoint.conditions.and_then(|c| c.ready).unwrap_or(false);
                endpoints.insert(name, (endpoint.addresses, ready));
            }
        }
        endpoints
    }

    /// `Ok` when every Service's slices are exactly what the planner computes from the objects
    /// now in the API (planning over them yields no write).
    pub async fn converged(&self) -> Result<(), String> {
        let services = self
            .services()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let workloads = self
            .workloads()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let slices = self.slices().await;
        let config = Config::default();
        let now = Time(Timestamp::now());
        let workload_refs: Vec<&ExternalWorkload> = workloads.iter().collect();
        for service in &services {
            let name = service.name_any();
            let existing: Vec<&EndpointSlice> = slices
                .iter()
                .filter(|s| s.labels().get(SERVICE_NAME_LABEL) == Some(&name))
                .collect();
            let plan = plan_slices(service, &workload_refs, &existing, &config, &now);
            if !plan.is_empty() {
                return Err(format!(
                    "service {name}: {} creates, {} updates, {} deletes still needed",
                    plan.creates.len(),
                    plan.updates.len(),
                    plan.deletes.len()
                ));
            }
        }
        Ok(())
    }

    /// Waits until [`Cluster::converged`].
    pub async fn wait_converged(&self) {
        eventually("slices to converge", CONVERGE, || self.converged()).await
    }

    /// The Lease of the e2e replicas.
    pub async fn lease(&self) -> Option<Lease> {
        self.leases().get_opt(LEASE).await.unwrap()
    }

    /// Holder of the e2e Lease (None when released).
    pub async fn lease_holder(&self) -> Option<String> {
        self.lease()
            .await
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
    }
}
