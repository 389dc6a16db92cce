//! The resources served, and how a request's path names one.

use serde_json::Value;

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
/// (v1beta1); the two differ only in the spelling of `spec.meshTLS`.
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

    /// The key objects of this resource are stored under (all versions share it).
    pub fn storage(&self) -> (&'static str, &'static str) {
        (self.group, self.plural)
    }

    /// The stored form of `object` sent in this version.
    pub fn stored(self, mut object: Value) -> Value {
        if self.version == "v1alpha1" {
            rename(&mut object, "meshTls", "meshTLS");
            object["apiVersion"] = Value::from("workload.linkerd.io/v1beta1");
        }
        object
    }

    /// A stored object as served in this version.
    pub fn served(self, mut object: Value) -> Value {
        if self.version == "v1alpha1" {
            rename(&mut object, "meshTLS", "meshTls");
        }
        object["apiVersion"] = Value::from(self.api_version());
        object["kind"] = Value::from(self.kind);
        object
    }
}

fn rename(object: &mut Value, from: &str, to: &str) {
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut)
        && let Some(value) = spec.remove(from)
    {
        spec.insert(to.to_string(), value);
    }
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
        if namespace.is_some() && !resource.namespaced {
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
    fn v1alpha1_is_stored_as_v1beta1_and_served_back_as_sent() {
        let alpha = RESOURCES[7];
        let sent = serde_json::json!({"apiVersion": "workload.linkerd.io/v1alpha1", "spec": {"meshTls": {"identity": "i"}}});
        let stored = alpha.stored(sent);
        assert_eq!(stored["spec"]["meshTLS"]["identity"], "i");
        assert_eq!(stored["apiVersion"], "workload.linkerd.io/v1beta1");
        let served = alpha.served(stored);
        assert_eq!(served["spec"]["meshTls"]["identity"], "i");
        assert_eq!(served["apiVersion"], "workload.linkerd.io/v1alpha1");
    }
}
