//! `estimator = "gigpo"`: GiGPO (Feng et al. 2025, arXiv:2505.10978) on
//! closed-loop episodes, with verl-agent's numerics
//! (`embodyflow_algos::gigpo`, golden tested against a transcription of its
//! `gigpo/core_gigpo.py`). Per decision t of trajectory i in group g:
//!
//! ```text
//! r_t   = score_i on the last decision, 0 before      (as GAE's decision level;
//!         with rewards.token_rewards: the sum of decision t's token rewards)
//! R_t   = r_t + gamma R_{t+1}
//! A^E_i = (S_i - mean_g S) / (std_g S + eps)          (norm = "mean": S_i - mean_g S)
//! A^S_t = (R_t - mean_s R) / (std_s R + eps)          s: the steps of g with t's anchor_key
//!         (norm = "mean": R_t - mean_s R; a step group of one: 0)
//! A_t   = A^E_i + omega A^S_t                          broadcast to every response token
//! ```
//!
//! E.g. gamma = 0.95, two copies of a task (scores 1 and 0) that both make
//! two decisions from the same two states: R = [0.95, 1] and [0, 0]; with
//! norm = "mean", A^E = ±0.5, A^S = ±0.475 at decision 0 and ±0.5 at
//! decision 1, so A = [0.975, 1.0] and [-0.975, -1.0].
//!
//! The rows' `episode_adv` is A^E, `step_adv` A^S per token, `returns` null.
//! Step groups need every step of a group first: pass 1 streams
//! `(trajectory_id, step_index, anchor_key)`, checks that every kept
//! trajectory has steps exactly `0..num_steps`, each with an anchor key
//! (null is bad input naming the table, column, trajectory and step: the
//! world must implement `ClosedLoopWorld::anchor_key`), and computes every
//! step's advantages (anchor keys are interned, so memory is a few words per
//! step); pass 2 streams `(trajectory_id, step_index, response_ids)` and
//! writes the owned steps. Statistics run over every kept group whatever
//! `--shard`, so shards together write the unsharded rows. The step group
//! size distribution (over the kept groups) goes to the diagnostics.

use std::collections::HashMap;

use arrow::array::{Array, Int32Array, ListArray, StringArray};
use embodyflow_algos::gigpo::{
    EpisodeStats, Gigpo as GigpoParams, GigpoInput, StepGroupSizes, StepNorm, gigpo,
};
use embodyflow_core::config::{ConfigKeys, ensure, in_range, positive};
use embodyflow_core::dataset::column;
use embodyflow_core::schemas::AdvantageRow;
use embodyflow_core::stage::Summary;
use embodyflow_core::{Error, Result, progress};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Section};
use crate::episodes::StepCounts;
use crate::estimator::{Counts, Estimate, Estimator, Reported, StepsInput};
use crate::output::AdvantagesOut;
use embodyflow_core::section::SectionConfig;

/// `estimator = "gigpo"`.
pub(crate) static GIGPO: Estimator = Estimator {
    name: "gigpo",
    about: "GiGPO: grpo plus omega times the normalised return among steps from one state",
    sections: &[Section::of::<GigpoConfig>("gigpo")],
    group_relative: true,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |build| {
        Ok(Box::new(Gigpo {
            config: build.config.section("gigpo"),
        }))
    },
};

/// `gigpo.*` settings (defaults: verl-agent's example runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GigpoConfig {
    /// gigpo: discount of the step returns.
    pub gamma: f32,
    /// gigpo: weight omega of A^S in A = A^E + omega * A^S (verl-agent's
    /// `step_advantage_w`).
    pub step_weight: f32,
    /// gigpo: std (mean-std normalisation) or mean (centring only), at both
    /// levels.
    pub norm: StepNorm,
    /// gigpo: added to the group's and the step group's standard deviation.
    pub eps: f64,
    /// gigpo: A^E's group statistics over one score per trajectory
    /// (episodes) or per step row (steps, verl-agent).
    pub episode_stats: EpisodeStats,
}

