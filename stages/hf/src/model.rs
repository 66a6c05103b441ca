//! The decoder of transformers' `Qwen2ForCausalLM`, `Qwen3ForCausalLM` and
//! `LlamaForCausalLM`, case by case as `modeling_qwen2.py`,
//! `modeling_qwen3.py` and `modeling_llama.py` compute it:
//!
//! ```text
//! h_0 = embed_tokens[ids]
//! a   = h + o_proj(attn(input_layernorm(h)))            per layer
//! h'  = a + down_proj(silu(gate_proj(n)) ⊙ up_proj(n)),  n = post_attention_layernorm(a)
//! logits = lm_head(norm(h_L))                             (lm_head = embed_tokens when tied)
//!
//! rms(x) = w ⊙ cast(x / sqrt(mean(x²) + eps))            x in f32, cast back to the model dtype
//! attn:  q, k, v = q_proj(x), k_proj(x), v_proj(x) per head (Qwen3: q = rms_q(q), k = rms_k(k) per head)
//!        q, k = q cos(pθ) + rotate_half(q) sin(pθ), …    θ = config.inv_freq(), rotate_half(x) = [-x₂, x₁]
//!        softmax(q kᵀ / √head_dim + M) v                 k, v repeated to every query head (GQA)
//! ```
//!
//! `M` is 0 where a key is at or before its query and not padding, and the
//! dtype's most negative finite value elsewhere (as transformers' masks), so
//! a padding row's attention is uniform instead of NaN. Positions `p` come
//! from the attention mask as `generate` computes them for left padding:
//! `cumsum(mask) - 1`, 0 at padding; a left-padded row thus has the logits
//! it has unpadded. Softmax runs in f32 inside libtorch's attention kernel
//! for bf16 inputs.
//!
//! Parameters live in a [`tch::nn::VarStore`] under transformers' names
//! (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`,
//! …, `model.norm.weight`, `lm_head.weight` when untied), so training is an
//! optimizer over [`HfDecoder::var_store`] and [`HfDecoder::save`] writes
//! what `AutoModelForCausalLM.from_pretrained` reads.
//!
//! ```no_run
//! use embodyflow_hf::{HfDecoder, KvCache};
//! use tch::Tensor;
//! let model = HfDecoder::load("Qwen2.5-0.5B".as_ref(), tch::Device::Cpu).unwrap();
//! let ids = Tensor::from_slice(&[0i64, 0, 7, 8, 9, 10]).view([2, 3]);
//! let mut mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1]).view([2, 3]);
//! // Incremental decoding: the prompt once, then one token at a time.
//! let mut cache = KvCache::default();
//! let logits = model.forward_cached(&ids, &mask, &mut cache).unwrap();
//! let next = logits.select(1, -1).argmax(-1, true);
//! mask = Tensor::cat(&[mask, Tensor::ones([2, 1], (tch::Kind::Int64, tch::Device::Cpu))], 1);
//! let logits = model.forward_cached(&next, &mask, &mut cache).unwrap(); // [2, 1, vocab]
//! ```

use std::path::Path;

use serde_json::Value;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use crate::HfError;
use crate::checkpointing::{self, Shallow};
use crate::config::{HfConfig, ModelType};
use crate::safetensors::{self, Weights};

/// Keys and values of the positions run so far, per layer, for decoding one
/// token at a time; empty before the first call.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
}

impl KvCache {
    /// Positions cached (0 when empty).
    pub fn len(&self) -> i64 {
        self.layers.first().map_or(0, |(k, _)| k.size()[2])
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the cached rows `rows` (a 1-D i64 tensor of row indices, in
    /// that order; an index may repeat, copying its row).
    pub fn keep_rows(&mut self, rows: &Tensor) {
        for (keys, values) in &mut self.layers {
            *keys = keys.index_select(0, rows);
            *values = values.index_select(0, rows);
        }
    }
}

#[derive(Debug)]
struct Layer {
    input_layernorm: Tensor,
    post_attention_layernorm: Tensor,
    q_proj: nn::Linear,
    k_proj: nn::Linear,
    v_proj: nn::Linear,
    o_proj: nn::Linear,
    /// Qwen3's per-head norms.
    q_k_norm: Option<(Tensor, Tensor)>,
    gate_proj: nn::Linear,
    up_proj: nn::Linear,
    down_proj: nn::Linear,
}

/// Zero-initialised: every parameter is then loaded from the checkpoint.
pub(crate) fn linear(path: nn::Path, input: i64, output: i64, bias: bool) -> nn::Linear {
    let config = nn::LinearConfig {
        ws_init: nn::Init::Const(0.0),
        bs_init: Some(nn::Init::Const(0.0)),
        bias,
    };
    nn::linear(path, input, output, config)
}

pub(crate) fn norm_weight(path: nn::Path, dim: i64) -> Tensor {
    path.var("weight", &[dim], nn::Init::Const(1.0))
}

/// transformers' `RMSNorm`: in f32, cast back before the weight.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let h = x.to_kind(Kind::Float);
    let variance = h.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
    let h = h * (variance + eps).rsqrt();
    weight * h.to_kind(x.kind())
}

pub(crate) fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[x2.neg(), x1], -1)
}

