//! The VLA network, [`Vla`]: the trunk ([`super::trunk`]), the proprio
//! embedding, the action queries and the action head (and with a latent
//! chain its parts, [`super::latent`]), as a [`PolicyNet`] a checkpoint
//! stores; its forward pass and what the plain policy computes from it
//! (sampling, log-probs, the behaviour-cloning loss). The module doc of
//! [`crate::vla`] gives the sequence, the attention and the formulas:
//!
//! ```text
//! logits[b, t, :] = W_head · h_L[b, act_t]          ([B, K·D, n_bins])
//! log π(a | o)    = Σ_t log_softmax(logits[t] / T)[a_t]
//! ```
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::vla::{Observation, Vla};
//! let policy = Checkpoint::<Vla>::load_kind("runs/sft/policy".as_ref(), tch::Device::Cpu).unwrap();
//! let image = vec![0u8; 32 * 32 * 3];
//! let row = Observation { image: &image, height: 32, width: 32, proprio: &[0.0; 5], instruction: &[17, 42] };
//! let logits = policy.model.logits(&[row]).unwrap(); // [1, K × D, n_bins]
//! let tokens = vec![0u32; logits.size()[1] as usize];
//! let loss = policy.model.bc_loss(&[row], &[&tokens], None).unwrap();
//! ```

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use super::batch::{Decision, Observation};
use super::config::{LatentConfig, VlaConfig};
use super::error::{VlaError, check_rows, check_temperature};
use super::latent::parts::{LatentInput, LatentParts};
use super::scores::{gather_tokens, log_softmax_at, masked_nll};
use super::trunk::network::{Trunk, vlm_special_ids};
use crate::checkpoint::{self, ConfigTag, PolicyKind, PolicyNet};
use crate::policy::{Entropy, arg_max, draw};
use embodyflow_hf::safetensors::Expected;

/// What the VLA embeds itself of a sequence; the trunk embeds the prefix.
struct Sequence {
    /// The proprio token `[batch, 1, embd]`.
    proprio: Tensor,
    /// The latent part and the action placeholders `[batch, n, embd]`.
    tail: Tensor,
    /// The tail's attention among itself `[1 or batch, n, n]` (bool: query, key).
    allowed: Tensor,
}

/// The network.
#[derive(Debug)]
pub struct Vla {
    pub(super) trunk: Trunk,
    proprio_embed: nn::Linear,
    action_query: Tensor,
    /// `None` when the trunk's vocabulary gives the action logits.
    action_head: Option<nn::Linear>,
    latent: Option<LatentParts>,
    pub(super) config: VlaConfig,
}

impl PolicyNet for Vla {
    type Config = VlaConfig;
    type Role = crate::net::ClosedLoop;
    const KIND: PolicyKind = PolicyKind::Vla;
    const NAME: &'static str = "vla";
    const TAG: ConfigTag = ConfigTag::Kind {
        name: "vla",
        default: false,
    };

    fn parse_config(value: serde_json::Value) -> Result<VlaConfig, String> {
        checkpoint::serde_config(value)
    }

    fn config_json(&self) -> serde_json::Value {
        checkpoint::tagged_config(Self::KIND, &self.config)
    }

    fn check(config: &VlaConfig) -> Result<(), String> {
        config.check()
    }

    fn tensors(config: &VlaConfig) -> Box<dyn Iterator<Item = Expected> + '_> {
        config.tensors()
    }

    fn tokens(
        dir: &std::path::Path,
        tokenizer: &tokenizers::Tokenizer,
        config: &VlaConfig,
    ) -> Result<checkpoint::Tokens, crate::ModelError> {
        match &config.trunk {
            None => checkpoint::own_tokens(dir, tokenizer, config.vocab_size),
            Some(_) => Ok(checkpoint::Tokens {
                special: vlm_special_ids(&dir.join(checkpoint::TOKENIZER_FILE), tokenizer, config)?,
                format: checkpoint::PromptFormat::Plan,
                carried: Default::default(),
            }),
        }
    }

    fn vocab_size(config: &VlaConfig) -> i64 {
        config.vocab_size
    }

    fn build(path: &nn::Path, config: &VlaConfig) -> Vla {
        Vla::new(path, config)
    }

    fn config(&self) -> &VlaConfig {
        &self.config
    }

    fn vision_encoder(&self) -> Option<&'static str> {
        self.config
            .trunk
            .as_ref()
            .map(|_| embodyflow_hf::vl::Layout::CURRENT.visual)
    }
}

