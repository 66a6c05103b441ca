//! The `score-rewards` stage: reads trajectories (and tasks for ground-truth
//! plans) and writes the rewards table, one row per trajectory.
//!
//! `reward.fn` chooses the reward (formulas in `embodyflow_algos::rewards`),
//! one module each behind the [`Reward`] interface and listed once in
//! [`REWARDS`]:
//! `outcome` (`reward.reward_coef * complete`), `embodied_r1` (format +
//! prefix accuracy; `reward.tolerant` for tolerant parsing;
//! `reward.action_list` names a JSON file with the environment's action names,
//! index = id, for the id/name agreement part), or `verify`
//! (`0.8 * accuracy + 0.2 * format`). Under `verify`, a trajectory whose task
//! has a built-in environment (`env = household`) and an observation is checked by executing the
//! extracted plan in it (`embodyflow_envs::TaskEnv::execute_plan`):
//! accuracy 1 when the plan reaches the goal, -1 otherwise, and `step_valid`
//! holds the executor's verdict per step; other tasks keep the step-match
//! accuracy (`2 * matched / max(predicted, gt) - 1`). For every trajectory whose task has a
//! ground-truth plan, `step_match` holds the rule match of each predicted step
//! under `match.mode` (`exact` | `prefix` | `lcs`), found with the tolerant
//! plan extraction whatever the reward.
//!
//! Closed-loop trajectories (episodes of a VLA in a world that
//! `embodyflow_worlds::is_closed_loop` names, `env = tabletop`, found
//! through the tasks table) take the outcome reward only: `score =
//! reward.reward_coef` when the episode succeeded (`complete`), else 0;
//! `success = complete`, `format = 0`, `accuracy = score`, `parse_ok = true`
//! (the schema's value for a policy that writes no plan), `pred_actions`,
//! `step_match` and `step_valid` null, `reward_fn = outcome`. A plan reward
//! (`embodied_r1`, `verify`) asked on them is refused (exit 2, naming a task
//! and the function) rather than replaced silently: the run's config says
//! what was scored. Without the tasks table every trajectory is scored as
//! given (outcome needs nothing else). Every row copies its trajectory's
//! `ever_grasped` (the episode's grasp fact, null for one-shot plans), so
//! the analyses of pushing vs grasping read it next to the score.
//!
//! An episode ended by infrastructure (`trajectories.infra_fault`: a
//! crashed, hung or malformed environment worker, an environment that
//! raised) is no outcome of the policy: its row is scored as the reward
//! function scores it (it did not succeed) and carries the fault
//! (`rewards.infra_fault`), so compute-advantages and the analyses leave it
//! out; the summary counts such rows apart and its success rate and mean
//! score are over the trajectories that ran.
//!
//! Rows are scored in parallel (rayon) and written in input order, so the
//! output is the same for any thread count; `--shard i/n` scores the groups a
//! process owns. A run goes in phases: the inputs the reward reads are
//! checked (`Inputs::open`), every row is scored and written
//! (`score_rows`), and the summary is written (`summary`).
//!
//! ```text
//! score-rewards --input runs/it0/rollouts --input data/train --out runs/it0/rewards \
//!     --set reward.fn=embodied_r1 --set match.mode=lcs
//! ```

mod embodied_r1;
mod outcome;
mod reward;
#[cfg(test)]
mod toy;
mod verify;

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use arrow::array::{Array, BooleanArray, Int64Array, ListArray, StringArray, StructArray};
use embodyflow_algos::plan::{GtStep, MatchMode, Plan, extract, step_match};
use embodyflow_core::checks::either;
use embodyflow_core::cli::{ShardSpec, StageArgs};
use embodyflow_core::config::{ConfigKeys, at_least, dotted, keys_of};
use embodyflow_core::dataset::{TableReader, TableWriter, batch_to_rows, column};
use embodyflow_core::schemas::{PredictedAction, RewardRow, TableName, TaskRow};
use embodyflow_core::section;
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, Result, progress};
use embodyflow_envs::TaskEnv;
use rayon::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

pub use reward::{Reads, Reward, Rollout, Scorer, Seen, Tally};

/// Every reward function, in the order `--help` names them.
pub static REWARDS: &[&dyn Reward] = &[
    &outcome::OUTCOME,
    &embodied_r1::EMBODIED_R1,
    &verify::VERIFY,
    #[cfg(test)]
    &toy::TOY,
];

/// The reward named `name`.
pub fn reward(name: &str) -> Option<&'static dyn Reward> {
    REWARDS.iter().copied().find(|r| r.name() == name)
}

