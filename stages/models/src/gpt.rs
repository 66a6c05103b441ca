//! A small decoder-only transformer (GPT-2 shape): token and learned position
//! embeddings, `n_layer` pre-norm blocks `x + attn(ln(x))`, `x + mlp(ln(x))`
//! with causal multi-head self-attention and a GELU MLP of width `4 n_embd`,
//! a final layer norm and an output head tied to the token embedding:
//!
//! ```text
//! logits[b, t, v] = ln_f(h_L)[b, t, :] · wte[v, :]
//! ```
//! Parameters are named by path (`wte`, `wpe`, `h.{i}.attn.c_attn`, …) so a
//! `model.safetensors` written by tch's `VarStore` maps one to one.
//!
//! Three ways to run it, by batch layout:
//! - [`Gpt::hidden_causal`] / [`Gpt::forward`]: every row starts at position
//!   0 and is right-padded; no mask, so SDPA's flash kernel skips the keys
//!   after each query (half the attention of a full mask);
//! - [`Gpt::hidden_masked`]: explicit positions and a mask, optionally with a
//!   decoding [`KvCache`] (left-padded sampling);
//! - [`Gpt::prefix`] then [`Gpt::hidden_after`]: prompts run once, their
//!   keys and values shared by every row that continues them (a group's G
//!   responses), gradients included.
//!
//! A bool mask becomes SDPA's additive float mask once per forward pass, not
//! in every layer.
//!
//! ```
//! use embodyflow_models::gpt::{Gpt, GptConfig};
//! let vs = tch::nn::VarStore::new(tch::Device::Cpu);
//! let config = GptConfig { vocab_size: 16, n_ctx: 8, n_embd: 8, n_head: 2, n_layer: 1 };
//! let model = Gpt::new(&vs.root(), &config);
//! let ids = tch::Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
//! assert_eq!(model.forward(&ids).size(), [1, 3, 16]);
//! ```

use embodyflow_hf::checkpointing::{self, Shallow};
use embodyflow_hf::safetensors::Expected;

use crate::net::{ConfigTag, PolicyKind, PolicyNet, serde_config, tagged_config};
use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

/// Architecture of a [`Gpt`], stored as a checkpoint's `config.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: i64,
    /// Longest sequence (prompt + response) the model attends over.
    pub n_ctx: i64,
    /// Width of the residual stream.
    pub n_embd: i64,
    /// Attention heads (must divide `n_embd`).
    pub n_head: i64,
    /// Transformer blocks.
    pub n_layer: i64,
}

impl GptConfig {
    /// Why this config describes no network, if it does not: every size at
    /// least 1, `n_head` dividing `n_embd`, and the MLP's `4 n_embd` an
    /// i64.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("n_ctx", self.n_ctx),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_layer", self.n_layer),
        ] {
            if value < 1 {
                return Err(format!("{name} must be at least 1, found {value}"));
            }
        }
        if self.n_embd % self.n_head != 0 {
            return Err(format!(
                "n_head {} must divide n_embd {}",
                self.n_head, self.n_embd
            ));
        }
        if self.n_embd.checked_mul(4).is_none() {
            return Err(format!(
                "n_embd {} is too large (4 n_embd overflows)",
                self.n_embd
            ));
        }
        Ok(())
    }

    /// Every parameter [`Gpt::new`] creates, by name and shape, with the
    /// config keys it follows from (`n_ctx_keys` for the position
    /// embedding: a VLA derives `n_ctx` from its own keys). Lazy: checking
    /// a config of 10^9 layers against a file stops at the first layer the
    /// file lacks.
    pub fn tensors(&self, n_ctx_keys: &'static str) -> impl Iterator<Item = Expected> + use<> {
        let e = self.n_embd;
        let head = [
            Expected::new("wte.weight", &[self.vocab_size, e], "vocab_size, n_embd"),
            Expected::new("wpe.weight", &[self.n_ctx, e], n_ctx_keys),
        ];
        let blocks = (0..self.n_layer).flat_map(move |i| {
            const KEYS: &str = "n_layer, n_embd";
            let at = |name: &str| format!("h.{i}.{name}");
            let mut tensors = Vec::with_capacity(12);
            for norm in ["ln_1", "ln_2"] {
                for part in ["weight", "bias"] {
                    tensors.push(Expected::new(at(&format!("{norm}.{part}")), &[e], KEYS));
                }
            }
            for (name, rows, columns) in [
                ("attn.c_attn", 3 * e, e),
                ("attn.c_proj", e, e),
                ("mlp.c_fc", 4 * e, e),
                ("mlp.c_proj", e, 4 * e),
            ] {
                tensors.push(Expected::new(
                    at(&format!("{name}.weight")),
                    &[rows, columns],
                    KEYS,
                ));
                tensors.push(Expected::new(at(&format!("{name}.bias")), &[rows], KEYS));
            }
            tensors
        });
        let ln_f =
            ["weight", "bias"].map(|part| Expected::new(format!("ln_f.{part}"), &[e], "n_embd"));
        head.into_iter().chain(blocks).chain(ln_f)
    }
}

