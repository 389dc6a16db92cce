//! Fidelity: the same requests sent to the in-memory API server and to the testbed's
//! kube-apiserver 1.37.2 must get the same answers, once what each server picks freely (names,
//! uids, timestamps, resourceVersions, cluster IPs) is normalised. What differs on purpose is
//! listed in the crate docs ("Deliberate simplifications").
//!
//! - `script`: EndpointSlices, step by step (the first fidelity test);
//! - `trace`: a seeded differential trace over every kind the controller touches (600 seeded
//!   operations, about 680 requests with the pages, watches and sentinels). It takes about 25 s
//!   on the 2-core CI machine under load (the real server's half about 11 s, mostly the 6 s
//!   bookmark watch), measured with `cargo test -p apisim --test fidelity -- trace --nocapture`.
//!   Seeds 5, 7, 11 and 33 were run; CI runs 33 (`FIDELITY_SEED` picks another).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod kinds;
mod normalise;
mod script;
mod trace;

use tokio::sync::Mutex;

/// Operations of the differential trace per run (the issue asks for at least 500).
const TRACE_OPERATIONS: usize = 600;

/// The trace's seed: `FIDELITY_SEED` when given (to reproduce or explore), else a fixed one so
/// a CI run is repeatable.
fn trace_seed() -> u64 {
    std::env::var("FIDELITY_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(33)
}

/// The trace compacts etcd, which would expire the script's paged list if both ran at once.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// Prints the first differences (each from where the two lines part), writes both records to
/// the test's temporary folder, and fails when they differ.
fn compare(test: &str, real: &[String], simulated: &[String]) {
    let folder = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(folder.join(format!("{test}.real.txt")), real.join("\n")).unwrap();
    std::fs::write(
        folder.join(format!("{test}.simulated.txt")),
        simulated.join("\n"),
    )
    .unwrap();
    let mut differences = 0;
    for (index, (real, simulated)) in real.iter().zip(simulated).enumerate() {
        if real == simulated {
            continue;
        }
        differences += 1;
        if differences <= 12 {
            let common = real
                .char_indices()
                .zip(simulated.chars())
                .find(|((_, a), b)| a != b)
                .map_or(real.len().min(simulated.len()), |((at, _), _)| at);
            let from = real[..common]
                .char_indices()
                .rev()
                .nth(80)
                .map_or(0, |(at, _)| at);
            let shorten = |text: &str| text.chars().take(280).collect::<String>();
            println!(
                "≠ {index} {}\n    real:      …{}\n    simulated: …{}",
                shorten(&real[..from.min(real.len())])
                    .chars()
                    .take(70)
                    .collect::<String>(),
                shorten(&real[from..]),
                shorten(simulated.get(from..).unwrap_or_default()),
            );
        }
    }
    println!(
        "{test}: {} steps, {differences} different, lengths {} and {} (both in {})",
        real.len().max(simulated.len()),
        real.len(),
        simulated.len(),
        folder.display()
    );
    assert!(
        differences == 0 && real.len() == simulated.len(),
        "{differences} steps answered differently"
    );
}

#[tokio::test]
async fn the_in_memory_api_answers_as_the_real_api_server_does() {
    let testbed = testbed::require!();
    let _one = ONE_AT_A_TIME.lock().await;
    let namespace = testbed.fresh_namespace("fidelity").await.unwrap();
    let real = script::script(testbed.client().await.unwrap(), &namespace).await;

    let server = apisim::ApiServer::new(apisim::ServerConfig::default());
    let simulated = script::script(server.client("fidelity"), "fidelity").await;
    compare("script", &real, &simulated);
}

#[tokio::test]
async fn a_seeded_trace_over_every_kind_is_answered_alike() {
    let testbed = testbed::require!();
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = trace_seed();
    let namespace = testbed.fresh_namespace("trace").await.unwrap();
    let started = tokio::time::Instant::now();
    let real = trace::run(
        testbed.client().await.unwrap(),
        &namespace,
        seed,
        TRACE_OPERATIONS,
        Box::new(move || {
            Box::pin(async move {
                testbed.compact_etcd().await.unwrap();
            })
        }),
    )
    .await;
    println!(
        "seed {seed}: the real server's trace took {:?}",
        started.elapsed()
    );
    // The acquisition barrier's probe (cluster::watch::fresh) takes only a bookmark at or past
    // the version a consistent list read for proof: kube-apiserver must give one, or every probe
    // would end in a re-list.
    assert!(
        real.iter().any(|(label, observed)| {
            label == "probe: a bookmark after a consistent list"
                && matches!(observed, trace::Observed::Bookmark { not_older: true })
        }),
        "kube-apiserver sent no bookmark at or past a consistent list's version"
    );

    let server = apisim::ApiServer::new(apisim::ServerConfig {
        skip_unchanged_writes: true,
        ..apisim::ServerConfig::default()
    });
    let compacting = server.clone();
    let simulated = trace::run(
        server.client("trace"),
        &namespace,
        seed,
        TRACE_OPERATIONS,
        Box::new(move || {
            let server = compacting.clone();
            Box::pin(async move { server.compact() })
        }),
    )
    .await;
    println!("real expiry: {:?}", normalise::expiry_answers(&real));
    assert_eq!(
        normalise::expiry_answers(&simulated),
        [
            "expire: the list continued after a compaction: error 410 Expired",
            "expire: a watch from version 1: events [ERROR {\"code\":410,\"reason\":\"Expired\"}]",
        ],
        "the in-memory server expires what was compacted"
    );
    compare(
        "trace",
        &normalise::normalise(&real),
        &normalise::normalise(&simulated),
    );
}
