//! Check (d), no duplicate at rest: no two slices of a Service hold one endpoint of one
//! address family, looked at when the world is calm.

use std::collections::BTreeMap;

use super::{
    Check, Checks,
    store::{service_of, uids},
};

// === impl Checks ===

impl Checks {
    /// Check (d): no two slices of a Service hold one endpoint of one family.
    pub fn check_duplicates(&self, why: &str) {
        let mut state = self.state.lock();
        let mut seen: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
        let mut duplicates = Vec::new();
        for ((namespace, name), slice) in &state.slices {
            let Some(service) = service_of(slice) else {
                continue;
            };
            for uid in uids(slice) {
                let key = (
                    namespace.clone(),
                    service.clone(),
                    slice.address_type.clone(),
                    uid,
                );
                if let Some(other) = seen.insert(key.clone(), name.clone()) {
                    duplicates.push(format!(
                        "{}/{} {} in {other} and {name}",
                        key.0, key.1, key.3
                    ));
                }
            }
        }
        if !duplicates.is_empty() {
            let detail = format!("{why}: {}", duplicates.join("; "));
            self.violate(&mut state, Check::DuplicateAtRest, detail);
        }
    }
}