/// `[B, KV, S, D]` → `[B, KV * n_rep, S, D]`, each key/value head repeated
/// for its group of query heads.
fn repeat_kv(x: &Tensor, n_rep: i64) -> Tensor {
    if n_rep == 1 {
        return x.shallow_clone();
    }
    let (b, kv, s, d) = x.size4().unwrap_or_default();
    x.unsqueeze(2)
        .expand([b, kv, n_rep, s, d], false)
        .reshape([b, kv * n_rep, s, d])
}

/// The most negative finite value of `kind` (transformers' `finfo.min`).
fn min_value(kind: Kind) -> f64 {
    match kind {
        Kind::BFloat16 => -3.3895313892515355e38,
        Kind::Half => -65504.0,
        Kind::Double => f64::MIN,
        _ => f32::MIN as f64,
    }
}

/// generate's position ids of a key mask `[B, S]` (bool): `cumsum - 1`,
/// 0 at padding.
pub(crate) fn mask_positions(keys: &Tensor) -> Tensor {
    (keys.to_kind(Kind::Int64).cumsum(-1, Kind::Int64) - 1).masked_fill(&keys.logical_not(), 0)
}

/// The positions whose logits a forward computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Positions {
    /// Every position of the input.
    All,
    /// The last one (decoding).
    Last,
}

/// Greedy decoding as transformers' `generate(do_sample=False)` over
/// `step(input_ids, attention_mask)`, which runs the prompt first and then
/// one token at a time, continuing its own cache: the argmax token each
/// step, at most `max_new_tokens`; once a row has produced `eos` it
/// continues with `pad`, and decoding stops when every row has. Returns the
/// new tokens `[B, n]`, `n <= max_new_tokens`.
pub(crate) fn greedy_loop(
    input_ids: &Tensor,
    attention_mask: &Tensor,
    device: Device,
    max_new_tokens: i64,
    eos: Option<i64>,
    pad: i64,
    step: &mut dyn FnMut(&Tensor, &Tensor) -> Result<Tensor, HfError>,
) -> Result<Tensor, HfError> {
    let _guard = tch::no_grad_guard();
    let b = input_ids.size().first().copied().unwrap_or(0);
    let mut mask = attention_mask.to_device(device).to_kind(Kind::Int64);
    let mut input = input_ids.shallow_clone();
    let mut finished = Tensor::zeros([b], (Kind::Bool, device));
    let mut tokens = Vec::new();
    for n in 0..max_new_tokens {
        if n > 0 {
            mask = Tensor::cat(&[&mask, &Tensor::ones([b, 1], (Kind::Int64, device))], 1);
        }
        let logits = step(&input, &mask)?;
        let mut next = logits.select(1, -1).argmax(-1, false);
        if let Some(eos) = eos {
            next = next.masked_fill(&finished, pad);
            finished = finished.logical_or(&next.eq(eos));
        }
        input = next.unsqueeze(1);
        tokens.push(input.shallow_clone());
        if finished.all().int64_value(&[]) != 0 {
            break;
        }
    }
    Ok(if tokens.is_empty() {
        Tensor::zeros([b, 0], (Kind::Int64, device))
    } else {
        Tensor::cat(&tokens, 1)
    })
}

impl Shallow for Layer {
    fn shallow(&self) -> Self {
        Layer {
            input_layernorm: self.input_layernorm.shallow(),
            post_attention_layernorm: self.post_attention_layernorm.shallow(),
            q_proj: self.q_proj.shallow(),
            k_proj: self.k_proj.shallow(),
            v_proj: self.v_proj.shallow(),
            o_proj: self.o_proj.shallow(),
            q_k_norm: self.q_k_norm.shallow(),
            gate_proj: self.gate_proj.shallow(),
            up_proj: self.up_proj.shallow(),
            down_proj: self.down_proj.shallow(),
        }
    }
}

