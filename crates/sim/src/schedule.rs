//! A seed's schedule: changes to Services and workloads, and faults placed between them, each at
//! a simulated instant. Generated up front from the seed alone, so it can be printed, traced and
//! replayed; the few choices that depend on the run (which replica leads when a fault strikes)
//! are made by the world from the same seed.

use std::{collections::BTreeMap, fmt, time::Duration};

use crate::rng::Rng;

mod faults;

pub use self::faults::{Fault, Target};
use self::faults::{fault, server_fault, view_fault};

/// The namespaces of the world.
pub const NAMESPACES: [&str; 2] = ["alpha", "beta"];
/// The values of the `app` label: Services select one each; `idle` selects nothing.
pub const APPS: [&str; 4] = ["web", "api", "db", "idle"];
/// The names of the Services of each namespace.
pub const SERVICES: [&str; 3] = ["web", "api", "db"];
/// Zones a workload can be in.
pub const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// What a schedule holds, and how the world around it runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Controller replicas.
    pub replicas: usize,
    /// Changes and faults happen in `0..duration`; then every fault heals.
    pub duration: Duration,
    /// Faults in the schedule.
    pub faults: usize,
    /// Changes to Services and workloads in the schedule.
    pub changes: usize,
    /// Workloads created before the replicas start, per namespace.
    pub initial_workloads: usize,
    /// Faults that strike with a slice write in flight, on top of `faults`: a graceful stop of
    /// the leader ([`Fault::StopDuringNextWrite`]) or a pause of its link long enough for the
    /// Lease to change hands ([`Fault::PauseDuringNextWrite`]). Drawn from a stream of their
    /// own, so the rest of a seed's schedule is the same whatever their number.
    pub during_write: usize,
    /// Faults of the fresh-view rule, on top of the others, from a stream of their own too: one
    /// kind of one replica's watch lagging behind its other watches ([`Fault::LagKind`]), and a
    /// slice write applied whose answer is lost ([`Fault::LoseAnswers`]).
    pub view_faults: usize,
    /// Faults the API server itself produces, on top of the others, from a stream of their own
    /// too: watches closed by the server ([`Fault::CloseWatches`]), an object deleted and created
    /// again behind a compaction ([`Fault::RecreateBehindCompaction`]), one instance's watch
    /// cache of one kind falling behind ([`Fault::LagCache`]), and a change racing a replica's
    /// read ([`Fault::RaceServiceRead`], [`Fault::RaceWorkloadRead`]); with them, the Lease
    /// deleted under a leader cut off ([`Fault::DeleteLeaseUnderPausedLeader`]).
    pub server_faults: usize,
    /// The API server runs as two instances behind one address, the second one's watch caches
    /// each lagging the store by its own amount up to this, drawn from the seed (as two
    /// kube-apiservers whose caches lag apart). `ZERO`: one instance, no lag.
    pub instance_lag: Duration,
    /// The percentage of seeds whose replicas show each kind up to date at an acquisition by a
    /// probe of its watch (the form the barrier takes above 5,000 objects) rather than by a
    /// re-list, drawn from the seed.
    pub probing_barrier: u64,
}

/// When a step happens, and what it is.
#[derive(Clone, Debug)]
pub struct Timed {
    /// Simulated time since the start.
    pub at: Duration,
    /// The step.
    pub step: Step,
}

/// One step of a schedule.
#[derive(Clone, Debug)]
pub enum Step {
    /// A change someone makes to the cluster's inputs.
    Change(Change),
    /// A fault.
    Fault(Fault),
}

/// A change to a Service or a workload, written by the world's client (never faulted).
#[derive(Clone, Debug)]
#[allow(missing_docs)] // the fields name what they hold; each variant's doc says what it does
pub enum Change {
    /// A new workload (a no-op if one of that name exists).
    CreateWorkload(WorkloadSpec),
    /// A workload deleted.
    DeleteWorkload { namespace: usize, name: String },
    /// Deleted and created again under the same name (a new uid).
    RecreateWorkload { namespace: usize, name: String },
    /// Its `app` label changed.
    Relabel {
        namespace: usize,
        name: String,
        app: usize,
    },
    /// Its IP changed.
    Readdress {
        namespace: usize,
        name: String,
        ip: u8,
    },
    /// Its Ready condition changed.
    Readiness {
        namespace: usize,
        name: String,
        ready: bool,
    },
    /// Its zone changed.
    Rezone {
        namespace: usize,
        name: String,
        zone: usize,
    },
    /// A Service's selector changed.
    Reselect {
        namespace: usize,
        service: usize,
        app: usize,
    },
    /// A Service's targetPort switched between the named port and a number.
    Retarget {
        namespace: usize,
        service: usize,
        numeric: bool,
    },
    /// A Service deleted (its slices go with it, as the garbage collector does) and created again
    /// after `after`.
    RecreateService {
        namespace: usize,
        service: usize,
        after: Duration,
    },
}

