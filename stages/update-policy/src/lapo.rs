//! The LAPO loss of LaST-R1 (docs/src/algorithms/lapo.md): PPO on a VLA that thinks
//! in continuous latents before it acts, one row per decision step. Each
//! decision has three things the policy chose, and each enters the clipped
//! surrogate of [`crate::loss::policy_loss`] (clip-higher, dual-clip; the
//! same function, not a copy) with the step's advantage `A`:
//!
//! ```text
//! action  log r = sum_t logp_t - sum_t old_logp_t        (the chunk: its n_action tokens summed)
//! end     log r = logp(<latent_end>) - old_logp(<latent_end>)   (the chosen stop)
//! latent  log r = -0.5 * sum_i m_i ||z_old_i - z_new_i||^2 / sigma^2   (old log r = 0)
//!
//! policy  = w_action * (n_action * L_action + w_end * L_end) / (n_action + w_end)
//!         + w_latent * L_latent
//! value   = 0.5 * mean_d max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)
//! loss    = policy + value_coef * value
//! ```
//!
//! The latent ratio is a Gaussian density ratio: the new policy's latent
//! `z_new_i` is the mean of a Gaussian of fixed standard deviation `sigma`
//! (`latent_sigma`, 10), evaluated at the latent the rollout policy
//! generated (`z_old_i`); the sum runs over the chosen latents only (mask
//! `m`, the first `chosen_length` slots), so candidate slots that the
//! `<latent_end>` stop cut off contribute nothing. The ratio is at most 1,
//! so with `A > 0` it is never clipped from above. As in `policy_loss`, the
//! log-ratios are clamped to `[-20, 20]` before `exp`.
//!
//! The weighting is the code's, not the paper's: `w_end` is the weight of
//! the one `<latent_end>` decision against the `n_action` action tokens
//! (56 in LaST-R1: 7 dimensions × 8 steps; here the width of the action
//! log-probs), inside a weighted mean, and the value loss is added with
//! weight 1. Defaults are the LaST-R1 script's: `action_loss_weight` 1.0,
//! `latent_end_loss_weight` 1.0, `latent_loss_weight` 0.1, `latent_sigma`
//! 10; the value is clipped symmetrically by the low clip ratio (0.2), as
//! the code does (its `high_clip_ratio` argument is unused).
//!
//! **The critic's optimiser** (`critic_optim`): LaST-R1's actor steps the
//! value head with an optimiser of its own at `value_head_lr` = 10× the
//! policy's `lr` (3e-4 against 3e-5) and clips one gradient norm over all
//! parameters at `grad_clip` = 10 (`scripts/run_libero_rl_training.sh`,
//! `dp_rob.py::_optimizer_step`). `own` (the default) is that: the value
//! head's parameters form an AdamW group at `value_lr_scale × optim.lr`
//! (two Adams stepped together are one Adam with two rates); `shared` is
//! one rate for trunk and head, kept because a fresh head then learns at
//! the policy's small rate, which is what the earlier results measured.
//! The clip is `optim.grad_clip` (the LAPO pipeline sets 10).
//!
//! Each surrogate is one "token" per decision (tensors `[B, 1]`), aggregated
//! over the valid decisions: the mean divides by `decisions`, the number of
//! valid decisions in the whole mini-batch, so the losses (and every metric
//! of [`LapoLoss`]) of its micro-batches sum to the mini-batch's. With one
//! token per row all three `ppo.loss_agg` modes give the same number.
//!
//! Reference: LaST-R1 (arXiv 2604.28192), `verl/trainer/ppo/core_algos.py::
//! compute_policy_loss_with_latent` and `compute_value_loss`, and the actor's
//! `update_policy` in `dp_rob.py` (the LaST-R1 notes,
//! §8.4–8.9).
//!
//! ```no_run
//! use embodyflow_update_policy::lapo::{LapoBatch, LapoConfig, lapo_loss};
//! use embodyflow_update_policy::loss::PpoConfig;
//! # let t: tch::Tensor = todo!();
//! let batch = LapoBatch {
//!     action_logprobs: &t,     // [B, n_action], recomputed (with gradients)
//!     old_action_logprobs: &t, // [B, n_action], from the rollout
//!     end_logprob: &t,         // [B]
//!     old_end_logprob: &t,     // [B]
//!     latents: &t,             // [B, L, D], recomputed (with gradients)
//!     old_latents: &t,         // [B, L, D], generated in the rollout
//!     latent_mask: &t,         // [B, L], 1 on the chosen latents
//!     advantages: &t,          // [B]
//!     values: &t,              // [B], recomputed (with gradients)
//!     old_values: &t,          // [B]
//!     returns: &t,             // [B]
//!     mask: &t,                // [B], 1 on valid decisions
//! };
//! let lapo = LapoConfig::default();
//! lapo.check()?;
//! let out = lapo_loss(&batch, &PpoConfig::default(), &lapo, 64.0)?;
//! out.loss.backward();
//! println!("action {} latent ratio {}", out.action.loss, out.latent_ratio);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use embodyflow_core::config::{ConfigKeys, non_negative, positive};

use crate::loss::{Denominators, LossAgg, PolicyLoss, PpoConfig, aggregate, policy_loss};

