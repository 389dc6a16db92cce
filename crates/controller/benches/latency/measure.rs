//! What the latency bench reads besides its own watch: the CPU time of processes from `/proc`,
//! and histograms from the leader's `/metrics` (Prometheus text).

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ), from `getconf CLK_TCK`.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}

/// User + system CPU seconds of process `pid` so far (0 when it is gone or unknown).
pub fn cpu_seconds(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else {
        return 0.0;
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it start at field 3.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15.
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(14 - 3), ticks(15 - 3)) {
        (Some(user), Some(system)) => (user + system) / clock_ticks(),
        _ => 0.0,
    }
}

/// The processes whose CPU a phase reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct Processes {
    /// The leading controller (none in a raw phase).
    pub leader: Option<u32>,
    /// kube-apiserver.
    pub apiserver: Option<u32>,
    /// etcd.
    pub etcd: Option<u32>,
}

/// CPU seconds of [`Processes`], of this bench process and of the whole machine, at one
/// moment or over a phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub leader: f64,
    pub apiserver: f64,
    pub etcd: f64,
    /// This bench process (the change generator, the raw client, the watch).
    pub bench: f64,
    /// Every CPU of the machine, busy time (`/proc/stat`).
    pub machine: f64,
}

// === impl Processes ===

impl Processes {
    /// Their CPU time so far.
    pub fn cpu(&self) -> Cpu {
        Cpu {
            leader: cpu_seconds(self.leader),
            apiserver: cpu_seconds(self.apiserver),
            etcd: cpu_seconds(self.etcd),
            bench: cpu_seconds(Some(std::process::id())),
            machine: machine_busy_seconds(),
        }
    }
}

// === impl Cpu ===

impl Cpu {
    /// What was spent since `before`.
    pub fn since(&self, before: &Cpu) -> Cpu {
        Cpu {
            leader: self.leader - before.leader,
            apiserver: self.apiserver - before.apiserver,
            etcd: self.etcd - before.etcd,
            bench: self.bench - before.bench,
            machine: self.machine - before.machine,
        }
    }

    /// CPU time of everything else on the machine (other processes: another build, another
    /// bench), over a phase.
    pub fn others(&self) -> f64 {
        (self.machine - self.leader - self.apiserver - self.etcd - self.bench).max(0.0)
    }
}

/// Busy CPU seconds of the whole machine so far: user, nice, system, irq, softirq and steal
/// time of the `cpu` line of `/proc/stat`.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else {
        return 0.0;
    };
    let fields: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| fields.get(i))
        .sum();
    busy / clock_ticks()
}

/// The cumulative buckets of histogram `name` whose series contain `labels`: (upper bound,
/// observations at or below it), by bound; `+Inf` last.
pub fn buckets(body: &str, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut found: Vec<(f64, f64)> = body
        .lines()
        .filter(|line| line.starts_with(&prefix) && line.contains(labels))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let bound = series.split("le=\"").nth(1)?.split('"').next()?;
            let bound = match bound {
                "+Inf" => f64::INFINITY,
                other => other.parse().ok()?,
            };
            Some((bound, value.parse().ok()?))
        })
        .collect();
    found.sort_by(|a, b| a.0.total_cmp(&b.0));
    found
}

/// The observations of `after` not in `before` (two scrapes of the same histogram).
pub fn delta(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(bound, count)| {
            let earlier = before
                .iter()
                .find(|(b, _)| b == bound)
                .map_or(0.0, |(_, c)| *c);
            (*bound, count - earlier)
        })
        .collect()
}

/// Observations in cumulative `buckets`.
pub fn total(buckets: &[(f64, f64)]) -> f64 {
    buckets.last().map_or(0.0, |(_, count)| *count)
}

/// The `q` quantile of cumulative `buckets`, interpolated inside its bucket as Prometheus'
/// `histogram_quantile` does (the lower bound of the `+Inf` bucket when it falls there).
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let total = total(buckets);
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(upper, count) in buckets {
        if count >= rank {
            if upper.is_infinite() {
                return lower;
            }
            let inside = count - below;
            let share = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return lower + (upper - lower) * share;
        }
        (lower, below) = (upper, count);
    }
    lower
}
