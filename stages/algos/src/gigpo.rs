//! GiGPO: group-in-group advantages for multi-step episodes (Feng et al.
//! 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
//! arXiv:2505.10978), with the numerics of verl-agent's
//! `gigpo/core_gigpo.py` (checked case by case by `scripts/gigpo_golden.py`
//! and `tests/gigpo_golden.rs`).
//!
//! The G rollouts of one task draw form a group. Per decision step t of
//! trajectory i with per-step rewards r:
//!
//! ```text
//! R_t   = r_t + gamma R_{t+1}                        discounted step return (Eq. 5)
//! A^E_i = (S_i - mean_g S) / (std_g S + eps)         episode advantage, GRPO (Eq. 3)
//!         (mean mode: S_i - mean_g S)
//! step group = steps of group g whose anchor key is equal (Eq. 6)
//! A^S_t = (R_t - mean_s R) / (std_s R + eps)         within the step group s (Eq. 7)
//!         (mean mode: R_t - mean_s R); a step group of one: A^S = 0
//! A_t   = A^E_i + omega A^S_t                        (Eq. 8)
//! ```
//!
//! As verl-agent: std is unbiased (n - 1), eps is added to it (default
//! 1e-6); verl-agent's `mode = "mean_std_norm"` is [`StepNorm::Std`] and
//! `"mean_norm"` is [`StepNorm::Mean`], and the one mode sets both levels;
//! omega is its `step_advantage_w`. A singleton step group gets mean = its own
//! return and std = 1 there, so A^S = 0 in both modes, as here. The episode
//! level is this crate's GRPO ([`crate::grpo`]: a group of one gets mean 0
//! and std 1). verl-agent computes the episode statistics over the step rows
//! of a group (each step row carries its episode's score, so a long episode
//! weighs more; its `compute_mean_std_cross_steps = True`), which is
//! [`EpisodeStats::Steps`]; the paper's Eq. 3 and plain GRPO take one score
//! per trajectory, [`EpisodeStats::Episodes`]. Sums are taken in f64 and the
//! results rounded to f32 (verl-agent works in f32).
//!
//! ```
//! use embodyflow_algos::gigpo::{EpisodeStats, Gigpo, GigpoInput, StepNorm, gigpo};
//! // One group, two trajectories of two steps; the outcome on the last step.
//! // Both start in state "s0"; both reach "s1" at their second step.
//! let input = GigpoInput {
//!     offsets: &[0, 2, 4],
//!     episode_groups: &[0, 0],
//!     episode_scores: &[1.0, 0.0],
//!     rewards: &[0.0, 1.0, 0.0, 0.0],
//!     anchors: &["s0", "s1", "s0", "s1"],
//! };
//! let params = Gigpo { gamma: 0.5, step_weight: 1.0, norm: StepNorm::Mean,
//!                      eps: 1e-6, episode_stats: EpisodeStats::Episodes };
//! let out = gigpo(&input, params).unwrap();
//! assert_eq!(out.returns, [0.5, 1.0, 0.0, 0.0]);
//! assert_eq!(out.episode, [0.5, 0.5, -0.5, -0.5]); // 1 - 0.5, 0 - 0.5
//! assert_eq!(out.step, [0.25, 0.5, -0.25, -0.5]);  // within {0.5, 0} and {1, 0}
//! assert_eq!(out.advantages, [0.75, 1.0, -0.75, -1.0]);
//! assert_eq!(out.sizes.shared_steps, 4);
//! ```

use std::collections::HashMap;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

use crate::AlgoError;
use crate::grpo::{GroupNorm, episode_advantages, group_stats};

/// How returns are normalised within a step group (and scores within an
/// episode group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepNorm {
    /// `(x - mean) / (std + eps)`: verl-agent's `mean_std_norm`.
    #[default]
    Std,
    /// `x - mean`: verl-agent's `mean_norm`.
    Mean,
}

/// What the episode advantage's group statistics run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeStats {
    /// One score per trajectory (the paper's Eq. 3; plain GRPO).
    #[default]
    Episodes,
    /// One score per step row, each carrying its trajectory's score
    /// (verl-agent's `compute_mean_std_cross_steps = True`).
    Steps,
}

/// GiGPO's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gigpo {
    /// Discount of the step returns.
    pub gamma: f32,
    /// Weight omega of A^S (verl-agent's `step_advantage_w`).
    pub step_weight: f32,
    /// Normalisation at both levels.
    pub norm: StepNorm,
    /// Added to the standard deviations.
    pub eps: f64,
    /// What the episode statistics run over.
    pub episode_stats: EpisodeStats,
}