/// A workload to create.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// Index into [`NAMESPACES`].
    pub namespace: usize,
    /// Its name.
    pub name: String,
    /// Index into [`APPS`].
    pub app: usize,
    /// Last octet of its IPv4 address.
    pub ip: u8,
    /// Whether it also has an IPv6 address.
    pub dual_stack: bool,
    /// Ready condition.
    pub ready: bool,
    /// Index into [`ZONES`].
    pub zone: usize,
}

// === impl Options ===

impl Default for Options {
    fn default() -> Self {
        Self {
            replicas: 3,
            duration: Duration::from_secs(120),
            faults: 24,
            changes: 80,
            initial_workloads: 6,
            during_write: 3,
            view_faults: 4,
            server_faults: 4,
            instance_lag: Duration::from_secs(2),
            probing_barrier: 50,
        }
    }
}

impl Options {
    /// The defaults, with `SIM_SERVER_FAULTS` (a count), `SIM_INSTANCE_LAG_MS` (the second
    /// instance's largest lag; 0 for one instance) and `SIM_PROBING_PERCENT` from the
    /// environment when set: a replay or a
    /// sweep under other options. The second value says whether any was set.
    pub fn from_env() -> (Self, bool) {
        let read = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let mut options = Self::default();
        let faults = read("SIM_SERVER_FAULTS");
        let lag = read("SIM_INSTANCE_LAG_MS");
        let probing = read("SIM_PROBING_PERCENT");
        if let Some(faults) = faults {
            options.server_faults = usize::try_from(faults).unwrap_or(usize::MAX);
        }
        if let Some(lag) = lag {
            options.instance_lag = Duration::from_millis(lag);
        }
        if let Some(probing) = probing {
            options.probing_barrier = probing;
        }
        (
            options,
            faults.is_some() || lag.is_some() || probing.is_some(),
        )
    }

    /// The defaults from before the API server's own faults, its second instance and the
    /// probing barrier were scheduled. The seeds kept as regressions were found under these, and replay the runs
    /// that found them only here.
    pub fn before_server_faults() -> Self {
        Self {
            server_faults: 0,
            instance_lag: Duration::ZERO,
            probing_barrier: 0,
            ..Self::default()
        }
    }
}

// === impl Schedule ===

/// The initial workloads and the timed steps of one seed.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Created before the replicas start.
    pub initial: Vec<WorkloadSpec>,
    /// In time order.
    pub steps: Vec<Timed>,
}

impl Schedule {
    /// The schedule of `seed`.
    pub fn generate(rng: &mut Rng, options: &Options) -> Self {
        let mut own = rng.derive(1);
        let mut view = rng.derive(2);
        let mut server = rng.derive(3);
        let mut names = Names::default();
        let initial = (0..NAMESPACES.len())
            .flat_map(|namespace| (0..options.initial_workloads).map(move |_| namespace))
            .map(|namespace| names.new_workload(rng, namespace))
            .collect::<Vec<_>>();
        let mut steps = Vec::new();
        let span = options.duration.as_millis() as u64;
        for _ in 0..options.changes {
            let at = Duration::from_millis(rng.below(span));
            steps.push(Timed {
                at,
                step: Step::Change(names.change(rng)),
            });
        }
        for _ in 0..options.faults {
            // Faults start after the first leader is in place and leave room to heal.
            let at = Duration::from_millis(3_000 + rng.below(span.saturating_sub(3_000)));
            steps.push(Timed {
                at,
                step: Step::Fault(fault(rng)),
            });
        }
        for _ in 0..options.during_write {
            let at = Duration::from_millis(3_000 + own.below(span.saturating_sub(3_000)));
            let fault = if own.chance(50) {
                Fault::StopDuringNextWrite {
                    hold: own.millis(200, 3_000),
                    restart_after: own.millis(0, 10_000),
                }
            } else {
                Fault::PauseDuringNextWrite {
                    lasting: own.millis(1_000, 30_000),
                }
            };
            steps.push(Timed {
                at,
                step: Step::Fault(fault),
            });
        }
        for _ in 0..options.view_faults {
            let at = Duration::from_millis(3_000 + view.below(span.saturating_sub(3_000)));
            steps.push(Timed {
                at,
                step: Step::Fault(view_fault(&mut view)),
            });
        }
        for _ in 0..options.server_faults {
            let at = Duration::from_millis(3_000 + server.below(span.saturating_sub(3_000)));
            steps.push(Timed {
                at,
                step: Step::Fault(server_fault(&mut server)),
            });
        }
        steps.sort_by_key(|timed| timed.at);
        Self { initial, steps }
    }
}

