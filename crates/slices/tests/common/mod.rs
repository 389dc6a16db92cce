//! Shared helpers for the planner's table-driven tests.
#![allow(dead_code)] // each test file uses a different subset

use api::v1beta1::ExternalWorkload;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slices::testing::{SliceStore, Workload, time};
use slices::{Config, SlicePlan, plan_slices};

/// One named rule: state to converge first (if any), then the inputs of the pass under test.
pub struct Case {
    /// The rule, as the test's name.
    pub rule: &'static str,
    /// Service and workloads whose slices exist before the pass.
    pub before: Option<(Service, Vec<ExternalWorkload>)>,
    /// The Service of the pass.
    pub service: Service,
    /// The workloads of the pass.
    pub workloads: Vec<ExternalWorkload>,
    /// The configuration (default unless the rule is about it).
    pub config: Config,
    /// What the plan must look like, given the slices that existed.
    pub check: fn(&SlicePlan, &[&EndpointSlice]) -> Result<(), String>,
}

impl Case {
    pub fn new(
        rule: &'static str,
        service: impl Into<Service>,
        workloads: Vec<ExternalWorkload>,
        check: fn(&SlicePlan, &[&EndpointSlice]) -> Result<(), String>,
    ) -> Self {
        Case {
            rule,
            before: None,
            service: service.into(),
            workloads,
            config: Config::default(),
            check,
        }
    }

    pub fn after(mut self, service: impl Into<Service>, workloads: Vec<ExternalWorkload>) -> Self {
        self.before = Some((service.into(), workloads));
        self
    }

    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }
}

/// Plans with the default trigger time.
pub fn plan(
    service: &Service,
    workloads: &[ExternalWorkload],
    existing: &[&EndpointSlice],
    config: &Config,
) -> SlicePlan {
    let workloads: Vec<&ExternalWorkload> = workloads.iter().collect();
    plan_slices(service, &workloads, existing, config, &time(100))
}

/// A store holding the slices the planner writes for this state from scratch.
pub fn converge(service: &Service, workloads: &[ExternalWorkload], config: &Config) -> SliceStore {
    let mut store = SliceStore::default();
    let first = plan(service, workloads, &[], config);
    store.apply(&first);
    store
}

/// Runs every case; reports all failing rules at once, by name. Also checks, for every case,
/// that planning again over the applied result writes nothing.
pub fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in cases {
        let mut store = match &case.before {
            Some((service, workloads)) => converge(service, workloads, &case.config),
            None => SliceStore::default(),
        };
        let existing: Vec<EndpointSlice> = store.slices().into_iter().cloned().collect();
        let existing_refs: Vec<&EndpointSlice> = existing.iter().collect();
        let result = plan(&case.service, &case.workloads, &existing_refs, &case.config);
        if let Err(message) = (case.check)(&result, &existing_refs) {
            failures.push(format!("{}: {message}\nplan: {result:#?}", case.rule));
            continue;
        }
        store.apply(&result);
        let deleting = case.service.metadata.deletion_timestamp.is_some();
        let again = plan(
            &case.service,
            &case.workloads,
            &store.slices(),
            &case.config,
        );
        if !deleting && !again.is_empty() {
            failures.push(format!(
                "{}: second plan is not empty: {again:#?}",
                case.rule
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} rule(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Fails the check with a message when the condition does not hold.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

/// Workload names in a slice, in slice order.
pub fn workloads_in(slice: &EndpointSlice) -> Vec<String> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect()
}

/// All addresses in some slices.
pub fn addresses(slices: &[EndpointSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .flat_map(|e| e.addresses.clone())
        .collect()
}

/// Ports of a slice as (name, port, protocol).
pub fn ports(slice: &EndpointSlice) -> Vec<(String, i32, String)> {
    slice
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or_default(),
                p.protocol.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Names of some slices.
pub fn names(slices: &[EndpointSlice]) -> Vec<String> {
    slices
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

/// Names of existing slices.
pub fn existing_names(slices: &[&EndpointSlice]) -> Vec<String> {
    slices
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

/// The only endpoint of the plan's only created slice.
pub fn only_endpoint(
    plan: &SlicePlan,
) -> Result<&k8s_openapi::api::discovery::v1::Endpoint, String> {
    match plan.creates.as_slice() {
        [slice] => match slice.endpoints.as_deref().unwrap_or_default() {
            [endpoint] => Ok(endpoint),
            other => Err(format!("expected one endpoint, got {}", other.len())),
        },
        other => Err(format!("expected one create, got {}", other.len())),
    }
}

/// A workload selected by `web` whose only port is `http` 9090, where `vm` workloads serve
/// the default port: its endpoints belong in a slice of another port list.
pub fn on_port_9090(name: &str, ip: &str) -> ExternalWorkload {
    Workload::named(name)
        .label("app", "web")
        .ip(ip)
        .port("http", 9090)
        .build()
}
