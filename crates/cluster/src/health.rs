//! The health of the caches as readiness and metrics see it.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};

use crate::{metrics::KindLabels, view::Marks, watch::health::KindHealth};

/// The health of the three caches (Service, ExternalWorkload, EndpointSlice): readiness and the
/// per-kind gauges `cache_age_seconds` and `cache_ready`.
#[derive(Clone, Debug)]
pub struct CacheHealth {
    kinds: Arc<[Arc<KindHealth>; 3]>,
}

// === impl CacheHealth ===

impl CacheHealth {
    pub(crate) fn new(kinds: [Arc<KindHealth>; 3]) -> Self {
        Self {
            kinds: Arc::new(kinds),
        }
    }

    pub(crate) fn kinds(&self) -> [Arc<KindHealth>; 3] {
        (*self.kinds).clone()
    }

    /// The watermarks: how far each kind's watch has read (the fresh-view rule's one record
    /// of it, `view::Marks`).
    pub(crate) fn marks(&self) -> Marks {
        let [services, workloads, slices] = &*self.kinds;
        Marks {
            services: services.read_version(),
            workloads: workloads.read_version(),
            slices: slices.read_version(),
        }
    }

    /// Whether every cache can be trusted now: synced, its watch not stalled, and not
    /// re-listing for longer than the stall bound. Standbys are ready too (a warm standby is
    /// ready to take over).
    pub fn is_ready(&self) -> bool {
        self.kinds.iter().all(|kind| kind.is_ready())
    }

    /// Whether every cache has caught up since its watch last lost its stream
    /// (`KindHealth::is_caught_up`).
    pub fn is_caught_up(&self) -> bool {
        self.kinds.iter().all(|kind| kind.is_caught_up())
    }

    /// Waits until every cache has its first complete list.
    pub(crate) async fn synced(&self) {
        for kind in self.kinds.iter() {
            kind.synced().await;
        }
    }
}

impl Collector for CacheHealth {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut ages = encoder.encode_descriptor(
            "cache_age_seconds",
            "Time since the watch of each kind last delivered an event or a bookmark",
            None,
            MetricType::Gauge,
        )?;
        for kind in self.kinds.iter() {
            let labels = KindLabels { kind: kind.kind() };
            ConstGauge::new(kind.age().as_secs_f64()).encode(ages.encode_family(&labels)?)?;
        }
        let mut ready = encoder.encode_descriptor(
            "cache_ready",
            "1 while the cache of each kind is synced, not stalled and not re-listing past the \
             stall bound, else 0",
            None,
            MetricType::Gauge,
        )?;
        for kind in self.kinds.iter() {
            let labels = KindLabels { kind: kind.kind() };
            ConstGauge::new(i64::from(kind.is_ready())).encode(ready.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
