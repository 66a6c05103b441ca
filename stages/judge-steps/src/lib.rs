//! The `judge-steps` stage: a built-in rule judge that writes the
//! `step_gates` table read by `compute-advantages --set step.gate=prompt`
//! (`gate = decision * (1 - redundancy) * (0.5 + 0.5 * causal)`,
//! the prompt gate of `easyr1-embody-stepopsd-notes` §5). Any external judge
//! (an LLM asked about each step, say) can write the same table instead.
//!
//! Each predicted plan step (the `pred_actions` of the rewards table) is
//! executed in the task's environment and judged:
//! - decision gate: 1 for a step that chooses an object or receptacle (find,
//!   pick up) or names no known action, 0.5 for one its earlier choices
//!   determine (put down, open, close, turn on/off, slice);
//! - redundancy gate: 1 for a valid step that changes nothing the goal needs
//!   (the state is unchanged, e.g. a repeated find, or the plan succeeds and
//!   still succeeds without it), else 0;
//! - causal gate: 0 for the steps after the first invalid one, else 1.
//!
//! A trajectory whose response gave no plan has no steps and no rows.
//!
//! ```text
//! judge-steps --input runs/it0/rollouts --input runs/it0/rewards --input data/train --out runs/it0/judge
//! compute-advantages --input runs/it0/rollouts --input runs/it0/rewards --input runs/it0/judge \
//!     --policy runs/it0/policy --out runs/it0/adv --set estimator=grpo_step --set step.gate=prompt
//! ```

use std::collections::{BTreeMap, HashMap};

use embodyflow_core::cli::StageArgs;
use embodyflow_core::schemas::{RewardRow, StepGateRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, Result, progress};
use serde::{Deserialize, Serialize};

/// Command line of `judge-steps`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::JUDGE_STEPS.name,
    version,
    about = spec::JUDGE_STEPS.purpose,
    after_help = spec::JUDGE_STEPS.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
}

/// The stage's config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Output layout.
    pub output: OutputConfig,
}

impl StageConfig for Config {
    fn output(&self) -> &OutputConfig {
        &self.output
    }
}

/// The gate rows of every judged plan step, in reward-row order, and the
/// number of steps per verdict.
pub fn judge_rewards(
    rewards: &[RewardRow],
    task_of: &HashMap<&str, &str>,
    tasks: &HashMap<&str, &TaskRow>,
) -> Result<(Vec<StepGateRow>, BTreeMap<&'static str, usize>)> {
    let mut rows = Vec::new();
    let mut verdicts = BTreeMap::new();
    let bar = progress::bar(rewards.len() as u64, "judging");
    for reward in rewards {
        bar.inc(1);
        let Some(plan) = &reward.pred_actions else {
            continue;
        };
        let task_id = task_of.get(reward.trajectory_id.as_str()).ok_or_else(|| {
            Error::BadInput(format!(
                "trajectory `{}` is in rewards but not in trajectories",
                reward.trajectory_id
            ))
        })?;
        let task = tasks.get(task_id).ok_or_else(|| {
            Error::BadInput(format!(
                "trajectory `{}`: task `{task_id}` is not in the input tasks table",
                reward.trajectory_id
            ))
        })?;
        let env = embodyflow_worlds::one_shot(task, 0)?;
        for (k, judged) in env.judge(plan).into_iter().enumerate() {
            *verdicts.entry(judged.reason).or_default() += 1;
            rows.push(StepGateRow {
                trajectory_id: reward.trajectory_id.clone(),
                plan_step: k as i32,
                decision_gate: judged.decision,
                redundancy_gate: f32::from(u8::from(judged.redundant)),
                causal_gate: f32::from(u8::from(judged.causal)),
                prompt_kl_score: None,
                reason: Some(judged.reason.to_string()),
            });
        }
    }
    bar.finish_and_clear();
    Ok((rows, verdicts))
}

