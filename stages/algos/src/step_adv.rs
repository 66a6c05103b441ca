//! Step advantages inside one response (grpo_step) and StepOPSD reweighting.
//!
//! **grpo_step**: `A_token = A^E + omega * A^S_token`, A^S non-zero only on the
//! `credit_target` tokens of plan steps (see [`crate::spans`]):
//! - `rule`: A^S = +1 on a step that matches the ground truth, -1 on one that
//!   does not ([`rule_step_scores`]);
//! - `forward_proxy`: from the per-token contrast `d_t = teacher_logp_t -
//!   student_logp_t` over a step's `score_source` tokens
//!   ([`forward_proxy_step_scores`]): `squash = contrast` gives
//!   `tanh(robust_mean(d) / score_tau)`, `squash = prob` gives
//!   `2 exp(mean teacher_logp) - 1`; steps with fewer than `min_score_tokens`
//!   score tokens get 0; `score_norm = per_response` first turns the raw step
//!   scores of a response into z-scores `(x - mean) / (std + 1e-6)` over its
//!   scored steps (when it has at least two). Every score is clamped to [-1, 1].
//!
//! `robust_mean` is the 10 % trimmed mean: the values are sorted and
//! `floor(0.1 n)` are dropped at each end before averaging (the plain mean
//! below 10 values).
//!
//! **StepOPSD** (sign-preserving multiplicative baseline): per token
//! `w = clip(2 sigmoid(sign(A) * Delta), 1 - alpha_clip, 1 + alpha_clip)` and
//! `A~ = (1 - lambda_mix) A + lambda_mix * w * A`, with Delta the teacher -
//! student log-prob gap on step tokens and 0 elsewhere (so w = 1 there).
//! Since w > 0, A~ has the sign of A.
//!
//! ```
//! use embodyflow_algos::step_adv::{robust_mean, stepopsd};
//! assert_eq!(robust_mean(&[1.0, 2.0, 3.0]), 2.0);
//! let a = stepopsd(-0.5, 3.0, 0.2, 1.0); // w = clip(2 sigmoid(-3)) = 0.8
//! assert!((a - -0.4).abs() < 1e-6);
//! ```

use serde::{Deserialize, Serialize};

/// How forward_proxy turns a step's log-probs into a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Squash {
    /// `tanh(robust_mean(teacher - student) / score_tau)`.
    Contrast,
    /// `2 exp(mean teacher_logp) - 1`.
    Prob,
}

/// Normalisation of raw step scores within a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreNorm {
    /// Raw scores.
    None,
    /// z-scores over the response's scored steps.
    PerResponse,
}

/// forward_proxy settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProxyParams {
    /// Squash.
    pub squash: Squash,
    /// Temperature of the tanh.
    pub score_tau: f32,
    /// Normalisation within the response.
    pub score_norm: ScoreNorm,
    /// Steps with fewer score tokens get 0.
    pub min_score_tokens: usize,
}

/// The 10 % trimmed mean (plain mean below 10 values); 0 for no values.
pub fn robust_mean(values: &[f32]) -> f32 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let cut = if sorted.len() >= 10 {
        sorted.len() / 10
    } else {
        0
    };
    let kept = &sorted[cut..sorted.len() - cut];
    kept.iter().map(|&v| f64::from(v)).sum::<f64>() as f32 / kept.len() as f32
}

/// Rule step scores: +1 for a matched step, -1 otherwise.
pub fn rule_step_scores(step_match: &[i8]) -> Vec<f32> {
    step_match
        .iter()
        .map(|&m| if m == 1 { 1.0 } else { -1.0 })
        .collect()
}

/// forward_proxy step scores from per-token teacher and student log-probs;
/// `score_tokens[k]` are step k's score-source token indices.
pub fn forward_proxy_step_scores(
    teacher: &[f32],
    student: &[f32],
    score_tokens: &[Vec<usize>],
    params: ProxyParams,
) -> Vec<f32> {
    let scored: Vec<bool> = score_tokens
        .iter()
        .map(|t| t.len() >= params.min_score_tokens.max(1))
        .collect();
    let mut raw: Vec<f32> = score_tokens
        .iter()
        .map(|tokens| match params.squash {
            Squash::Contrast => robust_mean(
                &tokens
                    .iter()
                    .map(|&t| teacher[t] - student[t])
                    .collect::<Vec<_>>(),
            ),
            Squash::Prob => {
                let mean = tokens.iter().map(|&t| f64::from(teacher[t])).sum::<f64>()
                    / tokens.len().max(1) as f64;
                mean as f32
            }
        })
        .collect();
    if params.score_norm == ScoreNorm::PerResponse && params.squash == Squash::Contrast {
        let values: Vec<f64> = raw
            .iter()
            .zip(&scored)
            .filter(|(_, s)| **s)
            .map(|(&r, _)| f64::from(r))
            .collect();
        if values.len() >= 2 {
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>()
                / values.len() as f64)
                .sqrt();
            for r in &mut raw {
                *r = ((f64::from(*r) - mean) / (std + 1e-6)) as f32;
            }
        }
    }
    raw.iter()
        .zip(&scored)
        .map(|(&r, &s)| {
            if !s {
                return 0.0;
            }
            let score = match params.squash {
                Squash::Contrast => (r / params.score_tau).tanh(),
                Squash::Prob => 2.0 * r.exp() - 1.0,
            };
            score.clamp(-1.0, 1.0)
        })
        .collect()
}

