//! LaST-R1's latent chain of thought (arXiv 2604.28192): a
//! [`Vla`] that "thinks" in continuous latent vectors before it acts, with
//! `<latent_end>` stop candidates and a value head.
//!
//! With `latent = { length = L, group = G }` in the [`VlaConfig`](super::VlaConfig), a
//! decision's sequence gains a latent part between the observation prefix
//! and the action placeholders — LaST-R1's grouped layout, `M = L / G`
//! stop candidates:
//!
//! ```text
//! [ prefix | <latent_start> z_1 … z_G <latent_end> z_{G+1} … z_{2G} <latent_end> … | act_1 … act_{K·D} ]
//!   e.g. L = 8, G = 2: S z1 z2 E z3 z4 E z5 z6 E z7 z8 E   (candidates at 2, 4, 6, 8 latents)
//! ```
//!
//! - **Latents.** `z_i` is the final hidden state (after the last layer
//!   norm) at the position *before* slot `i` — LaST-R1's `pad_abs = start +
//!   g (G + 1) + j − 1` — fed back as slot `i`'s input embedding: latents are
//!   generated autoregressively, one trunk pass each, the latent part
//!   attending causally. A slot's input is its latent rescaled to norm
//!   `√embd` (a layer-normed state's scale), whatever fills it — the
//!   policy's own latents, a rollout's, or the warm-up's target features —
//!   so all arrive at one scale. A rollout adds exploration noise `z_i + s
//!   ε`, `ε ~ N(0, I)` (`noise_std` = s; 0 = the policy's mean).
//! - **Stop.** The `<latent_end>` logit of candidate `m` is `end_head(h)` at
//!   the last latent of group `m` (the position that predicts
//!   `<latent_end>`); the stop distribution is `softmax_m(l_m / T)` over the
//!   `M` candidates. A rollout samples it, and its log-prob under that
//!   distribution is what the rollout stores and the update's ratio
//!   recomputes; greedy evaluation stops at the first candidate whose own
//!   probability of `<latent_end>`, `sigmoid(l_m)`, is at least 0.99, else
//!   at the most probable one (LaST-R1's confidence early exit, which reads
//!   each position's own `p(<latent_end>)`).
//! - **Actions.** The `K × D` placeholders see the prefix, each other and
//!   the latent part up to the chosen `<latent_end>` (the unchosen suffix is
//!   masked, as LaST-R1's attention mask does), decoded in one pass as
//!   without latents.
//! - **Value.** `value_head(h)` at the chosen `<latent_end>`
//!   (`value_choice = latent_end`): the decision-level critic of GAE.
//!
//! A rollout stores every latent (all `L`: the candidates after the chosen
//! stop still enter the stop's softmax), the chosen stop, the stop's and the
//! actions' log-probs and the value; [`Vla::latent_scores`] recomputes them
//! from those in one teacher-forced pass, the pass the rollout's action
//! sampling ran, so under the same weights the log-probs agree.
//!
//! **Warm-up** ([`Vla::warmup_loss`]): target features `z*` (a frozen image
//! encoder's features of future frames) supervise the predicted latents;
//! per row a chosen length `L_b`; `loss = w_latent · mean_{i < L_b} (1 −
//! cos(ẑ_i, z*_i)) + w_end · CE(stop at L_b) + w_action · CE(actions)`, 1 :
//! 0.1 : 1 as LaST-R1's warm-up. LaST-R1 fills the slots with the targets
//! (teacher forcing, `self_forcing = false`), so the actions learn from
//! latents better than those the policy generates when it acts; with
//! `self_forcing` (the default) the slots hold the policy's own one-step
//! predictions instead (a first pass without gradients, teacher-forced on
//! the targets). Measured on the tabletop goal suite (README): both solve
//! 29 of 40 training tasks greedily, and the self-forced policy's sampled
//! episodes succeed 44 of 64 times against 28 of 64.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::vla::{Observation, Vla};
//! let policy = Checkpoint::<Vla>::load_kind("runs/warmup/policy".as_ref(), tch::Device::Cpu).unwrap();
//! let image = vec![0u8; 32 * 32 * 3];
//! let row = Observation { image: &image, height: 32, width: 32, proprio: &[0.0; 5], instruction: &[17, 42] };
//! let out = policy.model.sample_with_latents(&[row], &[7], 1.6, 0.0).unwrap();
//! println!("thought {} latents, value {}", out[0].latent_len, out[0].value);
//! ```

use embodyflow_core::config::ConfigKeys;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::nn::Module;
use tch::{Device, Kind, Tensor};