impl Vla {
    /// Creates the parameters under `path`: the trunk's (the small one's
    /// `wte`, `wpe`, `h.{i}.…`, `ln_f` and `patch_embed`; a model's under
    /// transformers' names, zero until loaded), `proprio_embed`,
    /// `action_query` and `action_head` unless the vocabulary gives the
    /// action logits (and with latents `latent_start`, `latent_end`,
    /// `end_head`, `value_head`). Panics on a config that
    /// [`VlaConfig::check`] refuses (checkpoints check it first and name
    /// the file).
    pub fn new(path: &nn::Path, config: &VlaConfig) -> Vla {
        if let Err(reason) = config.check() {
            panic!("invalid VLA config: {reason}");
        }
        let e = config.n_embd;
        Vla {
            trunk: Trunk::new(path, config),
            // A world without proprio feeds one constant 0: the token is then
            // the layer's learned bias.
            proprio_embed: nn::linear(
                path / "proprio_embed",
                config.proprio_dim.max(1),
                e,
                Default::default(),
            ),
            action_query: path.var(
                "action_query",
                &[e],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            ),
            action_head: config
                .has_action_head()
                .then(|| nn::linear(path / "action_head", e, config.n_bins, Default::default())),
            latent: config.latent.as_ref().map(|_| LatentParts::new(path, e)),
            config: config.clone(),
        }
    }

    /// The architecture.
    pub fn config(&self) -> &VlaConfig {
        &self.config
    }

    pub(super) fn device(&self) -> Device {
        self.action_query.device()
    }

    /// The parameters' dtype (`Float`, or `BFloat16` over fp32 master
    /// weights: [`crate::precision`]): what the inputs are cast to where
    /// they enter the network.
    pub(super) fn kind(&self) -> Kind {
        self.action_query.kind()
    }

    /// Logits `[batch, K × D, n_bins]` of a batch of observations (with
    /// gradients when gradients are on).
    pub fn logits(&self, batch: &[Observation]) -> Result<Tensor, VlaError> {
        if let Some(latent) = &self.config.latent {
            return Err(VlaError::Latents(format!(
                "this VLA thinks in latents (latent.length {}) before it acts: \
                 sample_with_latents, latent_scores and warmup_loss run it",
                latent.length
            )));
        }
        let (hidden, _) = self.hidden(batch, None, true)?;
        Ok(self.action_logits(&hidden))
    }

    /// Samples one decision per row at `temperature` (`0` = greedy), row
    /// `b` drawing from a ChaCha8 stream seeded by `seeds[b]`.
    pub fn sample(
        &self,
        batch: &[Observation],
        seeds: &[u64],
        temperature: f64,
    ) -> Result<Vec<Decision>, VlaError> {
        check_rows("seeds", seeds.len(), batch.len())?;
        check_temperature(temperature)?;
        let logits = tch::no_grad(|| self.logits(batch))?;
        let mut rngs: Vec<ChaCha8Rng> = seeds
            .iter()
            .map(|&s| ChaCha8Rng::seed_from_u64(s))
            .collect();
        Ok(self.draw_decisions(&logits, &mut rngs, temperature))
    }

    /// One decision per row drawn from action logits `[batch, K × D,
    /// n_bins]` at `temperature` (`0` = greedy), row `b` from `rngs[b]`,
    /// tokens in order.
    pub(super) fn draw_decisions(
        &self,
        logits: &Tensor,
        rngs: &mut [ChaCha8Rng],
        temperature: f64,
    ) -> Vec<Decision> {
        let logp = log_softmax_at(logits, temperature);
        let logp = Vec::<f32>::try_from(logp.to(Device::Cpu).view([-1])).expect("f32 log-probs");
        let (n_bins, tokens) = (self.config.n_bins as usize, self.tokens_per_decision());
        rngs.iter_mut()
            .enumerate()
            .map(|(row, rng)| {
                let mut decision = Decision {
                    tokens: Vec::with_capacity(tokens),
                    token_logprobs: Vec::with_capacity(tokens),
                    logprob: 0.0,
                };
                let mut sum = 0.0f64;
                for t in 0..tokens {
                    let start = (row * tokens + t) * n_bins;
                    let token_logp = &logp[start..start + n_bins];
                    let token = if temperature > 0.0 {
                        draw(token_logp, 1.0, rng)
                    } else {
                        arg_max(token_logp)
                    };
                    decision.tokens.push(token as u32);
                    decision.token_logprobs.push(token_logp[token]);
                    sum += f64::from(token_logp[token]);
                }
                decision.logprob = sum as f32;
                decision
            })
            .collect()
    }

