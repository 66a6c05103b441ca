//! What a run did, in one place: the statistics of the rows written
//! ([`AdvantageStats`], fed by [`crate::output::AdvantagesOut`] for every
//! estimator) and the run's [`Diagnostics`], written as `diagnostics.json`
//! (read back by the `report` tool) and as the summary's lines. An
//! estimator's own counts (the step path's, GiGPO's step groups) follow the
//! run's in both, written by the estimator's module
//! ([`crate::estimator::Report`] through [`Diagnostics::to_json_with`]).
//!
//! The episode advantage's mean and standard deviation are over the written
//! steps (one value per step row, in output order, accumulated in f64):
//! `mean = sum / n`, `std = sqrt(max(0, sum_sq / n - mean^2))`, n at least 1.
//!
//! ```
//! use embodyflow_compute_advantages::AdvantageStats;
//! let mut stats = AdvantageStats::default();
//! stats.add(1.0, 3); // a step of 3 tokens with A^E = 1
//! stats.add(-1.0, 2);
//! assert_eq!((stats.steps, stats.tokens), (2, 5));
//! assert_eq!((stats.mean(), stats.std()), (0.0, 1.0));
//! ```

use std::fmt::Display;

use embodyflow_core::stage::Summary;
use serde::Serialize;

use crate::episodes::{Episodes, Groups};

/// Count, tokens and the first two moments of the written rows' episode advantage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdvantageStats {
    /// Step rows written.
    pub steps: u64,
    /// Response tokens written.
    pub tokens: u64,
    sum: f64,
    sum_sq: f64,
}

impl AdvantageStats {
    /// Counts one written row: its episode advantage and token count.
    pub fn add(&mut self, episode_adv: f32, tokens: usize) {
        let a = f64::from(episode_adv);
        self.sum += a;
        self.sum_sq += a * a;
        self.tokens += tokens as u64;
        self.steps += 1;
    }

    /// Mean episode advantage (0 without rows).
    pub fn mean(&self) -> f64 {
        self.sum / self.steps.max(1) as f64
    }

    /// Standard deviation of the episode advantage (0 without rows).
    pub fn std(&self) -> f64 {
        let n = self.steps.max(1) as f64;
        (self.sum_sq / n - self.mean().powi(2)).max(0.0).sqrt()
    }
}

/// What a run did, for the summary and `diagnostics.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Diagnostics {
    /// Estimator used.
    pub estimator: String,
    /// Trajectories in the input.
    pub trajectories: usize,
    /// Groups in the input.
    pub groups: usize,
    /// Groups kept by dynamic sampling (all when it is off).
    pub kept_groups: usize,
    /// Groups dropped because every score was equal (dynamic sampling).
    pub dropped_groups: usize,
    /// Groups dropped because faults left fewer than 2 trajectories that
    /// ran (group-relative estimators).
    pub dropped_too_few_valid: usize,
    /// Trajectories ended by infrastructure: in no group's statistics, no
    /// row written.
    pub faulted_trajectories: usize,
    /// Steps written by this process.
    pub steps_written: u64,
    /// Response tokens written by this process.
    pub tokens_written: u64,
    /// Mean episode advantage over written steps.
    pub episode_adv_mean: f64,
    /// Standard deviation of the episode advantage over written steps.
    pub episode_adv_std: f64,
}

/// The run's keys followed by an estimator's own.
#[derive(Serialize)]
struct WithCounts<'a, X> {
    #[serde(flatten)]
    run: &'a Diagnostics,
    #[serde(flatten)]
    counts: &'a X,
}

impl Diagnostics {
    /// The diagnostics of a run of `estimator` over `episodes` that wrote
    /// rows with `stats`.
    pub fn new(
        estimator: &str,
        episodes: &Episodes,
        groups: &Groups,
        stats: &AdvantageStats,
    ) -> Diagnostics {
        let kept = groups.kept.iter().filter(|k| **k).count();
        let too_few = groups
            .kept
            .iter()
            .zip(episodes.too_few_valid())
            .filter(|&(&k, few)| !k && few)
            .count();
        Diagnostics {
            estimator: estimator.to_string(),
            trajectories: episodes.list.len(),
            groups: episodes.group_ids.len(),
            kept_groups: kept,
            dropped_groups: groups.kept.len() - kept - too_few,
            dropped_too_few_valid: too_few,
            faulted_trajectories: episodes.faulted(),
            steps_written: stats.steps,
            tokens_written: stats.tokens,
            episode_adv_mean: stats.mean(),
            episode_adv_std: stats.std(),
        }
    }

    /// The warning of a run that kept no group of a non-empty input (every
    /// group all-equal or left with too few trajectories by faults): no row
    /// is written, so the update has nothing to learn from.
    pub fn warning(&self) -> Option<String> {
        (self.groups > 0 && self.kept_groups == 0).then(|| {
            format!(
                "no group kept of {}: {} dropped as all-equal (filter.dynamic_sampling), {} as too few valid after faults; the update has nothing to learn from",
                self.groups, self.dropped_groups, self.dropped_too_few_valid
            )
        })
    }

