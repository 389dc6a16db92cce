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
//!    them after every removal published for the Service: read from the API server after the
//!    plan ([`Admission::Confirm`], [`crate::confirm`]). The watermarks ([`Marks`]: how far each
//!    kind's watch has read) show only that a watch has read up to some past point; a change
//!    just after it, with a removal published since, would otherwise be put back. One case needs
//!    no read: while this term has not yet written the Service's slices, it has published no
//!    removal for it, and every removal an earlier term published is older than the acquisition
//!    point; caches that show the Service and the added workloads at one point past it vouch for
//!    the addition ([`View::caches_vouch`]). A new term's replay, the initial publish included,
//!    then costs its writes alone.
//!
//! [`admit`] is that decision; the reconcile acts on its answer and counts every wait under one
//! [`Wait`] reason.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use slices::{CachedWorkload, Token};

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
    /// How far each kind's watch had read before the pass read the caches.
    pub marks: Marks,
    /// The resourceVersion of the Service as the pass read it.
    pub service_version: Option<&'a Token>,
    /// This term has written the Service's slices (a write answered, or of unknown outcome).
    pub written: bool,
}

/// Who vouched for an addition: the `by` label of `external_endpoints_additions_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the label values operators query, in snake case
pub enum Vouched {
    /// The caches: the Service and the added workloads unchanged since both watches' marks.
    caches,
    /// Reads from the API server after the plan ([`crate::confirm`]).
    reads,
}

/// Label set with a [`Vouched`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VouchedLabels {
    /// By whom.
    pub by: Vouched,
}

// === impl View ===

impl View<'_> {
    /// Whether the caches alone vouch for the additions: this term has not yet written the
    /// Service's slices, and the caches show the Service and every added workload at one point
    /// ([`View::one_point`]).
    ///
    /// That point is past every removal published for the Service: this term has published
    /// none (only a write publishes), and one published by an earlier term landed before this
    /// term acquired the Lease, so before the acquisition point that every watermark has reached
    /// (clause 1). An addition as the API server had it at that point puts back nothing
    /// published; a change after it is published once the caches read it, as any change is.
    pub fn caches_vouch(&self) -> bool {
        !self.written && self.one_point()
    }

    /// Whether the caches show the Service and every added workload as the API server had them
    /// at one point: all are unchanged since the lower of the Service and workload watermarks.
    /// Each cache holds every change of its kind up to its watermark (a watch delivers in order,
    /// a re-list is a consistent read, and a watermark is raised only once what it vouches for
    /// is in the cache), so an object of a version at or below that point was, at that point, as
    /// the cache holds it. Not so when one kind's watch is ahead of the other's with a change the
    /// other has not read: a selector that re-selects a workload whose deletion the workload
    /// watch has not read, or a label the Service's new selector no longer takes.
    pub fn one_point(&self) -> bool {
        let point = self.marks.services.min(self.marks.workloads);
        let unchanged = |version: Option<&Token>| matches!(version, Some(Token::Number(version)) if *version <= point);
        unchanged(self.service_version)
            && self
                .added
                .iter()
                .all(|workload| unchanged(workload.resource_version.as_ref()))
    }
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
/// Clause 3: an addition is written after reads of the Service (same uid, same selector) and of
/// the added workloads (same uid, still selected) agree with the view: the Service selects the
/// workload as of now. Never a newer Service combined with an older workload (a selector change
/// that re-selects a workload deleted just before it), nor an addition by a selector the Service
/// has left, nor a workload relabelled out of it a moment ago. Without reads only while the
/// caches vouch ([`View::caches_vouch`]).
pub fn admit<'a>(view: &View<'a>) -> Admission<'a> {
    if view.unresolved_write {
        return Admission::ReadBack;
    }
    if view.added.is_empty() || view.caches_vouch() {
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

    /// A cached workload of resourceVersion `version` ("": none).
    fn workload(name: &str, version: &str) -> CachedWorkload {
        let mut workload = vm(name, "10.0.0.1").build();
        workload.metadata.resource_version = (!version.is_empty()).then(|| version.to_string());
        CachedWorkload::from(&workload)
    }

    fn marks(services: u64, workloads: u64) -> Marks {
        Marks {
            services,
            workloads,
            slices: 0,
        }
    }

    #[test]
    fn admission_by_clause() {
        // (added workloads, a write unresolved, what must be read: None to write, or the
        // Service and these workloads); no watermark vouches here (all 0)
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
        let service_version = Token::parse("7");
        for (index, (added, unresolved, expected)) in rows.iter().enumerate() {
            let workloads: Vec<CachedWorkload> =
                added.iter().map(|name| workload(name, "5")).collect();
            let view = View {
                unresolved_write: *unresolved,
                added: workloads.iter().collect(),
                marks: Marks::default(),
                service_version: Some(&service_version),
                written: false,
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

    #[test]
    fn the_caches_vouch_for_an_addition_only_at_one_point_before_the_terms_first_write() {
        // (Service and workload watermarks, the Service's version, the added workloads'
        // versions, whether the caches show them at one point)
        type Row = ((u64, u64), &'static str, &'static [&'static str], bool);
        let rows: &[Row] = &[
            // A replay over quiet caches: everything older than both watermarks.
            ((100, 100), "40", &["50", "60"], true),
            // At the point itself.
            ((100, 90), "90", &["90"], true),
            // The Service changed past the workload watch's mark (a selector that re-selects a
            // workload whose deletion the workload watch has not read).
            ((120, 100), "110", &["50"], false),
            // A workload changed past the Service watch's mark (a label the Service's new
            // selector, not yet read, no longer takes).
            ((100, 120), "40", &["50", "110"], false),
            // A version that is not a number, or none, vouches for nothing.
            ((100, 100), "40", &["x1"], false),
            ((100, 100), "", &["50"], false),
            ((100, 100), "40", &[""], false),
            // Nothing read yet.
            ((0, 0), "40", &["50"], false),
        ];
        for (index, ((services, workloads), service, added, one_point)) in rows.iter().enumerate() {
            let cached: Vec<CachedWorkload> = added
                .iter()
                .enumerate()
                .map(|(n, version)| workload(&format!("vm-{n}"), version))
                .collect();
            let service_version = (!service.is_empty()).then(|| Token::parse(service));
            for written in [false, true] {
                let view = View {
                    unresolved_write: false,
                    added: cached.iter().collect(),
                    marks: marks(*services, *workloads),
                    service_version: service_version.as_ref(),
                    written,
                };
                assert_eq!(view.one_point(), *one_point, "row {index}");
                // Once this term wrote the Service's slices, every addition is read.
                let admission = admit(&view);
                assert_eq!(
                    admission == Admission::Write,
                    *one_point && !written,
                    "row {index}, written {written}: {admission:?}"
                );
            }
        }
    }
}
