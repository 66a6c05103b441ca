//! The `generate-tasks` stage: writes the tasks table of one split of a
//! registered world, and the interface through which each world says how
//! ([`Generator`]).
//!
//! Every world of the registry ([`WORLDS`](crate::WORLDS), one-shot and
//! closed-loop alike) declares its `env` name, its own keys (a [`Settings`]
//! section at the top of this stage's config: its type's fields with their
//! doc comments, defaults and value checks), whether it writes LIBERO's
//! initial-states protocol, and how it writes a shard's tasks. The stage
//! iterates the registry for the config, `--help` and the checks and runs
//! the chosen world's [`Generator::write`]; it names no world. What each
//! world writes is documented with it: [`crate::household`],
//! [`crate::tabletop`], [`crate::gym`].
//!
//! Keys of every world: `env` (a registered world's name), `split`
//! (`train` | `val` | `unseen` | `test`), `count`, `protocol` and
//! `states`. The task seeds derive from `--seed`, so a rerun writes the
//! same table. `protocol` picks what a table holds: `layouts` (the default:
//! `count` tasks of `split`) or `initial-states` (LIBERO's protocol: `count`
//! tasks at `states` initial states each, [`LIBERO_STATES`] by default, of
//! `split` = `train`, `val` or `test`, for a world that draws them:
//! [`Generator::initial_states`]); `split = test` belongs to that protocol
//! alone, `unseen` (held-out goals) to the layouts protocol. A bad name, a
//! count of 0, a key of another world's (`suite` with `env = household`)
//! or an unknown `env` (the message names the registered ones) is rejected
//! when the config is loaded (exit 2, also by `--print-config`). The
//! summary counts tasks by type.
//!
//! ```text
//! generate-tasks --out data/val --set split=val --set count=200 --seed 7
//! generate-tasks --out data/tabletop-train --set env=tabletop --set suite=spatial --set count=500 --seed 7
//! generate-tasks --out data/goal-test --set env=tabletop --set suite=goal --set protocol=initial-states \
//!     --set count=7 --set states=50 --set split=test --seed 1
//! generate-tasks --out data/babyai-train --set env=gym --set gym.adapter=babyai \
//!     --set 'gym.env_ids=["BabyAI-GoToLocal-v0","BabyAI-PickupLoc-v0"]' --set count=64 --seed 7
//! ```
//!
//! A world's generator, in outline (the test-only `toy` world of this crate
//! is a whole one):
//!
//! ```text
//! #[derive(Serialize, Deserialize, Default, ConfigKeys)]
//! #[serde(default, deny_unknown_fields)]
//! struct CorridorKeys {
//!     /// Cells of the shortest corridor (env = corridor).
//!     corridor_min: u32,
//! }
//! impl SectionConfig<Config> for CorridorKeys { /* its value checks */ }
//! impl Generator for Corridor {
//!     fn name(&self) -> &'static str { "corridor" }
//!     fn settings(&self) -> Option<Settings> { Some(Settings::of::<CorridorKeys>(ROOT)) }
//!     fn write(&self, config: &Config, shard: ShardSpec, seed: u64, sink: &mut TaskSink) -> ... {
//!         let keys: CorridorKeys = config.keys()?;
//!         // sink.push(row) for each task the shard owns, then its summary lines
//!     }
//! }
//! ```

use std::collections::BTreeMap;
use std::sync::LazyLock;

use embodyflow_core::cli::{ShardSpec, StageArgs};
use embodyflow_core::config::{ConfigKeys, at_least, ensure, keys_of};
use embodyflow_core::dataset::TableWriter;
use embodyflow_core::schemas::{Split, TableName, TaskRow};
use embodyflow_core::section::{self, Section, SectionConfig};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::WorldsError;

/// How `generate-tasks` writes a world's tasks (`env = NAME`): one
/// `pub static` value per world, listed once in [`WORLDS`](crate::WORLDS).
pub trait Generator: Sync {
    /// `env = NAME`.
    fn name(&self) -> &'static str;

    /// Its own keys (`image_size`, `suite`, `gym.*`): a section of the
    /// config's top level ([`ROOT`]), whose type's doc comments are the
    /// keys' meanings and whose checks see the whole config (a world's key
    /// set for another world is refused there). `None`: no keys of its own.
    fn settings(&self) -> Option<Settings> {
        None
    }

    /// Whether it writes `protocol = initial-states` tables (`count` tasks
    /// at `states` initial states each).
    fn initial_states(&self) -> bool {
        false
    }

    /// Writes the tasks of `config` that `shard` owns into `sink` (their
    /// seeds drawn from `seed`) and adds its lines to the sink's summary.
    /// Its own keys are [`Config::keys`].
    fn write(
        &self,
        config: &Config,
        shard: ShardSpec,
        seed: u64,
        sink: &mut TaskSink,
    ) -> std::result::Result<(), WorldsError>;
}

/// A world's keys in the stage's config ([`Generator::settings`]).
pub type Settings = Section<Config>;

