//! A vision-language-action policy (VLA) that decodes a whole action chunk
//! in one forward pass, after OpenVLA-OFT's parallel decoding: the closed-loop
//! policy of SimpleVLA-RL.
//!
//! One decision reads an observation — an image `S × S × C` (bytes,
//! row-major: `C = channels`, 3 for RGB, 6 for two RGB cameras joined along
//! the channels, as LIBERO's agent-view and wrist views), a proprio vector of `proprio_dim` floats and the instruction's
//! token ids (the checkpoint's tokenizer) — and emits `K × D` action tokens
//! (`K = chunk_len` actions of `D = action_dim` dimensions, flattened step
//! after step: token `t` is dimension `t % D` of action `t / D`), each a bin
//! of `n_bins` over `[action_low, action_high]`:
//! `embodyflow_algos::action_tokens::ActionBins` (OpenVLA's 256 bins over
//! `[-1, 1]`) turns actions into tokens and back; the model knows only bins.
//!
//! The sequence, embedded and run through the [`Gpt`] trunk's blocks:
//!
//! ```text
//! [ patch_1 … patch_P | proprio | instr_1 … instr_L | act_1 … act_{K·D} ]
//!   P = (S / p)², patch_i = W_patch · pixels(p × p × C) / 127.5 − 1
//!   proprio = W_proprio · proprio (a constant 0 when proprio_dim = 0: a
//!   world without proprio, as a text-only env),  instr_j = wte[id_j],  act_t = q (learned)
//!   every input + wpe[position];  positions: prefix 0.., actions after
//!   the longest instruction (P + 1 + max_instruction + t), whatever L is
//! logits[b, t, :] = W_head · h_L[b, act_t]          ([B, K·D, n_bins])
//! ```
//!
//! Attention (one bool mask per forward pass): the prefix (patches, proprio,
//! instruction) is bidirectional among itself, as a ViT over patches is, and
//! never sees the action placeholders, so its states do not depend on them;
//! the placeholders see the whole prefix and each other (full attention: the
//! chunk is decoded jointly, not token after token). Instruction pads are
//! never attended to, so a row's logits do not depend on the batch it is in.
//!
//! A decision's distribution is the product of its token distributions at
//! temperature `T`: `log π(a | o) = Σ_t log_softmax(logits[t] / T)[a_t]`
//! (the chunk is one decision, its log-prob the sum over its
//! tokens). Sampling draws each token by inverse CDF from one ChaCha8 stream
//! per row seeded by the row's seed (as [`crate::policy`] does), tokens in
//! order; `T = 0` is greedy (arg max, log-probs at `T = 1`). Behaviour
//! cloning is the mean cross-entropy over the action tokens of the chunk
//! steps that lie within the episode.
//!
//! Over bf16 parameters (`train.precision = "bf16"`: bf16 copies of fp32
//! master weights, [`crate::precision`]) the network runs in bf16: the
//! pixels, proprio and latent slots are cast to the parameters' dtype where
//! they enter, and the heads' outputs (action logits, `<latent_end>` logits,
//! values) and the predicted latents are upcast to f32, so every log-prob,
//! value and loss is computed in f32.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::vla::{Observation, Vla};
//! let policy = Checkpoint::<Vla>::load_kind("runs/sft/policy".as_ref(), tch::Device::Cpu).unwrap();
//! let image = vec![0u8; 32 * 32 * 3];
//! let proprio = [0.5f32, 0.1, 0.25, 0.0, 0.0];
//! let instruction = [17, 42, 9];
//! let row = Observation { image: &image, height: 32, width: 32, proprio: &proprio, instruction: &instruction };
//! let decisions = policy.model.sample(&[row, row], &[7, 8], 1.6).unwrap();
//! assert_eq!(decisions[0].tokens.len(), 8 * 4);
//! let tokens: Vec<&[u32]> = decisions.iter().map(|d| d.tokens.as_slice()).collect();
//! let logp = policy.model.decision_logprobs(&[row, row], &tokens, 1.6).unwrap(); // [2]
//! ```

use embodyflow_core::{Classify, ErrorKind};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use crate::checkpoint::{self, ConfigTag, PolicyKind, PolicyNet};
#[cfg(doc)]
use crate::gpt::Gpt;
use crate::gpt::GptConfig;
use crate::policy::{Entropy, arg_max, draw};
use embodyflow_hf::safetensors::Expected;