/// Features added at some positions after the first decoder layers
/// (Qwen3-VL's DeepStack): `mask` `[B, T, 1]` (bool) marks the positions,
/// `features[i]` `[positions, hidden]` is added after layer `i`.
pub(crate) struct Added<'a> {
    pub(crate) mask: &'a Tensor,
    pub(crate) features: &'a [Tensor],
}

/// `h` with `feature` `[positions, hidden]` added where `mask` `[B, T, 1]` is set.
fn add_at(h: Tensor, mask: &Tensor, feature: &Tensor) -> Tensor {
    let width = h.size()[2];
    let at = h.masked_select(mask).view([-1, width]);
    let added = at + feature.to_kind(h.kind());
    h.masked_scatter(mask, &added)
}

impl Layer {
    fn new(path: &nn::Path, c: &HfConfig) -> Layer {
        let attn = path / "self_attn";
        let mlp = path / "mlp";
        let (h, d) = (c.hidden_size, c.head_dim);
        let q_k_norm = (c.model_type == ModelType::Qwen3).then(|| {
            (
                norm_weight(&attn / "q_norm", d),
                norm_weight(&attn / "k_norm", d),
            )
        });
        Layer {
            input_layernorm: norm_weight(path / "input_layernorm", h),
            post_attention_layernorm: norm_weight(path / "post_attention_layernorm", h),
            q_proj: linear(&attn / "q_proj", h, c.num_attention_heads * d, c.qkv_bias),
            k_proj: linear(&attn / "k_proj", h, c.num_key_value_heads * d, c.qkv_bias),
            v_proj: linear(&attn / "v_proj", h, c.num_key_value_heads * d, c.qkv_bias),
            o_proj: linear(&attn / "o_proj", c.num_attention_heads * d, h, c.o_bias),
            q_k_norm,
            gate_proj: linear(&mlp / "gate_proj", h, c.intermediate_size, c.mlp_bias),
            up_proj: linear(&mlp / "up_proj", h, c.intermediate_size, c.mlp_bias),
            down_proj: linear(&mlp / "down_proj", c.intermediate_size, h, c.mlp_bias),
        }
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: &(Tensor, Tensor),
        mask: &Tensor,
        cache: Option<&mut (Tensor, Tensor)>,
        c: &HfConfig,
    ) -> (Tensor, Option<(Tensor, Tensor)>) {
        let (b, t, _) = x.size3().unwrap_or_default();
        let n = rms_norm(x, &self.input_layernorm, c.rms_norm_eps);
        let heads = |y: Tensor| y.view([b, t, -1, c.head_dim]);
        let (mut q, mut k) = (
            heads(self.q_proj.forward(&n)),
            heads(self.k_proj.forward(&n)),
        );
        if let Some((q_norm, k_norm)) = &self.q_k_norm {
            q = rms_norm(&q, q_norm, c.rms_norm_eps);
            k = rms_norm(&k, k_norm, c.rms_norm_eps);
        }
        let v = heads(self.v_proj.forward(&n)).transpose(1, 2);
        let (cos, sin) = rope;
        let q = q.transpose(1, 2);
        let k = k.transpose(1, 2);
        let q = &q * cos + rotate_half(&q) * sin;
        let mut k = &k * cos + rotate_half(&k) * sin;
        let mut v = v;
        let mut new_entry = None;
        match cache {
            Some((past_k, past_v)) => {
                k = Tensor::cat(&[&*past_k, &k], 2);
                v = Tensor::cat(&[&*past_v, &v], 2);
                *past_k = k.shallow_clone();
                *past_v = v.shallow_clone();
            }
            None => new_entry = Some((k.shallow_clone(), v.shallow_clone())),
        }
        let n_rep = c.num_attention_heads / c.num_key_value_heads;
        let y = Tensor::scaled_dot_product_attention(
            &q,
            &repeat_kv(&k, n_rep),
            &repeat_kv(&v, n_rep),
            Some(mask),
            0.0,
            false,
            (c.head_dim as f64).powf(-0.5),
            false,
        );
        let a = x + self.o_proj.forward(&y.transpose(1, 2).reshape([b, t, -1]));
        let n = rms_norm(&a, &self.post_attention_layernorm, c.rms_norm_eps);
        let mlp = self
            .down_proj
            .forward(&(self.gate_proj.forward(&n).silu() * self.up_proj.forward(&n)));
        (a + mlp, new_entry)
    }
}

