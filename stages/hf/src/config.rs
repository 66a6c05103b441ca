//! A Hugging Face `config.json` for the decoders we run: the keys of
//! transformers' `Qwen2Config`, `Qwen3Config` and `LlamaConfig`, resolved
//! with transformers' own defaults into one [`HfConfig`].
//!
//! Both layouts transformers has written are read: the current one
//! (`rope_parameters = {rope_type, rope_theta, ...}`, `dtype`) and the older
//! one (`rope_theta` beside `rope_scaling = {type | rope_type, ...}`,
//! `torch_dtype`). Defaults follow the config classes: `num_key_value_heads`
//! = `num_attention_heads`; `head_dim` = `hidden_size / num_attention_heads`
//! except Qwen3 (128); `rope_theta` 10000; `rms_norm_eps` 1e-6; untied
//! embeddings. Rotary scaling (transformers' `modeling_rope_utils.py`):
//!
//! ```text
//! default  inv_freq[i] = theta^(-2i/d)
//! linear   inv_freq[i] / factor
//! llama3   wavelen = 2π / inv_freq; kept where wavelen < L / high_freq_factor,
//!          divided by factor where wavelen > L / low_freq_factor, between:
//!          (1 - s) inv_freq / factor + s inv_freq,
//!          s = (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
//!          (L = original_max_position_embeddings, default max_position_embeddings)
//! ```
//!
//! Anything else (another `model_type`, another rope type, a sliding window,
//! partial rotary, an activation other than SiLU) is a typed error naming
//! the file and key, never a silently different model.
//!
//! ```no_run
//! use embodyflow_hf::config::{HfConfig, ModelType};
//! let config = HfConfig::from_file("Qwen3-0.6B/config.json".as_ref()).unwrap();
//! assert_eq!(config.model_type, ModelType::Qwen3);
//! println!("{} layers, head_dim {}", config.num_hidden_layers, config.head_dim);
//! ```

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::HfError;
use crate::safetensors::Expected;

/// The architectures we run, by `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    /// Qwen2 / Qwen2.5: q/k/v projections with biases, o without.
    Qwen2,
    /// Qwen3: per-head RMSNorm on queries and keys before the rotary embedding.
    Qwen3,
    /// Llama (1 to 3.x): optional attention and MLP biases.
    Llama,
}

impl ModelType {
    /// The `model_type` values we accept, for error messages.
    pub const SUPPORTED: &'static str = "qwen2, qwen3, llama";
    /// The `model_type` of each architecture, in [`ModelType::ALL`]'s order.
    pub const NAMES: &'static [&'static str] = &["qwen2", "qwen3", "llama"];
    /// Every architecture.
    pub const ALL: [ModelType; 3] = [ModelType::Qwen2, ModelType::Qwen3, ModelType::Llama];

    fn parse(name: &str) -> Option<ModelType> {
        let at = Self::NAMES.iter().position(|&n| n == name)?;
        Some(Self::ALL[at])
    }
}

/// Rotary frequency scaling (`rope_parameters.rope_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`default`).
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's wavelength-dependent scaling.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are divided.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The pretraining context length.
        original_max_position_embeddings: f64,
    },
}

/// A resolved decoder configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The architecture.
    pub model_type: ModelType,
    /// Tokens in the embedding and the output head.
    pub vocab_size: i64,
    /// Width of the residual stream.
    pub hidden_size: i64,
    /// Width of the gated MLP.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (grouped-query attention; divides the query heads).
    pub num_key_value_heads: i64,
    /// Width of one head.
    pub head_dim: i64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Longest context the model was configured for.
    pub max_position_embeddings: i64,
    /// Output head shares the token embedding.
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Biases in the MLP (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// `dtype` (or the older `torch_dtype`) as written, e.g. `bfloat16`.
    pub dtype: Option<String>,
    /// The whole `config.json` object as read: [`crate::HfDecoder::save`]
    /// writes it back, so keys we do not interpret survive a round trip.
    pub source: Map<String, Value>,
}

/// The keys we read, before defaults; unknown keys are ignored (they stay
/// in [`HfConfig::source`]).
#[derive(Deserialize)]
struct RawConfig {
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<Map<String, Value>>,
    rope_scaling: Option<Map<String, Value>>,
    partial_rotary_factor: Option<f64>,
    max_position_embeddings: i64,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
    dtype: Option<String>,
    torch_dtype: Option<String>,
}

