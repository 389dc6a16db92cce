//! Deserialisers that never fail on a bad value.
//!
//! The controller lists and watches every ExternalWorkload of the cluster. One object that does
//! not fit our types would make the whole list fail to decode and stop the watch for every object
//! (docs/slices.md, "Input": the controller must survive objects that a looser CRD let in). So each
//! field of the types is decoded through these helpers: a value of the wrong shape becomes the
//! field's default, and the planner reports what it cannot use.

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};

/// Decodes any value; a value that does not fit `T` becomes `T::default()`.
pub(crate) fn value<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let raw = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(raw).unwrap_or_default())
}

/// Decodes a list, keeping the items that fit `T` and dropping the others; a non-list is empty.
pub(crate) fn list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let raw = serde_json::Value::deserialize(deserializer)?;
    Ok(match raw {
        serde_json::Value::Array(items) => items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// Decodes an optional string; a number or boolean keeps its text, anything else is `None`.
pub(crate) fn text<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw = serde_json::Value::deserialize(deserializer)?;
    Ok(match raw {
        serde_json::Value::String(text) => Some(text),
        serde_json::Value::Number(number) => Some(number.to_string()),
        serde_json::Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    })
}

/// Decodes a port number; text holding a number is read, anything else (or out of `i32`) is 0,
/// which no consumer accepts as a port.
pub(crate) fn port<'de, D>(deserializer: D) -> Result<i32, D::Error>
where
    D: Deserializer<'de>,
{
    let raw = serde_json::Value::deserialize(deserializer)?;
    let wide = match raw {
        serde_json::Value::Number(number) => number.as_i64(),
        serde_json::Value::String(text) => text.trim().parse::<i64>().ok(),
        _ => None,
    };
    Ok(wide.and_then(|n| i32::try_from(n).ok()).unwrap_or(0))
}
