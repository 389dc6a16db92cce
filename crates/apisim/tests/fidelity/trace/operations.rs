//! The seeded operations: each step picks a kind, a name and a request (a create, named,
//! generated or invalid; a get; a paged or selected list; an update, current, stale or
//! unchanged; one of the three patch types; `/status`; a preconditioned delete; a finalizer
//! removed) from the seed and the objects answered so far.

use super::*;

impl Run<'_> {
    /// A name of `kind` for this step: one of the fixed names, or one the server generated.
    fn name(&mut self, kind: Kind) -> String {
        let generated = self.generated.get(&kind).cloned().unwrap_or_default();
        if !generated.is_empty() && self.rng.below(4) == 0 {
            let index = self.rng.below(generated.len() as u64) as usize;
            return generated[index].clone();
        }
        kind.name(self.rng.below(4))
    }

    pub(super) fn body(&mut self, kind: Kind, name: Option<&str>, generate: bool) -> Value {
        let variant = self.rng.next() % 1000;
        let owner = format!("svc-{}", variant % 2);
        let owner_uid = self
            .last
            .get(&(Kind::Service, owner))
            .and_then(|service| service.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let finalizer = self.rng.below(5) == 0;
        // Each generated name has its own prefix, in order, so a list orders them alike on both
        // servers whatever random suffix each server picks.
        let prefix = format!("gen-{:03}-", self.generate_count);
        self.generate_count += usize::from(generate);
        kind.body(&BodyOf {
            name,
            generate_name: generate.then_some(prefix.as_str()),
            variant,
            namespace: self.namespace,
            owner_uid: owner_uid.as_deref(),
            finalizer,
        })
    }

    pub(super) async fn step(&mut self, step: usize) {
        let kind = self.rng.pick(&KINDS);
        let roll = self.rng.below(100);
        let name = self.name(kind);
        // A generated name is shown without the suffix each server picked.
        let shown = if name.starts_with("gen-") && name.len() == "gen-000-".len() + 5 {
            &name[..name.len() - 5]
        } else {
            name.as_str()
        };
        let label = |what: &str| format!("{step} {what} {} {shown}", kind.label());
        match roll {
            0..=19 => {
                let body = self.body(kind, Some(&name), false);
                let answer = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
                if let Ok(created) = &answer
                    && let Some(version) = created
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                {
                    self.first.insert((kind, name.clone()), version.to_string());
                }
                self.record(label("create"), kind, &name, answer);
            }
            20..=24 => {
                let body = self.body(kind, None, true);
                let answer = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
                if let Ok(created) = &answer
                    && let Some(generated) =
                        created.pointer("/metadata/name").and_then(Value::as_str)
                {
                    self.generated
                        .entry(kind)
                        .or_default()
                        .push(generated.to_string());
                }
                self.record(label("create generated"), kind, &name, answer);
            }
            25..=26 => {
                let body = kind.invalid_body(&name);
                let answer = self
                    .send(Method::POST, &self.collection(kind), None, Some(&body))
                    .await;
                self.record(label("create invalid"), kind, &name, answer);
            }
            27..=39 => {
                self.send_to_object(label("get"), Method::GET, kind, &name, None)
                    .await;
            }
            40..=47 => self.list(kind, step).await,
            48..=57 => {
                if kind.is_event() {
                    // An Event's version may move with no change served (crate docs), so it is
                    // read again before it is updated.
                    self.get_instead(kind, &name, step).await;
                }
                let Some(mut object) = self.last.get(&(kind, name.clone())).cloned() else {
                    return self.get_instead(kind, &name, step).await;
                };
                let variant = self.rng.next();
                let what = match self.rng.below(4) {
                    0 => "update unchanged",
                    1 => {
                        object["metadata"]["labels"]["touched"] =
                            Value::from(format!("t{}", variant % 5));
                        "update labels"
                    }
                    _ => {
                        kind.change(&mut object, variant);
                        "update"
                    }
                };
                self.send_to_object(label(what), Method::PUT, kind, &name, Some(&object))
                    .await;
            }
            58..=60 => {
                let Some(mut object) = self.last.get(&(kind, name.clone())).cloned() else {
                    return self.get_instead(kind, &name, step).await;
                };
                let first = self
                    .first
                    .get(&(kind, name.clone()))
                    .filter(|_| !kind.is_event())
                    .cloned()
                    .unwrap_or_else(|| "1".into());
                object["metadata"]["resourceVersion"] = Value::from(first);
                kind.change(&mut object, self.rng.next());
                let what = label("update from the first version");
                self.send_to_object(what, Method::PUT, kind, &name, Some(&object))
                    .await;
            }
            61..=68 => {
                let variant = self.rng.next();
                let mut change =
                    json!({"metadata": {"labels": {"patched": format!("p{}", variant % 4)}}});
                if self.rng.below(2) == 0 {
                    let mut object = self
                        .last
                        .get(&(kind, name.clone()))
                        .cloned()
                        .unwrap_or_else(|| json!({}));
                    kind.change(&mut object, variant);
                    if let Some(map) = object.as_object_mut() {
                        for (field, value) in map.iter() {
                            if !matches!(
                                field.as_str(),
                                "metadata" | "apiVersion" | "kind" | "status"
                            ) {
                                change[field] = value.clone();
                            }
                        }
                    }
                }
                self.patch_object(label("merge patch"), kind, &name, MERGE_PATCH, &change)
                    .await;
            }
            69..=73 => {
                let variant = self.rng.next();
                let patch = match self.rng.below(4) {
                    0 => json!([{"op": "test", "path": "/metadata/labels/app", "value": "other"}]),
                    1 => json!([{"op": "remove", "path": "/metadata/labels/variant"}]),
                    _ => json!([
                        {"op": "test", "path": "/metadata/labels/app", "value": "trace"},
                        {"op": "add", "path": "/metadata/labels/json", "value": format!("j{}", variant % 3)},
                    ]),
                };
                self.patch_object(label("json patch"), kind, &name, JSON_PATCH, &patch)
                    .await;
            }
            74..=76 => {
                let patch = json!({"metadata": {"annotations": {"strategic": format!("s{}", self.rng.below(3))}}});
                let what = label("strategic merge patch");
                self.patch_object(what, kind, &name, STRATEGIC_MERGE_PATCH, &patch)
                    .await;
            }
            77..=82 if kind.has_status() => {
                let status = kind.status(self.rng.next());
                let path = format!("{}/status", self.object(kind, &name));
                if self.rng.below(2) == 0 {
                    let Some(mut object) = self.last.get(&(kind, name.clone())).cloned() else {
                        return self.get_instead(kind, &name, step).await;
                    };
                    object["status"] = status;
                    // A spec change sent to /status is not applied.
                    kind.change(&mut object, self.rng.next());
                    let answer = self.send(Method::PUT, &path, None, Some(&object)).await;
                    self.record(label("update status"), kind, &name, answer);
                } else {
                    let patch =
                        json!({"status": status, "metadata": {"labels": {"ignored": "yes"}}});
                    let answer = self
                        .send(Method::PATCH, &path, Some(MERGE_PATCH), Some(&patch))
                        .await;
                    self.record(label("merge patch status"), kind, &name, answer);
                }
            }
            77..=82 => {
                let answer = self
                    .send(
                        Method::GET,
                        &format!("{}/status", self.object(kind, &name)),
                        None,
                        None,
                    )
                    .await;
                self.record(label("get status of a kind without"), kind, &name, answer);
            }
            83..=92 => {
                let last = self.last.get(&(kind, name.clone())).cloned();
                let (what, options) = match self.rng.below(4) {
                    0 => (
                        "delete, wrong uid",
                        json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
                    ),
                    1 => (
                        "delete, last version seen",
                        json!({"preconditions": {"resourceVersion": last.as_ref().and_then(|o| o.pointer("/metadata/resourceVersion")).cloned()}}),
                    ),
                    _ => ("delete", json!({})),
                };
                self.send_to_object(label(what), Method::DELETE, kind, &name, Some(&options))
                    .await;
            }
            _ => {
                let patch = json!({"metadata": {"finalizers": null}});
                let what = label("remove finalizers");
                self.patch_object(what, kind, &name, MERGE_PATCH, &patch)
                    .await;
            }
        }
    }

    async fn get_instead(&mut self, kind: Kind, name: &str, step: usize) {
        let label = format!("{step} get first {}", kind.label());
        self.send_to_object(label, Method::GET, kind, name, None)
            .await;
    }

    async fn list(&mut self, kind: Kind, step: usize) {
        let selector = match self.rng.below(4) {
            0 => "",
            1 => "app=trace",
            2 => "variant in (v0,v1)",
            _ => "!patched",
        };
        let limit = self.rng.pick(&[0, 1, 2, 5]);
        // Events are listed whole: the real server writes Events of its own into the namespace
        // (its cluster IP repair), which the comparison leaves out, and a page boundary would
        // move with them.
        let limit = if kind.is_event() { 0 } else { limit };
        let mut token = String::new();
        for page in 0.. {
            let mut query = format!("labelSelector={}", urlencode(selector));
            if limit > 0 {
                query.push_str(&format!("&limit={limit}"));
            }
            if !token.is_empty() {
                query.push_str(&format!("&continue={token}"));
            }
            let answer = self
                .send(
                    Method::GET,
                    &format!("{}?{query}", self.collection(kind)),
                    None,
                    None,
                )
                .await;
            let label = format!(
                "{step} list {} selector={selector:?} limit={limit} page={page}",
                kind.label()
            );
            match answer {
                Ok(list) => {
                    token = list
                        .pointer("/metadata/continue")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let items = list["items"].as_array().cloned().unwrap_or_default();
                    self.steps.push((
                        label,
                        Observed::List {
                            items,
                            more: !token.is_empty(),
                        },
                    ));
                    if token.is_empty() {
                        return;
                    }
                }
                Err((code, reason)) => {
                    self.steps.push((label, Observed::Error { code, reason }));
                    return;
                }
            }
        }
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
