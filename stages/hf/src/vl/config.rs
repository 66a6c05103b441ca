//! The `config.json` of a Qwen2.5-VL or Qwen3-VL checkpoint, resolved with
//! transformers' defaults (`Qwen2_5_VLConfig`, `Qwen3VLConfig`) into a
//! [`VlConfig`]: the language model as an [`HfConfig`] (Qwen2 with q/k/v
//! biases for Qwen2.5-VL, Qwen3 with q/k norms for Qwen3-VL), the vision
//! encoder's [`VisionConfig`], the multimodal rotary sections and the
//! special token ids.
//!
//! Both layouts are read: the current one (`text_config` and
//! `vision_config` objects) and the flat one the Qwen2.5-VL checkpoints on
//! the Hub ship (the language keys at the top level, `rope_scaling =
//! {"type": "mrope", "mrope_section": [...]}`). Defaults that differ from
//! the text-only decoders: `rope_theta` 1e6 (Qwen2.5-VL) or 5e5 (Qwen3-VL),
//! `rms_norm_eps` 1e-5 (Qwen2.5-VL), `mrope_section` [16, 24, 24] or
//! [24, 20, 20]; embeddings are tied when the top level or `text_config`
//! says so. Every `vision_config` size is bounded ([`MAX_DEPTH`] blocks,
//! [`MAX_WIDTH`] wide, …) before anything is allocated: a size beyond its
//! bound is a typed error naming the file, the key and the bound.
//!
//! ```no_run
//! use embodyflow_hf::vl::VlConfig;
//! let config = VlConfig::from_file("Qwen2.5-VL-3B-Instruct/config.json".as_ref()).unwrap();
//! println!("{} vision blocks, M-RoPE {:?}", config.vision.depth, config.mrope_section);
//! ```

use std::path::Path;

use serde_json::{Map, Value};

use crate::HfError;
use crate::config::HfConfig;
use crate::safetensors::Expected;

/// The vision-language families we run, by `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VlFamily {
    /// `qwen2_5_vl`: window and full attention blocks with RMSNorm and a
    /// SiLU-gated MLP, a Qwen2 language model, M-RoPE in sections.
    Qwen25Vl,
    /// `qwen3_vl`: LayerNorm blocks, a learned position grid, DeepStack
    /// features, a Qwen3 language model, interleaved M-RoPE.
    Qwen3Vl,
}

impl VlFamily {
    /// The `model_type` values we accept, for error messages.
    pub const SUPPORTED: &'static str = "qwen2_5_vl, qwen3_vl";
    /// The `model_type` of each family, in [`VlFamily::ALL`]'s order.
    pub const NAMES: &'static [&'static str] = &["qwen2_5_vl", "qwen3_vl"];
    /// Every family.
    pub const ALL: [VlFamily; 2] = [VlFamily::Qwen25Vl, VlFamily::Qwen3Vl];

    /// The family of a `model_type`, if we run it.
    pub fn parse(name: &str) -> Option<VlFamily> {
        let at = Self::NAMES.iter().position(|&n| n == name)?;
        Some(Self::ALL[at])
    }
}

/// The activation of the vision MLP (`vision_config.hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu`.
    Silu,
    /// `gelu` (erf).
    Gelu,
    /// `gelu_pytorch_tanh`.
    GeluTanh,
}

impl Activation {
    /// Applies the activation.
    pub fn apply(self, x: &tch::Tensor) -> tch::Tensor {
        match self {
            Activation::Silu => x.silu(),
            Activation::Gelu => x.gelu("none"),
            Activation::GeluTanh => x.gelu("tanh"),
        }
    }
}