/// Every reward's keys, in the order of [`REWARDS`].
fn sections() -> Vec<reward::Section> {
    REWARDS.iter().filter_map(|r| r.settings()).collect()
}

/// The meaning of `reward.fn`, naming every reward.
static FN_MEANING: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<&str> = REWARDS.iter().map(|r| r.name()).collect();
    format!("reward function: {}", either(&names))
});

/// Command line of `score-rewards`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::SCORE_REWARDS.name,
    version,
    about = spec::SCORE_REWARDS.purpose,
    after_help = spec::SCORE_REWARDS.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
}

/// `reward.*` settings: `fn`, the reward's name, and every reward's own
/// keys ([`Reward::settings`]), one table.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardConfig {
    /// The reward function's name (a registered one: checked at load).
    pub function: String,
    /// The `reward` table as resolved (`fn` and every reward's keys).
    pub table: Value,
}

impl RewardConfig {
    /// The chosen reward.
    pub fn reward(&self) -> &'static dyn Reward {
        reward(&self.function).expect("`reward.fn` was checked at load")
    }

    /// The table as the config tree's `{"reward": ...}`, for reading a
    /// reward's settings.
    fn tree(&self) -> Value {
        Value::Object(Map::from_iter([("reward".to_string(), self.table.clone())]))
    }
}

impl Default for RewardConfig {
    fn default() -> Self {
        let mut table = section::defaults(&sections())
            .get("reward")
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()));
        let function = REWARDS[0].name().to_string();
        if let Value::Object(map) = &mut table {
            map.insert("fn".into(), Value::String(function.clone()));
        }
        RewardConfig { function, table }
    }
}

impl Serialize for RewardConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.table.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RewardConfig {
    /// The table as given over the defaults; `fn` must be a string (that it
    /// names a reward is checked with the other values).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let given = Map::<String, Value>::deserialize(deserializer)?;
        let mut config = RewardConfig::default();
        if let Value::Object(table) = &mut config.table {
            table.extend(given);
        }
        config.function = match &config.table["fn"] {
            Value::String(name) => name.clone(),
            other => {
                return Err(serde::de::Error::custom(format!(
                    "`fn`: expected a reward name, found {other}"
                )));
            }
        };
        Ok(config)
    }
}

impl ConfigKeys for RewardConfig {
    fn config_keys(prefix: &str, out: &mut Vec<(String, &'static str)>) {
        out.push((dotted(prefix, "fn"), FN_MEANING.as_str()));
        for section in sections() {
            (section.keys)(prefix, out);
        }
    }
}

/// `match.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct MatchConfig {
    /// Rule step match: exact, prefix or lcs.
    pub mode: MatchMode,
}

impl Default for MatchConfig {
    fn default() -> Self {
        MatchConfig {
            mode: MatchMode::Exact,
        }
    }
}

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Reward function settings.
    #[keys(section)]
    pub reward: RewardConfig,
    /// Step match settings.
    #[serde(rename = "match")]
    #[keys(section)]
    pub step_match: MatchConfig,
    /// Rows per record batch read from trajectories.
    pub batch_rows: usize,
    /// A trajectory whose task is not in tasks: error or skip.
    pub missing_tasks: MissingTasks,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            reward: RewardConfig::default(),
            step_match: MatchConfig::default(),
            batch_rows: 8192,
            missing_tasks: MissingTasks::Error,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        keys_of::<Config>()
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    /// The tasks when the chosen reward needs them ([`Reward::reads`]).
    fn reads(&self) -> Vec<TableName> {
        match reward(&self.reward.function) {
            Some(chosen) if chosen.reads().tasks.is_some() => vec![TableName::Tasks],
            _ => Vec::new(),
        }
    }

    /// `reward.fn` a registered reward, every reward's keys checked
    /// ([`Reward::settings`]: `reward.reward_coef` above 0), `batch_rows`
    /// at least 1.
    fn validate(&self) -> Result<()> {
        if reward(&self.reward.function).is_none() {
            let names: Vec<String> = REWARDS.iter().map(|r| format!("`{}`", r.name())).collect();
            return Err(Error::BadValue {
                key: "reward.fn".into(),
                reason: format!(
                    "unknown variant `{}`, expected one of {}",
                    self.reward.function,
                    names.join(", ")
                ),
            });
        }
        section::check(&sections(), &self.reward.tree(), &())?;
        at_least("batch_rows", self.batch_rows, 1)
    }
}

