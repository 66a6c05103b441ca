//! The vision encoders of Qwen2.5-VL (`Qwen2_5_VisionTransformerPretrainedModel`)
//! and Qwen3-VL (`Qwen3VLVisionModel`), as transformers computes them:
//!
//! ```text
//! x   = conv3d(pixels.view(-1, C, T, P, P), kernel = stride = (T, P, P))    one row per patch
//!       (Qwen3-VL: + bias + bilinear(pos_embed grid → the image's h × w), align_corners)
//! rot = 2-D rotary per patch: [θ·row, θ·col] twice, θ = theta^(-4i/head_dim), in f32
//! per block: x += proj(attn(norm1(x)));  x += mlp(norm2(x))
//!       attention within each image (full) or each window of
//!       window_size / patch / merge merged tokens (Qwen2.5-VL, blocks not in
//!       fullatt_block_indexes); rotary applied to q, k in f32
//! out = merger(x): norm, the merge × merge patches of a token concatenated,
//!       fc2(gelu(fc1(·)))                                 one row per merged token
//! ```
//!
//! Patches arrive in the processor's order (merge blocks of `merge × merge`
//! patches, row-major within and across blocks). Qwen2.5-VL uses RMSNorm
//! and a gated MLP, reorders the merged tokens window by window before the
//! blocks and back after the merger; Qwen3-VL uses LayerNorm and a plain
//! MLP, and the outputs of the blocks listed in `deepstack_visual_indexes`
//! go through their own mergers (normalised after concatenation): the
//! DeepStack features the language model adds to the image positions after
//! its first layers.

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use crate::HfError;
use crate::checkpointing::{self, Shallow};
use crate::model::{linear, norm_weight, rms_norm, rotate_half};
use crate::vl::Images;
use crate::vl::config::{VisionConfig, VlFamily};

/// RMSNorm (Qwen2.5-VL) or LayerNorm (Qwen3-VL), eps 1e-6.
#[derive(Debug)]
enum Norm {
    Rms(Tensor),
    Layer(Tensor, Tensor),
}

impl Norm {
    fn new(path: nn::Path, dim: i64, family: VlFamily) -> Norm {
        match family {
            VlFamily::Qwen25Vl => Norm::Rms(norm_weight(path, dim)),
            VlFamily::Qwen3Vl => Norm::Layer(
                path.var("weight", &[dim], nn::Init::Const(1.0)),
                path.var("bias", &[dim], nn::Init::Const(0.0)),
            ),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            Norm::Rms(w) => rms_norm(x, w, 1e-6),
            Norm::Layer(w, b) => {
                let dim = w.size()[0];
                x.layer_norm([dim], Some(w), Some(b), 1e-6, true)
            }
        }
    }
}

impl Shallow for Norm {
    fn shallow(&self) -> Self {
        match self {
            Norm::Rms(w) => Norm::Rms(w.shallow()),
            Norm::Layer(w, b) => Norm::Layer(w.shallow(), b.shallow()),
        }
    }
}

#[derive(Debug)]
enum Mlp {
    /// `down(act(gate(x)) ⊙ up(x))`, with biases.
    Gated(nn::Linear, nn::Linear, nn::Linear),
    /// `fc2(act(fc1(x)))`.
    Plain(nn::Linear, nn::Linear),
}

#[derive(Debug)]
struct Block {
    norm1: Norm,
    norm2: Norm,
    qkv: nn::Linear,
    proj: nn::Linear,
    mlp: Mlp,
}

impl Shallow for Block {
    fn shallow(&self) -> Self {
        Block {
            norm1: self.norm1.shallow(),
            norm2: self.norm2.shallow(),
            qkv: self.qkv.shallow(),
            proj: self.proj.shallow(),
            mlp: match &self.mlp {
                Mlp::Gated(a, b, c) => Mlp::Gated(a.shallow(), b.shallow(), c.shallow()),
                Mlp::Plain(a, b) => Mlp::Plain(a.shallow(), b.shallow()),
            },
        }
    }
}

