//! Our Hugging Face decoder against transformers on the same CPU, batch and
//! thread count: a tiny random Qwen3 (`scripts/hf_golden.py bench-model`:
//! width 256, 4 layers, 8 heads / 4 kv heads, head_dim 32, MLP 768,
//! vocabulary 1024), a batch of 8 rows (row b left-padded by b mod 4), at
//! two prompt lengths: 32 tokens, and 630 (a household task's prompt, where
//! the prefill dominates):
//! - greedy: 64 new tokens after the prompt with the KV cache
//!   (`HfDecoder::greedy` vs `generate(do_sample=False)`), new tokens / s;
//! - train: forward + backward of the next-token loss over prompt + 64
//!   tokens, tokens / s.
//!
//! One warm-up, best of 3, on `--threads N` libtorch threads (default 1:
//! on a shared machine more threads than free cores make OpenMP's waits
//! dominate both sides). Prints `hf_<what>_tokens_per_s_<n>t_prompt<P> ours
//! N transformers N ratio R`. Needs the project venv (`scripts/setup`).

use std::path::Path;
use std::time::Instant;

use embodyflow_hf::HfDecoder;
use embodyflow_hf::testing::golden_script;
use tch::nn::OptimizerConfig;
use tch::{Device, Kind, Tensor};

const BATCH: i64 = 8;
/// The prompt lengths measured: short, and a household task's.
const PROMPTS: [i64; 2] = [32, 630];
const NEW: i64 = 64;
const PAD: i64 = 0;

/// The script's `bench_batch`: row b holds 1 + (131 b + 17 t) mod (vocab -
/// 1), its first b mod 4 positions padding.
fn batch(vocab: i64, length: i64) -> (Tensor, Tensor) {
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for b in 0..BATCH {
        for t in 0..length {
            let token = t >= b % 4;
            mask.push(token as i64);
            ids.push(if token {
                1 + (131 * b + 17 * t) % (vocab - 1)
            } else {
                PAD
            });
        }
    }
    (
        Tensor::from_slice(&ids).view([BATCH, length]),
        Tensor::from_slice(&mask).view([BATCH, length]),
    )
}

/// Best seconds of 3 runs of `f` after one warm-up run.
fn best_of_3(mut f: impl FnMut()) -> f64 {
    f();
    (0..3)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: i32 = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .map_or(1, |n| n.parse().expect("--threads N"));
    tch::set_num_threads(threads);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-bench-qwen3");
    let _ = std::fs::remove_dir_all(&dir);
    golden_script(&["bench-model", dir.to_str().unwrap()]);
    let model = HfDecoder::load(&dir, Device::Cpu).unwrap();
    let vocab = model.config().vocab_size;

    for prompt in PROMPTS {
        measure(&model, &dir, vocab, prompt, threads);
    }
}

/// Greedy decoding and a training step on `prompt`-token prompts, ours and
/// transformers' on the same model, printed.
fn measure(model: &HfDecoder, dir: &Path, vocab: i64, prompt: i64, threads: i32) {
    let (ids, mask) = batch(vocab, prompt);
    let greedy_s = best_of_3(|| {
        let tokens = model.greedy(&ids, &mask, NEW, None, PAD).unwrap();
        assert_eq!(tokens.size(), [BATCH, NEW]);
    });

    let (tids, tmask) = batch(vocab, prompt + NEW);
    let t = prompt + NEW;
    let targets = tids
        .narrow(1, 1, t - 1)
        .masked_fill(&tmask.narrow(1, 1, t - 1).eq(0), -100)
        .reshape([-1]);
    let mut opt = tch::nn::Sgd::default()
        .build(model.var_store(), 0.0)
        .unwrap();
    let train_s = best_of_3(|| {
        opt.zero_grad();
        let logits = model.forward(&tids, &tmask).unwrap();
        let loss = logits
            .narrow(1, 0, t - 1)
            .reshape([-1, vocab])
            .cross_entropy_loss::<Tensor>(&targets, None, tch::Reduction::Mean, -100, 0.0);
        loss.backward();
        assert_eq!(loss.kind(), Kind::Float);
    });

    let theirs: serde_json::Value = serde_json::from_str(
        golden_script(&[
            "bench",
            dir.to_str().unwrap(),
            &BATCH.to_string(),
            &prompt.to_string(),
            &NEW.to_string(),
            &threads.to_string(),
        ])
        .trim(),
    )
    .unwrap();
    println!(
        "# tiny Qwen3, batch {BATCH}, prompt {prompt}, {NEW} new tokens, {threads} thread(s), best of 3"
    );
    for (what, ours, key) in [
        (
            "greedy",
            (BATCH * NEW) as f64 / greedy_s,
            "greedy_tokens_per_s",
        ),
        ("train", (BATCH * t) as f64 / train_s, "train_tokens_per_s"),
    ] {
        let hf = theirs[key].as_f64().unwrap();
        println!(
            "hf_{what}_tokens_per_s_{threads}t_prompt{prompt} ours {ours:.0} transformers {hf:.0} ratio {:.2}",
            ours / hf
        );
    }
}
