//! The `generate-tasks` stage: writes the tasks table of one split of a
//! built-in environment.
//!
//! `env` (`household` | `tabletop` | `gym`), `split` (`train` | `val` | `unseen`),
//! `count` and, for the tabletop world, `suite` (`spatial` | `object` |
//! `goal` | `long` | `all`; unset means `all`) are config keys; the task seeds
//! derive from `--seed`, so a rerun writes the same table. With `suite =
//! all`, task `i` belongs to suite `i mod 4` (spatial, object, goal, long)
//! with index `i div 4` in it. A bad name, a count of 0 or a `suite` with
//! `env = household` is rejected when the config is loaded (exit 2, also by
//! `--print-config`). The summary counts tasks by type (and suite).
//!
//! Tabletop rows carry the whole scene spec as JSON in `observation`
//! (see `embodyflow_tabletop::rows`); their ids read
//! `tabletop-<suite>/<split>/<seed>/<index>`.
//!
//! `protocol` picks what a tabletop table holds. `layouts` (the default):
//! `count` tasks of `split`, val being the train combinations in new
//! layouts and unseen the held-out goals. `initial-states` (LIBERO's
//! protocol, `embodyflow_tabletop::initial_state`): `count` tasks of one
//! `suite` (the goal suite has seven), each at `states` initial states
//! (LIBERO: 50) of `split` = `train`, `val` or `test` — disjoint draws of
//! the same tasks, state-major (every task's state 0, then state 1, ...),
//! ids `tabletop-<suite>/<seed>/<index>@<split>/<state>`. `split = test`
//! belongs to this protocol alone. With `env = gym` it draws environments
//! with fixed, indexed initial states (LIBERO's 50 per task: the `libero`
//! adapter's reset seed is the index): `count` tasks (the first `count` of
//! `gym.env_ids`), each at the `states` initial states
//! `gym.first_state ..` (reset seeds, state-major), ids
//! `gym-<adapter>/<env id>@<split>/<state>`; the splits are disjoint
//! ranges of the same tasks' states (e.g. train 0..40, val 40..50, each
//! table naming its range), a held-out-tasks table other env ids. An index
//! the environment lacks is refused when the task is reset (exit 2, naming
//! the task).
//!
//! `env = gym` writes tasks of Gymnasium environments run through the
//! bridge ([`embodyflow_gym`]): `gym.adapter` (`babyai`, `metaworld`, ...),
//! `gym.env_ids` (task `i` is index `i div n` of env id `i mod n`, so a
//! list of BabyAI levels alternates), `gym.max_steps`, `gym.kwargs` (the
//! adapter's, for every task), `gym.instruction` (for environments that
//! give none, as the generic adapter's), `gym.success` (the success rule
//! of adapters that take one, [`SuccessRule`]: the rule in force, the
//! adapter's default when unset, is written into every spec and named in
//! the summary) and `gym.python` (the workers' interpreter). Each task's reset
//! seed is a hash of `--seed`, the split, the env id and the index (so the
//! splits hold disjoint seeds: held-out seeds for val and unseen), its
//! `task_type` is its env id and its instruction is the one the environment
//! gives at that reset (BabyAI's mission; the bridge resets every task
//! once to read it, `bridge.workers` at a time). Ids read
//! `gym-<adapter>/<env id>/<split>/<seed>/<index>`; the row holds the spec
//! JSON in `observation` (`embodyflow_gym::task_row`).
//!
//! ```text
//! generate-tasks --out data/val --set split=val --set count=200 --seed 7
//! generate-tasks --out data/tabletop-train --set env=tabletop --set suite=spatial --set count=500 --seed 7
//! generate-tasks --out data/goal-test --set env=tabletop --set suite=goal --set protocol=initial-states \
//!     --set count=7 --set states=50 --set split=test --seed 1
//! generate-tasks --out data/babyai-train --set env=gym --set gym.adapter=babyai \
//!     --set 'gym.env_ids=["BabyAI-GoToLocal-v0","BabyAI-PickupLoc-v0"]' --set count=64 --seed 7
//! ```

use std::collections::BTreeMap;

use embodyflow_core::Result;
use embodyflow_core::cli::{ShardSpec, StageArgs};
use embodyflow_core::config::{at_least, ensure};
use embodyflow_core::dataset::TableWriter;
use embodyflow_core::schemas::{TableName, TaskRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use serde::{Deserialize, Serialize};

use embodyflow_tabletop as tabletop;

use embodyflow_gym::{self as gym, GymTask, GymTaskSpec, SuccessRule};
use embodyflow_household::task::generate_task;
use embodyflow_household::{Split, TaskType, image_task_row};
use embodyflow_world::ClosedLoopWorld;

use crate::{WorldOptions, WorldTask, Worlds, WorldsError};

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

/// The environment whose tasks are generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Env {
    /// The household planning world (one-shot JSON plans).
    Household,
    /// The tabletop manipulation world (closed loop).
    Tabletop,
    /// Gymnasium environments through the bridge (closed loop, `gym.*`).
    Gym,
}