/// A block's layer norm: `nn::layer_norm`'s parameters (`weight`, `bias`)
/// and its forward (eps 1e-5), held so a block can be shallow-copied.
#[derive(Debug)]
struct Norm {
    ws: Tensor,
    bs: Tensor,
}

impl Norm {
    fn new(path: nn::Path, dim: i64) -> Norm {
        let norm = nn::layer_norm(path, vec![dim], Default::default());
        Norm {
            ws: norm.ws.expect("an affine layer norm"),
            bs: norm.bs.expect("an affine layer norm"),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.layer_norm(self.ws.size(), Some(&self.ws), Some(&self.bs), 1e-5, true)
    }
}

#[derive(Debug)]
struct Block {
    ln_1: Norm,
    c_attn: nn::Linear,
    attn_proj: nn::Linear,
    ln_2: Norm,
    c_fc: nn::Linear,
    mlp_proj: nn::Linear,
    n_head: i64,
}

impl Shallow for Block {
    fn shallow(&self) -> Self {
        Block {
            ln_1: Norm {
                ws: self.ln_1.ws.shallow(),
                bs: self.ln_1.bs.shallow(),
            },
            c_attn: self.c_attn.shallow(),
            attn_proj: self.attn_proj.shallow(),
            ln_2: Norm {
                ws: self.ln_2.ws.shallow(),
                bs: self.ln_2.bs.shallow(),
            },
            c_fc: self.c_fc.shallow(),
            mlp_proj: self.mlp_proj.shallow(),
            n_head: self.n_head,
        }
    }
}

impl Block {
    fn new(path: &nn::Path, config: &GptConfig) -> Block {
        let e = config.n_embd;
        let attn = path / "attn";
        let mlp = path / "mlp";
        Block {
            ln_1: Norm::new(path / "ln_1", e),
            c_attn: nn::linear(&attn / "c_attn", e, 3 * e, Default::default()),
            attn_proj: nn::linear(&attn / "c_proj", e, e, Default::default()),
            ln_2: Norm::new(path / "ln_2", e),
            c_fc: nn::linear(&mlp / "c_fc", e, 4 * e, Default::default()),
            mlp_proj: nn::linear(&mlp / "c_proj", 4 * e, e, Default::default()),
            n_head: config.n_head,
        }
    }

