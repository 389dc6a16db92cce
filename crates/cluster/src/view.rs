//! The fresh-view rule, decided in one step (docs/architecture.md, "A fresh view").
//!
//! A pass for a Service may write only if every kind it reads has been read at least up to
//!
//! 1. the term's acquisition point: held by the acquisition barrier ([`crate::watch::fresh`]),
//!    which runs before the term's replay, so no pass of the term runs before it;
//! 2. the pass's own last write for that Service: each answer enters the slice cache at once
//!    ([`crate::writer`]), and a write whose outcome is unknown holds the Service until a
//!    consistent read of its slices is in the cache ([`Admission::ReadBack`]);
//! 3. for an endpoint the pass adds, the Service and the added workloads as the API server has
//!    them now: read after the plan ([`Admission::Confirm`], [`crate::confirm`]). The watermarks
//!    ([`Marks`]: how far each kind's watch has read) can only show that a watch has read up to
//!    some past point, never up to now; a selector change or a relabel just after that point,
//!    with a published removal before it, would otherwise be put back.
//!
//! [`admit`] is that decision; the reconcile acts on its answer and counts every wait under one
//! [`Wait`] reason.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use slices::CachedWorkload;

/// Why a pass did not write, or a term did not yet replay: the `reason` label of
/// `external_endpoints_view_waits_total` and the `wait` field of the reconcile's log line.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the label values operators query, in snake case
pub enum Wait {
    /// Clause 1: a new term's caches were brought up to its acquisition point before the replay
    /// (counted once per term).
    acquiring,
    /// Clause 3: the API server's answer to an addition's reads disagreed with the view, while
    /// a watch that lost its stream had not yet caught up.
    lost_watch,
    /// Clause 2: a write of this Service's slices had an unknown outcome (or met a 409); its
    /// slices were read back before planning again.
    own_writes,
    /// Clause 3: the API server no longer has the Service selecting a workload the pass would add
    /// (one watch behind another, or behind the API server).
    unconfirmed,
}

impl Wait {
    /// Every reason, in the order the docs list them.
    pub const ALL: [Wait; 4] = [
        Wait::acquiring,
        Wait::lost_watch,
        Wait::own_writes,
        Wait::unconfirmed,
    ];
}

/// Label set with a [`Wait`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// Why.
    pub reason: Wait,
}

/// How far each kind's watch has read (0: nothing, or a version that is not a number): each
/// cache holds at least everything up to its watermark. The acquisition barrier raises them
/// (clause 1); a pass that waits on clause 3 logs them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Services.
    pub services: u64,
    /// ExternalWorkloads.
    pub workloads: u64,
    /// Managed EndpointSlices (our own answers enter the cache per object, not here: an answer
    /// says nothing of other Services' slices).
    pub slices: u64,
}

/// What a pass read, as [`admit`] needs it.
#[derive(Debug)]
pub struct View<'a> {
    /// A write of ours for this Service has an outcome not yet read back (clause 2).
    pub unresolved_write: bool,
    /// The workloads the plan adds to the Service's slices (none held there yet).
    pub added: Vec<&'a CachedWorkload>,
}

/// What [`admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<'a> {
    /// The view satisfies the rule: write the plan.
    Write,
    /// Clause 2: read the Service's slices back from the API server, then plan again.
    ReadBack,
    /// Clause 3: read these from the API server first, and write only if they agree with the
    /// view.
    Confirm {
        /// Read the Service (its uid and selector must be unchanged).
        service: bool,
        /// Read these added workloads (each must exist with the same uid, still selected).
        workloads: Vec<&'a CachedWorkload>,
    },
}

/// Decides whether a pass with this view may write (module docs).
///
/// Clause 3: an addition is written only after reads of the Service (same uid, same selector)
/// and of the added workloads (same uid, still selected) agree with the view: the Service
/// selects the workload as of now. Never a newer Service combined with an older workload (a
/// selector change that re-selects a workload deleted just before it), nor an addition by a
/// selector the Service has left, nor a workload relabelled out of it a moment ago.
pub fn admit<'a>(view: &View<'a>) -> Admission<'a> {
    if view.unresolved_write {
        return Admission::ReadBack;
    }
    if view.added.is_empty() {
        return Admission::Write;
    }
    Admission::Confirm {
        service: true,
        workloads: view.added.clone(),
    }
}

#[cfg(test)]
mod tests {
    use slices::testing::vm;

    use super::*;

    fn workload(name: &str) -> CachedWorkload {
        CachedWorkload::from(&vm(name, "10.0.0.1").build())
    }

    #[test]
    fn admission_by_clause() {
        // (added workloads, a write unresolved, what must be read: None to write, or the
        // Service and these workloads)
        type Row = (
            &'static [&'static str],
            bool,
            Option<&'static [&'static str]>,
        );
        let rows: &[Row] = &[
            // Nothing added: only clause 2 can hold a pass.
            (&[], false, None),
            // An addition: the Service and every added workload are read.
            (&["vm-1"], false, Some(&["vm-1"])),
            (&["vm-1", "vm-2"], false, Some(&["vm-1", "vm-2"])),
            // Clause 2 first: an unresolved write is read back before anything else.
            (&["vm-1"], true, None),
            (&[], true, None),
        ];
        for (index, (added, unresolved, expected)) in rows.iter().enumerate() {
            let workloads: Vec<CachedWorkload> = added.iter().map(|name| workload(name)).collect();
            let view = View {
                unresolved_write: *unresolved,
                added: workloads.iter().collect(),
            };
            let admission = admit(&view);
            let expected = match (unresolved, expected) {
                (true, _) => Admission::ReadBack,
                (false, None) => Admission::Write,
                (false, Some(names)) => Admission::Confirm {
                    service: true,
                    workloads: workloads
                        .iter()
                        .filter(|workload| names.contains(&&*workload.name))
                        .collect(),
                },
            };
            assert_eq!(admission, expected, "row {index}");
        }
    }
}
