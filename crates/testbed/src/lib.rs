//! testbed (to be filled).
