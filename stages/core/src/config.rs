//! Stage configuration: defaults, then a TOML file, then `--set` overrides,
//! later wins; checked before any work starts.
//!
//! A stage's config is a serde struct with a `Default`. Its defaults are
//! serialised to a JSON tree; the file and each `--set dotted.key=value` are
//! merged into that tree, and a key the tree does not have is an error that
//! lists every valid key (an empty table in the defaults is an open map that
//! takes any key). A `--set` value is read as a TOML value (`0.5`, `true`,
//! `[1, 2]`, `"text"`) and as a plain string when it is none. The merged tree
//! is then deserialised into the struct; a value of the wrong type names its
//! dotted key (an enum such as `split` or `estimator` is a serde enum, so an
//! unknown name is a bad value listing the valid ones). Last, the values are
//! checked: `output.*` here, the stage's own ranges and relations between
//! keys by [`StageConfig::validate`] (the [`ensure`], [`at_least`],
//! [`positive`], [`non_negative`], [`finite`] and [`in_range`] helpers name the key, what was
//! expected and what was found). `--print-config`, the pipeline runner's
//! pre-check and the stage run all resolve through [`load_config`], so they
//! accept and reject the same configs. The resolved tree is what manifests
//! record; an `f32` default appears in it as its shortest decimal (`0.99`,
//! not the widened `0.9900000095367432`), see [`defaults_tree`]. A
//! `--config` file that cannot be read is bad usage (exit 2).
//!
//! A stage's thread keys (`threads`, `omp_wait_policy`: [`crate::threads`])
//! are not in its struct: its spec declares its pool, and
//! [`load_stage_config`] adds that pool's keys and defaults to the tree,
//! checks them and takes them out before the rest becomes the struct (the
//! resolved tree keeps them, so manifests record them).
//!
//! Each key's one-line meaning is declared once: the field's doc comment,
//! read by `#[derive(ConfigKeys)]` ([`ConfigKeys`]), or an entry of
//! [`StageConfig::KEYS`] for a config that lists them by hand;
//! [`keys_help`] renders `key = default   meaning` for `--help` from them
//! ([`StageConfig::key_docs`]) and the defaults tree, and [`check_key_docs`]
//! (run by each stage's tests) fails when the meanings and the tree disagree.
//!
//! ```
//! # use embodyflow_core::config::{load_config, positive};
//! # use embodyflow_core::stage::{OutputConfig, StageConfig};
//! #[derive(serde::Serialize, serde::Deserialize, Default)]
//! struct Step { omega: f64, kind: String }
//! #[derive(serde::Serialize, serde::Deserialize, Default)]
//! struct Config { estimator: String, step: Step, output: OutputConfig }
//! impl StageConfig for Config {
//!     const KEYS: &'static [(&'static str, &'static str)] = &[
//!         ("estimator", "advantage estimator"),
//!         ("step.omega", "weight of the step term"),
//!         ("step.kind", "how steps are credited"),
//!     ];
//!     fn output(&self) -> &OutputConfig { &self.output }
//!     fn validate(&self) -> embodyflow_core::Result<()> {
//!         positive("step.omega", self.step.omega)
//!     }
//! }
//!
//! let resolved = load_config::<Config>(None, &["step.omega=0.5".into(), "estimator=grpo_step".into()]).unwrap();
//! assert_eq!(resolved.config.step.omega, 0.5);
//! let err = load_config::<Config>(None, &["step.omeg=1".into()]).err().unwrap().to_string();
//! assert!(err.contains("`step.omeg`") && err.contains("step.omega"));
//! let err = load_config::<Config>(None, &["step.omega=abc".into()]).err().unwrap().to_string();
//! assert!(err.contains("`step.omega`"));
//! let err = load_config::<Config>(None, &["step.omega=-1".into()]).err().unwrap().to_string();
//! assert_eq!(err, "config key `step.omega`: expected a finite number above 0, found -1");
//! ```

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::checks::{at_least, ensure, finite, in_range, non_negative, positive};
use embodyflow_schemas::TableName;

use crate::dataset::WriteOptions;
use crate::error::{Error, Result};
use crate::threads::{Threads, ThreadsConfig};

