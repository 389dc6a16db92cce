//! CREATE, UPDATE, PATCH and DELETE, with the API server's rules for system fields,
//! preconditions, `generation`, the `status` subresource, no-op updates (answered, not written)
//! and finalizers (a delete of an object that has some marks it deleting; the update that
//! empties them deletes it).

use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Answer, Call, Failure, json_response, parse, timestamp, validate};
use crate::{
    Applied, CacheView, Inner, Verb, WriteRequest, convert,
    kinds::Resource,
    patch::{PatchType, Refusal},
    store::Key,
};

/// Metadata an update cannot change: it is kept from the stored object.
const SYSTEM_FIELDS: [&str; 7] = [
    "uid",
    "creationTimestamp",
    "name",
    "namespace",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

impl Call<'_> {
    pub(super) fn create(&self, mut object: Value) -> Answer {
        let resource = self.resource();
        self.check_type(&object)?;
        validate::sent(resource, &object, None)?;
        object = resource.stored(object);
        let namespace = self.target.namespace.clone();
        if let Some(sent) = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            && namespace.as_deref() != Some(sent)
            && resource.namespaced
        {
            return Err(Failure { code: 400, reason: "BadRequest", message: "the namespace of the provided object does not match the namespace sent on the request".to_string() });
        }
        if object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|version| !version.is_empty())
        {
            return Err(Failure {
                code: 400,
                reason: "BadRequest",
                message: "resourceVersion should not be set on objects to be created".to_string(),
            });
        }
        let mut store = self.inner.store.lock();
        let name = match object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
        {
            Some(name) => name.to_string(),
            None => match object
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .filter(|prefix| !prefix.is_empty())
            {
                Some(prefix) => format!("{prefix}{}", store.name_suffix()),
                None => {
                    return Err(validate::invalid(
                        resource,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        let key = self.key(&name);
        if object
            .get("metadata")
            .is_none_or(|metadata| !metadata.is_object())
        {
            object["metadata"] = json!({});
        }
        object["metadata"]["name"] = Value::from(name.clone());
        if let Some(namespace) = &namespace {
            object["metadata"]["namespace"] = Value::from(namespace.clone());
        }
        // Validation comes before the name is looked up: an invalid body is 422 even when
        // its name is taken.
        validate::validate(resource, &name, &object)?;
        if store.objects.contains_key(&key) {
            return Err(Failure {
                code: 409,
                reason: "AlreadyExists",
                message: format!("{} \"{name}\" already exists", self.qualified()),
            });
        }
        if resource.status
            && resource.plural != "namespaces"
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
        let metadata = object
            .as_object_mut()
            .map(|map| map.entry("metadata").or_insert_with(|| json!({})));
        if let Some(metadata) = metadata {
            metadata["name"] = Value::from(name.clone());
            if let Some(namespace) = &namespace {
                metadata["namespace"] = Value::from(namespace.clone());
            }
            metadata["uid"] = Value::from(store.next_uid());
            metadata["creationTimestamp"] = Value::from(timestamp(self.inner));
            if resource.generation {
                metadata["generation"] = Value::from(1);
            }
            if let Some(metadata) = metadata.as_object_mut() {
                // A new object is not being deleted, whatever it says.
                metadata.remove("deletionTimestamp");
                metadata.remove("deletionGracePeriodSeconds");
            }
        }
        if resource.plural == "services" {
            let cluster_ip = store.next_cluster_ip();
            convert::default_service(&mut object, &cluster_ip);
        }
        drop(store);
        self.apply(Verb::Create, key, Some(object), StatusCode::CREATED)
    }

    pub(super) fn update(&self, sent: Value) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        if let Some(body_name) = sent.pointer("/metadata/name").and_then(Value::as_str)
            && body_name != name
        {
            return Err(Failure {
                code: 400,
                reason: "BadRequest",
                message: "the name of the object does not match the name on the URL".to_string(),
            });
        }
        self.check_type(&sent)?;
        let stored = self.resource().stored(sent.clone());
        self.replace(&name, stored, Some(&sent))
    }

    pub(super) fn patch(&self, body: &[u8]) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        let content_type = self
            .parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        let refused = |refusal: Refusal| match refusal {
            Refusal::Unsupported(message) => Failure {
                code: 415,
                reason: "UnsupportedMediaType",
                message,
            },
            Refusal::Invalid(message) => Failure {
                code: 422,
                reason: "Invalid",
                message,
            },
            Refusal::Malformed(message) => Failure {
                code: 400,
                reason: "BadRequest",
                message,
            },
        };
        let patch_type = PatchType::of(content_type, self.resource().custom()).map_err(refused)?;
        let current = {
            let store = self.inner.store.lock();
            store
                .objects
                .get(&self.key(&name))
                .cloned()
                .ok_or_else(|| self.not_found(&name))?
        };
        let served = self.resource().served(current);
        let patched = patch_type.apply(&served, body).map_err(refused)?;
        self.replace(
            &name,
            self.resource().stored(patched.clone()),
            Some(&patched),
        )
    }

    /// An update of `name` to `sent` (stored form; `as_sent` in the request's version), guarded
    /// by the sent resourceVersion and uid.
    fn replace(&self, name: &str, mut sent: Value, as_sent: Option<&Value>) -> Answer {
        let resource = self.resource();
        let key = self.key(name);
        let store = self.inner.store.lock();
        let current = store.objects.get(&key).cloned();
        drop(store);
        let Some(current) = current else {
            return self.create_on_update(name, sent);
        };
        let current_version = current
            .pointer("/metadata/resourceVersion")
            .cloned()
            .unwrap_or_default();
        if let Some(version) = sent
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|version| !version.is_empty())
            && Some(version) != current_version.as_str()
        {
            return Err(self.conflict(name, "the object has been modified; please apply your changes to the latest version and try again"));
        }
        let current_uid = current
            .pointer("/metadata/uid")
            .cloned()
            .unwrap_or_default();
        if let Some(uid) = sent
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .filter(|uid| !uid.is_empty())
            && Some(uid) != current_uid.as_str()
        {
            return Err(self.conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current_uid.as_str().unwrap_or_default()
                ),
            ));
        }
        if resource.group == "events.k8s.io" {
            validate::events_update(resource, name, &current, &sent)?;
        }
        if !self.target.status
            && let Some(as_sent) = as_sent
        {
            // After the preconditions, as on the real server (a stale update is 409 first).
            validate::sent(resource, as_sent, Some(&resource.served(current.clone())))?;
        }
        if self.target.status {
            // Only the status changes through /status.
            let status = sent.get("status").cloned();
            sent = current.clone();
            set_or_remove(&mut sent, "status", status);
        } else if resource.status {
            // The main resource keeps its status.
            set_or_remove(&mut sent, "status", current.get("status").cloned());
        }
        if sent
            .get("metadata")
            .is_none_or(|metadata| !metadata.is_object())
        {
            sent["metadata"] = json!({});
        }
        for field in SYSTEM_FIELDS {
            let kept = current["metadata"].get(field).cloned();
            if let Some(metadata) = sent["metadata"].as_object_mut() {
                match kept {
                    Some(value) => metadata.insert(field.to_string(), value),
                    None => metadata.remove(field),
                };
            }
        }
        sent["metadata"]["resourceVersion"] = current_version;
        let deleting = current.pointer("/metadata/deletionTimestamp").is_some();
        let (before, after) = (finalizers(&current), finalizers(&sent));
        if deleting && after.iter().any(|finalizer| !before.contains(finalizer)) {
            return Err(validate::invalid(
                resource,
                name,
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
            ));
        }
        // Compared as the request's version shows them (a field that version prunes is no
        // change of it, as on the real server).
        if resource.generation
            && validate::changed_beyond_metadata(
                resource,
                &resource.served(current.clone()),
                &resource.served(sent.clone()),
            )
        {
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            sent["metadata"]["generation"] = Value::from(generation + 1);
        }
        validate::validate(resource, name, &sent)?;
        if self.inner.config.skip_unchanged_writes
            && without_empty_finalizers(&sent) == without_empty_finalizers(&current)
        {
            // Nothing changed: the real server answers the stored object and writes nothing.
            return Ok(json_response(StatusCode::OK, &resource.served(current)));
        }
        let verb = if self.parts.method == Method::PATCH {
            Verb::Patch
        } else {
            Verb::Update
        };
        if deleting && after.is_empty() {
            // The last finalizer is gone: the object is deleted, and answered as updated.
            return self
                .apply(verb, key, None, StatusCode::OK)
                .map(|_| json_response(StatusCode::OK, &resource.served(sent)));
        }
        self.apply(verb, key, Some(sent), StatusCode::OK)
    }

    pub(super) fn delete(&self, body: &[u8]) -> Answer {
        let name = self.target.name.clone().unwrap_or_default();
        let key = self.key(&name);
        let options = if body.is_empty() {
            json!({})
        } else {
            parse(body)?
        };
        let store = self.inner.store.lock();
        let current = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(&name))?;
        drop(store);
        for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let wanted = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str);
            let actual = current["metadata"][field].as_str().unwrap_or_default();
            if let Some(wanted) = wanted
                && wanted != actual
            {
                return Err(self.conflict(&name, &format!("Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}")));
            }
        }
        let resource = self.resource();
        let mut held = finalizers(&current);
        let policy = options.get("propagationPolicy").and_then(Value::as_str);
        for (wanted, finalizer) in [("Orphan", "orphan"), ("Foreground", "foregroundDeletion")] {
            if policy == Some(wanted) && !held.iter().any(|held| held == finalizer) {
                held.push(finalizer.to_string());
            }
        }
        if held.is_empty() {
            let answer = self.apply(Verb::Delete, key, None, StatusCode::OK)?;
            // A refusal (the admission hook: the fencing policy) is the answer, and nothing
            // was deleted (simulation seed 56762: a deposed leader's delete answered 200, kept
            // as a tombstone in its cache, and the slice stayed).
            if !answer.status().is_success() {
                return Ok(answer);
            }
            let revision = self.inner.store.lock().revision;
            return Ok(json_response(
                StatusCode::OK,
                &deleted(resource, &current, revision),
            ));
        }
        // Finalizers hold it: it is marked deleting (once) and stays until they are removed.
        let mut deleting = current.clone();
        deleting["metadata"]["finalizers"] = json!(held);
        if current.pointer("/metadata/deletionTimestamp").is_none() {
            deleting["metadata"]["deletionTimestamp"] = Value::from(timestamp(self.inner));
            deleting["metadata"]["deletionGracePeriodSeconds"] = Value::from(0);
            if let Some(generation) = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .filter(|generation| *generation > 0)
            {
                deleting["metadata"]["generation"] = Value::from(generation + 1);
            }
        }
        if deleting == current {
            return Ok(json_response(StatusCode::OK, &resource.served(current)));
        }
        self.apply(Verb::Delete, key, Some(deleting), StatusCode::OK)
    }

    /// Admission, the write, then the observers; the answer is the stored object.
    fn apply(&self, verb: Verb, key: Key, object: Option<Value>, code: StatusCode) -> Answer {
        let resource = self.resource();
        let request = WriteRequest {
            caller: self.caller.to_string(),
            verb,
            group: resource.group.to_string(),
            plural: resource.plural.to_string(),
            namespace: self.target.namespace.clone(),
            name: key.3.clone(),
            object: object.clone(),
            cache: CacheView {
                inner: Arc::downgrade(self.inner),
                instance: self.instance,
            },
        };
        let admission = self.inner.admission.lock().clone();
        if let Some(admission) = admission
            && let Err(refused) = admission(&request)
        {
            return Ok(json_response(
                StatusCode::from_u16(refused.code).unwrap_or(StatusCode::FORBIDDEN),
                &serde_json::to_value(&refused).unwrap_or_default(),
            ));
        }
        let (_, _, new) = commit_and_announce(self.inner, self.caller, verb, resource, key, object);
        if crate::faults::take_lost_answer(self.inner, self.caller, resource, verb) {
            self.lost.set(true);
        }
        Ok(json_response(
            code,
            &new.map(|new| resource.served(new)).unwrap_or_default(),
        ))
    }
}

