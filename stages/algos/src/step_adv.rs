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
//! **Gates** scale each step's A^S:
//! - `residual_contrast` (forward_proxy): with `d'_t = d_t - median(d over the
//!   response)`, per step k over its score tokens `raw_k = robust_mean(d')`,
//!   `imp_k = robust_mean(|d'|)`; `soft_k = tanh(z(raw)_k / score_tau)`,
//!   `decision_k = sigmoid((z(imp)_k - threshold) / gate_tau)`,
//!   `budget_k = clamp(softmax(imp / budget_tau)_k * num_steps, 0, 1)`,
//!   `confidence_k = len_gate_k * var_gate_k` with `len_gate = 1` when the step
//!   has at least `min_score_tokens` score tokens (else 0) and
//!   `var_gate = 1 / (1 + std(d' over the step's score tokens))`; then
//!   `A^S_k = decision * budget * confidence * soft_k`. `z(x)_k` is the
//!   z-score `(x_k - mean) / (std + 1e-6)` over the response's steps with a
//!   score (x itself for `raw`, and 0 for `imp`, when there is one such step).
//! - `prompt` (a judge's `step_gates` rows): `gate = decision * (1 -
//!   redundancy) * (0.5 + 0.5 * causal)` multiplies the rule or forward_proxy score.
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

/// residual_contrast gate settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateParams {
    /// Importance z-score at which the decision gate is one half.
    pub threshold: f32,
    /// Temperature of the decision sigmoid.
    pub gate_tau: f32,
    /// Temperature of the budget softmax.
    pub budget_tau: f32,
}

fn median(values: &[f32]) -> f32 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        0.5 * (sorted[mid - 1] + sorted[mid])
    }
}

fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    (
        mean,
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt(),
    )
}

/// z-scores of `values` at the positions in `scored`; `single` for a lone one.
fn z_scores(values: &[f32], scored: &[bool], single: impl Fn(f32) -> f32) -> Vec<f32> {
    let picked: Vec<f64> = values
        .iter()
        .zip(scored)
        .filter(|(_, s)| **s)
        .map(|(&v, _)| f64::from(v))
        .collect();
    if picked.len() < 2 {
        return values.iter().map(|&v| single(v)).collect();
    }
    let (mean, std) = mean_std(&picked);
    values
        .iter()
        .map(|&v| ((f64::from(v) - mean) / (std + 1e-6)) as f32)
        .collect()
}

