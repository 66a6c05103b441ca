//! The VLA's trunk: the network between the embedded observation and the
//! heads, chosen by the config's `trunk` ([`VlaConfig::trunk`]).
//!
//! - **small** (no `trunk` in `config.json`): our [`Gpt`] blocks over
//!   `[patches | proprio | instruction | tail]`, the prefix bidirectional
//!   (the module doc of [`super`]);
//! - **a Hugging Face vision-language model** (Qwen2.5-VL, Qwen3-VL:
//!   [`VlNet`], `trunk.model` its `config.json` and `trunk.processor` its
//!   `preprocessor_config.json`, the weights under transformers' names
//!   beside the VLA's own in `model.safetensors`):
//!
//! ```text
//! ids     = per camera <|vision_start|> <|image_pad|>×n <|vision_end|>,
//!           then proprio, instr_1 … instr_L, tail_1 … tail_N
//!           (n = t·h·w / merge² of the processor's grid for an S × S frame)
//! h       = embed_tokens[ids]; the vision tower's merged features at the
//!           placeholders; the proprio and tail positions replaced by the
//!           VLA's embeddings (W_proprio · proprio, the latent part, the
//!           action queries)
//! p       = M-RoPE positions over the valid tokens (instruction pads take
//!           none, so a row's positions do not depend on its batch)
//! mask    = causal over the prefix (as the model was trained); the tail
//!           sees the whole prefix and itself as the VLA asks; no one sees a pad
//! hidden  = the language model's final (normed) states → the VLA's heads
//! ```
//!
//! The action tokens' logits come from a separate head (`action_tokens =
//! "head"`, `W_head · h`, as the small trunk), or, as OpenVLA does, from
//! the language model's own output embedding: bin `b` is vocabulary id `V −
//! n_bins + b` ([`vocab_id`]), `V` the embedding's rows (`action_tokens =
//! "vocab"`; in Qwen's padded embedding these are rows past the tokenizer's
//! last token, so no text token is overwritten). With `freeze_vision` (the
//! seeds train this way) the vision tower's parameters do not require
//! gradients, so no update changes them.
//!
//! ```no_run
//! use embodyflow_models::vla::trunk::{ActionTokens, init_on_vlm};
//! use embodyflow_models::vla::VlaConfig;
//! let shape = VlaConfig { chunk_len: 8, ..VlaConfig::small(0) };
//! let policy = init_on_vlm("Qwen2.5-VL-3B-Instruct".as_ref(), &shape, ActionTokens::Vocab, true, tch::Device::Cpu).unwrap();
//! policy.save("runs/vla-qwen/policy".as_ref(), "init-policy", false).unwrap();
//! ```

use std::path::Path;

use embodyflow_hf::image::{ImageProcessor, RgbImage};
use embodyflow_hf::safetensors::Expected;
use embodyflow_hf::vl::{Images, Layout, VlConfig, VlNet};
use embodyflow_hf::{HfError, VlModel};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use tokenizers::Tokenizer;

use super::{Observation, Vla, VlaConfig, VlaError};
use crate::ModelError;
use crate::checkpoint::{Checkpoint, TOKENIZER_FILE};
use crate::gpt::Gpt;
use crate::tokenizer::SpecialIds;

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

