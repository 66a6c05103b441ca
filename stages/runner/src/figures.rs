//! What the run report ([`crate::report`]) and the run log
//! ([`crate::runlog`]) read from a step's outputs: the drawn success and the
//! warnings its summary states, and means of its tables' columns computed
//! from the shard rows (read through [`embodyflow_core::dataset`]). Rows of
//! episodes that infrastructure ended (a crashed, hung or malformed
//! environment worker; `infra_fault` in trajectories and rewards, a
//! `failure_reason` in eval rows) are no outcome of the policy and are left
//! out; a mean leaves out null values, and a boolean's mean is its share of
//! true.
//!
//! ```text
//! mean(success) over eval rows whose failure_reason is null
//! groups with signal = #{ group : max(score) > min(score) } over rewards rows without infra_fault
//! ```
//!
//! Also the two helpers every chart uses ([`sanitize`], [`plot_err`]).

use std::collections::BTreeMap;
use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{EvalRow, MetricRow, RewardRow, Row, TrajectoryRow};
use embodyflow_plots::PlotError;

use crate::error::RunnerError;

/// The summary lines in which a rollout stage states the success of every
/// sample it drew: `| success rate (all drawn samples) | 0.250 (3 of 12) |`
/// for one-shot plans, `| success rate (all drawn episodes) | … |` for
/// closed-loop episodes.
const DRAWN_SUCCESS: [&str; 2] = [
    "| success rate (all drawn samples) |",
    "| success rate (all drawn episodes) |",
];

/// The successes and samples drawn of a rollout step, summed over the
/// `DRAWN_SUCCESS` lines of its summary (one per shard); `None` without a
/// line or samples.
pub(crate) fn drawn_counts(dir: &Path, stage: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(dir.join(format!("_summary.{stage}.md"))).ok()?;
    let (mut successes, mut samples) = (0u64, 0u64);
    for line in text
        .lines()
        .filter(|l| DRAWN_SUCCESS.iter().any(|label| l.starts_with(label)))
    {
        // "... | 0.250 (3 of 12) |" or "... | 0.034 (6 of 176; 0 cut at the decision limit) |"
        let counts = line.rsplit_once('(')?.1.split_once(')')?.0;
        let counts = counts.split(';').next()?;
        let (s, n) = counts.split_once(" of ")?;
        successes += s.trim().parse::<u64>().ok()?;
        samples += n.trim().parse::<u64>().ok()?;
    }
    (samples > 0).then_some((successes, samples))
}

/// The train success of a rollout step: successes over samples drawn
/// ([`drawn_counts`]). Dynamic sampling writes only the groups it keeps to
/// the trajectories table (none when every group scored the same, as when
/// the policy solves nothing), so the table's mean of `complete` is neither
/// the sampled rollouts' success nor defined then; it is the fallback for a
/// summary without the line ([`train_complete`]).
pub(crate) fn drawn_success(dir: &Path, stage: &str) -> Option<f64> {
    drawn_counts(dir, stage).map(|(successes, samples)| successes as f64 / samples as f64)
}

/// The `| warning | … |` lines of a step's summary (one per shard when the
/// runner joined shard summaries): what a stage said went wrong without
/// failing, such as dynamic sampling that dropped every draw.
pub(crate) fn step_warnings(dir: &Path, stage: &str) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(format!("_summary.{stage}.md"))) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("| warning | "))
        .map(|w| w.trim_end().trim_end_matches('|').trim_end().to_string())
        .collect()
}

/// The rows of the table in `dir`; `None` when it is absent or unreadable.
fn rows<R: Row>(dir: &Path) -> Option<Vec<R>> {
    TableReader::open(dir, R::TABLE)
        .and_then(|r| r.read_rows::<R>())
        .ok()
}