impl Default for GigpoConfig {
    fn default() -> Self {
        GigpoConfig {
            gamma: 0.95,
            step_weight: 1.0,
            norm: StepNorm::Std,
            eps: 1e-6,
            episode_stats: EpisodeStats::Episodes,
        }
    }
}

impl SectionConfig<Config> for GigpoConfig {
    /// `gigpo.gamma` in [0, 1], `gigpo.step_weight` finite and at least 0,
    /// `gigpo.eps` above 0.
    fn check(&self, _: &Config) -> Result<()> {
        in_range("gigpo.gamma", f64::from(self.gamma), 0.0, 1.0)?;
        let omega = self.step_weight;
        ensure(
            omega.is_finite() && omega >= 0.0,
            "gigpo.step_weight",
            "a finite number at least 0",
            omega,
        )?;
        positive("gigpo.eps", self.eps)
    }
}

/// GiGPO's counts: the step group sizes over the kept groups (whatever
/// `--shard`), `step_groups` in `diagnostics.json`.
#[derive(Debug, Serialize)]
pub(crate) struct StepGroupsReport {
    /// The size distribution of the step groups.
    pub step_groups: StepGroupSizes,
}

impl Counts for StepGroupsReport {
    fn lines(&self, summary: &mut Summary) {
        add_step_group_lines(summary, &self.step_groups);
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

/// GiGPO with its settings.
pub(crate) struct Gigpo {
    /// gamma, omega, norm, eps, episode statistics.
    pub config: GigpoConfig,
}

impl Gigpo {
    fn params(&self) -> GigpoParams {
        let c = &self.config;
        GigpoParams {
            gamma: c.gamma,
            step_weight: c.step_weight,
            norm: c.norm,
            eps: c.eps,
            episode_stats: c.episode_stats,
        }
    }
}

/// Every kept step's advantages, at `start[e] + step_index`.
struct Computed {
    /// First position of each kept episode (unused for the others).
    start: Vec<usize>,
    episode: Vec<f32>,
    step: Vec<f32>,
    advantages: Vec<f32>,
}

impl Estimate for Gigpo {
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        let (computed, sizes) = self.compute(input)?;
        let (episodes, groups) = (input.episodes, input.groups);
        input.for_each_batch("gigpo advantages", |batch| {
            let ids = column::<StringArray>(batch, "trajectory_id");
            let index = column::<Int32Array>(batch, "step_index");
            let responses = column::<ListArray>(batch, "response_ids");
            let mut rows = Vec::new();
            for i in 0..batch.num_rows() {
                let e = episodes.of_step(ids.value(i))?;
                if !groups.owns(&episodes.list[e]) {
                    continue;
                }
                let at = computed.start[e] + index.value(i) as usize;
                let tokens = responses.value_length(i) as usize;
                rows.push(AdvantageRow {
                    trajectory_id: ids.value(i).to_string(),
                    step_index: index.value(i),
                    advantages: vec![computed.advantages[at]; tokens],
                    returns: None,
                    episode_adv: computed.episode[at],
                    step_adv: Some(vec![computed.step[at]; tokens]),
                    estimator: GIGPO.name.to_string(),
                });
            }
            out.write_rows(&rows)
        })?;
        Ok(Some(Box::new(StepGroupsReport { step_groups: sizes })))
    }
}

impl Gigpo {
    /// Pass 1: reads every kept step's anchor key, checks the steps, and
    /// computes the advantages of every kept step.
    fn compute(&self, input: &StepsInput<'_>) -> Result<(Computed, StepGroupSizes)> {
        let (episodes, groups) = (input.episodes, input.groups);
        let mut anchor_ids: HashMap<String, u32> = HashMap::new();
        // Per kept episode: (step_index, interned anchor key, response tokens).
        let mut seen: Vec<Vec<(i32, u32, usize)>> = vec![Vec::new(); episodes.list.len()];
        let mut counts = StepCounts::new(episodes);
        // Token rewards are summed per step: their steps' token counts.
        let token_rewards = episodes.has_token_rewards();
        let mut columns = vec!["trajectory_id", "step_index", "anchor_key"];
        if token_rewards {
            columns.push("response_ids");
        }
        let bar = progress::bar(input.steps.num_rows(), "gigpo step groups");
        for batch in input.steps.batches(Some(&columns), input.batch_rows)? {
            let batch = batch?;
            bar.inc(batch.num_rows() as u64);
            let ids = column::<StringArray>(&batch, "trajectory_id");
            let index = column::<Int32Array>(&batch, "step_index");
            let anchors = column::<StringArray>(&batch, "anchor_key");
            let responses = token_rewards.then(|| column::<ListArray>(&batch, "response_ids"));
            let located = counts.locate(ids)?;
            if let Some(responses) = responses {
                counts.count_tokens(&located, responses);
            }
            for (i, &e) in located.iter().enumerate() {
                if !groups.keeps(&episodes.list[e]) {
                    continue;
                }
                if anchors.is_null(i) {
                    return Err(Error::BadInput(format!(
                        "steps table, trajectory `{}` step {}: `anchor_key` is null; estimator = gigpo groups decisions by their anchor state (the world's ClosedLoopWorld::anchor_key must give one; one-shot plans have none: use grpo_step)",
                        ids.value(i),
                        index.value(i)
                    )));
                }
                let next = anchor_ids.len() as u32;
                let key = match anchor_ids.get(anchors.value(i)) {
                    Some(&k) => k,
                    None => {
                        anchor_ids.insert(anchors.value(i).to_string(), next);
                        next
                    }
                };
                let tokens = responses.map_or(0, |r| r.value_length(i) as usize);
                seen[e].push((index.value(i), key, tokens));
            }
        }
        bar.finish_and_clear();
        counts.check()?;

        let mut start = vec![0; episodes.list.len()];
        let mut offsets = vec![0];
        let (mut kept_groups, mut scores, mut rewards, mut anchors) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (e, episode) in episodes.list.iter().enumerate() {
            if !groups.keeps(episode) {
                continue;
            }
            let steps = &mut seen[e];
            steps.sort_unstable_by_key(|s| s.0);
            if !steps.iter().map(|s| s.0).eq(0..episode.num_steps) {
                let found: Vec<i32> = steps.iter().map(|s| s.0).collect();
                return Err(Error::BadInput(format!(
                    "trajectory `{}`: steps table has step indices {found:?}, expected 0..{} (num_steps)",
                    episode.trajectory_id, episode.num_steps
                )));
            }
            start[e] = rewards.len();
            kept_groups.push(episode.group);
            scores.push(episode.score);
            anchors.extend(steps.iter().map(|s| s.1));
            // The outcome on the last decision, or each decision's token rewards summed.
            let tokens: Vec<usize> = steps.iter().map(|s| s.2).collect();
            rewards.extend(episode.step_rewards(&tokens)?);
            offsets.push(rewards.len());
        }
        let out = gigpo(
            &GigpoInput {
                offsets: &offsets,
                episode_groups: &kept_groups,
                episode_scores: &scores,
                rewards: &rewards,
                anchors: &anchors,
            },
            self.params(),
        )
        .map_err(|err| Error::BadInput(format!("gigpo: {err}")))?;
        Ok((
            Computed {
                start,
                episode: out.episode,
                step: out.step,
                advantages: out.advantages,
            },
            out.sizes,
        ))
    }
}

#[cfg(test)]
mod tests {
    use embodyflow_algos::gigpo::{EpisodeStats, StepNorm};

