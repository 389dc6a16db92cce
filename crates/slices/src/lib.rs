//! slices (to be filled).