/// The network of a Hugging Face decoder: its config and its parameters
/// (tensors of a [`nn::VarStore`] its owner keeps), and how to run them.
/// [`HfDecoder`] owns one with its store; a policy checkpoint
/// (`embodyflow_models`) keeps the store beside it.
#[derive(Debug)]
pub struct HfNet {
    config: HfConfig,
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<nn::Linear>,
    /// `[head_dim / 2]` f32 on the model's device.
    inv_freq: Tensor,
}

/// A Hugging Face decoder: its network and the store of its parameters.
#[derive(Debug)]
pub struct HfDecoder {
    vs: nn::VarStore,
    net: HfNet,
}

impl HfDecoder {
    /// Loads `dir/config.json` and its weights onto `device`, in the dtype
    /// the checkpoint stores `model.embed_tokens.weight` in (F32 or BF16;
    /// other tensors are cast to it). Every parameter the config implies must
    /// be present with its shape, which is checked on the files' headers
    /// before any parameter is allocated ([`HfNet::open_weights`]); tensors
    /// it does not imply are ignored, as transformers ignores them.
    pub fn load(dir: &Path, device: Device) -> Result<HfDecoder, HfError> {
        let config = HfConfig::from_file(&dir.join("config.json"))?;
        let weights = HfNet::open_weights(dir, &config)?;
        let mut vs = nn::VarStore::new(device);
        let net = HfNet::new(&vs.root(), config);
        net.load_weights(&mut vs, &weights)?;
        Ok(HfDecoder { vs, net })
    }

    /// The network.
    pub fn net(&self) -> &HfNet {
        &self.net
    }

    /// The parameters, named as transformers names them (for an optimizer).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// The resolved config.
    pub fn config(&self) -> &HfConfig {
        self.net.config()
    }

    /// The parameters' dtype (`Float` or `BFloat16`).
    pub fn kind(&self) -> Kind {
        self.net.kind()
    }

    /// Logits `[B, T, vocab]` (in the model's dtype) of `input_ids` `[B, T]`
    /// (i64) under `attention_mask` `[B, T]` (1 = token, 0 = padding, any
    /// integer or bool kind), with gradients when they are enabled.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor, HfError> {
        self.net.forward(input_ids, attention_mask)
    }

    /// As [`HfDecoder::forward`], continuing `cache` ([`HfNet::forward_cached`]).
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor, HfError> {
        self.net.forward_cached(input_ids, attention_mask, cache)
    }

    /// Greedy decoding ([`HfNet::greedy`]).
    pub fn greedy(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        max_new_tokens: i64,
        eos: Option<i64>,
        pad: i64,
    ) -> Result<Tensor, HfError> {
        self.net
            .greedy(input_ids, attention_mask, max_new_tokens, eos, pad)
    }

    /// Writes `dir/config.json` and `dir/model.safetensors`
    /// ([`HfNet::save`]), creating `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), HfError> {
        self.net.save(&self.vs, dir)
    }
}

impl HfNet {
    /// The parameters of `config` under `root` (transformers' names:
    /// `model.…` and `lm_head.weight` when untied), zero-initialised:
    /// [`HfNet::load_weights`] fills them.
    pub fn new(root: &nn::Path, config: HfConfig) -> HfNet {
        HfNet::new_at(&(root / "model"), &(root / "lm_head"), config)
    }

    /// As [`HfNet::new`], the decoder's parameters under `model` and the
    /// untied head under `head` (a vision-language model keeps its decoder
    /// under `model.language_model`; [`HfConfig::tensors_at`] lists them).
    pub fn new_at(model: &nn::Path, head: &nn::Path, config: HfConfig) -> HfNet {
        let c = &config;
        let embed_tokens = (model / "embed_tokens").var(
            "weight",
            &[c.vocab_size, c.hidden_size],
            nn::Init::Const(0.0),
        );
        let layers = (0..c.num_hidden_layers)
            .map(|i| Layer::new(&(model / "layers" / i), c))
            .collect();
        let norm = norm_weight(model / "norm", c.hidden_size);
        let lm_head = (!c.tie_word_embeddings)
            .then(|| linear(head.clone(), c.hidden_size, c.vocab_size, false));
        let inv_freq = c.inv_freq().to_device(model.device());
        HfNet {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            inv_freq,
        }
    }

