//! The resources served, and how a request's path names one.

use serde_json::Value;

use crate::convert;

/// One served resource (a group, version and plural), and how it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for the core group).
    pub group: &'static str,
    /// The version the request named.
    pub version: &'static str,
    /// Plural name in paths.
    pub plural: &'static str,
    /// Kind of the objects.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether `/status` is a subresource (writes to the main resource then keep the status).
    pub status: bool,
    /// Whether an update bumps `metadata.generation` when anything but metadata (labels
    /// included) changed, as EndpointSlices and custom resources do.
    pub generation: bool,
}

/// Everything served. ExternalWorkloads are served in both versions and stored in one form
/// (v1beta1); Events in two groups, stored in the core form (see `convert.rs`).
pub const RESOURCES: [Resource; 8] = [
    Resource {
        group: "",
        version: "v1",
        plural: "services",
        kind: "Service",
        namespaced: true,
        status: true,
        generation: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        status: true,
        generation: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status: false,
        generation: false,
    },
    Resource {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        kind: "EndpointSlice",
        namespaced: true,
        status: false,
        generation: true,
    },
    Resource {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        status: false,
        generation: false,
    },
    Resource {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status: false,
        generation: false,
    },
    Resource {
        group: "workload.linkerd.io",
        version: "v1beta1",
        plural: "externalworkloads",
        kind: "ExternalWorkload",
        namespaced: true,
        status: true,
        generation: true,
    },
    Resource {
        group: "workload.linkerd.io",
        version: "v1alpha1",
        plural: "externalworkloads",
        kind: "ExternalWorkload",
        namespaced: true,
        status: true,
        generation: true,
    },
];

/// What a request path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The resource.
    pub resource: Resource,
    /// The namespace, for a namespaced path.
    pub namespace: Option<String>,
    /// The object's name, for an object path.
    pub name: Option<String>,
    /// `/status`.
    pub status: bool,
}

// === impl Resource ===

impl Resource {
    /// `apiVersion` of objects served in this version.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Its name with its group, as `kubectl` spells it (`"endpointslices.discovery.k8s.io"`,
    /// `"services"`).
    pub fn qualified(&self) -> String {
        qualified_of(self.group, self.plural)
    }

    /// The key objects of this resource are stored under (all versions share it; both Event
    /// groups share the core one).
    pub fn storage(&self) -> (&'static str, &'static str) {
        if self.plural == "events" {
            ("", "events")
        } else {
            (self.group, self.plural)
        }
    }

    /// Whether it is a custom resource (served by the CRD's handler: list items keep their
    /// `apiVersion` and `kind`, strategic merge patches are refused).
    pub fn custom(&self) -> bool {
        self.group == "workload.linkerd.io"
    }

    /// The stored form of `object` sent in this version.
    pub fn stored(self, object: Value) -> Value {
        convert::to_storage(self, object)
    }

    /// A stored object as served in this version.
    pub fn served(self, object: Value) -> Value {
        convert::to_served(self, object)
    }
}

/// `plural.group`, or `plural` for the core group.
pub fn qualified_of(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// The storage of the resource named `name` (`"leases.coordination.k8s.io"`), if served.
pub fn storage_named(name: &str) -> Option<(&'static str, &'static str)> {
    RESOURCES
        .iter()
        .find(|resource| resource.qualified() == name)
        .map(Resource::storage)
}

// === impl Target ===

impl Target {
    /// Parses a request path (`/api/v1/...` or `/apis/<group>/<version>/...`); `None` when no
    /// served resource matches.
    pub fn parse(path: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match parts.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                (Some(namespace.to_string()), rest)
            }
            _ => (None, rest),
        };
        let (plural, name, status) = match rest {
            [plural] => (*plural, None, false),
            [plural, name] => (*plural, Some(name.to_string()), false),
            [plural, name, "status"] => (*plural, Some(name.to_string()), true),
            _ => return None,
        };
        // `/api/v1/namespaces/<name>` names a Namespace object.
        let (plural, name, namespace) = match (plural, &namespace) {
            ("namespaces", None) => (plural, name, None),
            _ => (plural, name, namespace),
        };
        let resource = RESOURCES
            .into_iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)?;
        if (namespace.is_some() && !resource.namespaced) || (status && !resource.status) {
            return None;
        }
        Some(Self {
            resource,
            namespace,
            name,
            status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_resources_namespaces_objects_and_status() {
        let slice = Target::parse("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices/s1")
            .unwrap_or_else(|| panic!("parsed"));
        assert_eq!(slice.resource.plural, "endpointslices");
        assert_eq!(slice.namespace.as_deref(), Some("ns"));
        assert_eq!(slice.name.as_deref(), Some("s1"));
        let all = Target::parse("/api/v1/services").unwrap_or_else(|| panic!("parsed"));
        assert_eq!((all.namespace, all.name), (None, None));
        let status = Target::parse(
            "/apis/workload.linkerd.io/v1alpha1/namespaces/n/externalworkloads/w/status",
        )
        .unwrap_or_else(|| panic!("parsed"));
        assert!(status.status);
        assert_eq!(status.resource.version, "v1alpha1");
        let namespace =
            Target::parse("/api/v1/namespaces/demo").unwrap_or_else(|| panic!("parsed"));
        assert_eq!(namespace.resource.plural, "namespaces");
        assert_eq!(namespace.name.as_deref(), Some("demo"));
        assert!(Target::parse("/api/v1/pods").is_none(), "not served");
        assert!(Target::parse("/apis/apps/v1/deployments").is_none());
    }

    #[test]
    fn v1alpha1_converts_with_no_webhook_and_each_schema_prunes_the_other_spelling() {
        let (beta, alpha) = (RESOURCES[6], RESOURCES[7]);
        let sent = serde_json::json!({"apiVersion": "workload.linkerd.io/v1alpha1", "spec": {"meshTls": {"identity": "i"}, "workloadIPs": []}});
        let stored = alpha.stored(sent);
        assert_eq!(stored["apiVersion"], "workload.linkerd.io/v1beta1");
        assert!(stored["spec"].get("meshTls").is_none(), "pruned: {stored}");
        assert!(
            stored["spec"].get("meshTLS").is_none(),
            "not renamed: {stored}"
        );
        let from_beta = beta.stored(serde_json::json!({"spec": {"meshTLS": {"identity": "i"}}}));
        let served = alpha.served(from_beta);
        assert!(served["spec"].get("meshTLS").is_none(), "pruned: {served}");
        assert_eq!(served["apiVersion"], "workload.linkerd.io/v1alpha1");
    }

    #[test]
    fn both_event_groups_share_one_storage_in_the_core_form() {
        let (core, events) = (RESOURCES[2], RESOURCES[5]);
        assert_eq!(core.storage(), events.storage());
        let stored = events.stored(serde_json::json!({"regarding": {"name": "web"}, "note": "n", "reportingController": "c", "reportingInstance": "i"}));
        assert_eq!(stored["involvedObject"]["name"], "web");
        assert_eq!(stored["message"], "n");
        assert_eq!(stored["reportingComponent"], "c");
        let as_core = core.served(stored.clone());
        assert_eq!(as_core["source"], serde_json::json!({}));
        assert_eq!(as_core["firstTimestamp"], Value::Null);
        let as_events = events.served(stored);
        assert_eq!(as_events["regarding"]["name"], "web");
        assert_eq!(as_events["deprecatedSource"], serde_json::json!({}));
        assert_eq!(as_events["apiVersion"], "events.k8s.io/v1");
    }
}
