//! A VLA's architecture as its checkpoint's `config.json` stores it
//! (`"kind": "vla"`): [`VlaConfig`] and its two optional sections, the
//! latent chain ([`LatentConfig`], `latent`) and a Hugging Face trunk
//! ([`HfTrunkConfig`], `trunk`, with where the action logits come from,
//! [`ActionTokens`]).
//!
//! The sequence a config describes, the trunk's `n_ctx`:
//!
//! ```text
//! n_ctx = (image_size / patch_size)² + 1 + max_instruction
//!         + (latent.length + latent.length / latent.group + 1)   (with a latent chain)
//!         + chunk_len · action_dim
//! ```
//!
//! [`VlaConfig::check`] refuses a config that describes no network, naming
//! the key; [`VlaConfig::tensors`] lists every parameter it implies.
//!
//! ```
//! use embodyflow_models::vla::{LatentConfig, VlaConfig};
//! let config = VlaConfig { chunk_len: 8, latent: Some(LatentConfig::last_r1()), ..VlaConfig::small(64) };
//! config.check().unwrap();
//! assert_eq!((config.n_patches(), config.n_action_tokens()), (16, 8 * 4));
//! assert_eq!(LatentConfig::last_r1().candidate_lengths(), [2, 4, 6, 8]);
//! let bad = VlaConfig { patch_size: 5, ..VlaConfig::small(64) };
//! assert_eq!(bad.check().unwrap_err(), "patch_size 5 must divide image_size 32");
//! ```

use std::path::Path;

use embodyflow_hf::HfError;
use embodyflow_hf::image::ImageProcessor;
use embodyflow_hf::safetensors::Expected;
use embodyflow_hf::vl::{Layout, VlConfig};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::gpt::GptConfig;

/// Architecture of a [`Vla`](super::Vla), stored as a checkpoint's `config.json` (with
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
    /// Channels of the small trunk's convolutional stem: two 3 × 3
    /// convolutions (stride 1, GELU) before the patches are cut, so each
    /// patch is embedded from per-pixel features rather than raw colours
    /// (Xiao et al. 2021, "Early convolutions help transformers see
    /// better"). Absent from a config, or 0: no stem, the patches are the
    /// pixels (a linear patch embedding, as ViT).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stem_channels: i64,
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
    /// Earlier decisions of its episode each decision's prompt recalls,
    /// `H`: their observed texts and actions in verl-agent's history
    /// prompt (`embodyflow_world::history_prompt`), which every stage that
    /// acts or trains builds alike; `max_instruction` counts the whole
    /// prompt. Absent from a config, or 0: the prompt holds the
    /// instruction and the current text alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history: i64,
    /// Width of the residual stream.
    pub n_embd: i64,
    /// Attention heads (must divide `n_embd`).
    pub n_head: i64,
    /// Transformer blocks.
    pub n_layer: i64,
    /// LaST-R1's latent chain of thought before the actions ([`latent`](super::latent));
    /// absent: the actions follow the observation directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latent: Option<LatentConfig>,
    /// The trunk: a Hugging Face vision-language model ([`trunk`](super::trunk)); absent:
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