/// A patch merger: `fc2(gelu(fc1(norm(·))))` over the concatenated patches
/// of each merged token; `postshuffle` normalises after concatenating.
#[derive(Debug)]
struct Merger {
    norm: Norm,
    postshuffle: bool,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Merger {
    fn new(path: &nn::Path, c: &VisionConfig, family: VlFamily, postshuffle: bool) -> Merger {
        let merged = c.hidden_size * c.merge_unit();
        let (norm, fc1, fc2) = match family {
            VlFamily::Qwen25Vl => ("ln_q", path / "mlp" / 0, path / "mlp" / 2),
            VlFamily::Qwen3Vl => ("norm", path / "linear_fc1", path / "linear_fc2"),
        };
        let norm_dim = if postshuffle { merged } else { c.hidden_size };
        Merger {
            norm: Norm::new(path / norm, norm_dim, family),
            postshuffle,
            fc1: linear(fc1, merged, merged, true),
            fc2: linear(fc2, merged, c.out_hidden_size, true),
        }
    }

    fn forward(&self, x: &Tensor, merged: i64) -> Tensor {
        let x = if self.postshuffle {
            self.norm.forward(&x.view([-1, merged]))
        } else {
            self.norm.forward(x).view([-1, merged])
        };
        self.fc2.forward(&self.fc1.forward(&x).gelu("none"))
    }
}

/// A vision encoder's parameters and how to run them.
#[derive(Debug)]
pub struct VisionTower {
    family: VlFamily,
    config: VisionConfig,
    patch_weight: Tensor,
    patch_bias: Option<Tensor>,
    pos_embed: Option<Tensor>,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
    /// `[head_dim / 4]` f32.
    inv_freq: Tensor,
}

/// What the encoder returns: one row per merged token, the images in
/// order, and the DeepStack features (Qwen3-VL) of the same rows.
#[derive(Debug)]
pub struct VisionOutput {
    /// `[merged tokens, out_hidden_size]`.
    pub features: Tensor,
    /// One `[merged tokens, out_hidden_size]` per DeepStack merger.
    pub deepstack: Vec<Tensor>,
}

impl VisionTower {
    /// The parameters of `config` under `path`, zero-initialised.
    pub fn new(path: &nn::Path, config: VisionConfig, family: VlFamily) -> VisionTower {
        let c = &config;
        let e = c.hidden_size;
        let qwen3 = family == VlFamily::Qwen3Vl;
        let patch = path / "patch_embed" / "proj";
        let patch_weight = patch.var(
            "weight",
            &[
                e,
                c.in_channels,
                c.temporal_patch_size,
                c.patch_size,
                c.patch_size,
            ],
            nn::Init::Const(0.0),
        );
        let patch_bias = qwen3.then(|| patch.var("bias", &[e], nn::Init::Const(0.0)));
        let pos_embed = qwen3.then(|| {
            (path / "pos_embed").var(
                "weight",
                &[c.num_position_embeddings, e],
                nn::Init::Const(0.0),
            )
        });
        let blocks = (0..c.depth)
            .map(|i| {
                let p = path / "blocks" / i;
                let mlp = &p / "mlp";
                Block {
                    norm1: Norm::new(&p / "norm1", e, family),
                    norm2: Norm::new(&p / "norm2", e, family),
                    qkv: linear(&p / "attn" / "qkv", e, 3 * e, true),
                    proj: linear(&p / "attn" / "proj", e, e, true),
                    mlp: if qwen3 {
                        Mlp::Plain(
                            linear(&mlp / "linear_fc1", e, c.intermediate_size, true),
                            linear(&mlp / "linear_fc2", c.intermediate_size, e, true),
                        )
                    } else {
                        Mlp::Gated(
                            linear(&mlp / "gate_proj", e, c.intermediate_size, true),
                            linear(&mlp / "up_proj", e, c.intermediate_size, true),
                            linear(&mlp / "down_proj", c.intermediate_size, e, true),
                        )
                    },
                }
            })
            .collect();
        let merger = Merger::new(&(path / "merger"), c, family, false);
        let deepstack = (0..c.deepstack_visual_indexes.len())
            .map(|j| Merger::new(&(path / "deepstack_merger_list" / j), c, family, true))
            .collect();
        // transformers' axial rotary: theta^(-arange(0, d, 2) / d), d = head_dim / 2.
        let d = c.head_dim() / 2;
        let exponent = Tensor::arange_start_step(0, d, 2, (Kind::Int64, Device::Cpu))
            .to_kind(Kind::Float)
            / d as f64;
        let inv_freq = Tensor::from(c.rope_theta as f32)
            .pow(&exponent)
            .reciprocal()
            .to_device(path.device());
        VisionTower {
            family,
            config,
            patch_weight,
            patch_bias,
            pos_embed,
            blocks,
            merger,
            deepstack,
            inv_freq,
        }
    }

