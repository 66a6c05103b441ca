//! The PPO policy loss (docs/src/algorithms/ppo.md), with veRL's numerics
//! (`verl/trainer/ppo/core_algos.py::compute_policy_loss`, `agg_loss`):
//!
//! ```text
//! ratio   = exp(clamp(logp - old_logp, -20, 20))
//! l1      = -A * ratio
//! l2      = -A * clamp(ratio, 1 - eps_low, 1 + eps_high)      (clip-higher: 0.2 / 0.28)
//! clipped = max(l1, l2)
//! l3      = -A * c                                              (dual-clip, c = 3)
//! loss_t  = A < 0 ? min(clipped, l3) : clipped
//! ```
//! aggregated over the response mask `m` by `token-mean` (sum l m / sum m),
//! `seq-mean-token-sum` (mean over sequences of sum_t l m) or
//! `seq-mean-token-mean` (mean over sequences of the per-sequence token mean).
//! Metrics: `pg_clipfrac` = fraction of tokens with l2 > l1,
//! `pg_clipfrac_lower` = fraction with A < 0 and clipped > l3, `approx_kl` =
//! token mean of `old_logp - logp`. An optional KL penalty to a reference
//! policy uses the estimators k1 = `logp - ref`, k2 = `0.5 (logp - ref)^2`,
//! k3 = `exp(ref - logp) - (ref - logp) - 1` (clamped to [-10, 10] as veRL does).
//!
//! Micro-batches accumulate gradients toward one optimizer step, so the
//! aggregation takes its denominators from the whole mini-batch
//! ([`Denominators`]): the sum over micro-batches equals the loss of the
//! mini-batch in one piece.
//!
//! ```no_run
//! use embodyflow_update_policy::loss::{policy_loss, Denominators, PpoConfig};
//! # let (logp, old, adv, mask): (tch::Tensor, tch::Tensor, tch::Tensor, tch::Tensor) = todo!();
//! let denominators = Denominators { tokens: 120.0, sequences: 4.0 };
//! let out = policy_loss(&logp, &old, &adv, &mask, &PpoConfig::default(), denominators);
//! out.loss.backward();
//! ```

use embodyflow_core::config::ConfigKeys;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// How per-token losses become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossAgg {
    /// Mean over all tokens of the batch (veRL's default; DAPO).
    #[serde(rename = "token-mean")]
    TokenMean,
    /// Mean over sequences of the token sum (Dr. GRPO).
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// Mean over sequences of the token mean (original GRPO).
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
}

/// KL estimator of the penalty to the reference policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logp - ref`.
    K1,
    /// `0.5 (logp - ref)^2`.
    K2,
    /// `exp(ref - logp) - (ref - logp) - 1` (low variance, non-negative).
    K3,
}

/// `ppo.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct PpoConfig {
    /// Lower clip range eps_low.
    pub clip_low: f64,
    /// Upper clip range eps_high (clip-higher).
    pub clip_high: f64,
    /// Dual-clip constant c for negative advantages (> 1).
    pub dual_clip: f64,
    /// Loss aggregation: token-mean, seq-mean-token-sum or seq-mean-token-mean.
    pub loss_agg: LossAgg,
    /// Entropy bonus coefficient (the loss subtracts coef * entropy).
    pub entropy_coef: f64,
    /// KL penalty coefficient beta (0: off).
    pub kl_coef: f64,
    /// KL estimator: k1, k2 or k3.
    pub kl_estimator: KlEstimator,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: 3.0,
            loss_agg: LossAgg::TokenMean,
            entropy_coef: 0.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
        }
    }
}

/// Token and sequence counts of the whole mini-batch a micro-batch belongs to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Denominators {
    /// Response tokens in the mini-batch.
    pub tokens: f64,
    /// Sequences in the mini-batch.
    pub sequences: f64,
}

/// The loss of one micro-batch and its metrics (token sums, to be divided by
/// the mini-batch token count).
pub struct PolicyLoss {
    /// The policy-gradient loss, already divided by the mini-batch denominators.
    pub loss: Tensor,
    /// Sum over tokens of `l2 > l1`.
    pub clipped_tokens: f64,
    /// Sum over tokens of the dual-clip indicator.
    pub clipped_lower_tokens: f64,
    /// Sum over tokens of `old_logp - logp`.
    pub kl_sum: f64,
}

/// Aggregates per-token values `[batch, time]` under `mask` with mini-batch denominators.
pub fn aggregate(
    values: &Tensor,
    mask: &Tensor,
    agg: LossAgg,
    denominators: Denominators,
) -> Tensor {
    let masked = values * mask;
    match agg {
        LossAgg::TokenMean => masked.sum(Kind::Float) / denominators.tokens,
        LossAgg::SeqMeanTokenSum => masked.sum(Kind::Float) / denominators.sequences,
        LossAgg::SeqMeanTokenMean => {
            let per_sequence = masked.sum_dim_intlist(-1, false, Kind::Float)
                / mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
            per_sequence.sum(Kind::Float) / denominators.sequences
        }
    }
}

