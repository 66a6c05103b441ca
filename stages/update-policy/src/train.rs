//! The training loop, one for every network ([`Trainable`]): epochs of
//! shuffled optimizer steps ([`train`]), each step's examples cut into
//! micro-batches ordered by prompt and length ([`micro_batches`]), their
//! losses aggregated with the whole step's denominators and their gradients
//! accumulated ([`accumulate`]), then the gradient norm clipped and one
//! AdamW step at the schedule's rate, recorded as one `metrics` row.
//!
//! A step of `grad_accumulation = k` mini-batches of `mini_batch`
//! sequences is one step on their union: every micro-batch's loss is
//! `sum(its terms) / D`, `D` the step's response tokens (`token-mean`) or
//! sequences (`seq-mean-*`), so the gradients add up to the whole step's.
//!
//! ```text
//! epoch e: shuffle(seed ^ e * 0x9E3779B97F4A7C15)
//!   step: zero_grad; for micro in micro_batches(step): backward(loss(micro) / D)
//!         clip_grad_norm(optim.grad_clip); AdamW step at lr(step count)
//! ```
//!
//! `train.gradient_checkpointing` recomputes each transformer block in the
//! backward (`embodyflow_hf::checkpointing`: the loss's backward, then the
//! blocks from the top); `train.precision = "bf16"` runs the passes in bf16
//! and steps fp32 master weights ([`embodyflow_models::precision`]), the
//! checkpoint written in fp32.

use std::time::Instant;

use embodyflow_core::schemas::{MetricRow, TaskRow};
use embodyflow_core::{Error, progress};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, PolicyNet};
use embodyflow_models::checkpointing;
use embodyflow_models::optimizer::{AdamW, OptimizerState, clip_grads};
use embodyflow_models::policy::{Entropy, ResponseScores};
use embodyflow_models::precision::MasterWeights;
use embodyflow_models::vla::VALUE_HEAD;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use crate::config::{Config, Objective, Precision, SftConfig};
use crate::examples::{Example, SftSet, redraw_warmup_lengths};
use crate::loss::{Denominators, aggregate, kl_penalty, policy_loss};

/// How `update-policy` trains every network of one
/// [`Role`](embodyflow_models::net::Role): how its
/// examples are made, checked and scored. [`train`] and [`accumulate`]
/// (shuffle, steps, gradient accumulation, AdamW, schedule, metrics,
/// optimizer state) are one for every network; the plan networks train
/// alike ([`Plans`](embodyflow_models::net::Plans), [`crate::plan`]: every
/// [`PlanNet`](embodyflow_models::policy::PlanNet)) and so does the VLA
/// ([`ClosedLoop`](embodyflow_models::net::ClosedLoop), [`crate::vla`]). A
/// network is trained by its role's implementation, so a new plan network
/// changes nothing here.
pub trait Training<M: PolicyNet> {
    /// The SFT examples of `tasks` (`seed`: the run's `--seed`).
    fn sft_examples(
        policy: &Checkpoint<M>,
        tasks: &[TaskRow],
        sft: &SftConfig,
        seed: u64,
    ) -> Result<SftSet, ModelError>;

    /// Fails on an example the policy cannot score, naming it.
    fn check_examples(policy: &Checkpoint<M>, examples: &[Example]) -> Result<(), Error>;