    /// `x` holds the new positions `[batch, new, embd]`; `mask` is `None` for
    /// plain causal attention over `x` (the flash kernel skips the keys after
    /// each query), else an additive float `[batch, 1, new, keys]` (0 =
    /// attend, -inf = not) over the keys `past` returns: it maps this layer's
    /// new keys and values `[batch, heads, new, head_dim]` to all the keys and
    /// values the new positions attend to (cached or shared prefix ones
    /// first).
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, past: Past) -> Tensor {
        let (b, t, e) = x.size3().expect("x is [batch, time, embd]");
        let head_dim = e / self.n_head;
        let qkv = self.c_attn.forward(&self.ln_1.forward(x));
        let split = qkv.split(e, 2);
        let heads = |z: &Tensor| z.view([b, t, self.n_head, head_dim]).transpose(1, 2);
        let (q, k, v) = (heads(&split[0]), heads(&split[1]), heads(&split[2]));
        let (k, v) = match past {
            Past::None => (k, v),
            Past::Cache(cache) => cache.append(&k, &v),
            Past::Record(layers) => {
                layers.push((k.shallow_clone(), v.shallow_clone()));
                (k, v)
            }
            Past::Prefix((keys, values), rows) => (
                Tensor::cat(&[keys.index_select(0, rows), k], 2),
                Tensor::cat(&[values.index_select(0, rows), v], 2),
            ),
        };
        let attended = Tensor::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            mask,
            0.0,
            mask.is_none(),
            None,
            false,
        );
        let attended = attended.transpose(1, 2).contiguous().view([b, t, e]);
        let x = x + self.attn_proj.forward(&attended);
        let hidden = self.c_fc.forward(&self.ln_2.forward(&x)).gelu("tanh");
        &x + self.mlp_proj.forward(&hidden)
    }
}