    use super::*;
    use crate::diagnostics::AdvantageStats;
    use crate::episodes::Groups;
    use crate::estimator::Report;
    use crate::testdata::{Fixture, exact, one_trajectory_run, step, with_and_without_fault};

    /// The step group sizes GiGPO reported.
    fn step_groups(reported: Reported) -> StepGroupSizes {
        let report = reported.expect("gigpo reports its step groups");
        let report: &dyn Report = &*report;
        let report: &dyn std::any::Any = report;
        let report = report
            .downcast_ref::<StepGroupsReport>()
            .expect("a step group report");
        report.step_groups.clone()
    }

    #[test]
    fn the_step_groups_follow_the_runs_keys_and_lines() {
        let run = one_trajectory_run("gigpo", &AdvantageStats::default());
        let report = StepGroupsReport {
            step_groups: StepGroupSizes::of(&[1, 2, 3]),
        };
        let mut summary = run.summary("0/1");
        report.add_lines(&mut summary);
        let markdown = summary.to_markdown();
        assert!(markdown.contains("5 of 6 (83.3 %)"), "{markdown}");
        assert!(markdown.contains("1: 1, 2: 1, 3: 1"), "{markdown}");
        assert!(
            markdown.contains("3 over 6 decisions, mean size 2.00"),
            "{markdown}"
        );
        assert!(!markdown.contains("sign-flip"), "{markdown}");
        let json = report.to_json(&run);
        assert!(json.contains("\"shared_steps\": 5"), "{json}");
        assert!(
            json.starts_with(run.to_json().trim_end_matches("\n}\n")),
            "{json}"
        );
    }

