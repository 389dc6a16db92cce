//! The faults a soak draws from (the chaos test's short soak and the soak bench), and how each
//! is struck.

use testbed::Server;

use crate::{
    Replica,
    chaos::{
        control::{self, Stop},
        faults, network,
        quiet::{self, Whose},
        wait_any_leading,
        world::{Member, World},
    },
    proxy::Mode,
};

/// One fault of a soak round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The leader stops gracefully; a follower takes over.
    HandOver,
    /// The leader is killed; a follower takes over once the Lease runs out.
    Crash,
    /// Another holder takes the Lease by hand, then releases it.
    Deposition,
    /// The leader's connection to the API server is cut or blackholed past RenewDeadline.
    Outage(Mode),
    /// The same, shorter than RenewDeadline: no step-down.
    Flap(Mode),
    /// The leader is cut off, then sent SIGTERM.
    TerminateCutOff(Mode),
    /// The Lease is deleted.
    LeaseDeleted,
    /// Connections are reset again and again.
    ConnectionResets,
    /// The leader's API server is killed (SIGKILL) and restarted.
    ApiServerKilled,
    /// The leader's API server is stopped gracefully and restarted.
    ApiServerStopped,
    /// etcd is killed and restarted with its data.
    EtcdKilled,
    /// Compaction expires every open watch (410 Gone).
    WatchExpiry,
    /// The leader's API server answers slowly.
    SlowApi,
    /// One of two API servers is cut off from its replicas.
    ApiServerCutOff,
    /// Watch streams stall: the leader's (it must heal within the stall bound), or every
    /// follower's, then the leader is killed (the next term must not plan from the stalled
    /// caches). The replicas need the stall bound ([`quiet::stall_args`]).
    StallWatches(Whose),
    /// Every replica's requests are held before they are forwarded, for as long as a term
    /// rides out.
    HoldRequests,
}

impl Fault {
    /// Faults of replicas, the Lease, and a replica's connection to its API server.
    pub const REPLICA: [Fault; 11] = [
        Fault::HandOver,
        Fault::Crash,
        Fault::Deposition,
        Fault::Outage(Mode::Cut),
        Fault::Outage(Mode::Blackhole),
        Fault::Flap(Mode::Cut),
        Fault::Flap(Mode::Blackhole),
        Fault::TerminateCutOff(Mode::Cut),
        Fault::TerminateCutOff(Mode::Blackhole),
        Fault::LeaseDeleted,
        Fault::ConnectionResets,
    ];

    /// Faults of the control plane (two API servers on one etcd).
    pub const CONTROL_PLANE: [Fault; 6] = [
        Fault::ApiServerKilled,
        Fault::ApiServerStopped,
        Fault::EtcdKilled,
        Fault::WatchExpiry,
        Fault::SlowApi,
        Fault::ApiServerCutOff,
    ];

    /// Quiet faults: nothing fails, a replica learns late or not at all (every replica
    /// proxied, with [`quiet::stall_args`]).
    pub const QUIET: [Fault; 3] = [
        Fault::StallWatches(Whose::Leader),
        Fault::StallWatches(Whose::Followers),
        Fault::HoldRequests,
    ];

    /// Strikes this fault and waits until the world has recovered from it.
    pub async fn strike(self, world: &mut World<'_>, members: &mut Vec<Member>) {
        match self {
            Fault::HandOver => faults::hand_over(world, members).await,
            Fault::Crash => faults::crash(world, members).await,
            Fault::Deposition => faults::deposition(world, members).await,
            Fault::Outage(mode) => network::outage(world, members, mode).await,
            Fault::Flap(mode) => network::flap(world, members, mode).await,
            Fault::TerminateCutOff(mode) => network::terminate_cut_off(world, members, mode).await,
            Fault::LeaseDeleted => faults::lease_deleted(world, members).await,
            Fault::ConnectionResets => network::connection_resets(world, members).await,
            Fault::ApiServerKilled | Fault::ApiServerStopped => {
                let side = leader_side(world, members).await;
                let stop = if self == Fault::ApiServerKilled {
                    Stop::Kill
                } else {
                    Stop::Graceful
                };
                control::restart(world, members, Server::ApiServer(side), stop).await;
            }
            Fault::EtcdKilled => control::restart(world, members, Server::Etcd, Stop::Kill).await,
            Fault::WatchExpiry => control::watch_expiry(world, members).await,
            Fault::SlowApi => control::slow_api(world, members).await,
            Fault::ApiServerCutOff => control::apiserver_partition(world, members).await,
            Fault::StallWatches(Whose::Leader) => {
                quiet::leader_watches_stalled(world, members).await;
            }
            Fault::StallWatches(Whose::Followers) => {
                quiet::followers_stalled_then_leader_killed(world, members).await;
            }
            Fault::HoldRequests => quiet::held_requests(world, members).await,
        }
    }
}

/// The API server of the current leader.
async fn leader_side(world: &World<'_>, members: &[Member]) -> usize {
    let replicas: Vec<&Replica> = members.iter().map(|m| &m.replica).collect();
    let (index, _) = wait_any_leading(&world.cluster, &replicas).await;
    members[index].apiserver
}
