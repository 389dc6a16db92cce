//! Bytes per cached object, by kind: this process lists every object of a kind from the API
//! (500 per page, as the controller's paged lists do), puts each through the controller's own
//! projection into the controller's own caches (`cluster::caches::Caches`, string pool
//! included), and reads its resident memory (`VmRSS`) before and after each kind.
//!
//! RSS rather than a heap count: it includes malloc's per-allocation overhead, as the
//! controller's RSS does. A first list of every kind, dropped at once, warms the allocator so
//! that the list buffers are not counted as cache.

use api::v1beta1::ExternalWorkload;
use cluster::{caches::Caches, watch::Project};
use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    serde::de::DeserializeOwned,
};
use kube::{Api, Client, Resource, api::ListParams};
use slices::MANAGED_BY_LABEL;
use tokio::time::Instant;

use crate::common::{Table, progress};

/// Bytes per object of each kind.
pub struct Footprint {
    kinds: Vec<(&'static str, usize, u64)>,
    pooled: usize,
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

fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Builds the caches from the API and measures them.
pub async fn measure(client: &Client, started: Instant) -> Footprint {
    let selector = format!("{MANAGED_BY_LABEL}={}", slices::DEFAULT_MANAGED_BY);
    // Warm-up: every kind listed once and dropped.
    list_each::<Service>(client, None, drop).await;
    list_each::<ExternalWorkload>(client, None, drop).await;
    list_each::<EndpointSlice>(client, Some(&selector), drop).await;

    let caches = Caches::new();
    let mut kinds = Vec::new();
    let before = rss();
    let count = list_each::<Service>(client, None, |s| {
        caches.services.apply(s.project(&caches.interner));
    })
    .await;
    let after = rss();
    kinds.push(("Service", count, after.saturating_sub(before)));
    let before = after;
    let count = list_each::<ExternalWorkload>(client, None, |w| {
        caches.workloads.apply(w.project(&caches.interner));
    })
    .await;
    let after = rss();
    kinds.push(("ExternalWorkload", count, after.saturating_sub(before)));
    let before = after;
    let count = list_each::<EndpointSlice>(client, Some(&selector), |s| {
        caches.slices.apply(s.project(&caches.interner));
    })
    .await;
    let after = rss();
    kinds.push(("EndpointSlice", count, after.saturating_sub(before)));
    let footprint = Footprint {
        kinds,
        pooled: caches.interner.len(),
    };
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
    }
}
