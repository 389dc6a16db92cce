//! Schema touch-ups the derive cannot express.

use schemars::Schema;

/// Marks `fields` as required and drops the `default` schemars derives for them.
///
/// The Rust fields carry `#[serde(default)]` so that decoding never fails on an object a looser
/// CRD let in; schemars would turn that into "optional, with default ''", which is both wrong (the
/// API must reject an object without them) and invalid (a default of '' breaks `minLength: 1`).
pub(crate) fn require(schema: &mut Schema, fields: &[&str]) {
    if let Some(properties) = schema
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        for field in fields {
            if let Some(property) = properties
                .get_mut(*field)
                .and_then(serde_json::Value::as_object_mut)
            {
                property.remove("default");
            }
        }
    }
    let required: Vec<serde_json::Value> = fields
        .iter()
        .map(|f| serde_json::Value::String((*f).to_owned()))
        .collect();
    schema.insert("required".to_owned(), serde_json::Value::Array(required));
}