/// Step scores under the residual_contrast gate (see the module doc).
pub fn residual_contrast_step_scores(
    teacher: &[f32],
    student: &[f32],
    score_tokens: &[Vec<usize>],
    params: ProxyParams,
    gate: GateParams,
) -> Vec<f32> {
    let d: Vec<f32> = teacher.iter().zip(student).map(|(t, s)| t - s).collect();
    let center = median(&d);
    let residual: Vec<Vec<f32>> = score_tokens
        .iter()
        .map(|tokens| tokens.iter().map(|&t| d[t] - center).collect())
        .collect();
    let scored: Vec<bool> = score_tokens
        .iter()
        .map(|t| !t.is_empty() && t.len() >= params.min_score_tokens)
        .collect();
    let raw: Vec<f32> = residual.iter().map(|r| robust_mean(r)).collect();
    let importance: Vec<f32> = residual
        .iter()
        .map(|r| robust_mean(&r.iter().map(|x| x.abs()).collect::<Vec<_>>()))
        .collect();
    let z_raw = z_scores(&raw, &scored, |v| v);
    let z_imp = z_scores(&importance, &scored, |_| 0.0);
    let scored_count = scored.iter().filter(|s| **s).count();
    let max_imp = importance
        .iter()
        .zip(&scored)
        .filter(|(_, s)| **s)
        .map(|(&i, _)| i)
        .fold(f32::MIN, f32::max);
    let exp: Vec<f64> = importance
        .iter()
        .zip(&scored)
        .map(|(&i, &s)| {
            if s {
                f64::from((i - max_imp) / gate.budget_tau).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = exp.iter().sum();
    (0..score_tokens.len())
        .map(|k| {
            if !scored[k] {
                return 0.0;
            }
            let soft = (z_raw[k] / params.score_tau).tanh();
            let decision = 1.0 / (1.0 + (-(z_imp[k] - gate.threshold) / gate.gate_tau).exp());
            let budget = ((exp[k] / total) * scored_count as f64).clamp(0.0, 1.0) as f32;
            let (_, std) = mean_std(
                &residual[k]
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect::<Vec<_>>(),
            );
            let confidence = 1.0 / (1.0 + std as f32);
            (decision * budget * confidence * soft).clamp(-1.0, 1.0)
        })
        .collect()
}

/// The prompt gate of one step from a judge's gates.
pub fn prompt_gate(decision: f32, redundancy: f32, causal: f32) -> f32 {
    decision * (1.0 - redundancy) * (0.5 + 0.5 * causal)
}

/// Mean, standard deviation and the 10th, 50th and 90th percentiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Number of values.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// 10th percentile (nearest rank).
    pub p10: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
}

impl Distribution {
    /// Summarises `values`.
    pub fn of(values: &[f32]) -> Distribution {
        if values.is_empty() {
            return Distribution::default();
        }
        let mut sorted: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        sorted.sort_by(f64::total_cmp);
        let rank =
            |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        let (mean, std) = mean_std(&sorted);
        Distribution {
            count: sorted.len(),
            mean,
            std,
            p10: rank(0.1),
            p50: rank(0.5),
            p90: rank(0.9),
        }
    }
}

/// Area under the ROC curve of `scores` separating `positives` from
/// `negatives`: P(positive > negative) + P(equal) / 2 (Mann-Whitney), `None`
/// when either class is empty.
pub fn auc(positives: &[f32], negatives: &[f32]) -> Option<f64> {
    if positives.is_empty() || negatives.is_empty() {
        return None;
    }
    let mut all: Vec<(f32, bool)> = positives
        .iter()
        .map(|&v| (v, true))
        .chain(negatives.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the positives' (average) ranks.
    let mut rank_sum = 0f64;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let average_rank = (i + j + 1) as f64 / 2.0; // ranks i+1..=j
        rank_sum += average_rank * all[i..j].iter().filter(|(_, p)| *p).count() as f64;
        i = j;
    }
    let (p, n) = (positives.len() as f64, negatives.len() as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// grpo_step's token advantages: `A_t = A^E + omega * A^S_t`.
pub fn combine(episode_adv: f32, omega: f32, step_adv: &[f32]) -> Vec<f32> {
    step_adv.iter().map(|&s| episode_adv + omega * s).collect()
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

    #[test]
    fn residual_contrast_by_hand() {
        // Response median of d is 0; step 0 is strongly supported on two tokens,
        // step 1 mildly opposed, step 2 has one token (below min_score_tokens = 2).
        let student = [0.0f32; 7];
        let teacher = [2.0, 2.0, -0.5, -0.5, 0.0, 0.0, 9.0];
        let tokens = vec![vec![0, 1], vec![2, 3], vec![6]];
        let params = ProxyParams {
            squash: Squash::Contrast,
            score_tau: 1.0,
            score_norm: ScoreNorm::None,
            min_score_tokens: 2,
        };
        let gate = GateParams {
            threshold: 0.0,
            gate_tau: 1.0,
            budget_tau: 1.0,
        };
        let s = residual_contrast_step_scores(&teacher, &student, &tokens, params, gate);
        assert_eq!(s[2], 0.0);
        // Two scored steps: z(raw) = +-1, z(imp) = +-1; budget = softmax([2, .5]) * 2 clamped.
        let budget0 = ((2f64.exp() / (2f64.exp() + 0.5f64.exp())) * 2.0).min(1.0) as f32;
        let budget1 = ((0.5f64.exp() / (2f64.exp() + 0.5f64.exp())) * 2.0).min(1.0) as f32;
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        let expected0 = sigmoid(1.0) * budget0 * 1.0 * (1.0f32).tanh();
        let expected1 = sigmoid(-1.0) * budget1 * 1.0 * (-1.0f32).tanh();
        assert!((s[0] - expected0).abs() < 1e-4, "{s:?} vs {expected0}");
        assert!((s[1] - expected1).abs() < 1e-4, "{s:?} vs {expected1}");
    }

    #[test]
    fn prompt_gate_by_hand() {
        assert_eq!(prompt_gate(1.0, 0.0, 1.0), 1.0);
        assert_eq!(prompt_gate(1.0, 0.0, 0.0), 0.5);
        assert_eq!(prompt_gate(0.8, 0.5, 1.0), 0.4);
        assert_eq!(prompt_gate(1.0, 1.0, 1.0), 0.0);
    }

    #[test]
    fn auc_and_distribution_by_hand() {
        assert_eq!(auc(&[3.0, 4.0], &[1.0, 2.0]), Some(1.0));
        assert_eq!(auc(&[1.0, 2.0], &[3.0, 4.0]), Some(0.0));
        assert_eq!(auc(&[1.0], &[1.0]), Some(0.5));
        assert_eq!(auc(&[2.0, 0.0], &[1.0]), Some(0.5));
        assert_eq!(auc(&[], &[1.0]), None);
        let d = Distribution::of(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!(
            (d.count, d.mean, d.p10, d.p50, d.p90),
            (10, 5.5, 1.0, 5.0, 9.0)
        );
    }

    proptest! {
        #[test]
        fn omega_zero_is_plain_grpo_bit_for_bit(
            episode in -10.0f32..10.0,
            step in proptest::collection::vec(-1.0f32..=1.0, 0..64),
        ) {
            let combined = combine(episode, 0.0, &step);
            prop_assert!(combined.iter().all(|a| a.to_bits() == episode.to_bits()));
        }

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