/// The mean of `values`; `None` when there are none.
pub(crate) fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0u64), |(sum, n), v| (sum + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

fn share(flags: impl Iterator<Item = bool>) -> Option<f64> {
    mean(flags.map(|b| if b { 1.0 } else { 0.0 }))
}

/// The success of an eval table (its rows without a `failure_reason`).
pub(crate) fn eval_success(dir: &Path) -> Option<f64> {
    let rows: Vec<EvalRow> = rows(dir)?;
    share(
        rows.iter()
            .filter(|r| r.failure_reason.is_none())
            .map(|r| r.success),
    )
}

/// The share of complete trajectories (rows without `infra_fault`).
pub(crate) fn train_complete(dir: &Path) -> Option<f64> {
    let rows: Vec<TrajectoryRow> = rows(dir)?;
    share(
        rows.iter()
            .filter(|r| r.infra_fault != Some(true))
            .map(|r| r.complete),
    )
}

/// The mean loss, approx KL and entropy of a metrics table (approx KL is
/// null on SFT rows); `None` when the table is unreadable.
pub(crate) fn update_means(dir: &Path) -> Option<Vec<Option<f64>>> {
    let rows: Vec<MetricRow> = rows(dir)?;
    Some(vec![
        mean(rows.iter().map(|r| f64::from(r.loss))),
        mean(rows.iter().filter_map(|r| r.approx_kl.map(f64::from))),
        mean(rows.iter().map(|r| f64::from(r.entropy))),
    ])
}

/// The rows of a rewards table that are outcomes of the policy (without
/// `infra_fault`); `None` when it is unreadable.
pub(crate) fn outcome_rewards(dir: &Path) -> Option<Vec<RewardRow>> {
    let rows: Vec<RewardRow> = rows(dir)?;
    Some(
        rows.into_iter()
            .filter(|r| r.infra_fault != Some(true))
            .collect(),
    )
}

/// The mean score of a rewards table's outcome rows.
pub(crate) fn score_mean(dir: &Path) -> Option<f64> {
    mean(outcome_rewards(dir)?.iter().map(|r| f64::from(r.score)))
}

/// The groups among `rows` whose scores are not all equal — the groups a
/// group-relative estimator (GRPO, Dr. GRPO) draws a gradient from — and
/// all the groups: `(with_signal, groups)`.
pub(crate) fn groups_with_signal(rows: &[RewardRow]) -> (u64, u64) {
    let mut groups: BTreeMap<&str, (f32, f32)> = BTreeMap::new();
    for r in rows {
        let range = groups.entry(&r.group_id).or_insert((r.score, r.score));
        *range = (range.0.min(r.score), range.1.max(r.score));
    }
    let signal = groups.values().filter(|(lo, hi)| hi > lo).count();
    (signal as u64, groups.len() as u64)
}

/// The reward function a rewards table was scored with (its first row's).
pub(crate) fn reward_fn(dir: &Path) -> Option<String> {
    let reader = TableReader::open(dir, RewardRow::TABLE).ok()?;
    let batch = reader.batches(None, 1).ok()?.next()?.ok()?;
    let rows = embodyflow_core::dataset::batch_to_rows::<RewardRow>(&batch).ok()?;
    rows.into_iter().next().map(|r| r.reward_fn)
}

/// A name as a file name's part: ASCII letters, digits, `.` and `-`, the
/// rest `_`.
pub(crate) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A chart's failure as the runner's error, naming its file.
pub(crate) fn plot_err(path: &Path) -> impl Fn(PlotError) -> RunnerError + '_ {
    move |reason| RunnerError::Plot {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Writes `rows` as the table of `R` under `root`, produced by `stage`
/// (tests that give a step's outputs by hand); returns its directory.
#[cfg(test)]
pub(crate) fn test_table<R: Row>(root: &Path, stage: &str, rows: &[R]) -> std::path::PathBuf {
    use embodyflow_core::dataset::{TableWriter, WriteOptions};
    let mut writer = TableWriter::create(root, R::TABLE, WriteOptions::default(), true).unwrap();
    writer.write_rows(rows).unwrap();
    let producer = embodyflow_core::manifest::Producer {
        stage: stage.into(),
        version: "0".into(),
        config: serde_json::json!({}),
        seed: 0,
        shard: "0/1".into(),
    };
    writer.finish(&producer, &[]).unwrap();
    root.join(R::TABLE.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::schemas::Examples;

    fn reward(group: &str, score: f32, infra_fault: Option<bool>) -> RewardRow {
        RewardRow {
            group_id: group.into(),
            trajectory_id: format!("{group}/{score}/{infra_fault:?}"),
            score,
            success: score > 0.0,
            infra_fault,
            ..RewardRow::examples()[0].clone()
        }
    }

    #[test]
    fn rewards_of_episodes_ended_by_infrastructure_are_no_outcome() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = test_table(
            tmp.path(),
            "test",
            &[
                reward("all-fail", -1.0, None),
                reward("all-fail", -1.0, Some(false)),
                reward("mixed", -1.0, None),
                reward("mixed", 1.0, None),
                reward("partial", 0.5, None),
                reward("partial", 0.7, None),
                reward("alone", 1.0, None),
                // A fault is no outcome: "faulted" has one score, no signal.
                reward("faulted", 1.0, None),
                reward("faulted", -1.0, Some(true)),
            ],
        );
        let outcomes = outcome_rewards(&dir).unwrap();
        assert_eq!(outcomes.len(), 8);
        assert_eq!(groups_with_signal(&outcomes), (2, 5));
        let mean = score_mean(&dir).unwrap();
        assert!((mean - 1.2 / 8.0).abs() < 1e-6, "{mean}");
    }

    #[test]
    fn eval_success_leaves_out_episodes_with_a_failure_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let row = |run: i32, success: bool, failure_reason: Option<&str>| EvalRow {
            run,
            success,
            failure_reason: failure_reason.map(str::to_string),
            ..EvalRow::examples()[0].clone()
        };
        let dir = test_table(
            tmp.path(),
            "test",
            &[
                row(0, true, None),
                row(1, false, None),
                row(2, false, Some("worker crashed")),
            ],
        );
        assert_eq!(eval_success(&dir), Some(0.5));
    }

    #[test]
    fn train_success_sums_the_drawn_samples_of_every_shard() {
        let tmp = tempfile::tempdir().unwrap();
        let summary = |rate: &str| {
            format!(
                "## collect-rollouts\n\n| | |\n|---|---|\n| groups written | 0 of 4 wanted (0 trajectories) |\n{} {rate} |\n",
                DRAWN_SUCCESS[0]
            )
        };
        let path = tmp.path().join("_summary.collect-rollouts.md");
        std::fs::write(&path, summary("0.000 (0 of 108)")).unwrap();
        assert_eq!(drawn_success(tmp.path(), "collect-rollouts"), Some(0.0));
        // The runner joins shard summaries into one file.
        let shards = format!(
            "<!-- shard 0/2 -->\n{}\n<!-- shard 1/2 -->\n{}",
            summary("0.250 (3 of 12)"),
            summary("0.750 (9 of 12)")
        );
        std::fs::write(&path, shards).unwrap();
        assert_eq!(drawn_success(tmp.path(), "collect-rollouts"), Some(0.5));
        assert_eq!(drawn_success(tmp.path(), "evaluate"), None);
        std::fs::write(&path, summary("0.000 (0 of 0)")).unwrap();
        assert_eq!(drawn_success(tmp.path(), "collect-rollouts"), None);
        // Closed-loop episodes: a summary whose kept groups all succeeded
        // still reports the drawn episodes' rate, not the kept table's.
        let closed_loop = format!(
            "| groups written | 1 of 8 wanted (8 trajectories) |\n{} 0.034 (6 of 176; 0 cut at the decision limit) |\n",
            DRAWN_SUCCESS[1]
        );
        std::fs::write(&path, closed_loop).unwrap();
        assert_eq!(
            drawn_success(tmp.path(), "collect-rollouts"),
            Some(6.0 / 176.0)
        );
    }

    #[test]
    fn a_steps_warnings_are_read_from_every_shards_summary() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(step_warnings(tmp.path(), "collect-rollouts").is_empty());
        let path = tmp.path().join("_summary.collect-rollouts.md");
        std::fs::write(
            &path,
            "<!-- shard 0/2 -->\n| groups written | 0 of 4 wanted |\n| warning | 0 of 4 slots filled: 9 groups dropped (all success 9) |\n<!-- shard 1/2 -->\n| warning | 1 of 4 slots filled |\n",
        )
        .unwrap();
        assert_eq!(
            step_warnings(tmp.path(), "collect-rollouts"),
            [
                "0 of 4 slots filled: 9 groups dropped (all success 9)",
                "1 of 4 slots filled"
            ]
        );
    }
}