/// What one layer's new keys and values join.
enum Past<'a> {
    /// Nothing: the new positions attend among themselves.
    None,
    /// A decoding cache: appended to it, attending to all of it.
    Cache(&'a mut LayerCache),
    /// Nothing, and the new keys and values are recorded (a [`Prefix`] being built).
    Record(&'a mut Vec<(Tensor, Tensor)>),
    /// A shared prefix's keys and values, each batch row taking the prefix
    /// row `rows[row]`, followed by the new ones.
    Prefix(&'a (Tensor, Tensor), &'a Tensor),
}

/// One layer's keys and values, preallocated for the longest sequence.
#[derive(Debug)]
struct LayerCache {
    keys: Tensor,
    values: Tensor,
    len: i64,
}

impl LayerCache {
    /// Stores `k`, `v` `[batch, heads, new, head_dim]` after the cached
    /// positions and returns all keys and values so far.
    fn append(&mut self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let new = k.size()[2];
        self.keys.narrow(2, self.len, new).copy_(k);
        self.values.narrow(2, self.len, new).copy_(v);
        self.len += new;
        (
            self.keys.narrow(2, 0, self.len),
            self.values.narrow(2, 0, self.len),
        )
    }
}

/// The key/value cache of a batch being decoded: every layer's keys and
/// values of the positions seen so far, so each new token costs one position's
/// forward pass instead of the whole prefix.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// Positions cached so far.
    pub fn len(&self) -> i64 {
        self.layers.first().map_or(0, |layer| layer.len)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the batch rows `rows` (a 1-D int64 index tensor): finished
    /// sequences leave the batch so later steps cost less.
    pub fn keep_rows(&mut self, rows: &Tensor) {
        for layer in &mut self.layers {
            layer.keys = layer.keys.index_select(0, rows);
            layer.values = layer.values.index_select(0, rows);
        }
    }
}

/// The transformer.
#[derive(Debug)]
pub struct Gpt {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    config: GptConfig,
}

impl Gpt {
    /// Creates the parameters under `path`.
    pub fn new(path: &nn::Path, config: &GptConfig) -> Gpt {
        assert!(
            config.n_embd % config.n_head == 0,
            "n_head {} must divide n_embd {}",
            config.n_head,
            config.n_embd
        );
        let embedding = nn::EmbeddingConfig {
            ws_init: nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
            ..Default::default()
        };
        Gpt {
            wte: nn::embedding(path / "wte", config.vocab_size, config.n_embd, embedding),
            wpe: nn::embedding(path / "wpe", config.n_ctx, config.n_embd, embedding),
            blocks: (0..config.n_layer)
                .map(|i| Block::new(&(path / "h" / i), config))
                .collect(),
            ln_f: nn::layer_norm(path / "ln_f", vec![config.n_embd], Default::default()),
            config: config.clone(),
        }
    }

    /// The architecture.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Logits `[batch, time, vocab]` for token ids `[batch, time]` (time <= n_ctx),
    /// every row starting at position 0 (plain causal attention).
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        self.logits(&self.hidden_causal(ids))
    }

    /// Final hidden states `[batch, time, embd]` (after the last layer norm)
    /// of token ids `[batch, time]` (time <= n_ctx), every row starting at
    /// position 0, under plain causal attention (no mask: the kernel skips
    /// the keys after each query). Rows may be right-padded: a real position
    /// never attends to the pads after it, so its hidden state is that of the
    /// row alone.
    pub fn hidden_causal(&self, ids: &Tensor) -> Tensor {
        let (batch, t) = ids.size2().expect("ids are [batch, time]");
        self.check_length(t);
        let positions = Tensor::arange(t, (Kind::Int64, ids.device())).expand([batch, t], false);
        self.hidden(ids, &positions, None, Context::None)
    }

    /// [`Gpt::hidden_causal`] of a batch of prefixes (prompts), with every
    /// layer's keys and values kept (and their gradients) so that many
    /// continuations of each prefix attend to it without recomputing it
    /// ([`Gpt::hidden_after`]).
    pub fn prefix(&self, ids: &Tensor) -> (Tensor, Prefix) {
        let (batch, t) = ids.size2().expect("ids are [batch, time]");
        self.check_length(t);
        let positions = Tensor::arange(t, (Kind::Int64, ids.device())).expand([batch, t], false);
        let mut layers = Vec::with_capacity(self.blocks.len());
        let hidden = self.hidden(ids, &positions, None, Context::Record(&mut layers));
        (hidden, Prefix { layers })
    }

    /// Final hidden states `[batch, new, embd]` of continuation ids `[batch,
    /// new]` at `positions` `[batch, new]`: row `b` continues prefix row
    /// `rows[b]` (`rows` a 1-D int64 tensor; many rows may share a prefix
    /// row, and the gradient of a shared prefix is the sum over them).
    /// `mask` (bool `[batch, 1, new, prefix_time + new]`, true = attend)
    /// says which prefix keys (a shorter prefix's right pads are not) and
    /// which new keys each new position attends to.
    pub fn hidden_after(
        &self,
        prefix: &Prefix,
        rows: &Tensor,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
    ) -> Tensor {
        self.hidden(ids, positions, Some(mask), Context::Prefix(prefix, rows))
    }

    /// An empty cache for `batch` sequences of up to `max_len` positions.
    pub fn empty_cache(&self, batch: i64, max_len: i64) -> KvCache {
        self.check_length(max_len);
        let head_dim = self.config.n_embd / self.config.n_head;
        let shape = [batch, self.config.n_head, max_len, head_dim];
        let options = (self.wte.ws.kind(), self.wte.ws.device());
        KvCache {
            layers: (0..self.config.n_layer)
                .map(|_| LayerCache {
                    keys: Tensor::zeros(shape, options),
                    values: Tensor::zeros(shape, options),
                    len: 0,
                })
                .collect(),
        }
    }

    /// Final hidden states `[batch, new, embd]` (after the last layer norm)
    /// of the new token ids `[batch, new]` at `positions` `[batch, new]`,
    /// attending under `mask` (bool `[batch, 1, new, cached + new]`, true =
    /// attend) to the cached positions and the new ones; with a cache, the new
    /// keys and values are appended to it. [`Gpt::logits`] turns the positions
    /// that need them into logits.
    pub fn hidden_masked(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let (_, t) = ids.size2().expect("ids are [batch, time]");
        let cached = cache.as_ref().map_or(0, |cache| cache.len());
        self.check_length(cached + t);
        let context = match cache {
            Some(cache) => Context::Cache(cache),
            None => Context::None,
        };
        self.hidden(ids, positions, Some(mask), context)
    }

    /// Logits `[.., vocab]` of final hidden states `[.., embd]` (the output
    /// head, tied to the token embedding).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        hidden.matmul(&self.wte.ws.tr())
    }

    fn check_length(&self, t: i64) {
        assert!(
            t <= self.config.n_ctx,
            "sequence of {t} tokens exceeds n_ctx {}",
            self.config.n_ctx
        );
    }

    /// Token embeddings `[.., embd]` of ids `[..]`, without positions (the
    /// VLA's instruction tokens, [`crate::vla`]).
    pub(crate) fn embed_tokens(&self, ids: &Tensor) -> Tensor {
        self.wte.forward(ids)
    }

    /// Learned position embeddings `[.., embd]` of positions `[..]` (< n_ctx).
    pub(crate) fn embed_positions(&self, positions: &Tensor) -> Tensor {
        self.wpe.forward(positions)
    }

    /// Final hidden states `[batch, time, embd]` of inputs already embedded
    /// (positions included) `[batch, time, embd]`, attending under `mask`
    /// (bool, broadcastable to `[batch, 1, time, time]`, true = attend): the
    /// VLA's prefix-plus-placeholders pass ([`crate::vla`]).
    pub(crate) fn hidden_of_embeddings(&self, x: Tensor, mask: &Tensor) -> Tensor {
        self.blocks(x, Some(mask), Context::None)
    }

    fn hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: Option<&Tensor>,
        context: Context,
    ) -> Tensor {
        let x = self.wte.forward(ids) + self.wpe.forward(positions);
        self.blocks(x, mask, context)
    }

    /// The blocks over the new positions' embeddings `x`. A bool `mask`
    /// becomes the additive float mask SDPA applies (0 / -inf) once here, not
    /// in every layer. Without a context, the blocks are a
    /// [`checkpointing::run`] (recomputed in the backward when
    /// checkpointing is on).
    fn blocks(&self, mut x: Tensor, mask: Option<&Tensor>, mut context: Context) -> Tensor {
        let mask = mask.map(|mask| {
            Tensor::zeros(mask.size(), (self.wte.ws.kind(), mask.device()))
                .masked_fill(&mask.logical_not(), f64::NEG_INFINITY)
        });
        if let Context::None = context {
            let trains = self.blocks.iter().any(|b| b.c_attn.ws.requires_grad());
            let x = checkpointing::run(x, &[], trains, |_| {
                self.blocks
                    .iter()
                    .map(|block| {
                        let (block, mask) = (block.shallow(), mask.shallow());
                        Box::new(move |x: &Tensor| block.forward(x, mask.as_ref(), Past::None))
                            as checkpointing::Block
                    })
                    .collect()
            });
            return self.ln_f.forward(&x);
        }
        for (index, block) in self.blocks.iter().enumerate() {
            let past = match &mut context {
                Context::None => Past::None,
                Context::Cache(cache) => Past::Cache(&mut cache.layers[index]),
                Context::Record(layers) => Past::Record(layers),
                Context::Prefix(prefix, rows) => Past::Prefix(&prefix.layers[index], rows),
            };
            x = block.forward(&x, mask.as_ref(), past);
        }
        self.ln_f.forward(&x)
    }
}

