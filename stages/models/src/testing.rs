//! The one tiny policy the tests share (models, teacher-logp, update-policy):
//! a byte-level BPE trained on a few household sentences and a GPT of two
//! layers, four heads and width 32, initialised from a fixed seed, on the
//! CPU. It is small enough to build in milliseconds and big enough to
//! exercise what the tests check: a multi-layer key/value cache, batched
//! scoring, a context limit (`n_ctx` is the caller's), a teacher context with
//! a reference plan, and gradient steps that move log-probs. [`tiny_vla`] is
//! its VLA counterpart on the same tokenizer.
//!
//! Not part of the API: hidden from the docs and meant for `#[cfg(test)]`
//! code (it is compiled in, rather than behind a cargo feature, so that
//! building the tests does not rebuild this crate and every crate above it
//! with other features).
//!
//! ```no_run
//! use embodyflow_models::testing::tiny_policy;
//! let policy = tiny_policy(48);
//! assert_eq!(policy.model.config().n_ctx, 48);
//! assert!(policy.model.config().vocab_size > 256); // every byte, the specials, some merges
//! ```

use tokenizers::Tokenizer;

use crate::checkpoint::Checkpoint;
use crate::gpt::GptConfig;
use crate::policy::{AsPrompt, Entropy, PlanNet, Sampled, score_responses};
use crate::tokenizer::train_bpe;
use crate::vla::{Vla, VlaConfig};

/// The seed `tiny_policy` initialises the weights from.
pub const SEED: i64 = 3;

/// The BPE of the tiny policy: every byte, the three special tokens and
/// merges learnt from task prompts, reference plans and answers.
pub fn tiny_tokenizer() -> Tokenizer {
    let corpus: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "Task: find a Mug {i}\nHere is a reference plan: pick up the Mug, \
                 put the apple {i} in the fridge, then find a mug {}",
                i * 7
            )
        })
        .collect();
    train_bpe(&corpus, 300).expect("the tiny corpus trains a BPE")
}

/// The tiny policy's shape for a vocabulary of `vocab_size` and a context of
/// `n_ctx` tokens: 2 layers, 4 heads, width 32.
pub fn tiny_config(vocab_size: i64, n_ctx: i64) -> GptConfig {
    GptConfig {
        vocab_size,
        n_ctx,
        n_embd: 32,
        n_head: 4,
        n_layer: 2,
    }
}

/// Seeds libtorch's global generator and holds it for the guard's life
/// ([`crate::generator::seeded`]): tests of one binary run on parallel
/// threads, and a network another test builds meanwhile waits instead of
/// drawing between this seed and this test's draws.
pub fn seed(seed: i64) -> crate::generator::Held {
    crate::generator::seeded(seed)
}

/// The message of loading `dir` as an `M` checkpoint, which must fail as
/// bad input.
pub fn load_refused<M: crate::net::PolicyNet>(dir: &std::path::Path) -> String {
    let error = Checkpoint::<M>::load_kind(dir, tch::Device::Cpu)
        .err()
        .expect("refused");
    assert_eq!(
        embodyflow_core::Classify::kind(&error),
        embodyflow_core::ErrorKind::BadInput,
        "{error}"
    );
    error.to_string()
}

/// The tiny policy with a context of `n_ctx` tokens, weights drawn after
/// seeding with `SEED` (under [`seed`]'s lock), on the CPU.
pub fn tiny_policy(n_ctx: i64) -> Checkpoint {
    let tokenizer = tiny_tokenizer();
    let config = tiny_config(tokenizer.get_vocab_size(true) as i64, n_ctx);
    let _generator = seed(SEED);
    Checkpoint::init(&config, tokenizer, tch::Device::Cpu).expect("the tiny config is valid")
}

/// A tiny VLA on the tiny tokenizer (instructions of up to 160 tokens,
/// 32 × 32 images in 8 × 8 patches, proprio 5, chunks of `chunk_len`
/// actions of 4 dimensions, 256 bins over [-1, 1], width 32, 4 heads, 2
/// layers), weights drawn after seeding with `SEED`, on the CPU.
pub fn tiny_vla(chunk_len: i64) -> Checkpoint<Vla> {
    tiny_vla_with(chunk_len, None)
}

/// [`tiny_vla`] with LaST-R1's latent chain of thought: 4 latents in groups
/// of 2 (stops after 2 or 4), a value head.
pub fn tiny_thinking_vla(chunk_len: i64) -> Checkpoint<Vla> {
    tiny_vla_with(
        chunk_len,
        Some(crate::vla::LatentConfig {
            length: 4,
            group: 2,
        }),
    )
}

/// The script that saves a tiny random Qwen2.5-VL with transformers.
pub const VLM_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/vla_trunk_fixture.py"
);