    fn anchored(
        id: &str,
        index: i32,
        tokens: usize,
        key: Option<&str>,
    ) -> embodyflow_core::schemas::StepRow {
        let mut row = step(id, index, tokens);
        row.anchor_key = key.map(str::to_string);
        row
    }

    fn estimator(norm: StepNorm, step_weight: f32) -> Gigpo {
        Gigpo {
            config: GigpoConfig {
                gamma: 0.95,
                step_weight,
                norm,
                eps: 1e-6,
                episode_stats: EpisodeStats::Episodes,
            },
        }
    }

    /// Group g: `a` (score 1) and `b` (score 0) both decide from states s0
    /// then s1; `c` (score 1) from s0 then s2, written out of order. Group
    /// h: `d` alone (score 2, one decision).
    fn fixture() -> Fixture {
        Fixture::new(
            &[
                ("a", "g", 1.0, 2),
                ("b", "g", 0.0, 2),
                ("c", "g", 1.0, 2),
                ("d", "h", 2.0, 1),
            ],
            &[
                anchored("c", 1, 1, Some("s2")),
                anchored("a", 0, 3, Some("s0")),
                anchored("a", 1, 2, Some("s1")),
                anchored("b", 0, 1, Some("s0")),
                anchored("b", 1, 4, Some("s1")),
                anchored("c", 0, 2, Some("s0")),
                anchored("d", 0, 2, Some("s0")),
            ],
        )
    }

    #[test]
    fn golden_a_group_with_a_faulted_member_equals_the_group_without_it() {
        // Group g: a (1), b (0) and c (1) as in `fixture`, and e (0), ended by
        // a fault after deciding from s0 and s1 (it would join both step groups).
        let trajectories = [
            ("a", "g", 1.0, 2),
            ("b", "g", 0.0, 2),
            ("e", "g", 0.0, 2),
            ("c", "g", 1.0, 2),
            ("d", "h", 2.0, 1),
        ];
        let steps = [
            anchored("c", 1, 1, Some("s2")),
            anchored("e", 1, 2, Some("s1")),
            anchored("a", 0, 3, Some("s0")),
            anchored("a", 1, 2, Some("s1")),
            anchored("e", 0, 1, Some("s0")),
            anchored("b", 0, 1, Some("s0")),
            anchored("b", 1, 4, Some("s1")),
            anchored("c", 0, 2, Some("s0")),
            anchored("d", 0, 2, Some("s0")),
        ];
        for (norm, weight) in [(StepNorm::Mean, 1.0), (StepNorm::Std, 0.5)] {
            let estimator = estimator(norm, weight);
            let (with, without) =
                with_and_without_fault(&trajectories, &steps, "e", &estimator, true);
            assert_eq!(with.len(), 7, "e's steps have no row");
            assert_eq!(exact(&with), exact(&without), "{norm:?}");
        }
    }