/// Every layer's keys and values `[prefixes, heads, time, head_dim]` of a
/// batch of prefixes run once by [`Gpt::prefix`] (still attached to the
/// graph when gradients are on).
#[derive(Debug)]
pub struct Prefix {
    layers: Vec<(Tensor, Tensor)>,
}

/// What a forward pass's new positions join, for all layers.
enum Context<'a> {
    None,
    Cache(&'a mut KvCache),
    Record(&'a mut Vec<(Tensor, Tensor)>),
    Prefix(&'a Prefix, &'a Tensor),
}

impl PolicyNet for Gpt {
    type Config = GptConfig;
    type Role = crate::net::Plans;
    const KIND: PolicyKind = PolicyKind::Plan;
    const NAME: &'static str = "plan";
    const TAG: ConfigTag = ConfigTag::Kind {
        name: "plan",
        default: true,
    };

    fn parse_config(value: serde_json::Value) -> Result<GptConfig, String> {
        serde_config(value)
    }

    fn config_json(&self) -> serde_json::Value {
        tagged_config(Self::KIND, self.config())
    }

    fn check(config: &GptConfig) -> Result<(), String> {
        config.check()
    }

    fn tensors(config: &GptConfig) -> Box<dyn Iterator<Item = Expected> + '_> {
        Box::new(config.tensors("n_ctx, n_embd"))
    }

    fn vocab_size(config: &GptConfig) -> i64 {
        config.vocab_size
    }

    fn build(path: &tch::nn::Path, config: &GptConfig) -> Gpt {
        Gpt::new(path, config)
    }

    fn config(&self) -> &GptConfig {
        Gpt::config(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::OptimizerConfig;

    fn tiny() -> GptConfig {
        GptConfig {
            vocab_size: 11,
            n_ctx: 12,
            n_embd: 16,
            n_head: 2,
            n_layer: 2,
        }
    }

    /// The tensor list a checkpoint's weights are checked against before
    /// allocation is the network `Gpt::new` builds.
    #[test]
    fn the_config_lists_exactly_the_networks_parameters() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let _model = Gpt::new(&vs.root(), &tiny());
        embodyflow_hf::testing::assert_tensors_are_the_variables(&vs, tiny().tensors("n_ctx"));
    }

    #[test]
    fn forward_is_causal() {
        let _generator = crate::testing::seed(0);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let model = Gpt::new(&vs.root(), &tiny());
        let a = Tensor::from_slice(&[1i64, 2, 3, 4, 5]).view([1, 5]);
        let b = Tensor::from_slice(&[1i64, 2, 3, 9, 9]).view([1, 5]);
        let (la, lb) = (model.forward(&a), model.forward(&b));
        // The first three positions see the same prefix, so their logits agree.
        let diff = (la.narrow(1, 0, 3) - lb.narrow(1, 0, 3))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-6, "future tokens leaked into the past: {diff}");
        let later = (la.narrow(1, 3, 2) - lb.narrow(1, 3, 2))
            .abs()
            .max()
            .double_value(&[]);
        assert!(later > 1e-4);
    }

    #[test]
    fn backward_reaches_every_parameter_and_training_lowers_the_loss() {
        let _generator = crate::testing::seed(0);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let model = Gpt::new(&vs.root(), &tiny());
        let mut opt = nn::AdamW::default().build(&vs, 3e-3).unwrap();
        // Learn to continue a fixed sequence: next-token cross-entropy.
        let seq = Tensor::from_slice(&[1i64, 4, 2, 8, 5, 7, 3, 6, 9, 10]).view([1, 10]);
        let (inputs, targets) = (seq.narrow(1, 0, 9), seq.narrow(1, 1, 9));
        let loss_of = |model: &Gpt| {
            model
                .forward(&inputs)
                .view([-1, 11])
                .cross_entropy_for_logits(&targets.view([-1]))
        };
        let first = loss_of(&model);
        opt.zero_grad();
        first.backward();
        for (name, var) in vs.variables() {
            let grad = var.grad();
            assert!(grad.defined(), "{name} got no gradient");
            assert!(
                grad.abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "{name} has a zero gradient"
            );
        }
        opt.step();
        for _ in 0..60 {
            opt.backward_step(&loss_of(&model));
        }
        let last = loss_of(&model).double_value(&[]);
        assert!(
            last < 0.5 * first.double_value(&[]),
            "loss {} -> {last}",
            first.double_value(&[])
        );
    }
}
