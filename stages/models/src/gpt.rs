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
//! ```
//! use embodyflow_models::gpt::{Gpt, GptConfig};
//! let vs = tch::nn::VarStore::new(tch::Device::Cpu);
//! let config = GptConfig { vocab_size: 16, n_ctx: 8, n_embd: 8, n_head: 2, n_layer: 1 };
//! let model = Gpt::new(&vs.root(), &config);
//! let ids = tch::Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
//! assert_eq!(model.forward(&ids).size(), [1, 3, 16]);
//! ```

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

#[derive(Debug)]
struct Block {
    ln_1: nn::LayerNorm,
    c_attn: nn::Linear,
    attn_proj: nn::Linear,
    ln_2: nn::LayerNorm,
    c_fc: nn::Linear,
    mlp_proj: nn::Linear,
    n_head: i64,
}

impl Block {
    fn new(path: &nn::Path, config: &GptConfig) -> Block {
        let e = config.n_embd;
        let attn = path / "attn";
        let mlp = path / "mlp";
        Block {
            ln_1: nn::layer_norm(path / "ln_1", vec![e], Default::default()),
            c_attn: nn::linear(&attn / "c_attn", e, 3 * e, Default::default()),
            attn_proj: nn::linear(&attn / "c_proj", e, e, Default::default()),
            ln_2: nn::layer_norm(path / "ln_2", vec![e], Default::default()),
            c_fc: nn::linear(&mlp / "c_fc", e, 4 * e, Default::default()),
            mlp_proj: nn::linear(&mlp / "c_proj", 4 * e, e, Default::default()),
            n_head: config.n_head,
        }
    }

    /// `x` holds the new positions `[batch, new, embd]`; `mask` is `None` for
    /// plain causal attention over `x`, else a bool `[batch, 1, new, keys]`
    /// (true = attend) over the cached keys followed by the new ones.
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, cache: Option<&mut LayerCache>) -> Tensor {
        let (b, t, e) = x.size3().expect("x is [batch, time, embd]");
        let head_dim = e / self.n_head;
        let qkv = self.c_attn.forward(&self.ln_1.forward(x));
        let split = qkv.split(e, 2);
        let heads = |z: &Tensor| z.view([b, t, self.n_head, head_dim]).transpose(1, 2);
        let (q, k, v) = (heads(&split[0]), heads(&split[1]), heads(&split[2]));
        let (k, v) = match cache {
            Some(cache) => cache.append(&k, &v),
            None => (k, v),
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
        let (batch, t) = ids.size2().expect("ids are [batch, time]");
        self.check_length(t);
        let positions = Tensor::arange(t, (Kind::Int64, ids.device())).expand([batch, t], false);
        self.logits(&self.hidden(ids, &positions, None, None))
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
        self.hidden(ids, positions, Some(mask), cache)
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

    fn hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let mut x = self.wte.forward(ids) + self.wpe.forward(positions);
        for (index, block) in self.blocks.iter().enumerate() {
            let layer = cache.as_deref_mut().map(|cache| &mut cache.layers[index]);
            x = block.forward(&x, mask, layer);
        }
        self.ln_f.forward(&x)
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
