//! veRL's outcome estimators beside GRPO: one advantage per trajectory from
//! the scores of its group (OPO and REINFORCE++-baseline also from each
//! trajectory's valid response tokens), each veRL 0.9.1's function of
//! `verl/trainer/ppo/core_algos.py` case by case. For trajectory i of a
//! group g of n trajectories, with score R_i (the sum of its token rewards)
//! and L_i valid (unmasked) response tokens:
//!
//! ```text
//! rloo:       A_i = n / (n - 1) (R_i - mean_g R)      the mean of the others as baseline
//!             (Ahmadian et al. 2024, arXiv:2402.14740; compute_rloo_outcome_advantage)
//! opo:        A_i = R_i - sum_g(L R) / sum_g L        length-weighted baseline
//!             (Hao et al. 2025, arXiv:2505.23585; compute_opo_outcome_advantage)
//! gpg:        A_i = alpha (R_i - mean_g R),  alpha = N / max(1, #{j : R_j != 0}) over the batch's N
//!             (Chu et al. 2025, arXiv:2504.02546; compute_gpg_outcome_advantage, f_norm = 1)
//! grpo_passk: A_i = (R_max - R_2nd) / (std_g R + eps) for the group's best, 0 for the others
//!             (Chen et al. 2025, arXiv:2503.19595; compute_grpo_passk_outcome_advantage;
//!             without the division when norm_by_std is false)
//! reinforce_plus_plus_baseline:
//!             A_i = R_i - mean_g R, whitened over every valid token of the batch
//!             (Hu 2025, arXiv:2501.03262; compute_reinforce_plus_plus_baseline_outcome_advantage)
//! ```
//!
//! A group of one has baseline 0 (mean 0 in veRL), so its advantage is R_i
//! (times alpha under GPG), except under pass@k, which needs two
//! trajectories per group and refuses a group of one as veRL raises
//! ([`AlgoError::GroupTooSmall`]). Ties for the best score under pass@k give
//! R_max - R_2nd = 0, so which of them is "the best" never matters. OPO's
//! baseline over a group whose trajectories have no valid token at all is 0
//! (veRL divides 0 by 0 there; every token of such a group is masked).
//! REINFORCE++-baseline whitens as [`crate::gae`]'s [`WhitenStats`]: each
//! trajectory's advantage counted once per valid token, veRL's
//! `masked_whiten` (fewer than two valid tokens in the batch is an error).
//! The token-level REINFORCE++ is GAE without a critic (V = 0, lambda = 1):
//! [`crate::gae`]. Sums are taken in f64 and the results rounded to f32.
//!
//! ```
//! use embodyflow_algos::outcome::{gpg, rloo};
//! let scores = [1.0, 0.0, 0.0, 1.0, 5.0];
//! let groups = [0, 0, 0, 0, 1];
//! let a = rloo(&scores, &groups);
//! assert!((a[0] - 2.0 / 3.0).abs() < 1e-6); // 1 - mean(0, 0, 1)
//! assert_eq!(a[4], 5.0); // a group of one keeps its score
//! // Three of five scores are non-zero: alpha = 5 / 3.
//! assert!((gpg(&scores, &groups)[0] - 5.0 / 3.0 * 0.5).abs() < 1e-6);
//! ```

use crate::AlgoError;
use crate::gae::WhitenStats;
use crate::grpo::{GroupNorm, group_stats};

/// Per group: its members' indices, in input order.
fn members(groups: &[u32]) -> Vec<Vec<usize>> {
    let count = groups.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
    let mut members = vec![Vec::new(); count];
    for (i, &g) in groups.iter().enumerate() {
        members[g as usize].push(i);
    }
    members
}

/// The group mean of every score's group, veRL's `id2mean`: 0 for a group
/// of one.
fn baselines(scores: &[f32], groups: &[u32]) -> Vec<f64> {
    let stats = group_stats(scores, groups);
    groups.iter().map(|&g| stats[g as usize].mean).collect()
}