/// A^S per token: each step's score written onto its credit-target tokens.
pub fn spread_step_scores(
    num_tokens: usize,
    credit_tokens: &[Vec<usize>],
    scores: &[f32],
) -> Vec<f32> {
    let mut step_adv = vec![0f32; num_tokens];
    for (tokens, &score) in credit_tokens.iter().zip(scores) {
        for &t in tokens {
            step_adv[t] = score;
        }
    }
    step_adv
}

/// StepOPSD's sign-preserving reweighting of one token's advantage.
pub fn stepopsd(advantage: f32, delta: f32, alpha_clip: f32, lambda_mix: f32) -> f32 {
    let sign = if advantage > 0.0 {
        1.0
    } else if advantage < 0.0 {
        -1.0
    } else {
        0.0
    };
    let w = (2.0 / (1.0 + (-sign * delta).exp())).clamp(1.0 - alpha_clip, 1.0 + alpha_clip);
    (1.0 - lambda_mix) * advantage + lambda_mix * w * advantage
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(squash: Squash) -> ProxyParams {
        ProxyParams {
            squash,
            score_tau: 1.0,
            score_norm: ScoreNorm::None,
            min_score_tokens: 1,
        }
    }

    #[test]
    fn trimmed_mean_drops_the_tails() {
        let mut values: Vec<f32> = (1..=10).map(|v| v as f32).collect();
        values[9] = 1000.0;
        // 10 values: drop 1 at each end -> mean of 2..=9 = 5.5
        assert_eq!(robust_mean(&values), 5.5);
        assert_eq!(robust_mean(&[]), 0.0);
    }

    #[test]
    fn contrast_and_prob_by_hand() {
        let teacher = [-0.1, -0.2, -3.0, -0.5];
        let student = [-1.1, -1.2, -1.0, -0.5];
        let tokens = vec![vec![0, 1], vec![2], vec![3], vec![]];
        let s = forward_proxy_step_scores(&teacher, &student, &tokens, params(Squash::Contrast));
        assert!((s[0] - 1f32.tanh()).abs() < 1e-6);
        assert!((s[1] - (-2f32).tanh()).abs() < 1e-6);
        assert_eq!(s[2], 0.0);
        assert_eq!(s[3], 0.0, "no score tokens, no score");
        let p = forward_proxy_step_scores(&teacher, &student, &tokens, params(Squash::Prob));
        assert!((p[0] - (2.0 * (-0.15f32).exp() - 1.0)).abs() < 1e-6);
        let min2 = ProxyParams {
            min_score_tokens: 2,
            ..params(Squash::Contrast)
        };
        assert_eq!(
            forward_proxy_step_scores(&teacher, &student, &tokens, min2)[1],
            0.0
        );
    }

    #[test]
    fn per_response_norm_centres_the_steps() {
        let teacher = [0.0, 1.0, 2.0];
        let student = [0.0, 0.0, 0.0];
        let tokens = vec![vec![0], vec![1], vec![2]];
        let norm = ProxyParams {
            score_norm: ScoreNorm::PerResponse,
            ..params(Squash::Contrast)
        };
        let s = forward_proxy_step_scores(&teacher, &student, &tokens, norm);
        assert!(s[1].abs() < 1e-6);
        assert!((s[0] + s[2]).abs() < 1e-6 && s[2] > 0.0);
    }

    #[test]
    fn rule_and_spread() {
        let scores = rule_step_scores(&[1, 0, 1]);
        assert_eq!(scores, vec![1.0, -1.0, 1.0]);
        let adv = spread_step_scores(6, &[vec![1], vec![2, 3], vec![]], &scores);
        assert_eq!(adv, vec![0.0, 1.0, -1.0, -1.0, 0.0, 0.0]);
    }

    #[test]
    fn stepopsd_by_hand() {
        // Delta 0 leaves A alone; a large supporting gap scales by 1 + alpha.
        assert_eq!(stepopsd(0.7, 0.0, 0.2, 0.5), 0.7);
        assert!((stepopsd(1.0, 50.0, 0.2, 1.0) - 1.2).abs() < 1e-6);
        assert!((stepopsd(1.0, -50.0, 0.2, 0.5) - (0.5 + 0.5 * 0.8)).abs() < 1e-6);
        assert_eq!(stepopsd(0.0, 5.0, 0.2, 0.5), 0.0);
    }

    proptest! {
        #[test]
        fn stepopsd_never_changes_the_sign(a in -10.0f32..10.0, delta in -30.0f32..30.0, alpha in 0.0f32..0.99, lambda in 0.0f32..1.0) {
            let out = stepopsd(a, delta, alpha, lambda);
            prop_assert!(a == 0.0 || (out.signum() == a.signum() && out != 0.0), "{a} -> {out}");
        }

        #[test]
        fn proxy_scores_stay_in_range(
            pairs in proptest::collection::vec((-20.0f32..0.0, -20.0f32..0.0), 1..30),
            tau in 0.05f32..5.0,
        ) {
            let (teacher, student): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
            let tokens: Vec<Vec<usize>> = (0..teacher.len()).map(|t| vec![t]).collect();
            for squash in [Squash::Contrast, Squash::Prob] {
                for score_norm in [ScoreNorm::None, ScoreNorm::PerResponse] {
                    let p = ProxyParams { squash, score_tau: tau, score_norm, min_score_tokens: 1 };
                    for s in forward_proxy_step_scores(&teacher, &student, &tokens, p) {
                        prop_assert!((-1.0..=1.0).contains(&s));
                    }
                }
            }
        }
    }
}
