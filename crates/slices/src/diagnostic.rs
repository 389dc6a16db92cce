//! What the planner could not use, for Events and metrics (docs/operations.md).

use std::fmt;

/// A workload value the planner left out of the slices.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Diagnostic {
    /// Name of the ExternalWorkload (same namespace as the Service).
    pub workload: String,
    /// What is wrong with it.
    pub problem: Problem,
}

/// Why a workload value was left out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// A `workloadIPs[].ip` that is not an IP address; that address is skipped.
    InvalidIp {
        /// The text found.
        value: String,
    },
    /// A Service's named targetPort has no workload port with that name and protocol; that
    /// Service port is left out for this workload.
    UnresolvedPort {
        /// The targetPort name.
        port_name: String,
        /// The Service port's protocol.
        protocol: String,
    },
    /// A named targetPort resolved to a workload port number outside 1..=65535; that Service
    /// port is left out for this workload.
    InvalidPort {
        /// The targetPort name.
        port_name: String,
        /// The number found.
        value: i32,
    },
    /// A headless Service's endpoint hostname must be a DNS label; this workload's name is not,
    /// so its endpoint has no hostname.
    InvalidHostname {
        /// The workload name that cannot be a hostname.
        value: String,
    },
}

/// The kind of a [`Problem`], without its values: a bounded set, fit for metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemKind {
    /// [`Problem::InvalidIp`].
    InvalidIp,
    /// [`Problem::UnresolvedPort`].
    UnresolvedPort,
    /// [`Problem::InvalidPort`].
    InvalidPort,
    /// [`Problem::InvalidHostname`].
    InvalidHostname,
}

// === impl Problem ===

impl Problem {
    /// Its kind.
    pub fn kind(&self) -> ProblemKind {
        match self {
            Problem::InvalidIp { .. } => ProblemKind::InvalidIp,
            Problem::UnresolvedPort { .. } => ProblemKind::UnresolvedPort,
            Problem::InvalidPort { .. } => ProblemKind::InvalidPort,
            Problem::InvalidHostname { .. } => ProblemKind::InvalidHostname,
        }
    }

    /// A bounded reason, fit for a metric label or an Event reason suffix.
    pub fn reason(&self) -> &'static str {
        self.kind().as_str()
    }
}

// === impl ProblemKind ===

impl ProblemKind {
    /// Every kind, so that a metrics layer can start each counter at zero.
    pub const ALL: [ProblemKind; 4] = [
        ProblemKind::InvalidIp,
        ProblemKind::UnresolvedPort,
        ProblemKind::InvalidPort,
        ProblemKind::InvalidHostname,
    ];

    /// The kind in snake case (`invalid_ip`), as metrics and Events name it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::InvalidIp => "invalid_ip",
            ProblemKind::UnresolvedPort => "unresolved_port",
            ProblemKind::InvalidPort => "invalid_port",
            ProblemKind::InvalidHostname => "invalid_hostname",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::InvalidIp { value } => {
                write!(
                    f,
                    "workload IP {value:?} is not an IP address; it is not published"
                )
            }
            Problem::UnresolvedPort {
                port_name,
                protocol,
            } => write!(
                f,
                "no workload port named {port_name:?} with protocol {protocol}; the Service port is not published for this workload"
            ),
            Problem::InvalidPort { port_name, value } => write!(
                f,
                "workload port {port_name:?} has number {value}, outside 1-65535; the Service port is not published for this workload"
            ),
            Problem::InvalidHostname { value } => write!(
                f,
                "workload name {value:?} is not a DNS label; its endpoint has no hostname"
            ),
        }
    }
}

// === impl Diagnostic ===

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExternalWorkload {}: {}", self.workload, self.problem)
    }
}