    /// The encoder's config.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// Encodes `images` (checked: [`check_images`]).
    pub fn forward(&self, images: &Images) -> Result<VisionOutput, HfError> {
        let c = &self.config;
        check_images(c, images)?;
        let device = self.patch_weight.device();
        let kind = self.patch_weight.kind();
        let (t, p, e) = (c.temporal_patch_size, c.patch_size, c.hidden_size);
        let grids = &images.grid_thw;
        let pixels =
            images
                .pixel_values
                .to_device(device)
                .to_kind(kind)
                .view([-1, c.in_channels, t, p, p]);
        let mut h = pixels
            .conv3d(
                &self.patch_weight,
                self.patch_bias.as_ref(),
                [t, p, p],
                [0, 0, 0],
                [1, 1, 1],
                1,
            )
            .view([-1, e]);
        if let Some(table) = &self.pos_embed {
            h = h + position_grid(table, grids, c.spatial_merge_size).to_kind(kind);
        }
        let n = h.size()[0];
        // 2-D rotary angles per patch, [N, head_dim] in f32.
        let rows: Vec<i64> = patch_rows_cols(grids, c.spatial_merge_size);
        let positions = Tensor::from_slice(&rows).view([n, 2]).to_device(device);
        let freqs = positions.unsqueeze(-1).to_kind(Kind::Float) * &self.inv_freq;
        let recompose = |f: Tensor| {
            let hw = Tensor::cat(&[f.select(1, 0), f.select(1, 1)], -1);
            Tensor::cat(&[&hw, &hw], -1)
        };
        let mut cos = recompose(freqs.cos());
        let mut sin = recompose(freqs.sin());
        let full = frame_lengths(grids);
        let mut window = None;
        let unit = c.merge_unit();
        let permute = |x: &Tensor, index: &Tensor| {
            let rows = x.size()[0];
            x.reshape([rows / unit, unit, -1])
                .index_select(0, index)
                .reshape([rows, -1])
        };
        if self.family == VlFamily::Qwen25Vl {
            let (index, lengths) = window_index(c, grids);
            let index = Tensor::from_slice(&index).to_device(device);
            h = permute(&h, &index);
            cos = permute(&cos, &index);
            sin = permute(&sin, &index);
            window = Some((index, lengths));
        }
        let merged = e * unit;
        let mut deepstack = Vec::new();
        // The blocks in chains ending where a DeepStack merger reads
        // (each a checkpointing::run, recomputed when checkpointing is on).
        let config = std::rc::Rc::new(c.clone());
        let mut start = 0;
        for end in 1..=self.blocks.len() {
            let ds = c
                .deepstack_visual_indexes
                .iter()
                .position(|&d| d == end as i64 - 1);
            if ds.is_none() && end < self.blocks.len() {
                continue;
            }
            let chain = start..end;
            start = end;
            let trains = self.blocks[chain.start].qkv.ws.requires_grad();
            h = checkpointing::run(h, &[], trains, |_| {
                chain
                    .map(|i| {
                        let lengths = match &window {
                            Some((_, windows))
                                if !c.fullatt_block_indexes.contains(&(i as i64)) =>
                            {
                                windows.clone()
                            }
                            _ => full.clone(),
                        };
                        let block = self.blocks[i].shallow();
                        let (cos, sin, config) = (cos.shallow(), sin.shallow(), config.clone());
                        Box::new(move |x: &Tensor| block.forward(x, &cos, &sin, &lengths, &config))
                            as checkpointing::Block
                    })
                    .collect()
            });
            if let Some(j) = ds {
                deepstack.push(self.deepstack[j].forward(&h, merged));
            }
        }
        let mut features = self.merger.forward(&h, merged);
        if let Some((index, _)) = window {
            features = features.index_select(0, &index.argsort(0, false));
        }
        Ok(VisionOutput {
            features,
            deepstack,
        })
    }
}

impl Block {
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        lengths: &[i64],
        c: &VisionConfig,
    ) -> Tensor {
        let n = x.size()[0];
        let heads = c.num_heads;
        let qkv = self
            .qkv
            .forward(&self.norm1.forward(x))
            .reshape([n, 3, heads, -1])
            .permute([1, 0, 2, 3]);
        let rotate = |y: Tensor| {
            let kind = y.kind();
            let y = y.to_kind(Kind::Float);
            let (cos, sin) = (cos.unsqueeze(-2), sin.unsqueeze(-2));
            (&y * cos + rotate_half(&y) * sin).to_kind(kind)
        };
        let q = rotate(qkv.get(0)).transpose(0, 1).unsqueeze(0);
        let k = rotate(qkv.get(1)).transpose(0, 1).unsqueeze(0);
        let v = qkv.get(2).transpose(0, 1).unsqueeze(0);
        let scale = (c.head_dim() as f64).powf(-0.5);
        let (qs, ks, vs) = (
            q.split_with_sizes(lengths, 2),
            k.split_with_sizes(lengths, 2),
            v.split_with_sizes(lengths, 2),
        );
        let outputs: Vec<Tensor> = qs
            .iter()
            .zip(&ks)
            .zip(&vs)
            .map(|((q, k), v)| {
                Tensor::scaled_dot_product_attention::<Tensor>(
                    q, k, v, None, 0.0, false, scale, false,
                )
                .transpose(1, 2)
            })
            .collect();
        let y = Tensor::cat(&outputs, 1).reshape([n, -1]);
        let h = x + self.proj.forward(&y);
        let n2 = self.norm2.forward(&h);
        let mlp = match &self.mlp {
            Mlp::Gated(gate, up, down) => {
                down.forward(&(c.hidden_act.apply(&gate.forward(&n2)) * up.forward(&n2)))
            }
            Mlp::Plain(fc1, fc2) => fc2.forward(&c.hidden_act.apply(&fc1.forward(&n2))),
        };
        h + mlp
    }
}