/// `lapo.*` settings: the LAPO weights, the latent's sigma and the value loss
/// (each field's doc comment is its key's meaning). The defaults are
/// LaST-R1's code's: its value is clipped symmetrically by the low clip
/// ratio (0.2) and added to the loss as is (1), and its script steps the
/// value head at `value_head_lr` 3e-4 against `lr` 3e-5 (10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct LapoConfig {
    /// LAPO: sigma of the latent ratio exp(-0.5 sum ||z_old - z||^2 / sigma^2)
    /// (LaST-R1: 10).
    pub latent_sigma: f64,
    /// LAPO: weight of the action/stop mean (action_loss_weight, 1).
    pub w_action: f64,
    /// LAPO: weight of the stop against the n_action action tokens
    /// (latent_end_loss_weight, 1).
    pub w_end: f64,
    /// LAPO: weight of the latent surrogate (latent_loss_weight, 0.1).
    pub w_latent: f64,
    /// LAPO: the value is clipped to old value +- this (LaST-R1: 0.2).
    pub value_clip: f64,
    /// LAPO: weight of the value loss in the total (LaST-R1: 1).
    pub value_coef: f64,
    /// LAPO: the value head's optimiser: own (its own rate, lapo.value_lr_scale
    /// x optim.lr, LaST-R1) or shared (one rate).
    pub critic_optim: CriticOptim,
    /// LAPO: the value head's rate as a multiple of optim.lr with critic_optim
    /// = own (LaST-R1: 10).
    pub value_lr_scale: f64,
}

/// `lapo.critic_optim`: the value head's optimiser.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CriticOptim {
    /// Its own AdamW at `value_lr_scale × optim.lr` (LaST-R1's
    /// `value_head_optimizer`); one gradient norm over all parameters is
    /// clipped at `optim.grad_clip`, as its actor does.
    #[default]
    Own,
    /// One AdamW and one rate for trunk and value head: a fresh head then
    /// learns at the policy's small rate, so the critic stays blind for
    /// long (measured: docs/src/results/last-r1-lapo.md).
    Shared,
}

impl LapoConfig {
    /// The value head's rate as a multiple of the policy's.
    pub fn value_lr_factor(&self) -> f64 {
        match self.critic_optim {
            CriticOptim::Own => self.value_lr_scale,
            CriticOptim::Shared => 1.0,
        }
    }
}

impl Default for LapoConfig {
    fn default() -> Self {
        LapoConfig {
            latent_sigma: 10.0,
            w_action: 1.0,
            w_end: 1.0,
            w_latent: 0.1,
            value_clip: 0.2,
            value_coef: 1.0,
            critic_optim: CriticOptim::Own,
            value_lr_scale: 10.0,
        }
    }
}

impl LapoConfig {
    /// Checks the settings with the stage config's own checks; the error
    /// (`Error::BadValue`) names the key (`lapo.<field>`), what it expects
    /// and what it found.
    pub fn check(&self) -> embodyflow_core::Result<()> {
        positive("lapo.latent_sigma", self.latent_sigma)?;
        positive("lapo.value_lr_scale", self.value_lr_scale)?;
        embodyflow_core::config::ensure(
            self.critic_optim == CriticOptim::Own || self.value_lr_scale == 10.0,
            "lapo.value_lr_scale",
            "its default (10) with lapo.critic_optim = shared, which reads no value rate",
            self.value_lr_scale,
        )?;
        for (key, value) in [
            ("lapo.w_action", self.w_action),
            ("lapo.w_end", self.w_end),
            ("lapo.w_latent", self.w_latent),
            ("lapo.value_clip", self.value_clip),
            ("lapo.value_coef", self.value_coef),
        ] {
            non_negative(key, value)?;
        }
        Ok(())
    }
}

/// One micro-batch of B decisions (all tensors on one device, floats).
pub struct LapoBatch<'a> {
    /// `[B, n_action]`: the new policy's log-probs of the chunk's action tokens.
    pub action_logprobs: &'a Tensor,
    /// `[B, n_action]`: the rollout policy's log-probs of the same tokens.
    pub old_action_logprobs: &'a Tensor,
    /// `[B]`: the new policy's log-prob of the chosen `<latent_end>` stop.
    pub end_logprob: &'a Tensor,
    /// `[B]`: the rollout policy's log-prob of that stop.
    pub old_end_logprob: &'a Tensor,
    /// `[B, L, D]`: the new policy's latents (L slots of dimension D).
    pub latents: &'a Tensor,
    /// `[B, L, D]`: the latents the rollout policy generated.
    pub old_latents: &'a Tensor,
    /// `[B, L]`: 1 on the chosen latent slots, 0 on the others.
    pub latent_mask: &'a Tensor,
    /// `[B]`: the decision's advantage.
    pub advantages: &'a Tensor,
    /// `[B]`: the new value head's predictions.
    pub values: &'a Tensor,
    /// `[B]`: the rollout's value predictions.
    pub old_values: &'a Tensor,
    /// `[B]`: the returns (GAE advantage + value, before whitening).
    pub returns: &'a Tensor,
    /// `[B]`: 1 on valid decisions, 0 on padding.
    pub mask: &'a Tensor,
}

/// A bad input of [`lapo_loss`].
#[derive(Debug, Clone, PartialEq)]
pub enum LapoError {
    /// A tensor of the batch does not have the shape the others imply.
    Shape {
        /// The [`LapoBatch`] field.
        input: &'static str,
        /// The expected shape, in words.
        expected: String,
        /// The shape found.
        found: Vec<i64>,
    },
    /// The mini-batch's count of valid decisions is not a positive number.
    Decisions(f64),
}

