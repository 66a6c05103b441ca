//! Inputs for the estimators' unit tests: episodes joined in memory, a steps
//! table written to a temporary directory in a chosen row order, and a run of
//! one estimator into a real advantages table that is read back.
//!
//! ```text
//! let f = Fixture::new(&[("a", "g", 1.0, 2), ("b", "g", 0.0, 1)], &[step("a", 0, 3), ...]);
//! let (rows, stats, _) = f.run(&estimator, &f.all_groups(), 4).unwrap();
//! ```

use embodyflow_core::config::load_config;
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::manifest::Producer;
use embodyflow_core::schemas::{AdvantageRow, StepRow, TableName};
use embodyflow_core::{Error, Result};

use crate::diagnostics::{AdvantageStats, Diagnostics};
use std::sync::Arc;

use crate::Config;
use crate::episodes::{Episodes, Groups};
use crate::estimator::{Build, Estimate, Estimator, Reported, StepsInput};
use crate::holes::Holes;
use crate::output::AdvantagesOut;

/// Episodes and their steps table.
pub struct Fixture {
    dir: tempfile::TempDir,
    /// The steps table, rows in the order given.
    pub steps: TableReader,
    /// The trajectories joined with their scores.
    pub episodes: Episodes,
    /// The steps' response masks.
    pub holes: Arc<Holes>,
}

/// Step `index` of trajectory `id` with `tokens` response tokens (ids 3, 4,
/// …), a per-token value and a per-step value that differ by row.
pub fn step(id: &str, index: i32, tokens: usize) -> StepRow {
    let seed = id.bytes().map(f32::from).sum::<f32>() * 0.01 + index as f32 * 0.1;
    let mut row = StepRow::one_shot(
        id.to_string(),
        vec![1, 2],
        (0..tokens as i32).map(|t| 3 + t).collect(),
        vec![-1.0; tokens],
    );
    row.step_index = index;
    row.old_value = Some(seed.sin());
    row.old_values = Some((0..tokens).map(|t| (seed + t as f32 * 0.3).cos()).collect());
    row
}

impl Fixture {
    /// `trajectories` are `(id, group, score, num_steps)`; `steps` are
    /// written in the order given, one shard of `rows_per_shard` rows at a time.
    pub fn new(trajectories: &[(&str, &str, f32, i32)], steps: &[StepRow]) -> Fixture {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let options = WriteOptions {
            rows_per_shard: 3,
            ..WriteOptions::default()
        };
        let rollouts = dir.path().join("rollouts");
        let mut writer = TableWriter::create(&rollouts, TableName::Steps, options, false)
            .expect("a steps writer");
        writer.write_rows(steps).expect("steps rows");
        writer.finish(&producer(), &[]).expect("the steps table");
        let episodes = Episodes::join(
            trajectories
                .iter()
                .map(|&(id, group, _, n)| (id.to_string(), group.to_string(), n)),
            trajectories
                .iter()
                .map(|&(id, group, score, _)| (id.to_string(), group.to_string(), score)),
        )
        .expect("consistent trajectories");
        let mut holes = Holes::default();
        for row in steps {
            if let Some(mask) = &row.response_mask {
                holes.insert(&row.trajectory_id, row.step_index, mask.clone());
            }
        }
        Fixture {
            holes: Arc::new(holes),
            steps: TableReader::open(&rollouts.join(TableName::Steps.as_str()), TableName::Steps)
                .expect("the steps table"),
            episodes,
            dir,
        }
    }

    /// Gives trajectory `id` its token rewards (their sum must be its score).
    pub fn with_token_rewards(mut self, id: &str, rewards: &[f32]) -> Result<Fixture> {
        self.episodes.set_token_rewards(id, rewards.to_vec())?;
        Ok(self)
    }

    /// Marks trajectory `id` as ended by infrastructure (`infra_fault`).
    pub fn with_fault(mut self, id: &str) -> Fixture {
        self.episodes.set_faulted(id);
        self
    }

    /// `estimator` built from its declaration under the config of `sets`
    /// (`key=value`). Its build reads no table: the rewards it is given are
    /// the steps table, and opening another input is refused.
    pub fn build(&self, estimator: &'static Estimator, sets: &[&str]) -> Result<Box<dyn Estimate>> {
        let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        sets.push(format!("estimator={}", estimator.name));
        let config = load_config::<Config>(None, &sets)?.config;
        (estimator.build)(&Build {
            config: &config,
            estimator,
            policy: None,
            rewards: &self.steps,
            input: &|table| {
                Err(Error::Usage(format!(
                    "no {} table in a fixture",
                    table.as_str()
                )))
            },
        })
    }