/// RLOO: `n / (n - 1) (R_i - mean_g R)`, the score less the mean of the
/// group's other scores; `R_i` in a group of one. `groups[i]` is the dense
/// group index of score i.
pub fn rloo(scores: &[f32], groups: &[u32]) -> Vec<f32> {
    let stats = group_stats(scores, groups);
    scores
        .iter()
        .zip(groups)
        .map(|(&s, &g)| {
            let stat = stats[g as usize];
            if stat.count < 2 {
                return s;
            }
            let n = stat.count as f64;
            (n / (n - 1.0) * (f64::from(s) - stat.mean)) as f32
        })
        .collect()
}

/// OPO: `R_i - sum_g(L R) / sum_g L` with `valid_tokens[i]` = L_i; `R_i` in
/// a group of one, or in a group without any valid token.
pub fn opo(scores: &[f32], groups: &[u32], valid_tokens: &[usize]) -> Vec<f32> {
    assert_eq!(scores.len(), valid_tokens.len(), "one length per score");
    let mut baseline = vec![0f64; scores.len()];
    for members in members(groups).iter().filter(|m| m.len() > 1) {
        let length: f64 = members.iter().map(|&i| valid_tokens[i] as f64).sum();
        if length == 0.0 {
            continue;
        }
        let weighted: f64 = members
            .iter()
            .map(|&i| valid_tokens[i] as f64 * f64::from(scores[i]))
            .sum();
        for &i in members {
            baseline[i] = weighted / length;
        }
    }
    scores
        .iter()
        .zip(baseline)
        .map(|(&s, b)| (f64::from(s) - b) as f32)
        .collect()
}

/// GPG: `alpha (R_i - mean_g R)` with `alpha = N / max(1, #{R_j != 0})`
/// over all N scores of the batch; a group of one has mean 0.
pub fn gpg(scores: &[f32], groups: &[u32]) -> Vec<f32> {
    let nonzero = scores.iter().filter(|&&s| s != 0.0).count().max(1);
    let alpha = scores.len() as f64 / nonzero as f64;
    scores
        .iter()
        .zip(baselines(scores, groups))
        .map(|(&s, mean)| (alpha * (f64::from(s) - mean)) as f32)
        .collect()
}

/// GRPO pass@k: the best score of each group gets `R_max - R_2nd` (divided
/// by the group's unbiased standard deviation plus eps with
/// `norm.norm_by_std`), every other score 0. A group of fewer than two is
/// an error, as in veRL.
pub fn grpo_passk(scores: &[f32], groups: &[u32], norm: GroupNorm) -> Result<Vec<f32>, AlgoError> {
    let stats = group_stats(scores, groups);
    let mut advantages = vec![0f32; scores.len()];
    for (g, members) in members(groups).iter().enumerate() {
        match members.len() {
            0 => continue,
            1 => {
                return Err(AlgoError::GroupTooSmall {
                    group: g as u32,
                    size: 1,
                    needed: 2,
                });
            }
            _ => {}
        }
        let best = *members
            .iter()
            .reduce(|best, i| if scores[*i] > scores[*best] { i } else { best })
            .expect("two members");
        let second = members
            .iter()
            .filter(|&&i| i != best)
            .map(|&i| scores[i])
            .fold(f32::NEG_INFINITY, f32::max);
        let gap = f64::from(scores[best]) - f64::from(second);
        advantages[best] = if norm.norm_by_std {
            gap / (stats[g].std + norm.eps)
        } else {
            gap
        } as f32;
    }
    Ok(advantages)
}