pub mod latent;
pub mod trunk;

pub use latent::{
    LatentConfig, LatentDecision, LatentScores, VALUE_HEAD, WarmupConfig, WarmupLoss,
};
use latent::{LatentInput, LatentParts};
use trunk::Trunk;
pub use trunk::{ActionTokens, HfTrunkConfig};

/// Architecture of a [`Vla`], stored as a checkpoint's `config.json` (with
/// `"kind": "vla"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VlaConfig {
    /// Tokens in the instruction vocabulary (the tokenizer's).
    pub vocab_size: i64,
    /// Most instruction tokens.
    pub max_instruction: i64,
    /// Side of the square RGB image, in pixels (0: a world without frames,
    /// such as a state-only Gymnasium environment: no patches).
    pub image_size: i64,
    /// Side of a square patch (must divide `image_size`).
    pub patch_size: i64,
    /// Channels per pixel: 3 (RGB), or 3 per camera when a world joins
    /// several named images along the channels (LIBERO's agent-view and
    /// wrist cameras: 6, `embodyflow_core::observation` version 2); each
    /// patch reads every channel, so the patch embedding sees all cameras
    /// at the same place. Absent from a config: 3.
    #[serde(default = "rgb", skip_serializing_if = "is_rgb")]
    pub channels: i64,
    /// Length of the proprio vector.
    pub proprio_dim: i64,
    /// Actions per decision (`K`).
    pub chunk_len: i64,
    /// Dimensions per action (`D`).
    pub action_dim: i64,
    /// Bins (tokens) per action dimension.
    pub n_bins: i64,
    /// Lowest action value (the first bin's edge).
    pub action_low: f64,
    /// Highest action value (the last bin's edge).
    pub action_high: f64,
    /// Width of the residual stream.
    pub n_embd: i64,
    /// Attention heads (must divide `n_embd`).
    pub n_head: i64,
    /// Transformer blocks.
    pub n_layer: i64,
    /// LaST-R1's latent chain of thought before the actions ([`latent`]);
    /// absent: the actions follow the observation directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latent: Option<LatentConfig>,
    /// The trunk: a Hugging Face vision-language model ([`trunk`]); absent:
    /// our small transformer of `n_embd`, `n_head`, `n_layer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunk: Option<HfTrunkConfig>,
}

fn rgb() -> i64 {
    3
}

fn is_rgb(channels: &i64) -> bool {
    *channels == 3
}

impl VlaConfig {
    /// The default shape, small enough for a CPU: 32 × 32 RGB images in 16
    /// patches of 8 × 8, proprio of 5, instructions of up to 32 tokens,
    /// chunks of 8 actions of 4 dimensions, OpenVLA's 256 bins over
    /// `[-1, 1]`, width 128, 4 heads, 4 layers.
    pub fn small(vocab_size: i64) -> VlaConfig {
        VlaConfig {
            vocab_size,
            max_instruction: 32,
            image_size: 32,
            patch_size: 8,
            channels: 3,
            proprio_dim: 5,
            chunk_len: 8,
            action_dim: 4,
            n_bins: 256,
            action_low: -1.0,
            action_high: 1.0,
            n_embd: 128,
            n_head: 4,
            n_layer: 4,
            latent: None,
            trunk: None,
        }
    }