impl fmt::Display for LapoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LapoError::Shape {
                input,
                expected,
                found,
            } => write!(
                f,
                "LAPO input {input}: expected {expected}, found {found:?}"
            ),
            LapoError::Decisions(d) => write!(
                f,
                "LAPO: the mini-batch's valid decisions must be a positive number, found {d}"
            ),
        }
    }
}

impl std::error::Error for LapoError {}

/// One clipped surrogate's share of the mini-batch (each a sum over the
/// micro-batch's decisions divided by the mini-batch's `decisions`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SurrogateTerm {
    /// The surrogate loss.
    pub loss: f64,
    /// Fraction of decisions clipped (`l2 > l1` of `policy_loss`).
    pub clipfrac: f64,
    /// Fraction of decisions held by the dual clip (A < 0).
    pub clipfrac_lower: f64,
    /// Mean of `old log r - log r` (the latent's old log-ratio is 0).
    pub approx_kl: f64,
}

/// The LAPO loss of one micro-batch and its terms.
pub struct LapoLoss {
    /// `policy + value_coef * value`, with gradients, already divided by the
    /// mini-batch's decisions.
    pub loss: Tensor,
    /// The weighted policy loss.
    pub policy: f64,
    /// The action chunk's surrogate `L_action`.
    pub action: SurrogateTerm,
    /// The `<latent_end>` stop's surrogate `L_end`.
    pub end: SurrogateTerm,
    /// The latent surrogate `L_latent`.
    pub latent: SurrogateTerm,
    /// The clipped value loss (unweighted).
    pub value: f64,
    /// Fraction of decisions whose clipped value error is the larger.
    pub value_clipfrac: f64,
    /// Mean latent ratio `exp(-0.5 * diff2 / sigma^2)`.
    pub latent_ratio: f64,
}

/// The LAPO loss of one micro-batch (module doc). `decisions` is the number
/// of valid decisions in the whole mini-batch; `ppo` gives the clip ranges
/// and the dual clip; `config` should have passed [`LapoConfig::check`].
pub fn lapo_loss(
    batch: &LapoBatch<'_>,
    ppo: &PpoConfig,
    config: &LapoConfig,
    decisions: f64,
) -> Result<LapoLoss, LapoError> {
    if !(decisions.is_finite() && decisions > 0.0) {
        return Err(LapoError::Decisions(decisions));
    }
    let (b, n_action) = check_shapes(batch)?;
    let denominators = Denominators {
        tokens: decisions,
        sequences: decisions,
    };
    let column = |t: &Tensor| t.view([b, 1]);
    let mask = column(batch.mask);
    let advantages = column(batch.advantages);
    let surrogate =
        |logp: &Tensor, old: &Tensor| policy_loss(logp, old, &advantages, &mask, ppo, denominators);

    let chunk = |t: &Tensor| t.sum_dim_intlist(1, true, Kind::Float);
    let action = surrogate(
        &chunk(batch.action_logprobs),
        &chunk(batch.old_action_logprobs),
    );
    let end = surrogate(&column(batch.end_logprob), &column(batch.old_end_logprob));
    let diff2 = (batch.old_latents - batch.latents)
        .square()
        .sum_dim_intlist(-1, false, Kind::Float);
    let diff2 = (diff2 * batch.latent_mask).sum_dim_intlist(-1, true, Kind::Float);
    let latent_log_ratio = diff2 * (-0.5 / (config.latent_sigma * config.latent_sigma));
    let latent = surrogate(&latent_log_ratio, &latent_log_ratio.zeros_like());

    let n = n_action as f64;
    let policy = (&action.loss * n + &end.loss * config.w_end)
        * (config.w_action / (n + config.w_end))
        + &latent.loss * config.w_latent;

    let values = column(batch.values);
    let old_values = column(batch.old_values);
    let returns = column(batch.returns);
    let clipped_values = values.clamp_tensor(
        Some(&old_values - config.value_clip),
        Some(&old_values + config.value_clip),
    );
    let unclipped_error = (&values - &returns).square();
    let clipped_error = (clipped_values - &returns).square();
    let value = aggregate(
        &(unclipped_error.maximum(&clipped_error) * 0.5),
        &mask,
        LossAgg::TokenMean,
        denominators,
    );
    let share = |t: &Tensor| {
        (t.detach().to_kind(Kind::Double) * &mask)
            .sum(Kind::Double)
            .double_value(&[])
            / decisions
    };
    let value_clipfrac = share(&clipped_error.gt_tensor(&unclipped_error));
    let latent_ratio = share(&latent_log_ratio.exp());
    let term = |p: &PolicyLoss| SurrogateTerm {
        loss: p.loss.double_value(&[]),
        clipfrac: p.clipped_tokens / decisions,
        clipfrac_lower: p.clipped_lower_tokens / decisions,
        approx_kl: p.kl_sum / decisions,
    };
    Ok(LapoLoss {
        policy: policy.double_value(&[]),
        value: value.double_value(&[]),
        loss: policy + value * config.value_coef,
        action: term(&action),
        end: term(&end),
        latent: term(&latent),
        value_clipfrac,
        latent_ratio,
    })
}