/// What to do with trajectories whose task the tasks table lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingTasks {
    /// Fail, naming the missing task ids and the tables read.
    Error,
    /// Leave those trajectories out and count them in the summary.
    Skip,
}

/// The trajectories (owned by this shard) whose task is not in `tasks`:
/// their count and the first few task ids, sorted. Reads only id columns.
fn missing_tasks(
    trajectories: &TableReader,
    tasks: &TableReader,
    shard: ShardSpec,
) -> Result<(HashSet<String>, u64)> {
    let mut known = HashSet::new();
    for batch in tasks.batches(Some(&["task_id"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "task_id");
        known.extend((0..batch.num_rows()).map(|i| ids.value(i).to_string()));
    }
    let (mut missing, mut count) = (HashSet::new(), 0u64);
    for batch in trajectories.batches(Some(&["group_id", "task_id"]), 65_536)? {
        let batch = batch?;
        let groups = column::<StringArray>(&batch, "group_id");
        let ids = column::<StringArray>(&batch, "task_id");
        for i in 0..batch.num_rows() {
            if shard.owns(groups.value(i)) && !known.contains(ids.value(i)) {
                count += 1;
                missing.insert(ids.value(i).to_string());
            }
        }
    }
    Ok((missing, count))
}

/// The ids of the tasks in closed-loop worlds (`embodyflow_worlds::is_closed_loop`
/// of their `env`). Reads only the id and env columns.
fn closed_loop_tasks(tasks: &TableReader) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    for batch in tasks.batches(Some(&["task_id", "env"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "task_id");
        let envs = column::<StringArray>(&batch, "env");
        out.extend(
            (0..batch.num_rows())
                .filter(|&i| embodyflow_worlds::is_closed_loop(envs.value(i)))
                .map(|i| ids.value(i).to_string()),
        );
    }
    Ok(out)
}

/// The first owned trajectory (in input order) whose task is closed-loop:
/// `(trajectory id, task id)`; reads only id columns.
fn first_closed_loop(
    trajectories: &TableReader,
    closed: &HashSet<String>,
    shard: ShardSpec,
) -> Result<Option<(String, String)>> {
    if closed.is_empty() {
        return Ok(None);
    }
    for batch in trajectories.batches(Some(&["trajectory_id", "group_id", "task_id"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let groups = column::<StringArray>(&batch, "group_id");
        let tasks = column::<StringArray>(&batch, "task_id");
        if let Some(i) = (0..batch.num_rows())
            .find(|&i| shard.owns(groups.value(i)) && closed.contains(tasks.value(i)))
        {
            return Ok(Some((ids.value(i).to_string(), tasks.value(i).to_string())));
        }
    }
    Ok(None)
}

/// The inputs a run reads, checked against what the reward needs before
/// any row is scored.
struct Inputs {
    trajectories: TableReader,
    /// Trajectories (owned by this shard) whose task the tasks table lacks.
    missing: HashSet<String>,
    skipped: u64,
    /// The tasks in closed-loop worlds.
    closed: HashSet<String>,
    gt: HashMap<String, Vec<GtStep>>,
    envs: HashMap<String, TaskEnv>,
}

impl Inputs {
    /// Opens the trajectories and, when given, the tasks; fails (bad input,
    /// before any row) when the reward needs the tasks and they are absent,
    /// when a trajectory's task is missing (unless `missing_tasks = skip`),
    /// or when the reward scores plans and a trajectory is a closed-loop
    /// episode.
    fn open(stage: &Stage<Config>, reward: &dyn Reward) -> Result<Inputs> {
        let config = &stage.config;
        let reads = reward.reads();
        let trajectories = stage.input(TableName::Trajectories)?;
        let tasks = stage.optional_input(TableName::Tasks)?;
        if let (Some(why), None) = (reads.tasks, &tasks) {
            return Err(Error::BadInput(format!(
                "reward.fn = {} needs the tasks table ({why}) among the inputs",
                reward.name()
            )));
        }
        // Every trajectory must find its task: scoring an unmatched plan as a
        // failure would silently poison the run.
        let (missing, skipped) = match &tasks {
            Some(tasks) => missing_tasks(&trajectories, tasks, stage.args.shard)?,
            None => (HashSet::new(), 0),
        };
        if skipped > 0 && config.missing_tasks == MissingTasks::Error {
            let mut ids: Vec<&String> = missing.iter().collect();
            ids.sort();
            let shown: Vec<&str> = ids.iter().take(5).map(|s| s.as_str()).collect();
            return Err(Error::BadInput(format!(
                "{skipped} trajectories of {} name {} tasks that the tasks table {} does not hold (e.g. {}); pass the tasks the rollouts were collected from, or --set missing_tasks=skip to leave them out",
                trajectories.dir().display(),
                missing.len(),
                tasks
                    .as_ref()
                    .map_or(String::new(), |t| t.dir().display().to_string()),
                shown.join(", ")
            )));
        }
        let closed = tasks
            .as_ref()
            .map(closed_loop_tasks)
            .transpose()?
            .unwrap_or_default();
        if !reads.episodes
            && let Some((trajectory, task)) =
                first_closed_loop(&trajectories, &closed, stage.args.shard)?
        {
            return Err(Error::BadInput(format!(
                "trajectory `{trajectory}` of {} is an episode of task `{task}`, a closed-loop world: reward.fn = {} scores one-shot plans; closed-loop episodes take reward.fn = outcome (reward.reward_coef on success)",
                trajectories.dir().display(),
                reward.name()
            )));
        }
        let gt = tasks.as_ref().map(read_gt).transpose()?.unwrap_or_default();
        let envs = match &tasks {
            Some(tasks) if reads.scenes => read_envs(tasks)?,
            _ => HashMap::new(),
        };
        Ok(Inputs {
            trajectories,
            missing,
            skipped,
            closed,
            gt,
            envs,
        })
    }
}

/// What the scored rows add up to.
#[derive(Debug, Default)]
struct Counts {
    scored: u64,
    parse_failures: u64,
    with_gt: u64,
    score_sum: f64,
    successes: u64,
    closed_loop: u64,
    faulted: u64,
    tally: Tally,
}

impl Counts {
    fn add(&mut self, row: &RewardRow) {
        self.scored += 1;
        if row.faulted() {
            self.faulted += 1;
            return;
        }
        self.parse_failures += u64::from(!row.parse_ok);
        self.with_gt += u64::from(row.step_match.is_some());
        self.score_sum += f64::from(row.score);
        self.successes += u64::from(row.success);
        if row.step_valid.is_some() {
            self.tally.executed += 1;
            self.tally.executed_ok += u64::from(row.accuracy > 0.0);
        }
    }
}

/// Scores every owned trajectory (in parallel, written in input order).
fn score_rows(
    stage: &Stage<Config>,
    inputs: &Inputs,
    scorer: &dyn Scorer,
    writer: &mut TableWriter,
) -> Result<Counts> {
    let config = &stage.config;
    let shard = stage.args.shard;
    let name = config.reward.function.as_str();
    let mut counts = Counts::default();
    let bar = progress::bar(inputs.trajectories.num_rows(), "scoring");
    let columns = [
        "trajectory_id",
        "group_id",
        "task_id",
        "complete",
        "response_text",
        "ever_grasped",
        "infra_fault",
    ];
    for batch in inputs
        .trajectories
        .batches(Some(&columns), config.batch_rows)?
    {
        let batch = batch?;
        bar.inc(batch.num_rows() as u64);
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let groups = column::<StringArray>(&batch, "group_id");
        let task_ids = column::<StringArray>(&batch, "task_id");
        let complete = column::<BooleanArray>(&batch, "complete");
        let texts = column::<StringArray>(&batch, "response_text");
        let grasped = column::<BooleanArray>(&batch, "ever_grasped");
        let fault = column::<BooleanArray>(&batch, "infra_fault");
        counts.closed_loop += (0..batch.num_rows())
            .filter(|&i| shard.owns(groups.value(i)) && inputs.closed.contains(task_ids.value(i)))
            .count() as u64;
        let rows: Vec<RewardRow> = (0..batch.num_rows())
            .into_par_iter()
            .filter(|&i| shard.owns(groups.value(i)) && !inputs.missing.contains(task_ids.value(i)))
            .map(|i| {
                let rollout = Rollout {
                    trajectory_id: ids.value(i),
                    group_id: groups.value(i),
                    complete: complete.value(i),
                    response_text: (!texts.is_null(i)).then(|| texts.value(i)),
                    gt: inputs.gt.get(task_ids.value(i)).map(Vec::as_slice),
                    env: inputs.envs.get(task_ids.value(i)),
                    ever_grasped: (!grasped.is_null(i)).then(|| grasped.value(i)),
                    infra_fault: fault.is_valid(i) && fault.value(i),
                };
                score(&rollout, scorer, name, config.step_match.mode)
            })
            .collect();
        for row in &rows {
            counts.add(row);
        }
        writer.write_rows(&rows)?;
    }
    bar.finish_and_clear();
    Ok(counts)
}

/// Scores one trajectory under `scorer` (reward `name`): the plan found
/// tolerantly, its rule match under `mode` whatever the reward, its run in
/// the task's environment when one is given (pure; the stage maps it over
/// rows in parallel).
pub fn score(rollout: &Rollout<'_>, scorer: &dyn Scorer, name: &str, mode: MatchMode) -> RewardRow {
    let plan: Option<Plan> = rollout.response_text.and_then(extract);
    let matches = match (&plan, rollout.gt) {
        (Some(plan), Some(gt)) => Some(step_match(&plan.steps, gt, mode)),
        (None, Some(_)) => Some(Vec::new()),
        (_, None) => None,
    };
    let execution = rollout
        .env
        .and_then(|env| plan.as_ref().map(|plan| env.execute_plan(plan)));
    let seen = Seen {
        plan,
        matches,
        execution,
    };
    let scored = scorer.score(rollout, &seen);
    let Seen {
        plan,
        matches,
        execution,
    } = seen;
    RewardRow {
        trajectory_id: rollout.trajectory_id.to_string(),
        group_id: rollout.group_id.to_string(),
        score: scored.score,
        format: scored.format,
        accuracy: scored.accuracy,
        success: rollout.complete,
        parse_ok: rollout.response_text.is_none() || plan.is_some(),
        pred_actions: plan.as_ref().map(|plan| {
            plan.steps
                .iter()
                .map(|s| PredictedAction {
                    action_id: s.action_id,
                    action_name: s.action_name.clone(),
                })
                .collect()
        }),
        step_match: matches,
        step_valid: execution.map(|e| e.step_valid),
        reward_fn: name.to_string(),
        ever_grasped: rollout.ever_grasped,
        token_rewards: None,
        infra_fault: Some(rollout.infra_fault),
    }
}

/// Ground-truth plans of the tasks, by task id.
fn read_gt(tasks: &TableReader) -> Result<HashMap<String, Vec<GtStep>>> {
    let mut plans = HashMap::new();
    for batch in tasks.batches(Some(&["task_id", "gt_actions"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "task_id");
        let gt = column::<ListArray>(&batch, "gt_actions");
        for i in 0..batch.num_rows() {
            if gt.is_null(i) {
                continue;
            }
            let steps = gt.value(i);
            let steps = steps
                .as_any()
                .downcast_ref::<StructArray>()
                .expect("list<struct>");
            let action_ids = steps
                .column_by_name("action_id")
                .expect("schema")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("i64");
            let names = steps
                .column_by_name("action_name")
                .expect("schema")
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("utf8");
            let plan = (0..steps.len())
                .map(|k| GtStep {
                    action_id: action_ids.value(k),
                    action_name: names.value(k).to_string(),
                })
                .collect();
            plans.insert(ids.value(i).to_string(), plan);
        }
    }
    Ok(plans)
}

/// The tasks of built-in environments (with an observation), by task id,
/// rebuilt for their executor; a malformed observation is bad input.
fn read_envs(tasks: &TableReader) -> Result<HashMap<String, TaskEnv>> {
    let mut out = HashMap::new();
    for batch in tasks.batches(None, 65_536)? {
        for row in batch_to_rows::<TaskRow>(&batch?)? {
            if TaskEnv::is_built_in(&row.env) && row.observation.is_some() {
                out.insert(row.task_id.clone(), TaskEnv::from_row(&row, 0)?);
            }
        }
    }
    Ok(out)
}

/// The run's summary: the counts, then the reward's own lines.
fn summary(stage: &Stage<Config>, skipped: u64, counts: &Counts, scorer: &dyn Scorer) -> Summary {
    let config = &stage.config;
    let ran = (counts.scored - counts.faulted).max(1) as f64;
    let mut summary = Summary::new(format!("score-rewards ({})", config.reward.function));
    summary
        .add("shard", stage.args.shard)
        .add("trajectories scored", counts.scored)
        .add("skipped: task not in the tasks table", skipped)
        .add("closed-loop episodes", counts.closed_loop)
        .add(
            "ended by an infrastructure fault (no outcome, left out below)",
            counts.faulted,
        )
        .add("with a ground-truth plan", counts.with_gt)
        .add("plan parse failures", counts.parse_failures)
        .add(
            "success rate",
            format!("{:.3}", counts.successes as f64 / ran),
        )
        .add("mean score", format!("{:.4}", counts.score_sum / ran))
        .add(
            "match mode",
            format!("{:?}", config.step_match.mode).to_lowercase(),
        );
    scorer.add_lines(&counts.tally, &mut summary);
    summary
}

/// Runs the stage.
pub fn run(args: Args) -> Result<()> {
    let stage =
        Stage::<Config>::start(&spec::SCORE_REWARDS, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_outputs(&[TableName::Rewards])?;
    let reward = stage.config.reward.reward();
    let scorer = reward.scorer(&stage.config.reward.tree())?;
    let inputs = Inputs::open(&stage, reward)?;
    let mut writer = stage.writer(TableName::Rewards)?;
    let counts = score_rows(&stage, &inputs, scorer.as_ref(), &mut writer)?;
    stage.finish(writer)?;
    stage.commit(&summary(&stage, inputs.skipped, &counts, scorer.as_ref()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        assert_eq!(
            refused_key::<Config>(&["reward.fn=verify", "reward.reward_coef=5"]),
            None
        );
        for (set, key) in [
            ("reward.fn=bogus", "reward.fn"),
            ("reward.reward_coef=0", "reward.reward_coef"),
            ("reward.reward_coef=-1", "reward.reward_coef"),
            ("reward.reward_coef=abc", "reward.reward_coef"),
            ("reward.tolerant=3", "reward.tolerant"),
            ("reward.bogus=1", "reward.bogus"),
            ("match.mode=fuzzy", "match.mode"),
            ("missing_tasks=ignore", "missing_tasks"),
            ("batch_rows=0", "batch_rows"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
        let sets = vec!["reward.fn=bogus".to_string()];
        let message = embodyflow_core::config::load_config::<Config>(None, &sets)
            .err()
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("config key `reward.fn`: unknown variant `bogus`, expected one of `outcome`, `embodied_r1`, `verify`"),
            "{message}"
        );
    }

    #[test]
    fn the_config_round_trips_through_its_tree() {
        let sets = vec![
            "reward.fn=embodied_r1".to_string(),
            "reward.tolerant=true".to_string(),
        ];
        let resolved = embodyflow_core::config::load_config::<Config>(None, &sets).unwrap();
        assert_eq!(resolved.json["reward"]["fn"], "embodied_r1");
        assert_eq!(resolved.json["reward"]["reward_coef"], 1.0);
        let config: Config = serde_json::from_value(resolved.json.clone()).unwrap();
        assert_eq!(config, resolved.config);
        assert_eq!(serde_json::to_value(&config).unwrap(), resolved.json);
        assert_eq!(config.reward.reward().name(), "embodied_r1");
    }

    #[test]
    fn a_closed_loop_episode_takes_the_outcome_reward_with_no_plan_columns() {
        let config: Config = serde_json::from_value(
            serde_json::json!({"reward": {"fn": "outcome", "reward_coef": 5.0}}),
        )
        .unwrap();
        let reward = config.reward.reward();
        assert!(reward.reads().episodes, "the outcome scores episodes");
        let scorer = reward.scorer(&config.reward.tree()).unwrap();
        for (complete, ever_grasped) in [(true, Some(false)), (false, Some(true))] {
            let rollout = Rollout {
                trajectory_id: "g/s1",
                group_id: "g",
                complete,
                response_text: None,
                gt: None,
                env: None,
                ever_grasped,
                infra_fault: !complete,
            };
            let row = score(&rollout, scorer.as_ref(), reward.name(), MatchMode::Exact);
            let expected = if complete { 5.0 } else { 0.0 };
            assert_eq!(
                (row.score, row.accuracy, row.format),
                (expected, expected, 0.0)
            );
            assert_eq!(row.success, complete);
            assert!(row.parse_ok, "no plan to parse");
            assert!(row.pred_actions.is_none() && row.step_match.is_none());
            assert!(row.step_valid.is_none());
            assert_eq!(row.reward_fn, "outcome");
            assert_eq!(row.ever_grasped, ever_grasped, "the grasp fact is copied");
            assert_eq!(row.infra_fault, Some(!complete), "the fault is carried");
            assert_eq!(
                (row.trajectory_id.as_str(), row.group_id.as_str()),
                ("g/s1", "g")
            );
        }
        for reward in REWARDS.iter().filter(|r| r.name() != "outcome") {
            assert!(!reward.reads().episodes, "{} scores plans", reward.name());
        }
    }

    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<Config>().unwrap();
    }
}
