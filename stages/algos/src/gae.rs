//! Generalised advantage estimation (Schulman et al. 2016) and veRL's masked
//! whitening.
//!
//! Over the positions t of one sequence, with V after the last position = 0:
//!
//! ```text
//! delta_t = r_t + gamma * V_{t+1} - V_t
//! A_t     = delta_t + gamma * lambda * A_{t+1}
//! returns = A + V                     (before whitening)
//! A      <- (A - mean) * rsqrt(var + 1e-8)   over every position of the batch
//! ```
//!
//! **Token level** ([`gae_tokens`]) is veRL's `compute_gae_advantage_return`
//! (`verl/trainer/ppo/core_algos.py`) on rows without masked positions: one
//! row per trajectory (its steps' response tokens in order), the outcome reward
//! on the last token. **Decision level** ([`gae_decisions`], LaST-R1) uses one
//! value per decision step and the outcome reward on the last step; each
//! step's advantage is then broadcast to its response tokens by the caller.
//! [`whiten`] is veRL's `masked_whiten` with every position valid: the mean
//! divides by `n + 1e-8`, the variance is the unbiased masked variance, and
//! fewer than two positions is an error rather than a NaN.
//!
//! ```
//! use embodyflow_algos::gae::{gae_tokens, GaeParams};
//! // One row of two tokens, reward 1 on the last, values 0.5 and 0.25.
//! let (adv, ret) = gae_tokens(&[0.0, 1.0], &[0.5, 0.25], &[0, 2], GaeParams { gamma: 1.0, lam: 1.0 });
//! assert_eq!(adv, vec![0.5, 0.75]); // A_1 = 1 - 0.25; A_0 = 0.25 - 0.5 + 0.75
//! assert_eq!(ret, vec![1.0, 1.0]);
//! ```

use crate::AlgoError;

/// Discount and GAE lambda.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaeParams {
    /// Discount gamma.
    pub gamma: f32,
    /// GAE lambda.
    pub lam: f32,
}

impl Default for GaeParams {
    fn default() -> Self {
        GaeParams {
            gamma: 0.99,
            lam: 0.95,
        }
    }
}

/// GAE over ragged rows: row r spans `offsets[r]..offsets[r + 1]` of
/// `rewards` and `values`. Returns (advantages, returns), both unwhitened.
pub fn gae_tokens(
    rewards: &[f32],
    values: &[f32],
    offsets: &[usize],
    params: GaeParams,
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    assert_eq!(
        offsets.last().copied().unwrap_or(0),
        rewards.len(),
        "offsets cover the rows"
    );
    let mut advantages = vec![0f32; rewards.len()];
    let mut returns = vec![0f32; rewards.len()];
    let (gamma, decay) = (params.gamma, params.gamma * params.lam);
    for row in offsets.windows(2) {
        let (r, v) = (&rewards[row[0]..row[1]], &values[row[0]..row[1]]);
        let a = &mut advantages[row[0]..row[1]];
        let Some(last) = r.len().checked_sub(1) else {
            continue;
        };
        // Pass 1 (vectorisable): the TD errors, V after the last position = 0.
        for t in 0..last {
            a[t] = r[t] + gamma * v[t + 1] - v[t];
        }
        a[last] = r[last] - v[last];
        // Pass 2: the only serial part, A_t = delta_t + gamma * lambda * A_{t+1}.
        let mut running = 0f32;
        for x in a.iter_mut().rev() {
            running = *x + decay * running;
            *x = running;
        }
        // Pass 3 (vectorisable): returns = A + V.
        for ((ret, &adv), &value) in returns[row[0]..row[1]].iter_mut().zip(a.iter()).zip(v) {
            *ret = adv + value;
        }
    }
    (advantages, returns)
}

/// Decision-level GAE: one value per step, `rewards[t]` per step (the outcome
/// on the last step of each trajectory). Same recurrence as [`gae_tokens`].
pub fn gae_decisions(
    rewards: &[f32],
    values: &[f32],
    offsets: &[usize],
    params: GaeParams,
) -> (Vec<f32>, Vec<f32>) {
    gae_tokens(rewards, values, offsets, params)
}

