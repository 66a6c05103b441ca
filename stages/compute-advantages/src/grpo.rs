//! `estimator = "grpo"` and `"dr_grpo"` (without StepOPSD): the episode
//! advantage of each trajectory, broadcast to every response token of every
//! one of its steps. With veRL's numerics (`embodyflow_algos::grpo`, golden
//! tested against veRL's `compute_grpo_outcome_advantage`), over the
//! trajectories i of a group g:
//!
//! ```text
//! grpo:     A^E_i = (R_i - mean_g R) / (std_g R + eps)
//! dr_grpo:  A^E_i =  R_i - mean_g R
//! ```
//!
//! E.g. a group scored [1, 0, 0, 1] gives A^E = ±0.866 under grpo (unbiased
//! std 0.577) and ±0.5 under dr_grpo. Both are outcome estimators
//! ([`crate::outcome`], which streams, masks, shards and broadcasts): their
//! [`kernel`] is all that is theirs. With `rewards.token_rewards`, R_i is
//! their sum (veRL's `token_level_rewards.sum(-1)`, hole tokens included);
//! hole tokens of `steps.response_mask` get 0.
//!
//! Both read `grpo.eps` ([`crate::episodes::GRPO`]); with
//! `stepopsd.enabled` they take the step path instead ([`crate::step`]),
//! which aligns tokens with plan steps to reweight them.

use embodyflow_algos::grpo::{GroupNorm, episode_advantages};
use embodyflow_core::Result;

use crate::episodes::{self, GrpoConfig};
use crate::estimator::{Build, Estimate, Estimator, Reported, StepsInput};
use crate::outcome::{Kernel, Outcome};
use crate::output::AdvantagesOut;
use crate::step::{self, StepOpsdConfig, StepPath};

/// `estimator = "grpo"`.
pub(crate) static GRPO: Estimator = Estimator {
    name: "grpo",
    about: "GRPO: (R_i - mean_g R) / (std_g R + eps) over the group of R_i",
    sections: &[episodes::GRPO, step::STEPOPSD],
    group_relative: true,
    reads: step::stepopsd_reads,
    check: |_| Ok(()),
    build: |build| build_grpo(build, true),
};

/// `estimator = "dr_grpo"`.
pub(crate) static DR_GRPO: Estimator = Estimator {
    name: "dr_grpo",
    about: "Dr. GRPO: R_i - mean_g R",
    sections: &[episodes::GRPO, step::STEPOPSD],
    group_relative: true,
    reads: step::stepopsd_reads,
    check: |_| Ok(()),
    build: |build| build_grpo(build, false),
};

/// GRPO (`by_std`) or Dr. GRPO; the step path when StepOPSD reweights it.
fn build_grpo(build: &Build<'_>, by_std: bool) -> Result<Box<dyn Estimate>> {
    let norm = build.config.section::<GrpoConfig>("grpo").norm(by_std);
    let stepopsd: StepOpsdConfig = build.config.section("stepopsd");
    if stepopsd.enabled {
        return Ok(Box::new(StepPath::load(build, norm, None)?));
    }
    Ok(Box::new(Grpo {
        norm,
        name: build.estimator.name,
    }))
}

/// GRPO or Dr. GRPO.
pub(crate) struct Grpo {
    /// Divide by the group's standard deviation (GRPO) or not (Dr. GRPO), and its eps.
    pub norm: GroupNorm,
    /// Written into every row's `estimator`.
    pub name: &'static str,
}

impl Estimate for Grpo {
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        Outcome::new(self.name, kernel(self.norm)).write(input, out)
    }
}