    /// The weights of model directory `dir` ([`Weights::open`]), checked
    /// against every parameter `config` implies ([`HfConfig::tensors`]) on
    /// the files' headers alone: a config whose sizes the weights do not
    /// hold (a vocabulary of 2^40, 10^9 layers) is an error naming the
    /// tensor, the file and the keys before anything is allocated.
    pub fn open_weights(dir: &Path, config: &HfConfig) -> Result<Weights, HfError> {
        let weights = Weights::open(dir)?;
        weights.check(config.tensors())?;
        Ok(weights)
    }

    /// Fills the parameters in `vs` (the store this network was built in)
    /// from `weights` ([`HfNet::open_weights`]), first setting the store to
    /// the dtype `model.embed_tokens.weight` is stored in (F32 or BF16;
    /// other tensors are cast to it).
    pub fn load_weights(&self, vs: &mut nn::VarStore, weights: &Weights) -> Result<(), HfError> {
        vs.set_kind(weights.kind("model.embed_tokens.weight")?);
        weights.fill(vs, self.config.tensors())
    }

    /// The resolved config.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The parameters' dtype (`Float` or `BFloat16`).
    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
    }

    /// The device the parameters are on.
    pub fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    /// Logits `[B, T, vocab]` (in the model's dtype) of `input_ids` `[B, T]`
    /// (i64) under `attention_mask` `[B, T]` (1 = token, 0 = padding, any
    /// integer or bool kind), with gradients when they are enabled.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor, HfError> {
        self.run(input_ids, attention_mask, None, Positions::All)
    }

    /// As [`HfNet::forward`], continuing `cache`: `attention_mask` covers
    /// the cached positions and then `input_ids` (`[B, cache.len() + T]`);
    /// the new keys and values are appended to `cache`.
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor, HfError> {
        self.run(input_ids, attention_mask, Some(cache), Positions::All)
    }

    /// As [`HfNet::forward_cached`], the logits `[B, 1, vocab]` of the last
    /// position only, as transformers' `generate` computes them
    /// (`logits_to_keep = 1`): decoding needs no others, and on a long
    /// prompt the output projection of every position is a large share of
    /// the prefill.
    pub fn forward_cached_last(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor, HfError> {
        self.run(input_ids, attention_mask, Some(cache), Positions::Last)
    }

    fn run(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: Option<&mut KvCache>,
        logits_at: Positions,
    ) -> Result<Tensor, HfError> {
        let past = cache.as_ref().map_or(0, |c| c.len());
        let (ids, keys) = self.check_batch(input_ids, attention_mask, past)?;
        let t = ids.size()[1];
        // generate's position ids: cumsum(mask) - 1, 0 at padding.
        let positions = mask_positions(&keys).narrow(1, past, t);
        let freqs = positions.unsqueeze(-1).to_kind(Kind::Float) * &self.inv_freq;
        let rope = self.rope(&freqs);
        let h = self.embed(&ids);
        Ok(self.decode(h, &rope, &keys, cache, None, logits_at))
    }

    /// The rotary `(cos, sin)` `[B, 1, T, head_dim]` in the model's dtype
    /// of the angles `freqs` `[B, T, head_dim / 2]` (f32), as transformers'
    /// rotary embedding returns them.
    pub(crate) fn rope(&self, freqs: &Tensor) -> (Tensor, Tensor) {
        let kind = self.kind();
        let emb = Tensor::cat(&[freqs, freqs], -1);
        (
            emb.cos().to_kind(kind).unsqueeze(1),
            emb.sin().to_kind(kind).unsqueeze(1),
        )
    }

    /// The rotary inverse frequencies `[head_dim / 2]` (f32, on the model's
    /// device).
    pub(crate) fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// The token embeddings `[B, T, hidden]` of checked ids.
    pub(crate) fn embed(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, ids, -1, false, false)
    }

    /// Logits of the embeddings `h` `[B, T, hidden]` under the rotary
    /// `rope` ([`HfNet::rope`]) and the key mask `keys` `[B, past + T]`
    /// (bool), continuing `cache`, at `logits_at`; `added` is added after
    /// the first layers (Qwen3-VL's DeepStack features).
    pub(crate) fn decode(
        &self,
        h: Tensor,
        rope: &(Tensor, Tensor),
        keys: &Tensor,
        cache: Option<&mut KvCache>,
        added: Option<Added<'_>>,
        logits_at: Positions,
    ) -> Tensor {
        let device = self.device();
        let t = h.size()[1];
        let s = keys.size()[1];
        let past = s - t;
        let key_index = Tensor::arange(s, (Kind::Int64, device));
        let query_index = Tensor::arange_start(past, s, (Kind::Int64, device));
        let causal = key_index.unsqueeze(0).le_tensor(&query_index.unsqueeze(1));
        let allowed = causal.unsqueeze(0).logical_and(&keys.unsqueeze(1));
        let hidden = self.hidden(h, rope, &allowed, cache, added);
        match logits_at {
            Positions::All => self.head(&hidden),
            Positions::Last => self.head(&hidden.narrow(1, t - 1, 1)),
        }
    }

    /// The final hidden states (after the last norm) `[B, T, hidden]` of
    /// the embeddings `h` under the rotary `rope`, each query attending to
    /// the keys `allowed` `[B or 1, T, past + T]` (bool: query, key) sets,
    /// continuing `cache`; `added` as [`HfNet::decode`]'s. A query
    /// allowed no key attends uniformly (the mask holds the dtype's most
    /// negative value, not `-inf`). Without a cache, each layer is a block
    /// of a [`checkpointing::run`] (recomputed in the backward when
    /// checkpointing is on).
    pub(crate) fn hidden(
        &self,
        h: Tensor,
        rope: &(Tensor, Tensor),
        allowed: &Tensor,
        cache: Option<&mut KvCache>,
        added: Option<Added<'_>>,
    ) -> Tensor {
        let kind = self.kind();
        let (b, t, _) = h.size3().unwrap_or_default();
        let s = allowed.size()[2];
        let mask = Tensor::zeros([b, 1, t, s], (kind, self.device()))
            .masked_fill(&allowed.logical_not().unsqueeze(1), min_value(kind));
        let h = match cache {
            Some(cache) => {
                let mut h = h;
                for (i, layer) in self.layers.iter().enumerate() {
                    let entry = cache.layers.get_mut(i);
                    let (next, new_entry) = layer.forward(&h, rope, &mask, entry, &self.config);
                    if let Some(e) = new_entry {
                        cache.layers.push(e);
                    }
                    h = match &added {
                        Some(a) if i < a.features.len() => add_at(next, a.mask, &a.features[i]),
                        _ => next,
                    };
                }
                h
            }
            None => {
                let features: Vec<&Tensor> = added
                    .as_ref()
                    .map_or(vec![], |a| a.features.iter().collect());
                let image_mask = added.as_ref().map(|a| a.mask.shallow_clone());
                let config = std::rc::Rc::new(self.config.clone());
                let trains = self.layers.iter().any(|l| l.q_proj.ws.requires_grad());
                checkpointing::run(h, &features, trains, |features| {
                    self.layers
                        .iter()
                        .enumerate()
                        .map(|(i, layer)| {
                            let layer = layer.shallow();
                            let (rope, mask, config) =
                                (rope.shallow(), mask.shallow(), config.clone());
                            let added = image_mask
                                .shallow()
                                .zip(features.get(i).map(Tensor::shallow_clone));
                            Box::new(move |x: &Tensor| {
                                let (y, _) = layer.forward(x, &rope, &mask, None, &config);
                                match &added {
                                    Some((at, feature)) => add_at(y, at, feature),
                                    None => y,
                                }
                            }) as checkpointing::Block
                        })
                        .collect()
                })
            }
        };
        rms_norm(&h, &self.norm, self.config.rms_norm_eps)
    }

    /// The output embedding `[vocab, hidden]`: `lm_head.weight`, or the
    /// token embedding when tied. Row `i` times a final hidden state is
    /// token `i`'s logit.
    pub fn output_embedding(&self) -> &Tensor {
        match &self.lm_head {
            Some(head) => &head.ws,
            None => &self.embed_tokens,
        }
    }

    /// Logits `[B, T, vocab]` of final hidden states `[B, T, hidden]`.
    pub fn head(&self, h: &Tensor) -> Tensor {
        h.linear::<Tensor>(self.output_embedding(), None)
    }

    /// The ids on the model's device and the mask as bool, after checking
    /// shapes, kinds and ranges.
    pub(crate) fn check_batch(
        &self,
        ids: &Tensor,
        mask: &Tensor,
        past: i64,
    ) -> Result<(Tensor, Tensor), HfError> {
        let bad = |reason: String| Err(HfError::BadBatch(reason));
        if ids.dim() != 2 || ids.kind() != Kind::Int64 {
            return bad(format!(
                "input_ids must be [B, T] i64, got {:?} {:?}",
                ids.size(),
                ids.kind()
            ));
        }
        let (b, t) = ids.size2().unwrap_or_default();
        if t == 0 {
            return bad("input_ids has no positions".into());
        }
        if mask.size() != [b, past + t] {
            return bad(format!(
                "attention_mask has shape {:?}, expected [{b}, {}] ({past} cached + {t} new)",
                mask.size(),
                past + t
            ));
        }
        let device = self.device();
        let ids = ids.to_device(device);
        let mask = mask.to_device(device);
        let (lo, hi) = (ids.min().int64_value(&[]), ids.max().int64_value(&[]));
        if lo < 0 || hi >= self.config.vocab_size {
            return bad(format!(
                "token ids span [{lo}, {hi}], the vocabulary is [0, {})",
                self.config.vocab_size
            ));
        }
        let keys = mask.ne(0);
        if keys.logical_xor(&mask.eq(1)).any().int64_value(&[]) != 0 {
            return bad("attention_mask holds values other than 0 and 1".into());
        }
        Ok((ids, keys))
    }

    /// Greedy decoding as transformers' `generate(do_sample=False)`: the
    /// argmax token each step, at most `max_new_tokens`; once a row has
    /// produced `eos` it continues with `pad`, and decoding stops when every
    /// row has. Returns the new tokens `[B, n]`, `n <= max_new_tokens`.
    pub fn greedy(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        max_new_tokens: i64,
        eos: Option<i64>,
        pad: i64,
    ) -> Result<Tensor, HfError> {
        let mut cache = KvCache::default();
        greedy_loop(
            input_ids,
            attention_mask,
            self.device(),
            max_new_tokens,
            eos,
            pad,
            &mut |input, mask| self.forward_cached_last(input, mask, &mut cache),
        )
    }

    /// `config.json` as saved: the config as read, `dtype` (and
    /// `torch_dtype` when present) set to the parameters' dtype.
    pub fn config_json(&self) -> Value {
        config_with_dtype(&self.config.source, self.kind())
    }

    /// Writes every parameter of `vs` (the store an [`HfNet`] was built
    /// in) under its transformers name to the safetensors file `path`.
    pub fn write_weights(vs: &nn::VarStore, path: &Path) -> Result<(), HfError> {
        let mut tensors: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let tensors: Vec<(String, Tensor)> =
            tensors.into_iter().map(|(n, t)| (n, t.detach())).collect();
        safetensors::write(path, &tensors)
    }

    /// Writes `dir/config.json` ([`HfNet::config_json`]) and
    /// `dir/model.safetensors` ([`HfNet::write_weights`]), creating `dir`.
    pub fn save(&self, vs: &nn::VarStore, dir: &Path) -> Result<(), HfError> {
        save_checkpoint(vs, dir, &self.config_json())
    }
}

