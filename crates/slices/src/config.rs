//! Planner configuration.

/// How the planner names and fills slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Most endpoints in one slice, 1 to 1000 (default 100, as upstream).
    pub max_endpoints_per_slice: usize,
    /// Value of `endpointslice.kubernetes.io/managed-by` on our slices.
    pub managed_by: String,
    /// Start of the generated slice names: `<prefix><service>-`.
    pub name_prefix: String,
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

/// Linkerd's controller name, so the two are drop-in replacements (design.md section 7).
pub const DEFAULT_MANAGED_BY: &str = "linkerd-external-workloads-controller";

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
    /// Checks every field; the planner assumes a validated configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1000).contains(&self.max_endpoints_per_slice) {
            return Err(ConfigError::MaxEndpointsOutOfRange(
                self.max_endpoints_per_slice,
            ));
        }
        if !is_label_value(&self.managed_by) {
            return Err(ConfigError::InvalidManagedBy(self.managed_by.clone()));
        }
        let prefix_ok = self.name_prefix.len() <= 200
            && !self.name_prefix.starts_with(['-', '.'])
            && self
                .name_prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !prefix_ok {
            return Err(ConfigError::InvalidNamePrefix(self.name_prefix.clone()));
        }
        Ok(())
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