impl Gigpo {
    /// The episode-level GRPO normalisation these settings imply.
    pub fn group_norm(&self) -> GroupNorm {
        GroupNorm {
            norm_by_std: self.norm == StepNorm::Std,
            eps: self.eps,
        }
    }
}

/// A batch of trajectories, flattened: trajectory e's steps (in step order)
/// are `offsets[e]..offsets[e + 1]` of `rewards` and `anchors`.
#[derive(Debug, Clone, Copy)]
pub struct GigpoInput<'a, K> {
    /// Step offsets, one more than trajectories, starting at 0.
    pub offsets: &'a [usize],
    /// Dense group index of each trajectory.
    pub episode_groups: &'a [u32],
    /// Score of each trajectory.
    pub episode_scores: &'a [f32],
    /// Reward of each step.
    pub rewards: &'a [f32],
    /// Anchor key of each step (equal keys: the same state).
    pub anchors: &'a [K],
}

/// GiGPO's per-step results, in the input's step order.
#[derive(Debug, Clone, PartialEq)]
pub struct GigpoOutput {
    /// Discounted step return R_t.
    pub returns: Vec<f32>,
    /// Episode advantage A^E of the step's trajectory.
    pub episode: Vec<f32>,
    /// Step advantage A^S.
    pub step: Vec<f32>,
    /// A = A^E + omega A^S.
    pub advantages: Vec<f32>,
    /// Dense step group of each step.
    pub step_groups: Vec<u32>,
    /// The step groups' size distribution.
    pub sizes: StepGroupSizes,
}

/// Discounted returns `R_t = r_t + gamma R_{t+1}` of one trajectory's
/// per-step rewards (R after the last step = 0), accumulated in f64.
pub fn discounted_returns(rewards: &[f32], gamma: f32) -> Vec<f32> {
    let mut returns = vec![0.0; rewards.len()];
    let mut running = 0f64;
    for (t, &r) in rewards.iter().enumerate().rev() {
        running = f64::from(r) + f64::from(gamma) * running;
        returns[t] = running as f32;
    }
    returns
}

/// Dense step group of each step: steps of the same group with equal anchor
/// keys share one, numbered in order of first appearance; also returns each
/// step group's size.
pub fn step_groups<K: Hash + Eq>(groups: &[u32], anchors: &[K]) -> (Vec<u32>, Vec<usize>) {
    let mut index: HashMap<(u32, &K), u32> = HashMap::new();
    let mut sizes: Vec<usize> = Vec::new();
    let dense = groups
        .iter()
        .zip(anchors)
        .map(|(&g, key)| {
            let next = sizes.len() as u32;
            let s = *index.entry((g, key)).or_insert(next);
            if s == next {
                sizes.push(0);
            }
            sizes[s as usize] += 1;
            s
        })
        .collect();
    (dense, sizes)
}

/// A^S of every step: its return normalised within its step group
/// (`step_groups[t]`, dense); a step group of one gets 0.
pub fn step_advantages(returns: &[f32], step_groups: &[u32], norm: StepNorm, eps: f64) -> Vec<f32> {
    let stats = group_stats(returns, step_groups);
    returns
        .iter()
        .zip(step_groups)
        .map(|(&r, &s)| {
            let stat = stats[s as usize];
            if stat.count <= 1 {
                return 0.0;
            }
            let centred = f64::from(r) - stat.mean;
            (match norm {
                StepNorm::Std => centred / (stat.std + eps),
                StepNorm::Mean => centred,
            }) as f32
        })
        .collect()
}

/// `A = A^E + omega A^S`, in f64 rounded to f32 (omega = 0 gives A^E exactly).
pub fn combine(episode_adv: f32, step_adv: f32, step_weight: f32) -> f32 {
    (f64::from(episode_adv) + f64::from(step_weight) * f64::from(step_adv)) as f32
}

