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

mod locate;

pub use self::locate::{Kubectl, Target, locate};
use crate::cli::Settings;

/// Oldest supported API server minor version: 1.33 is the first whose EndpointSlice API keeps
/// every field the controller writes (`trafficDistribution` is GA there).
pub const MIN_MINOR: u32 = 33;

/// The ExternalWorkload API version the controller lists and watches.
const WORKLOAD_API: &str = "workload.linkerd.io/v1beta1";

/// One check's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Short name, stable for scripts (`api-server`, `lease-namespace`, `crd`, `rbac`, `lease`,
    /// `candidates`).
    pub check: &'static str,
    /// Whether it passed (a note always does).
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// On failure, what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// On failure, a command the operator can run next (`kubectl ...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Not a check: where `check` looked (for the Lease).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub note: bool,
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
            command: None,
            note: false,
        }
    }

    fn note(check: &'static str, detail: impl Into<String>) -> Self {
        Outcome {
            note: true,
            ..Outcome::pass(check, detail)
        }
    }

    fn fail(
        check: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
        command: impl Into<String>,
    ) -> Self {
        Outcome {
            check,
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
            command: Some(command.into()),
            note: false,
        }
    }

    /// `PASS api-server: ...`, `NOTE lease-namespace: ...`, or `FAIL ...: ... -> fix: command`.
    pub fn line(&self) -> String {
        match (&self.fix, &self.command, self.ok) {
            (Some(fix), Some(command), false) => {
                format!("FAIL {}: {} -> {fix}: {command}", self.check, self.detail)
            }
            (Some(fix), None, false) => format!("FAIL {}: {} -> {fix}", self.check, self.detail),
            _ if self.note => format!("NOTE {}: {}", self.check, self.detail),
            _ => format!("PASS {}: {}", self.check, self.detail),
        }
    }
}

/// Runs every check in order; when the API server cannot be reached, only that one. `client`
/// acts as the identity whose rights are checked (impersonated with `--as`); `own` is the
/// caller's own identity, which looks for the installed controller.
pub async fn run(
    own: &Client,
    client: &Client,
    settings: &Settings,
    kubectl: &Kubectl,
) -> Vec<Outcome> {
    let mut outcomes = vec![api_server(client, kubectl).await];
    if !outcomes[0].ok {
        return outcomes;
    }
    let (target, looked) = locate(own, settings, kubectl).await;
    outcomes.push(looked);
    outcomes.push(crd(client, kubectl).await);
    outcomes.extend(rbac(client, &target, settings, kubectl).await);
    outcomes.push(lease(client, &target, kubectl).await);
    if settings.coordinated.is_some() {
        outcomes.push(candidates(client, &target, kubectl).await);
    }
    outcomes
}

async fn api_server(client: &Client, kubectl: &Kubectl) -> Outcome {
    const CHECK: &str = "api-server";
    let info = match client.apiserver_version().await {
        Ok(info) => info,
        Err(error) => {
            return Outcome::fail(
                CHECK,
                format!("cannot reach the API server: {error}"),
                "check --kubeconfig/--context and that the server is up",
                kubectl.run("cluster-info"),
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
            kubectl.run("version"),
        ),
    }
}

async fn crd(client: &Client, kubectl: &Kubectl) -> Outcome {
    const CHECK: &str = "crd";
    let fix = "install the ExternalWorkload CRD (ours, or Linkerd's)";
    let install = kubectl.run("apply -f deploy/crds/externalworkloads.yaml");
    match client.list_api_group_resources(WORKLOAD_API).await {
        Ok(list) if list.resources.iter().any(|r| r.name == "externalworkloads") => {
            Outcome::pass(CHECK, format!("externalworkloads served at {WORKLOAD_API}"))
        }
        Ok(_) => Outcome::fail(
            CHECK,
            format!("{WORKLOAD_API} does not serve externalworkloads"),
            fix,
            install,
        ),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Outcome::fail(CHECK, format!("{WORKLOAD_API} is not served"), fix, install)
        }
        Err(error) => Outcome::fail(
            CHECK,
            format!(
                "cannot read discovery for {WORKLOAD_API}: {}",
                reason(&error)
            ),
            "check that this identity may read API discovery",
            kubectl.run("api-resources --api-group=workload.linkerd.io"),
        ),
    }
}