/// `config` with `dtype` (and `torch_dtype` when present) set to `kind`'s
/// name (`bfloat16` or `float32`).
pub(crate) fn config_with_dtype(config: &serde_json::Map<String, Value>, kind: Kind) -> Value {
    let mut config = config.clone();
    let dtype = match kind {
        Kind::BFloat16 => "bfloat16",
        _ => "float32",
    };
    config.insert("dtype".into(), Value::from(dtype));
    if config.contains_key("torch_dtype") {
        config.insert("torch_dtype".into(), Value::from(dtype));
    }
    Value::Object(config)
}

/// Writes `dir/config.json` (`config`, through a temporary file) and
/// `dir/model.safetensors` (every variable of `vs`), creating `dir`.
pub(crate) fn save_checkpoint(
    vs: &nn::VarStore,
    dir: &Path,
    config: &Value,
) -> Result<(), HfError> {
    let write = |file: &Path, source: std::io::Error| HfError::Write {
        file: file.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| write(dir, e))?;
    let file = dir.join("config.json");
    let text = serde_json::to_string_pretty(config).map_err(|e| write(&file, e.into()))?;
    let tmp = dir.join("config.json.tmp");
    std::fs::write(&tmp, text + "\n").map_err(|e| write(&tmp, e))?;
    std::fs::rename(&tmp, &file).map_err(|e| write(&file, e))?;
    HfNet::write_weights(vs, &dir.join(safetensors::SINGLE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_tensors_are_the_variables;

    /// The tensor list the weights are checked against before allocation
    /// is the network `HfNet::new` builds, for every architecture and
    /// option that changes the parameters.
    #[test]
    fn the_config_lists_exactly_the_networks_parameters() {
        let base = r#""vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 32"#;
        for extra in [
            r#""model_type": "qwen2""#,
            r#""model_type": "qwen3", "head_dim": 6, "tie_word_embeddings": true"#,
            r#""model_type": "qwen3", "attention_bias": true"#,
            r#""model_type": "llama", "attention_bias": true, "mlp_bias": true"#,
            r#""model_type": "llama", "tie_word_embeddings": true"#,
        ] {
            let text = format!("{{{base}, {extra}}}");
            let config = HfConfig::parse(&text, Path::new("config.json")).unwrap();
            let vs = nn::VarStore::new(Device::Cpu);
            let _net = HfNet::new(&vs.root(), config.clone());
            assert_tensors_are_the_variables(&vs, config.tensors());
        }
    }

    /// Peak resident memory of one training step (forward and backward) of
    /// a 12-layer decoder (hidden 256) on 4 × 1024 tokens, plainly or with
    /// `EMBODYFLOW_CHECKPOINTING=1` per layer: run each in its own process
    /// (`docs/src/benchmarks.md`).
    #[test]
    #[ignore = "a measurement: run with --ignored --nocapture, one process per setting"]
    fn checkpointing_peak_memory() {
        fn status_kib(key: &str) -> f64 {
            let text = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = text.lines().find(|l| l.starts_with(key)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        }
        let on = std::env::var("EMBODYFLOW_CHECKPOINTING").is_ok_and(|v| v == "1");
        let text = r#"{"model_type": "qwen2", "vocab_size": 512, "hidden_size": 256,
            "intermediate_size": 688, "num_hidden_layers": 12, "num_attention_heads": 8,
            "num_key_value_heads": 4, "max_position_embeddings": 2048}"#;
        let config = HfConfig::parse(text, Path::new("config.json")).unwrap();
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let net = HfNet::new(&vs.root(), config);
        crate::testing::randomize(&vs);
        let ids = Tensor::randint(512, [4, 1024], (Kind::Int64, Device::Cpu));
        let mask = ids.ones_like();
        let before = status_kib("VmRSS:");
        let started = std::time::Instant::now();
        let _switch = crate::checkpointing::enable(on);
        let loss = net
            .forward(&ids, &mask)
            .unwrap()
            .log_softmax(-1, Kind::Float)
            .mean(Kind::Float);
        crate::checkpointing::backward(&loss);
        let peak = status_kib("VmHWM:");
        println!(
            "checkpointing {on}: peak RSS {:.0} MiB above the model's {:.0} MiB, step {:.2} s",
            (peak - before) / 1024.0,
            before / 1024.0,
            started.elapsed().as_secs_f64()
        );
    }

    /// Checkpointed per layer, every parameter's gradient is the plain
    /// backward's, for each architecture, with left padding.
    #[test]
    fn checkpointed_layers_give_the_plain_gradients() {
        let base = r#""vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 32"#;
        for extra in [
            r#""model_type": "qwen2""#,
            r#""model_type": "qwen3", "head_dim": 6, "tie_word_embeddings": true"#,
            r#""model_type": "llama", "attention_bias": true, "mlp_bias": true"#,
        ] {
            let text = format!("{{{base}, {extra}}}");
            let config = HfConfig::parse(&text, Path::new("config.json")).unwrap();
            tch::manual_seed(3);
            let vs = nn::VarStore::new(Device::Cpu);
            let net = HfNet::new(&vs.root(), config);
            crate::testing::randomize(&vs);
            let ids =
                Tensor::from_slice(&[0i64, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]).view([2, 6]);
            let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
            let target = Tensor::randn([2, 6, 40], (Kind::Float, Device::Cpu));
            let loss = || {
                let logp = net
                    .forward(&ids, &mask)
                    .unwrap()
                    .log_softmax(-1, Kind::Float);
                (logp * &target).sum(Kind::Float)
            };
            let diff = crate::testing::checkpointing_gradient_diff(&vs, &loss);
            assert!(diff <= 1e-5, "{extra}: {diff}");
        }
    }
}