/// The table of a world's keys: the config's top level (its keys are
/// `image_size`, `suite`, and `gym.*` for a type whose field is `gym`).
pub const ROOT: &str = "";

/// LIBERO's initial states per task (its `init_states` files): the
/// default of `states`.
pub const LIBERO_STATES: u32 = 50;

/// Every world's generator, in the order of [`WORLDS`](crate::WORLDS).
pub fn generators() -> impl Iterator<Item = &'static dyn Generator> {
    crate::WORLDS.iter().map(|w| w.tasks)
}

/// The generator of `env = name`.
pub fn generator(name: &str) -> Option<&'static dyn Generator> {
    generators().find(|g| g.name() == name)
}

/// Every world's keys, in the order of [`WORLDS`](crate::WORLDS).
fn sections() -> Vec<Settings> {
    generators().filter_map(|g| g.settings()).collect()
}

/// `a, b or c`.
fn either(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The names of the worlds `keep` keeps, as `a, b or c`.
pub fn names_where(keep: impl Fn(&dyn Generator) -> bool) -> String {
    let names: Vec<&str> = generators()
        .filter(|g| keep(*g))
        .map(|g| g.name())
        .collect();
    either(&names)
}

/// The meaning of `env`, naming every world.
static ENV_MEANING: LazyLock<String> =
    LazyLock::new(|| format!("environment: {}", names_where(|_| true)));

/// Command line of `generate-tasks`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::GENERATE_TASKS.name,
    version,
    about = spec::GENERATE_TASKS.purpose,
    after_help = spec::GENERATE_TASKS.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
}

/// What a table holds (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `count` tasks, each in a layout of its own split.
    #[default]
    Layouts,
    /// `count` tasks at `states` initial states each (LIBERO's protocol).
    InitialStates,
}

/// The stage's config: the keys of every world, and each world's own keys
/// ([`Generator::settings`]) at the top level beside them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default)]
pub struct Config {
    /// The world whose tasks are written (its meaning names them all).
    #[keys(skip)]
    pub env: String,
    /// Task split: train, val, unseen, or test (protocol = initial-states).
    pub split: Split,
    /// Number of tasks to generate (at least 1).
    pub count: usize,
    /// Layouts (val = new layouts, unseen = held-out goals) or
    /// initial-states (LIBERO's: count tasks at `states` initial states
    /// each; split train, val or test; the worlds that draw them).
    pub protocol: Protocol,
    /// Initial states per task with protocol = initial-states (LIBERO: 50;
    /// at least 1).
    pub states: u32,
    /// Every world's own keys as resolved (read typed by [`Config::keys`]).
    #[serde(flatten)]
    #[keys(skip)]
    pub worlds: Map<String, Value>,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        let worlds = match section::defaults(&sections()).get(ROOT) {
            Some(Value::Object(keys)) => keys.clone(),
            _ => Map::new(),
        };
        Config {
            env: crate::WORLDS[0].tasks.name().to_string(),
            split: Split::Train,
            count: 1000,
            protocol: Protocol::Layouts,
            states: LIBERO_STATES,
            worlds,
            output: OutputConfig::default(),
        }
    }
}

impl Config {
    /// The chosen world's generator (`env` was checked at load).
    pub fn generator(&self) -> &'static dyn Generator {
        generator(&self.env).expect("`env` was checked at load")
    }

    /// A world's keys, typed (its [`Generator::settings`] type).
    pub fn keys<T: SectionConfig<Config>>(&self) -> Result<T> {
        section::read::<Config, T>(ROOT, &self.tree())
    }

    /// Whether the chosen world is `name`.
    pub fn is(&self, name: &str) -> bool {
        self.env == name
    }

    /// Whether the table holds tasks at initial states.
    pub fn initial_states(&self) -> bool {
        self.protocol == Protocol::InitialStates
    }

    /// The worlds' keys as the sections read them: the top level as table
    /// [`ROOT`].
    fn tree(&self) -> Value {
        Value::Object(Map::from_iter([(
            ROOT.to_string(),
            Value::Object(self.worlds.clone()),
        )]))
    }
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        let mut keys = vec![("env".to_string(), ENV_MEANING.as_str())];
        keys.extend(keys_of::<Config>());
        for section in sections() {
            let mut own = Vec::new();
            section.key_docs(&mut own);
            // A key two worlds share is documented once.
            for (key, meaning) in own {
                if !keys.iter().any(|(k, _)| *k == key) {
                    keys.push((key, meaning));
                }
            }
        }
        keys
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    /// `env` a registered world; `count` and `states` at least 1; the
    /// protocol one the world draws, with its splits; then every world's
    /// own checks.
    fn validate(&self) -> Result<()> {
        if generator(&self.env).is_none() {
            let names: Vec<String> = generators().map(|g| format!("`{}`", g.name())).collect();
            return Err(Error::BadValue {
                key: "env".into(),
                reason: format!(
                    "unknown variant `{}`, expected one of {}",
                    self.env,
                    names.join(", ")
                ),
            });
        }
        at_least("count", self.count, 1)?;
        at_least("states", self.states, 1)?;
        let states = self.initial_states();
        ensure(
            !states || self.generator().initial_states(),
            "protocol",
            &format!(
                "initial-states with env = {}",
                names_where(|g| g.initial_states())
            ),
            "initial-states",
        )?;
        ensure(
            !(states && self.split == Split::Unseen),
            "split",
            "train, val or test with protocol = initial-states (held-out goals are the layouts protocol's unseen)",
            self.split,
        )?;
        ensure(
            states || self.split != Split::Test,
            "split",
            "train, val or unseen (test is the initial-states protocol's: set protocol = initial-states)",
            self.split,
        )?;
        section::check(&sections(), &self.tree(), self)
    }
}

