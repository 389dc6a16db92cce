//! What the acquisition barrier (clause 1 of the fresh-view rule, docs/architecture.md) costs at
//! the least on the testbed's kube-apiserver: each way the API server can show a client that it
//! has read a kind up to a point after the acquisition, timed by a plain client, with no
//! controller running. The barrier (`cluster::watch::fresh`) uses two of them: a re-list for a
//! kind of up to 5,000 objects, a probe (a watch whose bookmark reaches the point) above.
//!
//! One namespace of `PROOFS_SERVICES` Services × 5 ExternalWorkloads; for the workloads:
//! 1. the consistent read of the kind's current version (a LIST of one object, no version): the
//!    probe's first step;
//! 2. a consistent LIST of every workload, in one page and in pages of 500 (the barrier's
//!    re-list);
//! 3. a streaming list (`sendInitialEvents`, no version: a consistent read) to the bookmark that
//!    ends its initial events;
//! 4. a probe: a watch from just before the current version with a server timeout of 3 s, to
//!    its first bookmark at or past that version; and the same with 2 s, the next shorter
//!    timeout (timeouts are whole seconds; the API server sends the bookmark two seconds before
//!    a watch's timeout, so a 2 s watch should get none: counted).
//!
//! Each `PROOFS_ROUNDS` times, min / median / max; the load average before and after. Run alone.
//!
//! ```sh
//! cargo bench -p external-endpoints --bench proofs     # about 1 minute (+ a release build)
//! # knobs: PROOFS_SERVICES=1000 PROOFS_ROUNDS=12 (10000 Services: about 3 minutes at 8 rounds)
//! # PROOFS_TRACE=1 prints every event each probe reads, with its time and resourceVersion
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is the failure report

use std::time::Duration;

use api::v1beta1::ExternalWorkload;
use futures::{StreamExt, TryStreamExt};
use harness::{
    fixtures::populate,
    report::{Table, bench_main, env_usize, load_average, progress, summary},
};
use kube::{
    Api, Client,
    api::{ListParams, WatchEvent, WatchParams},
};
use tokio::time::Instant;

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

fn main() {
    bench_main("proofs", run);
}

async fn run() {
    let started = Instant::now();
    let load_before = load_average();
    let services = env_usize("PROOFS_SERVICES", 1000);
    let rounds = env_usize("PROOFS_ROUNDS", 12).max(1);

    let testbed = testbed::Testbed::start(testbed::Options::default())
        .await
        .expect("the testbed");
    let client: Client = testbed.client().await.expect("a client");
    let namespace = testbed
        .fresh_namespace("bench-proofs")
        .await
        .expect("a namespace");
    populate(&client, &namespace, services, 5, started).await;
    let api: Api<ExternalWorkload> = Api::namespaced(client.clone(), &namespace);
    progress(started, format!("{} workloads stored", services * 5));

    let mut version_reads = Vec::new();
    let mut one_page = Vec::new();
    let mut paged = Vec::new();
    let mut streaming = Vec::new();
    let mut probes = Vec::new();
    let mut short_probes_answered = 0;
    for round in 1..=rounds {
        let (took, version) = timed(current_version(&api)).await;
        version_reads.push(took);
        one_page.push(timed(list(&api, None)).await.0);
        paged.push(timed(list(&api, Some(500))).await.0);
        streaming.push(timed(streaming_list(&api)).await.0);
        let (took, answered) = timed(probe(&api, version, 3)).await;
        if answered {
            probes.push(took);
        } else {
            progress(
                started,
                format!("round {round}: the probe got no bookmark at or past {version}"),
            );
        }
        let version = current_version(&api).await;
        if probe(&api, version, 2).await {
            short_probes_answered += 1;
        }
        progress(started, format!("round {round} of {rounds}"));
    }

    let mut table = Table::default();
    let at = format!("{} ExternalWorkloads", services * 5);
    let row = |table: &mut Table, what: &str, samples: &[f64]| {
        table.row(&format!("{at}: {what}"), "s", samples, "");
    };
    row(
        &mut table,
        "consistent read of the current version (LIST of one)",
        &version_reads,
    );
    row(&mut table, "consistent LIST, one page", &one_page);
    row(&mut table, "consistent LIST, pages of 500", &paged);
    row(
        &mut table,
        "streaming list to its initial-events-end bookmark",
        &streaming,
    );
    row(
        &mut table,
        "probe: watch from before the current version, server timeout 3 s → bookmark at or past it",
        &probes,
    );
    table.row(
        &format!("{at}: probes with a 3 s server timeout that got a bookmark"),
        "",
        &[probes.len() as f64],
        &format!("of {rounds}"),
    );
    table.row(
        &format!("{at}: probes with a 2 s server timeout that got a bookmark"),
        "",
        &[f64::from(short_probes_answered)],
        &format!("of {rounds}"),
    );
    table.print("what clause 1's proof costs at least (a plain client, no controller)");
    if !probes.is_empty() {
        let (_, median, max) = summary(&probes);
        println!("probe to its bookmark: median {median:.3} s, max {max:.3} s");
    }
    println!(
        "load average before {load_before}, after {}",
        load_average()
    );
}

