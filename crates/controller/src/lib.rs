//! controller (to be filled).