/// The workload names a schedule has used, so changes mostly name workloads that exist.
#[derive(Default)]
struct Names {
    next: u32,
    workloads: BTreeMap<usize, Vec<String>>,
}

// === impl Names ===

impl Names {
    fn new_workload(&mut self, rng: &mut Rng, namespace: usize) -> WorkloadSpec {
        self.next += 1;
        let name = format!("vm-{}", self.next);
        self.workloads
            .entry(namespace)
            .or_default()
            .push(name.clone());
        WorkloadSpec {
            namespace,
            name,
            app: rng.index(APPS.len()),
            ip: u8::try_from(10 + rng.below(200)).unwrap_or(10),
            dual_stack: rng.chance(25),
            ready: rng.chance(80),
            zone: rng.index(ZONES.len()),
        }
    }

    fn existing(&mut self, rng: &mut Rng) -> (usize, String) {
        let namespace = rng.index(NAMESPACES.len());
        let names = self.workloads.entry(namespace).or_default();
        if names.is_empty() {
            return (namespace, "vm-0".to_string());
        }
        (namespace, rng.pick(names).clone())
    }

    fn change(&mut self, rng: &mut Rng) -> Change {
        let roll = rng.below(100);
        if roll < 15 {
            let namespace = rng.index(NAMESPACES.len());
            return Change::CreateWorkload(self.new_workload(rng, namespace));
        }
        let (namespace, name) = self.existing(rng);
        match roll {
            15..25 => Change::DeleteWorkload { namespace, name },
            25..32 => Change::RecreateWorkload { namespace, name },
            32..47 => Change::Relabel {
                namespace,
                name,
                app: rng.index(APPS.len()),
            },
            47..57 => Change::Readdress {
                namespace,
                name,
                ip: u8::try_from(10 + rng.below(200)).unwrap_or(10),
            },
            57..72 => Change::Readiness {
                namespace,
                name,
                ready: rng.chance(60),
            },
            72..80 => Change::Rezone {
                namespace,
                name,
                zone: rng.index(ZONES.len()),
            },
            80..88 => Change::Reselect {
                namespace,
                service: rng.index(SERVICES.len()),
                app: rng.index(APPS.len()),
            },
            88..94 => Change::Retarget {
                namespace,
                service: rng.index(SERVICES.len()),
                numeric: rng.chance(50),
            },
            _ => Change::RecreateService {
                namespace,
                service: rng.index(SERVICES.len()),
                after: rng.millis(0, 5_000),
            },
        }
    }
}

impl fmt::Display for Timed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>9.3}s {:?}", self.at.as_secs_f64(), self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_a_function_of_its_seed_and_holds_what_the_options_ask() {
        let options = Options::default();
        let one = Schedule::generate(&mut Rng::new(42), &options);
        let again = Schedule::generate(&mut Rng::new(42), &options);
        assert_eq!(format!("{:?}", one.steps), format!("{:?}", again.steps));
        let faults = one
            .steps
            .iter()
            .filter(|timed| matches!(timed.step, Step::Fault(_)))
            .count();
        assert_eq!(
            faults,
            options.faults + options.during_write + options.view_faults + options.server_faults
        );
        assert_eq!(
            one.steps.len(),
            options.faults
                + options.during_write
                + options.view_faults
                + options.server_faults
                + options.changes
        );
        assert!(one.steps.windows(2).all(|pair| pair[0].at <= pair[1].at));
        assert!(one.steps.iter().all(|timed| timed.at < options.duration));
        let other = Schedule::generate(&mut Rng::new(43), &options);
        assert_ne!(format!("{:?}", one.steps), format!("{:?}", other.steps));
    }

    #[test]
    fn the_server_faults_leave_the_rest_of_a_schedule_as_it_was() {
        let before = Options::before_server_faults();
        let with = Options::default();
        let old = Schedule::generate(&mut Rng::new(7), &before);
        let new = Schedule::generate(&mut Rng::new(7), &with);
        let server = |step: &Step| {
            matches!(
                step,
                Step::Fault(
                    Fault::CloseWatches { .. }
                        | Fault::RecreateBehindCompaction { .. }
                        | Fault::LagCache { .. }
                        | Fault::DeleteLeaseUnderPausedLeader { .. }
                        | Fault::RaceServiceRead { .. }
                        | Fault::RaceWorkloadRead { .. }
                )
            )
        };
        let rest: Vec<String> = new
            .steps
            .iter()
            .filter(|timed| !server(&timed.step))
            .map(ToString::to_string)
            .collect();
        let old: Vec<String> = old.steps.iter().map(ToString::to_string).collect();
        assert_eq!(rest, old);
        assert_eq!(
            new.steps.iter().filter(|timed| server(&timed.step)).count(),
            with.server_faults
        );
    }
}
