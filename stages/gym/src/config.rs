//! How the bridge runs its workers ([`BridgeConfig`]): how many, how long
//! a reply and a start may take, and which Python runs them (a stage's
//! `bridge.python` key, else `$EMBODYFLOW_GYM_PYTHON`, else the workspace's
//! `.venv`).
//!
//! ```
//! use embodyflow_gym::BridgeConfig;
//! let config = BridgeConfig { workers: 4, ..BridgeConfig::default() };
//! assert_eq!(config.startup_timeout, embodyflow_gym::STARTUP_TIMEOUT);
//! ```

use std::path::PathBuf;
use std::time::Duration;

/// The Python the workers run when neither a stage's `bridge.python` key nor
/// `EMBODYFLOW_GYM_PYTHON` names one: the workspace's `.venv`
/// (scripts/setup), found from this crate's directory.
pub const DEFAULT_PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");

/// The environment variable naming another Python for the workers.
pub const PYTHON_VAR: &str = "EMBODYFLOW_GYM_PYTHON";

/// The default [`BridgeConfig::startup_timeout`]: how long a worker may take
/// to start and build an environment (imports: ~1 s for Meta-World's MuJoCo
/// on an idle machine).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How the bridge runs its workers.
#[derive(Clone, Debug, PartialEq)]
pub struct BridgeConfig {
    /// Worker processes (episodes are split over them).
    pub workers: usize,
    /// Longest wait for a reply to a step, and longest silence between two
    /// frames of a reset or an expert episode (which send progress frames
    /// as they go); past it the worker is hung.
    pub timeout: Duration,
    /// Longest wait for a starting worker's first frame (its Python
    /// imports and first environment), when longer than `timeout`
    /// (default [`STARTUP_TIMEOUT`]); after that frame `timeout` applies.
    pub startup_timeout: Duration,
    /// The Python interpreter (any with the packages the adapters need;
    /// the worker's own package is put on its `PYTHONPATH`).
    pub python: PathBuf,
}

impl BridgeConfig {
    /// The interpreter a stage runs: its config key's when set, else
    /// `$EMBODYFLOW_GYM_PYTHON`, else [`DEFAULT_PYTHON`].
    pub fn python(key: Option<&std::path::Path>) -> PathBuf {
        key.map(PathBuf::from)
            .or_else(|| std::env::var_os(PYTHON_VAR).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PYTHON))
    }
}

impl Default for BridgeConfig {
    /// One worker, 60 s timeouts, `$EMBODYFLOW_GYM_PYTHON` or
    /// [`DEFAULT_PYTHON`].
    fn default() -> BridgeConfig {
        BridgeConfig {
            workers: 1,
            timeout: Duration::from_secs(60),
            startup_timeout: STARTUP_TIMEOUT,
            python: BridgeConfig::python(None),
        }
    }
}