    /// Every group kept and owned.
    pub fn all_groups(&self) -> Groups {
        let n = self.episodes.group_ids.len();
        Groups {
            kept: vec![true; n],
            owned: vec![true; n],
        }
    }

    /// Runs `estimator` over the steps in record batches of `batch_rows`;
    /// returns the advantages rows (sorted by trajectory and step), the
    /// statistics of what was written and what the estimator reported.
    pub fn run(
        &self,
        estimator: &dyn Estimate,
        groups: &Groups,
        batch_rows: usize,
    ) -> Result<(Vec<AdvantageRow>, AdvantageStats, Reported)> {
        let out = tempfile::tempdir_in(self.dir.path()).expect("an output directory");
        let writer = TableWriter::create(
            out.path(),
            TableName::Advantages,
            WriteOptions::default(),
            false,
        )?;
        let mut sink = AdvantagesOut::new(writer, 0, self.holes.clone());
        let input = StepsInput {
            steps: &self.steps,
            episodes: &self.episodes,
            groups,
            batch_rows,
            holes: &self.holes,
        };
        let reported = estimator.write(&input, &mut sink)?;
        let (writer, stats, _) = sink.into_parts();
        writer.finish(&producer(), &[])?;
        let table = out.path().join(TableName::Advantages.as_str());
        let mut rows: Vec<AdvantageRow> =
            TableReader::open(&table, TableName::Advantages)?.read_rows()?;
        rows.sort_by(|a, b| {
            (&a.trajectory_id, a.step_index).cmp(&(&b.trajectory_id, b.step_index))
        });
        Ok((rows, stats, reported))
    }
}

/// The rows `estimator` writes for `trajectories` and `steps` with
/// trajectory `faulted` ended by infrastructure, and the rows it writes for
/// the same input without that trajectory and its steps (groups as
/// [`Groups::select`] chooses them for a group-relative estimator or not):
/// leaving a faulted trajectory out of its group must give the same rows.
pub fn with_and_without_fault(
    trajectories: &[(&str, &str, f32, i32)],
    steps: &[StepRow],
    faulted: &str,
    estimator: &dyn Estimate,
    group_relative: bool,
) -> (Vec<AdvantageRow>, Vec<AdvantageRow>) {
    let run = |f: &Fixture| {
        let groups = Groups::select(
            &f.episodes,
            false,
            group_relative,
            embodyflow_core::cli::ShardSpec::ALL,
        );
        f.run(estimator, &groups, 3).expect("the estimator runs").0
    };
    let with = Fixture::new(trajectories, steps).with_fault(faulted);
    let others: Vec<_> = trajectories
        .iter()
        .filter(|t| t.0 != faulted)
        .copied()
        .collect();
    let their_steps: Vec<StepRow> = steps
        .iter()
        .filter(|s| s.trajectory_id != faulted)
        .cloned()
        .collect();
    let without = Fixture::new(&others, &their_steps);
    (run(&with), run(&without))
}

/// The rows as Debug text: every float in its shortest exact form (-0 and
/// 0 apart), so that equal text means bit-identical rows.
pub fn exact(rows: &[AdvantageRow]) -> String {
    format!("{rows:#?}")
}

fn producer() -> Producer {
    Producer {
        stage: "compute-advantages test".into(),
        version: "0".into(),
        config: serde_json::json!({}),
        seed: 0,
        shard: "0/1".into(),
    }
}

/// The diagnostics of a run of `estimator` over one trajectory `a` (group
/// `g`, score 1, kept and owned) that wrote rows with `stats`.
pub fn one_trajectory_run(estimator: &str, stats: &AdvantageStats) -> Diagnostics {
    let episodes = Episodes::join(
        [("a".to_string(), "g".to_string(), 1)],
        [("a".to_string(), "g".to_string(), 1.0)],
    )
    .expect("one consistent trajectory");
    let groups = Groups {
        kept: vec![true],
        owned: vec![true],
    };
    Diagnostics::new(estimator, &episodes, &groups, stats)
}
