//! The `evaluate` stage: the policy answers every task of the input `tasks`
//! table greedily, in `runs` scene layouts (run 0 is the task's own scene,
//! run r > 0 the same goal in the layout the environment draws for run r),
//! and the answers are executed. Writes the `eval` table (one row per task and
//! run) and a Markdown summary with the success rate by split and by task
//! type: the mean over runs, and the spread of the per-run rates.
//!
//! ```text
//! evaluate --policy runs/it9/policy --input data/val --out runs/it9/eval-val --set runs=3
//! ```

use std::collections::BTreeMap;

use embodyflow_core::Error;
use embodyflow_core::cli::{PolicyArg, StageArgs};
use embodyflow_core::schemas::{EvalRow, TableName, TaskRow};
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_envs::TaskEnv;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::episodes::{Request, run_episodes};
use embodyflow_models::policy::Sampling;
use serde::{Deserialize, Serialize};

/// Command line of `evaluate`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "evaluate",
    version,
    about = "Greedy success rates by split and task type"
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
    #[command(flatten)]
    policy: PolicyArg,
}

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Scene layouts per task.
    pub runs: u32,
    /// Most tokens per answer.
    pub max_new_tokens: usize,
    /// Sequences per decoding batch.
    pub batch_rows: usize,
    /// Output layout.
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runs: 3,
            max_new_tokens: 256,
            batch_rows: 128,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn output(&self) -> &OutputConfig {
        &self.output
    }
}

/// Success rates of `rows` grouped by `key`: for each group, the mean over
/// runs and the lowest and highest per-run rate.
pub fn success_by<F: Fn(&EvalRow) -> String>(
    rows: &[EvalRow],
    key: F,
) -> BTreeMap<String, (f64, f64, f64, usize)> {
    let mut counts: BTreeMap<String, BTreeMap<i32, (usize, usize)>> = BTreeMap::new();
    for row in rows {
        let per_run = counts
            .entry(key(row))
            .or_default()
            .entry(row.run)
            .or_default();
        per_run.0 += row.success as usize;
        per_run.1 += 1;
    }
    counts
        .into_iter()
        .map(|(group, runs)| {
            let rates: Vec<f64> = runs
                .values()
                .map(|&(wins, n)| wins as f64 / n as f64)
                .collect();
            let mean = rates.iter().sum::<f64>() / rates.len() as f64;
            let low = rates.iter().cloned().fold(f64::INFINITY, f64::min);
            let high = rates.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let tasks = runs.values().map(|&(_, n)| n).max().unwrap_or(0);
            (group, (mean, low, high, tasks))
        })
        .collect()
}

/// Runs the stage.
pub fn run(args: Args) -> Result<(), ModelError> {
    let stage = Stage::<Config>::start("evaluate", env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_outputs(&[TableName::Eval])?;
    let config = &stage.config;
    if config.runs == 0 {
        return Err(Error::Usage("runs must be at least 1".into()).into());
    }
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    let policy = Checkpoint::load(&args.policy.policy, device)?;
    let tasks: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
    let tasks: Vec<&TaskRow> = tasks
        .iter()
        .filter(|t| args.stage.shard.owns(&t.task_id))
        .collect();
    let mut envs = Vec::with_capacity(tasks.len() * config.runs as usize);
    for run in 0..config.runs {
        for task in &tasks {
            envs.push((run, *task, TaskEnv::from_row(task, run)?));
        }
    }
    let requests: Vec<Request> = envs
        .iter()
        .map(|(_, _, env)| Request { env, seed: 0 })
        .collect();
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: config.max_new_tokens,
    };
    let episodes = run_episodes(&policy, &requests, &greedy, config.batch_rows, "evaluating")?;
    let rows: Vec<EvalRow> = envs
        .iter()
        .zip(&episodes)
        .map(|((run, task, _), episode)| EvalRow {
            task_id: task.task_id.clone(),
            run: *run as i32,
            split: task.split.clone(),
            task_type: task.task_type.clone(),
            policy: policy.manifest.id.clone(),
            success: episode.outcome.success,
            num_steps: episode.outcome.step_valid.len() as i32,
            env_steps: episode.outcome.env_steps as i32,
        })
        .collect();
    let mut writer = stage.writer(TableName::Eval)?;
    writer.write_rows(&rows)?;
    stage.finish(writer)?;

    let mut summary = Summary::new("evaluate");
    summary.add("policy", &policy.manifest.id).add(
        "episodes",
        format!(
            "{} ({} tasks x {} runs, greedy)",
            rows.len(),
            tasks.len(),
            config.runs
        ),
    );
    let parsed = episodes.iter().filter(|e| e.outcome.parsed).count();
    summary.add(
        "answers with a plan",
        format!("{parsed} of {}", episodes.len()),
    );
    for (label, key) in [
        (
            "split",
            (|r: &EvalRow| r.split.clone()) as fn(&EvalRow) -> String,
        ),
        ("task type", |r: &EvalRow| {
            format!("{} / {}", r.split, r.task_type.as_deref().unwrap_or("-"))
        }),
    ] {
        for (group, (mean, low, high, n)) in success_by(&rows, key) {
            summary.add(
                format!("success, {label} {group}"),
                format!("{mean:.3} (runs {low:.3}..{high:.3}, {n} tasks)"),
            );
        }
    }
    stage.write_summary(&summary)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(split: &str, run: i32, success: bool) -> EvalRow {
        EvalRow {
            task_id: format!("t{run}"),
            run,
            split: split.into(),
            task_type: None,
            policy: "p".into(),
            success,
            num_steps: 1,
            env_steps: 1,
        }
    }

    #[test]
    fn success_is_the_mean_of_per_run_rates() {
        let rows = vec![
            row("val", 0, true),
            row("val", 0, false),
            row("val", 1, true),
            row("val", 1, true),
            row("unseen", 0, false),
        ];
        let by_split = success_by(&rows, |r| r.split.clone());
        assert_eq!(by_split["val"], (0.75, 0.5, 1.0, 2));
        assert_eq!(by_split["unseen"], (0.0, 0.0, 0.0, 1));
    }
}