/// `gym.*`: which Gymnasium environments (`env = gym`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GymKeys {
    /// The bridge's adapter (`babyai`, `metaworld`, `generic`, ...).
    pub adapter: String,
    /// The environment ids, in turn.
    pub env_ids: Vec<String>,
    /// Environment steps after which an episode ends as a failure.
    pub max_steps: u32,
    /// Worker processes resetting the tasks for their instructions.
    pub workers: usize,
    /// The adapter's keyword arguments for every task (a JSON object:
    /// `gymnasium.make`'s for most adapters).
    pub kwargs: serde_json::Value,
    /// The instruction of environments that give none (the generic
    /// adapter's); an environment's own (BabyAI's mission) comes first.
    pub instruction: Option<String>,
    /// When an episode succeeds, for adapters that take a rule (the
    /// generic one); unset: the adapter's default (`info` where the env
    /// reports success, else the adapter refuses naming the rules). The
    /// rule in force is written into every task's spec.
    pub success: Option<SuccessRule>,
    /// The bridge workers' Python (unset: `$EMBODYFLOW_GYM_PYTHON`, else
    /// the workspace's `.venv`).
    pub python: Option<std::path::PathBuf>,
    /// The first initial state (reset seed) of `protocol = initial-states`.
    pub first_state: u64,
}

impl Default for GymKeys {
    fn default() -> Self {
        GymKeys {
            adapter: "babyai".into(),
            env_ids: vec!["BabyAI-GoToLocal-v0".into()],
            max_steps: 64,
            workers: 1,
            kwargs: serde_json::json!({}),
            instruction: None,
            success: None,
            python: None,
            first_state: 0,
        }
    }
}

/// The tabletop suites a run generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SuiteChoice {
    /// Spatial relations.
    Spatial,
    /// New objects.
    Object,
    /// One layout, many goals.
    Goal,
    /// Two sub-goals.
    Long,
    /// The four in turn.
    All,
}

impl SuiteChoice {
    /// The suite of task `i` and its index within the suite.
    fn task(self, i: usize) -> (tabletop::Suite, u64) {
        let one = |s| (s, i as u64);
        match self {
            SuiteChoice::Spatial => one(tabletop::Suite::Spatial),
            SuiteChoice::Object => one(tabletop::Suite::Object),
            SuiteChoice::Goal => one(tabletop::Suite::Goal),
            SuiteChoice::Long => one(tabletop::Suite::Long),
            SuiteChoice::All => (tabletop::Suite::ALL[i % 4], (i / 4) as u64),
        }
    }
}