#[cfg(test)]
thread_local! {
    /// Trunk passes run on this thread (the tests count them).
    static PASSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The trunk of a [`Vla`].
#[derive(Debug)]
pub(super) enum Trunk {
    /// Our small transformer and its patch embedding.
    Small { gpt: Gpt, patch_embed: nn::Linear },
    /// A vision-language model.
    Hf(Box<HfTrunk>),
}

/// A vision-language model as a trunk.
#[derive(Debug)]
pub(super) struct HfTrunk {
    net: VlNet,
    processor: ImageProcessor,
    action_tokens: ActionTokens,
}

/// The variable `dotted` (a parameter's full name) under `root`.
fn variable(root: &nn::Path, dotted: &str) -> Option<Tensor> {
    let (parents, name) = dotted.rsplit_once('.')?;
    parents
        .split('.')
        .fold(root.clone(), |path, part| path.sub(part))
        .get(name)
}

impl Trunk {
    /// Creates the trunk's parameters under `path` (the small trunk's
    /// randomly, a model's zeroed until loaded), the vision tower's frozen
    /// when the config asks. `config` has been checked.
    pub(super) fn new(path: &nn::Path, config: &VlaConfig) -> Trunk {
        match &config.trunk {
            None => {
                let p = config.patch_size;
                Trunk::Small {
                    gpt: Gpt::new(path, &config.small_trunk()),
                    patch_embed: nn::linear(
                        path / "patch_embed",
                        p * p * config.channels,
                        config.n_embd,
                        Default::default(),
                    ),
                }
            }
            Some(hf) => {
                let (model, processor) = hf
                    .resolve()
                    .unwrap_or_else(|e| panic!("invalid VLA trunk: {e}"));
                let frozen: Vec<String> = match hf.freeze_vision {
                    true => model
                        .tensors(&Layout::CURRENT)
                        .map(|e| e.name)
                        .filter(|name| name.starts_with(Layout::CURRENT.visual))
                        .collect(),
                    false => Vec::new(),
                };
                let net = VlNet::new(path, model, Layout::CURRENT);
                for name in frozen {
                    if let Some(tensor) = variable(path, &name) {
                        let _ = tensor.set_requires_grad(false);
                    }
                }
                Trunk::Hf(Box::new(HfTrunk {
                    net,
                    processor,
                    action_tokens: hf.action_tokens,
                }))
            }
        }
    }

    /// Final hidden states `[batch, time, embd]` (in the dtype of `proprio`
    /// and `tail`, the VLA's parameters') of the observation
    /// prefix (image, `proprio` `[batch, 1, embd]`, instruction) then
    /// `tail` `[batch, n, embd]`, and where the tail starts. The prefix
    /// never sees the tail; the tail sees the whole prefix and, among
    /// itself, what `tail_allowed` `[1 or batch, n, n]` (bool: query, key)
    /// lets it; no query sees an instruction pad.
    pub(super) fn hidden(
        &self,
        config: &VlaConfig,
        batch: &[Observation],
        proprio: Tensor,
        tail: Tensor,
        tail_allowed: &Tensor,
    ) -> Result<(Tensor, i64), VlaError> {
        #[cfg(test)]
        PASSES.with(|passes| passes.set(passes.get() + 1));
        let device = tail.device();
        let n = tail.size()[1];
        match self {
            Trunk::Small { gpt, patch_embed } => {
                let (ids, lengths) = instruction_ids(batch, 0, device);
                let longest = ids.size()[1];
                let pixels = patches(config, batch, device).to_kind(patch_embed.ws.kind());
                let patches = patch_embed.forward(&pixels);
                let n_patches = config.n_patches();
                let prefix = n_patches + 1 + longest;
                let start = config.prefix_len();
                let positions = Tensor::cat(
                    &[
                        Tensor::arange(prefix, (Kind::Int64, device)),
                        Tensor::arange_start(start, start + n, (Kind::Int64, device)),
                    ],
                    0,
                );
                let x = Tensor::cat(&[patches, proprio, gpt.embed_tokens(&ids), tail], 1)
                    + gpt.embed_positions(&positions).unsqueeze(0);
                let everything = Tensor::ones([1, prefix, prefix], (Kind::Bool, device));
                let allowed = sequence_mask(&everything, tail_allowed);
                let allowed = without_pads(allowed, &lengths, n_patches + 1, longest);
                Ok((gpt.hidden_of_embeddings(x, &allowed.unsqueeze(1)), prefix))
            }
            Trunk::Hf(trunk) => trunk.hidden(config, batch, proprio, tail, tail_allowed),
        }
    }

    /// Logits `[batch, n, n_bins]` of action hidden states `[batch, n,
    /// embd]` when the action tokens are vocabulary ids (the output
    /// embedding's last `n_bins` rows), `None` when a head gives them.
    pub(super) fn vocab_action_logits(&self, hidden: &Tensor, n_bins: i64) -> Option<Tensor> {
        match self {
            Trunk::Hf(trunk) if trunk.action_tokens == ActionTokens::Vocab => {
                let weight = trunk.net.language().output_embedding();
                let vocab = weight.size()[0];
                let rows = weight.narrow(0, vocab - n_bins, n_bins);
                Some(hidden.linear::<Tensor>(&rows.to_kind(hidden.kind()), None))
            }
            _ => None,
        }
    }

    /// The vision-language network, for a model trunk.
    #[cfg(test)]
    pub(super) fn vl_net(&self) -> Option<&VlNet> {
        match self {
            Trunk::Hf(trunk) => Some(&trunk.net),
            Trunk::Small { .. } => None,
        }
    }
}

impl HfTrunk {
    fn hidden(
        &self,
        config: &VlaConfig,
        batch: &[Observation],
        proprio: Tensor,
        tail: Tensor,
        tail_allowed: &Tensor,
    ) -> Result<(Tensor, i64), VlaError> {
        let device = tail.device();
        let (b, n, e) = tail.size3().unwrap_or_default();
        let model = self.net.config();
        let filler = model.vision_end_token_id;
        let images = self.images(config, batch)?;
        let per_image = Images::tokens(images.grid_thw[0], model.vision.spatial_merge_size);
        let cameras = config.channels / 3;
        let image_len = cameras * (per_image + 2);
        let (instructions, lengths) = instruction_ids(batch, filler, Device::Cpu);
        let longest = instructions.size()[1];
        let prefix = image_len + 1 + longest;
        let mut camera = vec![model.vision_start_token_id];
        camera.extend(std::iter::repeat_n(
            model.image_token_id,
            per_image as usize,
        ));
        camera.push(model.vision_end_token_id);
        let cameras_ids = Tensor::from_slice(&camera.repeat(cameras as usize))
            .view([1, image_len])
            .expand([b, image_len], false);
        let ids = Tensor::cat(
            &[
                cameras_ids,
                Tensor::full([b, 1], filler, (Kind::Int64, Device::Cpu)),
                instructions,
                Tensor::full([b, n], filler, (Kind::Int64, Device::Cpu)),
            ],
            1,
        )
        .to(device);
        let time = prefix + n;
        let columns = Tensor::arange(time, (Kind::Int64, device));
        let replace = columns
            .eq(image_len)
            .logical_or(&columns.ge(prefix))
            .unsqueeze(0)
            .expand([b, time], false);
        let kind = proprio.kind();
        let zeros = |len: i64| Tensor::zeros([b, len, e], (kind, device));
        let embeddings = Tensor::cat(&[zeros(image_len), proprio, zeros(longest), tail], 1);
        let causal = columns
            .narrow(0, 0, prefix)
            .unsqueeze(0)
            .le_tensor(&columns.narrow(0, 0, prefix).unsqueeze(1))
            .unsqueeze(0);
        let allowed = sequence_mask(&causal, tail_allowed);
        let allowed = without_pads(allowed, &lengths, image_len + 1, longest);
        let pad = pad_columns(&lengths, image_len + 1, longest, time, device);
        let attention_mask = match &pad {
            Some(pad) => pad.logical_not().to_kind(Kind::Int64),
            None => Tensor::ones([b, time], (Kind::Int64, device)),
        };
        let hidden = self
            .net
            .hidden_states(
                &ids,
                &attention_mask,
                &allowed,
                Some(&images),
                Some((&replace, &embeddings)),
            )
            .map_err(|e| VlaError::Trunk(e.to_string()))?;
        Ok((hidden.to_kind(kind), prefix))
    }

    /// The frames of a batch as the processor gives them: each row's
    /// cameras (3 channels each, in order), rows in order.
    fn images(&self, config: &VlaConfig, batch: &[Observation]) -> Result<Images, VlaError> {
        let side = config.image_size as usize;
        let channels = config.channels as usize;
        let mut frames = Vec::with_capacity(batch.len() * channels / 3);
        for row in batch {
            for camera in 0..channels / 3 {
                let data: Vec<u8> = row
                    .image
                    .chunks_exact(channels)
                    .flat_map(|pixel| pixel[3 * camera..3 * camera + 3].iter().copied())
                    .collect();
                frames.push(
                    RgbImage::new(side, side, data).map_err(|e| VlaError::Trunk(e.to_string()))?,
                );
            }
        }
        let mut images = self
            .processor
            .process(&frames)
            .map_err(|e| VlaError::Trunk(e.to_string()))?;
        let device = self.net.language().device();
        images.pixel_values = images.pixel_values.to(device);
        Ok(images)
    }
}

/// Each row's instruction ids right-padded with `pad` to the batch's
/// longest `[batch, longest]` (on `device`), and each row's length.
fn instruction_ids(batch: &[Observation], pad: i64, device: Device) -> (Tensor, Vec<i64>) {
    let lengths: Vec<i64> = batch.iter().map(|r| r.instruction.len() as i64).collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut ids = Vec::with_capacity(batch.len() * longest as usize);
    for row in batch {
        ids.extend(row.instruction.iter().map(|&id| i64::from(id)));
        ids.extend(std::iter::repeat_n(
            pad,
            longest as usize - row.instruction.len(),
        ));
    }
    let ids = Tensor::from_slice(&ids)
        .view([batch.len() as i64, longest])
        .to(device);
    (ids, lengths)
}

/// The small trunk's patches `[batch, (S / p)², p·p·C]` of a batch's
/// frames, scaled to `[-1, 1]`.
fn patches(config: &VlaConfig, batch: &[Observation], device: Device) -> Tensor {
    let b = batch.len() as i64;
    let (s, p, c) = (config.image_size, config.patch_size, config.channels);
    let side = s / p;
    let mut pixels = Vec::with_capacity(batch.len() * (s * s * c) as usize);
    for row in batch {
        pixels.extend_from_slice(row.image);
    }
    // [b, s, s, c] -> [b, side, p, side, p, c] -> patches [b, side², p·p·c].
    Tensor::from_slice(&pixels)
        .to(device)
        .view([b, side, p, side, p, c])
        .permute([0, 1, 3, 2, 4, 5])
        .reshape([b, config.n_patches(), p * p * c])
        .to_kind(Kind::Float)
        / 127.5
        - 1.0
}

/// The attention `[1 or batch, time, time]` of a prefix whose queries see
/// what `prefix` `[1 or batch, P, P]` says and never the tail, and a tail
/// that sees the whole prefix and itself as `tail` `[1 or batch, n, n]`
/// says.
fn sequence_mask(prefix: &Tensor, tail: &Tensor) -> Tensor {
    let rows = prefix.size()[0].max(tail.size()[0]);
    let (p, n) = (prefix.size()[1], tail.size()[1]);
    let device = tail.device();
    let top = Tensor::cat(
        &[
            prefix.expand([rows, p, p], false),
            Tensor::zeros([rows, p, n], (Kind::Bool, device)),
        ],
        2,
    );
    let bottom = Tensor::cat(
        &[
            Tensor::ones([rows, n, p], (Kind::Bool, device)),
            tail.expand([rows, n, n], false),
        ],
        2,
    );
    Tensor::cat(&[top, bottom], 1)
}

/// The instruction's columns past each row's own length `[batch, time]`
/// (the instruction starting at column `start`, `longest` long); `None`
/// when no row is shorter than the longest.
fn pad_columns(
    lengths: &[i64],
    start: i64,
    longest: i64,
    time: i64,
    device: Device,
) -> Option<Tensor> {
    if lengths.iter().all(|&len| len == longest) {
        return None;
    }
    let lengths = Tensor::from_slice(lengths).to(device);
    let column = Tensor::arange(time, (Kind::Int64, device)) - start;
    let in_instruction = column.ge(0).logical_and(&column.lt(longest)).unsqueeze(0);
    Some(in_instruction.logical_and(&column.unsqueeze(0).ge_tensor(&lengths.unsqueeze(1))))
}

/// `allowed` `[rows, time, time]` with no query attending to an
/// instruction pad.
fn without_pads(allowed: Tensor, lengths: &[i64], start: i64, longest: i64) -> Tensor {
    let time = allowed.size()[2];
    match pad_columns(lengths, start, longest, time, allowed.device()) {
        Some(pad) => allowed.logical_and(&pad.logical_not().unsqueeze(1)),
        None => allowed,
    }
}

/// A fresh VLA on the vision-language model in `dir`: its trunk the
/// model's weights, its tokenizer the model's `tokenizer.json`, its heads
/// (proprio embedding, action queries, the action head and the latent
/// parts as `shape` asks) random (seeded by `tch::manual_seed`). `shape`
/// gives the world's side (frames, proprio, chunk, actions, bins, latent);
/// the width, heads, layers and vocabulary become the model's.
pub fn init_on_vlm(
    dir: &Path,
    shape: &VlaConfig,
    action_tokens: ActionTokens,
    freeze_vision: bool,
    device: Device,
) -> Result<Checkpoint<Vla>, ModelError> {
    let trunk = HfTrunkConfig::from_dir(dir, action_tokens, freeze_vision)?;
    let (model, processor) = trunk.resolve()?;
    let text = &model.text;
    let config = VlaConfig {
        vocab_size: text.vocab_size,
        n_embd: text.hidden_size,
        n_head: text.num_attention_heads,
        n_layer: text.num_hidden_layers,
        patch_size: processor.patch_size,
        trunk: Some(trunk),
        ..shape.clone()
    };
    let config_file = dir.join("config.json");
    config.check().map_err(|reason| ModelError::BadCheckpoint {
        file: config_file,
        reason,
    })?;
    let tokenizer_file = dir.join(TOKENIZER_FILE);
    let tokenizer = crate::tokenizer::load(&tokenizer_file)?;
    let special = vlm_special_ids(&tokenizer_file, &tokenizer, &config)?;
    let vars = nn::VarStore::new(device);
    let vla = Vla::new(&vars.root(), &config);
    let pretrained = VlModel::load(dir, device)?;
    let names = pretrained.net().layout().clone();
    let mut ours = vars.variables();
    tch::no_grad(|| -> Result<(), ModelError> {
        for (name, value) in pretrained.var_store().variables() {
            let current = current_name(&name, &names);
            let mut variable = ours.remove(&current).ok_or_else(|| {
                ModelError::Torch(format!("no parameter `{current}` for the model's `{name}`"))
            })?;
            variable
                .f_copy_(&value)
                .map_err(|e| ModelError::Torch(format!("{current}: {e}")))?;
        }
        Ok(())
    })?;
    Ok(Checkpoint::fresh(vars, vla, tokenizer, special))
}

/// A parameter's name under [`Layout::CURRENT`] from its name under `layout`.
fn current_name(name: &str, layout: &Layout) -> String {
    for (from, to) in [
        (layout.language, Layout::CURRENT.language),
        (layout.visual, Layout::CURRENT.visual),
    ] {
        if let Some(rest) = name.strip_prefix(from).filter(|r| r.starts_with('.')) {
            return format!("{to}{rest}");
        }
    }
    name.to_string()
}

/// The special ids a VLA on a model keeps: our `<|pad|>`, `<|plan|>` and
/// `<|eos|>` when the tokenizer has them, else the model's `<|vision_end|>`
/// for all three (a VLA reads none of them); a tokenizer with more tokens
/// than the embedding has rows is refused, naming `tokenizer.json`.
pub(super) fn vlm_special_ids(
    file: &Path,
    tokenizer: &Tokenizer,
    config: &VlaConfig,
) -> Result<SpecialIds, ModelError> {
    let vocab = tokenizer.get_vocab_size(true) as i64;
    if vocab > config.vocab_size {
        return Err(ModelError::BadCheckpoint {
            file: file.to_path_buf(),
            reason: format!(
                "the tokenizer has {vocab} tokens but the trunk's embedding has {} rows (vocab_size): another model's tokenizer?",
                config.vocab_size
            ),
        });
    }
    let end = config
        .trunk
        .as_ref()
        .and_then(|t| t.model.get("vision_end_token_id"))
        .and_then(Value::as_i64)
        .unwrap_or(0) as i32;
    Ok(SpecialIds::of(tokenizer).unwrap_or(SpecialIds {
        pad: end,
        plan: end,
        eos: end,
    }))
}

#[cfg(test)]
mod tests;
