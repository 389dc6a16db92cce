//! The controller as installed: its Deployments, found by the label the chart and `deploy/` put
//! on them, and the settings their replicas run with, read from the container's args and
//! environment by the binary's own parser. The tools use them for what the operator did not
//! give, so `check` looks at the Lease the replicas use and `diff` plans as they plan (issue 36).

use std::fmt;

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Container, EnvVar},
};
use kube::{Api, Client, ResourceExt, api::ListParams};

use crate::cli::{Args, Invocation};

/// The label every controller Deployment of the chart and of `deploy/` carries, whatever the
/// release is named (`app.kubernetes.io/name` is the release name).
pub const LABEL: &str = "app.kubernetes.io/part-of=external-endpoints";

/// The container running the controller in the chart's and `deploy/`'s pod template.
const CONTAINER: &str = "controller";

/// One controller Deployment.
#[derive(Clone, Debug)]
pub struct Installed {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its replicas' settings, or why they could not be read (a newer flag, say).
    pub args: Result<Box<Args>, String>,
}

/// Why the Deployments could not be listed.
#[derive(Debug)]
pub enum SearchError {
    /// The caller may not list Deployments in every namespace.
    Forbidden(String),
    /// Anything else (the server, the network).
    Failed(kube::Error),
}

// === impl Installed ===

impl Installed {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Reads the settings of `deployment`'s controller container.
    pub fn of(deployment: &Deployment) -> Self {
        let namespace = deployment.namespace().unwrap_or_default();
        let containers = (deployment.spec.template.spec.as_ref())
            .map(|pod| pod.containers.as_slice())
            .unwrap_or_default();
        let container = (containers.iter())
            .find(|c| c.name == CONTAINER)
            .or(containers.first());
        let args = match container {
            Some(container) => container_args(container, &namespace).map(Box::new),
            None => Err("no container".to_string()),
        };
        Installed {
            namespace,
            name: deployment.name_any(),
            args,
        }
    }
}

impl fmt::Display for SearchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SearchError::Forbidden(message) => write!(f, "forbidden: {message}"),
            SearchError::Failed(error) => write!(f, "{error}"),
        }
    }
}

/// The controller Deployments in every namespace, as the client's own identity sees them.
pub async fn find(client: &Client) -> Result<Vec<Installed>, SearchError> {
    let api: Api<Deployment> = Api::all(client.clone());
    match api.list(&ListParams::default().labels(LABEL)).await {
        Ok(list) => Ok(list.items.iter().map(Installed::of).collect()),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            Err(SearchError::Forbidden(status.message))
        }
        Err(error) => Err(SearchError::Failed(error)),
    }
}

/// The container's settings as the binary parses them in the pod: each variable of the
/// container that a flag falls back to becomes that flag, then the container's args follow and
/// override them (`args_override_self`). The environment of the process running the tool is
/// not read. A variable set from a field of the pod is known only for `metadata.namespace`
/// (the Deployment's); the others (the pod name, the identity) do not matter here.
fn container_args(container: &Container, namespace: &str) -> Result<Args, String> {
    let mut argv: Vec<String> = vec!["external-endpoints".into()];
    for arg in <Args as clap::CommandFactory>::command().get_arguments() {
        let (Some(variable), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let Some(value) = (container.env.iter().flatten())
            .find(|var| var.name.as_str() == variable)
            .and_then(|var| env_value(var, namespace))
        else {
            continue;
        };
        if arg.get_action().takes_values() {
            argv.push(format!("--{long}={value}"));
        } else if matches!(value.as_str(), "true" | "1" | "yes" | "on") {
            argv.push(format!("--{long}"));
        }
    }
    // An image whose entrypoint is overridden: `command` is the binary, then its own args.
    argv.extend(container.command.iter().flatten().skip(1).cloned());
    argv.extend(container.args.iter().flatten().cloned());
    let invocation = Invocation::of(argv.into_iter().map(Into::into).collect());
    let matches = Args::command_without_env()
        .try_get_matches_from(&invocation.argv)
        .map_err(|error| first_line(&error.to_string()))?;
    <Args as clap::FromArgMatches>::from_arg_matches(&matches)
        .map_err(|error| first_line(&error.to_string()))
}

/// The value of one container variable, where it can be known without the pod.
fn env_value(var: &EnvVar, namespace: &str) -> Option<String> {
    if let Some(value) = &var.value {
        return Some(value.clone());
    }
    let field = var.value_from.as_ref()?.field_ref.as_ref()?;
    (field.field_path == "metadata.namespace").then(|| namespace.to_string())
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector};

    use super::*;

    fn container(args: &[&str], env: Vec<EnvVar>) -> Container {
        Container {
            name: CONTAINER.into(),
            args: Some(args.iter().map(|a| a.to_string()).collect()),
            env: Some(env),
            ..Container::default()
        }
    }

    fn literal(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..EnvVar::default()
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }
    }

    #[test]
    fn the_deployments_downward_namespace_is_the_lease_namespace() {
        let env = vec![
            field("POD_NAME", "metadata.name"),
            field("POD_NAMESPACE", "metadata.namespace"),
        ];
        let args = container_args(&container(&["--lease-name=held"], env), "ops").unwrap();
        assert_eq!(args.lease_namespace, "ops");
        assert_eq!(args.lease_name, "held");
        assert_eq!(args.identity, None, "the pod name is not known here");
    }

    #[test]
    fn args_override_the_environment_and_planner_flags_are_read() {
        let env = vec![
            field("POD_NAMESPACE", "metadata.namespace"),
            literal("WATCH_NAMESPACE", "apps"),
            literal("COORDINATED_ELECTION", "true"),
        ];
        let argv = [
            "--lease-namespace=elsewhere",
            "--max-endpoints-per-slice",
            "7",
            "--managed-by=me",
            "--slice-prefix=mine-",
        ];
        let args = container_args(&container(&argv, env), "ops").unwrap();
        assert_eq!(args.lease_namespace, "elsewhere");
        assert_eq!(args.watch_namespace.as_deref(), Some("apps"));
        assert!(args.coordinated_election);
        assert_eq!(args.max_endpoints_per_slice, 7);
        assert_eq!(args.managed_by, "me");
        assert_eq!(args.slice_prefix, "mine-");
    }

    #[test]
    fn an_unknown_flag_is_reported_not_guessed() {
        let error = container_args(&container(&["--from-the-future"], vec![]), "ops").unwrap_err();
        assert!(error.contains("--from-the-future"), "{error}");
        assert_eq!(error.lines().count(), 1);
    }
}