impl HfConfig {
    /// Reads and resolves a `config.json`.
    pub fn from_file(file: &Path) -> Result<HfConfig, HfError> {
        let text = std::fs::read_to_string(file).map_err(|source| HfError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        HfConfig::parse(&text, file)
    }

    /// Resolves the text of a `config.json`; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<HfConfig, HfError> {
        let bad = |reason: String| HfError::BadConfig {
            file: file.to_path_buf(),
            reason,
        };
        let source: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        // The architecture first, so an unsupported model is named as such
        // and not as a missing key of ours.
        let model_type = match source.get("model_type") {
            Some(Value::String(name)) => {
                ModelType::parse(name).ok_or_else(|| HfError::UnsupportedArchitecture {
                    file: file.to_path_buf(),
                    found: name.clone(),
                    supported: ModelType::SUPPORTED,
                })?
            }
            Some(other) => return Err(bad(format!("`model_type` is {other}, expected a string"))),
            None => return Err(bad("missing key `model_type`".into())),
        };
        let raw: RawConfig = serde_json::from_value(Value::Object(source.clone()))
            .map_err(|e| bad(e.to_string()))?;
        let act = raw.hidden_act.as_deref().unwrap_or("silu");
        if act != "silu" {
            return Err(bad(format!(
                "`hidden_act` is {act:?}, only \"silu\" is supported"
            )));
        }
        if raw.use_sliding_window == Some(true) {
            return Err(bad(
                "`use_sliding_window` is true; sliding-window attention is not supported".into(),
            ));
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        for (key, value) in [
            ("vocab_size", raw.vocab_size),
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("max_position_embeddings", raw.max_position_embeddings),
        ] {
            if value <= 0 {
                return Err(bad(format!("`{key}` is {value}, expected > 0")));
            }
        }
        if heads % kv_heads != 0 {
            return Err(bad(format!(
                "`num_key_value_heads` {kv_heads} does not divide `num_attention_heads` {heads}"
            )));
        }
        let head_dim = match (raw.head_dim, model_type) {
            (Some(d), _) => d,
            (None, ModelType::Qwen3) => 128,
            (None, _) => {
                if raw.hidden_size % heads != 0 {
                    return Err(bad(format!(
                        "no `head_dim` and `num_attention_heads` {heads} does not divide `hidden_size` {}",
                        raw.hidden_size
                    )));
                }
                raw.hidden_size / heads
            }
        };
        if head_dim <= 0 || head_dim % 2 != 0 {
            return Err(bad(format!(
                "`head_dim` is {head_dim}, expected even and > 0"
            )));
        }
        if heads.checked_mul(head_dim).is_none() {
            return Err(bad(format!(
                "`num_attention_heads` {heads} × `head_dim` {head_dim} overflows"
            )));
        }
        let (rope_theta, rope_scaling) = rope(&raw, file)?;
        let (qkv_bias, o_bias, mlp_bias) = match model_type {
            ModelType::Qwen2 => (true, false, false),
            ModelType::Qwen3 => {
                let b = raw.attention_bias.unwrap_or(false);
                (b, b, false)
            }
            ModelType::Llama => {
                let b = raw.attention_bias.unwrap_or(false);
                (b, b, raw.mlp_bias.unwrap_or(false))
            }
        };
        Ok(HfConfig {
            model_type,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias,
            dtype: raw.dtype.or(raw.torch_dtype),
            source,
        })
    }

    /// Every parameter the config implies, under transformers' names, in
    /// the order [`crate::HfNet::new`] creates them: the embedding, each
    /// layer's, the final norm and the untied head. Lazy, so that checking
    /// a config of 10^9 layers against the weights ([`Weights::check`])
    /// stops at the first layer the files lack.
    ///
    /// [`Weights::check`]: crate::safetensors::Weights::check
    pub fn tensors(&self) -> impl Iterator<Item = Expected> + '_ {
        self.tensors_at("model")
    }