/// A config type's dotted keys with their one-line meanings. Derived:
/// `#[derive(ConfigKeys)]` takes each meaning from the field's doc comment
/// (joined into one line, the final full stop dropped, the first word in
/// lower case unless it is an acronym); `#[keys(section)]` marks a table of
/// settings whose own keys follow its name, `#[keys(skip)]` a field whose
/// keys are documented elsewhere (`output`).
///
/// ```
/// use embodyflow_core::config::{ConfigKeys, keys_of};
/// #[derive(ConfigKeys)]
/// struct Gae {
///     /// Discount.
///     gamma: f32,
///     /// GAE lambda.
///     lam: f32,
/// }
/// /// Keys documented elsewhere.
/// struct Output;
/// #[derive(ConfigKeys)]
/// struct Config {
///     /// Rows per record batch read from the steps table.
///     batch_rows: usize,
///     /// GAE settings.
///     #[keys(section)]
///     gae: Gae,
///     /// Where the tables go.
///     #[keys(skip)]
///     output: Output,
/// }
/// assert_eq!(
///     keys_of::<Config>(),
///     [
///         ("batch_rows".to_string(), "rows per record batch read from the steps table"),
///         ("gae.gamma".to_string(), "discount"),
///         ("gae.lam".to_string(), "GAE lambda"),
///     ]
/// );
/// let mut nested = Vec::new();
/// <Config as ConfigKeys>::config_keys("sft", &mut nested);
/// assert_eq!(nested[2], ("sft.gae.lam".to_string(), "GAE lambda"));
/// ```
pub trait ConfigKeys {
    /// Appends each key under `prefix` (empty at the top) with its meaning.
    fn config_keys(prefix: &str, out: &mut Vec<(String, &'static str)>);
}

pub use embodyflow_config_derive::ConfigKeys;

/// The keys of `T` from the top, in field order.
pub fn keys_of<T: ConfigKeys>() -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    T::config_keys("", &mut out);
    out
}

/// `key` under `prefix`: `prefix.key`, or `key` at the top.
pub fn dotted(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// How a stage lays out the tables it writes (`output.*` keys of every stage).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct OutputConfig {
    /// Rows per Parquet shard file.
    pub rows_per_shard: usize,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
    /// zstd compression level, 1-22.
    pub zstd_level: i32,
}

impl OutputConfig {
    /// The meaning of each `output.*` key, shown in every stage's `--help`
    /// with the stage's own ([`StageConfig::key_docs`]).
    pub fn keys() -> Vec<(String, &'static str)> {
        let mut keys = Vec::new();
        <OutputConfig as ConfigKeys>::config_keys("output", &mut keys);
        keys
    }
}

impl Default for OutputConfig {
    fn default() -> Self {
        let d = WriteOptions::default();
        OutputConfig {
            rows_per_shard: d.rows_per_shard,
            row_group_rows: d.row_group_rows,
            zstd_level: d.zstd_level,
        }
    }
}

/// A stage's config type.
pub trait StageConfig: Serialize + DeserializeOwned + Default {
    /// Every dotted key of the config but `output.*` with its one-line
    /// meaning, for `--help` ([`keys_help`], which takes the
    /// defaults from `Default`). The keys are those the defaults tree has:
    /// [`check_key_docs`], called by each stage's tests,
    /// fails on a key without a meaning or a meaning without a key, so the
    /// table cannot drift from the struct. A config that derives
    /// [`ConfigKeys`] (its meanings are its fields' doc
    /// comments) leaves this empty and returns them from [`Self::key_docs`].
    const KEYS: &'static [(&'static str, &'static str)] = &[];

    /// Every dotted key but `output.*` with its one-line meaning: [`Self::KEYS`]
    /// unless the config derives them ([`keys_of`]).
    fn key_docs() -> Vec<(String, &'static str)> {
        Self::KEYS
            .iter()
            .map(|&(k, m)| (k.to_string(), m))
            .collect()
    }

    /// The output layout settings.
    fn output(&self) -> &OutputConfig;

    /// The config of a resolved tree (the stage's own keys, thread keys
    /// taken out): serde, a value of the wrong type naming its dotted key. A
    /// config whose tables are declared at run time (compute-advantages'
    /// estimator sections) reads them itself, naming keys the same way.
    fn from_tree(tree: serde_json::Value) -> Result<Self> {
        serde_path_to_error::deserialize(tree).map_err(|e| Error::BadValue {
            key: e.path().to_string(),
            reason: e.inner().to_string(),
        })
    }

