//! Gymnasium environments through the bridge as the stages see them
//! (`env = gym:<adapter>`), one line of the registry
//! (`embodyflow_worlds::WORLDS`): [`GYM`] implements the world interfaces
//! of `embodyflow_world` (`World` and `Generator`), and [`BridgeKeys`] are
//! the `bridge.*` keys of the stages that run its episodes: a row's task spec ([`task_from_row`](crate::task_from_row)),
//! run `r` the reset seed `seed + r * RUN_SEED_STRIDE`, the policy's shape
//! as the adapter reports it (a fresh worker's probe) and episodes on the
//! bridge's workers, which the stage's next batch reuses
//! ([`GymEpisodes::with_pool`]); their fault counts go to its summary.
//! Its demonstrations are the adapter's scripted expert playing each task
//! in a worker ([`expert_demonstrations`](crate::expert_demonstrations)): the observation
//! the worker encoded, the text it observed, the chunk's actions as tokens
//! (a discrete action's index is its bin, a box action's values are
//! `bins.encode`d); demonstrations a worker fault ended count as failed.
//!
//! Its tasks (`generate-tasks --set env=gym`, keys `gym.*`): `gym.adapter`
//! (`babyai`, `metaworld`, ...), `gym.env_ids` (task `i` is index `i div n`
//! of env id `i mod n`, so a list of BabyAI levels alternates),
//! `gym.max_steps`, `gym.kwargs` (the adapter's, for every task),
//! `gym.instruction` (for environments that give none, as the generic
//! adapter's), `gym.success` (the success rule of adapters that take one,
//! [`SuccessRule`]: the rule in force, the adapter's default when unset, is
//! written into every spec and named in the summary), `gym.python` (the
//! workers' interpreter) and `gym.timeout_s` / `gym.startup_timeout_s` (the
//! workers' deadlines, as `bridge.*`'s in the other stages). Each task's reset seed is a hash of `--seed`, the
//! split, the env id and the index (so the splits hold disjoint seeds), its
//! `task_type` is its env id and its instruction is the one the environment
//! gives at that reset (BabyAI's mission; the bridge resets every task once
//! to read it, `gym.workers` at a time). Ids read
//! `gym-<adapter>/<env id>/<split>/<seed>/<index>`; the row holds the spec
//! JSON in `observation` ([`task_row`](crate::task_row)). Under `protocol =
//! initial-states` it draws environments with fixed, indexed initial states
//! (LIBERO's 50 per task: the `libero` adapter's reset seed is the index):
//! `count` tasks (the first `count` of `gym.env_ids`), each at the `states`
//! initial states `gym.first_state ..` (reset seeds, state-major), ids
//! `gym-<adapter>/<env id>@<split>/<state>`; the splits are disjoint ranges
//! of the same tasks' states (e.g. train 0..40, val 40..50, each table
//! naming its range), a held-out-tasks table other env ids. An index the
//! environment lacks is refused when the task is reset (exit 2, naming the
//! task). An adapter whose reset seed is such an index
//! ([`INDEXED_ADAPTERS`]: `libero`) is refused under the default protocol
//! by the config check, before any worker starts (exit 2, naming
//! `protocol = initial-states`).
//!
//! ```
//! use embodyflow_gym::{GymTask, GymTaskSpec};
//! use embodyflow_gym::declaration::{RUN_SEED_STRIDE, task};
//! let spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 7, 64);
//! let task = task(GymTask { task_id: "goto/7".into(), spec });
//! assert_eq!((task.env(), task.max_steps()), ("gym:babyai", 64));
//! let run = task.reseed(2).unwrap();
//! assert_eq!(run.spec::<GymTask>().unwrap().spec.seed, 7 + 2 * RUN_SEED_STRIDE);
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate as bridge;
use crate::{
    BridgeConfig, BridgeError, ENV_PREFIX, GymEpisodes, GymTask, GymTaskSpec, Pool, SuccessRule,
    task_from_row,
};
use embodyflow_core::Error;
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::config::{ConfigKeys, at_least, ensure, positive};
use embodyflow_core::schemas::TaskRow;
use embodyflow_core::section::SectionConfig;
use embodyflow_world::ClosedLoopWorld;
use serde::{Deserialize, Serialize};