/// A tiny random Qwen2.5-VL in transformers' layout in `dir`, saved by
/// transformers' `save_pretrained` (`scripts/vla_trunk_fixture.py`: 2
/// vision blocks, 2 decoder layers of width 48, patch 4, merge 2, an
/// embedding of 640 rows), its `tokenizer.json` the tiny tokenizer plus
/// `<|vision_start|>`, `<|vision_end|>` and `<|image_pad|>`; `family`
/// `qwen3_vl` makes a tied Qwen3-VL with DeepStack instead. Panics, saying
/// to run `scripts/setup`, without the project venv's transformers.
pub fn tiny_vlm(dir: &std::path::Path, family: &str) {
    let ours = dir.join("ours.json");
    tiny_tokenizer()
        .save(&ours, false)
        .expect("the tokenizer saves");
    let python = embodyflow_hf::testing::PYTHON;
    let out = std::process::Command::new(python)
        .arg(VLM_SCRIPT)
        .arg(dir)
        .arg(&ours)
        .arg(family)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} ({e}): run scripts/setup"));
    assert!(
        out.status.success(),
        "{VLM_SCRIPT} failed (transformers missing? run scripts/setup):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tiny_vla_with(chunk_len: i64, latent: Option<crate::vla::LatentConfig>) -> Checkpoint<Vla> {
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        chunk_len,
        max_instruction: 160,
        n_embd: 32,
        n_layer: 2,
        latent,
        ..VlaConfig::small(tokenizer.get_vocab_size(true) as i64)
    };
    let _generator = seed(SEED);
    Checkpoint::<Vla>::init_kind(&config, tokenizer, tch::Device::Cpu)
        .expect("the tiny VLA config is valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{SpecialIds, encode};

    #[test]
    fn the_tiny_policy_is_the_same_every_time() {
        let (a, b) = (tiny_policy(48), tiny_policy(48));
        assert_eq!(
            a.model.config(),
            &tiny_config(a.model.config().vocab_size, 48)
        );
        assert_eq!(a.special, SpecialIds::of(&a.tokenizer).unwrap());
        let ids = encode(&a.tokenizer, "find a Mug").unwrap();
        assert_eq!(ids, encode(&b.tokenizer, "find a Mug").unwrap());
        assert!(ids.len() < "find a Mug".len(), "the BPE merged: {ids:?}");
        let input = tch::Tensor::from_slice(&[5i64, 9, 12]).view([1, 3]);
        let (la, lb) = (a.model.forward(&input), b.model.forward(&input));
        assert_eq!(la.size(), [1, 3, a.model.config().vocab_size]);
        assert!(la.equal(&lb), "same seed, same weights");
    }

    #[test]
    fn networks_built_on_another_thread_do_not_draw_between_a_seed_and_its_draws() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let input = tch::Tensor::from_slice(&[5i64, 9, 12]).view([1, 3]);
        let expected = tiny_policy(48).model.forward(&input);
        let done = Arc::new(AtomicBool::new(false));
        let builder = {
            let done = done.clone();
            let tokenizer = tiny_tokenizer();
            let config = tiny_config(tokenizer.get_vocab_size(true) as i64, 48);
            std::thread::spawn(move || {
                let mut built = 0;
                while !done.load(Ordering::Relaxed) {
                    Checkpoint::init(&config, tokenizer.clone(), tch::Device::Cpu).unwrap();
                    built += 1;
                }
                built
            })
        };
        let same = (0..20)
            .filter(|_| tiny_policy(48).model.forward(&input).equal(&expected))
            .count();
        done.store(true, Ordering::Relaxed);
        let built = builder.join().unwrap();
        assert!(built > 0);
        assert_eq!(same, 20, "{built} networks built meanwhile");
    }
}

/// Each sampled answer of `policy` ends at its first stop id or at the
/// limit, and its recorded log-probs are the scorer's at `temperature`
/// (within 1e-4).
pub fn assert_sampled_are_scored<M: PlanNet, P: AsPrompt>(
    policy: &Checkpoint<M>,
    prompts: &[P],
    sampled: &[Sampled],
    temperature: f64,
) {
    let responses: Vec<&[i32]> = sampled.iter().map(|s| s.response_ids.as_slice()).collect();
    let scores = score_responses(policy, prompts, &responses, temperature, Entropy::Skip);
    for (row, s) in sampled.iter().enumerate() {
        assert!(!s.response_ids.is_empty());
        let stop_at = s.response_ids.iter().position(|&t| policy.stops(t));
        assert!(stop_at.is_none_or(|at| at + 1 == s.response_ids.len()));
        let scored: Vec<f32> = Vec::<f32>::try_from(scores.logprobs.get(row as i64).narrow(
            0,
            0,
            s.logprobs.len() as i64,
        ))
        .unwrap();
        for (a, b) in s.logprobs.iter().zip(&scored) {
            assert!((a - b).abs() < 1e-4, "row {row}: sampled {a}, scored {b}");
        }
    }
}