    /// Checks what the types do not: ranges (a group size of at least 1, a
    /// temperature above 0, a probability in [0, 1]) and relations between
    /// keys, each failure a [`Error::BadValue`] naming the dotted key, what
    /// was expected and what was found (see the helpers in
    /// this module). [`load_config`] calls it after
    /// `output.*` is checked, so `--print-config`, the runner's pre-check and
    /// the run reject the same values before any work. Reads no file.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The tables this config makes its stage read besides those its spec
    /// reads on every run: which of the spec's conditional reads
    /// ([`crate::spec::Need::When`]) hold, decided by the stage's own code
    /// from the declarations it runs (an estimator's, a reward's, an
    /// objective's), so that what the stage opens and what it reports are
    /// one answer. `--print-config` reports them as `reads` and the
    /// runner's pre-check requires them of a step's inputs. A table read
    /// only when an input holds it (none required) is not listed.
    fn reads(&self) -> Vec<TableName> {
        Vec::new()
    }
}

/// A config struct with its resolved JSON tree.
#[derive(Debug, Clone)]
pub struct Resolved<C> {
    /// The typed config.
    pub config: C,
    /// The stage's thread keys (all 0 / unset for a stage without a pool).
    pub threads: ThreadsConfig,
    /// The fully resolved tree (recorded in manifests).
    pub json: Value,
}

/// What `STAGE --print-config` prints on stdout (one JSON object): the
/// resolved config, or the problem with the key that caused it.
///
/// ```
/// # use embodyflow_core::config::ConfigReport;
/// # use embodyflow_core::stage::{OutputConfig, StageConfig};
/// #[derive(serde::Serialize, serde::Deserialize, Default)]
/// struct Config { omega: f64, output: OutputConfig }
/// impl StageConfig for Config {
///     const KEYS: &'static [(&'static str, &'static str)] = &[("omega", "a weight")];
///     fn output(&self) -> &OutputConfig { &self.output }
/// }
/// let report = ConfigReport::resolve::<Config>("s", "0.1.0", None, &["omeg=1".into()]);
/// assert_eq!(report.problem.unwrap().key.as_deref(), Some("omeg"));
/// let report = ConfigReport::resolve::<Config>("s", "0.1.0", None, &["output.zstd_level=0".into()]);
/// assert_eq!(report.problem.unwrap().key.as_deref(), Some("output.zstd_level"));
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ConfigReport {
    /// Stage name.
    pub stage: String,
    /// Stage version.
    pub version: String,
    /// The resolved tree, when it resolves.
    pub config: Option<Value>,
    /// Why it does not resolve.
    pub problem: Option<ConfigProblem>,
    /// The tables the resolved config reads besides the stage's every-run
    /// reads ([`StageConfig::reads`]); empty when it does not resolve.
    #[serde(default)]
    pub reads: Vec<String>,
}

/// A config that does not resolve: the dotted key at fault (when one is) and
/// the message a stage run would print.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ConfigProblem {
    /// The dotted key (unknown, or with a bad value).
    pub key: Option<String>,
    /// The error message.
    pub message: String,
}

impl ConfigReport {
    /// Resolves and checks config `C` from `file` and `sets` into a report.
    pub fn resolve<C: StageConfig>(
        stage: &str,
        version: &str,
        file: Option<&Path>,
        sets: &[String],
    ) -> Self {
        Self::resolve_with::<C>(stage, Threads::Single, version, file, sets)
    }

    /// [`Self::resolve`] for stage `name` computing on pool `pool` (what its
    /// [`crate::spec::StageSpec`] declares), with its thread keys
    /// ([`load_stage_config`]): what `STAGE --print-config` prints.
    pub fn for_stage<C: StageConfig>(
        name: &str,
        pool: Threads,
        version: &str,
        file: Option<&Path>,
        sets: &[String],
    ) -> Self {
        Self::resolve_with::<C>(name, pool, version, file, sets)
    }

    fn resolve_with<C: StageConfig>(
        stage: &str,
        pool: Threads,
        version: &str,
        file: Option<&Path>,
        sets: &[String],
    ) -> Self {
        let (config, problem, reads) = match load_with::<C>(pool, file, sets) {
            Ok(resolved) => {
                let reads = resolved
                    .config
                    .reads()
                    .into_iter()
                    .map(|table| table.as_str().to_string())
                    .collect();
                (Some(resolved.json), None, reads)
            }
            Err(error) => {
                let key = match &error {
                    Error::UnknownKey { key, .. } | Error::BadValue { key, .. } => {
                        Some(key.clone())
                    }
                    _ => None,
                };
                let message = error.to_string();
                (None, Some(ConfigProblem { key, message }), Vec::new())
            }
        };
        ConfigReport {
            stage: stage.to_string(),
            version: version.to_string(),
            config,
            problem,
            reads,
        }
    }
}