    /// Why this config describes no network, if it does not.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("patch_size", self.patch_size),
            ("channels", self.channels),
            ("chunk_len", self.chunk_len),
            ("action_dim", self.action_dim),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_layer", self.n_layer),
        ];
        for (name, value) in positive {
            if value < 1 {
                return Err(format!("{name} must be at least 1, found {value}"));
            }
        }
        if self.proprio_dim < 0 {
            return Err(format!(
                "proprio_dim must be at least 0 (0: a world without proprio), found {}",
                self.proprio_dim
            ));
        }
        if self.image_size < 0 {
            return Err(format!(
                "image_size must be at least 0 (0: a world without frames), found {}",
                self.image_size
            ));
        }
        if self.max_instruction < 0 {
            return Err(format!(
                "max_instruction must be at least 0, found {}",
                self.max_instruction
            ));
        }
        if self.trunk.is_none() && self.image_size % self.patch_size != 0 {
            return Err(format!(
                "patch_size {} must divide image_size {}",
                self.patch_size, self.image_size
            ));
        }
        if self.n_bins < 2 {
            return Err(format!("n_bins must be at least 2, found {}", self.n_bins));
        }
        if !(self.action_low.is_finite()
            && self.action_high.is_finite()
            && self.action_low < self.action_high)
        {
            return Err(format!(
                "need finite action_low < action_high, found [{}, {}]",
                self.action_low, self.action_high
            ));
        }
        if self.n_embd % self.n_head != 0 {
            return Err(format!(
                "n_head {} must divide n_embd {}",
                self.n_head, self.n_embd
            ));
        }
        if let Some(latent) = &self.latent {
            latent.check()?;
        }
        if let Some(trunk) = &self.trunk {
            trunk.check(self)?;
        }
        if self.sequence_len().is_none() {
            return Err(format!(
                "the sequence of (image_size / patch_size)² patches, proprio, max_instruction, \
                 latent and chunk_len × action_dim action tokens is too long to count \
                 (image_size {}, patch_size {}, max_instruction {}, chunk_len {}, action_dim {})",
                self.image_size,
                self.patch_size,
                self.max_instruction,
                self.chunk_len,
                self.action_dim
            ));
        }
        if self
            .patch_size
            .checked_mul(self.patch_size)
            .and_then(|n| n.checked_mul(3))
            .is_none()
            || self.n_embd.checked_mul(4).is_none()
        {
            return Err(format!(
                "patch_size {} or n_embd {} is too large to count the parameters",
                self.patch_size, self.n_embd
            ));
        }
        Ok(())
    }

    /// The trunk's `n_ctx`: patches, proprio, the longest instruction, the
    /// latent part and the action tokens; `None` when it overflows.
    fn sequence_len(&self) -> Option<i64> {
        let side = self.image_size.checked_div(self.patch_size)?;
        let latent = match &self.latent {
            Some(latent) => latent
                .length
                .checked_add(latent.candidates())?
                .checked_add(1)?,
            None => 0,
        };
        side.checked_mul(side)?
            .checked_add(1)?
            .checked_add(self.max_instruction)?
            .checked_add(latent)?
            .checked_add(self.chunk_len.checked_mul(self.action_dim)?)
    }

    /// Every parameter [`Vla::new`] creates, by name and shape, with the
    /// config keys it follows from: the trunk's (the small one's
    /// [`GptConfig::tensors`], its `n_ctx` derived from the sequence, and
    /// the patch embedding; a model's under transformers' names), then the
    /// VLA's own. The small trunk's are lazy.
    pub fn tensors(&self) -> Box<dyn Iterator<Item = Expected>> {
        let e = self.n_embd;
        let p = self.patch_size;
        let mut own = Vec::new();
        if self.trunk.is_none() {
            own.push(Expected::new(
                "patch_embed.weight",
                &[e, p * p * self.channels],
                "patch_size, channels, n_embd",
            ));
            own.push(Expected::new("patch_embed.bias", &[e], "n_embd"));
        }
        own.extend([
            Expected::new(
                "proprio_embed.weight",
                &[e, self.proprio_dim.max(1)],
                "proprio_dim, n_embd",
            ),
            Expected::new("proprio_embed.bias", &[e], "n_embd"),
            Expected::new("action_query", &[e], "n_embd"),
        ]);
        if self.has_action_head() {
            own.push(Expected::new(
                "action_head.weight",
                &[self.n_bins, e],
                "n_bins, n_embd",
            ));
            own.push(Expected::new("action_head.bias", &[self.n_bins], "n_bins"));
        }
        if self.latent.is_some() {
            for name in ["latent_start", "latent_end"] {
                own.push(Expected::new(name, &[e], "latent, n_embd"));
            }
            for head in ["end_head", "value_head"] {
                own.push(Expected::new(
                    format!("{head}.weight"),
                    &[1, e],
                    "latent, n_embd",
                ));
                own.push(Expected::new(format!("{head}.bias"), &[1], "latent"));
            }
        }
        let keys = "image_size, patch_size, max_instruction, latent, chunk_len, action_dim, n_embd";
        match &self.trunk {
            None => Box::new(self.small_trunk().tensors(keys).chain(own)),
            Some(trunk) => Box::new(trunk.tensors().into_iter().chain(own)),
        }
    }

    /// Whether the action tokens' logits come from `action_head` (the
    /// small trunk always; a model unless its vocabulary gives them).
    fn has_action_head(&self) -> bool {
        self.trunk
            .as_ref()
            .is_none_or(|t| t.action_tokens == ActionTokens::Head)
    }

    /// Image patches per observation: `(image_size / patch_size)²`.
    pub fn n_patches(&self) -> i64 {
        let side = self.image_size / self.patch_size;
        side * side
    }

    /// Action tokens per decision: `chunk_len × action_dim`.
    pub fn n_action_tokens(&self) -> i64 {
        self.chunk_len * self.action_dim
    }

    /// Positions before the latent part: patches, proprio and the longest
    /// instruction.
    pub(crate) fn prefix_len(&self) -> i64 {
        self.n_patches() + 1 + self.max_instruction
    }

    /// The small trunk: a [`Gpt`] over the whole sequence (its embedding
    /// embeds the instruction; its tied output head is not used).
    pub(crate) fn small_trunk(&self) -> GptConfig {
        GptConfig {
            vocab_size: self.vocab_size,
            // Counted without overflow by `check`; a config it refuses
            // gets a length no weights have.
            n_ctx: self.sequence_len().unwrap_or(i64::MAX),
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_layer: self.n_layer,
        }
    }
}