/// GiGPO over a batch: returns, A^E, A^S and A of every step.
pub fn gigpo<K: Hash + Eq>(
    input: &GigpoInput<'_, K>,
    params: Gigpo,
) -> Result<GigpoOutput, AlgoError> {
    let episodes = input.episode_groups.len();
    let check = |what: &'static str, expected: usize, found: usize| {
        if expected == found {
            Ok(())
        } else {
            Err(AlgoError::LengthMismatch {
                what,
                expected,
                found,
            })
        }
    };
    check("episode_scores", episodes, input.episode_scores.len())?;
    check("offsets", episodes + 1, input.offsets.len())?;
    let steps = input.rewards.len();
    check("anchors", steps, input.anchors.len())?;
    let ends_ordered = input.offsets.first() == Some(&0)
        && input.offsets.windows(2).all(|w| w[0] <= w[1])
        && input.offsets.last() == Some(&steps);
    if !ends_ordered {
        return Err(AlgoError::LengthMismatch {
            what: "offsets (last)",
            expected: steps,
            found: input.offsets.last().copied().unwrap_or(0),
        });
    }

    let mut returns = Vec::with_capacity(steps);
    let mut step_episode = Vec::with_capacity(steps);
    for (e, span) in input.offsets.windows(2).enumerate() {
        returns.extend(discounted_returns(
            &input.rewards[span[0]..span[1]],
            params.gamma,
        ));
        step_episode.extend(std::iter::repeat_n(e, span[1] - span[0]));
    }
    let step_group_of: Vec<u32> = step_episode
        .iter()
        .map(|&e| input.episode_groups[e])
        .collect();

    let episode: Vec<f32> = match params.episode_stats {
        EpisodeStats::Episodes => {
            let per_episode = episode_advantages(
                input.episode_scores,
                input.episode_groups,
                params.group_norm(),
            );
            step_episode.iter().map(|&e| per_episode[e]).collect()
        }
        EpisodeStats::Steps => {
            let scores: Vec<f32> = step_episode
                .iter()
                .map(|&e| input.episode_scores[e])
                .collect();
            episode_advantages(&scores, &step_group_of, params.group_norm())
        }
    };
    let (dense, sizes) = step_groups(&step_group_of, input.anchors);
    let step = step_advantages(&returns, &dense, params.norm, params.eps);
    let advantages = episode
        .iter()
        .zip(&step)
        .map(|(&a, &s)| combine(a, s, params.step_weight))
        .collect();
    Ok(GigpoOutput {
        returns,
        episode,
        step,
        advantages,
        step_groups: dense,
        sizes: StepGroupSizes::of(&sizes),
    })
}

/// The size distribution of step groups (diagnostics: how often states repeat).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepGroupSizes {
    /// Step groups.
    pub groups: usize,
    /// Steps in them.
    pub steps: usize,
    /// Steps in a step group of two or more (the ones with a step signal).
    pub shared_steps: usize,
    /// `(size, number of step groups of that size)`, by increasing size.
    pub histogram: Vec<(usize, usize)>,
}

impl StepGroupSizes {
    /// The distribution of `sizes` (one per step group).
    pub fn of(sizes: &[usize]) -> StepGroupSizes {
        let mut counts: HashMap<usize, usize> = HashMap::new();
        for &s in sizes {
            *counts.entry(s).or_default() += 1;
        }
        let mut histogram: Vec<(usize, usize)> = counts.into_iter().collect();
        histogram.sort_unstable();
        StepGroupSizes {
            groups: sizes.len(),
            steps: sizes.iter().sum(),
            shared_steps: sizes.iter().filter(|&&s| s >= 2).sum(),
            histogram,
        }
    }

    /// Adds another batch's distribution.
    pub fn merge(&mut self, other: &StepGroupSizes) {
        let mut counts: HashMap<usize, usize> = self.histogram.iter().copied().collect();
        for &(size, n) in &other.histogram {
            *counts.entry(size).or_default() += n;
        }
        self.histogram = counts.into_iter().collect();
        self.histogram.sort_unstable();
        self.groups += other.groups;
        self.steps += other.steps;
        self.shared_steps += other.shared_steps;
    }