/// Checks every tensor of `batch` against the others; returns B and n_action.
fn check_shapes(batch: &LapoBatch<'_>) -> Result<(i64, i64), LapoError> {
    let advantages = batch.advantages.size();
    let b = match advantages.as_slice() {
        [b] => *b,
        _ => {
            return Err(LapoError::Shape {
                input: "advantages",
                expected: "[B]".into(),
                found: advantages,
            });
        }
    };
    let action = batch.action_logprobs.size();
    let n_action = match action.as_slice() {
        [rows, n] if *rows == b && *n >= 1 => *n,
        _ => {
            return Err(LapoError::Shape {
                input: "action_logprobs",
                expected: format!("[{b}, n_action] with n_action >= 1"),
                found: action,
            });
        }
    };
    let latents = batch.latents.size();
    let (slots, dim) = match latents.as_slice() {
        [rows, l, d] if *rows == b => (*l, *d),
        _ => {
            return Err(LapoError::Shape {
                input: "latents",
                expected: format!("[{b}, L, D]"),
                found: latents,
            });
        }
    };
    let expect = |input: &'static str, t: &Tensor, shape: &[i64]| {
        let found = t.size();
        if found == shape {
            Ok(())
        } else {
            Err(LapoError::Shape {
                input,
                expected: format!("{shape:?}"),
                found,
            })
        }
    };
    expect(
        "old_action_logprobs",
        batch.old_action_logprobs,
        &[b, n_action],
    )?;
    expect("old_latents", batch.old_latents, &[b, slots, dim])?;
    expect("latent_mask", batch.latent_mask, &[b, slots])?;
    for (input, t) in [
        ("end_logprob", batch.end_logprob),
        ("old_end_logprob", batch.old_end_logprob),
        ("values", batch.values),
        ("old_values", batch.old_values),
        ("returns", batch.returns),
        ("mask", batch.mask),
    ] {
        expect(input, t, &[b])?;
    }
    Ok((b, n_action))
}