/// One row of a batch: what the policy sees at a decision.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// RGB bytes, `height × width × 3`, row-major.
    pub image: &'a [u8],
    /// Image height in pixels.
    pub height: usize,
    /// Image width in pixels.
    pub width: usize,
    /// The proprio vector.
    pub proprio: &'a [f32],
    /// The instruction's token ids.
    pub instruction: &'a [i32],
}

/// A batch the policy cannot run, named by row.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VlaError {
    /// No rows.
    #[error("an empty batch")]
    EmptyBatch,
    /// A per-row argument whose length is not the batch's.
    #[error("{what}: {found} given for a batch of {batch} rows")]
    RowCount {
        /// The argument.
        what: &'static str,
        /// Its length.
        found: usize,
        /// Rows in the batch.
        batch: usize,
    },
    /// An image whose shape is not the config's.
    #[error(
        "row {row}: image of {height}x{width} ({bytes} bytes), the policy takes {size}x{size}x{channels}"
    )]
    ImageShape {
        /// The row.
        row: usize,
        /// Its stated height.
        height: usize,
        /// Its stated width.
        width: usize,
        /// Its bytes.
        bytes: usize,
        /// The config's `image_size`.
        size: i64,
        /// The config's `channels`.
        channels: i64,
    },
    /// A proprio vector of the wrong length or with a NaN or infinity.
    #[error("row {row}: proprio {reason}")]
    Proprio {
        /// The row.
        row: usize,
        /// What was wrong.
        reason: String,
    },
    /// An instruction too long or with a token outside the vocabulary.
    #[error("row {row}: instruction {reason}")]
    Instruction {
        /// The row.
        row: usize,
        /// What was wrong.
        reason: String,
    },
    /// A decision with the wrong number of action tokens.
    #[error("row {row}: {found} action tokens, a decision has chunk_len x action_dim = {expected}")]
    ChunkShape {
        /// The row.
        row: usize,
        /// Tokens given.
        found: usize,
        /// Tokens a decision has.
        expected: i64,
    },
    /// An action token that is not a bin.
    #[error("row {row}: action token {token} at position {position} is outside 0..{n_bins}")]
    BadActionToken {
        /// The row.
        row: usize,
        /// Position in the flattened chunk.
        position: usize,
        /// The token.
        token: u32,
        /// Bins per dimension.
        n_bins: i64,
    },
    /// A count of valid chunk steps outside `1..=chunk_len`.
    #[error("row {row}: {found} valid chunk steps, expected 1..={chunk_len}")]
    ValidSteps {
        /// The row.
        row: usize,
        /// The count given.
        found: usize,
        /// Actions per decision.
        chunk_len: i64,
    },
    /// A temperature that is negative or not finite.
    #[error("temperature {0} must be finite and at least 0")]
    Temperature(f64),
    /// A call that needs latents on a policy without them, or the reverse.
    #[error("{0}")]
    Latents(String),
    /// A batch the vision-language trunk cannot run (its image processor
    /// or its network refused it).
    #[error("the trunk: {0}")]
    Trunk(String),
    /// A row's latent chain of the wrong size or with a NaN or infinity.
    #[error("row {row}: latents {reason}")]
    LatentShape {
        /// The row.
        row: usize,
        /// What was wrong.
        reason: String,
    },
    /// A stop (candidate index) beyond the candidates.
    #[error(
        "row {row}: stop {stop} is beyond the {candidates} <latent_end> candidates (0..{candidates})"
    )]
    Stop {
        /// The row.
        row: usize,
        /// The stop given.
        stop: usize,
        /// Candidates per decision.
        candidates: i64,
    },
}