use super::batch::{Decision, Observation};
pub use super::config::LatentConfig;
use super::error::{VlaError, check_rows, check_temperature};
use super::model::Vla;
use super::scores::{gather_tokens, log_softmax_at, masked_mean, masked_nll};
use crate::policy::{Entropy, arg_max, draw};
use parts::LatentInput;
pub use parts::VALUE_HEAD;

pub(super) mod parts;

/// What one trunk pass over a sequence with a latent part gives.
struct LatentPass {
    /// Final hidden states `[batch, time, embd]`, in the parameters' dtype.
    hidden: Tensor,
    /// The latent each slot predicts `[batch, L, embd]` (the hidden state
    /// before the slot), f32.
    predicted: Tensor,
    /// The `<latent_end>` logit of every candidate `[batch, M]`, f32.
    end_logits: Tensor,
    /// The value at every candidate's `<latent_end>` `[batch, M]`, f32.
    values: Tensor,
}

/// One decision of a thinking policy.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentDecision {
    /// The action chunk.
    pub decision: Decision,
    /// Every latent the policy generated (`L × embd`, slot after slot; the
    /// first `latent_len` are the chosen chain).
    pub latents: Vec<f32>,
    /// The chosen candidate (0-based).
    pub stop: usize,
    /// Latents before the chosen `<latent_end>`: `(stop + 1) × group`.
    pub latent_len: usize,
    /// Log-prob of the chosen stop under `softmax(l / T)` (`T = 1` when greedy).
    pub stop_logprob: f32,
    /// The value head's estimate at the chosen `<latent_end>`.
    pub value: f32,
}

/// What the update recomputes for a batch of stored decisions.
pub struct LatentScores {
    /// Log-prob `[batch, K × D]` of each stored action token under `logits / T`.
    pub token_logprobs: Tensor,
    /// Entropy `[batch, K × D]` of each action token's distribution, as asked.
    pub entropy: Option<Tensor>,
    /// The latents the policy predicts at each slot `[batch, L, embd]`
    /// (teacher-forced on the stored ones).
    pub latents: Tensor,
    /// Log-prob `[batch]` of each row's stored stop.
    pub stop_logprobs: Tensor,
    /// The value head `[batch]` at each row's stored stop.
    pub values: Tensor,
}

/// The warm-up loss's weights (LaST-R1: 1 : 0.1 : 1) and what fills the
/// latent slots. Each field's doc comment is its key's meaning
/// (update-policy's `sft.warmup.*`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct WarmupConfig {
    /// Weight of the latents' cosine term (LaST-R1: 1).
    pub latent: f64,
    /// Weight of the stop's (`<latent_end>`) cross-entropy (LaST-R1: 0.1).
    pub end: f64,
    /// Weight of the actions' cross-entropy (LaST-R1: 1).
    pub action: f64,
    /// Fill the slots with the policy's own one-step predictions (true) or
    /// with the targets, LaST-R1's teacher forcing (false).
    pub self_forcing: bool,
}

impl Default for WarmupConfig {
    fn default() -> Self {
        WarmupConfig {
            latent: 1.0,
            end: 0.1,
            action: 1.0,
            self_forcing: true,
        }
    }
}

/// The warm-up loss and its terms.
pub struct WarmupLoss {
    /// The weighted sum (with gradients).
    pub total: Tensor,
    /// Mean `1 − cos` over the chosen slots.
    pub latent: f64,
    /// Mean stop cross-entropy.
    pub end: f64,
    /// Mean action cross-entropy.
    pub action: f64,
    /// Mean entropy of the action tokens' distributions (over the tokens
    /// the loss keeps; a metric, without gradients).
    pub entropy: f64,
}

/// The greedy early exit's threshold on a candidate's own probability of
/// `<latent_end>` (LaST-R1's `latent_group_mode = first`).
pub const EARLY_EXIT: f64 = 0.99;

/// The stop of one decision from its candidates' `<latent_end>` logits
/// `l`: drawn from `softmax_m(l_m / T)` with `rng` at `temperature > 0`;
/// greedy (`T = 0`), the first candidate whose own probability of
/// `<latent_end>`, `sigmoid(l_m)` (the end head's one logit against
/// "go on thinking"), is at least [`EARLY_EXIT`], else the most probable
/// (the largest logit). LaST-R1's rollout does the same with each
/// position's vocabulary softmax: it samples over the candidates' logits
/// and exits early on a position's own `p(<latent_end>) >= 0.99`.
pub fn choose_stop(end_logits: &[f32], temperature: f64, rng: &mut ChaCha8Rng) -> usize {
    if temperature > 0.0 {
        let scaled: Vec<f64> = end_logits
            .iter()
            .map(|&l| f64::from(l) / temperature)
            .collect();
        let top = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let norm = top + scaled.iter().map(|x| (x - top).exp()).sum::<f64>().ln();
        let logp: Vec<f32> = scaled.iter().map(|x| (x - norm) as f32).collect();
        draw(&logp, 1.0, rng)
    } else {
        end_logits
            .iter()
            .position(|&l| 1.0 / (1.0 + (-f64::from(l)).exp()) >= EARLY_EXIT)
            .unwrap_or_else(|| arg_max(end_logits))
    }
}