    /// As [`HfConfig::tensors`], the decoder's under `prefix` instead of
    /// `model` (`model.language_model` in a vision-language checkpoint);
    /// the untied head stays `lm_head.weight`.
    pub fn tensors_at<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = Expected> + 'a {
        let (h, d, i) = (self.hidden_size, self.head_dim, self.intermediate_size);
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let embed = Expected::new(
            format!("{prefix}.embed_tokens.weight"),
            &[self.vocab_size, h],
            "vocab_size, hidden_size",
        );
        let layers = (0..self.num_hidden_layers).flat_map(move |layer| {
            const LAYER: &str = "num_hidden_layers, hidden_size";
            const ATTENTION: &str =
                "num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim";
            const MLP: &str = "num_hidden_layers, hidden_size, intermediate_size";
            let at = |name: &str| format!("{prefix}.layers.{layer}.{name}");
            let mut tensors = vec![
                Expected::new(at("input_layernorm.weight"), &[h], LAYER),
                Expected::new(at("post_attention_layernorm.weight"), &[h], LAYER),
            ];
            for (proj, rows, bias) in [
                ("q_proj", q, self.qkv_bias),
                ("k_proj", kv, self.qkv_bias),
                ("v_proj", kv, self.qkv_bias),
            ] {
                tensors.push(Expected::new(
                    at(&format!("self_attn.{proj}.weight")),
                    &[rows, h],
                    ATTENTION,
                ));
                if bias {
                    tensors.push(Expected::new(
                        at(&format!("self_attn.{proj}.bias")),
                        &[rows],
                        ATTENTION,
                    ));
                }
            }
            tensors.push(Expected::new(at("self_attn.o_proj.weight"), &[h, q], ATTENTION));
            if self.o_bias {
                tensors.push(Expected::new(at("self_attn.o_proj.bias"), &[h], ATTENTION));
            }
            if self.model_type == ModelType::Qwen3 {
                for norm in ["q_norm", "k_norm"] {
                    tensors.push(Expected::new(
                        at(&format!("self_attn.{norm}.weight")),
                        &[d],
                        "num_hidden_layers, head_dim",
                    ));
                }
            }
            for (proj, shape) in [
                ("gate_proj", [i, h]),
                ("up_proj", [i, h]),
                ("down_proj", [h, i]),
            ] {
                tensors.push(Expected::new(at(&format!("mlp.{proj}.weight")), &shape, MLP));
                if self.mlp_bias {
                    tensors.push(Expected::new(
                        at(&format!("mlp.{proj}.bias")),
                        &shape[..1],
                        MLP,
                    ));
                }
            }
            // By name, as the store lists them: the first mismatch named is
            // the same whichever way the list was written.
            tensors.sort_by(|a, b| a.name.cmp(&b.name));
            tensors
        });
        let norm = Expected::new(format!("{prefix}.norm.weight"), &[h], "hidden_size");
        let head = (!self.tie_word_embeddings).then(|| {
            Expected::new(
                "lm_head.weight",
                &[self.vocab_size, h],
                "vocab_size, hidden_size, tie_word_embeddings",
            )
        });
        std::iter::once(embed)
            .chain(layers)
            .chain(std::iter::once(norm))
            .chain(head)
    }

    /// The rotary inverse frequencies, `[head_dim / 2]` f32, computed with
    /// the same f32 operations as transformers.
    pub fn inv_freq(&self) -> tch::Tensor {
        let d = self.head_dim;
        let exponent =
            tch::Tensor::arange_start_step(0, d, 2, (tch::Kind::Int64, tch::Device::Cpu))
                .to_kind(tch::Kind::Float)
                / d as f64;
        let inv_freq = scalar(self.rope_theta).pow(&exponent).reciprocal();
        match self.rope_scaling {
            RopeScaling::None => inv_freq,
            RopeScaling::Linear { factor } => inv_freq / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let wavelen = scalar(2.0 * std::f64::consts::PI) / &inv_freq;
                let divided = &inv_freq / factor;
                let llama = divided.where_self(&wavelen.gt(low_wavelen), &inv_freq);
                let smooth = ((scalar(old) / &wavelen) - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed = (1.0f64 - &smooth) * &llama / factor + &smooth * &llama;
                let medium = wavelen
                    .ge(high_wavelen)
                    .logical_and(&wavelen.le(low_wavelen));
                smoothed.where_self(&medium, &llama)
            }
        }
    }
}

/// A 0-d f32 tensor: transformers' Python scalars meet f32 tensors as f32.
fn scalar(value: f64) -> tch::Tensor {
    tch::Tensor::from(value as f32)
}

