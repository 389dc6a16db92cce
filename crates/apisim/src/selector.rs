//! Label and field selectors, as the API server parses and applies them.

use std::collections::BTreeMap;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (`app=web,tier!=db,env in (a,b),!legacy`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// A parsed field selector: only `metadata.name` and `metadata.namespace`, as for most kinds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

// === impl LabelSelector ===

impl LabelSelector {
    /// Parses `text`; the error says what is wrong, as a 400 answer would.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(requirement(part)?);
        }
        Ok(Self(requirements))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => labels.get(key) == Some(value),
            Requirement::NotEquals(key, value) => labels.get(key) != Some(value),
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::NotExists(key) => !labels.contains_key(key),
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (index, character) in text.char_indices() {
        match character {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(valid_key(key.trim())?));
    }
    for (operator, set) in [(" notin ", false), (" in ", true)] {
        if let Some((key, values)) = part.split_once(operator) {
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|values| values.strip_suffix(')'))
                .ok_or_else(|| {
                    format!("unable to parse requirement: {part:?}: values must be in parentheses")
                })?;
            let values = values
                .split(',')
                .map(|value| value.trim().to_string())
                .collect();
            let key = valid_key(key.trim())?;
            return Ok(if set {
                Requirement::In(key, values)
            } else {
                Requirement::NotIn(key, values)
            });
        }
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(
            valid_key(key.trim())?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equals(
            valid_key(key.trim())?,
            value.trim().to_string(),
        ));
    }
    Ok(Requirement::Exists(valid_key(part)?))
}

fn valid_key(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label key {key:?}"
        ))
    }
}

// === impl FieldSelector ===

impl FieldSelector {
    /// Parses `text`; only `metadata.name` and `metadata.namespace` are supported (as for
    /// the kinds served here), anything else is an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
        {
            let (field, equal, value) = if let Some((field, value)) = part.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) =
                part.split_once("==").or_else(|| part.split_once('='))
            {
                (field, true, value)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace") {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    /// Whether `object` satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = if field == "metadata.name" {
                "/metadata/name"
            } else {
                "/metadata/namespace"
            };
            let actual = object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default();
            (actual == value) == *equal
        })
    }
}

/// The labels of a stored object.
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    #[allow(clippy::type_complexity)] // a table: selector, labels, expected
    fn label_selectors_match_as_the_api_server_does() {
        let cases: [(&str, &[(&str, &str)], bool); 9] = [
            ("app=web", &[("app", "web")], true),
            ("app==web", &[("app", "api")], false),
            ("app!=web", &[], true),
            ("app in (web, api)", &[("app", "api")], true),
            ("app notin (web,api)", &[("app", "api")], false),
            ("app notin (web)", &[], true),
            ("app", &[("app", "")], true),
            ("!app", &[("app", "x")], false),
            ("a=1,b in (2,3),!c", &[("a", "1"), ("b", "3")], true),
        ];
        for (selector, pairs, expected) in cases {
            let parsed =
                LabelSelector::parse(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert_eq!(
                parsed.matches(&labels(pairs)),
                expected,
                "{selector} on {pairs:?}"
            );
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selectors_know_name_and_namespace_only() {
        let object = serde_json::json!({"metadata": {"name": "x", "namespace": "n"}});
        assert!(
            FieldSelector::parse("metadata.name=x")
                .map(|f| f.matches(&object))
                .unwrap_or(false)
        );
        assert!(
            !FieldSelector::parse("metadata.namespace!=n")
                .map(|f| f.matches(&object))
                .unwrap_or(true)
        );
        assert!(FieldSelector::parse("spec.nodeName=a").is_err());
    }
}
