//! What a run did, in one place: the statistics of the rows written
//! ([`AdvantageStats`], fed by [`crate::output::AdvantagesOut`] for every
//! estimator) and the run's [`Diagnostics`], written as `diagnostics.json`
//! (read back by the `report` tool) and as the summary's lines.
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

use embodyflow_algos::gigpo::StepGroupSizes;
use embodyflow_algos::step_adv::Distribution;
use embodyflow_core::stage::Summary;
use serde::Serialize;

use crate::episodes::{Episodes, Groups};
use crate::step::{FlipCount, StepDiagnostics};

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
    /// The step path's counts (grpo_step, StepOPSD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepDiagnostics>,
    /// GiGPO's step groups over the kept groups (whatever `--shard`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_groups: Option<StepGroupSizes>,
}

impl Diagnostics {
    /// The diagnostics of a run of `estimator` over `episodes` that wrote
    /// rows with `stats`; `step` from the step path.
    pub fn new(
        estimator: &str,
        episodes: &Episodes,
        groups: &Groups,
        stats: &AdvantageStats,
        step: Option<StepDiagnostics>,
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
            step,
            step_groups: None,
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

    /// The run's summary; `shard` is this process's `--shard`.
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
        if let Some(step) = &self.step {
            add_step_lines(&mut summary, step);
        }
        if let Some(sizes) = &self.step_groups {
            add_step_group_lines(&mut summary, sizes);
        }
        summary
    }
}

/// GiGPO: how often a group's decisions share an anchor state.
fn add_step_group_lines(summary: &mut Summary, sizes: &StepGroupSizes) {
    let histogram: Vec<String> = sizes
        .histogram
        .iter()
        .map(|(size, n)| format!("{size}: {n}"))
        .collect();
    summary
        .add(
            "step groups (GiGPO, kept groups)",
            format!(
                "{} over {} decisions, mean size {:.2}",
                sizes.groups,
                sizes.steps,
                sizes.mean_size()
            ),
        )
        .add(
            "decisions in step groups of >= 2",
            format!(
                "{} of {} ({:.1} %)",
                sizes.shared_steps,
                sizes.steps,
                100.0 * sizes.shared_fraction()
            ),
        )
        .add("step group sizes (size: count)", histogram.join(", "));
}

fn add_step_lines(summary: &mut Summary, step: &StepDiagnostics) {
    let ratio = |flips: &FlipCount| format!("{:.4} ({} tokens)", flips.ratio(), flips.tokens);
    summary
        .add(
            "responses with non-zero A^S",
            format!("{} of {}", step.responses_with_step_adv, step.responses),
        )
        .add("plan parse failures (A^S = 0)", step.parse_failures)
        .add(
            "offset fallbacks / span check failures",
            format!("{} / {}", step.offset_fallbacks, step.span_verify_failures),
        )
        .add(
            "step-count mismatches with the rule match",
            step.step_count_mismatches,
        )
        .add(
            "steps without a teacher_logp row (A^S = 0)",
            step.teacher_missing,
        )
        .add("sign-flip ratio: all", ratio(&step.sign_flips))
        .add(
            "sign-flip ratio: where A^E != 0",
            ratio(&step.sign_flips_episode_adv_nonzero),
        )
        .add(
            "sign-flip ratio: success / failure",
            format!(
                "{:.4} / {:.4}",
                step.sign_flips_success.ratio(),
                step.sign_flips_failure.ratio()
            ),
        )
        .add(
            "sign-flip ratio: rule-correct / rule-wrong",
            format!(
                "{:.4} / {:.4}",
                step.sign_flips_rule_correct.ratio(),
                step.sign_flips_rule_wrong.ratio()
            ),
        );
    if let (Some(right), Some(wrong)) = (&step.step_adv_rule_correct, &step.step_adv_rule_wrong) {
        let describe = |d: &Distribution| {
            format!(
                "{:.3} ± {:.3} (p10 {:.3}, p50 {:.3}, p90 {:.3}; {} steps)",
                d.mean, d.std, d.p10, d.p50, d.p90, d.count
            )
        };
        summary
            .add("A^S on rule-correct steps", describe(right))
            .add("A^S on rule-wrong steps", describe(wrong))
            .add(
                "AUC of A^S (correct vs wrong)",
                step.step_adv_auc
                    .map_or("n/a".into(), |a| format!("{a:.3}")),
            );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let run = Diagnostics::new("grpo", &episodes, &groups, &stats, None);
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
            Diagnostics::new("gae", &episodes, &gae, &stats, None)
                .warning()
                .is_none()
        );
    }

    #[test]
    fn summary_lists_the_step_lines_only_on_the_step_path() {
        let episodes = Episodes::join(
            [("a".to_string(), "g".to_string(), 1)],
            [("a".to_string(), "g".to_string(), 1.0)],
        )
        .unwrap();
        let groups = Groups {
            kept: vec![true],
            owned: vec![true],
        };
        let mut stats = AdvantageStats::default();
        stats.add(0.5, 4);
        let plain = Diagnostics::new("grpo", &episodes, &groups, &stats, None);
        assert_eq!((plain.steps_written, plain.tokens_written), (1, 4));
        let markdown = plain.summary("0/1").to_markdown();
        assert!(markdown.contains("compute-advantages (grpo)"), "{markdown}");
        assert!(markdown.contains("0.5000 ± 0.0000"), "{markdown}");
        assert!(!markdown.contains("sign-flip"), "{markdown}");
        assert!(!plain.to_json().contains("\"step\""));
        let step = Diagnostics::new(
            "grpo_step",
            &episodes,
            &groups,
            &stats,
            Some(StepDiagnostics::default()),
        );
        assert!(
            step.summary("0/1")
                .to_markdown()
                .contains("sign-flip ratio: all")
        );
        assert!(step.to_json().contains("\"step\""));
        let mut gigpo = Diagnostics::new("gigpo", &episodes, &groups, &stats, None);
        gigpo.step_groups = Some(StepGroupSizes::of(&[1, 2, 3]));
        let markdown = gigpo.summary("0/1").to_markdown();
        assert!(markdown.contains("5 of 6 (83.3 %)"), "{markdown}");
        assert!(markdown.contains("1: 1, 2: 1, 3: 1"), "{markdown}");
        assert!(
            markdown.contains("3 over 6 decisions, mean size 2.00"),
            "{markdown}"
        );
        assert!(gigpo.to_json().contains("\"shared_steps\": 5"));
        assert!(!markdown.contains("sign-flip"), "{markdown}");
    }
}