/// REINFORCE++-baseline: `R_i - mean_g R` (`R_i` in a group of one),
/// whitened over the batch's valid tokens, trajectory i counting
/// `valid_tokens[i]` times (veRL's `masked_whiten` of the broadcast
/// advantages). Fewer than two valid tokens in all is an error.
pub fn reinforce_plus_plus_baseline(
    scores: &[f32],
    groups: &[u32],
    valid_tokens: &[usize],
) -> Result<Vec<f32>, AlgoError> {
    assert_eq!(scores.len(), valid_tokens.len(), "one length per score");
    let centred: Vec<f32> = scores
        .iter()
        .zip(baselines(scores, groups))
        .map(|(&s, mean)| (f64::from(s) - mean) as f32)
        .collect();
    let mut stats = WhitenStats::default();
    for (&a, &n) in centred.iter().zip(valid_tokens) {
        stats.add_repeated(a, n);
    }
    let mut advantages = centred;
    stats.whitening()?.apply(&mut advantages);
    Ok(advantages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rloo_is_the_score_less_the_mean_of_the_others() {
        let a = rloo(&[3.0, 1.0, 2.0, 7.0], &[0, 0, 0, 1]);
        assert_eq!(a, vec![1.5, -1.5, 0.0, 7.0]);
        assert_eq!(rloo(&[1.0, 1.0], &[0, 0]), vec![0.0, 0.0]);
    }

    #[test]
    fn opo_weighs_the_baseline_by_valid_tokens() {
        // Baseline (1 * 2 + 0 * 6) / 8 = 0.25.
        let a = opo(&[1.0, 0.0, 4.0], &[0, 0, 1], &[2, 6, 3]);
        assert_eq!(a, vec![0.75, -0.25, 4.0]);
        // A group without valid tokens keeps its scores.
        assert_eq!(opo(&[1.0, 0.0], &[0, 0], &[0, 0]), vec![1.0, 0.0]);
    }

    #[test]
    fn gpg_scales_by_the_batch_over_its_non_zero_scores() {
        // Two of four non-zero: alpha = 2; means 0.5 and 1.
        let a = gpg(&[1.0, 0.0, 0.0, 2.0], &[0, 0, 1, 1]);
        assert_eq!(a, vec![1.0, -1.0, -2.0, 2.0]);
        // Every score zero: alpha = N / 1 and every advantage 0.
        assert_eq!(gpg(&[0.0, 0.0], &[0, 0]), vec![0.0, 0.0]);
        assert_eq!(gpg(&[3.0], &[0]), vec![3.0]);
    }

    #[test]
    fn passk_credits_the_best_of_each_group_only() {
        let centred = GroupNorm {
            norm_by_std: false,
            eps: 1e-6,
        };
        let a = grpo_passk(&[0.2, 0.9, 0.5, 1.0, 1.0], &[0, 0, 0, 1, 1], centred).unwrap();
        assert_eq!(
            a,
            vec![0.0, (f64::from(0.9f32) - 0.5) as f32, 0.0, 0.0, 0.0]
        );
        let scaled = grpo_passk(&[1.0, 0.0, 0.0, 0.0], &[0; 4], GroupNorm::default()).unwrap();
        // std of [1, 0, 0, 0] = 0.5.
        assert!(
            (scaled[0] - 1.0 / (0.5 + 1e-6) as f32).abs() < 1e-6,
            "{scaled:?}"
        );
        assert_eq!(&scaled[1..], [0.0; 3]);
        assert_eq!(
            grpo_passk(&[1.0, 0.0, 2.0], &[0, 0, 1], GroupNorm::default()),
            Err(AlgoError::GroupTooSmall {
                group: 1,
                size: 1,
                needed: 2
            })
        );
    }

    #[test]
    fn reinforce_baseline_whitens_over_valid_tokens() {
        // Centred [0.5, -0.5, 0, 0], a token each: mean 0, unbiased
        // variance 1/6.
        let a =
            reinforce_plus_plus_baseline(&[1.0, 0.0, 3.0, 3.0], &[0, 0, 1, 1], &[1; 4]).unwrap();
        let scale = 1.0 / (1.0f64 / 6.0 + 1e-8).sqrt();
        for (x, want) in a.iter().zip([0.5 * scale, -0.5 * scale, 0.0, 0.0]) {
            assert!((f64::from(*x) - want).abs() < 1e-5, "{a:?}");
        }
        // A group of one is centred on 0; without valid tokens it leaves
        // the statistics (of [0.5, -0.5]: variance 0.5).
        let a = reinforce_plus_plus_baseline(&[1.0, 0.0, 2.0], &[0, 0, 1], &[1, 1, 0]).unwrap();
        assert!(
            (f64::from(a[2]) - 2.0 / (0.5f64 + 1e-8).sqrt()).abs() < 1e-5,
            "{a:?}"
        );
        assert_eq!(
            reinforce_plus_plus_baseline(&[1.0, 0.0], &[0, 0], &[1, 0]),
            Err(AlgoError::TooFewToWhiten(1))
        );
    }
}
