//! `update-policy` on a thinking VLA (LaST-R1's latent chain of thought,
//! `embodyflow_models::vla::latent`): the warm-up's latent targets
//! and the two losses the network computes itself ([`crate::Training::own_loss`]).
//!
//! - **Warm-up** (`objective = sft`): each behaviour-cloning decision also
//!   learns to think. Its latent targets are the features of the frames the
//!   chunk is about to produce: slot `l` of `L` targets the frame after
//!   action `ceil((l + 1) K / L)` of the chunk (clipped at the episode's
//!   last frame; `K = L = 8`: one frame per action), under a frozen frame
//!   encoder — LaST-R1 uses DINOv3's CLS (top-k channels); we fit a PCA to
//!   `n_embd` components ([`FrameEncoder`]) on every frame of the first
//!   warm-up's demonstrations and keep it fixed: the checkpoint carries it
//!   (`frame_encoder.safetensors`) and every later warm-up uses it. Each example's chain length
//!   is drawn uniformly from the stop candidates anew every epoch (seeded by
//!   `--seed`, the epoch and the example), as LaST-R1's multi-task warm-up
//!   draws from {2, 4, 6, 8} for each sample it uses. The
//!   loss is [`Vla::warmup_loss`] with `sft.warmup` (1 : 0.1 : 1).
//! - **LAPO** (`objective = lapo`): the rollout's latents, stop, old value
//!   and GAE return ([`crate::ExampleThought`]) through [`Vla::latent_scores`]
//!   (one teacher-forced pass at the rollouts' temperature) into
//!   [`crate::lapo::lapo_loss`]; a decision's advantage is its first token's
//!   (decision-level GAE broadcasts it).
//! - **PPO** (`objective = ppo`, e.g. on GRPO's advantages): the tokens the
//!   policy sampled, scored by the same teacher-forced pass behind the
//!   rollout's latents: each action token and the stop, one token more per
//!   decision, in the token-level clipped surrogate
//!   ([`crate::loss::policy_loss`]) with the token's advantage (the stop
//!   takes the decision's first token's). The latents are the policy's
//!   hidden states, not samples: they get no ratio and no term of their
//!   own, nor does the value head (no critic). So GRPO on a thinking VLA is
//!   SimpleVLA-RL's GRPO over every sampled token, against which LAPO adds
//!   the latent surrogate, the chunk-level ratio and the critic.
//!
//! Micro-batch losses are means over the micro-batch scaled by its share of
//! the step's decisions (LAPO's are divided by the step's decisions inside
//! `lapo_loss`), so the micro-batches of a step add up to its loss.

use std::sync::Arc;

use embodyflow_core::Error;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::frame_encoder::FrameEncoder;
use embodyflow_models::policy::Entropy;
use embodyflow_models::vla::{LatentConfig, LatentScores, Observation, Vla};
use tch::{Kind, Tensor};

use super::decisions::{decode_observations, observation_rows, observation_shape, padded_chunks};
use crate::examples::warmup_length;
use crate::lapo::{LapoBatch, lapo_loss};
use crate::loss::{Denominators, policy_loss};
use crate::{Config, Example, ExampleThought, Objective, OwnLoss};

/// The latent chain a thinking checkpoint has, or `None`.
pub fn latent_of(policy: &Checkpoint<Vla>) -> Option<&LatentConfig> {
    policy.model.config().latent.as_ref()
}

/// One warm-up example's frames: its decision's future frames, slot by slot.
pub struct FutureFrames {
    /// Index of the example.
    pub example: usize,
    /// `L` frames (bytes), one per latent slot.
    pub frames: Vec<Vec<u8>>,
}

/// The future frames of decision `decision` (chunks of `k` actions) of an
/// episode whose frame before step `s` is `step_frames[s]`: slot `l` of
/// `length` takes the frame after action `ceil((l + 1) k / length)` of the
/// chunk, clipped at the last frame.
pub fn future_frames(
    step_frames: &[Vec<u8>],
    decision: usize,
    k: usize,
    length: usize,
) -> Vec<Vec<u8>> {
    let last = step_frames.len() - 1;
    (0..length)
        .map(|l| {
            let offset = ((l + 1) * k).div_ceil(length);
            step_frames[(decision * k + offset).min(last)].clone()
        })
        .collect()
}

