//! More users than the admin: each a client certificate of its own (CN the user's name, O
//! `system:masters`), so that the API server's audit log ([`Testbed::audit_events`]) names
//! who made each request, with the admin's rights.

use std::path::PathBuf;

use crate::kubeconfig::write_kubeconfig;
use crate::{Testbed, TestbedError, certs};

// === impl Testbed ===

impl Testbed {
    /// Writes a kubeconfig for user `user` (a fresh client certificate, in group
    /// `system:masters`) talking to API server `apiserver` ([`Server::ApiServer`] index; the
    /// first when there is no such server), and returns its path. Each call writes new files,
    /// so tests sharing the testbed may ask for the same name at once; they are removed with
    /// the testbed's folder.
    ///
    /// [`Server::ApiServer`]: crate::Server::ApiServer
    pub fn kubeconfig_for(&self, user: &str, apiserver: usize) -> Result<PathBuf, TestbedError> {
        let folder = self.dir.join("users");
        std::fs::create_dir_all(&folder)
            .map_err(TestbedError::io(format!("creating {}", folder.display())))?;
        let own = tempfile::Builder::new()
            .prefix(&format!("{user}-"))
            .tempdir_in(&folder)
            .map_err(TestbedError::io(format!("creating a folder for {user}")))?
            .keep();
        let (cert, key) = (own.join("client.crt"), own.join("client.key"));
        certs::write_client_cert(&self.pki, user, (&cert, &key))?;
        let server = self
            .apiserver_url(apiserver)
            .unwrap_or_else(|| self.server.clone());
        let kubeconfig = own.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &self.pki, (&cert, &key))?;
        Ok(kubeconfig)
    }
}