/// What a tabletop table holds (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `count` tasks, each in a layout of its own split.
    #[default]
    Layouts,
    /// `count` tasks at `states` initial states each (LIBERO's protocol).
    InitialStates,
}

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `household` or `tabletop`.
    pub env: Env,
    /// `train`, `val` or `unseen`.
    pub split: Split,
    /// Number of tasks (at least 1).
    pub count: usize,
    /// Tabletop suite (`all` when unset); refused with `env = household`.
    pub suite: Option<SuiteChoice>,
    /// Tabletop: layouts or LIBERO's initial states.
    pub protocol: Protocol,
    /// Initial states per task (`protocol = initial-states`).
    pub states: u32,
    /// Gymnasium environments (`env = gym`).
    pub gym: GymKeys,
    /// Household: the side of the scene image each task carries
    /// (`embodyflow_household::render`); `None`: text only.
    pub image_size: Option<usize>,
    /// Output layout.
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            env: Env::Household,
            split: Split::Train,
            count: 1000,
            suite: None,
            protocol: Protocol::Layouts,
            states: tabletop::STATES_PER_TASK,
            gym: GymKeys::default(),
            image_size: None,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "env",
            "environment: household, tabletop or gym (a Gymnasium environment through the bridge)",
        ),
        (
            "gym.adapter",
            "the bridge's adapter for env = gym: babyai, metaworld, generic, ...",
        ),
        (
            "gym.env_ids",
            "the environment ids for env = gym, in turn (task i: id i mod n)",
        ),
        (
            "gym.max_steps",
            "environment steps per episode for env = gym (at least 1)",
        ),
        (
            "gym.kwargs",
            "the adapter's keyword arguments for every task, a JSON object (gymnasium.make's for most adapters)",
        ),
        (
            "gym.first_state",
            "env = gym with protocol = initial-states: the first initial state (reset seed) of the split's range (default 0)",
        ),
        (
            "gym.instruction",
            "the instruction of environments that give none (the generic adapter's)",
        ),
        (
            "gym.python",
            "the gym bridge workers' Python, e.g. a venv with your adapter packages (unset: $EMBODYFLOW_GYM_PYTHON, else .venv)",
        ),
        (
            "gym.success",
            "when an episode succeeds (adapters that take a rule, e.g. generic): info (the env's info success; the default where the env reports one), terminal_reward (terminated with a positive reward), survive (reaching truncation or max_steps without terminating), return_at_least:X (a return of at least X at the end); unset and no info signal: refused",
        ),
        (
            "gym.workers",
            "bridge workers resetting the tasks to read their instructions (at least 1)",
        ),
        ("count", "number of tasks to generate (at least 1)"),
        (
            "image_size",
            "env = household: each task carries a scene image (a top-down map of its initial state) of image_size x image_size pixels, 32 to 1024; unset: text only",
        ),
        (
            "protocol",
            "layouts (val = new layouts, unseen = held-out goals; tabletop) or initial-states (LIBERO's: count tasks at `states` initial states each; split train, val or test; tabletop, or gym from gym.first_state)",
        ),
        (
            "split",
            "task split: train, val, unseen, or test (protocol = initial-states)",
        ),
        (
            "states",
            "initial states per task with protocol = initial-states (LIBERO: 50; at least 1)",
        ),
        (
            "suite",
            "tabletop suite: spatial, object, goal, long or all (all when unset; env = tabletop only)",
        ),
    ];

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> Result<()> {
        at_least("count", self.count, 1)?;
        at_least("states", self.states, 1)?;
        if let Some(size) = self.image_size {
            ensure(
                self.env == Env::Household,
                "image_size",
                "env = household (the other worlds render their own frames)",
                size,
            )?;
            ensure(
                embodyflow_household::render::check_size(size).is_ok(),
                "image_size",
                "32 to 1024 pixels",
                size,
            )?;
        }
        let states = self.protocol == Protocol::InitialStates;
        ensure(
            !states || self.env != Env::Household,
            "protocol",
            "initial-states with env = tabletop or gym",
            "initial-states",
        )?;
        if states && self.env == Env::Gym {
            ensure(
                self.count <= self.gym.env_ids.len(),
                "count",
                &format!(
                    "at most the {} env ids of gym.env_ids: protocol = initial-states draws each task's states once",
                    self.gym.env_ids.len()
                ),
                self.count,
            )?;
        }
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
        if states && self.env == Env::Tabletop {
            let suite = match self.suite {
                None | Some(SuiteChoice::All) => None,
                Some(choice) => Some(choice.task(0).0),
            };
            let suite = suite.ok_or_else(|| {
                embodyflow_core::Error::BadValue {
                    key: "suite".into(),
                    reason: "protocol = initial-states draws the tasks of one suite: spatial, object, goal or long".into(),
                }
            })?;
            if let Some(n) = tabletop::protocol_tasks(suite) {
                ensure(
                    self.count as u64 <= n,
                    "count",
                    &format!(
                        "at most {n}: the {suite} suite's tasks under protocol = initial-states"
                    ),
                    self.count,
                )?;
            }
        }
        at_least("gym.max_steps", self.gym.max_steps, 1)?;
        at_least("gym.workers", self.gym.workers, 1)?;
        ensure(
            self.gym.kwargs.is_object(),
            "gym.kwargs",
            "a JSON object of keyword arguments",
            &self.gym.kwargs,
        )?;
        ensure(
            !self.gym.env_ids.is_empty() && self.gym.env_ids.iter().all(|id| !id.is_empty()),
            "gym.env_ids",
            "a list of environment ids",
            format!("{:?}", self.gym.env_ids),
        )?;
        ensure(
            self.env == Env::Tabletop || self.suite.is_none(),
            "suite",
            "no suite with env = household or gym (suites are the tabletop world's)",
            format!(
                "suite = {}",
                self.suite
                    .map_or("unset".into(), |s| format!("{s:?}").to_lowercase())
            ),
        )
    }
}

/// Runs the stage.
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
    match config.env {
        Env::Household => household_tasks(config, shard, seed, &mut sink)?,
        Env::Tabletop => tabletop_tasks(config, shard, seed, &mut sink)?,
        Env::Gym => gym_tasks(config, shard, seed, &mut sink)?,
    }
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
/// and the summary the world adds its counts to.
struct TaskSink {
    writer: TableWriter,
    rows: Vec<TaskRow>,
    summary: Summary,
}