/// A resolved `vision_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// Blocks.
    pub depth: i64,
    /// Width of the blocks.
    pub hidden_size: i64,
    /// Width of the MLP.
    pub intermediate_size: i64,
    /// Attention heads.
    pub num_heads: i64,
    /// The MLP's activation.
    pub hidden_act: Activation,
    /// Image channels.
    pub in_channels: i64,
    /// Side of a patch, in pixels.
    pub patch_size: i64,
    /// Frames per temporal patch (an image is repeated to fill them).
    pub temporal_patch_size: i64,
    /// Side of the square of patches merged into one language token.
    pub spatial_merge_size: i64,
    /// Width of the merged tokens (the language model's `hidden_size`).
    pub out_hidden_size: i64,
    /// Base of the 2-D rotary frequencies.
    pub rope_theta: f64,
    /// Qwen2.5-VL: side of an attention window, in pixels.
    pub window_size: i64,
    /// Qwen2.5-VL: the blocks that attend over the whole image.
    pub fullatt_block_indexes: Vec<i64>,
    /// Qwen3-VL: rows of the learned position grid (a square).
    pub num_position_embeddings: i64,
    /// Qwen3-VL: the blocks whose output feeds a DeepStack merger, the
    /// `i`-th added after the language model's layer `i`.
    pub deepstack_visual_indexes: Vec<i64>,
}

impl VisionConfig {
    /// Width of one head.
    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_heads
    }

    /// Patches per merged token.
    pub fn merge_unit(&self) -> i64 {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// Values per flattened patch: channels × temporal × patch².
    pub fn patch_dim(&self) -> i64 {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// Where a checkpoint keeps its two towers: `model.language_model` and
/// `model.visual` (transformers 5), or `model` and `visual` (the Hub's
/// Qwen2.5-VL files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The language model's prefix.
    pub language: &'static str,
    /// The vision encoder's prefix.
    pub visual: &'static str,
}

impl Layout {
    /// transformers 5's names.
    pub const CURRENT: Layout = Layout {
        language: "model.language_model",
        visual: "model.visual",
    };
    /// The names of checkpoints written before the towers were nested.
    pub const FLAT: Layout = Layout {
        language: "model",
        visual: "visual",
    };
}

/// A resolved vision-language configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VlConfig {
    /// The family.
    pub family: VlFamily,
    /// The language model (its `tie_word_embeddings` already merged with
    /// the top level's).
    pub text: HfConfig,
    /// The vision encoder.
    pub vision: VisionConfig,
    /// Frequencies given to the temporal, height and width positions;
    /// sums to `head_dim / 2`.
    pub mrope_section: [i64; 3],
    /// The placeholder each merged image patch takes in the prompt.
    pub image_token_id: i64,
    /// The video placeholder (videos are not supported).
    pub video_token_id: i64,
    /// `<|vision_start|>`.
    pub vision_start_token_id: i64,
    /// `<|vision_end|>`.
    pub vision_end_token_id: i64,
    /// The whole `config.json` as read, written back on save.
    pub source: Map<String, Value>,
}

impl VlConfig {
    /// Reads and resolves a `config.json`.
    pub fn from_file(file: &Path) -> Result<VlConfig, HfError> {
        let text = std::fs::read_to_string(file).map_err(|source| HfError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        VlConfig::parse(&text, file)
    }

    /// Whether the text of a `config.json` names a vision-language
    /// `model_type` we run.
    pub fn is_vl(text: &str) -> bool {
        serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v.get("model_type")?.as_str().and_then(VlFamily::parse))
            .is_some()
    }