/// Runs the stage.
pub fn run(args: Args) -> Result<()> {
    let stage = Stage::<Config>::start(&spec::JUDGE_STEPS, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_outputs(&[TableName::StepGates])?;
    let trajectories: Vec<TrajectoryRow> = stage.input(TableName::Trajectories)?.read_rows()?;
    let rewards: Vec<RewardRow> = stage.input(TableName::Rewards)?.read_rows()?;
    let task_rows: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
    let task_of: HashMap<&str, &str> = trajectories
        .iter()
        .map(|t| (t.trajectory_id.as_str(), t.task_id.as_str()))
        .collect();
    let tasks: HashMap<&str, &TaskRow> =
        task_rows.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let owned: Vec<RewardRow> = rewards
        .into_iter()
        .filter(|r| args.stage.shard.owns(&r.group_id))
        .collect();
    let (rows, verdicts) = judge_rewards(&owned, &task_of, &tasks)?;
    let mut writer = stage.writer(TableName::StepGates)?;
    writer.write_rows(&rows)?;
    stage.finish(writer)?;
    let mean_gate = rows
        .iter()
        .map(|r| r.decision_gate * (1.0 - r.redundancy_gate) * (0.5 + 0.5 * r.causal_gate))
        .map(f64::from)
        .sum::<f64>()
        / rows.len().max(1) as f64;
    let mut summary = Summary::new("judge-steps");
    summary
        .add(
            "trajectories judged",
            owned.iter().filter(|r| r.pred_actions.is_some()).count(),
        )
        .add("plan steps", rows.len())
        .add("mean prompt gate", format!("{mean_gate:.3}"));
    for (reason, count) in &verdicts {
        summary.add(
            format!("steps: {reason}"),
            format!(
                "{count} ({:.1} %)",
                100.0 * *count as f64 / rows.len().max(1) as f64
            ),
        );
    }
    stage.commit(&summary)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::schemas::PredictedAction;

    fn reward(trajectory_id: &str, plan: Option<Vec<PredictedAction>>) -> RewardRow {
        RewardRow {
            infra_fault: None,
            trajectory_id: trajectory_id.into(),
            group_id: "g".into(),
            score: 0.0,
            format: 0.0,
            accuracy: 0.0,
            success: false,
            parse_ok: plan.is_some(),
            pred_actions: plan,
            step_match: None,
            step_valid: None,
            reward_fn: "outcome".into(),
            ever_grasped: None,
            token_rewards: None,
        }
    }

    #[test]
    fn gates_follow_the_execution_of_each_plan() {
        let task = embodyflow_household::task_row(
            &embodyflow_household::generate_tasks(embodyflow_household::Split::Train, 4, 1)[0],
        );
        let mut plan: Vec<PredictedAction> = task
            .gt_actions
            .clone()
            .unwrap()
            .into_iter()
            .map(|a| PredictedAction {
                action_id: Some(a.action_id),
                action_name: Some(a.action_name),
            })
            .collect();
        plan.insert(
            1,
            PredictedAction {
                action_id: Some(9_999),
                action_name: None,
            },
        );
        let task_of = HashMap::from([("a", task.task_id.as_str()), ("b", task.task_id.as_str())]);
        let tasks = HashMap::from([(task.task_id.as_str(), &task)]);
        let rewards = [reward("a", Some(plan.clone())), reward("b", None)];
        let (rows, verdicts) = judge_rewards(&rewards, &task_of, &tasks).unwrap();
        assert_eq!(
            rows.len(),
            plan.len(),
            "a response without a plan has no rows"
        );
        assert_eq!(rows[1].reason.as_deref(), Some("invalid"));
        assert_eq!((rows[0].causal_gate, rows[1].causal_gate), (1.0, 1.0));
        assert!(
            rows[2..]
                .iter()
                .all(|r| r.causal_gate == 0.0 && r.trajectory_id == "a")
        );
        assert_eq!(verdicts["invalid"], 1);

        let stray = [reward("c", Some(plan))];
        let error = judge_rewards(&stray, &task_of, &tasks)
            .unwrap_err()
            .to_string();
        assert!(error.contains("trajectory `c`"), "{error}");
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