/// veRL's `masked_whiten` with every position valid, in place.
pub fn whiten(values: &mut [f32]) -> Result<(), AlgoError> {
    let n = values.len();
    if n < 2 {
        return Err(AlgoError::TooFewToWhiten(n));
    }
    let count = n as f64;
    let mean = sum_f64(values.iter().map(|&v| f64::from(v))) / (count + 1e-8);
    let centred_sq =
        sum_f64(values.iter().map(|&v| (f64::from(v) - mean).powi(2))) / (count + 1e-8);
    let variance = centred_sq * count / (count - 1.0);
    let scale = (1.0 / (variance + 1e-8).sqrt()) as f32;
    let mean = mean as f32;
    for v in values.iter_mut() {
        *v = (*v - mean) * scale;
    }
    Ok(())
}

/// Sum in f64 over 8 interleaved accumulators, so the compiler can vectorise it.
fn sum_f64(values: impl Iterator<Item = f64>) -> f64 {
    let mut lanes = [0f64; 8];
    for (i, v) in values.enumerate() {
        lanes[i % 8] += v;
    }
    lanes.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hand_computed_two_rows() {
        // gamma 0.5, lambda 0.5: decay 0.25.
        // Row 0: r = [0, 1], V = [0.2, 0.4]
        //   t1: delta = 1 + 0 - 0.4 = 0.6,             A1 = 0.6
        //   t0: delta = 0 + 0.5*0.4 - 0.2 = 0.0,       A0 = 0 + 0.25*0.6 = 0.15
        // Row 1: r = [2], V = [1]: A = 1
        let p = GaeParams {
            gamma: 0.5,
            lam: 0.5,
        };
        let (adv, ret) = gae_tokens(&[0.0, 1.0, 2.0], &[0.2, 0.4, 1.0], &[0, 2, 3], p);
        let expect_adv = [0.15, 0.6, 1.0];
        let expect_ret = [0.35, 1.0, 2.0];
        for i in 0..3 {
            assert!((adv[i] - expect_adv[i]).abs() < 1e-6, "{adv:?}");
            assert!((ret[i] - expect_ret[i]).abs() < 1e-6, "{ret:?}");
        }
    }

    #[test]
    fn whitening_matches_the_formula_and_refuses_one_position() {
        let mut v = [1.0f32, 2.0, 3.0];
        whiten(&mut v).unwrap();
        // mean 2, unbiased var 1: (x - 2) / sqrt(1 + 1e-8)
        for (got, want) in v.iter().zip([-1.0, 0.0, 1.0]) {
            assert!((got - want).abs() < 1e-6, "{v:?}");
        }
        assert_eq!(whiten(&mut [1.0]), Err(AlgoError::TooFewToWhiten(1)));
        assert_eq!(whiten(&mut []), Err(AlgoError::TooFewToWhiten(0)));
    }

    proptest! {
        #[test]
        fn lambda_one_gamma_one_gives_reward_to_go_minus_value(
            rewards in proptest::collection::vec(-2.0f32..2.0, 1..30),
            values in proptest::collection::vec(-2.0f32..2.0, 30),
        ) {
            let n = rewards.len();
            let values = &values[..n];
            let (adv, ret) = gae_tokens(&rewards, values, &[0, n], GaeParams { gamma: 1.0, lam: 1.0 });
            for t in 0..n {
                let to_go: f32 = rewards[t..].iter().sum();
                prop_assert!((adv[t] - (to_go - values[t])).abs() < 1e-4);
                prop_assert!((ret[t] - to_go).abs() < 1e-4);
            }
        }

        #[test]
        fn whitened_values_have_zero_mean_and_unit_unbiased_variance(
            values in proptest::collection::vec(-10.0f32..10.0, 2..200)
        ) {
            let spread = values.iter().cloned().fold(f32::MIN, f32::max) - values.iter().cloned().fold(f32::MAX, f32::min);
            prop_assume!(spread > 1e-2);
            let mut w = values.clone();
            whiten(&mut w).unwrap();
            let n = w.len() as f64;
            let mean = w.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            let var = w.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (n - 1.0);
            prop_assert!(mean.abs() < 1e-4);
            prop_assert!((var - 1.0).abs() < 1e-3);
        }
    }
}