use embodyflow_world::demonstrations::{DemoDecision, DemoRequest, Demonstration};
use embodyflow_world::generator::{
    Generator, LIBERO_STATES, ROOT, Settings, TaskRequest, TaskSink,
};
use embodyflow_world::workers::WorkerSettings;
use embodyflow_world::world::{
    Kept, PolicyShape, World, WorldEpisodes, WorldOptions, WorldTask, WorldsError, specs,
};

/// A bridge task's run `r > 0` resets with seed `seed + r * RUN_SEED_STRIDE`
/// (far from the seeds a task generator hands out next to each other).
pub const RUN_SEED_STRIDE: u64 = 1_000_003;

/// `env = gym:<adapter>`.
pub static GYM: Gym = Gym;

/// The Gymnasium bridge's environments.
pub struct Gym;

/// The world's task of a bridge task (`env = gym:<adapter>`).
pub fn task(task: GymTask) -> WorldTask {
    WorldTask::new(
        &GYM,
        &format!("{ENV_PREFIX}{}", task.spec.adapter),
        task.task_id.clone(),
        task.spec.instruction.clone().unwrap_or_default(),
        task.spec.max_steps,
        task,
    )
}

impl World for Gym {
    fn env(&self) -> &'static str {
        "gym:<adapter>"
    }

    fn claims(&self, env: &str) -> bool {
        env.starts_with(ENV_PREFIX)
    }

    fn task(&'static self, row: &TaskRow) -> Result<WorldTask, Error> {
        task_from_row(row)
            .map(task)
            .map_err(|e| Error::BadInput(format!("tasks table: {e}")))
    }

    /// Run `r` resets with seed `seed + r · RUN_SEED_STRIDE`; an adapter
    /// whose reset seed is a fixed initial state's index
    /// ([`INDEXED_ADAPTERS`]) has no other run of a task, and run `r > 0`
    /// is refused naming the task, before any worker starts.
    fn reseed(&'static self, task: &WorldTask, run: u32) -> Result<WorldTask, Error> {
        let mut task = task.spec::<GymTask>().expect("a bridge task").clone();
        if run > 0 && INDEXED_ADAPTERS.contains(&task.spec.adapter.as_str()) {
            return Err(Error::BadInput(format!(
                "task `{}`: no run {run} of it: the {} adapter's reset seed {} is an initial state's index, one fixed scene; evaluate with runs = 1, over more initial states (generate-tasks --set states=...)",
                task.task_id, task.spec.adapter, task.spec.seed
            )));
        }
        task.spec.seed = task
            .spec
            .seed
            .checked_add(u64::from(run) * RUN_SEED_STRIDE)
            .ok_or_else(|| {
                Error::BadInput(format!(
                    "task `{}`: seed {} has no run {run} (overflow)",
                    task.task_id, task.spec.seed
                ))
            })?;
        Ok(self::task(task))
    }

    fn policy_shape(
        &self,
        task: &WorldTask,
        _: usize,
        workers: &WorkerSettings,
    ) -> Result<PolicyShape, WorldsError> {
        let task = task.spec::<GymTask>().expect("a bridge task");
        let info = bridge::probe(&bridge_config(workers), &task.spec).map_err(bridge_error)?;
        Ok(PolicyShape {
            observation: info.shape,
            action_dim: info.action.dim(),
            bins: Some(info.action.bins()),
            observation_text: info.text,
        })
    }

    fn episodes(
        &self,
        tasks: &[WorldTask],
        group: usize,
        options: &WorldOptions,
        kept: &mut Kept,
    ) -> Result<Box<dyn WorldEpisodes>, WorldsError> {
        let pool = match kept.state.take().map(|state| state.downcast::<Pool>()) {
            Some(Ok(pool)) => *pool,
            _ => Pool::new(&bridge_config(&options.workers)).map_err(bridge_error)?,
        };
        let episodes = GymEpisodes::with_pool(pool, &specs::<GymTask>(tasks), group, &options.bins)
            .map_err(bridge_error)?;
        Ok(Box::new(episodes))
    }

    fn demonstrations(
        &self,
        tasks: &[WorldTask],
        request: &DemoRequest<'_>,
        each: &mut dyn FnMut(Demonstration) -> Result<(), Error>,
    ) -> Result<String, Error> {
        let bad = |e: &dyn std::fmt::Display| Error::BadInput(format!("tasks table: {e}"));
        if request.step_frames {
            return Err(Error::BadInput(
                "a thinking VLA's warm-up needs the tabletop expert's per-step frames; bridge tasks train a VLA without latents".into(),
            ));
        }
        let tasks = specs::<GymTask>(tasks);
        let Some(first) = tasks.first().map(|t| &t.spec) else {
            return Err(bad(&"no task to demonstrate"));
        };
        let bridge = bridge_config(request.workers);
        let info = bridge::probe(&bridge, first).map_err(|e| bad(&e))?;
        info.action
            .check_bins(request.bins)
            .map_err(|e| Error::BadInput(format!("the checkpoint's action bins: {e}")))?;
        let demos = bridge::expert_demonstrations(&bridge, &tasks, request.chunk_len)
            .map_err(|e| bad(&e))?;
        for demo in demos {
            let mut decisions = Vec::new();
            // A failed demonstration is left out: its decisions are not needed.
            let played = if demo.success {
                demo.decisions
            } else {
                Vec::new()
            };
            for (i, decision) in played.into_iter().enumerate() {
                let tokens = info
                    .action
                    .tokens(request.bins, &decision.actions)
                    .map_err(|e| {
                        Error::BadInput(format!("task `{}` decision {i}: {e}", demo.task_id))
                    })?;
                decisions.push(DemoDecision {
                    observation: decision.observation,
                    text: decision.text,
                    tokens,
                });
            }
            each(Demonstration {
                task_id: demo.task_id,
                instruction: demo.instruction,
                success: demo.success,
                decisions,
                step_frames: Vec::new(),
                failure: demo.failure,
            })?;
        }
        Ok(format!("{ENV_PREFIX}{}", first.adapter))
    }
}

