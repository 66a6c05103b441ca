//! The `score-rewards` stage: reads trajectories (and tasks for ground-truth
//! plans) and writes the rewards table, one row per trajectory.
//!
//! `reward.fn` chooses the reward (formulas in `embodyflow_algos::rewards`):
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
//! `embodyflow_envs::TaskEnv::is_closed_loop` names, `env = tabletop`, found
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
//! process owns.
//!
//! ```text
//! score-rewards --input runs/it0/rollouts --input data/train --out runs/it0/rewards \
//!     --set reward.fn=embodied_r1 --set match.mode=lcs
//! ```

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use arrow::array::{Array, BooleanArray, Int64Array, ListArray, StringArray, StructArray};
use embodyflow_algos::plan::{GtStep, MatchMode, Plan, extract, step_match};
use embodyflow_algos::rewards::{ActionList, Scored, embodied_r1, outcome, verify};
use embodyflow_core::cli::StageArgs;
use embodyflow_core::config::{ConfigKeys, at_least, keys_of, positive};
use embodyflow_core::dataset::{TableReader, batch_to_rows, column};
use embodyflow_core::schemas::{PredictedAction, RewardRow, TableName, TaskRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, Result, progress};
use embodyflow_envs::TaskEnv;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

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

/// The reward function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardFn {
    /// `reward_coef * complete`.
    Outcome,
    /// Format + prefix accuracy (Embodied-R1).
    EmbodiedR1,
    /// `0.8 * accuracy + 0.2 * format` (EasyR1 embody).
    Verify,
}

impl RewardFn {
    fn name(self) -> &'static str {
        match self {
            RewardFn::Outcome => "outcome",
            RewardFn::EmbodiedR1 => "embodied_r1",
            RewardFn::Verify => "verify",
        }
    }
}