impl TaskSink {
    /// Adds `row`; the waiting rows are written once 4096 wait.
    fn push(&mut self, row: TaskRow) -> Result<()> {
        self.rows.push(row);
        if self.rows.len() >= 4096 {
            self.writer.write_rows(&self.rows)?;
            self.rows.clear();
        }
        Ok(())
    }

    /// Adds each name's task count to the summary, in name order.
    fn add_counts<K: Into<String>>(&mut self, counts: BTreeMap<K, usize>) {
        for (name, n) in counts {
            self.summary.add(name, n);
        }
    }
}

/// The household world's tasks of the shard, counted by type.
fn household_tasks(
    config: &Config,
    shard: ShardSpec,
    seed: u64,
    sink: &mut TaskSink,
) -> std::result::Result<(), WorldsError> {
    let split = config.split;
    let mut by_type: BTreeMap<&'static str, usize> =
        TaskType::ALL.iter().map(|t| (t.as_str(), 0)).collect();
    let (mut steps, mut owned) = (0usize, 0usize);
    for index in 0..config.count {
        let id = format!("household/{split}/{seed}/{index:06}");
        if !shard.owns(&id) {
            continue;
        }
        let task = generate_task(split, seed, index);
        let row =
            image_task_row(&task, config.image_size).expect("validate checked the image size");
        *by_type.entry(task.task_type.as_str()).or_default() += 1;
        steps += row.gt_actions.as_ref().map_or(0, Vec::len);
        owned += 1;
        sink.push(row)?;
    }
    sink.summary.add("tasks", owned).add(
        "mean expert plan length",
        format!("{:.2}", steps as f64 / owned.max(1) as f64),
    );
    sink.add_counts(by_type);
    Ok(())
}

/// The tabletop world's tasks of the shard (layouts, or tasks x initial
/// states), counted by suite and type.
fn tabletop_tasks(
    config: &Config,
    shard: ShardSpec,
    seed: u64,
    sink: &mut TaskSink,
) -> std::result::Result<(), WorldsError> {
    let split = config.split;
    let choice = config.suite.unwrap_or(SuiteChoice::All);
    // (task index within its suite, initial state) in table order.
    let keys: Vec<(usize, Option<u32>)> = match config.protocol {
        Protocol::Layouts => (0..config.count).map(|i| (i, None)).collect(),
        Protocol::InitialStates => (0..config.states)
            .flat_map(|state| (0..config.count).map(move |i| (i, Some(state))))
            .collect(),
    };
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    let mut owned = 0usize;
    for (i, state) in keys {
        let (suite, index) = choice.task(i);
        let (name, split) = (suite.as_str(), split.as_str());
        let id = match state {
            Some(state) => tabletop::scene::state_id_of(name, split, seed, index, state),
            None => tabletop::scene::task_id_of(name, split, seed, index),
        };
        if !shard.owns(&id) {
            continue;
        }
        let task = match state {
            Some(state) => tabletop::initial_state(suite, seed, index, config.split, state)
                .map_err(|e| embodyflow_core::Error::BadInput(e.to_string()))?,
            None => tabletop::generate(suite, config.split, seed, index),
        };
        *by_type
            .entry(format!("{suite}: {}", task.task_type))
            .or_default() += 1;
        owned += 1;
        sink.push(tabletop::task_row(&task))?;
    }
    sink.summary.add("env", "tabletop").add("tasks", owned);
    if config.protocol == Protocol::InitialStates {
        sink.summary
            .add("protocol", "initial-states")
            .add("initial states per task", config.states);
    }
    sink.add_counts(by_type);
    Ok(())
}