    /// Resolves the text of a `config.json`; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<VlConfig, HfError> {
        let bad = |reason: String| HfError::BadConfig {
            file: file.to_path_buf(),
            reason,
        };
        let source: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let family = match source.get("model_type") {
            Some(Value::String(name)) => {
                VlFamily::parse(name).ok_or_else(|| HfError::UnsupportedArchitecture {
                    file: file.to_path_buf(),
                    found: name.clone(),
                    supported: VlFamily::SUPPORTED,
                })?
            }
            Some(other) => return Err(bad(format!("`model_type` is {other}, expected a string"))),
            None => return Err(bad("missing key `model_type`".into())),
        };
        let (text_key, text_map) = match source.get("text_config") {
            Some(Value::Object(map)) => ("text_config.", map.clone()),
            Some(other) => {
                return Err(bad(format!("`text_config` is {other}, expected an object")));
            }
            None => ("", source.clone()),
        };
        let (text, mrope_section) = text_config(family, text_key, text_map, &source, file)?;
        let vision = match source.get("vision_config") {
            Some(Value::Object(map)) => vision_config(family, map, file)?,
            Some(other) => {
                return Err(bad(format!(
                    "`vision_config` is {other}, expected an object"
                )));
            }
            None => return Err(bad("missing key `vision_config`".into())),
        };
        if vision.out_hidden_size != text.hidden_size {
            return Err(bad(format!(
                "`vision_config.out_hidden_size` {} differs from the language model's `{text_key}hidden_size` {}",
                vision.out_hidden_size, text.hidden_size
            )));
        }
        if vision.deepstack_visual_indexes.len() as i64 > text.num_hidden_layers {
            return Err(bad(format!(
                "`vision_config.deepstack_visual_indexes` feeds {} layers, the language model has {}",
                vision.deepstack_visual_indexes.len(),
                text.num_hidden_layers
            )));
        }
        let token = |key: &str, default: i64| -> Result<i64, HfError> {
            match source.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_i64()
                    .filter(|&id| (0..text.vocab_size).contains(&id))
                    .ok_or_else(|| {
                        bad(format!(
                            "`{key}` is {v}, expected a token id below `vocab_size` {}",
                            text.vocab_size
                        ))
                    }),
            }
        };
        Ok(VlConfig {
            family,
            mrope_section,
            image_token_id: token("image_token_id", 151655)?,
            video_token_id: token("video_token_id", 151656)?,
            vision_start_token_id: token("vision_start_token_id", 151652)?,
            vision_end_token_id: token("vision_end_token_id", 151653)?,
            text,
            vision,
            source,
        })
    }

    /// Every parameter the config implies under `layout`'s names: the
    /// language model's ([`HfConfig::tensors_at`]) and the vision
    /// encoder's, in the order the network creates them.
    pub fn tensors<'a>(&'a self, layout: &'a Layout) -> impl Iterator<Item = Expected> + 'a {
        self.text
            .tensors_at(layout.language)
            .chain(self.vision_tensors(layout.visual))
    }

    fn vision_tensors(&self, prefix: &str) -> Vec<Expected> {
        const BLOCK: &str = "vision_config.depth, hidden_size, intermediate_size";
        const MERGER: &str = "vision_config.hidden_size, spatial_merge_size, out_hidden_size";
        let v = &self.vision;
        let (e, i, o) = (v.hidden_size, v.intermediate_size, v.out_hidden_size);
        let merged = e * v.merge_unit();
        let qwen3 = self.family == VlFamily::Qwen3Vl;
        let mut out = vec![Expected::new(
            format!("{prefix}.patch_embed.proj.weight"),
            &[
                e,
                v.in_channels,
                v.temporal_patch_size,
                v.patch_size,
                v.patch_size,
            ],
            "vision_config.hidden_size, in_channels, temporal_patch_size, patch_size",
        )];
        let linear = |out: &mut Vec<Expected>, name: String, rows: i64, cols: i64, keys| {
            out.push(Expected::new(format!("{name}.weight"), &[rows, cols], keys));
            out.push(Expected::new(format!("{name}.bias"), &[rows], keys));
        };
        // LayerNorm (weight and bias) in Qwen3-VL, RMSNorm (weight) in Qwen2.5-VL.
        let norm = |out: &mut Vec<Expected>, name: String, dim: i64, keys| {
            out.push(Expected::new(format!("{name}.weight"), &[dim], keys));
            if qwen3 {
                out.push(Expected::new(format!("{name}.bias"), &[dim], keys));
            }
        };
        if qwen3 {
            out.push(Expected::new(
                format!("{prefix}.patch_embed.proj.bias"),
                &[e],
                "vision_config.hidden_size",
            ));
            out.push(Expected::new(
                format!("{prefix}.pos_embed.weight"),
                &[v.num_position_embeddings, e],
                "vision_config.num_position_embeddings, hidden_size",
            ));
        }
        for block in 0..v.depth {
            let at = |name: &str| format!("{prefix}.blocks.{block}.{name}");
            let mut tensors = Vec::new();
            norm(&mut tensors, at("norm1"), e, BLOCK);
            norm(&mut tensors, at("norm2"), e, BLOCK);
            linear(&mut tensors, at("attn.qkv"), 3 * e, e, BLOCK);
            linear(&mut tensors, at("attn.proj"), e, e, BLOCK);
            if qwen3 {
                linear(&mut tensors, at("mlp.linear_fc1"), i, e, BLOCK);
                linear(&mut tensors, at("mlp.linear_fc2"), e, i, BLOCK);
            } else {
                linear(&mut tensors, at("mlp.gate_proj"), i, e, BLOCK);
                linear(&mut tensors, at("mlp.up_proj"), i, e, BLOCK);
                linear(&mut tensors, at("mlp.down_proj"), e, i, BLOCK);
            }
            tensors.sort_by(|a, b| a.name.cmp(&b.name));
            out.extend(tensors);
        }
        if qwen3 {
            let merger = |out: &mut Vec<Expected>, name: String, norm_dim: i64| {
                norm(out, format!("{name}.norm"), norm_dim, MERGER);
                linear(out, format!("{name}.linear_fc1"), merged, merged, MERGER);
                linear(out, format!("{name}.linear_fc2"), o, merged, MERGER);
            };
            merger(&mut out, format!("{prefix}.merger"), e);
            for j in 0..v.deepstack_visual_indexes.len() {
                merger(
                    &mut out,
                    format!("{prefix}.deepstack_merger_list.{j}"),
                    merged,
                );
            }
        } else {
            norm(&mut out, format!("{prefix}.merger.ln_q"), e, MERGER);
            linear(
                &mut out,
                format!("{prefix}.merger.mlp.0"),
                merged,
                merged,
                MERGER,
            );
            linear(
                &mut out,
                format!("{prefix}.merger.mlp.2"),
                o,
                merged,
                MERGER,
            );
        }
        out
    }
}

