//! api (to be filled).