    /// Per-token log-probs `[B, T]` of a micro-batch's responses under
    /// `logits / temperature`, the mask `[B, T]` (1 on the tokens of the
    /// loss) and the entropies `entropy` asks for, with gradients when
    /// gradients are on. The examples passed [`Training::check_examples`].
    fn score(
        policy: &Checkpoint<M>,
        batch: &[&Example],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<ResponseScores, ModelError>;

    /// A micro-batch's loss when the network computes it itself (a
    /// thinking VLA: its warm-up under `sft`, LAPO under `lapo`), already
    /// scaled to its share of the step (`denominators`); `None`: the
    /// token-level path of [`accumulate`] (the default).
    fn own_loss(
        _policy: &Checkpoint<M>,
        _batch: &[&Example],
        _config: &Config,
        _denominators: Denominators,
    ) -> Result<Option<OwnLoss>, ModelError> {
        Ok(None)
    }
}

/// A network `update-policy` trains: one whose role trains it
/// ([`Training`]); `M::Role::score(...)` scores with it.
pub trait Trainable: PolicyNet<Role: Training<Self>> {}

impl<M: PolicyNet<Role: Training<M>>> Trainable for M {}

/// A micro-batch's loss and its terms, each its share of the optimizer step
/// ([`Training::own_loss`]).
pub struct OwnLoss {
    /// The loss to minimise (with gradients).
    pub loss: Tensor,
    /// The action term (LAPO's action surrogate; the warm-up's action
    /// cross-entropy).
    pub pg_loss: f64,
    /// Mean entropy of the action tokens (a metric).
    pub entropy: f64,
    /// The latent term (LAPO's latent surrogate; the warm-up's cosine loss).
    pub latent: f64,
    /// The `<latent_end>` term.
    pub end: f64,
    /// LAPO's clipped value loss (`None` in the warm-up).
    pub value: Option<f64>,
    /// Fraction of the step's decisions whose action ratio was clipped.
    pub clipfrac: f64,
    /// Fraction held by the dual clip.
    pub clipfrac_lower: f64,
    /// Mean `old − new` action log-prob per decision.
    pub approx_kl: f64,
    /// Action tokens in the loss.
    pub tokens: u64,
}

/// `rows` right-padded with 0 to `width` columns.
fn pad_rows(rows: &[&[f32]], width: usize, device: tch::Device) -> tch::Tensor {
    let mut flat = Vec::with_capacity(rows.len() * width);
    for row in rows {
        flat.extend_from_slice(row);
        flat.extend(std::iter::repeat_n(0.0, width - row.len()));
    }
    tch::Tensor::from_slice(&flat)
        .view([rows.len() as i64, width as i64])
        .to(device)
}

/// What a training run did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// One row per optimizer step.
    pub metrics: Vec<MetricRow>,
    /// Response tokens processed (forward and backward), over all epochs.
    pub tokens: u64,
    /// Examples processed (sequences; a VLA's decisions), over all epochs.
    pub sequences: u64,
    /// Wall time of the optimisation.
    pub seconds: f64,
}