/// The language model's config: `map` (the `text_config` object, or the
/// top level of a flat config) given the family's `model_type` and
/// defaults, resolved by [`HfConfig::parse`]; and the M-RoPE sections.
fn text_config(
    family: VlFamily,
    key: &str,
    mut map: Map<String, Value>,
    top: &Map<String, Value>,
    file: &Path,
) -> Result<(HfConfig, [i64; 3]), HfError> {
    let bad = |reason: String| HfError::BadConfig {
        file: file.to_path_buf(),
        reason,
    };
    let (model_type, theta, eps, context, section) = match family {
        VlFamily::Qwen25Vl => ("qwen2", 1e6, 1e-5, 32768, [16, 24, 24]),
        VlFamily::Qwen3Vl => ("qwen3", 5e5, 1e-6, 128000, [24, 20, 20]),
    };
    map.insert("model_type".into(), Value::from(model_type));
    map.entry("rms_norm_eps").or_insert(Value::from(eps));
    map.entry("max_position_embeddings")
        .or_insert(Value::from(context));
    let tied = [
        top.get("tie_word_embeddings"),
        map.get("tie_word_embeddings"),
    ]
    .into_iter()
    .any(|v| v.and_then(Value::as_bool) == Some(true));
    map.insert("tie_word_embeddings".into(), Value::from(tied));
    // transformers reads `mrope` as the default rotary type with sections.
    let rope_key = ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find(|k| map.get(*k).is_some_and(Value::is_object));
    let mut mrope = None;
    if let Some(rope_key) = rope_key
        && let Some(Value::Object(params)) = map.get_mut(rope_key)
    {
        for kind in ["rope_type", "type"] {
            if params.get(kind).and_then(Value::as_str) == Some("mrope") {
                params.insert(kind.into(), Value::from("default"));
            }
        }
        mrope = params.remove("mrope_section").map(|v| (rope_key, v));
        params.remove("mrope_interleaved");
        if !params.contains_key("rope_theta") && !map.contains_key("rope_theta") {
            map.insert("rope_theta".into(), Value::from(theta));
        }
    } else {
        map.entry("rope_theta").or_insert(Value::from(theta));
    }
    let text = HfConfig::parse(&Value::Object(map).to_string(), file).map_err(|e| match e {
        HfError::BadConfig { file, reason } if !key.is_empty() => HfError::BadConfig {
            file,
            reason: format!("{} ({key}…)", reason),
        },
        other => other,
    })?;
    let section = match mrope {
        None => section,
        Some((rope_key, value)) => {
            let parsed: Option<Vec<i64>> = value
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect());
            match parsed.as_deref() {
                Some(&[t, h, w]) if t >= 0 && h >= 0 && w >= 0 => [t, h, w],
                _ => {
                    return Err(bad(format!(
                        "`{key}{rope_key}.mrope_section` is {value}, expected 3 counts"
                    )));
                }
            }
        }
    };
    let half = text.head_dim / 2;
    if section.iter().sum::<i64>() != half {
        return Err(bad(format!(
            "`{key}mrope_section` {section:?} sums to {}, the rotary half width (head_dim / 2) is {half}",
            section.iter().sum::<i64>()
        )));
    }
    if family == VlFamily::Qwen3Vl && (section[1] * 3 > half || section[2] * 3 > half) {
        return Err(bad(format!(
            "`{key}mrope_section` {section:?}: interleaved height/width sections need 3 × each <= {half}"
        )));
    }
    Ok((text, section))
}

