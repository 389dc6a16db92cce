//! Planner configuration.

/// How the planner names and fills slices; checked once by [`Config::new`], so the planner
/// takes it as valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    max_endpoints_per_slice: usize,
    managed_by: String,
    name_prefix: String,
}

/// A configuration the planner cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The maximum is outside 1..=1000. Not retryable: fix the flag.
    #[error("max endpoints per slice must be between 1 and 1000, got {0}")]
    MaxEndpointsOutOfRange(usize),
    /// managed-by is not a valid label value (1 to 63 characters of `[A-Za-z0-9._-]`, starting and
    /// ending alphanumeric). Not retryable: fix the flag.
    #[error("managed-by {0:?} is not a valid label value")]
    InvalidManagedBy(String),
    /// The prefix is not lowercase DNS-name characters (`[a-z0-9.-]`, at most 200, not starting with
    /// `-` or `.`). Not retryable: fix the flag.
    #[error("slice name prefix {0:?} is not made of DNS name characters")]
    InvalidNamePrefix(String),
}

/// Linkerd's controller name, so the two are drop-in replacements (docs/operations.md,
/// migrating from Linkerd).
pub const DEFAULT_MANAGED_BY: &str = "linkerd-external-workloads-controller";

/// The largest allowed maximum of endpoints per slice (the API server's own limit).
pub const MAX_ENDPOINTS_LIMIT: usize = 1000;

/// Linkerd's slice name prefix.
pub const DEFAULT_NAME_PREFIX: &str = "linkerd-external-";

// === impl Config ===

impl Default for Config {
    fn default() -> Self {
        Self {
            max_endpoints_per_slice: 100,
            managed_by: DEFAULT_MANAGED_BY.to_owned(),
            name_prefix: DEFAULT_NAME_PREFIX.to_owned(),
        }
    }
}

impl Config {
    /// A configuration with at most `max_endpoints_per_slice` (1..=1000) endpoints per slice,
    /// `managed_by` (a label value) on every slice, and slice names starting with `name_prefix`
    /// (lowercase DNS name characters).
    pub fn new(
        max_endpoints_per_slice: usize,
        managed_by: impl Into<String>,
        name_prefix: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        let (managed_by, name_prefix) = (managed_by.into(), name_prefix.into());
        if !(1..=MAX_ENDPOINTS_LIMIT).contains(&max_endpoints_per_slice) {
            return Err(ConfigError::MaxEndpointsOutOfRange(max_endpoints_per_slice));
        }
        if !is_label_value(&managed_by) {
            return Err(ConfigError::InvalidManagedBy(managed_by));
        }
        let prefix_ok = name_prefix.len() <= 200
            && !name_prefix.starts_with(['-', '.'])
            && name_prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !prefix_ok {
            return Err(ConfigError::InvalidNamePrefix(name_prefix));
        }
        Ok(Self {
            max_endpoints_per_slice,
            managed_by,
            name_prefix,
        })
    }

    /// Most endpoints in one slice, 1 to 1000 (default 100, as upstream).
    pub fn max_endpoints_per_slice(&self) -> usize {
        self.max_endpoints_per_slice
    }

    /// Value of `endpointslice.kubernetes.io/managed-by` on our slices.
    pub fn managed_by(&self) -> &str {
        &self.managed_by
    }

    /// Start of the generated slice names: `<prefix><service>-`.
    pub fn name_prefix(&self) -> &str {
        &self.name_prefix
    }
}

/// A non-empty Kubernetes label value.
fn is_label_value(value: &str) -> bool {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && edge_ok(value.chars().next())
        && edge_ok(value.chars().last())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_linkerds_and_valid() {
        let default = Config::default();
        assert_eq!(
            Config::new(100, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX),
            Ok(default)
        );
    }

    #[test]
    fn rejects_each_bad_field() {
        let bad = [
            Config::new(0, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX),
            Config::new(1001, DEFAULT_MANAGED_BY, DEFAULT_NAME_PREFIX),
            Config::new(100, "", DEFAULT_NAME_PREFIX),
            Config::new(100, "-edge", DEFAULT_NAME_PREFIX),
            Config::new(100, DEFAULT_MANAGED_BY, "Upper-"),
            Config::new(100, DEFAULT_MANAGED_BY, "-dash"),
        ];
        for result in bad {
            assert!(result.is_err(), "{result:?}");
        }
        assert!(Config::new(1000, "a.b_c-d", "x.").is_ok());
    }
}