/// The outcome kernel of GRPO (or Dr. GRPO): the group-normalised score.
pub(crate) fn kernel(norm: GroupNorm) -> Kernel {
    Kernel::scores(move |scores, groups| Ok(episode_advantages(scores, groups, norm)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episodes::Groups;
    use crate::testdata::{Fixture, exact, step, with_and_without_fault};
    use embodyflow_algos::grpo::episode_advantages;

    /// Two groups; trajectory `b` has two steps, `d` a step without tokens.
    fn fixture() -> Fixture {
        Fixture::new(
            &[
                ("a", "g0", 1.0, 1),
                ("b", "g0", 0.0, 2),
                ("c", "g1", 0.5, 1),
                ("d", "g1", 2.0, 1),
            ],
            &[
                step("b", 1, 2),
                step("a", 0, 4),
                step("c", 0, 3),
                step("b", 0, 5),
                step("d", 0, 0),
            ],
        )
    }

    fn grpo() -> Grpo {
        Grpo {
            norm: GroupNorm::default(),
            name: "grpo",
        }
    }

    #[test]
    fn every_token_of_a_step_gets_its_episode_advantage_whatever_the_batch() {
        let f = fixture();
        let expected =
            episode_advantages(&[1.0, 0.0, 0.5, 2.0], &[0, 0, 1, 1], GroupNorm::default());
        let (rows, stats, step) = f.run(&grpo(), &f.all_groups(), 2).unwrap();
        assert!(step.is_none());
        let keys: Vec<(&str, i32, usize)> = rows
            .iter()
            .map(|r| (r.trajectory_id.as_str(), r.step_index, r.advantages.len()))
            .collect();
        assert_eq!(
            keys,
            [
                ("a", 0, 4),
                ("b", 0, 5),
                ("b", 1, 2),
                ("c", 0, 3),
                ("d", 0, 0)
            ]
        );
        for row in &rows {
            let e = f.episodes.get(&row.trajectory_id).unwrap();
            assert_eq!(row.episode_adv, expected[e]);
            assert!(row.advantages.iter().all(|&a| a == expected[e]), "{row:?}");
            assert_eq!(row.estimator, "grpo");
            assert!(row.returns.is_none() && row.step_adv.is_none());
        }
        assert_eq!((stats.steps, stats.tokens), (5, 14));
        for batch_rows in [1, 3, 100] {
            let (again, again_stats, reported) =
                f.run(&grpo(), &f.all_groups(), batch_rows).unwrap();
            assert_eq!((again, again_stats), (rows.clone(), stats));
            assert!(reported.is_none());
        }
    }

    #[test]
    fn only_owned_groups_are_written_but_every_step_is_counted() {
        let f = fixture();
        let groups = Groups {
            kept: vec![true, true],
            owned: vec![false, true],
        };
        let (rows, stats, _) = f.run(&grpo(), &groups, 2).unwrap();
        let ids: Vec<&str> = rows.iter().map(|r| r.trajectory_id.as_str()).collect();
        assert_eq!(ids, ["c", "d"]);
        assert_eq!((stats.steps, stats.tokens), (2, 3));

        // A step missing from a group this process does not write is still bad input.
        let missing = Fixture::new(
            &[("a", "g0", 1.0, 2), ("c", "g1", 0.5, 1)],
            &[step("a", 0, 1), step("c", 0, 1)],
        );
        let groups = Groups {
            kept: vec![true, true],
            owned: vec![false, true],
        };
        let error = missing.run(&grpo(), &groups, 8).unwrap_err().to_string();
        assert!(
            error.contains("`a`: steps table has 1 steps, expected 2"),
            "{error}"
        );
    }

    #[test]
    fn token_rewards_sum_to_the_score_and_holes_get_zero() {
        // a: one step of 4 tokens, holes first, in the middle and last;
        // b: a step of 2 tokens all holes, then a step of 3 without mask.
        let mut a = step("a", 0, 4);
        a.response_mask = Some(vec![false, true, false, false]);
        let mut b0 = step("b", 0, 2);
        b0.response_mask = Some(vec![false, false]);
        let mut b1 = step("b", 1, 3);
        b1.response_mask = Some(vec![true, true, true]);
        let f = Fixture::new(&[("a", "g", 1.0, 1), ("b", "g", 0.0, 2)], &[a, b0, b1])
            // Rewards on several tokens, one on a hole (veRL sums them all).
            .with_token_rewards("a", &[0.25, 0.5, 0.0, 0.25])
            .unwrap()
            .with_token_rewards("b", &[0.5, 0.0, 0.0, -0.25, -0.25])
            .unwrap();
        assert_eq!(f.episodes.scores(), [1.0, 0.0]);
        for batch_rows in [1, 8] {
            let (rows, ..) = f.run(&grpo(), &f.all_groups(), batch_rows).unwrap();
            // Scores 1 and 0: mean 0.5, unbiased std 0.7071: A = ±0.7071.
            let a = 0.5 / 0.5f32.sqrt() / (1.0 + 1e-6 / 0.5f32.sqrt());
            let want: [(&str, Vec<f32>); 3] = [
                ("a", vec![0.0, a, 0.0, 0.0]),
                ("b", vec![0.0, 0.0]),
                ("b", vec![-a; 3]),
            ];
            for (row, (id, advantages)) in rows.iter().zip(&want) {
                assert_eq!(row.trajectory_id, *id);
                for (x, y) in row.advantages.iter().zip(advantages) {
                    assert!((x - y).abs() < 1e-6, "{row:?}");
                }
                assert_eq!(row.advantages.len(), advantages.len());
            }
        }
    }

    #[test]
    fn token_rewards_of_another_sum_or_length_and_masks_of_another_length_are_bad_input() {
        let f = fixture();
        let mut f = f;
        let error = f
            .episodes
            .set_token_rewards("a", vec![0.5, 0.25, 0.0, 0.0])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`a`: rewards.score is 1, the sum of its token_rewards is 0.75"),
            "{error}"
        );
        // Within 1e-4 relative it is the sum that counts.
        f.episodes
            .set_token_rewards("d", vec![1.0, 1.00005])
            .unwrap();
        assert!((f.episodes.list[3].score - 2.00005).abs() < 1e-6);
        // d's step has no tokens: two token rewards are one too many.
        let error = f.run(&grpo(), &f.all_groups(), 2).unwrap_err().to_string();
        assert!(
            error.contains(
                "`d`: rewards.token_rewards has 2 entries, its steps have 0 response tokens"
            ),
            "{error}"
        );
        let mut short = step("a", 0, 3);
        short.response_mask = Some(vec![true, false]);
        let f = Fixture::new(&[("a", "g", 1.0, 1)], &[short]);
        let error = f.run(&grpo(), &f.all_groups(), 2).unwrap_err().to_string();
        assert!(
            error.contains("trajectory `a` step 0: response_mask has 2 entries, expected 3"),
            "{error}"
        );
    }

    /// Group g0: `b` (two steps) ended by an infrastructure fault among
    /// three that ran; group g1 without faults.
    const FAULTED_GROUP: [(&str, &str, f32, i32); 6] = [
        ("a", "g0", 1.0, 1),
        ("b", "g0", 0.0, 2),
        ("c", "g0", 0.0, 1),
        ("d", "g0", 1.0, 1),
        ("e", "g1", 0.5, 1),
        ("f", "g1", 2.0, 1),
    ];

    fn faulted_group_steps() -> Vec<embodyflow_core::schemas::StepRow> {
        vec![
            step("b", 1, 1),
            step("a", 0, 2),
            step("b", 0, 3),
            step("c", 0, 2),
            step("d", 0, 4),
            step("e", 0, 1),
            step("f", 0, 2),
        ]
    }

    #[test]
    fn golden_a_group_with_a_faulted_member_equals_the_group_without_it() {
        let steps = faulted_group_steps();
        for norm_by_std in [true, false] {
            let estimator = Grpo {
                norm: GroupNorm {
                    norm_by_std,
                    eps: 1e-6,
                },
                name: if norm_by_std { "grpo" } else { "dr_grpo" },
            };
            let (with, without) =
                with_and_without_fault(&FAULTED_GROUP, &steps, "b", &estimator, true);
            assert_eq!(with.len(), 5, "b's two steps have no row: {with:?}");
            assert_eq!(exact(&with), exact(&without), "norm_by_std = {norm_by_std}");
            // Counted as a failure, b would move its siblings' advantages.
            let counted = Fixture::new(&FAULTED_GROUP, &steps);
            let (rows, ..) = counted.run(&estimator, &counted.all_groups(), 3).unwrap();
            assert_ne!(rows[0].episode_adv, with[0].episode_adv);
        }
    }

    #[test]
    fn a_group_that_faults_leave_with_one_trajectory_has_no_signal() {
        let trajectories = [
            ("a", "g", 1.0, 1),
            ("b", "g", 0.0, 1),
            ("c", "h", 1.0, 1),
            ("d", "h", 0.0, 1),
        ];
        let steps = [
            step("a", 0, 1),
            step("b", 0, 1),
            step("c", 0, 1),
            step("d", 0, 1),
        ];
        let (with, _) = with_and_without_fault(&trajectories, &steps, "b", &grpo(), true);
        let ids: Vec<&str> = with.iter().map(|r| r.trajectory_id.as_str()).collect();
        assert_eq!(ids, ["c", "d"], "group g is left with a alone: no row");
    }

    #[test]
    fn a_step_of_an_unknown_trajectory_is_bad_input() {
        let f = Fixture::new(&[("a", "g0", 1.0, 1)], &[step("a", 0, 1), step("z", 0, 1)]);
        let error = f.run(&grpo(), &f.all_groups(), 1).unwrap_err().to_string();
        assert!(
            error.contains("`z`, which is not in trajectories"),
            "{error}"
        );
    }
}