/// A standard normal draw (Box–Muller) from `rng`.
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

impl Vla {
    /// One trunk pass over `[prefix | latent part (`latents` in the slots) |
    /// actions when asked]`, the actions seeing `visible[b]` positions of
    /// the latent part (`visible` unread without actions), and what it
    /// reads out: the predicted latents, the stop logits and the values.
    /// The one forward pass of every latent path: generation, the stop's
    /// choice, action sampling, the update's scores and the warm-up.
    fn latent_pass(
        &self,
        batch: &[Observation],
        latents: &Tensor,
        visible: &[i64],
        actions: bool,
    ) -> Result<LatentPass, VlaError> {
        let shape = self.latent_shape()?;
        let input = LatentInput {
            latents: latents.shallow_clone(),
            visible: visible.to_vec(),
        };
        let (hidden, prefix) = self.hidden(batch, Some(&input), actions)?;
        let parts = self.latent_parts();
        let device = hidden.device();
        let index = |positions: Vec<i64>| {
            let positions: Vec<i64> = positions.into_iter().map(|p| prefix + p).collect();
            hidden.index_select(1, &Tensor::from_slice(&positions).to(device))
        };
        let predicted = index((0..shape.length).map(|i| shape.slot(i) - 1).collect());
        let candidates = 0..shape.candidates();
        let before_end = index(candidates.clone().map(|m| shape.end(m) - 1).collect());
        let at_end = index(candidates.map(|m| shape.end(m)).collect());
        // The heads run in the parameters' dtype; what they read out is f32.
        let float = |t: Tensor| t.squeeze_dim(2).to_kind(Kind::Float);
        Ok(LatentPass {
            end_logits: float(parts.end_head.forward(&before_end)),
            values: float(parts.value_head.forward(&at_end)),
            predicted: predicted.to_kind(Kind::Float),
            hidden,
        })
    }

    /// 1 on each row's chosen latents (the first `(stops[b] + 1) × group`
    /// slots), 0 on the others: `[batch, L]`.
    pub fn chosen_latents(&self, stops: &[usize]) -> Result<Tensor, VlaError> {
        let shape = self.latent_shape()?;
        let lengths = shape.candidate_lengths();
        let mut mask = Vec::with_capacity(stops.len() * shape.length as usize);
        for (row, &stop) in stops.iter().enumerate() {
            let len = *lengths.get(stop).ok_or(VlaError::Stop {
                row,
                stop,
                candidates: shape.candidates(),
            })?;
            mask.extend((0..shape.length as usize).map(|i| f32::from(u8::from(i < len))));
        }
        Ok(Tensor::from_slice(&mask)
            .view([stops.len() as i64, shape.length])
            .to(self.device()))
    }

    /// Positions of the latent part the actions see when stopping at
    /// candidate `stop`: up to and including its `<latent_end>`.
    fn visible(shape: &LatentConfig, stop: usize) -> i64 {
        shape.end(stop as i64) + 1
    }

