//! The `generate-tasks` stage: writes the tasks table of one split of a
//! registered world through its [`Generator`].
//!
//! Every world of the registry ([`WORLDS`], one-shot and closed-loop
//! alike) declares its `env` name, its own keys (a
//! [`Settings`](embodyflow_world::generator::Settings) section at the top of this
//! stage's config), whether it writes LIBERO's initial-states protocol, and
//! how it writes a shard's tasks. The stage iterates the registry for the
//! config, `--help` and the checks and hands the chosen world's
//! [`Generator::write`] a [`TaskRequest`] of its config; it names no world.
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
//! What a world writes is documented with it ([`crate::household`],
//! [`embodyflow_tabletop::declaration`], [`embodyflow_gym::declaration`]); the interface it implements is
//! [`crate::generator`].

use std::sync::LazyLock;

use embodyflow_core::cli::StageArgs;
use embodyflow_core::config::{ConfigKeys, at_least, ensure, keys_of};
use embodyflow_core::schemas::{Split, TableName};
use embodyflow_core::section;
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::registry::{WORLDS, generator, generators, names_where};
use embodyflow_world::generator::{
    Generator, LIBERO_STATES, Protocol, ROOT, Settings, TaskRequest, TaskSink,
};
use embodyflow_world::world::WorldsError;

/// Every world's keys, in the order of [`WORLDS`].
fn sections() -> Vec<Settings> {
    generators().filter_map(|g| g.settings()).collect()
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
            env: WORLDS[0].tasks.name().to_string(),
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

    /// What the chosen world is asked: this config's keys and every
    /// world's own, and the registered worlds' names.
    pub fn request(&self) -> TaskRequest {
        TaskRequest {
            env: self.env.clone(),
            split: self.split,
            count: self.count,
            protocol: self.protocol,
            states: self.states,
            keys: self.worlds.clone(),
            worlds: generators().map(|g| g.name()).collect(),
        }
    }

    /// Whether the table holds tasks at initial states.
    pub fn initial_states(&self) -> bool {
        self.protocol == Protocol::InitialStates
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
        let request = self.request();
        section::check(&sections(), &request.tree(), &request)
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
    let mut sink = TaskSink::new(stage.writer(TableName::Tasks)?, summary);
    config
        .generator()
        .write(&config.request(), shard, seed, &mut sink)?;
    let (writer, summary) = sink.finish()?;
    stage.finish(writer)?;
    stage.commit(&summary)?;
    Ok(())
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
        let report = resolve(&["env=tabletop", "camera=area"]);
        assert!(report.problem.is_none(), "{:?}", report.problem);
        assert_eq!(report.config.unwrap()["camera"], "area");
        let problem = resolve(&["camera=area"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("camera"));
        assert!(problem.message.contains("household"), "{}", problem.message);
        let problem = resolve(&["env=tabletop", "camera=fisheye"])
            .problem
            .unwrap();
        assert_eq!(problem.key.as_deref(), Some("camera"));
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
        for world in WORLDS {
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
