//! Vision-language checkpoints: transformers' `Qwen2_5_VLForConditionalGeneration`
//! and `Qwen3VLForConditionalGeneration` in tch, loaded from a model
//! directory as transformers writes it (`config.json`, the weights, and the
//! image processor's `preprocessor_config.json`, [`crate::image`]).
//!
//! ```text
//! h       = embed_tokens[ids], each <|image_pad|> replaced, in order, by a
//!           merged image token of the vision encoder (vision::VisionTower)
//! p[3,t]  = M-RoPE positions (get_rope_index): text tokens count on all three
//!           axes; an image of llm grid (gt, gh, gw) starting at s takes
//!           (s + t, s + row, s + col), and the text after it continues at
//!           s + max(gh, gw); padding 0
//! angles  = p[axis(i)] · θ_i, axis(i) by mrope_section — Qwen2.5-VL: in
//!           sections [T…, H…, W…]; Qwen3-VL: interleaved, H at i ≡ 1 and W at
//!           i ≡ 2 (mod 3) below 3 × their section, T elsewhere
//! logits  = the text decoder (HfNet) on h with those angles; Qwen3-VL adds
//!           DeepStack feature k to the image positions after layer k
//! ```
//!
//! While decoding, a new token's position is `cumsum(mask) - 1` plus the
//! row's `max(p) + 1 - tokens` of the prompt (transformers' `rope_deltas`),
//! which [`VlCache`] keeps.
//!
//! A prompt holds one `<|image_pad|>` per image as the chat template writes
//! it; [`VlNet::expand_image_tokens`] repeats each to its merged patch count
//! (`t·h·w / merge²`), as the processor does, and a batch whose placeholder
//! runs do not match the images given is an error naming the counts.
//!
//! ```no_run
//! use embodyflow_hf::image::{ImageProcessor, RgbImage};
//! use embodyflow_hf::vl::VlModel;
//! use tch::Tensor;
//! let dir = std::path::Path::new("Qwen2.5-VL-3B-Instruct");
//! let model = VlModel::load(dir, tch::Device::Cpu).unwrap();
//! let processor = ImageProcessor::for_model(dir, model.config()).unwrap();
//! let image = RgbImage::new(64, 48, vec![128; 64 * 48 * 3]).unwrap();
//! let images = processor.process(&[image]).unwrap();
//! let prompt = [1i64, 151652, 151655, 151653, 2]; // text, <|vision_start|><|image_pad|><|vision_end|>, text
//! let ids = model.net().expand_image_tokens(&prompt, &images.grid_thw).unwrap();
//! let ids = Tensor::from_slice(&ids).unsqueeze(0);
//! let logits = model.forward(&ids, &ids.ones_like(), Some(&images)).unwrap();
//! ```

pub mod config;
pub mod vision;

use std::path::Path;

use tch::{Device, Kind, Tensor, nn};

use crate::HfError;
use crate::model::{
    Added, HfNet, KvCache, Positions, config_with_dtype, greedy_loop, mask_positions,
    save_checkpoint,
};
use crate::safetensors::Weights;
pub use config::{Layout, VisionConfig, VlConfig, VlFamily};
pub use vision::VisionTower;

/// Images as the processor gives them ([`crate::image::ImageProcessor`]):
/// the flattened patches of every image, in order, and each image's grid of
/// patches.
#[derive(Debug)]
pub struct Images {
    /// `[Σ t·h·w, channels × temporal_patch_size × patch_size²]` f32.
    pub pixel_values: Tensor,
    /// `[t, h, w]` patches per image (`t` = 1 for an image).
    pub grid_thw: Vec<[i64; 3]>,
}

impl Images {
    /// Merged tokens image `i` takes in the prompt: `t·h·w / merge²`.
    pub fn tokens(grid: [i64; 3], merge: i64) -> i64 {
        grid[0] * grid[1] * grid[2] / (merge * merge)
    }
}

/// The key/value cache of a vision-language model and each row's M-RoPE
/// offset from its prompt.
#[derive(Debug, Default)]
pub struct VlCache {
    kv: KvCache,
    rope_deltas: Option<Tensor>,
}

