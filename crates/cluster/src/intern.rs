//! The string pool of the caches: equal names, namespaces, label keys and values of different
//! objects share one allocation.
//!
//! At 10k Services and 50k workloads the same strings recur everywhere: a Service's name is its
//! slices' service-name label, its workloads' selector label value and its slices' owner name; a
//! workload's name is an endpoint's target name. Pooled, each is held once.

use std::{collections::HashSet, sync::Arc};

use parking_lot::Mutex;
use slices::{Intern, Text};

/// Below this size the pool is never swept.
const MIN_SWEEP: usize = 4096;

/// A pool of shared strings. Strings no object holds any more are dropped when the pool has
/// doubled since its last sweep, so the pool stays within twice what the caches use.
#[derive(Debug)]
pub struct Interner {
    pool: Mutex<Pool>,
}

#[derive(Debug)]
struct Pool {
    texts: HashSet<Text>,
    sweep_at: usize,
}

// === impl Interner ===

impl Interner {
    /// An empty pool.
    pub fn new() -> Self {
        Self {
            pool: Mutex::new(Pool {
                texts: HashSet::new(),
                sweep_at: MIN_SWEEP,
            }),
        }
    }

    /// Number of pooled strings.
    pub fn len(&self) -> usize {
        self.pool.lock().texts.len()
    }
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Intern for Interner {
    fn intern(&self, text: &str) -> Text {
        let mut pool = self.pool.lock();
        if let Some(shared) = pool.texts.get(text) {
            return shared.clone();
        }
        if pool.texts.len() >= pool.sweep_at {
            // Held only by the pool: no cached object uses it any more. A count cannot rise
            // from 1 while the lock is held, since new holders get their copy from here.
            pool.texts.retain(|t| Arc::strong_count(t) > 1);
            pool.texts.shrink_to_fit();
            pool.sweep_at = (pool.texts.len() * 2).max(MIN_SWEEP);
        }
        let shared = Text::from(text);
        pool.texts.insert(shared.clone());
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_share_one_allocation() {
        let pool = Interner::new();
        let a = pool.intern("web");
        let b = pool.intern("web");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(pool.len(), 1);
    }

    #[test]
    fn strings_nobody_holds_are_swept_once_the_pool_doubles() {
        let pool = Interner::new();
        let kept = pool.intern("kept");
        for i in 0..MIN_SWEEP - 1 {
            drop(pool.intern(&format!("gone-{i}")));
        }
        assert_eq!(pool.len(), MIN_SWEEP);
        // The next new string triggers the sweep: only "kept" and it remain.
        let _last = pool.intern("last");
        assert_eq!(pool.len(), 2);
        assert!(Arc::ptr_eq(&kept, &pool.intern("kept")));
    }
}
