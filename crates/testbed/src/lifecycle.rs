//! The control plane's processes while it runs: one more API server, kill, graceful stop and
//! restart of a server, an etcd compaction, and the list of supervised servers behind them.

use std::time::Duration;

use kube::Client;

use crate::process::Supervised;
use crate::wait::Deadline;
use crate::{Options, Server, Testbed, TestbedError, audit, servers};

// === impl Testbed: processes ===

impl Testbed {
    /// Starts one more kube-apiserver on the same etcd, certificates and service-account keys
    /// (an HA control plane), waits until it is ready, and returns its [`Server::ApiServer`]
    /// index. It stops with the testbed.
    pub async fn add_apiserver(&self) -> Result<usize, TestbedError> {
        let deadline = Deadline::after(Options::default().start_timeout);
        let index = self.apiserver_ports.lock().len();
        let name = server_name(Server::ApiServer(index));
        let issuer = self.apiserver_ports.lock().first().copied();
        let (apiserver, port) =
            servers::start_apiserver(&self.apiserver_spec(&name, issuer), deadline).await?;
        self.add_server(apiserver);
        self.apiserver_ports.lock().push(port);
        let client = self.client_of(index)?;
        self.wait_ready(Server::ApiServer(index), &client, deadline)
            .await?;
        Ok(index)
    }

    /// SIGKILL to `server` (a crash: no graceful shutdown); returns once it has exited.
    pub async fn kill(&self, server: Server) -> Result<(), TestbedError> {
        let mut process = self.take(server)?;
        let result = process.signal_and_wait("KILL", STOP_WAIT).await;
        self.put_back(server, process);
        match result? {
            true => Ok(()),
            false => Err(TestbedError::Timeout {
                what: format!("{} to exit after SIGKILL", server_name(server)),
                after: STOP_WAIT,
            }),
        }
    }

    /// SIGTERM to `server` (a graceful shutdown); returns once it has exited, after a SIGKILL
    /// if it took longer than a minute.
    pub async fn stop(&self, server: Server) -> Result<(), TestbedError> {
        let mut process = self.take(server)?;
        let mut result = process.signal_and_wait("TERM", GRACEFUL_STOP_WAIT).await;
        if matches!(result, Ok(false)) {
            result = process.signal_and_wait("KILL", STOP_WAIT).await;
        }
        self.put_back(server, process);
        result.map(|_| ())
    }

    /// Starts a killed or stopped `server` again with the same flags, so on the same port and
    /// (etcd) the same data folder, and waits until it is ready (an API server: `/readyz` and
    /// namespace `default`). A server still running is left alone.
    pub async fn restart(&self, server: Server) -> Result<(), TestbedError> {
        let deadline = Deadline::after(Options::default().start_timeout);
        let mut stopped = self.take(server)?;
        if stopped.exited().is_none() {
            self.put_back(server, stopped);
            return Ok(());
        }
        let (port, etcd) = match server {
            Server::Etcd => (port_of(&self.etcd_url), true),
            Server::ApiServer(index) => (
                self.apiserver_ports.lock().get(index).copied().unwrap_or(0),
                false,
            ),
        };
        let started = servers::restart(&stopped, port, etcd, deadline).await;
        let process = match started {
            Ok(process) => process,
            Err(error) => {
                self.put_back(server, stopped);
                return Err(error);
            }
        };
        self.put_back(server, process);
        if let Server::ApiServer(index) = server {
            let client = self.client_of(index)?;
            self.wait_ready(server, &client, deadline).await?;
        }
        Ok(())
    }

    /// Compacts etcd up to its current revision and returns that revision: from then on a
    /// watch that resumes from an older resourceVersion is answered 410 Gone (when it reaches
    /// etcd: an API server started with `--watch-cache=false` passes every watch through).
    pub async fn compact_etcd(&self) -> Result<i64, TestbedError> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port_of(&self.etcd_url)));
        servers::compact_etcd(addr).await
    }

    /// A client of API server `index` only.
    pub(crate) fn client_of(&self, index: usize) -> Result<Client, TestbedError> {
        let mut config = self.config.clone();
        let url = self.apiserver_url(index).unwrap_or_default();
        config.cluster_url = url.parse().map_err(|error| TestbedError::Io {
            context: format!("parsing {url}"),
            source: std::io::Error::other(format!("{error}")),
        })?;
        Client::try_from(config).map_err(TestbedError::kube("building a client"))
    }

    pub(crate) fn apiserver_spec<'a>(
        &'a self,
        name: &'a str,
        issuer_port: Option<u16>,
    ) -> servers::ApiServerSpec<'a> {
        let mut extra_args = self.apiserver_args.clone();
        if self.audit_log {
            extra_args.extend(audit::apiserver_args(&self.dir, name));
        }
        servers::ApiServerSpec {
            binary: &self.binaries.kube_apiserver,
            dir: &self.dir,
            pki: &self.pki,
            etcd_url: &self.etcd_url,
            name,
            issuer_port,
            extra_args,
        }
    }

    pub(crate) fn add_server(&self, server: Supervised) {
        self.logs
            .lock()
            .push((server.name().to_string(), server.log().to_path_buf()));
        self.servers.lock().push(server);
    }

    /// Waits until API server `server` is ready, failing early if it exits.
    pub(crate) async fn wait_ready(
        &self,
        server: Server,
        client: &Client,
        deadline: Deadline,
    ) -> Result<(), TestbedError> {
        let mut process = self.take(server)?;
        let result = servers::wait_apiserver_ready(&mut process, client, deadline).await;
        self.put_back(server, process);
        result
    }

    /// Takes `server` out of the list (put it back with [`Testbed::put_back`]).
    pub(crate) fn take(&self, server: Server) -> Result<Supervised, TestbedError> {
        let name = server_name(server);
        let mut servers = self.servers.lock();
        let index = servers
            .iter()
            .position(|process| process.name() == name)
            .ok_or_else(|| TestbedError::Io {
                context: format!("finding {name}"),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such server"),
            })?;
        Ok(servers.remove(index))
    }

    /// Puts a server back where it stands in the start order.
    pub(crate) fn put_back(&self, server: Server, process: Supervised) {
        let mut servers = self.servers.lock();
        let rank = |name: &str| {
            ["etcd", "kube-apiserver", "kube-controller-manager"]
                .iter()
                .position(|known| *known == name)
                .unwrap_or(usize::MAX)
        };
        let own = rank(&server_name(server));
        let index = servers
            .iter()
            .position(|other| rank(other.name()) > own)
            .unwrap_or(servers.len());
        servers.insert(index, process);
    }
}

/// How long a server may take to exit after SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// How long a graceful stop may take before it becomes a SIGKILL.
const GRACEFUL_STOP_WAIT: Duration = Duration::from_secs(60);

/// The supervised process name of `server`.
pub(crate) fn server_name(server: Server) -> String {
    match server {
        Server::Etcd => "etcd".to_string(),
        Server::ApiServer(0) => "kube-apiserver".to_string(),
        Server::ApiServer(index) => format!("kube-apiserver-{index}"),
    }
}

/// The port of `http(s)://127.0.0.1:<port>`.
pub(crate) fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .unwrap_or(0)
}
