//! The reads of the write path: the read-back of a Service's slices after a write of unknown
//! outcome, and the reads that confirm a plan's additions (`confirm`). Each is bounded and takes
//! a slot of the calls in flight, as a write does, and is read again after a 429.

use api::v1beta1::ExternalWorkload;
use k8s_openapi::{NamespaceResourceScope, api::discovery::v1::EndpointSlice};
use kube::{Api, Resource, api::ListParams};
use serde::de::DeserializeOwned;
use slices::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, ServiceKey};

use super::KubeReadWrite;
use crate::watch::health::version_number;

// === impl KubeReadWrite ===

impl KubeReadWrite {
    /// The object `name` of kind `K` (a Service or a workload) as the API server has it now (a
    /// GET without a resourceVersion: read from etcd, not the API server's cache); `None` if it
    /// does not exist.
    pub async fn read<K>(&self, namespace: &str, name: &str) -> Result<Option<K>, kube::Error>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        self.limited(|| api.get_opt(name)).await
    }

    /// The slices of Service `key` managed by `managed_by`, by a consistent LIST (no
    /// resourceVersion: served once the API server's cache has caught up with etcd), and the
    /// version the list was read at (0 when it is not a number).
    pub async fn list_slices(
        &self,
        key: &ServiceKey,
        managed_by: &str,
    ) -> Result<(Vec<EndpointSlice>, u64), kube::Error> {
        let labels = format!(
            "{SERVICE_NAME_LABEL}={},{MANAGED_BY_LABEL}={managed_by}",
            key.name
        );
        let api = self.api(&key.namespace);
        let params = ListParams::default().labels(&labels);
        let list = self.limited(|| api.list(&params)).await?;
        let version = list
            .metadata
            .resource_version
            .as_deref()
            .map_or(0, version_number);
        Ok((list.items, version))
    }

    /// The workloads of `namespace` matching `labels`, by a consistent LIST (no
    /// resourceVersion: the API server answers once its cache has caught up with etcd).
    pub async fn list_workloads(
        &self,
        namespace: &str,
        labels: &str,
    ) -> Result<Vec<ExternalWorkload>, kube::Error> {
        let api: Api<ExternalWorkload> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().labels(labels);
        let list = self.limited(|| api.list(&params)).await?;
        Ok(list.items)
    }
}
