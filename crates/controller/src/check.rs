//! `external-endpoints check`: is this cluster, and this identity, ready for the controller, and
//! is an installed controller healthy?
//!
//! One line per check, pass or fail, and on failure what to do. Reads only: the one request
//! that is not a read is SelfSubjectAccessReview, which the API server answers without storing.

use std::time::Duration;

use k8s_openapi::{
    api::{
        authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        },
        coordination::{v1::Lease, v1beta1::LeaseCandidate},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde::Serialize;

use crate::cli::Settings;

/// Oldest supported API server minor version: 1.33 is the first whose EndpointSlice API keeps
/// every field the controller writes (`trafficDistribution` is GA there).
pub const MIN_MINOR: u32 = 33;

/// The ExternalWorkload API version the controller lists and watches.
const WORKLOAD_API: &str = "workload.linkerd.io/v1beta1";

/// One check's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Short name, stable for scripts (`api-server`, `crd`, `rbac`, `lease`, `candidates`).
    pub check: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// On failure, what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Where a right is needed.
#[derive(Clone, Copy, Debug)]
enum Scope {
    /// Every namespace (an empty namespace in the review).
    Cluster,
    /// The Lease's namespace only.
    LeaseNamespace,
}

/// The rights the controller uses: `deploy/rbac.yaml` grants exactly these.
struct Need {
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    scope: Scope,
    /// Only with `--coordinated-election`.
    coordinated_only: bool,
}

const NEEDS: &[Need] = &[
    Need {
        group: "",
        resource: "services",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        coordinated_only: false,
    },
    Need {
        group: "workload.linkerd.io",
        resource: "externalworkloads",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        coordinated_only: false,
    },
    Need {
        group: "discovery.k8s.io",
        resource: "endpointslices",
        verbs: &["get", "list", "watch", "create", "update", "delete"],
        scope: Scope::Cluster,
        coordinated_only: false,
    },
    Need {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        scope: Scope::Cluster,
        coordinated_only: false,
    },
    Need {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "update"],
        scope: Scope::LeaseNamespace,
        coordinated_only: false,
    },
    Need {
        group: "coordination.k8s.io",
        resource: "leasecandidates",
        verbs: &["get", "list", "watch", "create", "update", "delete"],
        scope: Scope::LeaseNamespace,
        coordinated_only: true,
    },
];

// === impl Outcome ===

