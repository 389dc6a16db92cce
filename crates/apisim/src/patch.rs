//! The patch types, answered as kube-apiserver answers them, or refused with a clear error:
//!
//! | content type | here |
//! | --- | --- |
//! | `application/merge-patch+json` | RFC 7386, every kind (what kube's event recorder sends) |
//! | `application/json-patch+json` | RFC 6902, every kind; a failed `test` or a missing path is 422 |
//! | `application/strategic-merge-patch+json` | built-in kinds, for patches without lists (there it is a merge patch); custom resources get 415 as from the real server |
//! | `application/apply-patch+yaml` | refused (415): server-side apply is not modelled |

use serde_json::Value;

/// A patch, by its content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
}

/// Why a patch was not applied.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The content type is not served (415), with what to say.
    Unsupported(String),
    /// The patch cannot be applied to the object (422), with what to say.
    Invalid(String),
    /// The body is not a patch of its type (400).
    Malformed(String),
}

// === impl PatchType ===

impl PatchType {
    /// The type of a request's content type, for a resource (custom or built in).
    pub fn of(content_type: &str, custom: bool) -> Result<Self, Refusal> {
        match content_type {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" if !custom => Ok(Self::Strategic),
            "application/strategic-merge-patch+json" => Err(Refusal::Unsupported(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".to_string(),
            )),
            "application/apply-patch+yaml" => Err(Refusal::Unsupported(
                "server-side apply (application/apply-patch+yaml) is not served by the in-memory API server: field management is not modelled".to_string(),
            )),
            other => Err(Refusal::Unsupported(format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json"
            ))),
        }
    }

    /// `object` with `body` applied.
    pub fn apply(self, object: &Value, body: &[u8]) -> Result<Value, Refusal> {
        let malformed = |error: serde_json::Error| {
            Refusal::Malformed(format!(
                "the body of the request could not be decoded: {error}"
            ))
        };
        match self {
            Self::Merge => {
                let patch: Value = serde_json::from_slice(body).map_err(malformed)?;
                let mut object = object.clone();
                merge(&mut object, &patch);
                Ok(object)
            }
            Self::Strategic => {
                let patch: Value = serde_json::from_slice(body).map_err(malformed)?;
                if holds_list(&patch) {
                    // A list's strategy (merge by key, replace, retain) comes from the type's
                    // Go struct tags, which are not modelled; a list merged as a merge patch
                    // would be a silent difference, so it is refused instead.
                    return Err(Refusal::Unsupported(
                        "a strategic merge patch with a list is not served by the in-memory API server (send a merge or JSON patch)".to_string(),
                    ));
                }
                let mut object = object.clone();
                merge(&mut object, &patch);
                Ok(object)
            }
            Self::Json => {
                let patch: json_patch::Patch = serde_json::from_slice(body).map_err(malformed)?;
                let mut object = object.clone();
                json_patch::patch(&mut object, &patch)
                    .map_err(|error| Refusal::Invalid(error.to_string()))?;
                Ok(object)
            }
        }
    }
}

fn holds_list(value: &Value) -> bool {
    match value {
        Value::Array(_) => true,
        Value::Object(map) => map.values().any(holds_list),
        _ => false,
    }
}

/// RFC 7386 merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(target), Some(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (None, Some(_)) => {
            *target = Value::Object(serde_json::Map::new());
            merge(target, patch);
        }
        _ => *target = patch.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object() -> Value {
        json!({"metadata": {"name": "a", "labels": {"app": "web"}}, "spec": {"ports": [{"port": 80}]}})
    }

    #[test]
    fn merge_patches_replace_lists_and_null_removes() {
        let patched = PatchType::Merge
            .apply(&object(), br#"{"metadata":{"labels":{"app":null,"tier":"a"}},"spec":{"ports":[{"port":81}]}}"#)
            .unwrap_or_default();
        assert_eq!(patched["metadata"]["labels"], json!({"tier": "a"}));
        assert_eq!(patched["spec"]["ports"], json!([{"port": 81}]));
    }

    #[test]
    fn json_patches_apply_in_order_and_a_failed_test_is_invalid() {
        let patched = PatchType::Json
            .apply(
                &object(),
                br#"[{"op":"test","path":"/metadata/labels/app","value":"web"},{"op":"add","path":"/metadata/labels/x","value":"1"},{"op":"remove","path":"/spec/ports/0"}]"#,
            )
            .unwrap_or_default();
        assert_eq!(patched["metadata"]["labels"]["x"], "1");
        assert_eq!(patched["spec"]["ports"], json!([]));
        let failed = PatchType::Json.apply(
            &object(),
            br#"[{"op":"test","path":"/metadata/labels/app","value":"db"}]"#,
        );
        assert!(matches!(failed, Err(Refusal::Invalid(_))), "{failed:?}");
        let missing = PatchType::Json.apply(&object(), br#"[{"op":"remove","path":"/nothing"}]"#);
        assert!(matches!(missing, Err(Refusal::Invalid(_))), "{missing:?}");
    }

    #[test]
    fn unsupported_patch_types_are_refused_by_name() {
        assert_eq!(
            PatchType::of("application/merge-patch+json", true),
            Ok(PatchType::Merge)
        );
        assert!(matches!(
            PatchType::of("application/strategic-merge-patch+json", true),
            Err(Refusal::Unsupported(_))
        ));
        let Err(Refusal::Unsupported(apply)) = PatchType::of("application/apply-patch+yaml", false)
        else {
            panic!("apply is refused");
        };
        assert!(apply.contains("server-side apply"), "{apply}");
        let with_list = PatchType::Strategic.apply(&object(), br#"{"spec":{"ports":[]}}"#);
        assert!(matches!(with_list, Err(Refusal::Unsupported(_))));
        let without = PatchType::Strategic
            .apply(&object(), br#"{"metadata":{"annotations":{"a":"b"}}}"#)
            .unwrap_or_default();
        assert_eq!(without["metadata"]["annotations"]["a"], "b");
    }
}
