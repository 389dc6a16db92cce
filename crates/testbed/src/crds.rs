//! Installing the project's CustomResourceDefinitions and waiting until they are served.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::serde::Deserialize;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};

use crate::TestbedError;
use crate::wait::{Deadline, poll_until};

/// Field manager of the testbed's server-side applies.
const FIELD_MANAGER: &str = "external-endpoints-testbed";

/// Every CRD in the `*.yaml` / `*.yml` files of `dirs` (files sorted by name; a missing or
/// empty folder contributes nothing). Documents that are not CRDs are an error: these folders
/// hold CRDs only, and silently skipping a typo'd kind would hide a broken manifest.
pub(crate) fn read_crds(dirs: &[PathBuf]) -> Result<Vec<CustomResourceDefinition>, TestbedError> {
    let mut files = Vec::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => {
                return Err(TestbedError::io(format!("listing {}", dir.display()))(
                    error,
                ));
            }
        };
        for entry in entries {
            let path = entry
                .map_err(TestbedError::io(format!("listing {}", dir.display())))?
                .path();
            let yaml = path
                .extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml");
            if yaml && path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();

    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .map_err(TestbedError::io(format!("reading {}", path.display())))?;
        crds.extend(parse_crds(&path, &text)?);
    }
    Ok(crds)
}

fn parse_crds(path: &Path, text: &str) -> Result<Vec<CustomResourceDefinition>, TestbedError> {
    let manifest_error = |detail: String| TestbedError::Manifest {
        path: path.to_path_buf(),
        detail,
    };
    let mut crds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(document)
            .map_err(|error| manifest_error(error.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a leading `---`
        }
        let kind = value
            .get("kind")
            .and_then(|kind| kind.as_str())
            .unwrap_or("");
        if kind != "CustomResourceDefinition" {
            return Err(manifest_error(format!(
                "expected only kind CustomResourceDefinition, found {kind:?}"
            )));
        }
        let crd =
            serde_json::from_value(value).map_err(|error| manifest_error(error.to_string()))?;
        crds.push(crd);
    }
    Ok(crds)
}

/// Applies each CRD (server-side apply, so re-installing is harmless), waits until it is
/// Established, then until a LIST of every served version succeeds: Established alone can
/// precede the moment the new endpoints answer.
pub(crate) async fn install(
    client: &Client,
    crds: &[CustomResourceDefinition],
    deadline: Deadline,
) -> Result<(), TestbedError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(TestbedError::kube(format!("installing CRD {name}")))?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        poll_until(
            deadline,
            &format!("CRD {name} to be Established"),
            || async {
                let Ok(current) = api.get(&name).await else {
                    return false;
                };
                current
                    .status
                    .and_then(|status| status.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            },
        )
        .await?;
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let gvk = GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let what = format!("{}/{} to be served", resource.api_version, resource.plural);
            poll_until(deadline, &what, || async {
                api.list(&ListParams::default().limit(1)).await.is_ok()
            })
            .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object}}
"#;

    #[test]
    fn parses_multi_document_files_and_skips_empty_documents() {
        let text = format!(
            "---\n{CRD}\n---\n{}\n---\n",
            CRD.replace("widgets.", "gadgets.")
        );
        let crds = parse_crds(Path::new("x.yaml"), &text).unwrap();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["widgets.example.com", "gadgets.example.com"]);
    }

    #[test]
    fn rejects_documents_that_are_not_crds() {
        let error =
            parse_crds(Path::new("x.yaml"), "apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert!(error.to_string().contains("ConfigMap"), "{error}");
    }

    #[test]
    fn a_missing_folder_contributes_nothing() {
        let crds = read_crds(&[PathBuf::from("/nonexistent/testbed/crds")]).unwrap();
        assert!(crds.is_empty());
    }
}
