//! The server's request log: one entry per request, and the hash that tells two runs apart.

use std::fmt;

use serde_json::Value;

/// One request, as the log keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Its place in the log.
    pub seq: u64,
    /// Simulated milliseconds since the server was made.
    pub at_ms: u64,
    /// Who sent it.
    pub caller: String,
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// HTTP status of the answer.
    pub status: u16,
    /// The global revision after it.
    pub revision: u64,
    /// The request body hashed (FNV-1a; 0 when empty), with every timestamp in it masked: the
    /// replicas write the wall clock into Lease times and slice trigger-time annotations, and
    /// the simulation does not control it.
    pub body: u64,
}

/// A stable hash (FNV-1a) of `entries`, request bodies included: equal logs, equal hashes.
pub(crate) fn hash(entries: &[LogEntry]) -> u64 {
    entries.iter().fold(FNV_OFFSET, |hash, entry| {
        fnv1a(fnv1a(hash, entry.to_string().as_bytes()), b"\n")
    })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Continues the FNV-1a hash `hash` over `bytes`.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The hash a [`LogEntry`] keeps of a request body: JSON with every string that reads as a
/// timestamp replaced, other bodies as they are.
pub(crate) fn body_hash(body: &[u8]) -> u64 {
    if body.is_empty() {
        return 0;
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(mut value) => {
            mask_timestamps(&mut value);
            fnv1a(FNV_OFFSET, value.to_string().as_bytes())
        }
        Err(_) => fnv1a(FNV_OFFSET, body),
    }
}

fn mask_timestamps(value: &mut Value) {
    match value {
        Value::String(text) if text.parse::<k8s_openapi::jiff::Timestamp>().is_ok() => {
            *text = "<time>".to_string();
        }
        Value::Array(items) => items.iter_mut().for_each(mask_timestamps),
        Value::Object(fields) => fields.values_mut().for_each(mask_timestamps),
        _ => {}
    }
}

impl fmt::Display for LogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}ms {} {} {} {} rv={}",
            self.seq, self.at_ms, self.caller, self.method, self.uri, self.status, self.revision
        )?;
        if self.body != 0 {
            write!(f, " body={:016x}", self.body)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_hash_ignores_timestamps_and_nothing_else() {
        let lease = |renewed: &str, holder: &str| {
            serde_json::json!({"spec": {"holderIdentity": holder, "renewTime": renewed}})
                .to_string()
        };
        let at = |renewed, holder| body_hash(lease(renewed, holder).as_bytes());
        let first = at("2026-12-05T13:00:00.000001Z", "a");
        assert_eq!(first, at("2026-12-05T13:00:07.123456Z", "a"));
        assert_ne!(first, at("2026-12-05T13:00:00.000001Z", "b"));
        assert_eq!(body_hash(b""), 0);
        assert_ne!(body_hash(b"not json"), body_hash(b"not json either"));
    }
}