/// The share of the returns' variance the values explain:
/// `1 - Var(R - v) / Var(R)` (1: perfect, 0: no better than the mean
/// return, below 0: worse). Both variances share their denominator, so
/// biased and unbiased estimates give the same number. `None` when there
/// are fewer than 2 values, the lengths differ, or `Var(R)` is 0 (or not a
/// number).
pub fn explained_variance(values: &[f32], returns: &[f32]) -> Option<f64> {
    if values.len() != returns.len() || returns.len() < 2 {
        return None;
    }
    let variance = |xs: &mut dyn Iterator<Item = f64>| {
        let xs: Vec<f64> = xs.collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64
    };
    let var_returns = variance(&mut returns.iter().map(|&r| f64::from(r)));
    if var_returns.is_nan() || var_returns <= 0.0 {
        return None;
    }
    let var_residual = variance(
        &mut values
            .iter()
            .zip(returns)
            .map(|(&v, &r)| f64::from(r) - f64::from(v)),
    );
    Some(1.0 - var_residual / var_returns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn tensor(values: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(values).view(shape)
    }

    fn assert_close(found: f64, expected: f64, what: &str) {
        assert!(
            (found - expected).abs() < 1e-5,
            "{what}: found {found}, expected {expected}"
        );
    }

    /// The tensors of a [`LapoBatch`], owned.
    struct Fixture {
        action: Tensor,
        old_action: Tensor,
        end: Tensor,
        old_end: Tensor,
        latents: Tensor,
        old_latents: Tensor,
        latent_mask: Tensor,
        advantages: Tensor,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
    }

    impl Fixture {
        /// Decisions with the given advantages whose every ratio is 1 (new ==
        /// old), whose value loss is 0 (value == old value == return), all
        /// valid, every latent slot chosen.
        fn neutral(advantages: &[f32], n_action: i64, slots: i64, dim: i64) -> Fixture {
            let b = advantages.len() as i64;
            let options = (Kind::Float, Device::Cpu);
            let action = Tensor::arange(b * n_action, options).view([b, n_action]) * -0.1;
            let end = Tensor::full([b], -0.7, options);
            let latents = Tensor::arange(b * slots * dim, options).view([b, slots, dim]) * 0.3;
            let values = Tensor::full([b], 0.4, options);
            Fixture {
                old_action: action.copy(),
                action,
                old_end: end.copy(),
                end,
                old_latents: latents.copy(),
                latents,
                latent_mask: Tensor::ones([b, slots], options),
                advantages: tensor(advantages, &[b]),
                old_values: values.copy(),
                returns: values.copy(),
                values,
                mask: Tensor::ones([b], options),
            }
        }

        /// One decision (A = 1) with three latent slots of dimension 2, the
        /// first two chosen: `||z_old - z_new||^2` is 4 and 25 on them (29
        /// in all) and 32 on the unchosen third.
        fn one_latent_decision(n_action: i64) -> Fixture {
            let mut f = Fixture::neutral(&[1.0], n_action, 3, 2);
            f.latents = tensor(&[1.0, 2.0, 0.0, 0.0, 5.0, 5.0], &[1, 3, 2]);
            f.old_latents = tensor(&[1.0, 0.0, 3.0, 4.0, 9.0, 9.0], &[1, 3, 2]);
            f.latent_mask = tensor(&[1.0, 1.0, 0.0], &[1, 3]);
            f
        }

        fn batch(&self) -> LapoBatch<'_> {
            LapoBatch {
                action_logprobs: &self.action,
                old_action_logprobs: &self.old_action,
                end_logprob: &self.end,
                old_end_logprob: &self.old_end,
                latents: &self.latents,
                old_latents: &self.old_latents,
                latent_mask: &self.latent_mask,
                advantages: &self.advantages,
                values: &self.values,
                old_values: &self.old_values,
                returns: &self.returns,
                mask: &self.mask,
            }
        }

        fn narrow(&self, start: i64, len: i64) -> Fixture {
            let n = |t: &Tensor| t.narrow(0, start, len);
            Fixture {
                action: n(&self.action),
                old_action: n(&self.old_action),
                end: n(&self.end),
                old_end: n(&self.old_end),
                latents: n(&self.latents),
                old_latents: n(&self.old_latents),
                latent_mask: n(&self.latent_mask),
                advantages: n(&self.advantages),
                values: n(&self.values),
                old_values: n(&self.old_values),
                returns: n(&self.returns),
                mask: n(&self.mask),
            }
        }

        fn run(&self, ppo: &PpoConfig, config: &LapoConfig, decisions: f64) -> LapoLoss {
            lapo_loss(&self.batch(), ppo, config, decisions).unwrap()
        }

        fn loss(&self, config: &LapoConfig) -> LapoLoss {
            let decisions = self.mask.sum(Kind::Double).double_value(&[]);
            self.run(&PpoConfig::default(), config, decisions)
        }
    }

    #[test]
    fn action_ratio_is_the_ratio_of_the_summed_token_logprobs() {
        let mut f = Fixture::neutral(&[1.0, 1.0], 3, 2, 2);
        f.action = tensor(&[-0.1, -0.2, -0.3, -0.9, -0.9, -0.9], &[2, 3]);
        f.old_action = tensor(&[-0.2, -0.2, -0.35, -1.0, -1.0, -1.0], &[2, 3]);
        let out = f.loss(&LapoConfig::default());
        // Decision 0: log r = -0.6 + 0.75 = 0.15, r = 1.161834 (unclipped), l = -1.161834.
        // Decision 1: log r = 3 * 0.1 = 0.3, r = 1.349859 > 1.28: l = -1.28 (each
        // token's own ratio, e^0.1 = 1.105171, would not be clipped).
        assert_close(out.action.loss, (-1.161834 - 1.28) / 2.0, "L_action");
        assert_close(out.action.clipfrac, 0.5, "action clipfrac");
        assert_close(
            out.action.approx_kl,
            (-0.15 - 0.3) / 2.0,
            "action approx_kl",
        );
        // End and latent at ratio 1 with A = 1: -1 each.
        // policy = (3 * -1.220917 - 1) / 4 + 0.1 * -1 = -1.165688 - 0.1.
        assert_close(out.policy, -1.265688, "policy");
        assert_close(out.loss.double_value(&[]), -1.265688, "loss");
    }

    #[test]
    fn end_ratio_is_the_chosen_stops() {
        let mut f = Fixture::neutral(&[2.0, -1.0], 4, 2, 2);
        f.end = tensor(&[-0.5, -1.0], &[2]);
        f.old_end = tensor(&[-0.7, -0.6], &[2]);
        let out = f.loss(&LapoConfig::default());
        // Decision 0: A = 2, r = e^0.2 = 1.221403 (unclipped): l = -2.442806.
        // Decision 1: A = -1, r = e^-0.4 = 0.670320 < 0.8: l = max(0.670320, 0.8) = 0.8.
        assert_close(out.end.loss, (-2.442806 + 0.8) / 2.0, "L_end");
        assert_close(out.end.clipfrac, 0.5, "end clipfrac");
        assert_close(out.end.clipfrac_lower, 0.0, "end clipfrac_lower");
        assert_close(out.end.approx_kl, (-0.2 + 0.4) / 2.0, "end approx_kl");
        // Actions and latents at ratio 1: (-2 + 1) / 2 = -0.5 each.
        // policy = (4 * -0.5 + 1 * -0.821403) / 5 + 0.1 * -0.5.
        assert_close(out.policy, -0.564281 - 0.05, "policy");
    }

    #[test]
    fn latent_ratio_counts_the_chosen_latents_only() {
        let f = Fixture::one_latent_decision(3);
        let out = f.loss(&LapoConfig::default());
        // Chosen: 4 + 25 = 29; log r = -0.5 * 29 / 10^2 = -0.145, r = 0.865022, A = 1.
        assert_close(out.latent_ratio, 0.865022, "latent ratio");
        assert_close(out.latent.loss, -0.865022, "L_latent");
        assert_close(out.latent.approx_kl, 0.145, "latent approx_kl");
        assert_close(out.latent.clipfrac, 0.0, "latent clipfrac");
        // Actions and end at ratio 1: -1; policy = -1 + 0.1 * -0.865022.
        assert_close(out.policy, -1.0865022, "policy");

        // The unchosen third slot does not count, whatever it holds.
        let mut moved = Fixture::one_latent_decision(3);
        moved.latents = tensor(&[1.0, 2.0, 0.0, 0.0, 100.0, -7.0], &[1, 3, 2]);
        let moved = moved.loss(&LapoConfig::default());
        assert_eq!(moved.loss.double_value(&[]), out.loss.double_value(&[]));
        assert_eq!(moved.latent_ratio, out.latent_ratio);
        // Chosen, it would (29 + 32 = 61).
        let mut all = Fixture::one_latent_decision(3);
        all.latent_mask = tensor(&[1.0, 1.0, 1.0], &[1, 3]);
        assert!((all.loss(&LapoConfig::default()).latent_ratio - out.latent_ratio).abs() > 0.1);

        // sigma = 5: log r = -0.5 * 29 / 25 = -0.58, r = 0.559898; with A > 0 a
        // ratio below 1 - eps_low is not clipped (l1 = -0.559898 > l2 = -0.8).
        let config = LapoConfig {
            latent_sigma: 5.0,
            ..Default::default()
        };
        let out = f.loss(&config);
        assert_close(out.latent.loss, -0.559898, "L_latent, sigma 5");
        assert_close(out.latent.clipfrac, 0.0, "latent clipfrac, sigma 5");
    }

    #[test]
    fn ratios_above_the_clip_range_are_clipped_and_the_dual_clip_bounds_negative_advantages() {
        let mut f = Fixture::neutral(&[1.0, -1.0], 2, 1, 1);
        f.action = tensor(&[0.25, 0.25, 1.0, 1.0], &[2, 2]);
        f.old_action = tensor(&[0.0, 0.0, 0.0, 0.0], &[2, 2]);
        let out = f.loss(&LapoConfig::default());
        // Decision 0: A = 1, r = e^0.5 = 1.648721 > 1.28: l = -1.28.
        // Decision 1: A = -1, r = e^2 = 7.389056: max(7.389056, 1.28) = 7.389056 > 3: l = 3.
        assert_close(out.action.loss, (-1.28 + 3.0) / 2.0, "L_action");
        assert_close(out.action.clipfrac, 0.5, "action clipfrac");
        assert_close(out.action.clipfrac_lower, 0.5, "action clipfrac_lower");
        // A dual clip of 10 leaves decision 1 at 7.389056.
        let ppo = PpoConfig {
            dual_clip: 10.0,
            ..Default::default()
        };
        let out = f.run(&ppo, &LapoConfig::default(), 2.0);
        assert_close(
            out.action.loss,
            (-1.28 + 7.389056) / 2.0,
            "L_action, dual clip 10",
        );
        assert_close(
            out.action.clipfrac_lower,
            0.0,
            "clipfrac_lower, dual clip 10",
        );
    }

    #[test]
    fn policy_weights_the_action_tokens_against_the_end_as_the_code_does() {
        let mut f = Fixture::one_latent_decision(56);
        // 56 action tokens, chunk log-ratio 0.056: r = 1.057598, L_action = -1.057598.
        f.old_action = Tensor::full([1, 56], -0.25, (Kind::Float, Device::Cpu));
        f.action = f.old_action.copy();
        let _ = f.action.get(0).get(0).fill_(-0.25 + 0.056);
        // End: log r = 0.1, r = 1.105171, L_end = -1.105171; latent: L_latent = -0.865022.
        f.end = tensor(&[-0.4], &[1]);
        f.old_end = tensor(&[-0.5], &[1]);
        let out = f.loss(&LapoConfig::default());
        assert_close(out.action.loss, -1.057598, "L_action");
        assert_close(out.end.loss, -1.105171, "L_end");
        assert_close(out.latent.loss, -0.865022, "L_latent");
        // (56 * -1.057598 - 1.105171) / 57 + 0.1 * -0.865022 = -1.058432 - 0.086502.
        assert_close(out.policy, -1.144935, "policy, defaults");
        let config = LapoConfig {
            w_action: 2.0,
            w_end: 4.0,
            w_latent: 0.5,
            ..Default::default()
        };
        // 2 * (56 * -1.057598 + 4 * -1.105171) / 60 + 0.5 * -0.865022
        // = 2 * -63.646154 / 60 - 0.432511 = -2.121538 - 0.432511.
        let out = f.loss(&config);
        assert_close(out.policy, -2.554050, "policy, weights 2 / 4 / 0.5");
        assert_close(out.loss.double_value(&[]), -2.554050, "loss (value 0)");
    }

    #[test]
    fn value_loss_is_clipped_around_the_old_value() {
        let mut f = Fixture::neutral(&[0.0, 0.0], 2, 1, 1);
        f.values = tensor(&[0.5, 0.5], &[2]).set_requires_grad(true);
        f.old_values = tensor(&[0.0, 0.0], &[2]);
        f.returns = tensor(&[1.0, 0.0], &[2]);
        let out = f.loss(&LapoConfig::default());
        // Decision 0: (0.5 - 1)^2 = 0.25 < (clip(0.5, -0.2, 0.2) - 1)^2 = 0.64: 0.32.
        // Decision 1: (0.5 - 0)^2 = 0.25 > (0.2 - 0)^2 = 0.04: 0.125.
        assert_close(out.value, (0.32 + 0.125) / 2.0, "value");
        assert_close(out.value_clipfrac, 0.5, "value clipfrac");
        assert_close(out.policy, 0.0, "policy (A = 0)");
        assert_close(out.loss.double_value(&[]), 0.2225, "loss");
        out.loss.backward();
        // The clipped branch holds decision 0 (no gradient); decision 1:
        // d/dv 0.5 (v - R)^2 / 2 = (v - R) / 2 = 0.25.
        let grad = Vec::<f32>::try_from(f.values.grad()).unwrap();
        assert_close(f64::from(grad[0]), 0.0, "value grad, clipped");
        assert_close(f64::from(grad[1]), 0.25, "value grad, unclipped");

        let config = LapoConfig {
            value_clip: 1.0,
            value_coef: 0.5,
            ..Default::default()
        };
        // clip(0.5, -1, 1) = 0.5: both decisions 0.5 * 0.25 = 0.125; weighted 0.5.
        let out = f.loss(&config);
        assert_close(out.value, 0.125, "value, clip 1");
        assert_close(out.value_clipfrac, 0.0, "value clipfrac, clip 1");
        assert_close(out.loss.double_value(&[]), 0.0625, "loss, value_coef 0.5");
    }

    #[test]
    fn new_equal_to_old_gives_ratio_one() {
        let f = Fixture::neutral(&[1.0, -2.0], 4, 3, 5);
        let out = f.loss(&LapoConfig::default());
        assert_eq!(out.latent_ratio, 1.0);
        // Every surrogate: (-1 * 1 + 2 * 1) / 2 = 0.5, nothing clipped.
        for (term, name) in [
            (out.action, "action"),
            (out.end, "end"),
            (out.latent, "latent"),
        ] {
            assert_close(term.loss, 0.5, name);
            assert_eq!(
                (term.clipfrac, term.clipfrac_lower, term.approx_kl),
                (0.0, 0.0, 0.0),
                "{name}"
            );
        }
        // (4 * 0.5 + 0.5) / 5 + 0.1 * 0.5.
        assert_close(out.policy, 0.55, "policy");
        assert_close(out.value, 0.0, "value");
    }

    #[test]
    fn gradients_reach_the_new_latents_logprobs_and_values() {
        let mut f = Fixture::neutral(&[1.0], 2, 2, 2);
        f.action = f.old_action.copy().set_requires_grad(true);
        f.end = f.old_end.copy().set_requires_grad(true);
        f.latents = Tensor::zeros([1, 2, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        f.old_latents = tensor(&[1.0, 0.0, 4.0, 4.0], &[1, 2, 2]);
        f.latent_mask = tensor(&[1.0, 0.0], &[1, 2]);
        f.values = tensor(&[0.5], &[1]).set_requires_grad(true);
        f.old_values = tensor(&[0.5], &[1]);
        f.returns = tensor(&[0.0], &[1]);
        let config = LapoConfig {
            latent_sigma: 1.0,
            ..Default::default()
        };
        let out = f.loss(&config);
        out.loss.backward();
        let grad = |t: &Tensor| Vec::<f32>::try_from(t.grad().view([-1])).unwrap();
        // Action tokens at r = 1, A = 1: -1 * w_action * n / (n + w_end) = -2 / 3 each.
        for g in grad(&f.action) {
            assert_close(f64::from(g), -2.0 / 3.0, "action token grad");
        }
        // End: -1 * w_end / (n + w_end) = -1 / 3.
        assert_close(f64::from(grad(&f.end)[0]), -1.0 / 3.0, "end grad");
        // Latent: log r = -0.5 * 1 / 1 = -0.5, r = 0.606531 (A = 1: unclipped);
        // d/dz_new = w_latent * -A * r * (z_old - z_new) / sigma^2 = 0.1 * -0.606531 * [1, 0];
        // the unchosen slot gets none.
        let latent = grad(&f.latents);
        assert_close(f64::from(latent[0]), -0.0606531, "latent grad");
        assert_eq!(&latent[1..], &[0.0, 0.0, 0.0]);
        // Value: v - R = 0.5.
        assert_close(f64::from(grad(&f.values)[0]), 0.5, "value grad");
    }

    #[test]
    fn micro_batches_sum_to_the_mini_batch_loss() {
        let mut f = Fixture::neutral(&[1.0, -0.5, 7.0, -2.0], 3, 2, 2);
        f.action = tensor(
            &[
                -0.1, -0.2, -0.3, -0.5, -0.4, -0.2, -1.0, -1.0, -1.0, -0.1, -0.1, -0.1,
            ],
            &[4, 3],
        );
        f.end = tensor(&[-0.6, -0.3, -5.0, -1.5], &[4]);
        f.latents = f.old_latents.shallow_clone() + tensor(&[0.5, -1.0, 3.0, 0.0], &[4, 1, 1]);
        f.latent_mask = tensor(&[1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0], &[4, 2]);
        f.values = tensor(&[0.3, -0.1, 9.0, 0.9], &[4]);
        f.returns = tensor(&[1.0, -0.5, 9.0, 0.2], &[4]);
        f.mask = tensor(&[1.0, 1.0, 0.0, 1.0], &[4]);
        let ppo = PpoConfig::default();
        let config = LapoConfig::default();
        let whole = f.run(&ppo, &config, 3.0);
        let first = f.narrow(0, 2).run(&ppo, &config, 3.0);
        let second = f.narrow(2, 2).run(&ppo, &config, 3.0);
        let sums = |o: &LapoLoss| {
            let mut v = vec![
                o.loss.double_value(&[]),
                o.policy,
                o.value,
                o.value_clipfrac,
                o.latent_ratio,
            ];
            for t in [o.action, o.end, o.latent] {
                v.extend([t.loss, t.clipfrac, t.clipfrac_lower, t.approx_kl]);
            }
            v
        };
        for (i, ((w, a), b)) in sums(&whole)
            .into_iter()
            .zip(sums(&first))
            .zip(sums(&second))
            .enumerate()
        {
            assert_close(a + b, w, &format!("metric {i}"));
        }
        // The padding decision (row 2) does not count, whatever it holds.
        let mut padded = f.narrow(0, 4);
        padded.advantages = tensor(&[1.0, -0.5, -100.0, -2.0], &[4]);
        padded.values = tensor(&[0.3, -0.1, -40.0, 0.9], &[4]);
        let padded = padded.run(&ppo, &config, 3.0);
        assert_close(
            padded.loss.double_value(&[]),
            whole.loss.double_value(&[]),
            "padding",
        );
    }

    #[test]
    fn config_defaults_are_the_scripts_and_errors_name_the_key() {
        let defaults = LapoConfig::default();
        assert_eq!(
            (
                defaults.latent_sigma,
                defaults.w_action,
                defaults.w_end,
                defaults.w_latent
            ),
            (10.0, 1.0, 1.0, 0.1)
        );
        assert_eq!((defaults.value_clip, defaults.value_coef), (0.2, 1.0));
        // The value head's own optimiser at 10x the policy's rate (LaST-R1's
        // value_head_lr 3e-4 against lr 3e-5); shared: one rate.
        assert_eq!(defaults.critic_optim, CriticOptim::Own);
        assert_eq!(defaults.value_lr_factor(), 10.0);
        let shared: LapoConfig = serde_json::from_str(r#"{"critic_optim": "shared"}"#).unwrap();
        assert_eq!(shared.value_lr_factor(), 1.0);
        shared.check().unwrap();
        defaults.check().unwrap();
        let parsed: LapoConfig = serde_json::from_str(r#"{"latent_sigma": 5}"#).unwrap();
        assert_eq!(
            parsed,
            LapoConfig {
                latent_sigma: 5.0,
                ..Default::default()
            }
        );
        assert!(serde_json::from_str::<LapoConfig>(r#"{"sigma": 5}"#).is_err());
        let cases: [(LapoConfig, &str); 11] = [
            (
                LapoConfig {
                    value_lr_scale: 0.0,
                    ..defaults.clone()
                },
                "lapo.value_lr_scale",
            ),
            (
                LapoConfig {
                    critic_optim: CriticOptim::Shared,
                    value_lr_scale: 5.0,
                    ..defaults.clone()
                },
                "lapo.value_lr_scale",
            ),
            (
                LapoConfig {
                    latent_sigma: 0.0,
                    ..defaults.clone()
                },
                "lapo.latent_sigma",
            ),
            (
                LapoConfig {
                    latent_sigma: -1.0,
                    ..defaults.clone()
                },
                "lapo.latent_sigma",
            ),
            (
                LapoConfig {
                    latent_sigma: f64::NAN,
                    ..defaults.clone()
                },
                "lapo.latent_sigma",
            ),
            (
                LapoConfig {
                    latent_sigma: f64::INFINITY,
                    ..defaults.clone()
                },
                "lapo.latent_sigma",
            ),
            (
                LapoConfig {
                    w_action: -1.0,
                    ..defaults.clone()
                },
                "lapo.w_action",
            ),
            (
                LapoConfig {
                    w_end: -0.5,
                    ..defaults.clone()
                },
                "lapo.w_end",
            ),
            (
                LapoConfig {
                    w_latent: -0.1,
                    ..defaults.clone()
                },
                "lapo.w_latent",
            ),
            (
                LapoConfig {
                    value_clip: -0.2,
                    ..defaults.clone()
                },
                "lapo.value_clip",
            ),
            (
                LapoConfig {
                    value_coef: f64::NAN,
                    ..defaults.clone()
                },
                "lapo.value_coef",
            ),
        ];
        for (config, key) in cases {
            let error = config.check().unwrap_err();
            assert!(
                matches!(&error, embodyflow_core::Error::BadValue { key: k, .. } if k == key),
                "{key}: {error}"
            );
        }
        // Zero weights and a zero clip are allowed (a term switched off).
        let zeros = LapoConfig {
            w_end: 0.0,
            w_latent: 0.0,
            value_clip: 0.0,
            value_coef: 0.0,
            ..defaults
        };
        zeros.check().unwrap();
    }

    #[test]
    fn bad_shapes_and_decisions_are_errors() {
        let mut f = Fixture::one_latent_decision(3);
        f.latent_mask = tensor(&[1.0, 1.0], &[1, 2]);
        let error = lapo_loss(
            &f.batch(),
            &PpoConfig::default(),
            &LapoConfig::default(),
            1.0,
        )
        .err()
        .unwrap();
        assert_eq!(
            error,
            LapoError::Shape {
                input: "latent_mask",
                expected: "[1, 3]".into(),
                found: vec![1, 2],
            }
        );
        assert!(error.to_string().contains("latent_mask"), "{error}");
        let mut f = Fixture::neutral(&[1.0, 1.0], 3, 2, 2);
        f.returns = tensor(&[1.0], &[1]);
        let error = lapo_loss(
            &f.batch(),
            &PpoConfig::default(),
            &LapoConfig::default(),
            2.0,
        )
        .err()
        .unwrap();
        assert!(matches!(
            error,
            LapoError::Shape {
                input: "returns",
                ..
            }
        ));
        let f = Fixture::neutral(&[1.0], 3, 2, 2);
        for decisions in [0.0, -1.0, f64::NAN] {
            let result = lapo_loss(
                &f.batch(),
                &PpoConfig::default(),
                &LapoConfig::default(),
                decisions,
            );
            assert!(matches!(result, Err(LapoError::Decisions(_))));
        }
    }

    #[test]
    fn explained_variance_by_hand() {
        let returns = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(explained_variance(&returns, &returns), Some(1.0));
        assert_eq!(explained_variance(&[0.0; 4], &returns), Some(0.0));
        // R - v = [0, -1, 0, 1]: Var = 0.5; Var(R) = 1.25; 1 - 0.5 / 1.25 = 0.6.
        let ev = explained_variance(&[1.0, 3.0, 3.0, 3.0], &returns).unwrap();
        assert_close(ev, 0.6, "explained variance");
        assert_eq!(explained_variance(&[0.0, 1.0, 2.0], &[2.0, 2.0, 2.0]), None);
        assert_eq!(explained_variance(&[1.0], &[1.0]), None);
        assert_eq!(explained_variance(&[1.0, 2.0], &[1.0, 2.0, 3.0]), None);
    }
}