/// Checks that `images` fit `config`: `pixel_values` `[N, C·T·P²]` with
/// `N` the sum of the grids' `t·h·w`, each `h`, `w` a multiple of the merge
/// size.
pub fn check_images(config: &VisionConfig, images: &Images) -> Result<(), HfError> {
    let bad = |reason: String| Err(HfError::BadBatch(reason));
    let m = config.spatial_merge_size;
    let mut rows = 0i64;
    for (i, &[t, h, w]) in images.grid_thw.iter().enumerate() {
        if t <= 0 || h <= 0 || w <= 0 || h % m != 0 || w % m != 0 {
            return bad(format!(
                "image {i}: grid_thw [{t}, {h}, {w}] must be positive with h and w multiples of spatial_merge_size {m}"
            ));
        }
        rows += t * h * w;
    }
    let size = images.pixel_values.size();
    if size != [rows, config.patch_dim()] {
        return bad(format!(
            "pixel_values has shape {size:?}, the grids need [{rows}, {}] (channels × temporal_patch_size × patch_size²)",
            config.patch_dim()
        ));
    }
    Ok(())
}

/// `(row, col)` of every patch, flattened, in the processor's order: merge
/// blocks row-major, patches row-major within a block, frames repeated.
fn patch_rows_cols(grids: &[[i64; 3]], m: i64) -> Vec<i64> {
    let mut out = Vec::new();
    for &[t, h, w] in grids {
        for _ in 0..t {
            for bh in 0..h / m {
                for bw in 0..w / m {
                    for ih in 0..m {
                        for iw in 0..m {
                            out.extend([bh * m + ih, bw * m + iw]);
                        }
                    }
                }
            }
        }
    }
    out
}

/// Patches per frame of every image: the full-attention segments.
fn frame_lengths(grids: &[[i64; 3]]) -> Vec<i64> {
    grids
        .iter()
        .flat_map(|&[t, h, w]| std::iter::repeat_n(h * w, t as usize))
        .collect()
}

