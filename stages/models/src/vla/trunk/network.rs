//! The network of a VLA's trunk ([`crate::vla::trunk`] says what each
//! trunk is): [`Trunk`] embeds the observation prefix, runs it with the
//! VLA's tail and gives the final hidden states; a model trunk also gives
//! the action logits from its vocabulary and the special ids it keeps.
//!
//! ```text
//! small: x = [W_patch · patches | proprio | wte[instr] | tail] + wpe[positions]
//!        hidden = Gpt blocks(x, prefix bidirectional, tail as the VLA asks)
//! model: hidden = VlNet(ids, M-RoPE, prefix causal, tail as the VLA asks)
//! ```
//!
//! ```
//! use embodyflow_models::vla::VlaConfig;
//! // The small trunk embeds 8 × 8 × 3 patches: its parameters come first.
//! let names: Vec<String> = VlaConfig::small(64).tensors().map(|e| e.name).collect();
//! assert!(names.contains(&"patch_embed.weight".to_string()));
//! ```

use std::path::Path;

use embodyflow_hf::image::{ImageProcessor, RgbImage};
use embodyflow_hf::vl::{Images, Layout, VlNet};
use serde_json::Value;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use tokenizers::Tokenizer;

use crate::ModelError;
use crate::gpt::Gpt;
use crate::tokenizer::SpecialIds;
use crate::vla::batch::Observation;
use crate::vla::config::{ActionTokens, VlaConfig};
use crate::vla::error::VlaError;

#[cfg(test)]
thread_local! {
    /// Trunk passes run on this thread (the tests count them).
    pub(crate) static PASSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The trunk of a [`Vla`](crate::vla::Vla).
#[derive(Debug)]
pub(crate) enum Trunk {
    /// Our small transformer, its convolutional stem (`stem_channels > 0`)
    /// and its patch embedding.
    Small {
        gpt: Gpt,
        stem: Option<Stem>,
        patch_embed: nn::Linear,
    },
    /// A vision-language model.
    Hf(Box<HfTrunk>),
}

/// The small trunk's convolutional stem: two 3 × 3 convolutions, stride 1,
/// zero padding 1, each followed by GELU (`VlaConfig::stem_channels`).
#[derive(Debug)]
pub(crate) struct Stem {
    conv1: nn::Conv2D,
    conv2: nn::Conv2D,
}

impl Stem {
    fn new(path: &nn::Path, channels: i64, width: i64) -> Stem {
        let config = nn::ConvConfig {
            padding: 1,
            ..Default::default()
        };
        Stem {
            conv1: nn::conv2d(path / "conv1", channels, width, 3, config),
            conv2: nn::conv2d(path / "conv2", width, width, 3, config),
        }
    }

    /// Features `[b, s, s, width]` of frames `[b, s, s, channels]`.
    fn forward(&self, frames: &Tensor) -> Tensor {
        let x = frames.permute([0, 3, 1, 2]);
        let x = self.conv1.forward(&x).gelu("none");
        self.conv2.forward(&x).gelu("none").permute([0, 2, 3, 1])
    }
}

/// A vision-language model as a trunk.
#[derive(Debug)]
pub(crate) struct HfTrunk {
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
    pub(crate) fn new(path: &nn::Path, config: &VlaConfig) -> Trunk {
        match &config.trunk {
            None => {
                let p = config.patch_size;
                Trunk::Small {
                    gpt: Gpt::new(path, &config.small_trunk()),
                    stem: (config.stem_channels > 0).then(|| {
                        Stem::new(&(path / "stem"), config.channels, config.stem_channels)
                    }),
                    patch_embed: nn::linear(
                        path / "patch_embed",
                        p * p * config.patch_channels(),
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
    pub(crate) fn hidden(
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
            Trunk::Small {
                gpt,
                stem,
                patch_embed,
            } => {
                let (ids, lengths) = instruction_ids(batch, 0, device);
                let longest = ids.size()[1];
                let frames = frames(config, batch, device).to_kind(patch_embed.ws.kind());
                let features = match stem {
                    Some(stem) => stem.forward(&frames),
                    None => frames,
                };
                let patches = patch_embed.forward(&patches(config, &features));
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
    pub(crate) fn vocab_action_logits(&self, hidden: &Tensor, n_bins: i64) -> Option<Tensor> {
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
    pub(crate) fn vl_net(&self) -> Option<&VlNet> {
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

/// A batch's frames `[batch, S, S, C]`, scaled to `[-1, 1]`.
fn frames(config: &VlaConfig, batch: &[Observation], device: Device) -> Tensor {
    let b = batch.len() as i64;
    let (s, c) = (config.image_size, config.channels);
    let mut pixels = Vec::with_capacity(batch.len() * (s * s * c) as usize);
    for row in batch {
        pixels.extend_from_slice(row.image);
    }
    Tensor::from_slice(&pixels)
        .to(device)
        .view([b, s, s, c])
        .to_kind(Kind::Float)
        / 127.5
        - 1.0
}

/// The small trunk's patches `[batch, (S / p)², p·p·C']` of a map `[batch,
/// S, S, C']` (the frames, or the stem's features).
fn patches(config: &VlaConfig, map: &Tensor) -> Tensor {
    let (b, s, c) = (map.size()[0], config.image_size, map.size()[3]);
    let p = config.patch_size;
    let side = s / p;
    // [b, s, s, c] -> [b, side, p, side, p, c] -> patches [b, side², p·p·c].
    map.view([b, side, p, side, p, c])
        .permute([0, 1, 3, 2, 4, 5])
        .reshape([b, config.n_patches(), p * p * c])
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

/// The special ids a VLA on a model keeps: our `<|pad|>`, `<|plan|>` and
/// `<|eos|>` when the tokenizer has them, else the model's `<|vision_end|>`
/// for all three (a VLA reads none of them); a tokenizer with more tokens
/// than the embedding has rows is refused, naming `tokenizer.json`.
pub(crate) fn vlm_special_ids(
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
