//! The VLA's trunk: the network between the embedded observation and the
//! heads, chosen by the config's `trunk` ([`VlaConfig::trunk`](super::VlaConfig::trunk)).
//!
//! - **small** (no `trunk` in `config.json`): our [`Gpt`](crate::gpt::Gpt) blocks over
//!   `[patches | proprio | instruction | tail]`, the prefix bidirectional
//!   (the module doc of [`super`]);
//! - **a Hugging Face vision-language model** (Qwen2.5-VL, Qwen3-VL:
//!   [`VlNet`](embodyflow_hf::vl::VlNet), `trunk.model` its `config.json` and `trunk.processor` its
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

use embodyflow_hf::VlModel;
use embodyflow_hf::vl::Layout;
use tch::Device;

use super::config::VlaConfig;
pub use super::config::{ActionTokens, HfTrunkConfig, bin_of, vocab_id};
use super::model::Vla;
use crate::ModelError;
use crate::checkpoint::{Checkpoint, TOKENIZER_FILE, built};
use network::vlm_special_ids;

pub(super) mod network;

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
    let (vars, vla) = built::<Vla>(&config, device);
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

#[cfg(test)]
mod tests;