    /// Log-prob `[batch, K × D]` of each action token of `tokens` (one
    /// decision per row) under `logits / temperature`, with gradients when
    /// gradients are on.
    pub fn token_logprobs(
        &self,
        batch: &[Observation],
        tokens: &[&[u32]],
        temperature: f64,
    ) -> Result<Tensor, VlaError> {
        let (logprobs, _) = self.token_scores(batch, tokens, temperature, Entropy::Skip)?;
        Ok(logprobs)
    }

    /// [`Vla::token_logprobs`] and, as `entropy` asks, the entropy
    /// `[batch, K × D]` of each action token's distribution under
    /// `logits / temperature`, from one forward pass (a trainer's
    /// log-probs and entropy metric or bonus).
    pub fn token_scores(
        &self,
        batch: &[Observation],
        tokens: &[&[u32]],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<(Tensor, Option<Tensor>), VlaError> {
        check_temperature(temperature)?;
        let targets = self.action_tokens(tokens, batch.len())?;
        let log_probs = log_softmax_at(&self.logits(batch)?, temperature);
        Ok((gather_tokens(&log_probs, &targets), entropy.of(&log_probs)))
    }

    /// Log-prob `[batch]` of each row's decision: the sum of
    /// [`Vla::token_logprobs`] over its `K × D` tokens.
    pub fn decision_logprobs(
        &self,
        batch: &[Observation],
        tokens: &[&[u32]],
        temperature: f64,
    ) -> Result<Tensor, VlaError> {
        Ok(self
            .token_logprobs(batch, tokens, temperature)?
            .sum_dim_intlist(1, false, Kind::Float))
    }

    /// Behaviour-cloning loss (a scalar with gradients): the mean
    /// cross-entropy of the target `tokens` over the action tokens of each
    /// row's first `valid_steps[row]` chunk steps (all `K` when `None`; the
    /// steps after an episode's end are left out).
    pub fn bc_loss(
        &self,
        batch: &[Observation],
        tokens: &[&[u32]],
        valid_steps: Option<&[usize]>,
    ) -> Result<Tensor, VlaError> {
        let targets = self.action_tokens(tokens, batch.len())?;
        let mask = self.valid_mask(valid_steps, batch.len())?;
        let logits = self.logits(batch)?;
        Ok(masked_nll(&logits, &targets, mask.as_ref()))
    }

    /// 1 on the action tokens of each row's first `valid_steps[row]` chunk
    /// steps, 0 after (`None`: every token counts), `[batch, K × D]`.
    pub(super) fn valid_mask(
        &self,
        valid_steps: Option<&[usize]>,
        batch: usize,
    ) -> Result<Option<Tensor>, VlaError> {
        let (k, d) = (self.config.chunk_len, self.config.action_dim);
        Ok(match valid_steps {
            None => None,
            Some(valid) => {
                check_rows("valid_steps", valid.len(), batch)?;
                let mut mask = Vec::with_capacity(valid.len() * (k * d) as usize);
                for (row, &steps) in valid.iter().enumerate() {
                    if steps == 0 || steps as i64 > k {
                        return Err(VlaError::ValidSteps {
                            row,
                            found: steps,
                            chunk_len: k,
                        });
                    }
                    for step in 0..k as usize {
                        let on = if step < steps { 1.0f32 } else { 0.0 };
                        mask.extend(std::iter::repeat_n(on, d as usize));
                    }
                }
                Some(
                    Tensor::from_slice(&mask)
                        .view([batch as i64, k * d])
                        .to(self.device()),
                )
            }
        })
    }

    fn tokens_per_decision(&self) -> usize {
        self.config.n_action_tokens() as usize
    }

    /// Target tokens `[batch, K × D]` (int64, on the device), checked.
    pub(super) fn action_tokens(
        &self,
        tokens: &[&[u32]],
        batch: usize,
    ) -> Result<Tensor, VlaError> {
        check_rows("action tokens", tokens.len(), batch)?;
        let per = self.tokens_per_decision();
        let n_bins = self.config.n_bins;
        let mut flat = Vec::with_capacity(batch * per);
        for (row, decision) in tokens.iter().enumerate() {
            if decision.len() != per {
                return Err(VlaError::ChunkShape {
                    row,
                    found: decision.len(),
                    expected: per as i64,
                });
            }
            for (position, &token) in decision.iter().enumerate() {
                if i64::from(token) >= n_bins {
                    return Err(VlaError::BadActionToken {
                        row,
                        position,
                        token,
                        n_bins,
                    });
                }
                flat.push(i64::from(token));
            }
        }
        Ok(Tensor::from_slice(&flat)
            .view([batch as i64, per as i64])
            .to(self.device()))
    }

    /// Final hidden states `[batch, time, embd]` of a batch's sequence
    /// `[ prefix | latent part | action placeholders ]` and where the
    /// prefix ends: the latent part present when `latent` is given (its
    /// `latents` written into the slots), the placeholders when `actions`
    /// is true; the trunk ([`super::trunk`]) embeds and runs the prefix.
    ///
    /// Every query sees the prefix keys its trunk lets it (an instruction
    /// pad is no one's key); latent queries see the latent part causally
    /// (keys up to their own); action queries see each other and the first
    /// `visible[b]` positions of the latent part (the chain up to the
    /// chosen `<latent_end>`). The prefix sees nothing after it, so nothing
    /// before a position depends on what comes after it.
    pub(super) fn hidden(
        &self,
        batch: &[Observation],
        latent: Option<&LatentInput>,
        actions: bool,
    ) -> Result<(Tensor, i64), VlaError> {
        let Sequence {
            proprio,
            tail,
            allowed,
        } = self.sequence(batch, latent, actions)?;
        self.trunk
            .hidden(&self.config, batch, proprio, tail, &allowed)
    }

    /// What the VLA embeds itself of a batch's sequence ([`Vla::hidden`]):
    /// the proprio token, the tail and the tail's attention.
    fn sequence(
        &self,
        batch: &[Observation],
        latent: Option<&LatentInput>,
        actions: bool,
    ) -> Result<Sequence, VlaError> {
        self.check_batch(batch)?;
        let config = &self.config;
        let device = self.device();
        let b = batch.len() as i64;
        let proprio_in = config.proprio_dim.max(1);
        let mut proprio = Vec::with_capacity(batch.len() * proprio_in as usize);
        for row in batch {
            match config.proprio_dim {
                0 => proprio.push(0.0),
                _ => proprio.extend_from_slice(row.proprio),
            }
        }
        let proprio = self
            .proprio_embed
            .forward(
                &Tensor::from_slice(&proprio)
                    .view([b, proprio_in])
                    .to(device)
                    .to_kind(self.kind()),
            )
            .unsqueeze(1);
        let mut parts = Vec::new();
        let latent_len = match latent {
            None => 0,
            Some(input) => {
                let part = self.latent_part(&input.latents)?;
                let len = part.size()[1];
                parts.push(part);
                len
            }
        };
        if actions {
            let n = config.n_action_tokens();
            parts.push(
                self.action_query
                    .view([1, 1, config.n_embd])
                    .expand([b, n, config.n_embd], false),
            );
        }
        let tail = match parts.is_empty() {
            true => Tensor::zeros([b, 0, config.n_embd], (self.kind(), device)),
            false => Tensor::cat(&parts, 1),
        };
        let time = tail.size()[1];
        let columns = Tensor::arange(time, (Kind::Int64, device));
        let is_latent = columns.lt(latent_len);
        let is_action = columns.ge(latent_len);
        // [query, key]: latent queries see the latent part causally;
        // action queries see the actions.
        let causal = columns.unsqueeze(0).le_tensor(&columns.unsqueeze(1));
        let mut allowed = is_latent
            .unsqueeze(1)
            .logical_and(&is_latent.unsqueeze(0))
            .logical_and(&causal)
            .logical_or(&is_action.unsqueeze(1).logical_and(&is_action.unsqueeze(0)))
            .unsqueeze(0); // [1, q, k]
        if let (Some(input), true) = (latent, actions) {
            check_rows("visible latent positions", input.visible.len(), batch.len())?;
            let visible = Tensor::from_slice(&input.visible).to(device); // [b]
            let seen = is_latent
                .unsqueeze(0)
                .logical_and(&columns.unsqueeze(0).lt_tensor(&visible.unsqueeze(1))); // [b, k]
            allowed =
                allowed.logical_or(&is_action.view([1, time, 1]).logical_and(&seen.unsqueeze(1)));
        }
        Ok(Sequence {
            proprio,
            tail,
            allowed,
        })
    }

    /// Logits `[batch, K × D, n_bins]` (f32) of the action placeholders
    /// (the last `K × D` positions) of hidden states `[batch, time, embd]`:
    /// the action head's, or the trunk's vocabulary rows of the bins, run
    /// in the parameters' dtype and upcast before any `log_softmax`.
    pub(super) fn action_logits(&self, hidden: &Tensor) -> Tensor {
        let actions = self.config.n_action_tokens();
        let time = hidden.size()[1];
        let at_actions = hidden.narrow(1, time - actions, actions);
        match &self.action_head {
            Some(head) => head.forward(&at_actions),
            None => self
                .trunk
                .vocab_action_logits(&at_actions, self.config.n_bins)
                .expect("a VLA without an action head reads its trunk's vocabulary"),
        }
        .to_kind(Kind::Float)
    }

    fn check_batch(&self, batch: &[Observation]) -> Result<(), VlaError> {
        if batch.is_empty() {
            return Err(VlaError::EmptyBatch);
        }
        let config = &self.config;
        let size = config.image_size as usize;
        for (row, observation) in batch.iter().enumerate() {
            let Observation {
                image,
                height,
                width,
                proprio,
                instruction,
            } = *observation;
            let channels = config.channels as usize;
            if height != size || width != size || image.len() != size * size * channels {
                return Err(VlaError::ImageShape {
                    row,
                    height,
                    width,
                    bytes: image.len(),
                    size: config.image_size,
                    channels: config.channels,
                });
            }
            if proprio.len() as i64 != config.proprio_dim {
                return Err(VlaError::Proprio {
                    row,
                    reason: format!(
                        "has {} values, the config's proprio_dim is {}",
                        proprio.len(),
                        config.proprio_dim
                    ),
                });
            }
            if let Some(index) = proprio.iter().position(|v| !v.is_finite()) {
                return Err(VlaError::Proprio {
                    row,
                    reason: format!("value {} at index {index} is not finite", proprio[index]),
                });
            }
            if instruction.len() as i64 > config.max_instruction {
                return Err(VlaError::Instruction {
                    row,
                    reason: format!(
                        "of {} tokens exceeds max_instruction {}",
                        instruction.len(),
                        config.max_instruction
                    ),
                });
            }
            let vocab = config.vocab_size;
            if let Some(position) = instruction
                .iter()
                .position(|&id| id < 0 || i64::from(id) >= vocab)
            {
                return Err(VlaError::Instruction {
                    row,
                    reason: format!(
                        "token {} at position {position} is outside the vocabulary 0..{vocab}",
                        instruction[position]
                    ),
                });
            }
        }
        Ok(())
    }

    /// The latent chain's shape, or the error of a policy without one.
    pub(super) fn latent_shape(&self) -> Result<&LatentConfig, VlaError> {
        self.config.latent.as_ref().ok_or_else(|| {
            VlaError::Latents(
                "this VLA has no latent chain of thought (its config has no `latent`)".into(),
            )
        })
    }

    pub(super) fn latent_parts(&self) -> &LatentParts {
        self.latent
            .as_ref()
            .expect("a latent config comes with latent parameters")
    }

    /// The latent part's embeddings `[batch, positions, embd]` with
    /// `latents` `[batch, L, embd]` in the slots.
    fn latent_part(&self, latents: &Tensor) -> Result<Tensor, VlaError> {
        let shape = self.latent_shape()?;
        let parts = self.latent_parts();
        let (b, e) = (latents.size()[0], self.config.n_embd);
        let token = |t: &Tensor| t.view([1, 1, e]).expand([b, 1, e], false);
        let norm = latents.norm_scalaropt_dim(2.0, [2], true).clamp_min(1e-6);
        // Rescaled in the latents' own precision, then cast to the parameters'.
        let slots = (latents / norm * (e as f64).sqrt()).to_kind(parts.start.kind());
        let mut pieces = vec![token(&parts.start)];
        for m in 0..shape.candidates() {
            pieces.push(slots.narrow(1, m * shape.group, shape.group));
            pieces.push(token(&parts.end));
        }
        Ok(Tensor::cat(&pieces, 1))
    }
}

#[cfg(test)]
mod tests;