/// Qwen2-VL's chat template in small: a user turn's content is a string
/// or a list of image and text parts.
pub const TINY_VL_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A tiny random vision-language plan policy of `family` (`qwen2_5_vl` or
/// `qwen3_vl`) in transformers' layout in `dir`, written here (no Python):
/// the tiny policy's BPE plus the chat tokens and `<|vision_start|>`,
/// `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>` (the ids the config
/// names), [`TINY_VL_TEMPLATE`], 2 vision and 2 language layers of widths
/// 32 and 48, GQA 4/2, patch 4, merge 2, temporal patch 2 (Qwen2.5-VL:
/// untied, one windowed and one full block; Qwen3-VL: tied, DeepStack from
/// both blocks), weights drawn after seeding with 7, and a
/// `preprocessor_config.json` for 8² to 64² pixels.
pub fn write_tiny_vl_policy(dir: &std::path::Path, family: &str) {
    use embodyflow_hf::HfNet;
    use embodyflow_hf::vl::{Layout, VlConfig, VlNet};
    use tch::Tensor;
    use tokenizers::AddedToken;
    let mut tokenizer = tiny_tokenizer();
    let specials = [
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ];
    tokenizer.add_special_tokens(&specials.map(|t| AddedToken::from(t, true)));
    let id = |token: &str| tokenizer.token_to_id(token).unwrap();
    let vocab = (tokenizer.get_vocab_size(true) as i64 + 63) / 64 * 64;
    let text = serde_json::json!({
        "vocab_size": vocab, "hidden_size": 48, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    });
    let mut config = serde_json::json!({
        "model_type": family,
        "tie_word_embeddings": family == "qwen3_vl",
        "text_config": text,
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48,
            "num_heads": 2, "patch_size": 4, "out_hidden_size": 48},
        "image_token_id": id("<|image_pad|>"),
        "video_token_id": id("<|video_pad|>"),
        "vision_start_token_id": id("<|vision_start|>"),
        "vision_end_token_id": id("<|vision_end|>"),
    });
    if family == "qwen3_vl" {
        config["text_config"]["head_dim"] = 16.into();
        config["text_config"]["rope_parameters"] = serde_json::json!(
            {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": true});
        config["vision_config"]["deepstack_visual_indexes"] = serde_json::json!([0, 1]);
        config["vision_config"]["num_position_embeddings"] = 16.into();
    } else {
        config["text_config"]["rope_scaling"] =
            serde_json::json!({"type": "mrope", "mrope_section": [2, 2, 2]});
        config["vision_config"]["fullatt_block_indexes"] = serde_json::json!([1]);
        config["vision_config"]["window_size"] = 16.into();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let parsed = VlConfig::parse(&config.to_string(), std::path::Path::new("config.json")).unwrap();
    let _guard = seed(7);
    let vars = tch::nn::VarStore::new(tch::Device::Cpu);
    let _net = VlNet::new(&vars.root(), parsed, Layout::CURRENT);
    tch::no_grad(|| {
        for (_, mut variable) in vars.variables() {
            variable.copy_(&(Tensor::randn_like(&variable) * 0.5));
        }
    });
    HfNet::write_weights(&vars, &dir.join(crate::checkpoint::WEIGHTS_FILE)).unwrap();
    tokenizer
        .save(dir.join(crate::checkpoint::TOKENIZER_FILE), false)
        .unwrap();
    let tokenizer_config =
        serde_json::json!({"chat_template": TINY_VL_TEMPLATE, "eos_token": "<|im_end|>"});
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    let processor = serde_json::json!({"patch_size": 4, "merge_size": 2,
        "temporal_patch_size": 2, "min_pixels": 64, "max_pixels": 4096});
    std::fs::write(dir.join(crate::vl::PROCESSOR_FILE), processor.to_string()).unwrap();
}

/// A 32 × 32 RGB image of pseudo-random bytes drawn from `seed` (an 8 × 8
/// patch grid, 16 tokens after the merge, for [`write_tiny_vl_policy`]).
pub fn tiny_image(seed: u32) -> embodyflow_hf::image::RgbImage {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let data = (0..32 * 32 * 3)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    embodyflow_hf::image::RgbImage::new(32, 32, data).expect("32 × 32 × 3 bytes")
}

/// (name, dtype) of every tensor of a `.safetensors` file, read from its
/// header (`"F32"`, `"BF16"`, …).
pub fn stored_dtypes(file: &std::path::Path) -> Vec<(String, String)> {
    let bytes = std::fs::read(file).expect("the safetensors file reads");
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + len]).expect("a JSON header");
    header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, entry)| (name, entry["dtype"].as_str().unwrap_or("").to_string()))
        .collect()
}
