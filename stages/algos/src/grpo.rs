//! Episode advantages normalised within groups: GRPO and Dr. GRPO.
//!
//! For trajectory i in group g (the G rollouts of one task draw) with score
//! R_i:
//!
//! ```text
//! GRPO:     A^E_i = (R_i - mean_g R) / (std_g R + eps)
//! Dr. GRPO: A^E_i =  R_i - mean_g R                      (norm_by_std = false)
//! ```
//!
//! with veRL's numerics (`verl/trainer/ppo/core_algos.py`,
//! `compute_grpo_outcome_advantage`): the standard deviation is unbiased
//! (n - 1), `eps = 1e-6` is added to it (not under a square root), and a group
//! of one gets mean 0 and std 1, so its advantage is R / (1 + eps), not 0.
//! Sums are taken in f64 and the result rounded to f32.
//!
//! ```
//! use embodyflow_algos::grpo::{episode_advantages, GroupNorm};
//! let scores = [1.0, 0.0, 0.0, 1.0, 5.0];
//! let groups = [0, 0, 0, 0, 1];
//! let adv = episode_advantages(&scores, &groups, GroupNorm::default());
//! assert!((adv[0] - 0.866_025).abs() < 1e-5);     // (1 - 0.5) / (0.57735 + 1e-6)
//! assert!((adv[4] - 5.0 / (1.0 + 1e-6)).abs() < 1e-6); // a group of one
//! ```

/// How scores are normalised within a group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupNorm {
    /// Divide by the group's standard deviation (GRPO) or not (Dr. GRPO).
    pub norm_by_std: bool,
    /// Added to the standard deviation.
    pub eps: f64,
}

impl Default for GroupNorm {
    fn default() -> Self {
        GroupNorm {
            norm_by_std: true,
            eps: 1e-6,
        }
    }
}

/// Per-group mean and the divisor applied to centred scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupStats {
    /// Rollouts in the group.
    pub count: usize,
    /// Mean score (0 for a group of one).
    pub mean: f64,
    /// Unbiased standard deviation (1 for a group of one).
    pub std: f64,
}

/// Statistics of every group; `groups[i]` is the dense group index of score i.
pub fn group_stats(scores: &[f32], groups: &[u32]) -> Vec<GroupStats> {
    assert_eq!(scores.len(), groups.len(), "one group index per score");
    let num_groups = groups.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
    let mut count = vec![0usize; num_groups];
    let mut sum = vec![0f64; num_groups];
    for (&s, &g) in scores.iter().zip(groups) {
        count[g as usize] += 1;
        sum[g as usize] += f64::from(s);
    }
    let mean: Vec<f64> = sum
        .iter()
        .zip(&count)
        .map(|(&s, &n)| if n > 0 { s / n as f64 } else { 0.0 })
        .collect();
    let mut squares = vec![0f64; num_groups];
    for (&s, &g) in scores.iter().zip(groups) {
        let d = f64::from(s) - mean[g as usize];
        squares[g as usize] += d * d;
    }
    (0..num_groups)
        .map(|g| {
            if count[g] <= 1 {
                GroupStats {
                    count: count[g],
                    mean: 0.0,
                    std: 1.0,
                }
            } else {
                GroupStats {
                    count: count[g],
                    mean: mean[g],
                    std: (squares[g] / (count[g] - 1) as f64).sqrt(),
                }
            }
        })
        .collect()
}

/// Episode advantage of every trajectory.
pub fn episode_advantages(scores: &[f32], groups: &[u32], norm: GroupNorm) -> Vec<f32> {
    let stats = group_stats(scores, groups);
    scores
        .iter()
        .zip(groups)
        .map(|(&s, &g)| {
            let stat = stats[g as usize];
            let centred = f64::from(s) - stat.mean;
            (if norm.norm_by_std {
                centred / (stat.std + norm.eps)
            } else {
                centred
            }) as f32
        })
        .collect()
}

/// Whether a group is kept by dynamic sampling: its scores are not all equal
/// (all-success and all-failure groups carry no GRPO signal).
pub fn is_mixed(scores: impl IntoIterator<Item = f32>) -> bool {
    let mut iter = scores.into_iter();
    match iter.next() {
        None => false,
        Some(first) => iter.any(|s| s != first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hand_computed_group_of_four() {
        // scores 1, 0, 0, 1: mean 0.5, unbiased var = (4 * 0.25) / 3, std = 0.577350269
        let adv = episode_advantages(&[1.0, 0.0, 0.0, 1.0], &[0, 0, 0, 0], GroupNorm::default());
        let expected = 0.5 / (0.577_350_269_189_625_8 + 1e-6);
        for (a, sign) in adv.iter().zip([1.0, -1.0, -1.0, 1.0]) {
            assert!((f64::from(*a) - sign * expected).abs() < 1e-6, "{adv:?}");
        }
    }

    #[test]
    fn dr_grpo_only_centres() {
        let adv = episode_advantages(
            &[3.0, 1.0, 2.0],
            &[0, 0, 0],
            GroupNorm {
                norm_by_std: false,
                eps: 1e-6,
            },
        );
        assert_eq!(adv, vec![1.0, -1.0, 0.0]);
    }

    #[test]
    fn a_group_of_one_keeps_its_score() {
        let adv = episode_advantages(&[2.0], &[0], GroupNorm::default());
        assert_eq!(adv[0], (2.0f64 / (1.0 + 1e-6)) as f32);
    }

    #[test]
    fn an_all_equal_group_gets_zero() {
        let adv = episode_advantages(&[1.0, 1.0, 1.0], &[0, 0, 0], GroupNorm::default());
        assert_eq!(adv, vec![0.0, 0.0, 0.0]);
        assert!(!is_mixed([1.0, 1.0]) && is_mixed([1.0, 0.0]) && !is_mixed([]));
    }

    proptest! {
        #[test]
        fn advantages_sum_to_zero_in_every_group_larger_than_one(
            scores in proptest::collection::vec(-5.0f32..5.0, 2..40), groups in 1u32..5
        ) {
            let index: Vec<u32> = (0..scores.len() as u32).map(|i| i % groups).collect();
            let adv = episode_advantages(&scores, &index, GroupNorm::default());
            for g in 0..groups {
                let members: Vec<f32> = adv.iter().zip(&index).filter(|(_, i)| **i == g).map(|(a, _)| *a).collect();
                if members.len() > 1 {
                    let sum: f32 = members.iter().sum();
                    prop_assert!(sum.abs() < 1e-4 * members.len() as f32, "sum {sum}");
                }
            }
        }

        #[test]
        fn order_within_the_batch_does_not_matter(scores in proptest::collection::vec(-5.0f32..5.0, 1..30)) {
            let groups: Vec<u32> = (0..scores.len() as u32).map(|i| i % 3).collect();
            let adv = episode_advantages(&scores, &groups, GroupNorm::default());
            let rev_scores: Vec<f32> = scores.iter().rev().copied().collect();
            let rev_groups: Vec<u32> = groups.iter().rev().copied().collect();
            let mut rev = episode_advantages(&rev_scores, &rev_groups, GroupNorm::default());
            rev.reverse();
            for (a, b) in adv.iter().zip(&rev) {
                prop_assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}
