//! The `generate-tasks` stage: writes the tasks table of one split.
//!
//! `split` (`train` | `val` | `unseen`) and `count` are config keys; the task
//! seeds derive from `--seed`, so a rerun writes the same table. A bad split
//! name or a count of 0 is rejected when the config is loaded (exit 2, also by
//! `--print-config`). The summary counts tasks by type.
//!
//! ```text
//! generate-tasks --out data/val --set split=val --set count=200 --seed 7
//! ```

use std::collections::BTreeMap;

use embodyflow_core::Result;
use embodyflow_core::cli::StageArgs;
use embodyflow_core::config::at_least;
use embodyflow_core::schemas::{TableName, TaskRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use serde::{Deserialize, Serialize};

use crate::task::{Split, TaskType, generate_task};
use crate::text::task_row;

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

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `train`, `val` or `unseen`.
    pub split: Split,
    /// Number of tasks (at least 1).
    pub count: usize,
    /// Output layout.
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            split: Split::Train,
            count: 1000,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        ("count", "number of tasks to generate (at least 1)"),
        ("split", "task split: train, val or unseen"),
    ];

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> Result<()> {
        at_least("count", self.count, 1)
    }
}

/// Runs the stage.
#[allow(clippy::result_large_err)] // the core's error type, shared by every stage
pub fn run(args: Args) -> Result<()> {
    let stage = Stage::<Config>::start(
        &spec::GENERATE_TASKS,
        env!("CARGO_PKG_VERSION"),
        &args.stage,
    )?;
    let config = &stage.config;
    let split = config.split;
    stage.check_outputs(&[TableName::Tasks])?;
    let seed = stage.args.seed;
    let mut by_type: BTreeMap<&'static str, usize> =
        TaskType::ALL.iter().map(|t| (t.as_str(), 0)).collect();
    let (mut steps, mut owned) = (0usize, 0usize);
    let mut writer = stage.writer(TableName::Tasks)?;
    let mut rows: Vec<TaskRow> = Vec::new();
    for index in 0..config.count {
        let id = format!("household/{split}/{seed}/{index:06}");
        if !stage.args.shard.owns(&id) {
            continue;
        }
        let task = generate_task(split, seed, index);
        let row = task_row(&task);
        *by_type.entry(task.task_type.as_str()).or_default() += 1;
        steps += row.gt_actions.as_ref().map_or(0, Vec::len);
        owned += 1;
        rows.push(row);
        if rows.len() >= 4096 {
            writer.write_rows(&rows)?;
            rows.clear();
        }
    }
    writer.write_rows(&rows)?;
    stage.finish(writer)?;
    let mut summary = Summary::new(format!("generate-tasks ({split})"));
    summary
        .add("shard", stage.args.shard)
        .add("seed", seed)
        .add("tasks", owned)
        .add(
            "mean expert plan length",
            format!("{:.2}", steps as f64 / owned.max(1) as f64),
        );
    for (name, n) in by_type {
        summary.add(name, n);
    }
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