/// The dotted key a config refuses under these `--set` overrides, as
/// `--print-config` and the runner's pre-check report it (the message when
/// the problem names no key); `None` when the config resolves. The stages'
/// tests of [`StageConfig::validate`] call it.
pub fn refused_key<C: StageConfig>(sets: &[&str]) -> Option<String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    ConfigReport::resolve::<C>("", "", None, &sets)
        .problem
        .map(|p| p.key.unwrap_or(p.message))
}

/// Loads a stage config: defaults, then `file`, then `sets` (`key=value`);
/// then checks its values (`output.*`, then [`StageConfig::validate`]).
pub fn load_config<C: StageConfig>(file: Option<&Path>, sets: &[String]) -> Result<Resolved<C>> {
    load_with::<C>(Threads::Single, file, sets)
}

/// [`load_config`] with the thread keys of pool `pool` (the stage's
/// [`StageSpec::threads`]): `threads` and, for torch, `omp_wait_policy`,
/// checked here and returned in [`Resolved::threads`].
///
/// ```
/// # use embodyflow_core::config::load_stage_config;
/// # use embodyflow_core::stage::{OutputConfig, StageConfig};
/// # use embodyflow_core::threads::{Threads, WaitPolicy};
/// #[derive(serde::Serialize, serde::Deserialize, Default)]
/// #[serde(default, deny_unknown_fields)]
/// struct Config { lr: f64, output: OutputConfig }
/// impl StageConfig for Config {
///     const KEYS: &'static [(&'static str, &'static str)] = &[("lr", "learning rate")];
///     fn output(&self) -> &OutputConfig { &self.output }
/// }
/// let r = load_stage_config::<Config>(Threads::Torch, None, &["threads=2".into()]).unwrap();
/// assert_eq!((r.threads.threads, r.threads.omp_wait_policy), (2, Some(WaitPolicy::Passive)));
/// assert_eq!(r.json["omp_wait_policy"], "passive");
/// let err = load_stage_config::<Config>(Threads::Torch, None, &["omp_wait_policy=spin".into()]);
/// assert!(err.err().unwrap().to_string().starts_with("config key `omp_wait_policy`: unknown variant `spin`"));
/// let err = load_stage_config::<Config>(Threads::Single, None, &["threads=2".into()]);
/// assert!(err.err().unwrap().to_string().starts_with("unknown config key `threads`"));
/// ```
pub fn load_stage_config<C: StageConfig>(
    pool: Threads,
    file: Option<&Path>,
    sets: &[String],
) -> Result<Resolved<C>> {
    load_with::<C>(pool, file, sets)
}

/// The defaults of `C` with the keys of `pool`.
fn defaults_with<C: StageConfig>(pool: Threads) -> Value {
    let mut defaults = defaults_tree::<C>();
    if let Value::Object(map) = &mut defaults {
        for (key, value) in pool.defaults() {
            assert!(
                !map.contains_key(&key),
                "`{key}` is a key of the stage's own config and of its thread pool"
            );
            map.insert(key, value);
        }
    }
    defaults
}

fn load_with<C: StageConfig>(
    pool: Threads,
    file: Option<&Path>,
    sets: &[String],
) -> Result<Resolved<C>> {
    let defaults = defaults_with::<C>(pool);
    let mut tree = defaults.clone();
    if let Some(path) = file {
        // The file is the user's input: missing or unreadable is bad usage.
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Usage(format!("--config {}: cannot read it: {e}", path.display()))
        })?;
        let table: toml::Table = toml::from_str(&text)
            .map_err(|e| Error::Usage(format!("config file {}: {e}", path.display())))?;
        let value = serde_json::to_value(table).expect("TOML values convert to JSON");
        merge(&mut tree, &defaults, value, "")?;
    }
    for set in sets {
        let (key, raw) = set
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| Error::Usage(format!("--set `{set}`: expected dotted.key=value")))?;
        let mut value = parse_set_value(raw);
        for part in key.trim().rsplit('.') {
            value = Value::Object(Map::from_iter([(part.to_string(), value)]));
        }
        merge(&mut tree, &defaults, value, "")?;
    }
    let mut own = tree.clone();
    let threads = ThreadsConfig::take_from(&mut own, pool)?;
    let config = C::from_tree(own)?;
    check_output(config.output())?;
    config.validate()?;
    Ok(Resolved {
        config,
        threads,
        json: tree,
    })
}