impl VlCache {
    /// Positions cached.
    pub fn len(&self) -> i64 {
        self.kv.len()
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }

    /// Keeps the rows `rows` (1-D i64, in that order, may repeat) of the
    /// keys, values and offsets.
    pub fn keep_rows(&mut self, rows: &Tensor) {
        self.kv.keep_rows(rows);
        if let Some(deltas) = &self.rope_deltas {
            self.rope_deltas = Some(deltas.index_select(0, rows));
        }
    }
}

/// A prompt's embeddings with its images written in, its M-RoPE positions
/// `[3, B, T]`, each row's offset `[B, 1]`, and the image mask `[B, T, 1]`
/// with the DeepStack features to add after the first layers.
struct Prompt {
    h: Tensor,
    positions: Tensor,
    deltas: Tensor,
    deepstack: Option<(Tensor, Vec<Tensor>)>,
}

/// The DeepStack features of a prompt, as the decoder adds them.
fn deepstack_added(deepstack: &Option<(Tensor, Vec<Tensor>)>) -> Option<Added<'_>> {
    deepstack
        .as_ref()
        .map(|(mask, features)| Added { mask, features })
}

/// The network of a vision-language checkpoint: the language model, the
/// vision encoder, and the names its weights have ([`Layout`]).
#[derive(Debug)]
pub struct VlNet {
    config: VlConfig,
    layout: Layout,
    language: HfNet,
    visual: VisionTower,
    /// `[head_dim / 2]` i64: the position axis of each rotary frequency.
    axes: Tensor,
}

/// A vision-language model: its network and the store of its parameters.
#[derive(Debug)]
pub struct VlModel {
    vs: nn::VarStore,
    net: VlNet,
}

/// The var-store path of a dotted prefix (`model.language_model`).
fn at<'a>(root: &nn::Path<'a>, dotted: &str) -> nn::Path<'a> {
    let mut parts = dotted.split('.');
    let first = root / parts.next().unwrap_or_default();
    parts.fold(first, |path, part| &path / part)
}

impl VlModel {
    /// Loads `dir/config.json` and its weights onto `device`, in the dtype
    /// of the token embedding (F32 or BF16), under either [`Layout`]; every
    /// parameter the config implies is checked on the files' headers first.
    pub fn load(dir: &Path, device: Device) -> Result<VlModel, HfError> {
        let config = VlConfig::from_file(&dir.join("config.json"))?;
        let (weights, layout) = VlNet::open_weights(dir, &config)?;
        let mut vs = nn::VarStore::new(device);
        let net = VlNet::new(&vs.root(), config, layout);
        net.load_weights(&mut vs, &weights)?;
        Ok(VlModel { vs, net })
    }

    /// The network.
    pub fn net(&self) -> &VlNet {
        &self.net
    }

    /// The parameters, named as the checkpoint names them.
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// Mutable parameters (to freeze the vision encoder, say).
    pub fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }

    /// The resolved config.
    pub fn config(&self) -> &VlConfig {
        &self.net.config
    }

    /// Logits ([`VlNet::forward`]).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
    ) -> Result<Tensor, HfError> {
        self.net.forward(input_ids, attention_mask, images)
    }

    /// Greedy decoding ([`VlNet::greedy`]).
    pub fn greedy(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
        max_new_tokens: i64,
        eos: Option<i64>,
        pad: i64,
    ) -> Result<Tensor, HfError> {
        self.net
            .greedy(input_ids, attention_mask, images, max_new_tokens, eos, pad)
    }

    /// Writes `dir/config.json` (as read, `dtype` set to the parameters')
    /// and `dir/model.safetensors` under the names the model was loaded with.
    pub fn save(&self, dir: &Path) -> Result<(), HfError> {
        save_checkpoint(&self.vs, dir, &self.net.config_json())
    }
}

