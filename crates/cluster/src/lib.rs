//! cluster (to be filled).