/// Bridge tasks of the shard, their instructions from the adapter (or
/// `gym.instruction`), counted by env id.
fn gym_tasks(
    config: &Config,
    shard: ShardSpec,
    seed: u64,
    sink: &mut TaskSink,
) -> std::result::Result<(), WorldsError> {
    let split = config.split;
    let keys = &config.gym;
    // (env id, task id, reset seed) in table order.
    let draws: Vec<(&String, String, u64)> = match config.protocol {
        Protocol::Layouts => (0..config.count)
            .map(|i| {
                let env_id = &keys.env_ids[i % keys.env_ids.len()];
                let index = i / keys.env_ids.len();
                let id = format!("gym-{}/{env_id}/{split}/{seed}/{index:06}", keys.adapter);
                (env_id, id, reset_seed(seed, split.as_str(), env_id, index))
            })
            .collect(),
        Protocol::InitialStates => (0..u64::from(config.states))
            .flat_map(|state| {
                keys.env_ids[..config.count]
                    .iter()
                    .map(move |id| (id, state))
            })
            .map(|(env_id, state)| {
                let state = keys.first_state + state;
                let id = format!("gym-{}/{env_id}@{split}/{state}", keys.adapter);
                (env_id, id, state)
            })
            .collect(),
    };
    let mut tasks = Vec::new();
    for (env_id, id, reset) in draws {
        if !shard.owns(&id) {
            continue;
        }
        let mut spec = GymTaskSpec::new(&keys.adapter, env_id, reset, keys.max_steps);
        spec.kwargs = keys.kwargs.clone();
        spec.instruction.clone_from(&keys.instruction);
        spec.success.clone_from(&keys.success);
        tasks.push(GymTask { task_id: id, spec });
    }
    let (instructions, rule) = gym_instructions(&mut tasks, keys)?;
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    for (task, instruction) in tasks.iter().zip(instructions) {
        let mut row = gym::task_row(&task.task_id, split.as_str(), &task.spec)?;
        row.task_type = Some(task.spec.env_id.clone());
        row.instruction = instruction;
        *by_type.entry(task.spec.env_id.clone()).or_default() += 1;
        sink.push(row)?;
    }
    sink.summary
        .add("env", format!("gym:{}", keys.adapter))
        .add("tasks", tasks.len())
        .add(
            "success rule",
            rule.map_or("the adapter's own".into(), |r| r.to_string()),
        );
    if config.protocol == Protocol::InitialStates {
        let first = keys.first_state;
        sink.summary.add("protocol", "initial-states").add(
            "initial states (reset seeds)",
            format!("{first}..{}", first + u64::from(config.states)),
        );
    }
    sink.add_counts(by_type);
    Ok(())
}

/// A bridge task's reset seed: BLAKE3 of `--seed`, the split, the env id
/// and the index, as a non-negative i64 (the `seed` column).
fn reset_seed(seed: u64, split: &str, env_id: &str, index: usize) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.update(split.as_bytes());
    hasher.update(&[0]);
    hasher.update(env_id.as_bytes());
    hasher.update(&(index as u64).to_le_bytes());
    let bytes = hasher.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes")) >> 1
}

/// The instruction each task's environment gives at its reset (one reset
/// per task, on `gym.workers` bridge workers; an adapter that gives none
/// leaves its spec's, or an empty text), and the success rule in force:
/// the one the adapter announces (its default when `gym.success` is
/// unset), written into every spec; `None` for an adapter that decides
/// success itself.
fn gym_instructions(
    tasks: &mut [GymTask],
    keys: &GymKeys,
) -> std::result::Result<(Vec<String>, Option<SuccessRule>), WorldsError> {
    let Some(first) = tasks.first() else {
        return Ok((Vec::new(), keys.success.clone()));
    };
    let bridge = embodyflow_gym::BridgeConfig {
        workers: keys.workers,
        python: embodyflow_gym::BridgeConfig::python(keys.python.as_deref()),
        ..Default::default()
    };
    let info = gym::probe(&bridge, &first.spec)?;
    for task in tasks.iter_mut() {
        task.spec.success.clone_from(&info.success);
    }
    let mut worlds = Worlds::new(WorldOptions {
        image_size: info.shape.height,
        bins: info.action.bins(),
        bridge,
    });
    let tasks: Vec<WorldTask> = tasks.iter().cloned().map(crate::gym::task).collect();
    let episodes = worlds.episodes(&tasks, 1)?;
    let mut instructions = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        // A task whose environment cannot be reset is no task to write.
        if let Some(reason) = episodes.start_failure(i) {
            return Err(embodyflow_core::Error::BadInput(format!(
                "task `{}`: its environment could not be reset: {reason}",
                task.task_id()
            ))
            .into());
        }
        instructions.push(episodes.instruction(i).to_string());
    }
    worlds.done(episodes);
    Ok((instructions, info.success))
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
        let problem = resolve(&["env=lab"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("env"));
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
    fn all_suites_take_turns() {
        let suites: Vec<_> = (0..8).map(|i| SuiteChoice::All.task(i)).collect();
        assert_eq!(suites[5], (embodyflow_tabletop::Suite::Object, 1));
        assert_eq!(
            SuiteChoice::Goal.task(5),
            (embodyflow_tabletop::Suite::Goal, 5)
        );
    }
}

/// The stage's `KEYS` table documents exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
    }
}