/// The most blocks a vision encoder may have (Qwen2.5-VL has 32,
/// Qwen3-VL 27), which also bounds its lists of block indexes.
pub const MAX_DEPTH: i64 = 1024;
/// The most a vision width (`hidden_size`, `intermediate_size`,
/// `out_hidden_size`) or the learned position grid may be: 2^20.
pub const MAX_WIDTH: i64 = 1 << 20;

/// The largest value `vision_config.<key>` may take. Every size is bounded
/// before anything is allocated: a forged `depth` of 10^9 is refused here
/// instead of listing 10^9 blocks' tensors, and the products the tensor
/// shapes take (`hidden_size` × `spatial_merge_size`^2, squared; channels
/// × temporal × patch^2 × `hidden_size`) stay far inside an `i64`.
fn bound(key: &str) -> i64 {
    match key {
        "depth" => MAX_DEPTH,
        "hidden_size" | "intermediate_size" | "out_hidden_size" | "num_position_embeddings" => {
            MAX_WIDTH
        }
        "num_heads" => 1 << 16,
        "in_channels" | "temporal_patch_size" => 64,
        "patch_size" => 1024,
        "spatial_merge_size" => 16,
        "window_size" => 1 << 16,
        _ => unreachable!("no bound for vision_config.{key}"),
    }
}

