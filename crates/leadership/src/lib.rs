//! leadership (to be filled).