/// The defaults of `C` as a JSON tree, each `f32` as its shortest decimal.
///
/// `serde_json::to_value` widens an `f32` to the `f64` of the same binary
/// value (`0.99f32` becomes `0.9900000095367432`); its text serialiser writes
/// an `f32` as the shortest decimal that reads back as the same `f32`
/// (`0.99`). The tree is read back from that text: such a decimal has at most
/// 9 significant digits, which serde_json parses to the nearest `f64` (its
/// exact path for an exponent within ±22, which config values have), so the
/// `f32` field still deserialises to the same value.
///
/// ```
/// # use embodyflow_core::config::defaults_tree;
/// # use embodyflow_core::stage::{OutputConfig, StageConfig};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Config { gamma: f32, lr: f64, output: OutputConfig }
/// impl Default for Config {
///     fn default() -> Self { Config { gamma: 0.99, lr: 1e-5, output: OutputConfig::default() } }
/// }
/// impl StageConfig for Config {
///     const KEYS: &'static [(&'static str, &'static str)] = &[("gamma", "discount"), ("lr", "learning rate")];
///     fn output(&self) -> &OutputConfig { &self.output }
/// }
/// let tree = defaults_tree::<Config>();
/// assert_eq!(tree["gamma"].to_string(), "0.99");
/// assert_eq!(tree["lr"], 1e-5); // an f64 stays as it is
/// ```
pub fn defaults_tree<C: StageConfig>() -> Value {
    let text = serde_json::to_string(&C::default()).expect("a config's defaults serialise to JSON");
    serde_json::from_str(&text).expect("serde_json reads back what it wrote")
}

/// One key as `--help` lists it: dotted name, default, meaning.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyHelp {
    /// The dotted key.
    pub key: String,
    /// Its default (`null` for an unset optional key).
    pub default: Value,
    /// Its meaning from [`StageConfig::key_docs`] or [`OutputConfig::keys`].
    pub meaning: Option<&'static str>,
}

/// Every key of `C`'s defaults tree (as [`Error::UnknownKey`] lists them:
/// leaves, an open map as one key) with its default and meaning.
pub fn key_help<C: StageConfig>() -> Vec<KeyHelp> {
    key_help_with::<C>(Threads::Single)
}

/// [`key_help`] with the thread keys of `pool`.
fn key_help_with<C: StageConfig>(pool: Threads) -> Vec<KeyHelp> {
    let defaults = defaults_with::<C>(pool);
    let docs = C::key_docs();
    let output = OutputConfig::keys();
    let mut keys = Vec::new();
    leaf_keys(&defaults, "", &mut keys);
    keys.into_iter()
        .map(|key| {
            let default = key
                .split('.')
                .try_fold(&defaults, |node, part| node.get(part))
                .cloned()
                .unwrap_or(Value::Null);
            let meaning = docs
                .iter()
                .chain(&output)
                .map(|(k, m)| (k.as_str(), *m))
                .chain(pool.keys().iter().copied())
                .find(|(k, _)| *k == key)
                .map(|(_, m)| m);
            KeyHelp {
                key,
                default,
                meaning,
            }
        })
        .collect()
}