/// Gives each warm-up example its latent targets: the checkpoint's frozen
/// frame encoder, or else a PCA of `n_embd` components fitted on
/// `all_frames` (returned, for the output checkpoint to keep), each
/// example's future frames encoded, its chain length drawn from the
/// candidates. Returns the summary note on the encoder.
pub fn attach_warmup_targets(
    policy: &Checkpoint<Vla>,
    examples: &mut [Example],
    futures: &[FutureFrames],
    all_frames: &[&[u8]],
    seed: u64,
) -> Result<(String, Option<Arc<FrameEncoder>>), ModelError> {
    let latent = latent_of(policy).expect("a thinking checkpoint");
    let config = policy.model.config();
    let size = config.image_size as usize;
    let dim = config.n_embd as usize;
    let (encoder, fitted, source) = match &policy.frame_encoder {
        Some(encoder) => {
            let shape = (encoder.height(), encoder.width(), encoder.dim());
            if shape != (size, size, dim) {
                return Err(Error::BadInput(format!(
                    "the checkpoint's frame encoder takes {}x{} frames to {} features; \
                     the VLA's are {size}x{size} and n_embd {dim}",
                    shape.0, shape.1, shape.2
                ))
                .into());
            }
            (
                Arc::clone(encoder),
                None,
                "the checkpoint's PCA".to_string(),
            )
        }
        None => {
            let encoder = FrameEncoder::fit(all_frames, size, size, 3, dim).map_err(|e| {
                Error::BadInput(format!(
                    "the warm-up's frame encoder (PCA of {} demonstration frames to n_embd = {dim}): {e}",
                    all_frames.len()
                ))
            })?;
            let encoder = Arc::new(encoder);
            let source = format!(
                "PCA of {} demonstration frames to {dim} components, fitted now and saved with the checkpoint",
                all_frames.len()
            );
            (Arc::clone(&encoder), Some(encoder), source)
        }
    };
    let lengths = latent.candidate_lengths();
    for future in futures {
        let frames: Vec<&[u8]> = future.frames.iter().map(Vec::as_slice).collect();
        let features = encoder
            .encode(&frames)
            .map_err(|e| Error::BadInput(format!("the warm-up's frame encoder: {e}")))?;
        let latents = Vec::<f32>::try_from(features.contiguous().view([-1]))
            .map_err(|e| ModelError::Torch(e.to_string()))?;
        let example = &mut examples[future.example];
        example.thought = Some(ExampleThought {
            latents,
            latent_dim: dim,
            latent_len: warmup_length(&lengths, seed, &example.source),
            warmup_lengths: lengths.clone(),
            old_stop_logprob: 0.0,
            old_value: 0.0,
            target_return: 0.0,
        });
    }
    let note = format!(
        "{source} (frozen; stands in for DINOv3 CLS top-k), targets the frames after the \
         chunk's actions, chain lengths drawn from {lengths:?}"
    );
    Ok((note, fitted))
}

/// Fails on an example a checkpoint with (or without) a latent chain cannot
/// train on, naming it and the `steps` field.
pub fn check_thoughts(policy: &Checkpoint<Vla>, examples: &[Example]) -> Result<(), Error> {
    let config = policy.model.config();
    let Some(latent) = latent_of(policy) else {
        if let Some(example) = examples.iter().find(|e| e.thought.is_some()) {
            return Err(Error::BadInput(format!(
                "{} carries a latent chain of thought, but the checkpoint has none (no `latent` in its config)",
                example.source
            )));
        }
        return Ok(());
    };
    let lengths = latent.candidate_lengths();
    for example in examples {
        let source = &example.source;
        let Some(thought) = &example.thought else {
            return Err(Error::BadInput(format!(
                "{source}: no latent chain; a thinking VLA trains with objective = sft (its warm-up), \
                 lapo or ppo (on its own rollouts' latents and stop)"
            )));
        };
        if thought.latent_dim as i64 != config.n_embd {
            return Err(Error::BadInput(format!(
                "table `steps` field `latent_dim`, {source}: {}, the checkpoint's latents have n_embd = {}",
                thought.latent_dim, config.n_embd
            )));
        }
        let expected = (latent.length * config.n_embd) as usize;
        if thought.latents.len() != expected {
            return Err(Error::BadInput(format!(
                "table `steps` field `latents`, {source}: {} values, the checkpoint's chain has \
                 latent_length x n_embd = {} x {} = {expected}",
                thought.latents.len(),
                latent.length,
                config.n_embd
            )));
        }
        if !lengths.contains(&thought.latent_len) {
            return Err(Error::BadInput(format!(
                "table `steps` field `chosen_latent_len`, {source}: {} is not one of the checkpoint's \
                 stop candidates {lengths:?}",
                thought.latent_len
            )));
        }
    }
    Ok(())
}