    fn close(a: f32, b: f64) -> bool {
        (f64::from(a) - b).abs() < 1e-6
    }

    #[test]
    fn hand_computed_mean_norm() {
        let f = fixture();
        let (rows, stats, reported) = f
            .run(&estimator(StepNorm::Mean, 1.0), &f.all_groups(), 2)
            .unwrap();
        // A^E: group g scores [1, 0, 1], mean 2/3; d alone: mean 0 -> 2.
        // Returns: a [0.95, 1], b [0, 0], c [0.95, 1].
        // s0 in g: {0.95, 0, 0.95}, mean 0.6333: a, c +0.31667, b -0.63333.
        // s1 in g: {1, 0}, mean 0.5: a +0.5, b -0.5. s2 and d's s0: singletons -> 0.
        let m0 = 1.9 / 3.0;
        let expected: [(&str, i32, usize, f64, f64); 7] = [
            ("a", 0, 3, 1.0 / 3.0, 0.95 - m0),
            ("a", 1, 2, 1.0 / 3.0, 0.5),
            ("b", 0, 1, -2.0 / 3.0, -m0),
            ("b", 1, 4, -2.0 / 3.0, -0.5),
            ("c", 0, 2, 1.0 / 3.0, 0.95 - m0),
            ("c", 1, 1, 1.0 / 3.0, 0.0),
            ("d", 0, 2, 2.0, 0.0),
        ];
        assert_eq!(rows.len(), 7);
        for (row, (id, index, tokens, ae, as_)) in rows.iter().zip(expected) {
            assert_eq!((row.trajectory_id.as_str(), row.step_index), (id, index));
            assert_eq!(row.advantages.len(), tokens, "{row:?}");
            assert!(close(row.episode_adv, ae), "{row:?}");
            let step_adv = row.step_adv.as_ref().unwrap();
            assert!(step_adv.iter().all(|&s| close(s, as_)), "{row:?}");
            assert!(
                row.advantages.iter().all(|&a| close(a, ae + as_)),
                "{row:?}"
            );
            assert_eq!(row.estimator, "gigpo");
            assert!(row.returns.is_none());
        }
        assert_eq!((stats.steps, stats.tokens), (7, 15));
        let sizes = step_groups(reported);
        // Step groups: g/s0 (3), g/s1 (2), g/s2 (1), h/s0 (1).
        assert_eq!(sizes.histogram, [(1, 2), (2, 1), (3, 1)]);
        assert_eq!((sizes.steps, sizes.shared_steps), (7, 5));
        // Whatever the batch size, the same rows.
        for batch_rows in [1, 3, 100] {
            let (again, _, _) = f
                .run(&estimator(StepNorm::Mean, 1.0), &f.all_groups(), batch_rows)
                .unwrap();
            assert_eq!(again, rows);
        }
    }

    #[test]
    fn token_rewards_summed_per_decision_are_the_step_rewards() {
        // a's score 1 as token rewards 0.5 on its first token (decision 0,
        // 3 tokens) and 0.5 on its last (decision 1, 2 tokens): r = [0.5, 0.5].
        // Returns: a [0.5 + 0.95 * 0.5, 0.5] = [0.975, 0.5], b [0, 0], c [0.95, 1].
        // s0 in g: {0.975, 0, 0.95}, mean 0.641667; s1 in g: {0.5, 0}, mean 0.25.
        // A^E as before (scores 1, 0, 1 and 2): 1/3, -2/3, 1/3, 2.
        let f = fixture()
            .with_token_rewards("a", &[0.5, 0.0, 0.0, 0.0, 0.5])
            .unwrap();
        let (rows, ..) = f
            .run(&estimator(StepNorm::Mean, 1.0), &f.all_groups(), 2)
            .unwrap();
        let m0 = 1.925 / 3.0;
        let expected: [(&str, i32, f64, f64); 7] = [
            ("a", 0, 1.0 / 3.0, 0.975 - m0),
            ("a", 1, 1.0 / 3.0, 0.25),
            ("b", 0, -2.0 / 3.0, -m0),
            ("b", 1, -2.0 / 3.0, -0.25),
            ("c", 0, 1.0 / 3.0, 0.95 - m0),
            ("c", 1, 1.0 / 3.0, 0.0),
            ("d", 0, 2.0, 0.0),
        ];
        for (row, (id, index, ae, as_)) in rows.iter().zip(expected) {
            assert_eq!((row.trajectory_id.as_str(), row.step_index), (id, index));
            assert!(close(row.episode_adv, ae), "{row:?}");
            assert!(
                row.advantages.iter().all(|&a| close(a, ae + as_)),
                "{row:?}"
            );
        }
        // Five token rewards for a's five tokens; four are bad input.
        let error = fixture()
            .with_token_rewards("a", &[0.5, 0.0, 0.0, 0.5])
            .unwrap()
            .run(&estimator(StepNorm::Mean, 1.0), &fixture().all_groups(), 2)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(
                "`a`: rewards.token_rewards has 4 entries, its steps have 5 response tokens"
            ),
            "{error}"
        );
    }