/// Qwen2.5-VL's windows: the order of the merged tokens window by window
/// (windows of `window_size / patch / merge` merged tokens a side, row-major
/// over each frame, the last row and column of windows partial) and the
/// patches in each non-empty window.
fn window_index(c: &VisionConfig, grids: &[[i64; 3]]) -> (Vec<i64>, Vec<i64>) {
    let m = c.spatial_merge_size;
    let side = c.window_size / m / c.patch_size;
    let mut index = Vec::new();
    let mut lengths = Vec::new();
    let mut offset = 0;
    for &[t, h, w] in grids {
        let (lh, lw) = (h / m, w / m);
        // As transformers pads: a whole window more when the side divides.
        let windows_h = (lh + side - lh % side) / side;
        let windows_w = (lw + side - lw % side) / side;
        for frame in 0..t {
            for wh in 0..windows_h {
                for ww in 0..windows_w {
                    let mut count = 0;
                    for r in wh * side..((wh + 1) * side).min(lh) {
                        for col in ww * side..((ww + 1) * side).min(lw) {
                            index.push(offset + frame * lh * lw + r * lw + col);
                            count += 1;
                        }
                    }
                    if count > 0 {
                        lengths.push(count * c.merge_unit());
                    }
                }
            }
        }
        offset += t * lh * lw;
    }
    (index, lengths)
}

/// Qwen3-VL's learned positions: the `side × side` grid of `table`
/// (`side = floor(sqrt(rows))`) resampled bilinearly (align_corners) to each
/// image's `h × w`, one row per patch in the processor's order, computed
/// with transformers' f32 operations.
fn position_grid(table: &Tensor, grids: &[[i64; 3]], m: i64) -> Tensor {
    let side = (table.size()[0] as f64).sqrt().floor() as i64;
    let taps = |index: i64, size: i64| -> [(i64, f32); 2] {
        let src = (index as f32 * (side - 1) as f32) / ((size - 1).max(1) as f32);
        let floor = src.floor();
        [0i64, 1].map(|offset| {
            let tap = (floor as i64 + offset).clamp(0, side - 1);
            let distance = (src - floor - offset as f32).abs();
            (tap, (1.0 - distance).max(0.0))
        })
    };
    let mut indices = Vec::new();
    let mut weights = Vec::new();
    let rows_cols = patch_rows_cols(grids, m);
    let mut k = 0;
    for &[t, h, w] in grids {
        for _ in 0..t * h * w {
            let (row, col) = (rows_cols[k], rows_cols[k + 1]);
            k += 2;
            for (hi, hw) in taps(row, h) {
                for (wi, ww) in taps(col, w) {
                    indices.push(hi * side + wi);
                    weights.push(hw * ww);
                }
            }
        }
    }
    let device = table.device();
    let indices = Tensor::from_slice(&indices).view([-1, 4]).to_device(device);
    let weights = Tensor::from_slice(&weights)
        .view([-1, 4, 1])
        .to_device(device);
    (Tensor::embedding(table, &indices, -1, false, false) * weights).sum_dim_intlist(
        1,
        false,
        None::<Kind>,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(window_size: i64) -> VisionConfig {
        VisionConfig {
            depth: 1,
            hidden_size: 8,
            intermediate_size: 8,
            num_heads: 1,
            hidden_act: crate::vl::config::Activation::Silu,
            in_channels: 3,
            patch_size: 4,
            temporal_patch_size: 2,
            spatial_merge_size: 2,
            out_hidden_size: 8,
            rope_theta: 10_000.0,
            window_size,
            fullatt_block_indexes: vec![],
            num_position_embeddings: 0,
            deepstack_visual_indexes: vec![],
        }
    }

    /// A 3 × 5 grid of merged tokens in windows of 2: rows {0, 1} and {2},
    /// columns {0, 1}, {2, 3} and {4}; a second 2 × 2 image (offset 15) fills
    /// one window, the padding row of windows after it empty and dropped.
    #[test]
    fn windows_cover_the_merged_tokens_row_major_with_partial_edges() {
        let (index, lengths) = window_index(&config(16), &[[1, 6, 10], [1, 4, 4]]);
        assert_eq!(
            index,
            [
                0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18
            ]
        );
        assert_eq!(lengths, [16, 16, 8, 8, 8, 4, 16]);
    }

    #[test]
    fn patches_are_numbered_block_by_block() {
        assert_eq!(
            patch_rows_cols(&[[1, 2, 4]], 2),
            [0, 0, 0, 1, 1, 0, 1, 1, 0, 2, 0, 3, 1, 2, 1, 3]
        );
    }
}