/// The vision encoder's config from the `vision_config` object.
fn vision_config(
    family: VlFamily,
    map: &Map<String, Value>,
    file: &Path,
) -> Result<VisionConfig, HfError> {
    let bad = |reason: String| HfError::BadConfig {
        file: file.to_path_buf(),
        reason,
    };
    let int = |key: &str, default: i64| -> Result<i64, HfError> {
        let bound = bound(key);
        match map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_i64().filter(|&n| n > 0 && n <= bound).ok_or_else(|| {
                bad(format!(
                    "`vision_config.{key}` is {v}, expected an integer > 0 and <= {bound}"
                ))
            }),
        }
    };
    let list = |key: &str, default: &[i64]| -> Result<Vec<i64>, HfError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(default.to_vec()),
            Some(Value::Array(a)) if a.len() as u64 > MAX_DEPTH as u64 => Err(bad(format!(
                "`vision_config.{key}` lists {} blocks, expected at most {MAX_DEPTH}",
                a.len()
            ))),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect())
                .ok_or_else(|| {
                    bad(format!(
                        "`vision_config.{key}` is {v}, expected a list of block indexes"
                    ))
                }),
        }
    };
    let qwen3 = family == VlFamily::Qwen3Vl;
    let act_default = if qwen3 { "gelu_pytorch_tanh" } else { "silu" };
    let act = match map.get("hidden_act") {
        None | Some(Value::Null) => act_default,
        Some(Value::String(s)) => s.as_str(),
        Some(v) => {
            return Err(bad(format!(
                "`vision_config.hidden_act` is {v}, expected a string"
            )));
        }
    };
    let hidden_act = match act {
        "silu" => Activation::Silu,
        "gelu" => Activation::Gelu,
        "gelu_pytorch_tanh" => Activation::GeluTanh,
        other => {
            return Err(bad(format!(
                "`vision_config.hidden_act` {other:?} is not supported (supported: silu, gelu, gelu_pytorch_tanh)"
            )));
        }
    };
    let rope_theta = match map.get("rope_parameters") {
        Some(Value::Object(p)) => {
            match p.get("rope_type").and_then(Value::as_str) {
                None | Some("axial") | Some("default") => {}
                Some(other) => {
                    return Err(HfError::UnsupportedRope {
                        file: file.to_path_buf(),
                        key: "vision_config.rope_parameters".into(),
                        found: other.into(),
                    });
                }
            }
            match p.get("rope_theta") {
                None | Some(Value::Null) => 10_000.0,
                Some(v) => v
                    .as_f64()
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .ok_or_else(|| {
                        bad(format!(
                            "`vision_config.rope_parameters.rope_theta` is {v}, expected a finite number > 0"
                        ))
                    })?,
            }
        }
        _ => 10_000.0,
    };
    let (hidden, heads) = if qwen3 { (1152, 16) } else { (3584, 16) };
    let config = VisionConfig {
        depth: int("depth", if qwen3 { 27 } else { 32 })?,
        hidden_size: int("hidden_size", hidden)?,
        intermediate_size: int("intermediate_size", if qwen3 { 4304 } else { 3420 })?,
        num_heads: int("num_heads", heads)?,
        hidden_act,
        in_channels: int("in_channels", 3)?,
        patch_size: int("patch_size", if qwen3 { 16 } else { 14 })?,
        temporal_patch_size: int("temporal_patch_size", 2)?,
        spatial_merge_size: int("spatial_merge_size", 2)?,
        out_hidden_size: int("out_hidden_size", 3584)?,
        rope_theta,
        window_size: if qwen3 { 0 } else { int("window_size", 112)? },
        fullatt_block_indexes: if qwen3 {
            Vec::new()
        } else {
            list("fullatt_block_indexes", &[7, 15, 23, 31])?
        },
        num_position_embeddings: if qwen3 {
            int("num_position_embeddings", 2304)?
        } else {
            0
        },
        deepstack_visual_indexes: if qwen3 {
            list("deepstack_visual_indexes", &[8, 16, 24])?
        } else {
            Vec::new()
        },
    };
    let head_dim = config.hidden_size / config.num_heads;
    if config.hidden_size % config.num_heads != 0 || head_dim % 4 != 0 {
        return Err(bad(format!(
            "`vision_config.num_heads` {} must divide `hidden_size` {} into heads of a multiple of 4 (2-D rotary)",
            config.num_heads, config.hidden_size
        )));
    }
    for (key, indexes) in [
        ("fullatt_block_indexes", &config.fullatt_block_indexes),
        ("deepstack_visual_indexes", &config.deepstack_visual_indexes),
    ] {
        if let Some(i) = indexes.iter().find(|&&i| i < 0 || i >= config.depth) {
            return Err(bad(format!(
                "`vision_config.{key}` holds {i}, outside the {} blocks (`depth`)",
                config.depth
            )));
        }
    }
    if !qwen3 && config.window_size / config.spatial_merge_size / config.patch_size == 0 {
        return Err(bad(format!(
            "`vision_config.window_size` {} is smaller than patch_size × spatial_merge_size = {}",
            config.window_size,
            config.patch_size * config.spatial_merge_size
        )));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small Qwen2.5-VL config with `vision` spliced into its
    /// `vision_config` and `out_hidden_size` = the text width.
    fn config(family: &str, vision: &str) -> String {
        let text = if family == "qwen3_vl" {
            r#""head_dim": 16, "rope_parameters": {"rope_type": "default", "mrope_section": [4, 2, 2]}"#
        } else {
            r#""rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 2]}"#
        };
        format!(
            r#"{{"model_type": "{family}",
            "text_config": {{"vocab_size": 200, "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, {text}}},
            "vision_config": {{"depth": 2, "hidden_size": 32, "intermediate_size": 48,
              "num_heads": 2, "patch_size": 4, "window_size": 16, "out_hidden_size": 48,
              "fullatt_block_indexes": [1], "deepstack_visual_indexes": [0, 1],
              "num_position_embeddings": 16 {vision}}},
            "image_token_id": 192, "video_token_id": 193, "vision_start_token_id": 190,
            "vision_end_token_id": 191}}"#
        )
    }

    fn refused(family: &str, vision: &str) -> String {
        let text = config(family, vision);
        match VlConfig::parse(&text, Path::new("m/config.json")) {
            Ok(_) => panic!("{vision} was accepted"),
            Err(e) => {
                assert!(matches!(e, HfError::BadConfig { .. }), "{e}");
                e.to_string()
            }
        }
    }

    #[test]
    fn forged_vision_sizes_are_refused_before_anything_is_allocated() {
        for family in VlFamily::NAMES {
            VlConfig::parse(&config(family, ""), Path::new("m/config.json")).unwrap();
        }
        let started = std::time::Instant::now();
        for (family, key, value, bound) in [
            ("qwen2_5_vl", "depth", "1000000000", "1024"),
            ("qwen3_vl", "depth", "1000000000", "1024"),
            ("qwen2_5_vl", "hidden_size", "4294967296", "1048576"),
            (
                "qwen2_5_vl",
                "intermediate_size",
                "1099511627776",
                "1048576",
            ),
            (
                "qwen2_5_vl",
                "out_hidden_size",
                "9223372036854775807",
                "1048576",
            ),
            ("qwen2_5_vl", "num_heads", "1000000000", "65536"),
            ("qwen2_5_vl", "in_channels", "100000", "64"),
            ("qwen2_5_vl", "patch_size", "3037000500", "1024"),
            ("qwen2_5_vl", "temporal_patch_size", "1000000", "64"),
            ("qwen2_5_vl", "spatial_merge_size", "65536", "16"),
            ("qwen2_5_vl", "window_size", "1000000000", "65536"),
            (
                "qwen3_vl",
                "num_position_embeddings",
                "1000000000000",
                "1048576",
            ),
        ] {
            let err = refused(family, &format!(r#", "{key}": {value}"#));
            assert!(
                err.contains("m/config.json")
                    && err.contains(&format!("`vision_config.{key}` is {value}"))
                    && err.contains(&format!("<= {bound}")),
                "{family} {key}: {err}"
            );
        }
        // Block indexes: in range, and no longer a list than the bound.
        let err = refused("qwen3_vl", r#", "deepstack_visual_indexes": [0, 2]"#);
        assert!(
            err.contains("`vision_config.deepstack_visual_indexes` holds 2"),
            "{err}"
        );
        let many = vec!["1"; 2000].join(", ");
        let err = refused(
            "qwen2_5_vl",
            &format!(r#", "fullatt_block_indexes": [{many}]"#),
        );
        assert!(
            err.contains(
                "`vision_config.fullatt_block_indexes` lists 2000 blocks, expected at most 1024"
            ),
            "{err}"
        );
        let err = refused(
            "qwen3_vl",
            r#", "rope_parameters": {"rope_type": "default", "rope_theta": -1.0}"#,
        );
        assert!(err.contains("rope_theta` is -1.0"), "{err}");
        assert!(
            started.elapsed().as_secs_f64() < 5.0,
            "took {:?}",
            started.elapsed()
        );
    }

    /// The largest config the bounds allow lists its tensors without an
    /// overflowing shape.
    #[test]
    fn the_bounds_keep_every_shape_inside_an_i64() {
        for family in VlFamily::NAMES {
            let text = config(
                family,
                r#", "hidden_size": 1048576, "num_heads": 65536, "spatial_merge_size": 16,
                "in_channels": 64, "temporal_patch_size": 64, "patch_size": 1024,
                "window_size": 65536, "num_position_embeddings": 1048576,
                "intermediate_size": 1048576"#,
            );
            let config = VlConfig::parse(&text, Path::new("m/config.json")).unwrap();
            for expected in config.vision_tensors("visual") {
                let numel = expected
                    .shape
                    .iter()
                    .try_fold(1i64, |n, &d| n.checked_mul(d));
                assert!(numel.is_some(), "{expected:?}");
            }
        }
    }
}
