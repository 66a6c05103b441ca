//! How the bridge runs its workers ([`BridgeConfig`]): how many, how long
//! a reply and a start (or an environment's build) may take, which keys set
//! those deadlines (named when a worker misses one), and which Python runs
//! them (a stage's `bridge.python` key, else `$EMBODYFLOW_GYM_PYTHON`, else
//! the workspace's `.venv`).
//!
//! ```
//! use embodyflow_gym::BridgeConfig;
//! use std::time::Duration;
//! let config = BridgeConfig { workers: 4, ..BridgeConfig::default() };
//! assert_eq!(config.startup_timeout, embodyflow_gym::STARTUP_TIMEOUT);
//! let keyed = BridgeConfig { keys: Some("bridge".into()), ..config };
//! assert_eq!(
//!     keyed.deadline(keyed.build_patience()),
//!     "bridge.startup_timeout_s = 300; raise it on a busy machine"
//! );
//! assert_eq!(
//!     keyed.deadline(Duration::from_secs(60)),
//!     "bridge.timeout_s = 60; raise it on a busy machine"
//! );
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
/// to start (its imports) or to build an environment. Meta-World's imports
/// take ~1 s on an idle machine, but a LIBERO worker's hello (robosuite's
/// imports, the rendering check, the scene compiled) took 12.5 s on the
/// 2-core machine at load 3, 34-40 s at load 6, 61-63 s at load 9 and
/// 104 s at load 17.5: about 6 s per unit of load. 300 s leaves a margin
/// of three at load 15-17; a worker that really hangs while it starts is found
/// after it, each of its [`START_ATTEMPTS`](crate::START_ATTEMPTS).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

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
    /// imports) and longest silence while a worker builds an environment
    /// (it says so in a progress frame first), when longer than `timeout`
    /// (default [`STARTUP_TIMEOUT`]): [`BridgeConfig::build_patience`].
    pub startup_timeout: Duration,
    /// The Python interpreter (any with the packages the adapters need;
    /// the worker's own package is put on its `PYTHONPATH`).
    pub python: PathBuf,
    /// The table of the config keys that set the two deadlines (`bridge`
    /// for `bridge.timeout_s` and `bridge.startup_timeout_s`, `gym` in
    /// generate-tasks), named when a worker misses one; `None` when no
    /// key set them (a library caller).
    pub keys: Option<String>,
}

impl BridgeConfig {
    /// The interpreter a stage runs: its config key's when set, else
    /// `$EMBODYFLOW_GYM_PYTHON`, else [`DEFAULT_PYTHON`].
    pub fn python(key: Option<&std::path::Path>) -> PathBuf {
        key.map(PathBuf::from)
            .or_else(|| std::env::var_os(PYTHON_VAR).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PYTHON))
    }

    /// How long a worker may stay silent while it starts or builds an
    /// environment: the longer of `startup_timeout` and `timeout`.
    pub fn build_patience(&self) -> Duration {
        self.startup_timeout.max(self.timeout)
    }

    /// What set a deadline of `waited` and what to do about it:
    /// `bridge.startup_timeout_s = 300; raise it on a busy machine` for the
    /// build patience when `startup_timeout` gives it, else the same of
    /// `timeout_s`; the fields' names when no key set them.
    pub fn deadline(&self, waited: Duration) -> String {
        let startup = waited == self.startup_timeout && self.startup_timeout >= self.timeout;
        let (key, field, value) = match startup {
            true => ("startup_timeout_s", "startup_timeout", self.startup_timeout),
            false => ("timeout_s", "timeout", self.timeout),
        };
        let value = value.as_secs_f64();
        match &self.keys {
            Some(table) => format!("{table}.{key} = {value}; raise it on a busy machine"),
            None => format!("the bridge config's {field} = {value} s"),
        }
    }
}

impl Default for BridgeConfig {
    /// One worker, a 60 s timeout, [`STARTUP_TIMEOUT`] to start or build,
    /// `$EMBODYFLOW_GYM_PYTHON` or [`DEFAULT_PYTHON`], no keys.
    fn default() -> BridgeConfig {
        BridgeConfig {
            workers: 1,
            timeout: Duration::from_secs(60),
            startup_timeout: STARTUP_TIMEOUT,
            python: BridgeConfig::python(None),
            keys: None,
        }
    }
}
