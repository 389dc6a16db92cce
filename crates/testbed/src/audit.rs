//! The API servers' own record of EndpointSlice writes ([`Options::audit_log`]): who created,
//! changed or deleted which slice, when, and the resourceVersion it got.
//!
//! ```text
//!  kube-apiserver --audit-policy-file=audit-policy.yaml   (slice writes: RequestResponse;
//!                 --audit-log-path=<name>-audit.log         everything else: None)
//!        └──► one JSON event per write, written before the answer (blocking mode)
//!                 └──► Testbed::audit_events ──► AuditEvent
//! ```
//!
//! The level is RequestResponse, not Metadata: a create by `generateName` has no name until it
//! is stored, and only the response object carries the name and the resourceVersion the write
//! got, which is what a watch of the slices shows.
//!
//! [`Options::audit_log`]: crate::Options::audit_log

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::{Testbed, TestbedError};

/// The audit policy file, in the testbed's folder.
const POLICY_FILE: &str = "audit-policy.yaml";

/// What each audit log's file name holds (`kube-apiserver-audit.log`, and the files rotated
/// out of it past 100 MB, `kube-apiserver-audit-<time>.log`).
const LOG_MARK: &str = "-audit";

/// Slice writes with their request and response; nothing else. The RequestReceived stage is
/// left out: one event per write, once it is answered.
const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
omitManagedFields: true
rules:
- level: RequestResponse
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: discovery.k8s.io
    resources: [endpointslices]
- level: None
";

/// One slice write as an API server recorded it (stage ResponseComplete).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEvent {
    /// `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// The authenticated user (a client certificate's CN: see [`Testbed::kubeconfig_for`]).
    pub user: String,
    /// The client's `User-Agent` header.
    pub user_agent: String,
    /// The slice's namespace.
    pub namespace: String,
    /// The slice's name (for a create by `generateName`, the one it got).
    pub name: String,
    /// The answer's HTTP status code.
    pub code: u16,
    /// The resourceVersion the write gave the slice (creates, updates, patches that succeeded).
    pub resource_version: Option<String>,
    /// When the API server received the request.
    pub received: Option<Timestamp>,
    /// When it answered.
    pub completed: Option<Timestamp>,
}

// === impl AuditEvent ===

impl AuditEvent {
    /// Parses one line of an audit log; None for anything but a completed request.
    pub fn parse(line: &str) -> Option<AuditEvent> {
        let event: Value = serde_json::from_str(line).ok()?;
        if event["stage"] != "ResponseComplete" {
            return None;
        }
        let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
        let time = |value: &Value| value.as_str()?.parse().ok();
        let object = &event["objectRef"];
        let response = &event["responseObject"]["metadata"];
        let name = match text(&object["name"]) {
            name if name.is_empty() => text(&response["name"]),
            name => name,
        };
        Some(AuditEvent {
            verb: text(&event["verb"]),
            user: text(&event["user"]["username"]),
            user_agent: text(&event["userAgent"]),
            namespace: text(&object["namespace"]),
            name,
            code: u16::try_from(event["responseStatus"]["code"].as_u64()?).ok()?,
            resource_version: response["resourceVersion"].as_str().map(String::from),
            received: time(&event["requestReceivedTimestamp"]),
            completed: time(&event["stageTimestamp"]),
        })
    }

    /// Whether the write took effect (a 2xx answer).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

// === impl Testbed ===

impl Testbed {
    /// Every slice write the API servers recorded so far, in each server's order (empty
    /// without [`Options::audit_log`](crate::Options::audit_log)). Each is written before its
    /// client gets the answer.
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>, TestbedError> {
        let mut events = Vec::new();
        let entries = std::fs::read_dir(&self.dir)
            .map_err(TestbedError::io(format!("listing {}", self.dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let is_log = path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.contains(LOG_MARK) && name.ends_with(".log"));
            if !is_log {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .map_err(TestbedError::io(format!("reading {}", path.display())))?;
            events.extend(text.lines().filter_map(AuditEvent::parse));
        }
        Ok(events)
    }
}

/// Writes the policy into the testbed's folder.
pub(crate) fn write_policy(dir: &Path) -> Result<(), TestbedError> {
    let path = dir.join(POLICY_FILE);
    std::fs::write(&path, POLICY).map_err(TestbedError::io(format!("writing {}", path.display())))
}

/// The audit flags of the API server `name`: the policy, its own log file, JSON lines, and
/// blocking mode (the event is written before the client gets its answer).
pub(crate) fn apiserver_args(dir: &Path, name: &str) -> [String; 4] {
    [
        format!("--audit-policy-file={}", dir.join(POLICY_FILE).display()),
        format!(
            "--audit-log-path={}",
            dir.join(format!("{name}{LOG_MARK}.log")).display()
        ),
        "--audit-log-format=json".to_string(),
        "--audit-log-mode=blocking".to_string(),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_create_by_generate_name_is_named_by_its_response() {
        let line = r#"{"kind":"Event","stage":"ResponseComplete","verb":"create",
            "user":{"username":"r1","groups":["system:masters"]},"userAgent":"kube-rs/5",
            "objectRef":{"resource":"endpointslices","namespace":"ns","apiGroup":"discovery.k8s.io"},
            "responseStatus":{"code":201},
            "responseObject":{"metadata":{"name":"web-x1","resourceVersion":"42"}},
            "requestReceivedTimestamp":"2026-12-03T11:00:00.000001Z",
            "stageTimestamp":"2026-12-03T11:00:00.004000Z"}"#
            .replace('\n', "");
        let event = AuditEvent::parse(&line).unwrap();
        assert_eq!(event.user, "r1");
        assert_eq!(event.name, "web-x1");
        assert_eq!(event.resource_version.as_deref(), Some("42"));
        assert!(event.succeeded());
        assert!(event.received < event.completed);
    }

    #[test]
    fn only_completed_requests_are_events() {
        let line = r#"{"stage":"Panic","verb":"delete","responseStatus":{"code":500}}"#;
        assert_eq!(AuditEvent::parse(line), None);
    }
}
