//! Coordinated Leader Election (KEP-4355) on the testbed's API servers.
//!
//! kube-apiserver 1.37 runs the election controller (and the LeaseCandidate garbage collector)
//! in a post-start hook, itself leader-elected among API servers through the Lease
//! `kube-system/leader-election-controller`, only when the `CoordinatedLeaderElection` feature
//! gate is on (beta, off by default). The controller's informers list and watch
//! `coordination.k8s.io/v1beta1` LeaseCandidates, a beta API that is off by default too: with the
//! gate alone the informer never syncs and the controller never starts its workers. Both flags
//! are therefore needed.

use crate::Options;

/// The kube-apiserver flags that turn on the election controller and the LeaseCandidate API.
pub const COORDINATED_LEADER_ELECTION_ARGS: [&str; 2] = [
    "--feature-gates=CoordinatedLeaderElection=true",
    "--runtime-config=coordination.k8s.io/v1beta1=true",
];

// === impl Options ===

impl Options {
    /// Starts every API server with Coordinated Leader Election on
    /// ([`COORDINATED_LEADER_ELECTION_ARGS`]).
    #[must_use]
    pub fn with_coordinated_leader_election(mut self) -> Self {
        self.apiserver_args
            .extend(COORDINATED_LEADER_ELECTION_ARGS.map(String::from));
        self
    }
}