fn is_zero(value: &i64) -> bool {
    *value == 0
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
            stem_channels: 0,
            proprio_dim: 5,
            chunk_len: 8,
            action_dim: 4,
            n_bins: 256,
            action_low: -1.0,
            action_high: 1.0,
            history: 0,
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
        if self.stem_channels < 0 {
            return Err(format!(
                "stem_channels must be at least 0 (0: no convolutional stem), found {}",
                self.stem_channels
            ));
        }
        if self.stem_channels > 0 && self.trunk.is_some() {
            return Err("stem_channels: a convolutional stem is the small trunk's; a model trunk has its own vision encoder".into());
        }
        if self.history < 0 {
            return Err(format!(
                "history must be at least 0 (0: prompts recall no earlier decision), found {}",
                self.history
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
            .and_then(|n| n.checked_mul(self.patch_channels().max(3)))
            .is_none()
            || self
                .stem_channels
                .checked_mul(self.stem_channels.max(self.channels) * 9)
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

    /// Every parameter [`Vla::new`](super::Vla::new) creates, by name and shape, with the
    /// config keys it follows from: the trunk's (the small one's
    /// [`GptConfig::tensors`], its `n_ctx` derived from the sequence, and
    /// the patch embedding; a model's under transformers' names), then the
    /// VLA's own. The small trunk's are lazy.
    pub fn tensors(&self) -> Box<dyn Iterator<Item = Expected>> {
        let e = self.n_embd;
        let p = self.patch_size;
        let mut own = Vec::new();
        if self.trunk.is_none() {
            let s = self.stem_channels;
            if s > 0 {
                own.extend([
                    Expected::new(
                        "stem.conv1.weight",
                        &[s, self.channels, 3, 3],
                        "stem_channels, channels",
                    ),
                    Expected::new("stem.conv1.bias", &[s], "stem_channels"),
                    Expected::new("stem.conv2.weight", &[s, s, 3, 3], "stem_channels"),
                    Expected::new("stem.conv2.bias", &[s], "stem_channels"),
                ]);
            }
            own.push(Expected::new(
                "patch_embed.weight",
                &[e, p * p * self.patch_channels()],
                "patch_size, channels, stem_channels, n_embd",
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
    pub(super) fn has_action_head(&self) -> bool {
        self.trunk
            .as_ref()
            .is_none_or(|t| t.action_tokens == ActionTokens::Head)
    }

    /// Image patches per observation: `(image_size / patch_size)²`.
    pub fn n_patches(&self) -> i64 {
        let side = self.image_size / self.patch_size;
        side * side
    }

    /// Channels of the map the small trunk cuts patches from: the stem's,
    /// or the frame's without one.
    pub fn patch_channels(&self) -> i64 {
        if self.stem_channels > 0 {
            self.stem_channels
        } else {
            self.channels
        }
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

    /// The small trunk: a [`Gpt`](crate::gpt::Gpt) over the whole sequence (its embedding
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

/// The latent chain's shape (a [`VlaConfig`](super::VlaConfig)'s `latent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatentConfig {
    /// Most latent vectors before the actions (LaST-R1's `latent_length`, 8).
    pub length: i64,
    /// Latents per group; a `<latent_end>` candidate follows each group
    /// (`latent_length / latent_end_num`, 2).
    pub group: i64,
}

impl LatentConfig {
    /// LaST-R1's LIBERO setting: 8 latents in groups of 2 (stops at 2, 4, 6, 8).
    pub fn last_r1() -> LatentConfig {
        LatentConfig {
            length: 8,
            group: 2,
        }
    }

    /// Why this is no latent chain, if it is not.
    pub fn check(&self) -> Result<(), String> {
        if self.length < 1 || self.group < 1 {
            return Err(format!(
                "latent.length and latent.group must be at least 1, found {} and {}",
                self.length, self.group
            ));
        }
        if self.length % self.group != 0 {
            return Err(format!(
                "latent.group {} must divide latent.length {}",
                self.group, self.length
            ));
        }
        Ok(())
    }

    /// Stop candidates `M = length / group`.
    pub fn candidates(&self) -> i64 {
        self.length / self.group
    }

    /// Latent lengths of the candidates: `group, 2·group, …, length`.
    pub fn candidate_lengths(&self) -> Vec<usize> {
        (1..=self.candidates())
            .map(|m| (m * self.group) as usize)
            .collect()
    }

    /// Positions of the latent part: `<latent_start>`, the slots and one
    /// `<latent_end>` per group.
    pub fn positions(&self) -> i64 {
        1 + self.length + self.candidates()
    }

    /// Position of latent slot `i` inside the latent part.
    pub(super) fn slot(&self, i: i64) -> i64 {
        1 + i + i / self.group
    }

    /// Position of candidate `m`'s `<latent_end>` inside the latent part.
    pub(super) fn end(&self, m: i64) -> i64 {
        (m + 1) * (self.group + 1)
    }
}

/// The most decoder layers or vision blocks a trunk config may declare (its
/// tensor list is built before the weights are read).
const MAX_LAYERS: i64 = 4096;

/// Where the action tokens' logits come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionTokens {
    /// A separate linear head over the trunk's hidden states, `n_bins`
    /// outputs (`action_head.*`).
    #[default]
    Head,
    /// OpenVLA's: bin `b` is the language model's vocabulary id `V − n_bins
    /// + b`, its logit that row of the output embedding.
    Vocab,
}

/// A Hugging Face vision-language model as the trunk (`trunk` in a VLA's
/// `config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfTrunkConfig {
    /// The model's `config.json`, as read.
    pub model: Map<String, Value>,
    /// Its `preprocessor_config.json`, as read.
    pub processor: Map<String, Value>,
    /// Where the action tokens' logits come from.
    #[serde(default)]
    pub action_tokens: ActionTokens,
    /// Keep the vision tower's weights fixed (no gradients).
    #[serde(default)]
    pub freeze_vision: bool,
}

impl HfTrunkConfig {
    /// The trunk config of model directory `dir` (`config.json` and
    /// `preprocessor_config.json`, checked as a plan policy's are).
    pub fn from_dir(
        dir: &Path,
        action_tokens: ActionTokens,
        freeze_vision: bool,
    ) -> Result<HfTrunkConfig, HfError> {
        let config = VlConfig::from_file(&dir.join("config.json"))?;
        let processor = ImageProcessor::for_model(dir, &config)?;
        let processor_map = std::fs::read_to_string(&processor.file)
            .map_err(|source| HfError::Read {
                file: processor.file.clone(),
                source,
            })
            .and_then(|text| {
                serde_json::from_str(&text).map_err(|e| HfError::BadConfig {
                    file: processor.file.clone(),
                    reason: e.to_string(),
                })
            })?;
        Ok(HfTrunkConfig {
            model: config.source,
            processor: processor_map,
            action_tokens,
            freeze_vision,
        })
    }

    /// The resolved model config and image processor (errors name
    /// `trunk.model` or `trunk.processor` and the key).
    pub fn resolve(&self) -> Result<(VlConfig, ImageProcessor), HfError> {
        let text = Value::Object(self.model.clone()).to_string();
        let config = VlConfig::parse(&text, Path::new("trunk.model"))?;
        let text = Value::Object(self.processor.clone()).to_string();
        let processor = ImageProcessor::parse(&text, Path::new("trunk.processor"))?;
        processor.check_model(&config)?;
        Ok((config, processor))
    }

    /// Why `vla` (whose trunk this is) describes no network, if it does not:
    /// its width, heads, layers and vocabulary must be the model's, its
    /// frames RGB cameras the processor can resize, its bins inside the
    /// vocabulary when they are vocabulary ids.
    pub(super) fn check(&self, vla: &VlaConfig) -> Result<(), String> {
        let (config, processor) = self.resolve().map_err(|e| e.to_string())?;
        let text = &config.text;
        for (key, ours, theirs_key, theirs) in [
            ("vocab_size", vla.vocab_size, "vocab_size", text.vocab_size),
            ("n_embd", vla.n_embd, "hidden_size", text.hidden_size),
            (
                "n_head",
                vla.n_head,
                "num_attention_heads",
                text.num_attention_heads,
            ),
            (
                "n_layer",
                vla.n_layer,
                "num_hidden_layers",
                text.num_hidden_layers,
            ),
        ] {
            if ours != theirs {
                return Err(format!(
                    "{key} {ours} differs from the trunk's (trunk.model) {theirs_key} {theirs}"
                ));
            }
        }
        if text.num_hidden_layers > MAX_LAYERS || config.vision.depth > MAX_LAYERS {
            return Err(format!(
                "trunk.model declares {} decoder layers and {} vision blocks; at most {MAX_LAYERS} each",
                text.num_hidden_layers, config.vision.depth
            ));
        }
        if vla.image_size < 1 || vla.channels % 3 != 0 {
            return Err(format!(
                "a vision-language trunk sees RGB frames: image_size {} must be at least 1 and channels {} a multiple of 3",
                vla.image_size, vla.channels
            ));
        }
        processor
            .smart_resize(vla.image_size, vla.image_size)
            .map_err(|e| e.to_string())?;
        if self.action_tokens == ActionTokens::Vocab && vla.n_bins >= vla.vocab_size {
            return Err(format!(
                "n_bins {} action tokens as vocabulary ids need a larger vocabulary than {}",
                vla.n_bins, vla.vocab_size
            ));
        }
        Ok(())
    }

    /// The model's parameters under transformers' names (empty for a
    /// config [`HfTrunkConfig::check`] refuses).
    pub(super) fn tensors(&self) -> Vec<Expected> {
        match self.resolve() {
            Ok((config, _)) => config.tensors(&Layout::CURRENT).collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Vocabulary id of action bin `bin` when the action tokens are the last
/// `n_bins` ids of a vocabulary of `vocab` rows (OpenVLA).
pub fn vocab_id(bin: u32, n_bins: i64, vocab: i64) -> i64 {
    vocab - n_bins + i64::from(bin)
}

/// The action bin of vocabulary id `id` ([`vocab_id`]'s inverse), `None`
/// for an id outside the last `n_bins`.
pub fn bin_of(id: i64, n_bins: i64, vocab: i64) -> Option<u32> {
    let bin = id - (vocab - n_bins);
    (0..n_bins).contains(&bin).then_some(bin as u32)
}