/// Optimises `policy` on `examples`, continuing from the optimizer `state`
/// (pure apart from the policy's weights; the final state is left in
/// `policy.optimizer` for the checkpoint). The examples are checked first
/// ([`Training::check_examples`]).
pub fn train<M: Trainable>(
    policy: &mut Checkpoint<M>,
    reference: Option<&Checkpoint<M>>,
    examples: &[Example],
    config: &Config,
    seed: u64,
    state: OptimizerState,
) -> Result<TrainReport, ModelError> {
    if config.mini_batch == 0 || config.micro_batch == 0 || config.grad_accumulation == 0 {
        return Err(Error::Usage(
            "mini_batch, micro_batch and grad_accumulation must be at least 1".into(),
        )
        .into());
    }
    M::Role::check_examples(policy, examples)?;
    let _checkpointing = checkpointing::enable(config.train.gradient_checkpointing);
    let master =
        (config.train.precision == Precision::Bf16).then(|| MasterWeights::new(&mut policy.vars));
    let optim = &config.optim;
    let mut optimizer = AdamW::new(optim.adamw(), state).with_schedule(optim.schedule());
    if config.objective == Objective::Lapo {
        optimizer = optimizer.with_lr_scale(VALUE_HEAD, config.lapo.value_lr_factor());
    }
    let started = Instant::now();
    let mut metrics = Vec::new();
    let mut tokens = 0u64;
    let mut sequences = 0u64;
    let per_step = config.mini_batch.saturating_mul(config.grad_accumulation);
    let steps_per_epoch = examples.len().div_ceil(per_step);
    let bar = progress::bar((steps_per_epoch * config.epochs) as u64, "updating");
    let all_examples = examples;
    for epoch in 0..config.epochs {
        let epoch_seed = seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let redrawn = redraw_warmup_lengths(all_examples, epoch_seed);
        let examples = redrawn.as_deref().unwrap_or(all_examples);
        let mut order: Vec<usize> = (0..examples.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(epoch_seed));
        // One optimizer step per `grad_accumulation` mini-batches.
        for step in order.chunks(per_step) {
            let denominators = Denominators {
                tokens: step
                    .iter()
                    .map(|&i| examples[i].loss_tokens())
                    .sum::<usize>()
                    .max(1) as f64,
                sequences: step.len() as f64,
            };
            optimizer.zero_grad(&policy.vars);
            let micros = micro_batches(examples, step, config.micro_batch);
            let sums = accumulate(policy, reference, examples, &micros, denominators, config)?;
            tokens += sums.tokens;
            sequences += step.len() as u64;
            let (grad_norm, lr) = match &master {
                None => (
                    optimizer.clip_grad_norm(&policy.vars, optim.grad_clip),
                    optimizer.step(&policy.vars),
                ),
                Some(master) => {
                    let params = master.gradients(&policy.vars);
                    let grads: Vec<Tensor> = params.iter().map(|p| p.2.shallow_clone()).collect();
                    let norm = clip_grads(&grads, optim.grad_clip);
                    let lr = optimizer.step_params(params);
                    master.write_back(&policy.vars);
                    (norm, lr)
                }
            };
            policy.manifest.updates += 1;
            metrics.push(MetricRow {
                iteration: config.iteration,
                update: metrics.len() as i32,
                loss: sums.loss as f32,
                pg_loss: sums.pg_loss as f32,
                // PPO-only figures are null on SFT rows.
                clipfrac: (config.objective != Objective::Sft)
                    .then_some((sums.clipped / denominators.tokens) as f32),
                clipfrac_lower: (config.objective != Objective::Sft)
                    .then_some((sums.clipped_lower / denominators.tokens) as f32),
                approx_kl: (config.objective != Objective::Sft)
                    .then_some((sums.approx_kl / denominators.tokens) as f32),
                entropy: sums.entropy as f32,
                kl_loss: (config.ppo.kl_coef > 0.0).then_some(sums.kl_loss as f32),
                latent_loss: sums.latent_terms.map(|t| t.latent as f32),
                end_loss: sums.latent_terms.map(|t| t.end as f32),
                value_loss: sums.latent_terms.and_then(|t| t.value.map(|v| v as f32)),
                grad_norm: grad_norm as f32,
                lr: lr as f32,
            });
            if !sums.loss.is_finite() {
                return Err(ModelError::Torch(format!(
                    "the loss became {} at update {} of epoch {epoch}; lower optim.lr",
                    sums.loss,
                    metrics.len() - 1
                )));
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    if let Some(master) = master {
        master.finish(&mut policy.vars);
    }
    policy.optimizer = Some(optimizer.state);
    Ok(TrainReport {
        metrics,
        tokens,
        sequences,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The micro-batches of one optimizer step (`step`: indices into
/// `examples`): its examples ordered by prompt (length, then ids, so a
/// group's samples sit side by side and the scorer encodes their shared
/// prompt once) and by response length (less padding), then cut into
/// `micro_batch` rows. Every micro-batch's loss is normalised by the whole
/// step's [`Denominators`] and the gradients add up, so this order changes
/// the step only by float rounding; it is a function of the step's examples
/// (ties keep the shuffled order), so the same seed gives the same run.
pub fn micro_batches(examples: &[Example], step: &[usize], micro_batch: usize) -> Vec<Vec<usize>> {
    let mut rows = step.to_vec();
    rows.sort_by(|&a, &b| {
        let (x, y) = (&examples[a], &examples[b]);
        x.prompt
            .len()
            .cmp(&y.prompt.len())
            .then_with(|| x.prompt.cmp(&y.prompt))
            .then(x.response.len().cmp(&y.response.len()))
    });
    rows.chunks(micro_batch.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// What one optimizer step's micro-batches add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepSums {
    /// The loss (policy loss, entropy bonus and KL penalty).
    pub loss: f64,
    /// The policy-gradient loss (PPO).
    pub pg_loss: f64,
    /// The aggregated entropy (a metric unless `ppo.entropy_coef > 0`).
    pub entropy: f64,
    /// The aggregated KL penalty (with `ppo.kl_coef > 0`).
    pub kl_loss: f64,
    /// Tokens with `l2 > l1` (PPO).
    pub clipped: f64,
    /// Tokens under the dual clip (PPO).
    pub clipped_lower: f64,
    /// Sum of `old_logp - logp` (PPO).
    pub approx_kl: f64,
    /// Response tokens.
    pub tokens: u64,
    /// A thinking VLA's latent, stop and value terms ([`OwnLoss`]).
    pub latent_terms: Option<LatentTerms>,
}

/// A thinking VLA's step terms, summed over its micro-batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatentTerms {
    /// The latent term.
    pub latent: f64,
    /// The `<latent_end>` term.
    pub end: f64,
    /// The value loss (LAPO).
    pub value: Option<f64>,
}

/// Runs forward and backward over `micros` (rows of `examples`), every loss
/// aggregated with the step's `denominators`, accumulating the gradients in
/// the policy's variables. The entropy is computed without gradients (a
/// metric) unless the PPO loss has an entropy bonus.
pub fn accumulate<M: Trainable>(
    policy: &Checkpoint<M>,
    reference: Option<&Checkpoint<M>>,
    examples: &[Example],
    micros: &[Vec<usize>],
    denominators: Denominators,
    config: &Config,
) -> Result<StepSums, ModelError> {
    let device = policy.vars.device();
    let bonus = config.objective == Objective::Ppo && config.ppo.entropy_coef > 0.0;
    let entropy_mode = if bonus {
        Entropy::Loss
    } else {
        Entropy::Metric
    };
    let mut sums = StepSums::default();
    for micro in micros {
        let batch: Vec<&Example> = micro.iter().map(|&i| &examples[i]).collect();
        if let Some(own) = M::Role::own_loss(policy, &batch, config, denominators)? {
            // A decision counts whole in this loss (LaST-R1's valid steps,
            // `ceil(finish_step / K)`): a mask may only mark the actions a
            // chunk cut by the episode's end never ran, a tail of holes.
            if let Some(e) = batch.iter().find(|e| {
                e.response_mask
                    .as_ref()
                    .is_some_and(|m| m.windows(2).any(|w| !w[0] && w[1]))
            }) {
                return Err(Error::BadInput(format!(
                    "{}: its response_mask has holes before the policy's own tokens, which this policy's own loss (a VLA's whole decisions) does not take",
                    e.source
                ))
                .into());
            }
            checkpointing::backward(&own.loss);
            sums.loss += own.loss.double_value(&[]);
            sums.pg_loss += own.pg_loss;
            sums.entropy += own.entropy;
            // Decision fractions, kept as counts over the step's tokens
            // (the metrics divide by them).
            sums.clipped += own.clipfrac * denominators.tokens;
            sums.clipped_lower += own.clipfrac_lower * denominators.tokens;
            sums.approx_kl += own.approx_kl * denominators.tokens;
            sums.tokens += own.tokens;
            let terms = sums.latent_terms.get_or_insert_with(LatentTerms::default);
            terms.latent += own.latent;
            terms.end += own.end;
            if let Some(value) = own.value {
                *terms.value.get_or_insert(0.0) += value;
            }
            continue;
        }
        let temperature = batch[0].temperature as f64;
        let mut scores = M::Role::score(policy, &batch, temperature, entropy_mode)?;
        let width = scores.logprobs.size()[1] as usize;
        if batch.iter().any(|e| e.response_mask.is_some()) {
            // Holes of the response masks leave every term below.
            let rows: Vec<Vec<f32>> = batch
                .iter()
                .map(|e| match &e.response_mask {
                    Some(mask) => mask.iter().map(|&m| f32::from(u8::from(m))).collect(),
                    None => vec![1.0; e.response.len()],
                })
                .collect();
            let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            scores.mask = &scores.mask * pad_rows(&rows, width, device).to_kind(scores.mask.kind());
        }
        let entropy = aggregate(
            scores.entropy.as_ref().expect("entropy is asked for"),
            &scores.mask,
            config.ppo.loss_agg,
            denominators,
        );
        let mut loss = match config.objective {
            Objective::Lapo => {
                return Err(Error::Usage(
                    "objective = lapo trains a VLA with a latent chain of thought \
                     (init-policy --set kind=vla --set vla.latent_length=8)"
                        .into(),
                )
                .into());
            }
            Objective::Sft => aggregate(
                &(-&scores.logprobs),
                &scores.mask,
                config.ppo.loss_agg,
                denominators,
            ),
            Objective::Ppo => {
                let old: Vec<_> = batch.iter().map(|e| e.hole_free(&e.old_logprobs)).collect();
                let adv: Vec<_> = batch.iter().map(|e| e.hole_free(&e.advantages)).collect();
                let old: Vec<&[f32]> = old.iter().map(|v| v.as_ref()).collect();
                let adv: Vec<&[f32]> = adv.iter().map(|v| v.as_ref()).collect();
                let out = policy_loss(
                    &scores.logprobs,
                    &pad_rows(&old, width, device),
                    &pad_rows(&adv, width, device),
                    &scores.mask,
                    &config.ppo,
                    denominators,
                );
                sums.clipped += out.clipped_tokens;
                sums.clipped_lower += out.clipped_lower_tokens;
                sums.approx_kl += out.kl_sum;
                sums.pg_loss += out.loss.double_value(&[]);
                if bonus {
                    out.loss - &entropy * config.ppo.entropy_coef
                } else {
                    out.loss
                }
            }
        };
        if let (Some(reference), true) = (reference, config.ppo.kl_coef > 0.0) {
            let ref_logp = tch::no_grad(|| {
                M::Role::score(reference, &batch, temperature, Entropy::Skip).map(|s| s.logprobs)
            })?;
            let kl = aggregate(
                &kl_penalty(&scores.logprobs, &ref_logp, config.ppo.kl_estimator),
                &scores.mask,
                config.ppo.loss_agg,
                denominators,
            );
            sums.kl_loss += kl.double_value(&[]);
            loss += kl * config.ppo.kl_coef;
        }
        checkpointing::backward(&loss);
        sums.loss += loss.double_value(&[]);
        sums.entropy += entropy.double_value(&[]);
        sums.tokens += scores.mask.sum(Kind::Double).double_value(&[]) as u64;
    }
    Ok(sums)
}

#[cfg(test)]
pub(crate) mod tests;
