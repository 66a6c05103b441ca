//! Config tables declared at run time by the parts of a stage that read
//! them: an estimator's `gae.*`, a reward's `reward.reward_coef`. Each
//! [`Section`] names its table and its type; the stage gathers the sections
//! of every registered part into its config ([`defaults`]), checks them all
//! when the config loads ([`check`]) and hands each part its settings typed
//! ([`read`]). The type carries everything else: defaults (`Default`), key
//! meanings (doc comments, `#[derive(ConfigKeys)]`), value checks
//! ([`SectionConfig::check`]).
//!
//! Several sections may share a table: each owns the keys of its own type
//! (the keys of its defaults) and reads only those, so rewards that each add
//! a key to `reward.*` stay one module each; a section declared twice (by
//! two estimators that both read `grpo.eps`) is the same keys twice.
//!
//! ```
//! use embodyflow_core::config::ConfigKeys;
//! use embodyflow_core::section::{self, Section, SectionConfig};
//! #[derive(serde::Serialize, serde::Deserialize, ConfigKeys)]
//! #[serde(default, deny_unknown_fields)]
//! struct Coef {
//!     /// Outcome reward for a completed task.
//!     reward_coef: f32,
//! }
//! impl Default for Coef {
//!     fn default() -> Self { Coef { reward_coef: 1.0 } }
//! }
//! impl SectionConfig<()> for Coef {
//!     fn check(&self, _: &()) -> embodyflow_core::Result<()> {
//!         embodyflow_core::config::positive("reward.reward_coef", f64::from(self.reward_coef))
//!     }
//! }
//! #[derive(serde::Serialize, serde::Deserialize, ConfigKeys, Default)]
//! #[serde(default, deny_unknown_fields)]
//! struct Tolerant {
//!     /// Tolerant parsing.
//!     tolerant: bool,
//! }
//! impl SectionConfig<()> for Tolerant {}
//!
//! let sections = [Section::of::<Coef>("reward"), Section::of::<Tolerant>("reward")];
//! let tree = section::defaults(&sections);
//! assert_eq!(tree["reward"], serde_json::json!({"reward_coef": 1.0, "tolerant": false}));
//! let coef: Coef = section::read::<(), Coef>("reward", &tree).unwrap();
//! assert_eq!(coef.reward_coef, 1.0);
//! let bad = serde_json::json!({"reward": {"reward_coef": 0.0, "tolerant": true}});
//! let err = section::check(&sections, &bad, &()).unwrap_err().to_string();
//! assert_eq!(err, "config key `reward.reward_coef`: expected a finite number above 0, found 0");
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::config::{ConfigKeys, dotted};
use crate::error::{Error, Result};

/// A table of settings (or a part of one) declared by what reads it, for a
/// stage whose whole config is `C`.
pub struct Section<C = ()> {
    /// The table's name, the prefix of its keys.
    pub name: &'static str,
    /// Its defaults as a JSON object.
    pub defaults: fn() -> Value,
    /// Its keys under a prefix, with their meanings.
    pub keys: fn(&str, &mut Vec<(String, &'static str)>),
    /// Reads its keys of the table (named by the first argument) as its
    /// type and checks their values ([`SectionConfig::check`]).
    pub check: fn(&str, &Value, &C) -> Result<()>,
    /// A boolean key that switches on what the section does, and what that
    /// is to the parts that declare it (`enabled`, `StepOPSD reweights`): a
    /// stage refuses it true for a part that does not declare the section.
    pub switch: Option<(&'static str, &'static str)>,
}

impl<C> Clone for Section<C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Section<C> {}

/// A section's type: serde with defaults, key meanings from its doc
/// comments, and the checks its values need.
pub trait SectionConfig<C = ()>: Serialize + DeserializeOwned + Default + ConfigKeys {
    /// Ranges and relations between keys (the helpers of [`crate::config`]
    /// name the full dotted key); `config` is the stage's whole config, for
    /// relations to other keys (the chosen estimator).
    fn check(&self, config: &C) -> Result<()> {
        let _ = config;
        Ok(())
    }
}

impl<C> Section<C> {
    /// The section of table `name` with type `T`.
    pub const fn of<T: SectionConfig<C>>(name: &'static str) -> Section<C> {
        Section {
            name,
            defaults: defaults_of::<T>,
            keys: T::config_keys,
            check: check_of::<C, T>,
            switch: None,
        }
    }

    /// The section with boolean key `key` switching on what it does
    /// (`what`, said of the parts that declare it).
    pub const fn switched_by(self, key: &'static str, what: &'static str) -> Section<C> {
        Section {
            switch: Some((key, what)),
            ..self
        }
    }

    /// Its keys with their meanings, prefixed with its table's name.
    pub fn key_docs(&self, out: &mut Vec<(String, &'static str)>) {
        (self.keys)(self.name, out)
    }
}

/// The tables of `sections` with their defaults: one JSON object per table
/// name, the keys of every section that shares it.
pub fn defaults<C>(sections: &[Section<C>]) -> Value {
    let mut tree = Map::new();
    for section in sections {
        let table = tree
            .entry(section.name)
            .or_insert_with(|| Value::Object(Map::new()));
        if let (Value::Object(table), Value::Object(own)) = (table, (section.defaults)()) {
            table.extend(own);
        }
    }
    Value::Object(tree)
}

/// Every section's keys read from `tree` (a config's tree, the tables by
/// name) and checked, in order: the first failure names its dotted key.
pub fn check<C>(sections: &[Section<C>], tree: &Value, config: &C) -> Result<()> {
    for section in sections {
        let table = tree.get(section.name).unwrap_or(&Value::Null);
        (section.check)(section.name, table, config)?;
    }
    Ok(())
}

/// The keys of type `T` in table `name` of `tree` (a config's tree), typed.
/// A key of a wrongly typed value is named (`reward.reward_coef`).
pub fn read<C, T: SectionConfig<C>>(name: &str, tree: &Value) -> Result<T> {
    let table = tree.get(name).unwrap_or(&Value::Null);
    typed::<C, T>(name, table)
}

/// `T`'s keys of `table`, typed.
fn typed<C, T: SectionConfig<C>>(name: &str, table: &Value) -> Result<T> {
    let own = defaults_of::<T>();
    let mut mine = Map::new();
    if let (Some(table), Some(own)) = (table.as_object(), own.as_object()) {
        for (key, value) in table {
            if own.contains_key(key) {
                mine.insert(key.clone(), value.clone());
            }
        }
    }
    serde_path_to_error::deserialize(Value::Object(mine)).map_err(|e| {
        let path = e.path().to_string();
        Error::BadValue {
            key: if path == "." {
                name.to_string()
            } else {
                dotted(name, &path)
            },
            reason: e.inner().to_string(),
        }
    })
}

/// `T`'s defaults, each `f32` as its shortest decimal (as
/// [`crate::config::defaults_tree`] writes them).
fn defaults_of<T: Serialize + Default>() -> Value {
    let text = serde_json::to_string(&T::default()).expect("a section's defaults serialise");
    serde_json::from_str(&text).expect("serde_json reads back what it wrote")
}

fn check_of<C, T: SectionConfig<C>>(name: &str, table: &Value, config: &C) -> Result<()> {
    typed::<C, T>(name, table)?.check(config)
}
