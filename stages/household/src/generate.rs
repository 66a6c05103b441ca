//! The `generate-tasks` stage: writes the tasks table of one split of a
//! built-in environment.
//!
//! `env` (`household` | `tabletop`), `split` (`train` | `val` | `unseen`),
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
//! ```text
//! generate-tasks --out data/val --set split=val --set count=200 --seed 7
//! generate-tasks --out data/tabletop-train --set env=tabletop --set suite=spatial --set count=500 --seed 7
//! ```

use std::collections::BTreeMap;

use embodyflow_core::Result;
use embodyflow_core::cli::StageArgs;
use embodyflow_core::config::{at_least, ensure};
use embodyflow_core::schemas::{TableName, TaskRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use serde::{Deserialize, Serialize};

use embodyflow_tabletop as tabletop;

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

/// The environment whose tasks are generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Env {
    /// The household planning world (one-shot JSON plans).
    Household,
    /// The tabletop manipulation world (closed loop).
    Tabletop,
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
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        ("env", "environment: household or tabletop"),
        ("count", "number of tasks to generate (at least 1)"),
        ("split", "task split: train, val or unseen"),
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
        ensure(
            self.env == Env::Tabletop || self.suite.is_none(),
            "suite",
            "no suite with env = household (suites are the tabletop world's)",
            format!(
                "suite = {}",
                self.suite
                    .map_or("unset".into(), |s| format!("{s:?}").to_lowercase())
            ),
        )
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
    let mut writer = stage.writer(TableName::Tasks)?;
    let mut rows: Vec<TaskRow> = Vec::new();
    let mut summary = Summary::new(format!("generate-tasks ({split})"));
    summary.add("shard", stage.args.shard).add("seed", seed);
    match config.env {
        Env::Household => {
            let mut by_type: BTreeMap<&'static str, usize> =
                TaskType::ALL.iter().map(|t| (t.as_str(), 0)).collect();
            let (mut steps, mut owned) = (0usize, 0usize);
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
            summary.add("tasks", owned).add(
                "mean expert plan length",
                format!("{:.2}", steps as f64 / owned.max(1) as f64),
            );
            for (name, n) in by_type {
                summary.add(name, n);
            }
        }
        Env::Tabletop => {
            let choice = config.suite.unwrap_or(SuiteChoice::All);
            let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
            let mut owned = 0usize;
            for i in 0..config.count {
                let (suite, index) = choice.task(i);
                let id = tabletop::suite::task_id_of(suite.as_str(), split.as_str(), seed, index);
                if !stage.args.shard.owns(&id) {
                    continue;
                }
                let task = tabletop::generate(suite, split, seed, index);
                *by_type
                    .entry(format!("{suite}: {}", task.task_type))
                    .or_default() += 1;
                owned += 1;
                rows.push(tabletop::task_row(&task));
                if rows.len() >= 4096 {
                    writer.write_rows(&rows)?;
                    rows.clear();
                }
            }
            summary.add("env", "tabletop").add("tasks", owned);
            for (name, n) in by_type {
                summary.add(name, n);
            }
        }
    }
    writer.write_rows(&rows)?;
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
        let problem = resolve(&["env=lab"]).problem.unwrap();
        assert_eq!(problem.key.as_deref(), Some("env"));
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
