//! Where `check` looks for the Lease, and the commands it prints for the operator to run next.

use kube::Client;

use super::Outcome;
use crate::{
    cli::{Args, Settings, Source},
    installed::{self, Installed, SearchError},
};

/// The Lease to check, and how it was found.
#[derive(Clone, Debug)]
pub struct Target {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// The controller Deployment it was read from, if any (`namespace/name`).
    pub deployment: Option<(String, String)>,
}

/// Writes the operator's next commands with the kubeconfig, context and impersonation the
/// check ran with, so they can be pasted as printed.
#[derive(Clone, Debug, Default)]
pub struct Kubectl {
    /// `--kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `--context`.
    pub context: Option<String>,
    /// `--as` and `--as-group`, for the rights.
    pub impersonate: Option<(String, Vec<String>)>,
}

// === impl Kubectl ===

impl Kubectl {
    /// `kubectl [--kubeconfig ..] [--context ..] REST`.
    pub(super) fn run(&self, rest: &str) -> String {
        let mut line = "kubectl".to_string();
        if let Some(path) = &self.kubeconfig {
            line.push_str(&format!(" --kubeconfig {path}"));
        }
        if let Some(context) = &self.context {
            line.push_str(&format!(" --context {context}"));
        }
        format!("{line} {rest}")
    }

    /// `kubectl auth can-i VERB RESOURCE WHERE [--as ..]`.
    pub(super) fn can_i(&self, verb: &str, resource: &str, namespace: Option<&str>) -> String {
        let place = match namespace {
            Some(namespace) => format!("-n {namespace}"),
            None => "--all-namespaces".to_string(),
        };
        let mut rest = format!("auth can-i {verb} {resource} {place}");
        if let Some((user, groups)) = &self.impersonate {
            rest.push_str(&format!(" --as {user}"));
            for group in groups {
                rest.push_str(&format!(" --as-group {group}"));
            }
        }
        self.run(&rest)
    }
}

// === impl Target ===

impl Target {
    /// `namespace/name`.
    pub(super) fn at(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Where to read the replicas' logs: the Deployment found, or the pods of the Lease's
    /// namespace.
    pub(super) fn logs(&self, kubectl: &Kubectl) -> String {
        match &self.deployment {
            Some((namespace, name)) => kubectl.run(&format!("-n {namespace} logs deploy/{name}")),
            None => kubectl.run(&format!("-n {} get pods", self.namespace)),
        }
    }
}

/// Where the Lease is, looked for as an operator would: `--lease-namespace`, then
/// `POD_NAMESPACE`, then the installed controller's Deployment (found by its label, with the
/// caller's own identity), then the kubeconfig's namespace. The Lease's name is `--lease-name`
/// (or `LEASE_NAME`), else the Deployment's. The note says where it looked.
pub async fn locate(own: &Client, settings: &Settings, kubectl: &Kubectl) -> (Target, Outcome) {
    const CHECK: &str = "lease-namespace";
    let sources = settings.args.sources;
    let given = |from: &str| {
        let namespace = settings.lease.namespace().to_string();
        let note = Outcome::note(CHECK, format!("{namespace}, {from}"));
        let name = settings.lease.name().to_string();
        let target = Target {
            namespace,
            name,
            deployment: None,
        };
        (target, note)
    };
    match sources.lease_namespace {
        Source::Flag => return given("from --lease-namespace"),
        Source::Env => return given("from POD_NAMESPACE (--lease-namespace not given)"),
        Source::Default => {}
    }
    let mut looked = vec![
        "--lease-namespace not given".to_string(),
        "POD_NAMESPACE not set".into(),
    ];
    match installed::find(own).await {
        Ok(found) => {
            let readable: Vec<(&Installed, &Args)> = (found.iter())
                .filter_map(|i| i.args.as_ref().ok().map(|args| (i, args.as_ref())))
                .collect();
            for unreadable in found.iter().filter(|i| i.args.is_err()) {
                let error = unreadable.args.as_ref().err().cloned().unwrap_or_default();
                looked.push(format!(
                    "Deployment {}: cannot read its flags ({error})",
                    unreadable.key()
                ));
            }
            if let Some((first, args)) = readable.first() {
                let name = match sources.lease_name {
                    Source::Default => args.lease_name.clone(),
                    _ => settings.lease.name().to_string(),
                };
                let target = Target {
                    namespace: args.lease_namespace.clone(),
                    name,
                    deployment: Some((first.namespace.clone(), first.name.clone())),
                };
                let mut detail = format!(
                    "{}, from Deployment {} (labelled {}, found as the kubeconfig's user in all namespaces)",
                    target.namespace,
                    first.key(),
                    installed::LABEL
                );
                if readable.len() > 1 {
                    let others: Vec<String> = readable[1..]
                        .iter()
                        .map(|(i, a)| {
                            format!("{} (Lease {}/{})", i.key(), a.lease_namespace, a.lease_name)
                        })
                        .collect();
                    detail.push_str(&format!(
                        "; also found {}: pass --lease-namespace to check another",
                        others.join(", ")
                    ));
                }
                looked.push(detail);
                return (target, Outcome::note(CHECK, looked.join("; ")));
            }
            looked.push(match found.is_empty() {
                true => format!(
                    "no Deployment labelled {} in any namespace",
                    installed::LABEL
                ),
                false => "no Deployment whose flags could be read".to_string(),
            });
        }
        Err(SearchError::Forbidden(message)) => looked.push(format!(
            "the kubeconfig's user may not list Deployments in all namespaces ({message}; {})",
            kubectl.run("auth can-i list deployments.apps --all-namespaces")
        )),
        Err(SearchError::Failed(error)) => {
            looked.push(format!("listing Deployments failed: {error}"))
        }
    }
    let namespace = own.default_namespace().to_string();
    looked.push(format!("{namespace}, the kubeconfig's namespace"));
    let target = Target {
        namespace,
        name: settings.lease.name().to_string(),
        deployment: None,
    };
    (target, Outcome::note(CHECK, looked.join("; ")))
}
