//! Test doubles for the write path: a [`WriteApi`] that records every call and fails or ends
//! the term at exact calls, optionally backed by a [`SliceServer`] that stores what it accepts
//! and echoes it through a slice watch; and a term whose fence tests can end.
//!
//! The in-process harness of the cluster core ([`harness`]) puts these together with the real
//! caches, handlers, reconcile and leadership runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

pub mod harness;
pub mod server;

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::{core::v1::ObjectReference, discovery::v1::EndpointSlice};
use kube::{api::Preconditions, core::Status, runtime::events::Event};
use leadership::{
    Fence,
    testing::{self, LeadershipSender},
};
use parking_lot::Mutex;
use tokio::time::Instant;

pub use self::server::{SliceEvent, SliceServer};
use crate::writer::WriteApi;

/// Records every call as `"create <generateName>"`, `"replace <name>"`, `"delete <name>"` or
/// `"event <reason> <regarding name>"` (and each delete's preconditions); answers a call listed
/// in `failures` with that HTTP status, and after `end_term_after` calls ends the term (as a
/// lost lease would, between two calls of one pass).
///
/// Without a server, a create answers `<generateName>x1` at resourceVersion 1 and an update
/// resourceVersion 2; with one ([`FakeApi::backed_by`]), the server decides, as the API would.
#[derive(Default)]
pub struct FakeApi {
    calls: Mutex<Vec<String>>,
    preconditions: Mutex<Vec<(String, Preconditions)>>,
    failures: Mutex<HashMap<String, (u16, String)>>,
    end_term_after: Mutex<Option<(usize, LeadershipSender)>>,
    server: Option<Arc<SliceServer>>,
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
        let api = Self::default();
        for (call, code) in calls {
            api.fail(call, *code);
        }
        api
    }

    /// Ends `term` right after the `calls`-th call (answered first).
    pub fn ending_term_after(calls: usize, term: &TestTerm) -> Self {
        let api = Self::default();
        api.end_term_after(calls, term.sender.clone());
        api
    }

    /// Sends every write to `server`, which stores it or refuses it as the API server would.
    pub fn backed_by(server: Arc<SliceServer>) -> Self {
        Self {
            server: Some(server),
            ..Self::default()
        }
    }

    /// From now on, answers `call` with HTTP status `code`, without sending it on.
    pub fn fail(&self, call: &str, code: u16) {
        self.failures
            .lock()
            .insert(call.into(), (code, "injected".into()));
    }

    /// From now on, answers `call` as the API server's fencing policy refuses a replica that
    /// does not hold the Lease (403, [`leadership::FENCING_POLICY_DENIAL`]).
    pub fn deny_as_not_holder(&self, call: &str) {
        let message = format!(
            "ValidatingAdmissionPolicy 'fencing' with binding 'fencing' denied request: \
             'replica-a' {} ns/lease",
            leadership::FENCING_POLICY_DENIAL
        );
        self.failures.lock().insert(call.into(), (403, message));
    }

    /// Ends the term published through `sender` right after the `calls`-th call from now
    /// (answered first).
    pub fn end_term_after(&self, calls: usize, sender: LeadershipSender) {
        let at = self.calls.lock().len() + calls;
        *self.end_term_after.lock() = Some((at, sender));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    /// The preconditions each delete of `name` carried, in order.
    pub fn delete_preconditions(&self, name: &str) -> Vec<Preconditions> {
        let sent = self.preconditions.lock();
        sent.iter()
            .filter(|(deleted, _)| deleted == name)
            .map(|(_, preconditions)| preconditions.clone())
            .collect()
    }

    fn answer(&self, call: String) -> Result<(), kube::Error> {
        let failure = self.failures.lock().get(&call).cloned();
        let count = {
            let mut calls = self.calls.lock();
            calls.push(call);
            calls.len()
        };
        let mut end_term_after = self.end_term_after.lock();
        if end_term_after.as_ref().is_some_and(|(at, _)| count == *at)
            && let Some((_, sender)) = end_term_after.take()
        {
            sender.send_replace(None);
        }
        failure.map_or(Ok(()), |(code, message)| Err(status_with(code, &message)))
    }
}

impl WriteApi for FakeApi {
    async fn create(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
        self.answer(format!("create {prefix}"))?;
        if let Some(server) = &self.server {
            return server.create(namespace, slice);
        }
        let mut created = slice.clone();
        created.metadata.name = Some(format!("{prefix}x1"));
        created.metadata.generation = Some(1);
        created.metadata.resource_version = Some("1".into());
        Ok(created)
    }

    async fn replace(
        &self,
        namespace: &str,
        slice: &EndpointSlice,
    ) -> Result<EndpointSlice, kube::Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.answer(format!("replace {name}"))?;
        if let Some(server) = &self.server {
            return server.replace(namespace, slice);
        }
        let mut updated = slice.clone();
        updated.metadata.generation = Some(2);
        updated.metadata.resource_version = Some("2".into());
        Ok(updated)
    }

    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<(), kube::Error> {
        self.preconditions
            .lock()
            .push((name.to_string(), preconditions.clone()));
        self.answer(format!("delete {name}"))?;
        match &self.server {
            Some(server) => server.delete(namespace, name, preconditions),
            None => Ok(()),
        }
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
    status_with(code, "injected")
}

/// An API error with HTTP status `code` and `message`.
pub fn status_with(code: u16, message: &str) -> kube::Error {
    kube::Error::Api(Status::failure(message, "Injected").with_code(code).boxed())
}

// === impl TestTerm ===

impl TestTerm {
    /// A term of an hour whose fence allows writes until [`TestTerm::end`].
    pub fn new() -> Self {
        let term = testing::term(Instant::now(), std::time::Duration::from_secs(3600));
        let (sender, leadership) = testing::leadership(Some(term.clone()));
        let fence = testing::fence(term, leadership, std::time::Duration::ZERO);
        Self { fence, sender }
    }

    /// Ends the term, as a lost lease does.
    pub fn end(&self) {
        self.sender.send_replace(None);
    }
}