impl Call<'_> {
    /// A PUT of an object that does not exist: Leases, Events and Services are created by it
    /// (their registries allow it), unless it names a resourceVersion (409); other kinds
    /// answer 404.
    fn create_on_update(&self, name: &str, sent: Value) -> Answer {
        let resource = self.resource();
        if !matches!(resource.plural, "events" | "leases" | "services") {
            return Err(self.not_found(name));
        }
        if sent
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|version| !version.is_empty())
        {
            return Err(self.conflict(name, "the object has been modified; please apply your changes to the latest version and try again"));
        }
        self.create(resource.served(sent))
    }

    /// A body of another group, version or kind than the path names is refused (400).
    fn check_type(&self, object: &Value) -> Result<(), Failure> {
        let resource = self.resource();
        let api_version = object.get("apiVersion").and_then(Value::as_str);
        let kind = object.get("kind").and_then(Value::as_str);
        if api_version.is_some_and(|sent| sent != resource.api_version()) {
            return Err(Failure {
                code: 400,
                reason: "BadRequest",
                message: format!(
                    "the API version in the data ({}) does not match the expected API version ({})",
                    api_version.unwrap_or_default(),
                    resource.api_version()
                ),
            });
        }
        if kind.is_some_and(|sent| sent != resource.kind) {
            return Err(Failure {
                code: 400,
                reason: "BadRequest",
                message: format!(
                    "the kind in the data ({}) does not match the expected kind ({})",
                    kind.unwrap_or_default(),
                    resource.kind
                ),
            });
        }
        Ok(())
    }
}

