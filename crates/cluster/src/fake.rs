//! Test doubles for the write path: a [`WriteApi`] that records every call and fails or ends
//! the term at exact calls, and a term whose fence tests can end.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::HashMap;

use k8s_openapi::api::{core::v1::ObjectReference, discovery::v1::EndpointSlice};
use kube::{core::Status, runtime::events::Event};
use leadership::{Fence, FenceMetrics, LeadershipSender, Term, fixed_leadership};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::writer::WriteApi;

/// Records every call as `"create <generateName>"`, `"replace <name>"`, `"delete <name>"` or
/// `"event <reason> <regarding name>"`; answers a call listed in `failures` with that HTTP
/// status, and after `end_term_after` calls ends the term (as a lost lease would, between two
/// calls of one pass).
#[derive(Default)]
pub struct FakeApi {
    calls: Mutex<Vec<String>>,
    failures: HashMap<String, u16>,
    end_term_after: Option<(usize, LeadershipSender)>,
}

/// A term that lasts until the test ends it, and its fence.
pub struct TestTerm {
    pub fence: Fence,
    sender: LeadershipSender,
}

// === impl FakeApi ===

impl FakeApi {
    /// Answers each of `calls` with its status.
    pub fn failing(calls: &[(&str, u16)]) -> Self {
        Self {
            failures: calls
                .iter()
                .map(|(call, code)| ((*call).into(), *code))
                .collect(),
            ..Self::default()
        }
    }

    /// Ends `term` right after the `calls`-th call (answered first).
    pub fn ending_term_after(calls: usize, term: &TestTerm) -> Self {
        Self {
            end_term_after: Some((calls, term.sender.clone())),
            ..Self::default()
        }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    fn answer(&self, call: String) -> Result<(), kube::Error> {
        let failure = self.failures.get(&call).copied();
        let count = {
            let mut calls = self.calls.lock();
            calls.push(call);
            calls.len()
        };
        if let Some((after, sender)) = &self.end_term_after
            && count == *after
        {
            sender.send_replace(None);
        }
        failure.map_or(Ok(()), |code| Err(status(code)))
    }
}

impl WriteApi for FakeApi {
    async fn create(
        &self,
        _namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
        self.answer(format!("create {prefix}"))?;
        let mut created = slice.clone();
        created.metadata.name = Some(format!("{prefix}x1"));
        created.metadata.generation = Some(1);
        created.metadata.resource_version = Some("1".into());
        Ok(created)
    }

    async fn replace(
        &self,
        _namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.answer(format!("replace {name}"))?;
        let mut updated = slice.clone();
        updated.metadata.generation = Some(2);
        updated.metadata.resource_version = Some("2".into());
        Ok(updated)
    }

    async fn delete(
        &self,
        _namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<(), kube::Error> {
        assert_eq!(uid, Some(format!("uid-{name}").as_str()), "delete by UID");
        self.answer(format!("delete {name}"))
    }

    async fn publish_event(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let name = regarding.name.as_deref().unwrap_or_default();
        self.answer(format!("event {} {name}", event.reason))
    }
}

/// An API error with HTTP status `code`.
pub fn status(code: u16) -> kube::Error {
    kube::Error::Api(
        Status::failure("injected", "Injected")
            .with_code(code)
            .boxed(),
    )
}

// === impl TestTerm ===

impl TestTerm {
    /// A term of an hour whose fence allows writes until [`TestTerm::end`].
    pub fn new() -> Self {
        let term = Term::new(Instant::now(), std::time::Duration::from_secs(3600));
        let (sender, leadership) = fixed_leadership(term.clone());
        let fence = Fence::new(
            term,
            leadership,
            std::time::Duration::ZERO,
            FenceMetrics::default(),
        );
        Self { fence, sender }
    }

    /// Ends the term, as a lost lease does.
    pub fn end(&self) {
        self.sender.send_replace(None);
    }
}