    /// Share of steps in step groups of two or more (0 without steps).
    pub fn shared_fraction(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.shared_steps as f64 / self.steps as f64
        }
    }

    /// Mean step group size (0 without groups).
    pub fn mean_size(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.steps as f64 / self.groups as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(norm: StepNorm, step_weight: f32) -> Gigpo {
        Gigpo {
            gamma: 0.95,
            step_weight,
            norm,
            eps: 1e-6,
            episode_stats: EpisodeStats::Episodes,
        }
    }

    #[test]
    fn returns_discount_backwards() {
        assert_eq!(discounted_returns(&[0.0, 0.0, 1.0], 0.5), [0.25, 0.5, 1.0]);
        assert_eq!(discounted_returns(&[1.0, 2.0], 1.0), [3.0, 2.0]);
        assert!(discounted_returns(&[], 0.9).is_empty());
    }

    #[test]
    fn step_groups_split_by_group_and_key() {
        // Same key in two groups: two step groups.
        let (dense, sizes) = step_groups(&[0, 0, 1, 0, 1], &["a", "b", "a", "a", "c"]);
        assert_eq!(dense, [0, 1, 2, 0, 3]);
        assert_eq!(sizes, [2, 1, 1, 1]);
    }

    #[test]
    fn step_advantages_hand_computed() {
        // Step group 0: returns 1, 0.5, 0 (mean 0.5, unbiased std 0.5); 1: a singleton.
        let returns = [1.0, 0.5, 0.0, 7.0];
        let groups = [0, 0, 0, 1];
        let std = step_advantages(&returns, &groups, StepNorm::Std, 1e-6);
        let d = 0.5 / (0.5 + 1e-6);
        assert_eq!(std, [d as f32, 0.0, -d as f32, 0.0]);
        let mean = step_advantages(&returns, &groups, StepNorm::Mean, 1e-6);
        assert_eq!(mean, [0.5, 0.0, -0.5, 0.0]);
    }

    #[test]
    fn all_equal_returns_give_zero_step_advantage() {
        let adv = step_advantages(&[0.9, 0.9, 0.9], &[0, 0, 0], StepNorm::Std, 1e-6);
        assert_eq!(adv, [0.0, 0.0, 0.0]);
    }

    #[test]
    fn episode_statistics_over_steps_weigh_long_episodes() {
        // Trajectory a: 3 steps, score 1; b: 1 step, score 0. Over steps the
        // scores are [1, 1, 1, 0]: mean 0.75; over episodes [1, 0]: mean 0.5.
        let input = GigpoInput {
            offsets: &[0, 3, 4],
            episode_groups: &[0, 0],
            episode_scores: &[1.0, 0.0],
            rewards: &[0.0, 0.0, 1.0, 0.0],
            anchors: &[1, 2, 3, 4],
        };
        let mut p = params(StepNorm::Mean, 1.0);
        let episodes = gigpo(&input, p).unwrap();
        assert_eq!(episodes.episode, [0.5, 0.5, 0.5, -0.5]);
        p.episode_stats = EpisodeStats::Steps;
        let steps = gigpo(&input, p).unwrap();
        assert_eq!(steps.episode, [0.25, 0.25, 0.25, -0.75]);
        // Every anchor differs: no step signal, A = A^E.
        assert_eq!(steps.step, [0.0; 4]);
        assert_eq!(steps.advantages, steps.episode);
        assert_eq!(steps.sizes.shared_steps, 0);
        let expected = [0.95f64 * 0.95, 0.95, 1.0, 0.0];
        for (r, e) in steps.returns.iter().zip(expected) {
            assert!((f64::from(*r) - e).abs() < 1e-7, "{:?}", steps.returns);
        }
    }

    /// A group whose episodes all succeed has no episode signal (A^E = 0)
    /// but still a step signal: the episode that loops back to a state
    /// reaches it with a lower discounted return, so its looping decision
    /// gets a negative A^S and the direct one a positive A^S. This is what
    /// dynamic sampling's filter on equal scores drops, hence off for GiGPO
    /// by default (verl-agent's GiGPO examples do not filter).
    #[test]
    fn an_all_success_group_still_carries_a_step_signal() {
        // a: states 1 2 3, success; b: 1 5 1 2 3 (back to 1), success.
        let input = GigpoInput {
            offsets: &[0, 3, 8],
            episode_groups: &[0, 0],
            episode_scores: &[1.0, 1.0],
            rewards: &[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0],
            anchors: &[1, 2, 3, 1, 5, 1, 2, 3],
        };
        let out = gigpo(&input, params(StepNorm::Std, 1.0)).unwrap();
        assert!(out.episode.iter().all(|&a| a == 0.0), "{:?}", out.episode);
        // State 1: a's first decision (return 0.95^2) and b's second visit
        // (0.95^2) against b's first, the loop (0.95^4).
        assert!(out.step[3] < 0.0, "the loop: {:?}", out.step);
        assert!(out.step[0] > 0.0 && out.step[5] > 0.0, "{:?}", out.step);
        assert_eq!(out.step[4], 0.0, "state 5: a singleton");
        assert!(out.advantages.iter().any(|&a| a != 0.0));
    }

    #[test]
    fn bad_lengths_are_errors() {
        let input = GigpoInput {
            offsets: &[0, 2],
            episode_groups: &[0],
            episode_scores: &[1.0],
            rewards: &[0.0, 1.0, 2.0],
            anchors: &[1, 2, 3],
        };
        assert!(matches!(
            gigpo(&input, params(StepNorm::Std, 1.0)),
            Err(AlgoError::LengthMismatch { .. })
        ));
        let input = GigpoInput {
            anchors: &[1, 2],
            offsets: &[0, 3],
            ..input
        };
        assert_eq!(
            gigpo(&input, params(StepNorm::Std, 1.0)).unwrap_err(),
            AlgoError::LengthMismatch {
                what: "anchors",
                expected: 3,
                found: 2
            }
        );
    }

    #[test]
    fn sizes_summarise_and_merge() {
        let mut sizes = StepGroupSizes::of(&[1, 3, 1, 2]);
        assert_eq!(sizes.histogram, [(1, 2), (2, 1), (3, 1)]);
        assert_eq!((sizes.groups, sizes.steps, sizes.shared_steps), (4, 7, 5));
        assert!((sizes.shared_fraction() - 5.0 / 7.0).abs() < 1e-12);
        sizes.merge(&StepGroupSizes::of(&[2]));
        assert_eq!(sizes.histogram, [(1, 2), (2, 2), (3, 1)]);
        assert_eq!((sizes.groups, sizes.steps, sizes.mean_size()), (5, 9, 1.8));
        assert_eq!(StepGroupSizes::default().shared_fraction(), 0.0);
    }

    /// Random batches: `groups` groups of `g` trajectories of 1..=4 steps,
    /// anchors drawn from a few states so that some repeat.
    fn batch() -> impl Strategy<Value = (Vec<usize>, Vec<u32>, Vec<f32>, Vec<f32>, Vec<u8>)> {
        proptest::collection::vec((1usize..5, 0u32..3, -2.0f32..2.0), 1..20).prop_flat_map(|eps| {
            let steps: usize = eps.iter().map(|e| e.0).sum();
            (
                Just(eps),
                proptest::collection::vec(-1.0f32..1.0, steps),
                proptest::collection::vec(0u8..4, steps),
            )
                .prop_map(|(eps, rewards, anchors)| {
                    let mut offsets = vec![0];
                    for e in &eps {
                        offsets.push(offsets.last().unwrap() + e.0);
                    }
                    let groups = eps.iter().map(|e| e.1).collect();
                    let scores = eps.iter().map(|e| e.2).collect();
                    (offsets, groups, scores, rewards, anchors)
                })
        })
    }

    proptest! {
        #[test]
        fn step_groups_centre_their_returns_and_singletons_get_zero(
            (offsets, groups, scores, rewards, anchors) in batch()
        ) {
            let input = GigpoInput { offsets: &offsets, episode_groups: &groups,
                episode_scores: &scores, rewards: &rewards, anchors: &anchors };
            for norm in [StepNorm::Std, StepNorm::Mean] {
                let out = gigpo(&input, params(norm, 1.0)).unwrap();
                let mut sums: HashMap<u32, (f64, usize)> = HashMap::new();
                for (&s, &a) in out.step_groups.iter().zip(&out.step) {
                    let entry = sums.entry(s).or_default();
                    entry.0 += f64::from(a);
                    entry.1 += 1;
                }
                for (s, (sum, n)) in sums {
                    if n == 1 {
                        let t = out.step_groups.iter().position(|&x| x == s).unwrap();
                        prop_assert_eq!(out.step[t], 0.0);
                    } else {
                        // |A^S| <= sqrt(n - 1) in std mode: a sum of n values near 0.
                        prop_assert!(sum.abs() < 1e-4 * n as f64, "step group {} sums to {}", s, sum);
                    }
                }
                prop_assert_eq!(out.sizes.steps, rewards.len());
            }
        }

        #[test]
        fn omega_zero_is_plain_grpo_bit_for_bit(
            (offsets, groups, scores, rewards, anchors) in batch()
        ) {
            let input = GigpoInput { offsets: &offsets, episode_groups: &groups,
                episode_scores: &scores, rewards: &rewards, anchors: &anchors };
            for norm in [StepNorm::Std, StepNorm::Mean] {
                let p = params(norm, 0.0);
                let out = gigpo(&input, p).unwrap();
                let grpo = episode_advantages(&scores, &groups, p.group_norm());
                for (e, span) in offsets.windows(2).enumerate() {
                    for t in span[0]..span[1] {
                        prop_assert_eq!(out.advantages[t].to_bits(), grpo[e].to_bits());
                    }
                }
            }
        }
    }
}