/// `gym.*`: which Gymnasium environments (`env = gym`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GymKeys {
    /// The bridge's adapter for env = gym (babyai, metaworld, generic, ...).
    pub adapter: String,
    /// The environment ids for env = gym, in turn (task i: id i mod n).
    pub env_ids: Vec<String>,
    /// Environment steps per episode for env = gym (at least 1).
    pub max_steps: u32,
    /// Bridge workers resetting the tasks to read their instructions (at
    /// least 1).
    pub workers: usize,
    /// The adapter's keyword arguments for every task, a JSON object
    /// (gymnasium.make's for most adapters).
    pub kwargs: serde_json::Value,
    /// The instruction of environments that give none (the generic
    /// adapter's).
    pub instruction: Option<String>,
    /// When an episode succeeds (adapters that take a rule, e.g. generic):
    /// info (the env's info success; the default where the env reports
    /// one), terminal_reward (terminated with a positive reward), survive
    /// (reaching truncation or max_steps without terminating),
    /// return_at_least:X (a return of at least X at the end); unset and no
    /// info signal: refused.
    pub success: Option<SuccessRule>,
    /// The gym bridge workers' Python, e.g. a venv with your adapter
    /// packages (unset: $EMBODYFLOW_GYM_PYTHON, else .venv).
    pub python: Option<std::path::PathBuf>,
    /// Seconds a bridge worker may stay silent in a reset before it counts
    /// as hung, > 0.
    pub timeout_s: f64,
    /// Seconds a bridge worker may take to start (its imports) or to build
    /// an environment (LIBERO: a minute on a loaded machine) before it
    /// counts as hung, > 0; gym.timeout_s when that is longer.
    pub startup_timeout_s: f64,
    /// env = gym with protocol = initial-states: the first initial state
    /// (reset seed) of the split's range (default 0).
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
            timeout_s: 60.0,
            startup_timeout_s: crate::STARTUP_TIMEOUT.as_secs_f64(),
            first_state: 0,
        }
    }
}