impl Classify for VlaError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::BadInput
    }
}

/// One sampled decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The `K × D` action tokens (bins), step after step.
    pub tokens: Vec<u32>,
    /// Log-prob of each token under `logits / T` (`T = 1` when greedy).
    pub token_logprobs: Vec<f32>,
    /// The decision's log-prob: the sum of its tokens'.
    pub logprob: f32,
}

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
    trunk: Trunk,
    proprio_embed: nn::Linear,
    action_query: Tensor,
    /// `None` when the trunk's vocabulary gives the action logits.
    action_head: Option<nn::Linear>,
    latent: Option<LatentParts>,
    config: VlaConfig,
}

impl PolicyNet for Vla {
    type Config = VlaConfig;
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
                special: trunk::vlm_special_ids(
                    &dir.join(checkpoint::TOKENIZER_FILE),
                    tokenizer,
                    config,
                )?,
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

    fn device(&self) -> Device {
        self.action_query.device()
    }

    /// The parameters' dtype (`Float`, or `BFloat16` over fp32 master
    /// weights: [`crate::precision`]): what the inputs are cast to where
    /// they enter the network.
    fn kind(&self) -> Kind {
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
    fn draw_decisions(
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
    fn valid_mask(
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
    fn action_tokens(&self, tokens: &[&[u32]], batch: usize) -> Result<Tensor, VlaError> {
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
    /// is true; the trunk ([`trunk`]) embeds and runs the prefix.
    ///
    /// Every query sees the prefix keys its trunk lets it (an instruction
    /// pad is no one's key); latent queries see the latent part causally
    /// (keys up to their own); action queries see each other and the first
    /// `visible[b]` positions of the latent part (the chain up to the
    /// chosen `<latent_end>`). The prefix sees nothing after it, so nothing
    /// before a position depends on what comes after it.
    fn hidden(
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
    fn action_logits(&self, hidden: &Tensor) -> Tensor {
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
}

/// Log-probs `[batch, K × D]` of `tokens` (int64 `[batch, K × D]`) under
/// `logits / temperature` (`logits` `[batch, K × D, n_bins]`;
/// `temperature = 0` reads as 1): the per-token terms of a decision's
/// log-prob, for token-level losses on logits already computed.
pub fn logprobs_of(logits: &Tensor, tokens: &Tensor, temperature: f64) -> Tensor {
    gather_tokens(&log_softmax_at(logits, temperature), tokens)
}

/// The mean cross-entropy of `targets` under `logits` (at `T = 1`) over
/// the tokens `mask` keeps (all when `None`).
fn masked_nll(logits: &Tensor, targets: &Tensor, mask: Option<&Tensor>) -> Tensor {
    masked_mean(&-logprobs_of(logits, targets, 1.0), mask)
}

/// The mean of `values` over the entries `mask` keeps (all when `None`).
fn masked_mean(values: &Tensor, mask: Option<&Tensor>) -> Tensor {
    match mask {
        None => values.mean(Kind::Float),
        Some(mask) => (values * mask).sum(Kind::Float) / mask.sum(Kind::Float),
    }
}

/// `log_probs[b, t, tokens[b, t]]`: `[batch, K × D]`.
fn gather_tokens(log_probs: &Tensor, tokens: &Tensor) -> Tensor {
    log_probs
        .gather(2, &tokens.unsqueeze(2), false)
        .squeeze_dim(2)
}

/// `log_softmax(logits / T)` over the bins (`T = 0`: at 1, for greedy).
fn log_softmax_at(logits: &Tensor, temperature: f64) -> Tensor {
    if temperature > 0.0 && temperature != 1.0 {
        (logits / temperature).log_softmax(-1, Kind::Float)
    } else {
        logits.log_softmax(-1, Kind::Float)
    }
}

fn check_rows(what: &'static str, found: usize, batch: usize) -> Result<(), VlaError> {
    if found != batch {
        return Err(VlaError::RowCount { what, found, batch });
    }
    Ok(())
}

fn check_temperature(temperature: f64) -> Result<(), VlaError> {
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(VlaError::Temperature(temperature));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