impl VlNet {
    /// The parameters of `config` under `root`, named as `layout` says,
    /// zero-initialised.
    pub fn new(root: &nn::Path, config: VlConfig, layout: Layout) -> VlNet {
        let language = HfNet::new_at(
            &at(root, layout.language),
            &(root / "lm_head"),
            config.text.clone(),
        );
        let visual = VisionTower::new(
            &at(root, layout.visual),
            config.vision.clone(),
            config.family,
        );
        let half = config.text.head_dim / 2;
        let [t, h, w] = config.mrope_section;
        let axes: Vec<i64> = (0..half)
            .map(|i| match config.family {
                VlFamily::Qwen25Vl if i < t => 0,
                VlFamily::Qwen25Vl if i < t + h => 1,
                VlFamily::Qwen25Vl => 2,
                VlFamily::Qwen3Vl if i % 3 == 1 && i < 3 * h => 1,
                VlFamily::Qwen3Vl if i % 3 == 2 && i < 3 * w => 2,
                VlFamily::Qwen3Vl => 0,
            })
            .collect();
        let axes = Tensor::from_slice(&axes).to_device(root.device());
        VlNet {
            config,
            layout,
            language,
            visual,
            axes,
        }
    }

    /// The weights of model directory `dir` (`model.safetensors` or a
    /// sharded index) and the [`Layout`] they are named in, every tensor
    /// `config` implies checked on the files' headers before anything is
    /// allocated.
    pub fn open_weights(dir: &Path, config: &VlConfig) -> Result<(Weights, Layout), HfError> {
        let weights = Weights::open(dir)?;
        let current = format!("{}.embed_tokens.weight", Layout::CURRENT.language);
        let layout = if weights.names().any(|n| n == current) {
            Layout::CURRENT
        } else {
            Layout::FLAT
        };
        weights.check(config.tensors(&layout))?;
        Ok((weights, layout))
    }

    /// Fills the parameters in `vs` (the store this network was built in)
    /// from `weights` ([`VlNet::open_weights`]), first setting the store to
    /// the dtype of the token embedding (F32 or BF16).
    pub fn load_weights(&self, vs: &mut nn::VarStore, weights: &Weights) -> Result<(), HfError> {
        vs.set_kind(weights.kind(&format!("{}.embed_tokens.weight", self.layout.language))?);
        weights.fill(vs, self.config.tensors(&self.layout))
    }

    /// `config.json` as read, `dtype` set to the parameters'.
    pub fn config_json(&self) -> serde_json::Value {
        config_with_dtype(&self.config.source, self.language.kind())
    }

    /// The resolved config.
    pub fn config(&self) -> &VlConfig {
        &self.config
    }

    /// The names of the parameters.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The language model.
    pub fn language(&self) -> &HfNet {
        &self.language
    }

    /// The vision encoder.
    pub fn visual(&self) -> &VisionTower {
        &self.visual
    }

    /// `prompt` with each image placeholder repeated to its image's merged
    /// token count, the images taken in order; a count of placeholders
    /// other than the number of images is an error naming both.
    pub fn expand_image_tokens(
        &self,
        prompt: &[i64],
        grids: &[[i64; 3]],
    ) -> Result<Vec<i64>, HfError> {
        let image = self.config.image_token_id;
        let found = prompt.iter().filter(|&&t| t == image).count();
        if found != grids.len() {
            return Err(HfError::BadBatch(format!(
                "the prompt holds {found} image placeholders (token {image}), {} images were given",
                grids.len()
            )));
        }
        let merge = self.config.vision.spatial_merge_size;
        let mut grids = grids.iter();
        let mut out = Vec::with_capacity(prompt.len());
        for &token in prompt {
            match token == image {
                true => {
                    let grid = grids.next().copied().unwrap_or_default();
                    out.extend(std::iter::repeat_n(
                        image,
                        Images::tokens(grid, merge) as usize,
                    ));
                }
                false => out.push(token),
            }
        }
        Ok(out)
    }

