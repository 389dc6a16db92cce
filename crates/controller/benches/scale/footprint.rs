//! Bytes per cached object, by kind: this process lists every object of a kind from the API
//! (500 per page, as the controller's paged lists do), puts each through the controller's own
//! projection into the controller's own caches (`cluster::measure::StandaloneCaches`, string
//! pool included), and reads its resident memory (`VmRSS`) before and after each kind.
//!
//! RSS rather than a heap count: it includes malloc's per-allocation overhead, as the
//! controller's RSS does. A first list of every kind, dropped at once, warms the allocator so
//! that the list buffers are not counted as cache.
//!
//! Then a re-list of every kind through the same caches (`StandaloneCaches::relist`, as the watch does
//! after an expired watch): the peak RSS during it (`VmHWM`, reset first through
//! `/proc/self/clear_refs`) against the RSS before it.

use api::v1beta1::ExternalWorkload;
use cluster::measure::{Kind, StandaloneCaches};
use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    serde::de::DeserializeOwned,
};
use kube::{Api, Client, Resource, api::ListParams};
use slices::MANAGED_BY_LABEL;
use tokio::time::Instant;

use harness::report::{Table, progress};

/// Bytes per object of each kind.
pub struct Footprint {
    kinds: Vec<(&'static str, usize, u64)>,
    pooled: usize,
    /// RSS before the re-list, peak during it.
    relist: (u64, u64),
}

/// Lists every object of `K` matching `selector`, page by page, calling `each` on each.
async fn list_each<K>(client: &Client, selector: Option<&str>, mut each: impl FnMut(K)) -> usize
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let mut params = ListParams::default().limit(500);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let mut count = 0;
    loop {
        let page = api.list(&params).await.unwrap();
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        for object in page.items {
            count += 1;
            each(object);
        }
        match next {
            Some(token) => params.continue_token = Some(token),
            None => return count,
        }
    }
}

fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn rss() -> u64 {
    status_field("VmRSS:")
}

/// Re-lists one kind into its cache, as the watch does.
async fn relist<K>(client: &Client, selector: Option<&str>, caches: &StandaloneCaches)
where
    K: Kind
        + Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut relist = caches.relist::<K>();
    list_each::<K>(client, selector, |object| relist.apply(object)).await;
    relist.finish();
}

/// Builds the caches from the API and measures them.
pub async fn measure(client: &Client, started: Instant) -> Footprint {
    let selector = format!("{MANAGED_BY_LABEL}={}", slices::DEFAULT_MANAGED_BY);
    // Warm-up: every kind listed once and dropped.
    list_each::<Service>(client, None, drop).await;
    list_each::<ExternalWorkload>(client, None, drop).await;
    list_each::<EndpointSlice>(client, Some(&selector), drop).await;

    let caches = StandaloneCaches::new();
    let mut kinds = Vec::new();
    let before = rss();
    let count = list_each::<Service>(client, None, |s| caches.apply(s)).await;
    let after = rss();
    kinds.push(("Service", count, after.saturating_sub(before)));
    let before = after;
    let count = list_each::<ExternalWorkload>(client, None, |w| caches.apply(w)).await;
    let after = rss();
    kinds.push(("ExternalWorkload", count, after.saturating_sub(before)));
    let before = after;
    let count = list_each::<EndpointSlice>(client, Some(&selector), |s| caches.apply(s)).await;
    let after = rss();
    kinds.push(("EndpointSlice", count, after.saturating_sub(before)));
    // A re-list of everything; the peak is reset first (Linux: "5" resets VmHWM).
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = rss();
    relist::<Service>(client, None, &caches).await;
    relist::<ExternalWorkload>(client, None, &caches).await;
    relist::<EndpointSlice>(client, Some(&selector), &caches).await;
    let peak = if reset { status_field("VmHWM:") } else { 0 };
    progress(
        started,
        format!(
            "re-list of every kind: RSS {:.1} MiB before, peak {:.1} MiB during",
            before as f64 / (1024.0 * 1024.0),
            peak as f64 / (1024.0 * 1024.0)
        ),
    );
    let footprint = Footprint {
        kinds,
        pooled: caches.pooled_strings(),
        relist: (before, peak),
    };
    progress(
        started,
        format!(
            "cached struct sizes (before their heap parts): Service {} B, workload {} B, slice {} B, endpoint {} B",
            std::mem::size_of::<slices::CachedService>(),
            std::mem::size_of::<slices::CachedWorkload>(),
            std::mem::size_of::<slices::CachedSlice>(),
            std::mem::size_of::<slices::CachedEndpoint>(),
        ),
    );
    for (kind, count, bytes) in &footprint.kinds {
        progress(
            started,
            format!(
                "footprint: {count} {kind}s cost {:.1} MiB of RSS in the caches, {} bytes each",
                *bytes as f64 / (1024.0 * 1024.0),
                bytes / (*count).max(1) as u64
            ),
        );
    }
    footprint
}

// === impl Footprint ===

impl Footprint {
    /// Adds one row per kind.
    pub fn rows(&self, table: &mut Table) {
        for (kind, count, bytes) in &self.kinds {
            table.row(
                &format!(
                    "cache RSS per {kind} ({count} cached, index and pooled strings included)"
                ),
                "",
                &[*bytes as f64 / (*count).max(1) as f64],
                "bytes",
            );
        }
        table.row("strings in the shared pool", "", &[self.pooled as f64], "");
        let (before, peak) = self.relist;
        let cached: u64 = self.kinds.iter().map(|(_, _, bytes)| bytes).sum();
        table.row(
            &format!(
                "re-list of every kind through the caches (this process): RSS before, peak during; peak − before = {:.0}% of the caches' {:.1} MiB",
                (peak as f64 - before as f64) / cached.max(1) as f64 * 100.0,
                cached as f64 / (1024.0 * 1024.0)
            ),
            "MiB",
            &[before as f64 / (1024.0 * 1024.0), peak as f64 / (1024.0 * 1024.0)],
            "≤ +20%",
        );
    }
}