    #[test]
    fn hand_computed_std_norm_and_omega() {
        let f = fixture();
        let (rows, _, _) = f
            .run(&estimator(StepNorm::Std, 0.5), &f.all_groups(), 4)
            .unwrap();
        // s1 in g: returns {1, 0}: unbiased std sqrt(0.5); a: 0.5 / (0.70711 + 1e-6).
        let a1 = &rows[1];
        let step = 0.5 / (0.5f64.sqrt() + 1e-6);
        // Group g scores [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3).
        let episode = (1.0 / 3.0) / ((1.0f64 / 3.0).sqrt() + 1e-6);
        assert!(close(a1.episode_adv, episode), "{a1:?}");
        assert!(close(a1.step_adv.as_ref().unwrap()[0], step), "{a1:?}");
        assert!(close(a1.advantages[0], episode + 0.5 * step), "{a1:?}");
        // d, alone in its group: R / (1 + eps), and A^S = 0.
        assert!(close(rows[6].episode_adv, 2.0 / (1.0 + 1e-6)));
        assert_eq!(rows[6].step_adv.as_ref().unwrap(), &[0.0, 0.0]);
    }

    #[test]
    fn shards_write_their_groups_with_the_statistics_of_all() {
        let f = fixture();
        let all = f
            .run(&estimator(StepNorm::Std, 1.0), &f.all_groups(), 2)
            .unwrap()
            .0;
        let groups = Groups {
            kept: vec![true, true],
            owned: vec![true, false],
        };
        let part = f.run(&estimator(StepNorm::Std, 1.0), &groups, 2).unwrap().0;
        assert_eq!(part, all[..6]);
    }

    #[test]
    fn a_null_anchor_key_and_bad_steps_are_bad_input() {
        let f = Fixture::new(
            &[("a", "g", 1.0, 2)],
            &[anchored("a", 0, 1, Some("s0")), anchored("a", 1, 1, None)],
        );
        let error = f
            .run(&estimator(StepNorm::Std, 1.0), &f.all_groups(), 8)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("steps table, trajectory `a` step 1: `anchor_key` is null"),
            "{error}"
        );
        let duplicated = Fixture::new(
            &[("a", "g", 1.0, 2)],
            &[
                anchored("a", 0, 1, Some("s0")),
                anchored("a", 0, 1, Some("s1")),
            ],
        );
        let error = duplicated
            .run(&estimator(StepNorm::Std, 1.0), &duplicated.all_groups(), 8)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("step indices [0, 0], expected 0..2"),
            "{error}"
        );
        let missing = Fixture::new(&[("a", "g", 1.0, 2)], &[anchored("a", 0, 1, Some("s0"))]);
        let error = missing
            .run(&estimator(StepNorm::Std, 1.0), &missing.all_groups(), 8)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`a`: steps table has 1 steps, expected 2"),
            "{error}"
        );
    }
}