    /// Logits `[B, T, vocab]` of `input_ids` (placeholders expanded) under
    /// `attention_mask` with `images`, with gradients when enabled.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
    ) -> Result<Tensor, HfError> {
        self.run(input_ids, attention_mask, images, None, None)
    }

    /// As [`VlNet::forward`] over prompts followed by responses, row `r`'s
    /// prompt its first `prompt_lens[r]` tokens: an image placeholder in a
    /// response is a text token at a text position, as decoding read it
    /// when it was sampled, and no image slot.
    pub fn forward_responses(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
        prompt_lens: &[i64],
    ) -> Result<Tensor, HfError> {
        self.run(input_ids, attention_mask, images, None, Some(prompt_lens))
    }

    /// As [`VlNet::forward`], continuing `cache`: the first call holds the
    /// prompt and its images; later calls (images `None`) the new tokens,
    /// `attention_mask` covering the cached positions too.
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
        cache: &mut VlCache,
    ) -> Result<Tensor, HfError> {
        self.run(input_ids, attention_mask, images, Some(cache), None)
    }

    /// [`VlNet::forward_cached`], or [`VlNet::forward`] without a cache
    /// (image placeholders read as text from column `text_from[row]` on).
    fn run(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
        mut cache: Option<&mut VlCache>,
        text_from: Option<&[i64]>,
    ) -> Result<Tensor, HfError> {
        let past = cache.as_ref().map_or(0, |c| c.len());
        let (ids, keys) = self.language.check_batch(input_ids, attention_mask, past)?;
        let (b, t) = ids.size2().unwrap_or_default();
        let device = self.language.device();
        let mut h = self.language.embed(&ids);
        let mut deepstack = None;
        let positions = if past == 0 {
            let slots = self.image_slots(&ids, &keys, text_from);
            let prompt = self.embed_prompt(h, &keys, &slots, images)?;
            (h, deepstack) = (prompt.h, prompt.deepstack);
            if let Some(cache) = cache.as_mut() {
                cache.rope_deltas = Some(prompt.deltas);
            }
            prompt.positions
        } else {
            if images.is_some_and(|i| !i.grid_thw.is_empty()) {
                return Err(HfError::BadBatch(
                    "images go with the prompt, not with a cached continuation".into(),
                ));
            }
            let deltas = match cache.as_ref().and_then(|c| c.rope_deltas.as_ref()) {
                Some(d) => d.shallow_clone(),
                None => Tensor::zeros([b, 1], (Kind::Int64, device)),
            };
            (mask_positions(&keys).narrow(1, past, t) + deltas)
                .unsqueeze(0)
                .expand([3, b, t], false)
        };
        let rope = self.rope_of(&positions);
        Ok(self.language.decode(
            h,
            &rope,
            &keys,
            cache.map(|c| &mut c.kv),
            deepstack_added(&deepstack),
            Positions::All,
        ))
    }

    /// The final hidden states (after the last norm) `[B, T, hidden]` of
    /// a prompt (placeholders expanded) with `images`, each query attending
    /// to the keys `allowed` `[B or 1, T, T]` (bool: query, key) sets
    /// instead of the causal mask, and the token embeddings replaced by
    /// `replace = (where [B, T] bool, embeddings [B, T, hidden])` where it
    /// is set (positions a caller embeds itself, as a VLA's proprio and
    /// action slots). `attention_mask` `[B, T]` (1 = token, 0 = padding)
    /// gives the M-RoPE positions as [`VlNet::forward`] does, padding
    /// anywhere in a row skipped. With gradients when enabled.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        allowed: &Tensor,
        images: Option<&Images>,
        replace: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor, HfError> {
        let (ids, keys) = self.language.check_batch(input_ids, attention_mask, 0)?;
        let mut h = self.language.embed(&ids);
        if let Some((at, embeddings)) = replace {
            h = h.where_self(
                &at.logical_not().unsqueeze(-1),
                &embeddings.to_kind(h.kind()),
            );
        }
        let slots = self.image_slots(&ids, &keys, None);
        let prompt = self.embed_prompt(h, &keys, &slots, images)?;
        let rope = self.rope_of(&prompt.positions);
        Ok(self.language.hidden(
            prompt.h,
            &rope,
            allowed,
            None,
            deepstack_added(&prompt.deepstack),
        ))
    }

    /// The image slots `[B, T]` (bool) of `ids`: the image placeholders
    /// among the valid tokens `keys`, before column `text_from[row]` when
    /// given (a placeholder past it is a sampled text token).
    fn image_slots(&self, ids: &Tensor, keys: &Tensor, text_from: Option<&[i64]>) -> Tensor {
        let slots = ids.eq(self.config.image_token_id).logical_and(keys);
        match text_from {
            None => slots,
            Some(from) => {
                let (_, t) = ids.size2().unwrap_or_default();
                let columns = Tensor::arange(t, (Kind::Int64, ids.device())).unsqueeze(0);
                let from = Tensor::from_slice(from)
                    .to_device(ids.device())
                    .unsqueeze(1);
                slots.logical_and(&columns.lt_tensor(&from))
            }
        }
    }

    /// A prompt's embeddings `h` with the image features written at the
    /// image `slots` ([`VlNet::image_slots`]), its M-RoPE positions and
    /// offsets ([`VlNet::rope_index`]) and the DeepStack features to add.
    fn embed_prompt(
        &self,
        h: Tensor,
        keys: &Tensor,
        slots: &Tensor,
        images: Option<&Images>,
    ) -> Result<Prompt, HfError> {
        let image_mask = slots.shallow_clone();
        let grids = images.map_or(&[][..], |i| &i.grid_thw[..]);
        let (positions, deltas) = self.rope_index(keys, slots, grids)?;
        let mut prompt = Prompt {
            h,
            positions,
            deltas,
            deepstack: None,
        };
        if let Some(images) = images.filter(|i| !i.grid_thw.is_empty()) {
            let out = self.visual.forward(images)?;
            let mask = image_mask.unsqueeze(-1);
            prompt.h = prompt
                .h
                .masked_scatter(&mask, &out.features.to_kind(prompt.h.kind()));
            prompt.deepstack = Some((mask, out.deepstack));
        }
        Ok(prompt)
    }

    /// The rotary `(cos, sin)` of M-RoPE positions `[3, B, T]`: each
    /// frequency reads its axis.
    fn rope_of(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let (_, b, t) = positions.size3().unwrap_or_default();
        let half = self.config.text.head_dim / 2;
        let freqs = positions.unsqueeze(-1).to_kind(Kind::Float) * self.language.inv_freq();
        let index = self
            .axes
            .view([1, 1, 1, half])
            .expand([1, b, t, half], false);
        let freqs = freqs.gather(0, &index, false).squeeze_dim(0);
        self.language.rope(&freqs)
    }

    /// transformers' `get_rope_index`: the M-RoPE positions `[3, B, T]` of
    /// the valid tokens `keys` (padding 0) and each row's `max + 1 - tokens`
    /// `[B, 1]`, each run of image `slots` ([`VlNet::image_slots`]) taking
    /// the next grid.
    fn rope_index(
        &self,
        keys: &Tensor,
        slots: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<(Tensor, Tensor), HfError> {
        let (b, t) = keys.size2().unwrap_or_default();
        let rows = |mask: &Tensor| -> Result<Vec<Vec<i64>>, HfError> {
            Vec::try_from(&mask.to_device(Device::Cpu).to_kind(Kind::Int64))
                .map_err(|e: tch::TchError| HfError::Torch(e.to_string()))
        };
        let (keys, slots) = (rows(keys)?, rows(slots)?);
        let merge = self.config.vision.spatial_merge_size;
        let mut positions = vec![0i64; (3 * b * t) as usize];
        let mut deltas = Vec::with_capacity(b as usize);
        let mut next_grid = 0;
        let (bu, tu) = (b as usize, t as usize);
        for row in 0..bu {
            let valid: Vec<usize> = (0..tu).filter(|&j| keys[row][j] != 0).collect();
            let mut current = 0i64;
            let mut max = -1i64;
            let mut k = 0;
            while k < valid.len() {
                let j = valid[k];
                if slots[row][j] == 0 {
                    for axis in 0..3 {
                        positions[axis * bu * tu + row * tu + j] = current;
                    }
                    max = max.max(current);
                    current += 1;
                    k += 1;
                    continue;
                }
                let run = valid[k..]
                    .iter()
                    .take_while(|&&j| slots[row][j] != 0)
                    .count();
                let Some(&[gt, gh, gw]) = grids.get(next_grid) else {
                    return Err(HfError::BadBatch(format!(
                        "row {row}: image placeholders beyond the {} images given",
                        grids.len()
                    )));
                };
                let (lh, lw) = (gh / merge, gw / merge);
                let need = (gt * lh * lw) as usize;
                if run < need {
                    return Err(HfError::BadBatch(format!(
                        "row {row}: a run of {run} image placeholders, image {next_grid} (grid [{gt}, {gh}, {gw}]) needs {need}"
                    )));
                }
                let mut n = 0;
                for frame in 0..gt {
                    for r in 0..lh {
                        for c in 0..lw {
                            let j = valid[k + n];
                            let at = row * tu + j;
                            positions[at] = current + frame;
                            positions[bu * tu + at] = current + r;
                            positions[2 * bu * tu + at] = current + c;
                            max = max.max(current + frame).max(current + r).max(current + c);
                            n += 1;
                        }
                    }
                }
                current += lh.max(lw);
                k += need;
                next_grid += 1;
            }
            deltas.push(if valid.is_empty() {
                0
            } else {
                max + 1 - valid.len() as i64
            });
        }
        if next_grid != grids.len() {
            return Err(HfError::BadBatch(format!(
                "the batch's image placeholders take {next_grid} images, {} were given",
                grids.len()
            )));
        }
        let device = self.language.device();
        Ok((
            Tensor::from_slice(&positions)
                .view([3, b, t])
                .to_device(device),
            Tensor::from_slice(&deltas).view([b, 1]).to_device(device),
        ))
    }

    /// Greedy decoding as transformers' `generate(do_sample=False)`, the
    /// images given with the prompt ([`crate::HfNet::greedy`]'s rules for
    /// `eos` and `pad`). Returns the new tokens `[B, n]`.
    pub fn greedy(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        images: Option<&Images>,
        max_new_tokens: i64,
        eos: Option<i64>,
        pad: i64,
    ) -> Result<Tensor, HfError> {
        let mut cache = VlCache::default();
        greedy_loop(
            input_ids,
            attention_mask,
            self.language.device(),
            max_new_tokens,
            eos,
            pad,
            &mut |input, mask| {
                let images = if cache.is_empty() { images } else { None };
                self.forward_cached(input, mask, images, &mut cache)
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_tensors_are_the_variables;

    fn tiny(family: &str, tied: bool) -> VlConfig {
        let (text, vision) = if family == "qwen3_vl" {
            (
                r#""head_dim": 16, "rope_parameters": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": true}"#,
                r#""deepstack_visual_indexes": [0, 1], "num_position_embeddings": 16"#,
            )
        } else {
            (
                r#""rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 2]}"#,
                r#""fullatt_block_indexes": [1], "window_size": 16"#,
            )
        };
        let text = format!(
            r#"{{"model_type": "{family}", "tie_word_embeddings": {tied},
            "text_config": {{"vocab_size": 200, "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, {text}}},
            "vision_config": {{"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
              "patch_size": 4, "out_hidden_size": 48, {vision}}},
            "image_token_id": 192, "video_token_id": 193, "vision_start_token_id": 190,
            "vision_end_token_id": 191}}"#
        );
        VlConfig::parse(&text, Path::new("config.json")).unwrap()
    }

    /// The tensor list checked before allocation is the network `VlNet::new`
    /// builds, for both families, tied and untied, in both layouts.
    #[test]
    fn the_config_lists_exactly_the_networks_parameters() {
        for family in ["qwen2_5_vl", "qwen3_vl"] {
            for tied in [false, true] {
                for layout in [Layout::CURRENT, Layout::FLAT] {
                    let config = tiny(family, tied);
                    let vs = nn::VarStore::new(Device::Cpu);
                    let _net = VlNet::new(&vs.root(), config.clone(), layout.clone());
                    assert_tensors_are_the_variables(&vs, config.tensors(&layout));
                }
            }
        }
    }

    #[test]
    fn placeholders_expand_to_the_merged_patch_count() {
        let config = tiny("qwen2_5_vl", false);
        let vs = nn::VarStore::new(Device::Cpu);
        let net = VlNet::new(&vs.root(), config, Layout::CURRENT);
        // 12 × 10 patches merge 2 × 2 into 30 tokens, 4 × 4 into 4.
        let out = net
            .expand_image_tokens(&[5, 190, 192, 191, 192, 6], &[[1, 12, 10], [1, 4, 4]])
            .unwrap();
        assert_eq!(out.len(), 4 + 30 + 4);
        assert_eq!(out.iter().filter(|&&t| t == 192).count(), 34);
        let err = net
            .expand_image_tokens(&[5, 192, 6], &[[1, 4, 4], [1, 4, 4]])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("1 image placeholders") && err.contains("2 images"),
            "{err}"
        );
    }

    /// Checkpointed per decoder layer and per vision block (Qwen3-VL's
    /// DeepStack features between them), every parameter's gradient is the
    /// plain backward's; with the vision tower frozen, it gets none.
    #[test]
    fn checkpointed_blocks_give_the_plain_gradients() {
        for family in ["qwen2_5_vl", "qwen3_vl"] {
            for frozen in [false, true] {
                tch::manual_seed(5);
                let vs = nn::VarStore::new(Device::Cpu);
                let net = VlNet::new(&vs.root(), tiny(family, false), Layout::CURRENT);
                crate::testing::randomize(&vs);
                if frozen {
                    for (name, var) in vs.variables() {
                        if name.contains("visual") {
                            let _ = var.set_requires_grad(false);
                        }
                    }
                }
                // Two rows, one 8 × 8-patch image in the first (16 tokens).
                let images = Images {
                    pixel_values: Tensor::randn([64, 3 * 2 * 16], (Kind::Float, Device::Cpu)),
                    grid_thw: vec![[1, 8, 8]],
                };
                let mut row = vec![5i64, 190];
                row.extend([192; 16]);
                row.extend([191, 6, 7]);
                let mut other = vec![0i64; 10];
                other.extend(8..19);
                let ids = Tensor::from_slice(&[row, other].concat()).view([2, 21]);
                let mask = ids.ne(0).to_kind(Kind::Int64);
                let target = Tensor::randn([2, 21, 200], (Kind::Float, Device::Cpu));
                let loss = || {
                    let logits = net.forward(&ids, &mask, Some(&images)).unwrap();
                    (logits.log_softmax(-1, Kind::Float) * &target).sum(Kind::Float)
                };
                let diff = crate::testing::checkpointing_gradient_diff(&vs, &loss);
                assert!(diff <= 1e-5, "{family}, vision frozen {frozen}: {diff}");
                let visual_grads = vs
                    .variables()
                    .into_iter()
                    .filter(|(name, var)| name.contains("visual") && var.grad().defined())
                    .count();
                assert_eq!(visual_grads == 0, frozen, "{family}");
            }
        }
    }

    /// get_rope_index's worked example: text, a 1 × (4 × 6 patches → 2 × 3)
    /// image, text; after the image the text continues at start + max(2, 3).
    #[test]
    fn rope_index_places_an_image_on_its_grid() {
        let config = tiny("qwen2_5_vl", false);
        let vs = nn::VarStore::new(Device::Cpu);
        let net = VlNet::new(&vs.root(), config, Layout::CURRENT);
        let mut ids = vec![0i64, 5, 190];
        ids.extend([192; 6]);
        ids.extend([191, 7]);
        let mask: Vec<i64> = (0..ids.len()).map(|j| i64::from(j > 0)).collect();
        let ids = Tensor::from_slice(&ids).unsqueeze(0);
        let keys = Tensor::from_slice(&mask).unsqueeze(0).ne(0);
        let slots = net.image_slots(&ids, &keys, None);
        let (p, d) = net.rope_index(&keys, &slots, &[[1, 4, 6]]).unwrap();
        let p: Vec<Vec<Vec<i64>>> = Vec::try_from(&p).unwrap();
        assert_eq!(p[0][0], [0, 0, 1, 2, 2, 2, 2, 2, 2, 5, 6]);
        assert_eq!(p[1][0], [0, 0, 1, 2, 2, 2, 3, 3, 3, 5, 6]);
        assert_eq!(p[2][0], [0, 0, 1, 2, 3, 4, 2, 3, 4, 5, 6]);
        // max 6 + 1 - 10 tokens.
        assert_eq!(d.int64_value(&[0, 0]), -3);
    }
}