impl Outcome {
    fn pass(check: &'static str, detail: impl Into<String>) -> Self {
        Outcome {
            check,
            ok: true,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fail(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Outcome {
            check,
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// `PASS api-server: ...`, or `FAIL ...: ... -> fix`.
    pub fn line(&self) -> String {
        match (&self.fix, self.ok) {
            (Some(fix), false) => format!("FAIL {}: {} -> {fix}", self.check, self.detail),
            _ => format!("PASS {}: {}", self.check, self.detail),
        }
    }
}

/// Runs every check in order; when the API server cannot be reached, only that one.
pub async fn run(client: &Client, settings: &Settings) -> Vec<Outcome> {
    let mut outcomes = vec![api_server(client).await];
    if !outcomes[0].ok {
        return outcomes;
    }
    outcomes.push(crd(client).await);
    outcomes.extend(rbac(client, settings).await);
    outcomes.push(lease(client, settings).await);
    if settings.coordinated.is_some() {
        outcomes.push(candidates(client, settings).await);
    }
    outcomes
}

async fn api_server(client: &Client) -> Outcome {
    const CHECK: &str = "api-server";
    let info = match client.apiserver_version().await {
        Ok(info) => info,
        Err(error) => {
            return Outcome::fail(
                CHECK,
                format!("cannot reach the API server: {error}"),
                "check --kubeconfig/--context and that the server is up",
            );
        }
    };
    let minor: Option<u32> = info.minor.trim_end_matches('+').parse().ok();
    let version = format!("{}.{}", info.major, info.minor);
    match (info.major.as_str(), minor) {
        ("1", Some(minor)) if minor >= MIN_MINOR => {
            Outcome::pass(CHECK, format!("reachable, version {version}"))
        }
        _ => Outcome::fail(
            CHECK,
            format!("version {version} is not supported"),
            format!("upgrade the API server to 1.{MIN_MINOR} or newer"),
        ),
    }
}

async fn crd(client: &Client) -> Outcome {
    const CHECK: &str = "crd";
    let fix = "install the ExternalWorkload CRD (deploy/crds/externalworkloads.yaml or Linkerd's)";
    match client.list_api_group_resources(WORKLOAD_API).await {
        Ok(list) if list.resources.iter().any(|r| r.name == "externalworkloads") => {
            Outcome::pass(CHECK, format!("externalworkloads served at {WORKLOAD_API}"))
        }
        Ok(_) => Outcome::fail(
            CHECK,
            format!("{WORKLOAD_API} does not serve externalworkloads"),
            fix,
        ),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Outcome::fail(CHECK, format!("{WORKLOAD_API} is not served"), fix)
        }
        Err(error) => Outcome::fail(
            CHECK,
            format!("cannot read discovery for {WORKLOAD_API}: {error}"),
            "check that this identity may read API discovery",
        ),
    }
}

/// One outcome per resource: which verbs are missing, and where.
async fn rbac(client: &Client, settings: &Settings) -> Vec<Outcome> {
    const CHECK: &str = "rbac";
    let lease_namespace = settings.lease.namespace();
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut outcomes = Vec::new();
    for need in NEEDS {
        if need.coordinated_only && settings.coordinated.is_none() {
            continue;
        }
        let namespace = match need.scope {
            Scope::Cluster => None,
            Scope::LeaseNamespace => Some(lease_namespace.to_string()),
        };
        let place = namespace
            .as_deref()
            .map_or("cluster-wide".to_string(), |ns| {
                format!("in namespace {ns}")
            });
        let resource = match need.group {
            "" => need.resource.to_string(),
            group => format!("{}.{group}", need.resource),
        };
        let mut missing = Vec::new();
        for verb in need.verbs {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(need.group.to_string()),
                        resource: Some(need.resource.to_string()),
                        verb: Some((*verb).to_string()),
                        namespace: namespace.clone(),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            match api.create(&PostParams::default(), &review).await {
                Ok(result) if result.status.as_ref().is_some_and(|s| s.allowed) => {}
                Ok(_) => missing.push((*verb).to_string()),
                Err(error) => missing.push(format!("{verb} (review failed: {error})")),
            }
        }
        outcomes.push(if missing.is_empty() {
            Outcome::pass(
                CHECK,
                format!("{resource} {place}: {}", need.verbs.join(", ")),
            )
        } else {
            Outcome::fail(
                CHECK,
                format!("{resource} {place}: missing {}", missing.join(", ")),
                "grant them as deploy/rbac.yaml does (ClusterRole, Role in the Lease namespace)",
            )
        });
    }
    outcomes
}

async fn lease(client: &Client, settings: &Settings) -> Outcome {
    const CHECK: &str = "lease";
    let (namespace, name) = (settings.lease.namespace(), settings.lease.name());
    let at = format!("{namespace}/{name}");
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = match api.get_opt(name).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            return Outcome::fail(
                CHECK,
                format!("{at} does not exist"),
                "start the controller: its first replica creates the Lease (check --lease-name/--lease-namespace)",
            );
        }
        Err(error) => {
            return Outcome::fail(
                CHECK,
                format!("cannot read {at}: {error}"),
                "check --lease-namespace and the Lease rights above",
            );
        }
    };
    let spec = lease.spec.unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        return Outcome::fail(
            CHECK,
            format!("{at} has no holder ({transitions} transitions)"),
            "no replica is leading: check that the controller's pods are running and ready",
        );
    };
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    let Some(renewed) = spec.renew_time.or(spec.acquire_time) else {
        return Outcome::fail(
            CHECK,
            format!("{at} held by {holder} without a renew time"),
            "a replica writes it at its next renewal; if it stays so, delete the Lease",
        );
    };
    let age = Timestamp::now()
        .duration_since(renewed.0)
        .as_secs_f64()
        .max(0.0);
    let age = Duration::from_millis((age * 1000.0) as u64);
    let format = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
    if age > duration {
        Outcome::fail(
            CHECK,
            format!(
                "{at} held by {holder}, stale: last renewed {} ago, beyond its {} duration (takeover possible since {} ago), {transitions} transitions",
                format(age),
                format(duration),
                format(age - duration),
            ),
            "the holder stopped renewing and no standby took over: check the controller's pods and their logs",
        )
    } else {
        Outcome::pass(
            CHECK,
            format!(
                "{at} held by {holder}, renewed {} ago (duration {}), {transitions} transitions",
                format(age),
                format(duration)
            ),
        )
    }
}

async fn candidates(client: &Client, settings: &Settings) -> Outcome {
    const CHECK: &str = "candidates";
    let (namespace, name) = (settings.lease.namespace(), settings.lease.name());
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), namespace);
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let names: Vec<String> = (list.items.into_iter())
                .filter(|c| c.spec.lease_name == name)
                .filter_map(|c| c.metadata.name)
                .collect();
            if names.is_empty() {
                Outcome::fail(
                    CHECK,
                    format!("no LeaseCandidate for {namespace}/{name}"),
                    "start the controller with --coordinated-election",
                )
            } else {
                Outcome::pass(CHECK, format!("{}: {}", names.len(), names.join(", ")))
            }
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Outcome::fail(
            CHECK,
            "coordination.k8s.io/v1beta1 LeaseCandidate is not served",
            "enable the API server's CoordinatedLeaderElection feature gate and coordination.k8s.io/v1beta1, or drop --coordinated-election",
        ),
        Err(error) => Outcome::fail(
            CHECK,
            format!("cannot list LeaseCandidates in {namespace}: {error}"),
            "check the LeaseCandidate rights above",
        ),
    }
}