/// The bridge's keys in generate-tasks' config: the `gym` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GymTable {
    /// Gymnasium environments (env = gym).
    #[keys(section)]
    pub gym: GymKeys,
}

impl SectionConfig<TaskRequest> for GymTable {
    /// `gym.*` in range whatever the world; an adapter that resets by
    /// initial-state index only under LIBERO's protocol, and then at most
    /// one task per env id (each task's states are drawn once). Checked
    /// before any worker starts.
    fn check(&self, config: &TaskRequest) -> embodyflow_core::Result<()> {
        let keys = &self.gym;
        if config.is(NAME) && INDEXED_ADAPTERS.contains(&keys.adapter.as_str()) {
            ensure(
                config.initial_states(),
                "protocol",
                format!(
                    "protocol = initial-states for gym.adapter = {}: its reset seed is a task's initial-state index (0..{}), which the default protocol's hashed seeds never are; add --set protocol=initial-states (count tasks of gym.env_ids, states initial states each from gym.first_state)",
                    keys.adapter,
                    LIBERO_STATES - 1
                ),
                "layouts",
            )?;
        }
        if config.is(NAME) && config.initial_states() {
            ensure(
                config.count <= keys.env_ids.len(),
                "count",
                &format!(
                    "at most the {} env ids of gym.env_ids: protocol = initial-states draws each task's states once",
                    keys.env_ids.len()
                ),
                config.count,
            )?;
        }
        at_least("gym.max_steps", keys.max_steps, 1)?;
        at_least("gym.workers", keys.workers, 1)?;
        positive("gym.timeout_s", keys.timeout_s)?;
        positive("gym.startup_timeout_s", keys.startup_timeout_s)?;
        ensure(
            keys.kwargs.is_object(),
            "gym.kwargs",
            "a JSON object of keyword arguments",
            &keys.kwargs,
        )?;
        ensure(
            !keys.env_ids.is_empty() && keys.env_ids.iter().all(|id| !id.is_empty()),
            "gym.env_ids",
            "a list of environment ids",
            format!("{:?}", keys.env_ids),
        )
    }
}

/// Its name in generate-tasks' `env`.
const NAME: &str = "gym";

/// The adapters whose reset seed is the index of one of a task's fixed
/// initial states (LIBERO's 50): their tasks are drawn only under `protocol
/// = initial-states`, since the default protocol's seeds are hashes far
/// beyond any index.
pub const INDEXED_ADAPTERS: [&str; 1] = ["libero"];