/// The clipped surrogate of one micro-batch (all tensors `[batch, time]`).
pub fn policy_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    config: &PpoConfig,
    denominators: Denominators,
) -> PolicyLoss {
    let log_ratio = (logp - old_logp).clamp(-20.0, 20.0);
    let ratio = log_ratio.exp();
    let l1 = -advantages * &ratio;
    let l2 = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high);
    let clipped = l1.maximum(&l2);
    let l3 = -advantages * config.dual_clip;
    let negative = advantages.lt(0.0);
    let per_token = clipped.minimum(&l3).where_self(&negative, &clipped);
    let sum_of = |indicator: Tensor| {
        (indicator.to_kind(Kind::Float) * mask)
            .sum(Kind::Double)
            .double_value(&[])
    };
    let clipped_tokens = sum_of(l2.gt_tensor(&l1));
    let clipped_lower_tokens = sum_of(clipped.gt_tensor(&l3).logical_and(&negative));
    let kl_sum = ((old_logp - logp).detach() * mask)
        .sum(Kind::Double)
        .double_value(&[]);
    PolicyLoss {
        loss: aggregate(&per_token, mask, config.loss_agg, denominators),
        clipped_tokens,
        clipped_lower_tokens,
        kl_sum,
    }
}

/// The per-token KL estimate of `logp` against a reference `ref_logp`.
pub fn kl_penalty(logp: &Tensor, ref_logp: &Tensor, estimator: KlEstimator) -> Tensor {
    let diff = logp - ref_logp;
    match estimator {
        KlEstimator::K1 => diff,
        KlEstimator::K2 => diff.square() * 0.5,
        KlEstimator::K3 => {
            let neg = -&diff;
            (neg.exp() - neg - 1.0).clamp(-10.0, 10.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(values: &[f32]) -> Tensor {
        Tensor::from_slice(values).view([1, values.len() as i64])
    }

    #[test]
    fn surrogate_by_hand() {
        // Token 0: A = 1, ratio e^0.5 = 1.6487 > 1.28 -> clipped at 1.28, loss -1.28.
        // Token 1: A = -1, ratio e^-0.5 = 0.6065 < 0.8 -> max(0.6065, 0.8) = 0.8.
        // Token 2: A = -1, ratio e^2 = 7.389 -> clipped = 7.389 > dual-clip 3 -> 3.
        // Token 3: A = 2, ratio 1 -> -2 (no clip). Token 4 masked out.
        let old = t(&[0.0, 0.0, 0.0, 0.0, 0.0]);
        let logp = t(&[0.5, -0.5, 2.0, 0.0, 9.0]);
        let adv = t(&[1.0, -1.0, -1.0, 2.0, 5.0]);
        let mask = t(&[1.0, 1.0, 1.0, 1.0, 0.0]);
        let denominators = Denominators {
            tokens: 4.0,
            sequences: 1.0,
        };
        let out = policy_loss(
            &logp,
            &old,
            &adv,
            &mask,
            &PpoConfig::default(),
            denominators,
        );
        let expected = (-1.28 + 0.8 + 3.0 - 2.0) / 4.0;
        assert!((out.loss.double_value(&[]) - expected).abs() < 1e-6);
        // l2 > l1 on tokens 0 (-1.28 > -1.6487) and 1 (0.8 > 0.6065).
        assert_eq!(out.clipped_tokens, 2.0);
        assert_eq!(out.clipped_lower_tokens, 1.0);
        assert!((out.kl_sum - (-0.5 + 0.5 - 2.0)).abs() < 1e-6);
    }

    #[test]
    fn aggregations_by_hand() {
        let values = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([2, 2]);
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0]).view([2, 2]);
        let d = Denominators {
            tokens: 3.0,
            sequences: 2.0,
        };
        let value = |agg| aggregate(&values, &mask, agg, d).double_value(&[]);
        assert!((value(LossAgg::TokenMean) - 2.0).abs() < 1e-6); // (1+2+3)/3
        assert!((value(LossAgg::SeqMeanTokenSum) - 3.0).abs() < 1e-6); // (3+3)/2
        assert!((value(LossAgg::SeqMeanTokenMean) - 2.25).abs() < 1e-6); // (1.5+3)/2
    }

    #[test]
    fn micro_batches_sum_to_the_whole() {
        let logp = Tensor::from_slice(&[0.1f32, -0.3, 0.2, 0.05, -0.1, 0.4]).view([3, 2]);
        let old = Tensor::from_slice(&[0.0f32, 0.0, 0.1, 0.0, 0.0, 0.0]).view([3, 2]);
        let adv = Tensor::from_slice(&[1.0f32, 1.0, -0.5, -0.5, 2.0, 2.0]).view([3, 2]);
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0, 1.0, 1.0]).view([3, 2]);
        let d = Denominators {
            tokens: 5.0,
            sequences: 3.0,
        };
        for agg in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenMean,
        ] {
            let config = PpoConfig {
                loss_agg: agg,
                ..Default::default()
            };
            let whole = policy_loss(&logp, &old, &adv, &mask, &config, d)
                .loss
                .double_value(&[]);
            let part = |start, len| {
                policy_loss(
                    &logp.narrow(0, start, len),
                    &old.narrow(0, start, len),
                    &adv.narrow(0, start, len),
                    &mask.narrow(0, start, len),
                    &config,
                    d,
                )
                .loss
                .double_value(&[])
            };
            assert!((whole - (part(0, 2) + part(2, 1))).abs() < 1e-6, "{agg:?}");
        }
    }

    #[test]
    fn k3_is_non_negative_and_zero_at_equality() {
        let logp = t(&[-1.0, -2.0, -0.5]);
        let reference = t(&[-1.0, -1.0, -3.0]);
        let k3 = kl_penalty(&logp, &reference, KlEstimator::K3);
        let values: Vec<f32> = Vec::<f32>::try_from(k3.view([-1])).unwrap();
        assert_eq!(values[0], 0.0);
        assert!(values.iter().all(|&v| v >= 0.0));
    }
}