/// Runs the stage: the chosen world writes the shard's tasks.
pub fn run(args: Args) -> std::result::Result<(), WorldsError> {
    let stage = Stage::<Config>::start(
        &spec::GENERATE_TASKS,
        env!("CARGO_PKG_VERSION"),
        &args.stage,
    )?;
    let config = &stage.config;
    stage.check_outputs(&[TableName::Tasks])?;
    let (shard, seed) = (stage.args.shard, stage.args.seed);
    let mut summary = Summary::new(format!("generate-tasks ({})", config.split));
    summary.add("shard", shard).add("seed", seed);
    let mut sink = TaskSink {
        writer: stage.writer(TableName::Tasks)?,
        rows: Vec::new(),
        summary,
    };
    config.generator().write(config, shard, seed, &mut sink)?;
    let TaskSink {
        mut writer,
        rows,
        summary,
    } = sink;
    writer.write_rows(&rows)?;
    stage.finish(writer)?;
    stage.commit(&summary)?;
    Ok(())
}

/// Where a world's tasks go: the table writer, the rows waiting for it,
/// and the summary the world adds its lines to.
pub struct TaskSink {
    writer: TableWriter,
    rows: Vec<TaskRow>,
    /// The stage's summary (shard and seed, then the world's lines).
    pub summary: Summary,
}

impl TaskSink {
    /// Adds `row`; the waiting rows are written once 4096 wait.
    pub fn push(&mut self, row: TaskRow) -> Result<()> {
        self.rows.push(row);
        if self.rows.len() >= 4096 {
            self.writer.write_rows(&self.rows)?;
            self.rows.clear();
        }
        Ok(())
    }

    /// Adds each name's task count to the summary, in name order.
    pub fn add_counts<K: Into<String>>(&mut self, counts: BTreeMap<K, usize>) {
        for (name, n) in counts {
            self.summary.add(name, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::ConfigReport;

    fn resolve(sets: &[&str]) -> ConfigReport {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        ConfigReport::resolve::<Config>("generate-tasks", "0", None, &sets)
    }

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert!(resolve(&[]).problem.is_none(), "the defaults pass");
        let report = resolve(&["split=unseen", "count=1"]);
        assert_eq!(report.config.unwrap()["split"], "unseen");
        let problem = resolve(&["split=bogus"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("split"));
        assert!(
            problem.message.contains("bogus") && problem.message.contains("`unseen`"),
            "{}",
            problem.message
        );
        let problem = resolve(&["count=0"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("count"));
        let report = resolve(&["env=tabletop", "suite=long"]);
        assert!(report.problem.is_none(), "{:?}", report.problem);
        assert_eq!(report.config.unwrap()["suite"], "long");
        let problem = resolve(&["suite=goal"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("suite"));
        assert!(problem.message.contains("household"), "{}", problem.message);
        let problem = resolve(&["env=tabletop", "suite=kitchen"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("suite"));
        let problem = resolve(&["protocol=initial-states", "split=test"])
            .problem
            .unwrap();
        assert_eq!(problem.key.as_deref(), Some("protocol"));
        assert!(
            problem.message.contains("tabletop or gym"),
            "{}",
            problem.message
        );
    }

    #[test]
    fn an_unknown_env_names_every_registered_world() {
        let problem = resolve(&["env=lab"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("env"));
        assert!(problem.message.contains("`lab`"), "{}", problem.message);
        for world in crate::WORLDS {
            let name = world.tasks.name();
            assert!(
                problem.message.contains(&format!("`{name}`")),
                "{name}: {}",
                problem.message
            );
            assert!(ENV_MEANING.contains(name), "{name}: {}", *ENV_MEANING);
        }
    }

    #[test]
    fn a_scene_image_is_a_household_key_within_the_renderers_sizes() {
        assert!(resolve(&["image_size=64"]).problem.is_none());
        for sets in [&["image_size=8"][..], &["env=tabletop", "image_size=64"]] {
            let problem = resolve(sets).problem.unwrap();
            assert_eq!(problem.key.as_deref(), Some("image_size"), "{sets:?}");
        }
    }

    #[test]
    fn a_worlds_key_of_the_wrong_type_is_named() {
        let problem = resolve(&["env=gym", "gym.max_steps=many"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("gym.max_steps"));
        let problem = resolve(&["env=gym", "gym.max_steps=0"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("gym.max_steps"));
    }
}

/// The stage's key meanings document exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
    }
}