    /// Generates the latent chain of a batch autoregressively, one trunk
    /// pass per latent, each with noise `noise_std · ε` drawn from the row's
    /// stream: `[batch, L, embd]`.
    fn generate_latents(
        &self,
        batch: &[Observation],
        rngs: &mut [ChaCha8Rng],
        noise_std: f64,
    ) -> Result<Tensor, VlaError> {
        let shape = self.latent_shape()?;
        let (b, e) = (batch.len() as i64, self.config.n_embd);
        let latents = Tensor::zeros([b, shape.length, e], (Kind::Float, self.device()));
        for i in 0..shape.length {
            let mut z = self
                .latent_pass(batch, &latents, &[], false)?
                .predicted
                .select(1, i);
            if noise_std > 0.0 {
                let noise: Vec<f32> = rngs
                    .iter_mut()
                    .flat_map(|rng| {
                        (0..e)
                            .map(|_| (noise_std * standard_normal(rng)) as f32)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                z += Tensor::from_slice(&noise).view([b, e]).to(self.device());
            }
            latents.narrow(1, i, 1).copy_(&z.unsqueeze(1));
        }
        Ok(latents)
    }

    /// Samples one decision per row, thinking first: the latent chain
    /// (with exploration noise `noise_std`), a stop drawn from
    /// `softmax(l / T)` (greedy at `T = 0`: the first candidate of
    /// own probability `sigmoid(l)` ≥ 0.99, else the most probable), then the action chunk
    /// at `temperature`, row `b` drawing everything from a ChaCha8 stream
    /// seeded by `seeds[b]`.
    pub fn sample_with_latents(
        &self,
        batch: &[Observation],
        seeds: &[u64],
        temperature: f64,
        noise_std: f64,
    ) -> Result<Vec<LatentDecision>, VlaError> {
        check_rows("seeds", seeds.len(), batch.len())?;
        check_temperature(temperature)?;
        if !(noise_std.is_finite() && noise_std >= 0.0) {
            return Err(VlaError::Latents(format!(
                "latent noise_std {noise_std} must be finite and at least 0"
            )));
        }
        let shape = self.latent_shape()?.clone();
        let mut rngs: Vec<ChaCha8Rng> = seeds
            .iter()
            .map(|&s| ChaCha8Rng::seed_from_u64(s))
            .collect();
        tch::no_grad(|| {
            let latents = self.generate_latents(batch, &mut rngs, noise_std)?;
            // The stop logits do not depend on what the actions see.
            let chain = self.latent_pass(batch, &latents, &[], false)?;
            let end_logits = Vec::<f32>::try_from(chain.end_logits.to(Device::Cpu).view([-1]))
                .expect("f32 logits");
            let m = shape.candidates() as usize;
            let stops: Vec<usize> = rngs
                .iter_mut()
                .enumerate()
                .map(|(row, rng)| {
                    choose_stop(&end_logits[row * m..(row + 1) * m], temperature, rng)
                })
                .collect();
            let visible: Vec<i64> = stops.iter().map(|&s| Self::visible(&shape, s)).collect();
            let acted = self.latent_pass(batch, &latents, &visible, true)?;
            let decisions =
                self.draw_decisions(&self.action_logits(&acted.hidden), &mut rngs, temperature);
            let column = self.stop_rows(&stops, batch.len())?.unsqueeze(1);
            let chosen_logp = log_softmax_at(&acted.end_logits, temperature)
                .gather(1, &column, false)
                .squeeze_dim(1);
            let chosen_value = acted.values.gather(1, &column, false).squeeze_dim(1);
            let chosen_logp = Vec::<f32>::try_from(chosen_logp.to(Device::Cpu)).expect("f32");
            let chosen_value = Vec::<f32>::try_from(chosen_value.to(Device::Cpu)).expect("f32");
            let per_row = (shape.length * self.config.n_embd) as usize;
            let flat = Vec::<f32>::try_from(latents.to(Device::Cpu).view([-1])).expect("f32");
            Ok(decisions
                .into_iter()
                .enumerate()
                .map(|(row, decision)| LatentDecision {
                    decision,
                    latents: flat[row * per_row..(row + 1) * per_row].to_vec(),
                    stop: stops[row],
                    latent_len: shape.candidate_lengths()[stops[row]],
                    stop_logprob: chosen_logp[row],
                    value: chosen_value[row],
                })
                .collect())
        })
    }

    /// Stored latents `[batch, L, embd]` on the device, checked: `L × embd`
    /// finite values per row.
    fn latent_rows(&self, latents: &[&[f32]], batch: usize) -> Result<Tensor, VlaError> {
        check_rows("latents", latents.len(), batch)?;
        let shape = self.latent_shape()?;
        let per_row = (shape.length * self.config.n_embd) as usize;
        let mut flat = Vec::with_capacity(batch * per_row);
        for (row, values) in latents.iter().enumerate() {
            if values.len() != per_row {
                return Err(VlaError::LatentShape {
                    row,
                    reason: format!(
                        "have {} values, a chain has latent.length x n_embd = {} x {} = {per_row}",
                        values.len(),
                        shape.length,
                        self.config.n_embd
                    ),
                });
            }
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(VlaError::LatentShape {
                    row,
                    reason: format!("value {} at index {i} is not finite", values[i]),
                });
            }
            flat.extend_from_slice(values);
        }
        Ok(Tensor::from_slice(&flat)
            .view([batch as i64, shape.length, self.config.n_embd])
            .to(self.device()))
    }

    /// Stops as an int64 tensor `[batch]`, checked against the candidates.
    fn stop_rows(&self, stops: &[usize], batch: usize) -> Result<Tensor, VlaError> {
        check_rows("stops", stops.len(), batch)?;
        let candidates = self.latent_shape()?.candidates();
        if let Some(row) = stops.iter().position(|&s| s as i64 >= candidates) {
            return Err(VlaError::Stop {
                row,
                stop: stops[row],
                candidates,
            });
        }
        Ok(
            Tensor::from_slice(&stops.iter().map(|&s| s as i64).collect::<Vec<_>>())
                .to(self.device()),
        )
    }

    /// Recomputes stored decisions in one teacher-forced pass (with
    /// gradients when gradients are on): the action tokens' log-probs at
    /// `temperature`, their entropy as asked, the predicted latents, the
    /// stop's log-prob and the value at the stored stop.
    pub fn latent_scores(
        &self,
        batch: &[Observation],
        latents: &[&[f32]],
        stops: &[usize],
        tokens: &[&[u32]],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<LatentScores, VlaError> {
        check_temperature(temperature)?;
        let shape = self.latent_shape()?;
        let stored = self.latent_rows(latents, batch.len())?;
        let stop = self.stop_rows(stops, batch.len())?;
        let targets = self.action_tokens(tokens, batch.len())?;
        let visible: Vec<i64> = stops.iter().map(|&s| Self::visible(shape, s)).collect();
        let pass = self.latent_pass(batch, &stored, &visible, true)?;
        let log_probs = log_softmax_at(&self.action_logits(&pass.hidden), temperature);
        let column = stop.unsqueeze(1);
        Ok(LatentScores {
            token_logprobs: gather_tokens(&log_probs, &targets),
            entropy: entropy.of(&log_probs),
            latents: pass.predicted,
            stop_logprobs: log_softmax_at(&pass.end_logits, temperature)
                .gather(1, &column, false)
                .squeeze_dim(1),
            values: pass.values.gather(1, &column, false).squeeze_dim(1),
        })
    }

    /// LaST-R1's warm-up loss (module doc): the predicted latents against
    /// `targets` (`L × embd` per row), the slots filled with the targets or
    /// (`self_forcing`) the policy's one-step predictions, the chain cut at
    /// each row's `stops[b]`, the actions' cross-entropy over each row's
    /// first `valid_steps[b]` chunk steps (all when `None`).
    pub fn warmup_loss(
        &self,
        batch: &[Observation],
        targets: &[&[f32]],
        stops: &[usize],
        tokens: &[&[u32]],
        valid_steps: Option<&[usize]>,
        warmup: WarmupConfig,
    ) -> Result<WarmupLoss, VlaError> {
        let shape = self.latent_shape()?;
        let b = batch.len();
        let goal = self.latent_rows(targets, b)?;
        let stop = self.stop_rows(stops, b)?;
        let action_targets = self.action_tokens(tokens, b)?;
        let action_mask = self.valid_mask(valid_steps, b)?;
        let visible: Vec<i64> = stops.iter().map(|&s| Self::visible(shape, s)).collect();
        let inputs = if warmup.self_forcing {
            tch::no_grad(|| self.latent_pass(batch, &goal, &[], false))?.predicted
        } else {
            goal.shallow_clone()
        };
        let chosen = self.chosen_latents(stops)?;
        let pass = self.latent_pass(batch, &inputs, &visible, true)?;
        let cosine = Tensor::cosine_similarity(&pass.predicted, &goal, 2, 1e-8);
        let distance: Tensor = cosine.neg() + 1.0;
        let latent = masked_mean(&distance, Some(&chosen));
        let end = -pass
            .end_logits
            .log_softmax(1, Kind::Float)
            .gather(1, &stop.unsqueeze(1), false)
            .mean(Kind::Float);
        let action_logits = self.action_logits(&pass.hidden);
        let action = masked_nll(&action_logits, &action_targets, action_mask.as_ref());
        let token_entropy = Entropy::Metric
            .of(&action_logits.log_softmax(-1, Kind::Float))
            .expect("asked for");
        let entropy = masked_mean(&token_entropy, action_mask.as_ref()).double_value(&[]);
        let (latent_value, end_value, action_value) = (
            latent.double_value(&[]),
            end.double_value(&[]),
            action.double_value(&[]),
        );
        Ok(WarmupLoss {
            total: latent * warmup.latent + end * warmup.end + action * warmup.action,
            latent: latent_value,
            end: end_value,
            action: action_value,
            entropy,
        })
    }
}

#[cfg(test)]
mod tests;