    /// `diagnostics.json`: pretty JSON and a final newline.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("diagnostics serialise") + "\n"
    }

    /// `diagnostics.json` with an estimator's `counts` (a struct whose
    /// fields become keys) after the run's.
    pub fn to_json_with<X: Serialize>(&self, counts: &X) -> String {
        let both = WithCounts { run: self, counts };
        serde_json::to_string_pretty(&both).expect("diagnostics serialise") + "\n"
    }

    /// The run's summary (an estimator's own lines follow:
    /// [`crate::estimator::Report::add_lines`]); `shard` is this process's
    /// `--shard`.
    pub fn summary(&self, shard: impl Display) -> Summary {
        let mut summary = Summary::new(format!("compute-advantages ({})", self.estimator));
        summary
            .add("shard", shard)
            .add("trajectories", self.trajectories)
            .add(
                "trajectories ended by an infrastructure fault (left out)",
                self.faulted_trajectories,
            )
            .add(
                "groups (kept / dropped as all-equal / dropped as too few valid after faults)",
                format!(
                    "{} ({} / {} / {})",
                    self.groups, self.kept_groups, self.dropped_groups, self.dropped_too_few_valid
                ),
            )
            .add("steps written", self.steps_written)
            .add("tokens written", self.tokens_written)
            .add(
                "episode advantage mean ± std",
                format!("{:.4} ± {:.4}", self.episode_adv_mean, self.episode_adv_std),
            );
        if let Some(warning) = self.warning() {
            tracing::warn!("{warning}");
            summary.add("warning", warning);
        }
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::one_trajectory_run;

    #[test]
    fn stats_match_the_two_pass_moments() {
        let values = [0.5f32, -1.25, 2.0, 0.0, 0.75];
        let mut stats = AdvantageStats::default();
        for (i, &v) in values.iter().enumerate() {
            stats.add(v, i);
        }
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert_eq!(stats.steps, 5);
        assert_eq!(stats.tokens, 10);
        assert!((stats.mean() - mean).abs() < 1e-12);
        assert!((stats.std() - var.sqrt()).abs() < 1e-12);
        let empty = AdvantageStats::default();
        assert_eq!((empty.mean(), empty.std()), (0.0, 0.0));
    }

    #[test]
    fn faults_and_the_groups_they_empty_are_counted_and_an_empty_run_warns() {
        let pair = |id: &str, g: &str| (id.to_string(), g.to_string(), 1);
        let score = |id: &str, g: &str, s: f32| (id.to_string(), g.to_string(), s);
        let mut episodes = Episodes::join(
            [
                pair("a", "g"),
                pair("b", "g"),
                pair("c", "h"),
                pair("d", "h"),
            ],
            [
                score("a", "g", 1.0),
                score("b", "g", 0.0),
                score("c", "h", 1.0),
                score("d", "h", 1.0),
            ],
        )
        .unwrap();
        episodes.set_faulted("b");
        // g is left with a alone; h is all-equal.
        let groups = Groups::select(&episodes, true, true, embodyflow_core::cli::ShardSpec::ALL);
        assert_eq!(groups.kept, [false, false]);
        let stats = AdvantageStats::default();
        let run = Diagnostics::new("grpo", &episodes, &groups, &stats);
        assert_eq!(
            (
                run.faulted_trajectories,
                run.dropped_groups,
                run.dropped_too_few_valid
            ),
            (1, 1, 1)
        );
        let markdown = run.summary("0/1").to_markdown();
        assert!(
            markdown.contains("| trajectories ended by an infrastructure fault (left out) | 1 |")
                && markdown.contains("| 2 (0 / 1 / 1) |"),
            "{markdown}"
        );
        assert!(
            markdown.contains("| warning | no group kept of 2: 1 dropped as all-equal (filter.dynamic_sampling), 1 as too few valid after faults; the update has nothing to learn from |"),
            "{markdown}"
        );
        // GAE needs no siblings: g stays, without b.
        let gae = Groups::select(
            &episodes,
            false,
            false,
            embodyflow_core::cli::ShardSpec::ALL,
        );
        assert_eq!(gae.kept, [true, true]);
        assert!(gae.keeps(&episodes.list[0]) && !gae.keeps(&episodes.list[1]));
        assert!(
            Diagnostics::new("gae", &episodes, &gae, &stats)
                .warning()
                .is_none()
        );
    }

    #[test]
    fn an_estimators_counts_follow_the_runs_in_the_json() {
        let mut stats = AdvantageStats::default();
        stats.add(0.5, 4);
        let plain = one_trajectory_run("grpo", &stats);
        assert_eq!((plain.steps_written, plain.tokens_written), (1, 4));
        let markdown = plain.summary("0/1").to_markdown();
        assert!(markdown.contains("compute-advantages (grpo)"), "{markdown}");
        assert!(markdown.contains("0.5000 ± 0.0000"), "{markdown}");
        assert!(!markdown.contains("sign-flip"), "{markdown}");
        assert!(!plain.to_json().contains("\"step\""));
        // An estimator's counts follow the run's keys.
        #[derive(Serialize)]
        struct Counts {
            extra: u32,
        }
        let json = plain.to_json_with(&Counts { extra: 7 });
        assert!(
            json.ends_with("  \"episode_adv_std\": 0.0,\n  \"extra\": 7\n}\n"),
            "{json}"
        );
        assert_eq!(json.replace(",\n  \"extra\": 7", ""), plain.to_json());
    }
}