async fn timed<T>(work: impl Future<Output = T>) -> (f64, T) {
    let begun = Instant::now();
    let value = work.await;
    (begun.elapsed().as_secs_f64(), value)
}

/// The kind's current version, by a consistent read.
async fn current_version(api: &Api<ExternalWorkload>) -> u64 {
    let list = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("a LIST of one");
    version(list.metadata.resource_version.as_deref())
}

fn version(text: Option<&str>) -> u64 {
    text.and_then(|v| v.parse().ok())
        .expect("a numeric resourceVersion")
}

/// Every workload by consistent LISTs, in pages of `page` (`None`: one page).
async fn list(api: &Api<ExternalWorkload>, page: Option<u32>) -> usize {
    let mut listed = 0;
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default();
        if let Some(page) = page {
            params = params.limit(page);
        }
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let list = api.list(&params).await.expect("a LIST");
        listed += list.items.len();
        token = list.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return listed;
        }
    }
}

/// A streaming list read to the bookmark that ends its initial events; the objects it sent.
async fn streaming_list(api: &Api<ExternalWorkload>) -> usize {
    let params = WatchParams::streaming_lists().timeout(30);
    let mut events = api
        .watch(&params, "")
        .await
        .expect("a streaming list")
        .boxed();
    let mut objects = 0;
    while let Some(event) = events.try_next().await.expect("a watch event") {
        match event {
            WatchEvent::Added(_) => objects += 1,
            WatchEvent::Bookmark(bookmark)
                if bookmark
                    .metadata
                    .annotations
                    .contains_key(INITIAL_EVENTS_END) =>
            {
                return objects;
            }
            _ => {}
        }
    }
    panic!("the streaming list ended before its initial events did");
}

/// A probe as the barrier makes one: a watch from a version before `reach` (the watch's last
/// version; here the one just before) with a server timeout of `seconds`: whether a bookmark
/// at or past `reach` came before the stream ended. (A watch from `reach` itself gets no
/// bookmark until the API server's cache moves past it.)
async fn probe(api: &Api<ExternalWorkload>, reach: u64, seconds: u32) -> bool {
    let params = WatchParams::default().timeout(seconds);
    let mut events = api
        .watch(&params, &(reach - 1).to_string())
        .await
        .expect("a watch")
        .boxed();
    let deadline = Duration::from_secs(u64::from(seconds) + 5);
    let opened = Instant::now();
    let tracing = std::env::var_os("PROOFS_TRACE").is_some();
    let trace = |what: String| {
        if tracing {
            let at = opened.elapsed().as_secs_f64();
            eprintln!("  probe({seconds}s) reach {reach}: {at:.3} s {what}");
        }
    };
    let wait = async {
        while let Some(event) = events.try_next().await.expect("a watch event") {
            trace(match &event {
                WatchEvent::Bookmark(b) => format!("bookmark {}", b.metadata.resource_version),
                WatchEvent::Error(e) => format!("error {e:?}"),
                WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                    format!("object {:?}", o.metadata.resource_version)
                }
            });
            if let WatchEvent::Bookmark(bookmark) = event
                && version(Some(&bookmark.metadata.resource_version)) >= reach
            {
                return true;
            }
        }
        trace("stream ended".to_owned());
        false
    };
    tokio::time::timeout(deadline, wait)
        .await
        .expect("the stream ends by its server timeout")
}