/// A thinking checkpoint's micro-batch loss (module doc); `None` for a
/// checkpoint without latents.
pub fn own_loss(
    policy: &Checkpoint<Vla>,
    batch: &[&Example],
    config: &Config,
    denominators: Denominators,
) -> Result<Option<OwnLoss>, ModelError> {
    let Some(latent) = latent_of(policy) else {
        return Ok(None);
    };
    let model_config = policy.model.config();
    let shape = observation_shape(model_config);
    let (pixels, proprio) = decode_observations(batch, &shape)?;
    let rows = observation_rows(batch, &pixels, &proprio, &shape);
    let thoughts: Vec<&ExampleThought> = batch
        .iter()
        .map(|e| e.thought.as_ref().expect("checked by check_examples"))
        .collect();
    let latents: Vec<&[f32]> = thoughts.iter().map(|t| t.latents.as_slice()).collect();
    let group = latent.group as usize;
    let stops: Vec<usize> = thoughts.iter().map(|t| t.latent_len / group - 1).collect();
    let per = model_config.n_action_tokens() as usize;
    let tokens = padded_chunks(batch, per);
    let chunks: Vec<&[u32]> = tokens.chunks(per).collect();
    let decisions = Decisions {
        batch,
        rows: &rows,
        thoughts: &thoughts,
        latents: &latents,
        stops: &stops,
        chunks: &chunks,
        per,
        share: batch.len() as f64 / denominators.sequences,
    };
    let loss = match config.objective {
        Objective::Sft => decisions.warmup(policy, config)?,
        Objective::Lapo => decisions.lapo(policy, config, denominators)?,
        Objective::Ppo => decisions.ppo(policy, config, denominators)?,
    };
    Ok(Some(loss))
}

/// A thinking micro-batch decoded once for the objective that scores it:
/// each decision's observation, stored latents, chosen stop and action
/// chunk (padded to `per` tokens), and the batch's share of the sequences.
struct Decisions<'a> {
    batch: &'a [&'a Example],
    rows: &'a [Observation<'a>],
    thoughts: &'a [&'a ExampleThought],
    latents: &'a [&'a [f32]],
    stops: &'a [usize],
    chunks: &'a [&'a [u32]],
    per: usize,
    share: f64,
}