/// `rope_theta` and the scaling from either layout.
fn rope(raw: &RawConfig, file: &Path) -> Result<(f64, RopeScaling), HfError> {
    let bad = |reason: String| HfError::BadConfig {
        file: file.to_path_buf(),
        reason,
    };
    let (key, params) = match (&raw.rope_parameters, &raw.rope_scaling) {
        (Some(p), _) => ("rope_parameters", p.clone()),
        (None, Some(s)) => ("rope_scaling", s.clone()),
        (None, None) => ("rope_parameters", Map::new()),
    };
    let number = |name: &str| -> Result<Option<f64>, HfError> {
        match params.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(format!("`{key}.{name}` is {v}, expected a number"))),
        }
    };
    let theta = number("rope_theta")?.or(raw.rope_theta).unwrap_or(10_000.0);
    let partial = number("partial_rotary_factor")?.or(raw.partial_rotary_factor);
    if partial.is_some_and(|p| p != 1.0) {
        return Err(bad(format!(
            "`partial_rotary_factor` is {}; partial rotary embeddings are not supported",
            partial.unwrap_or(1.0)
        )));
    }
    let kind = match params.get("rope_type").or_else(|| params.get("type")) {
        None | Some(Value::Null) => "default".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(bad(format!("`{key}.rope_type` is {v}, expected a string"))),
    };
    let required = |name: &str| -> Result<f64, HfError> {
        number(name)?.ok_or_else(|| bad(format!("`{key}` of type {kind:?} lacks `{name}`")))
    };
    let scaling = match kind.as_str() {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: required("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: required("factor")?,
            low_freq_factor: required("low_freq_factor")?,
            high_freq_factor: required("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")?
                .unwrap_or(raw.max_position_embeddings as f64),
        },
        _ => {
            return Err(HfError::UnsupportedRope {
                file: file.to_path_buf(),
                key: key.to_string(),
                found: kind,
            });
        }
    };
    Ok((theta, scaling))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HfConfig, HfError> {
        HfConfig::parse(text, Path::new("m/config.json"))
    }

    const QWEN3: &str = r#"{"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "max_position_embeddings": 32"#;

    #[test]
    fn defaults_follow_the_config_classes() {
        let c = parse(&format!("{QWEN3}}}")).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim), (2, 128));
        assert_eq!((c.rope_theta, c.rms_norm_eps), (10_000.0, 1e-6));
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.o_bias);
        let q2 = parse(&format!("{}}}", QWEN3.replace("qwen3", "qwen2"))).unwrap();
        assert_eq!(q2.head_dim, 4);
        assert!(q2.qkv_bias && !q2.o_bias);
    }

    #[test]
    fn older_layout_rope_scaling_with_type_key() {
        let c = parse(&format!(
            r#"{QWEN3}, "rope_theta": 500.0, "rope_scaling": {{"type": "linear", "factor": 4.0}}}}"#
        ))
        .unwrap();
        assert_eq!(c.rope_theta, 500.0);
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        // head_dim 128, theta 500, linear 4: inv_freq[1] = 500^(-2/128) / 4.
        let f = c.inv_freq();
        assert_eq!(f.size(), [64]);
        let expected = 500f64.powf(-2.0 / 128.0) / 4.0;
        assert!((f.double_value(&[1]) - expected).abs() < 1e-7);
    }

    #[test]
    fn llama3_scaling_by_wavelength() {
        // head_dim 8, theta 100: inv_freq 1, 0.3162, 0.1, 0.03162; wavelengths
        // 6.28 (< 32/4: kept), 19.87 (smoothed), 62.8 and 198.7 (> 32: / 8).
        let c = parse(&format!(
            r#"{}, "head_dim": 8, "rope_parameters": {{"rope_type": "llama3", "rope_theta": 100.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}}}}"#,
            QWEN3.replace("qwen3", "llama")
        ))
        .unwrap();
        let f = c.inv_freq();
        let inv1 = 100f64.powf(-0.25);
        let s = (32.0 * inv1 / (2.0 * std::f64::consts::PI) - 1.0) / 3.0;
        let expected = [
            1.0,
            (1.0 - s) * inv1 / 8.0 + s * inv1,
            0.1 / 8.0,
            100f64.powf(-0.75) / 8.0,
        ];
        for (i, e) in expected.iter().enumerate() {
            assert!(
                (f.double_value(&[i as i64]) - e).abs() < 1e-6,
                "{i}: {} vs {e}",
                f.double_value(&[i as i64])
            );
        }
    }

    #[test]
    fn unsupported_architecture_names_file_and_value() {
        let err = parse(r#"{"model_type": "gpt2"}"#).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, HfError::UnsupportedArchitecture { .. }));
        assert!(
            text.contains("m/config.json")
                && text.contains("gpt2")
                && text.contains("qwen2, qwen3, llama"),
            "{text}"
        );
    }

    #[test]
    fn unsupported_rope_type_and_bad_keys_are_named() {
        let err = parse(&format!(
            r#"{QWEN3}, "rope_scaling": {{"rope_type": "yarn", "factor": 4.0}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("rope_scaling") && err.to_string().contains("yarn"),
            "{err}"
        );
        let err = parse(&format!(r#"{QWEN3}, "num_key_value_heads": 3}}"#)).unwrap_err();
        assert!(err.to_string().contains("num_key_value_heads"), "{err}");
        let err = parse(r#"{"model_type": "llama", "vocab_size": 4}"#).unwrap_err();
        assert!(err.to_string().contains("hidden_size"), "{err}");
        let err = parse(&format!(r#"{QWEN3}, "hidden_act": "gelu"}}"#)).unwrap_err();
        assert!(err.to_string().contains("hidden_act"), "{err}");
    }
}
