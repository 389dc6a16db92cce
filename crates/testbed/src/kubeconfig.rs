//! The kubeconfig a testbed writes for its clients: the API server, verified with the testbed's
//! CA, and a user's client certificate.

use std::path::Path;

use crate::{TestbedError, certs};

/// Writes a kubeconfig for `server` (verified with the testbed's CA) whose user authenticates
/// with the client certificate and key `user`.
pub(crate) fn write_kubeconfig(
    path: &Path,
    server: &str,
    pki: &certs::Pki,
    (cert, key): (&Path, &Path),
) -> Result<(), TestbedError> {
    // JSON strings are YAML strings: quoting paths this way is always valid.
    let quote = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testbed
  context:
    cluster: testbed
    user: admin
    namespace: default
current-context: testbed
",
        server = serde_json::Value::String(server.to_string()),
        ca = quote(&pki.ca_cert),
        cert = quote(cert),
        key = quote(key),
    );
    std::fs::write(path, text).map_err(TestbedError::io(format!("writing {}", path.display())))
}
