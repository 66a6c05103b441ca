//! Inputs for the estimators' unit tests: episodes joined in memory, a steps
//! table written to a temporary directory in a chosen row order, and a run of
//! one estimator into a real advantages table that is read back; veRL's
//! golden cases (`tests/fixtures/verl/outcome.json`) run through the stage
//! ([`matches_verl`]).
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

/// A case of `tests/fixtures/verl/outcome.json`: veRL 0.9.1's own
/// estimator on a padded batch (`scripts/verl_golden.py --outcome`).
#[derive(serde::Deserialize)]
pub struct Golden {
    estimator: String,
    /// veRL's config keys of the case.
    pub config: serde_json::Map<String, serde_json::Value>,
    group: Vec<String>,
    response_mask: Vec<Vec<bool>>,
    token_rewards: Vec<Vec<f32>>,
    #[serde(default)]
    raises: Option<String>,
    #[serde(default)]
    advantages: Vec<Vec<f32>>,
    #[serde(default)]
    returns: Vec<Vec<f32>>,
}

/// Response tokens per step of the fixtures made from golden rows.
const STEP_TOKENS: usize = 5;

/// The golden cases of `estimator`.
fn golden(estimator: &str) -> Vec<Golden> {
    #[derive(serde::Deserialize)]
    struct File {
        verl_version: String,
        cases: Vec<Golden>,
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/verl/outcome.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let file: File = serde_json::from_str(&text).unwrap();
    assert_eq!(file.verl_version, "0.9.1");
    let cases: Vec<Golden> = file
        .cases
        .into_iter()
        .filter(|c| c.estimator == estimator)
        .collect();
    assert!(!cases.is_empty(), "no golden case of {estimator}");
    cases
}

/// Trajectory `t<row>` per golden row in its group, its response cut
/// into steps of [`STEP_TOKENS`] tokens with their masks; its token
/// rewards when one sits before its last token, else its score alone
/// (which the stage puts on the last token, as veRL's batch has it).
/// With `faulted`, one more trajectory of two steps in the first row's
/// group, ended by infrastructure.
fn golden_fixture(case: &Golden, faulted: bool) -> Fixture {
    let ids: Vec<String> = (0..case.group.len()).map(|i| format!("t{i}")).collect();
    let (mut trajectories, mut steps) = (Vec::new(), Vec::new());
    for (i, id) in ids.iter().enumerate() {
        let chunks: Vec<&[bool]> = case.response_mask[i].chunks(STEP_TOKENS).collect();
        for (s, mask) in chunks.iter().enumerate() {
            let mut row = step(id, s as i32, mask.len());
            row.response_mask = Some(mask.to_vec());
            steps.push(row);
        }
        let score = case.token_rewards[i]
            .iter()
            .map(|&r| f64::from(r))
            .sum::<f64>() as f32;
        trajectories.push((
            id.as_str(),
            case.group[i].as_str(),
            score,
            chunks.len() as i32,
        ));
    }
    if faulted {
        trajectories.push(("faulted", case.group[0].as_str(), 9.0, 2));
        steps.extend([step("faulted", 0, 3), step("faulted", 1, 2)]);
    }
    let mut f = Fixture::new(&trajectories, &steps);
    for (id, rewards) in ids.iter().zip(&case.token_rewards) {
        if rewards[..rewards.len() - 1].iter().any(|&r| r != 0.0) {
            f = f.with_token_rewards(id, rewards).unwrap();
        }
    }
    if faulted {
        f = f.with_fault("faulted");
    }
    f
}

/// Runs `estimator`, built from its declaration with the config `sets`
/// gives each case, on every golden case of its name: its rows equal
/// veRL's advantages (and returns, where it writes them) within 1e-6
/// (holes exactly 0), and equal bit for
/// bit the rows of the same batch with a faulted member and those of
/// two shards together; a case where veRL raises is bad input.
pub fn matches_verl(estimator: &'static Estimator, sets: impl Fn(&Golden) -> Vec<String>) {
    use embodyflow_core::cli::ShardSpec;
    for case in golden(estimator.name) {
        let sets = sets(&case);
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let run = |faulted: bool, shard: ShardSpec| {
            let f = golden_fixture(&case, faulted);
            let groups = Groups::select(&f.episodes, false, estimator.group_relative, shard);
            let built = f.build(estimator, &sets)?;
            f.run(built.as_ref(), &groups, 4).map(|(rows, ..)| rows)
        };
        if let Some(raises) = &case.raises {
            let error = run(false, ShardSpec::ALL).unwrap_err().to_string();
            eprintln!(
                "{}: veRL raises `{raises}`, we refuse: {error}",
                estimator.name
            );
            assert!(error.contains("group `g2` has 1"), "{error}");
            continue;
        }
        let rows = run(false, ShardSpec::ALL).unwrap();
        let steps: usize = case
            .response_mask
            .iter()
            .map(|m| m.len().div_ceil(STEP_TOKENS))
            .sum();
        assert_eq!(rows.len(), steps);
        let mut diff = 0f32;
        for row in &rows {
            let i: usize = row.trajectory_id[1..].parse().unwrap();
            let start = STEP_TOKENS * row.step_index as usize;
            let end = start + row.advantages.len();
            let mask = &case.response_mask[i][start..end];
            let ours = [Some(&row.advantages), row.returns.as_ref()];
            for (ours, theirs) in ours.into_iter().zip([&case.advantages, &case.returns]) {
                for ((&a, &b), &valid) in ours
                    .into_iter()
                    .flatten()
                    .zip(&theirs[i][start..end])
                    .zip(mask)
                {
                    diff = diff.max((a - b).abs());
                    assert!(valid || a == 0.0, "{row:?}");
                }
            }
        }
        let holes = case.response_mask.iter().flatten().filter(|&&m| !m).count();
        eprintln!(
            "{} {:?} ({holes} holes): max abs diff {diff:e} against veRL",
            estimator.name, case.config
        );
        assert!(diff <= 1e-6, "{}: {diff:e}", estimator.name);
        assert_eq!(exact(&run(true, ShardSpec::ALL).unwrap()), exact(&rows));
        let mut sharded: Vec<AdvantageRow> = (0..2)
            .flat_map(|index| run(false, ShardSpec { index, count: 2 }).unwrap())
            .collect();
        sharded.sort_by(|a, b| {
            (&a.trajectory_id, a.step_index).cmp(&(&b.trajectory_id, b.step_index))
        });
        assert_eq!(exact(&sharded), exact(&rows));
    }
}