/// The answer to a delete that removed `object` at once: the object for Services, a `Status`
/// naming it for every other kind served (the real registry's `ReturnDeletedObject`).
fn deleted(resource: Resource, object: &Value, revision: u64) -> Value {
    if resource.plural == "services" {
        // At the version of its deletion.
        let mut object = resource.served(object.clone());
        object["metadata"]["resourceVersion"] = Value::from(revision.to_string());
        return object;
    }
    let mut details = json!({
        "name": object.pointer("/metadata/name").cloned().unwrap_or_default(),
        "kind": resource.plural,
        "uid": object.pointer("/metadata/uid").cloned().unwrap_or_default(),
    });
    if !resource.group.is_empty() {
        details["group"] = Value::from(resource.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// Commits a write (no admission: the caller has admitted it), wakes the watch caches and
/// tells the observers.
pub(crate) fn commit_and_announce(
    inner: &Arc<Inner>,
    caller: &str,
    verb: Verb,
    resource: Resource,
    key: Key,
    object: Option<Value>,
) -> (u64, Option<Value>, Option<Value>) {
    let (revision, old, new) = inner.store.lock().commit(key.clone(), object);
    inner.revisions.send_replace(revision);
    let applied = Applied {
        revision,
        caller: caller.to_string(),
        verb,
        group: resource.group.to_string(),
        plural: resource.plural.to_string(),
        namespace: resource.namespaced.then(|| key.2.clone()),
        name: key.3,
        old: old.clone(),
        new: new.clone(),
    };
    let observers = inner.observers.lock().clone();
    for observer in observers {
        observer(&applied);
    }
    (revision, old, new)
}

fn finalizers(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// The object with an empty finalizer list left out (the server does not keep one).
fn without_empty_finalizers(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut)
        && metadata.get("finalizers").is_some_and(|finalizers| {
            finalizers.as_array().is_some_and(Vec::is_empty) || finalizers.is_null()
        })
    {
        metadata.remove("finalizers");
    }
    object
}

fn set_or_remove(object: &mut Value, field: &str, value: Option<Value>) {
    match value {
        Some(value) => object[field] = value,
        None => {
            if let Some(map) = object.as_object_mut() {
                map.remove(field);
            }
        }
    }
}