/// `reward.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// Reward function: outcome, embodied_r1 or verify.
    #[serde(rename = "fn")]
    pub function: RewardFn,
    /// Outcome reward for a completed task (1.0 SimpleVLA-RL, 5.0 LaST-R1).
    pub reward_coef: f32,
    /// embodied_r1: tolerant parsing instead of the reference's strict parsing.
    pub tolerant: bool,
    /// embodied_r1: JSON file with the action names (index = action id).
    pub action_list: Option<PathBuf>,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            function: RewardFn::Outcome,
            reward_coef: 1.0,
            tolerant: false,
            action_list: None,
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

    fn validate(&self) -> Result<()> {
        positive("reward.reward_coef", f64::from(self.reward.reward_coef))?;
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
    shard: embodyflow_core::cli::ShardSpec,
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

/// The ids of the tasks in closed-loop worlds (`TaskEnv::is_closed_loop`
/// of their `env`). Reads only the id and env columns.
fn closed_loop_tasks(tasks: &TableReader) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    for batch in tasks.batches(Some(&["task_id", "env"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "task_id");
        let envs = column::<StringArray>(&batch, "env");
        out.extend(
            (0..batch.num_rows())
                .filter(|&i| TaskEnv::is_closed_loop(envs.value(i)))
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
    shard: embodyflow_core::cli::ShardSpec,
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

/// One trajectory as scoring sees it.
#[derive(Debug, Clone)]
pub struct Rollout<'a> {
    /// Trajectory id.
    pub trajectory_id: &'a str,
    /// Group id.
    pub group_id: &'a str,
    /// Whether the environment reported success.
    pub complete: bool,
    /// The response text of a one-shot plan.
    pub response_text: Option<&'a str>,
    /// The task's ground-truth plan.
    pub gt: Option<&'a [GtStep]>,
    /// The task in its environment (a built-in `env` with an observation);
    /// `verify` then executes the plan.
    pub env: Option<&'a TaskEnv>,
    /// Whether the episode ever grasped a goal's object (closed loop; null
    /// for a one-shot plan): copied to the row.
    pub ever_grasped: Option<bool>,
    /// Whether infrastructure ended the episode: copied to the row.
    pub infra_fault: bool,
}

/// Scores one trajectory (pure; the stage maps it over rows in parallel).
pub fn score(rollout: &Rollout<'_>, config: &Config, actions: Option<&ActionList>) -> RewardRow {
    let text = rollout.response_text.unwrap_or("");
    let tolerant_plan: Option<Plan> = rollout.response_text.and_then(extract);
    let matches = match (&tolerant_plan, rollout.gt) {
        (Some(plan), Some(gt)) => Some(step_match(&plan.steps, gt, config.step_match.mode)),
        (None, Some(_)) => Some(Vec::new()),
        (_, None) => None,
    };
    let execution = match (config.reward.function, rollout.env) {
        (RewardFn::Verify, Some(env)) => tolerant_plan.as_ref().map(|plan| env.execute_plan(plan)),
        _ => None,
    };
    let scored = match config.reward.function {
        RewardFn::Outcome => {
            let score = outcome(rollout.complete, config.reward.reward_coef);
            Scored {
                score,
                format: 0.0,
                accuracy: score,
                plan: None,
            }
        }
        RewardFn::EmbodiedR1 => embodied_r1(
            text,
            rollout.gt.unwrap_or(&[]),
            actions,
            config.reward.tolerant,
        ),
        RewardFn::Verify => {
            let matched = matches
                .as_ref()
                .map_or(0, |m| m.iter().filter(|&&x| x == 1).count());
            let executor_success = rollout
                .env
                .map(|_| execution.as_ref().is_some_and(|e| e.success));
            verify(
                tolerant_plan.clone(),
                executor_success,
                matched,
                rollout.gt.map_or(0, <[GtStep]>::len),
            )
        }
    };
    RewardRow {
        trajectory_id: rollout.trajectory_id.to_string(),
        group_id: rollout.group_id.to_string(),
        score: scored.score,
        format: scored.format,
        accuracy: scored.accuracy,
        success: rollout.complete,
        parse_ok: rollout.response_text.is_none() || tolerant_plan.is_some(),
        pred_actions: tolerant_plan.as_ref().map(|plan| {
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
        reward_fn: config.reward.function.name().to_string(),
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

fn read_action_list(path: &PathBuf) -> Result<ActionList> {
    // The file is named by the config: missing or unreadable is bad input.
    let text = std::fs::read_to_string(path).map_err(|e| Error::BadValue {
        key: "reward.action_list".into(),
        reason: format!("{}: cannot read it: {e}", path.display()),
    })?;
    let names: Vec<String> = serde_json::from_str(&text).map_err(|e| Error::BadValue {
        key: "reward.action_list".into(),
        reason: format!(
            "{}: expected a JSON list of action names: {e}",
            path.display()
        ),
    })?;
    Ok(ActionList::new(names))
}

/// Runs the stage.
pub fn run(args: Args) -> Result<()> {
    let stage =
        Stage::<Config>::start(&spec::SCORE_REWARDS, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_outputs(&[TableName::Rewards])?;
    let config = &stage.config;
    let actions = config
        .reward
        .action_list
        .as_ref()
        .map(read_action_list)
        .transpose()?;
    let trajectories = stage.input(TableName::Trajectories)?;
    let tasks = stage.optional_input(TableName::Tasks)?;
    if config.reward.function == RewardFn::EmbodiedR1 && tasks.is_none() {
        return Err(Error::BadInput(
            "reward.fn = embodied_r1 needs the tasks table (ground-truth plans) among the inputs"
                .into(),
        ));
    }
    if config.reward.function == RewardFn::Verify && tasks.is_none() {
        return Err(Error::BadInput(
            "reward.fn = verify needs the tasks table (the scenes plans run in) among the inputs"
                .into(),
        ));
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
    if config.reward.function != RewardFn::Outcome
        && let Some((trajectory, task)) =
            first_closed_loop(&trajectories, &closed, stage.args.shard)?
    {
        return Err(Error::BadInput(format!(
            "trajectory `{trajectory}` of {} is an episode of task `{task}`, a closed-loop world: reward.fn = {} scores one-shot plans; closed-loop episodes take reward.fn = outcome (reward.reward_coef on success)",
            trajectories.dir().display(),
            config.reward.function.name()
        )));
    }
    let gt = tasks.as_ref().map(read_gt).transpose()?.unwrap_or_default();
    let envs = match (&tasks, config.reward.function) {
        (Some(tasks), RewardFn::Verify) => read_envs(tasks)?,
        _ => HashMap::new(),
    };

    let mut writer = stage.writer(TableName::Rewards)?;
    let (mut scored, mut parse_failures, mut with_gt, mut score_sum, mut successes) =
        (0u64, 0u64, 0u64, 0f64, 0u64);
    let (mut executed, mut executed_ok, mut closed_loop, mut faulted) = (0u64, 0u64, 0u64, 0u64);
    let bar = progress::bar(trajectories.num_rows(), "scoring");
    let columns = [
        "trajectory_id",
        "group_id",
        "task_id",
        "complete",
        "response_text",
        "ever_grasped",
        "infra_fault",
    ];
    for batch in trajectories.batches(Some(&columns), config.batch_rows)? {
        let batch = batch?;
        bar.inc(batch.num_rows() as u64);
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let groups = column::<StringArray>(&batch, "group_id");
        let task_ids = column::<StringArray>(&batch, "task_id");
        let complete = column::<BooleanArray>(&batch, "complete");
        let texts = column::<StringArray>(&batch, "response_text");
        let grasped = column::<BooleanArray>(&batch, "ever_grasped");
        let fault = column::<BooleanArray>(&batch, "infra_fault");
        closed_loop += (0..batch.num_rows())
            .filter(|&i| {
                stage.args.shard.owns(groups.value(i)) && closed.contains(task_ids.value(i))
            })
            .count() as u64;
        let rows: Vec<RewardRow> = (0..batch.num_rows())
            .into_par_iter()
            .filter(|&i| {
                stage.args.shard.owns(groups.value(i)) && !missing.contains(task_ids.value(i))
            })
            .map(|i| {
                let rollout = Rollout {
                    trajectory_id: ids.value(i),
                    group_id: groups.value(i),
                    complete: complete.value(i),
                    response_text: (!texts.is_null(i)).then(|| texts.value(i)),
                    gt: gt.get(task_ids.value(i)).map(Vec::as_slice),
                    env: envs.get(task_ids.value(i)),
                    ever_grasped: (!grasped.is_null(i)).then(|| grasped.value(i)),
                    infra_fault: fault.is_valid(i) && fault.value(i),
                };
                score(&rollout, config, actions.as_ref())
            })
            .collect();
        for row in &rows {
            scored += 1;
            if row.faulted() {
                faulted += 1;
                continue;
            }
            parse_failures += u64::from(!row.parse_ok);
            with_gt += u64::from(row.step_match.is_some());
            score_sum += f64::from(row.score);
            successes += u64::from(row.success);
            if row.step_valid.is_some() {
                executed += 1;
                executed_ok += u64::from(row.accuracy > 0.0);
            }
        }
        writer.write_rows(&rows)?;
    }
    bar.finish_and_clear();
    stage.finish(writer)?;
    let mut summary = Summary::new(format!("score-rewards ({})", config.reward.function.name()));
    summary
        .add("shard", stage.args.shard)
        .add("trajectories scored", scored)
        .add("skipped: task not in the tasks table", skipped)
        .add("closed-loop episodes", closed_loop)
        .add(
            "ended by an infrastructure fault (no outcome, left out below)",
            faulted,
        )
        .add("with a ground-truth plan", with_gt)
        .add("plan parse failures", parse_failures)
        .add(
            "success rate",
            format!("{:.3}", successes as f64 / (scored - faulted).max(1) as f64),
        )
        .add(
            "mean score",
            format!("{:.4}", score_sum / (scored - faulted).max(1) as f64),
        )
        .add(
            "match mode",
            format!("{:?}", config.step_match.mode).to_lowercase(),
        );
    if config.reward.function == RewardFn::Verify {
        summary
            .add("plans executed (household)", executed)
            .add("executed plans reaching the goal", executed_ok);
    }
    if config.reward.function == RewardFn::EmbodiedR1 && actions.is_none() {
        summary.add(
            "note",
            "no reward.action_list: the id/name agreement part of the format reward is 0",
        );
    }
    stage.commit(&summary)?;
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
            ("match.mode=fuzzy", "match.mode"),
            ("missing_tasks=ignore", "missing_tasks"),
            ("batch_rows=0", "batch_rows"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
    }

    #[test]
    fn a_closed_loop_episode_takes_the_outcome_reward_with_no_plan_columns() {
        let config: Config = serde_json::from_value(
            serde_json::json!({"reward": {"fn": "outcome", "reward_coef": 5.0}}),
        )
        .unwrap();
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
            let row = score(&rollout, &config, None);
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
    }

    #[test]
    fn a_missing_action_list_is_bad_input_naming_the_key() {
        let err = read_action_list(&PathBuf::from("no/such/actions.json")).unwrap_err();
        assert!(
            matches!(&err, Error::BadValue { key, .. } if key == "reward.action_list"),
            "{err:?}"
        );
        assert!(err.to_string().contains("no/such/actions.json"), "{err}");
    }
}

/// The derived key meanings document exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
    }
}