/// One outcome per resource: which verbs are missing, and where.
async fn rbac(
    client: &Client,
    target: &Target,
    settings: &Settings,
    kubectl: &Kubectl,
) -> Vec<Outcome> {
    const CHECK: &str = "rbac";
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut outcomes = Vec::new();
    for need in NEEDS {
        if need.coordinated_only && settings.coordinated.is_none() {
            continue;
        }
        let namespace = match need.scope {
            Scope::Cluster => None,
            Scope::LeaseNamespace => Some(target.namespace.clone()),
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
                Ok(_) => missing.push(((*verb).to_string(), *verb)),
                Err(error) => {
                    missing.push((format!("{verb} (review failed: {})", reason(&error)), *verb))
                }
            }
        }
        outcomes.push(match missing.first() {
            None => Outcome::pass(
                CHECK,
                format!("{resource} {place}: {}", need.verbs.join(", ")),
            ),
            Some((_, verb)) => {
                let names: Vec<&str> = missing.iter().map(|(text, _)| text.as_str()).collect();
                Outcome::fail(
                    CHECK,
                    format!("{resource} {place}: missing {}", names.join(", ")),
                    "grant them as deploy/rbac.yaml does (ClusterRole, Role in the Lease namespace), then confirm",
                    kubectl.can_i(verb, &resource, namespace.as_deref()),
                )
            }
        });
    }
    outcomes
}

async fn lease(client: &Client, target: &Target, kubectl: &Kubectl) -> Outcome {
    const CHECK: &str = "lease";
    let (namespace, name) = (target.namespace.as_str(), target.name.as_str());
    let at = target.at();
    let get = kubectl.run(&format!("-n {namespace} get lease {name} -o yaml"));
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = match api.get_opt(name).await {
        Ok(Some(lease)) => lease,
        Ok(None) if target.deployment.is_some() => {
            return Outcome::fail(
                CHECK,
                format!("{at} does not exist"),
                "the controller's first replica creates it: see why none did",
                target.logs(kubectl),
            );
        }
        Ok(None) => {
            return Outcome::fail(
                CHECK,
                format!("{at} does not exist"),
                "start the controller (its first replica creates the Lease), or find the Lease and pass --lease-namespace",
                kubectl.run(&format!(
                    "get leases --all-namespaces --field-selector metadata.name={name}"
                )),
            );
        }
        Err(error) => {
            return Outcome::fail(
                CHECK,
                format!("cannot read {at}: {}", reason(&error)),
                "check --lease-namespace and the Lease rights above",
                get,
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
            target.logs(kubectl),
        );
    };
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    let Some(renewed) = spec.renew_time.or(spec.acquire_time) else {
        return Outcome::fail(
            CHECK,
            format!("{at} held by {holder} without a renew time"),
            "a replica writes it at its next renewal; if it stays so, delete the Lease",
            kubectl.run(&format!("-n {namespace} delete lease {name}")),
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
                "{at} held by {holder}, expired: last renewed {} ago, beyond its {} duration (takeover possible since {} ago), {transitions} transitions",
                format(age),
                format(duration),
                format(age - duration),
            ),
            "the holder stopped renewing and no standby took over: check the controller's pods and their logs",
            target.logs(kubectl),
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

async fn candidates(client: &Client, target: &Target, kubectl: &Kubectl) -> Outcome {
    const CHECK: &str = "candidates";
    let (namespace, name) = (target.namespace.as_str(), target.name.as_str());
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
                    target.logs(kubectl),
                )
            } else {
                Outcome::pass(CHECK, format!("{}: {}", names.len(), names.join(", ")))
            }
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Outcome::fail(
            CHECK,
            "coordination.k8s.io/v1beta1 LeaseCandidate is not served",
            "enable the API server's CoordinatedLeaderElection feature gate and coordination.k8s.io/v1beta1, or drop --coordinated-election",
            kubectl.run("api-resources --api-group=coordination.k8s.io"),
        ),
        Err(error) => Outcome::fail(
            CHECK,
            format!(
                "cannot list LeaseCandidates in {namespace}: {}",
                reason(&error)
            ),
            "check the LeaseCandidate rights above",
            kubectl.can_i(
                "list",
                "leasecandidates.coordination.k8s.io",
                Some(namespace),
            ),
        ),
    }
}

/// The API server's own message for a refused request (kube's Display repeats the whole
/// Status), the error otherwise.
fn reason(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        error => error.to_string(),
    }
}
