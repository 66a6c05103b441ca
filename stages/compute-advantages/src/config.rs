//! The stage's config: which estimator runs, the settings every estimator
//! shares, and the sections of settings the estimators declare, read from
//! the layered TOML config and `--set key=value` (see
//! `embodyflow_core::config`).
//!
//! The stage's own keys are `estimator`, `batch_rows` and `filter.*`; every
//! other table (`grpo`, `gae`, `gigpo`, `step`, `stepopsd`) is a
//! [`Section`] an estimator declares ([`crate::estimator::Estimator`]) and
//! the registry gathers ([`crate::registry`]): its type gives the keys, their
//! defaults, their meanings (doc comments, `#[derive(ConfigKeys)]`) and their
//! checks. Every section is resolved and checked whichever estimator runs,
//! so a config that loads is a config that runs with any `estimator =`.
//! Every table is `deny_unknown_fields`, so a misspelt key is an error that
//! names it before any work.
//!
//! ```text
//! estimator = "gae"          # one of the estimators `--help` lists
//! batch_rows = 256           # rows per record batch read from steps
//! [gae]
//! gamma = 0.99
//! lam = 0.95
//! level = "decision"         # token | decision
//! hold_mib = 48              # raw advantages kept from pass 1 (else a 2nd pass)
//! [filter]
//! dynamic_sampling = true    # drop groups whose scores are all equal
//! [gigpo]
//! gamma = 0.95               # discount of the step returns
//! step_weight = 1.0          # omega in A = A^E + omega * A^S
//! norm = "std"               # std | mean (both levels)
//! eps = 1e-6
//! episode_stats = "episodes" # episodes | steps (verl-agent's weighting)
//! ```

use embodyflow_core::config::ConfigKeys;
use embodyflow_core::section::{self, SectionConfig};
use embodyflow_core::stage::OutputConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `filter.*` settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Drop groups whose scores are all equal.
    pub dynamic_sampling: bool,
}

/// The keys every estimator shares (the estimators' sections apart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Common {
    /// Advantage estimator (one of the registered names).
    pub estimator: String,
    /// Group filter.
    #[keys(section)]
    pub filter: FilterConfig,
    /// Rows per record batch read from the steps table.
    pub batch_rows: usize,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl Default for Common {
    fn default() -> Self {
        Common {
            estimator: "grpo".into(),
            filter: FilterConfig::default(),
            batch_rows: 256,
            output: OutputConfig::default(),
        }
    }
}

/// The stage's config: the shared keys and every declared section's
/// resolved settings (as its JSON tree; [`Config::section`] reads one typed).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The estimator's name (a registered one: checked at load).
    pub estimator: String,
    /// Group filter.
    pub filter: FilterConfig,
    /// Rows per record batch read from the steps table.
    pub batch_rows: usize,
    /// Output layout.
    pub output: OutputConfig,
    /// Every section's settings: a JSON object of tables by name (`gae`,
    /// `step`, …).
    pub sections: Value,
}

impl Config {
    /// Section `name` as its type `T`. The section was checked when the
    /// config loaded, so reading it again cannot fail.
    pub fn section<T: SectionConfig<Config>>(&self, name: &str) -> T {
        section::read::<Config, T>(name, &self.sections)
            .unwrap_or_else(|e| panic!("section `{name}` was checked at load: {e}"))
    }

    pub(crate) fn from_parts(common: Common, sections: Value) -> Config {
        Config {
            estimator: common.estimator,
            filter: common.filter,
            batch_rows: common.batch_rows,
            output: common.output,
            sections,
        }
    }

    /// The config as one JSON tree: the shared keys and every section.
    pub(crate) fn to_tree(&self) -> Value {
        let common = Common {
            estimator: self.estimator.clone(),
            filter: self.filter.clone(),
            batch_rows: self.batch_rows,
            output: self.output.clone(),
        };
        let mut tree = serde_json::to_value(common).expect("the shared keys serialise");
        let map = tree.as_object_mut().expect("a struct is a JSON object");
        if let Value::Object(sections) = &self.sections {
            map.extend(sections.clone());
        }
        tree
    }
}

/// A table of settings an estimator declares (`gae.*`): its name and type
/// ([`embodyflow_core::section`]). Several estimators may declare the same
/// section (grpo, dr_grpo, grpo_step and grpo_passk all read `grpo.eps`);
/// it is one table of the config.
pub type Section = embodyflow_core::section::Section<Config>;