/// Whether [`StageConfig::KEYS`] documents exactly the keys of `C` (with
/// [`OutputConfig::keys`] for `output.*`): `Err` names every key without a
/// meaning, every documented key the config lacks and every key documented
/// twice.
pub fn check_key_docs<C: StageConfig>() -> std::result::Result<(), String> {
    let keys = key_help::<C>();
    let mut problems = Vec::new();
    for key in keys.iter().filter(|k| k.meaning.is_none()) {
        problems.push(format!("`{}` has no meaning in KEYS", key.key));
    }
    let docs = C::key_docs();
    for (i, (documented, _)) in docs.iter().enumerate() {
        if documented.starts_with("output.") {
            problems.push(format!(
                "KEYS documents `{documented}`, which OutputConfig documents"
            ));
        } else if !keys.iter().any(|k| k.key == *documented) {
            problems.push(format!(
                "KEYS documents `{documented}`, which the config lacks"
            ));
        }
        if docs[..i].iter().any(|(k, _)| k == documented) {
            problems.push(format!("KEYS documents `{documented}` twice"));
        }
    }
    for (documented, meaning) in docs.iter().chain(&OutputConfig::keys()) {
        if meaning.trim().is_empty() || meaning.contains('\n') {
            problems.push(format!(
                "KEYS: the meaning of `{documented}` is not one line"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The config keys for `--help`: one line each, `key = default   meaning`
/// (a string default quoted as TOML writes it, an unset optional key as
/// `unset`).
pub fn keys_help<C: StageConfig>() -> String {
    keys_help_with::<C>(Threads::Single)
}

/// [`keys_help`] with the thread keys of `pool` (a stage's `--help`).
pub fn keys_help_with<C: StageConfig>(pool: Threads) -> String {
    let keys = key_help_with::<C>(pool);
    let lefts: Vec<String> = keys
        .iter()
        .map(|k| {
            let default = match &k.default {
                Value::Null => "unset".to_string(),
                other => other.to_string(),
            };
            format!("{} = {default}", k.key)
        })
        .collect();
    let width = lefts
        .iter()
        .map(|l| l.len())
        .filter(|&l| l <= 44)
        .max()
        .unwrap_or(0);
    let mut text =
        String::from("Config keys (--set key=value or --config FILE.toml; defaults shown):\n");
    for (left, key) in lefts.iter().zip(&keys) {
        let meaning = key.meaning.unwrap_or("(undocumented)");
        if left.len() <= width {
            text.push_str(&format!("  {left:<width$}   {meaning}\n"));
        } else {
            text.push_str(&format!("  {left}\n  {:<width$}   {meaning}\n", ""));
        }
    }
    text
}

/// The `output.*` keys every stage has: positive sizes, a zstd level of 1-22.
fn check_output(output: &OutputConfig) -> Result<()> {
    at_least("output.rows_per_shard", output.rows_per_shard, 1)?;
    at_least("output.row_group_rows", output.row_group_rows, 1)?;
    ensure(
        (1..=22).contains(&output.zstd_level),
        "output.zstd_level",
        "a zstd level from 1 to 22",
        output.zstd_level,
    )
}

/// Reads a `--set` value as TOML, or as a string when it is not TOML.
fn parse_set_value(raw: &str) -> Value {
    match toml::from_str::<toml::Table>(&format!("value = {raw}")) {
        Ok(mut table) => serde_json::to_value(table.remove("value").expect("parsed key"))
            .expect("TOML converts to JSON"),
        Err(_) => Value::String(raw.to_string()),
    }
}

/// Merges `value` into `tree` at `prefix`, checking keys against `defaults`.
fn merge(tree: &mut Value, defaults: &Value, value: Value, prefix: &str) -> Result<()> {
    let (Value::Object(tree_map), Value::Object(incoming)) = (&mut *tree, value.clone()) else {
        *tree = value;
        return Ok(());
    };
    let default_map = defaults.as_object();
    let open_map = default_map.is_none_or(|m| m.is_empty());
    for (key, incoming_value) in incoming {
        let dotted = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let default_child = default_map.and_then(|m| m.get(&key));
        if default_child.is_none() && !open_map {
            let mut valid = Vec::new();
            leaf_keys(defaults, prefix, &mut valid);
            return Err(Error::UnknownKey { key: dotted, valid });
        }
        match (tree_map.get_mut(&key), default_child) {
            (Some(child), Some(default_child)) if default_child.is_object() => {
                if !incoming_value.is_object() {
                    return Err(Error::BadValue {
                        key: dotted,
                        reason: format!("is a table of settings, found the value {incoming_value}"),
                    });
                }
                merge(child, default_child, incoming_value, &dotted)?;
            }
            _ => {
                tree_map.insert(key, incoming_value);
            }
        }
    }
    Ok(())
}

/// Every dotted leaf key of a defaults tree.
fn leaf_keys(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (key, child) in map {
                let dotted = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                leaf_keys(child, &dotted, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
    #[serde(default)]
    struct Inner {
        omega: f64,
        mode: String,
        min_tokens: u32,
        tau: Option<f64>,
    }
    impl Default for Inner {
        fn default() -> Self {
            Inner {
                omega: 1.0,
                mode: "exact".into(),
                min_tokens: 2,
                tau: None,
            }
        }
    }
    #[derive(Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
    #[serde(default)]
    struct Config {
        estimator: String,
        step: Inner,
        templates: BTreeMap<String, String>,
        output: OutputConfig,
    }

    impl StageConfig for Config {
        const KEYS: &'static [(&'static str, &'static str)] = &[
            ("estimator", "the estimator"),
            ("step.omega", "step weight"),
            ("step.mode", "match mode"),
            ("step.min_tokens", "fewest tokens"),
            ("step.tau", "temperature"),
            ("templates", "prompt templates by name"),
        ];
        fn output(&self) -> &OutputConfig {
            &self.output
        }
        fn validate(&self) -> Result<()> {
            in_range("step.omega", self.step.omega, 0.0, 1.0)?;
            at_least("step.min_tokens", self.step.min_tokens, 1)?;
            if let Some(tau) = self.step.tau {
                positive("step.tau", tau)?;
            }
            ensure(
                self.step.mode == "exact" || self.step.mode == "lcs",
                "step.mode",
                "exact or lcs",
                format!("`{}`", self.step.mode),
            )
        }
    }

    fn sets(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn layers_defaults_file_and_sets_with_later_winning() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "estimator = 'gae'\n[step]\nomega = 0.25\nmode = 'lcs'\n",
        )
        .unwrap();
        let r = load_config::<Config>(
            Some(&file),
            &sets(&["step.omega=0.5", "step.tau=2", "step.omega=0.75"]),
        )
        .unwrap();
        assert_eq!(r.config.estimator, "gae");
        assert_eq!(r.config.step.omega, 0.75);
        assert_eq!(r.config.step.mode, "lcs");
        assert_eq!(r.config.step.tau, Some(2.0));
        assert_eq!(r.config.step.min_tokens, 2);
        assert_eq!(r.json["step"]["omega"], 0.75);
    }

    #[test]
    fn unknown_keys_are_named_with_the_valid_ones() {
        let err = load_config::<Config>(None, &sets(&["step.omgea=1"])).unwrap_err();
        match &err {
            Error::UnknownKey { key, valid } => {
                assert_eq!(key, "step.omgea");
                assert!(
                    valid.contains(&"step.omega".to_string())
                        && valid.contains(&"step.tau".to_string()),
                    "{valid:?}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = load_config::<Config>(None, &sets(&["nonsense=1"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`nonsense`") && err.contains("estimator"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_in_the_file_are_named_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[step]\nomega = 0.25\nsquash = 'prob'\n").unwrap();
        let err = load_config::<Config>(Some(&file), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`step.squash`"), "{err}");
    }

    #[test]
    fn badly_typed_values_name_the_key() {
        for (set, key) in [
            ("step.omega=abc", "step.omega"),
            ("step.min_tokens=-3", "step.min_tokens"),
            ("step.mode=3", "step.mode"),
        ] {
            let err = load_config::<Config>(None, &sets(&[set])).unwrap_err();
            assert!(
                matches!(&err, Error::BadValue { key: k, .. } if k == key),
                "{set}: {err}"
            );
            assert!(err.to_string().contains(&format!("`{key}`")), "{err}");
        }
        let err = load_config::<Config>(None, &sets(&["step=1"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`step`"), "{err}");
    }

    #[test]
    fn values_out_of_range_name_the_key_with_expected_and_found() {
        for (set, key, reason) in [
            (
                "step.omega=1.5",
                "step.omega",
                "expected a number in [0, 1], found 1.5",
            ),
            (
                "step.min_tokens=0",
                "step.min_tokens",
                "expected at least 1, found 0",
            ),
            (
                "step.tau=0",
                "step.tau",
                "expected a finite number above 0, found 0",
            ),
            (
                "step.mode=fuzzy",
                "step.mode",
                "expected exact or lcs, found `fuzzy`",
            ),
            (
                "output.rows_per_shard=0",
                "output.rows_per_shard",
                "expected at least 1, found 0",
            ),
            (
                "output.row_group_rows=0",
                "output.row_group_rows",
                "expected at least 1, found 0",
            ),
            (
                "output.zstd_level=23",
                "output.zstd_level",
                "expected a zstd level from 1 to 22, found 23",
            ),
        ] {
            let err = load_config::<Config>(None, &sets(&[set])).unwrap_err();
            match &err {
                Error::BadValue { key: k, reason: r } => {
                    assert_eq!((k.as_str(), r.as_str()), (key, reason), "{set}")
                }
                other => panic!("{set}: unexpected {other:?}"),
            }
            let report = ConfigReport::resolve::<Config>("s", "0", None, &sets(&[set]));
            let problem = report.problem.expect("rejected");
            assert_eq!(problem.key.as_deref(), Some(key), "{set}");
            assert_eq!(problem.message, err.to_string());
            assert!(report.config.is_none());
        }
        // In range and the defaults pass.
        load_config::<Config>(
            None,
            &sets(&["step.omega=1", "step.tau=0.5", "step.mode=lcs"]),
        )
        .unwrap();
        assert!(
            ConfigReport::resolve::<Config>("s", "0", None, &[])
                .problem
                .is_none()
        );
    }

    #[test]
    fn a_missing_config_file_is_bad_usage_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        let err = load_config::<Config>(Some(&missing), &[]).unwrap_err();
        assert!(matches!(&err, Error::Usage(_)), "{err:?}");
        assert_eq!(crate::Classify::kind(&err), crate::ErrorKind::BadInput);
        assert!(err.to_string().contains("missing.toml"), "{err}");
        // A directory is not a config file either.
        let err = load_config::<Config>(Some(dir.path()), &[]).unwrap_err();
        assert!(matches!(&err, Error::Usage(_)), "{err:?}");
    }

    #[test]
    fn f32_values_resolve_to_their_shortest_decimal() {
        #[derive(Debug, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        struct Floats {
            gamma: f32,
            lam: f32,
            lr: f64,
            output: OutputConfig,
        }
        impl Default for Floats {
            fn default() -> Self {
                Floats {
                    gamma: 0.99,
                    lam: 0.95,
                    lr: 1e-5,
                    output: OutputConfig::default(),
                }
            }
        }
        impl StageConfig for Floats {
            const KEYS: &'static [(&'static str, &'static str)] =
                &[("gamma", "g"), ("lam", "l"), ("lr", "r")];
            fn output(&self) -> &OutputConfig {
                &self.output
            }
        }
        // Widening gives the long form this replaces.
        assert_eq!(
            serde_json::to_value(Floats::default()).unwrap()["gamma"].to_string(),
            "0.9900000095367432"
        );
        let resolved = load_config::<Floats>(None, &sets(&["lam=0.9"])).unwrap();
        let text = serde_json::to_string(&resolved.json).unwrap();
        assert!(
            text.contains(r#""gamma":0.99,"#) && text.contains(r#""lam":0.9,"#),
            "{text}"
        );
        assert!(text.contains(r#""lr":0.00001,"#), "{text}");
        assert_eq!(resolved.config.gamma, 0.99f32);
        let report = ConfigReport::resolve::<Floats>("s", "0", None, &[]);
        let printed = serde_json::to_string(&report).unwrap();
        assert!(printed.contains(r#""gamma":0.99,"#), "{printed}");
        // Every f32 reads back as itself through the tree.
        for bits in (0..u32::MAX).step_by(7_919_993) {
            let value = f32::from_bits(bits);
            if !value.is_finite() || value.abs() < 1e-20 || value.abs() > 1e20 {
                continue;
            }
            let tree: Value =
                serde_json::from_str(&serde_json::to_string(&value).unwrap()).unwrap();
            let back: f32 = serde_json::from_value(tree).unwrap();
            assert_eq!(back.to_bits(), bits, "{value}");
        }
    }

    #[test]
    fn key_docs_must_match_the_defaults_tree() {
        assert_eq!(check_key_docs::<Config>(), Ok(()));
        let help = keys_help::<Config>();
        for line in [
            "step.omega = 1.0",
            "step.mode = \"exact\"",
            "step.tau = unset",
            "templates = {}",
            "output.zstd_level = ",
            "rows per Parquet shard file",
        ] {
            assert!(help.contains(line), "{line}:\n{help}");
        }
        let omega = help.lines().find(|l| l.contains("step.omega")).unwrap();
        assert!(omega.ends_with("   step weight"), "{omega}");

        #[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
        struct Drifted {
            kept: u32,
            added: u32,
            output: OutputConfig,
        }
        impl StageConfig for Drifted {
            const KEYS: &'static [(&'static str, &'static str)] = &[
                ("kept", "still here"),
                ("removed", "a key the struct lost"),
                ("kept", "again"),
                ("output.zstd_level", "documented in core"),
            ];
            fn output(&self) -> &OutputConfig {
                &self.output
            }
        }
        let err = check_key_docs::<Drifted>().unwrap_err();
        for part in [
            "`added` has no meaning",
            "`removed`, which the config lacks",
            "`kept` twice",
            "`output.zstd_level`, which OutputConfig documents",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        assert!(keys_help::<Drifted>().contains("added = 0"));
    }

    #[test]
    fn open_maps_take_any_key_and_malformed_sets_are_usage_errors() {
        let r = load_config::<Config>(None, &sets(&["templates.teacher=Plan: {plan}"])).unwrap();
        assert_eq!(r.config.templates["teacher"], "Plan: {plan}");
        assert!(matches!(
            load_config::<Config>(None, &sets(&["=3"])),
            Err(Error::Usage(_))
        ));
        assert!(matches!(
            load_config::<Config>(None, &sets(&["omega"])),
            Err(Error::Usage(_))
        ));
    }
}