impl Generator for Gym {
    fn name(&self) -> &'static str {
        NAME
    }

    fn settings(&self) -> Option<Settings> {
        Some(Settings::of::<GymTable>(ROOT))
    }

    fn initial_states(&self) -> bool {
        true
    }

    /// Bridge tasks of the shard, their instructions from the adapter (or
    /// `gym.instruction`), counted by env id.
    fn write(
        &self,
        config: &TaskRequest,
        shard: ShardSpec,
        seed: u64,
        sink: &mut TaskSink,
    ) -> Result<(), WorldsError> {
        let GymTable { gym: keys } = config.keys()?;
        let split = config.split;
        // (env id, task id, reset seed) in table order.
        let draws: Vec<(&String, String, u64)> = match config.initial_states() {
            false => (0..config.count)
                .map(|i| {
                    let env_id = &keys.env_ids[i % keys.env_ids.len()];
                    let index = i / keys.env_ids.len();
                    let id = format!("gym-{}/{env_id}/{split}/{seed}/{index:06}", keys.adapter);
                    (env_id, id, reset_seed(seed, split.as_str(), env_id, index))
                })
                .collect(),
            true => (0..u64::from(config.states))
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
        let (instructions, rule) = instructions(&mut tasks, &keys)?;
        let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
        for (task, instruction) in tasks.iter().zip(instructions) {
            let mut row = bridge::task_row(&task.task_id, split.as_str(), &task.spec)
                .map_err(bridge_error)?;
            row.task_type = Some(task.spec.env_id.clone());
            row.instruction = instruction;
            *by_type.entry(task.spec.env_id.clone()).or_default() += 1;
            sink.push(row)?;
        }
        sink.summary
            .add("env", format!("{ENV_PREFIX}{}", keys.adapter))
            .add("tasks", tasks.len())
            .add(
                "success rule",
                rule.map_or("the adapter's own".into(), |r| r.to_string()),
            );
        if config.initial_states() {
            let first = keys.first_state;
            sink.summary.add("protocol", "initial-states").add(
                "initial states (reset seeds)",
                format!("{first}..{}", first + u64::from(config.states)),
            );
        }
        sink.add_counts(by_type);
        Ok(())
    }
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
fn instructions(
    tasks: &mut [GymTask],
    keys: &GymKeys,
) -> Result<(Vec<String>, Option<SuccessRule>), WorldsError> {
    let Some(first) = tasks.first() else {
        return Ok((Vec::new(), keys.success.clone()));
    };
    let bridge = BridgeConfig {
        workers: keys.workers,
        timeout: Duration::from_secs_f64(keys.timeout_s),
        startup_timeout: Duration::from_secs_f64(keys.startup_timeout_s),
        python: BridgeConfig::python(keys.python.as_deref()),
        keys: Some(NAME.into()),
    };
    let info = bridge::probe(&bridge, &first.spec).map_err(bridge_error)?;
    for task in tasks.iter_mut() {
        task.spec.success.clone_from(&info.success);
    }
    let tasks: Vec<WorldTask> = tasks.iter().cloned().map(task).collect();
    let pool = Pool::new(&bridge).map_err(bridge_error)?;
    let episodes = GymEpisodes::with_pool(pool, &specs::<GymTask>(&tasks), 1, &info.action.bins())
        .map_err(bridge_error)?;
    let mut instructions = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        // A task whose environment cannot be reset is no task to write.
        if let Some(reason) = episodes.start_failure(i) {
            return Err(Error::BadInput(format!(
                "task `{}`: its environment could not be reset: {reason}",
                task.task_id()
            ))
            .into());
        }
        instructions.push(episodes.instruction(i).to_string());
    }
    Ok((instructions, info.success))
}

/// `bridge.*`: how collect-rollouts and evaluate run the Gymnasium
/// bridge's workers (bridge tasks only). Each field's doc comment is its
/// key's meaning (`--help`); a stage holds it as a `#[keys(section)]`
/// field named `bridge`. A worker past `timeout_s` counts as hung: it is
/// killed and restarted and its episodes fail with the reason; a starting
/// worker's first frame and an environment's build may take
/// `startup_timeout_s` ([`STARTUP_TIMEOUT`](crate::STARTUP_TIMEOUT) by
/// default: a LIBERO hello takes a minute on a loaded machine). A worker
/// that misses either deadline is reported naming its key and value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct BridgeKeys {
    /// Gym bridge worker processes (0: one per CPU); bridge tasks only.
    pub workers: usize,
    /// Seconds a gym bridge worker may take per step, or stay silent in a
    /// reset or expert episode, before it counts as hung, > 0.
    pub timeout_s: f64,
    /// Seconds a gym bridge worker may take to start (its imports) or to
    /// build an environment (LIBERO: a minute on a loaded machine) before
    /// it counts as hung, > 0; timeout_s when that is longer.
    pub startup_timeout_s: f64,
    /// The gym bridge workers' Python, e.g. a venv with your adapter
    /// packages (unset: $EMBODYFLOW_GYM_PYTHON, else .venv).
    pub python: Option<std::path::PathBuf>,
}