impl Decisions<'_> {
    /// The warm-up's behaviour cloning with latent targets
    /// (`objective = sft`).
    fn warmup(&self, policy: &Checkpoint<Vla>, config: &Config) -> Result<OwnLoss, ModelError> {
        let d = policy.model.config().action_dim as usize;
        let valid: Vec<usize> = self.batch.iter().map(|e| e.response.len() / d).collect();
        let warm = policy.model.warmup_loss(
            self.rows,
            self.latents,
            self.stops,
            self.chunks,
            Some(&valid),
            config.sft.warmup,
        )?;
        let share = self.share;
        Ok(OwnLoss {
            loss: warm.total * share,
            pg_loss: warm.action * share,
            entropy: warm.entropy * share,
            latent: warm.latent * share,
            end: warm.end * share,
            value: None,
            clipfrac: 0.0,
            clipfrac_lower: 0.0,
            approx_kl: 0.0,
            tokens: self.batch.iter().map(|e| e.response.len() as u64).sum(),
        })
    }

    /// The policy's scores of the stored decisions at the rollout's
    /// temperature, with the entropy as a metric.
    fn scores(&self, policy: &Checkpoint<Vla>) -> Result<LatentScores, ModelError> {
        Ok(policy.model.latent_scores(
            self.rows,
            self.latents,
            self.stops,
            self.chunks,
            f64::from(self.batch[0].temperature),
            Entropy::Metric,
        )?)
    }

    /// The mean per-token entropy of `scores`, as the batch's share.
    fn entropy(&self, scores: &LatentScores) -> f64 {
        let entropy = scores
            .entropy
            .as_ref()
            .expect("asked for")
            .mean(Kind::Float)
            .double_value(&[]);
        entropy * self.share
    }

    /// LAPO's action, stop and latent surrogates and the clipped value
    /// loss (`objective = lapo`).
    fn lapo(
        &self,
        policy: &Checkpoint<Vla>,
        config: &Config,
        denominators: Denominators,
    ) -> Result<OwnLoss, ModelError> {
        let scores = self.scores(policy)?;
        let device = policy.vars.device();
        let b = self.batch.len() as i64;
        let column = |values: Vec<f32>| Tensor::from_slice(&values).to(device);
        let old_logprobs: Vec<f32> = self
            .batch
            .iter()
            .flat_map(|e| e.old_logprobs.iter().copied())
            .collect();
        let old_logprobs = column(old_logprobs).view([b, self.per as i64]);
        let old_latents = column(self.latents.concat()).view_as(&scores.latents);
        let latent_mask = policy.model.chosen_latents(self.stops)?;
        let advantages = column(self.batch.iter().map(|e| e.advantages[0]).collect());
        let thoughts = self.thoughts;
        let old_end = column(thoughts.iter().map(|t| t.old_stop_logprob).collect());
        let old_values = column(thoughts.iter().map(|t| t.old_value).collect());
        let returns = column(thoughts.iter().map(|t| t.target_return).collect());
        let valid = Tensor::ones([b], (Kind::Float, device));
        let out = lapo_loss(
            &LapoBatch {
                action_logprobs: &scores.token_logprobs,
                old_action_logprobs: &old_logprobs,
                end_logprob: &scores.stop_logprobs,
                old_end_logprob: &old_end,
                latents: &scores.latents,
                old_latents: &old_latents,
                latent_mask: &latent_mask,
                advantages: &advantages,
                values: &scores.values,
                old_values: &old_values,
                returns: &returns,
                mask: &valid,
            },
            &config.ppo,
            &config.lapo,
            denominators.sequences,
        )
        .map_err(|e| ModelError::Torch(e.to_string()))?;
        Ok(OwnLoss {
            loss: out.loss,
            pg_loss: out.action.loss,
            entropy: self.entropy(&scores),
            latent: out.latent.loss,
            end: out.end.loss,
            value: Some(out.value),
            clipfrac: out.action.clipfrac,
            clipfrac_lower: out.action.clipfrac_lower,
            approx_kl: out.action.approx_kl,
            tokens: (self.batch.len() * self.per) as u64,
        })
    }

    /// The token-level clipped surrogate on the sampled action tokens and
    /// stop behind the stored latents (`objective = ppo`): no latent term,
    /// no value loss.
    fn ppo(
        &self,
        policy: &Checkpoint<Vla>,
        config: &Config,
        denominators: Denominators,
    ) -> Result<OwnLoss, ModelError> {
        if config.ppo.kl_coef > 0.0 || config.ppo.entropy_coef > 0.0 {
            return Err(Error::Usage(format!(
                "objective = ppo on a VLA with a latent chain of thought takes ppo.kl_coef = 0 and \
                 ppo.entropy_coef = 0 (its loss has no KL penalty or entropy bonus); got {} and {}",
                config.ppo.kl_coef, config.ppo.entropy_coef
            ))
            .into());
        }
        let scores = self.scores(policy)?;
        let b = self.batch.len() as i64;
        let rows = sampled_token_rows(self.batch, self.thoughts, self.per);
        let device = policy.vars.device();
        let tensor = |values: &[f32]| Tensor::from_slice(values).to(device).view([b, -1]);
        let logp = Tensor::cat(
            &[&scores.token_logprobs, &scores.stop_logprobs.view([b, 1])],
            1,
        );
        // Every decision adds its stop to the step's tokens.
        let sampled = Denominators {
            tokens: denominators.tokens + denominators.sequences,
            sequences: denominators.sequences,
        };
        let out = policy_loss(
            &logp,
            &tensor(&rows.old_logprobs),
            &tensor(&rows.advantages),
            &tensor(&rows.mask),
            &config.ppo,
            sampled,
        );
        let pg_loss = out.loss.double_value(&[]);
        Ok(OwnLoss {
            loss: out.loss,
            pg_loss,
            entropy: self.entropy(&scores),
            latent: 0.0,
            end: 0.0,
            value: None,
            clipfrac: out.clipped_tokens / sampled.tokens,
            clipfrac_lower: out.clipped_lower_tokens / sampled.tokens,
            approx_kl: out.kl_sum / sampled.tokens,
            tokens: self.batch.iter().map(|e| e.response.len() as u64).sum(),
        })
    }
}

/// PPO's rows on a thinking VLA, `[batch, per + 1]` flattened: each
/// decision's action tokens (padded to `per`, the padding masked out) and
/// then its stop, with the stop's stored log-prob and the decision's
/// advantage (its first token's).
struct SampledTokenRows {
    old_logprobs: Vec<f32>,
    advantages: Vec<f32>,
    mask: Vec<f32>,
}

fn sampled_token_rows(
    batch: &[&Example],
    thoughts: &[&ExampleThought],
    per: usize,
) -> SampledTokenRows {
    let width = per + 1;
    let mut rows = SampledTokenRows {
        old_logprobs: vec![0.0; batch.len() * width],
        advantages: vec![0.0; batch.len() * width],
        mask: vec![0.0; batch.len() * width],
    };
    for (r, (example, thought)) in batch.iter().zip(thoughts).enumerate() {
        let row = r * width;
        let n = example.response.len();
        rows.old_logprobs[row..row + n].copy_from_slice(&example.old_logprobs);
        rows.advantages[row..row + n].copy_from_slice(&example.advantages);
        rows.mask[row..row + n].fill(1.0);
        rows.old_logprobs[row + per] = thought.old_stop_logprob;
        rows.advantages[row + per] = example.advantages[0];
        rows.mask[row + per] = 1.0;
    }
    rows
}

#[cfg(test)]
mod tests;