impl Default for BridgeKeys {
    fn default() -> Self {
        BridgeKeys {
            workers: 0,
            timeout_s: 60.0,
            startup_timeout_s: crate::STARTUP_TIMEOUT.as_secs_f64(),
            python: None,
        }
    }
}

impl BridgeKeys {
    /// Checks the values (for a stage's `validate`; `prefix` is where the
    /// stage keeps them, `""` for `bridge.*`, `"sft."` for `sft.bridge.*`).
    pub fn validate(&self, prefix: &str) -> embodyflow_core::Result<()> {
        embodyflow_core::config::positive(&format!("{prefix}bridge.timeout_s"), self.timeout_s)?;
        embodyflow_core::config::positive(
            &format!("{prefix}bridge.startup_timeout_s"),
            self.startup_timeout_s,
        )
    }

    /// The bridge's config as the worlds take it (passed on unread by the
    /// stages and the registry).
    pub fn settings(&self) -> WorkerSettings {
        WorkerSettings::of(self.config())
    }

    /// The bridge's config (the Python of `python`, else
    /// `EMBODYFLOW_GYM_PYTHON`, else the workspace's `.venv`), its
    /// deadlines named as `bridge.*` keys.
    pub fn config(&self) -> BridgeConfig {
        let workers = match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        BridgeConfig {
            workers,
            timeout: Duration::from_secs_f64(self.timeout_s),
            startup_timeout: Duration::from_secs_f64(self.startup_timeout_s),
            python: BridgeConfig::python(self.python.as_deref()),
            keys: Some("bridge".into()),
        }
    }
}

/// The bridge's config among a stage's worker settings
/// ([`BridgeKeys::settings`]); the defaults without them.
fn bridge_config(workers: &WorkerSettings) -> BridgeConfig {
    workers.get::<BridgeConfig>().cloned().unwrap_or_default()
}

/// The bridge's error as the registry's: `the gym bridge: ...`, classified
/// as the bridge classifies it.
fn bridge_error(error: BridgeError) -> WorldsError {
    WorldsError::world("the gym bridge", error)
}

#[cfg(test)]
mod tests {
    use crate::GymTaskSpec;
    use embodyflow_algos::action_tokens::ActionBins;

    use super::*;

    #[test]
    fn a_thinking_vlas_step_frames_are_refused_before_any_worker_starts() {
        let spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 7, 64);
        let tasks = [task(GymTask {
            task_id: "goto/7".into(),
            spec,
        })];
        let (bins, workers) = (ActionBins::openvla(), WorkerSettings::default());
        let request = DemoRequest {
            observation: embodyflow_core::observation::ObservationShape {
                height: 7,
                width: 7,
                channels: 3,
                proprio: 4,
            },
            action_dim: 1,
            bins: &bins,
            chunk_len: 1,
            noise: 0.0,
            planned_labels: false,
            seeds: &[0],
            step_frames: true,
            workers: &workers,
        };
        let error = GYM
            .demonstrations(&tasks, &request, &mut |_| panic!("no demonstration"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("bridge tasks train a VLA without latents"),
            "{error}"
        );
    }

    #[test]
    fn an_initial_state_has_no_other_run() {
        let libero = task(GymTask {
            task_id: "gym-libero/libero_spatial/0@val/43".into(),
            spec: GymTaskSpec::new("libero", "libero_spatial/0", 43, 512),
        });
        assert_eq!(libero.reseed(0).unwrap(), libero, "run 0 is the task");
        let error = libero.reseed(1).unwrap_err();
        assert!(matches!(error, Error::BadInput(_)), "{error:?}");
        let error = error.to_string();
        assert!(
            error.contains("gym-libero/libero_spatial/0@val/43")
                && error.contains("no run 1")
                && error.contains("runs = 1"),
            "{error}"
        );
    }
}
