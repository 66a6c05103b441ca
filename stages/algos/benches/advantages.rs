//! Throughput of the GRPO and GAE kernels on one thread, at the size of the
//! offline-core issue: 4096 responses x 1024 tokens in groups of 8.
//! Prints `name tokens_per_s` lines that `scripts/bench` compares with veRL.
//! Size overrides: BENCH_RESPONSES, BENCH_TOKENS.

use std::hint::black_box;
use std::time::Instant;

use embodyflow_algos::gae::{GaeParams, gae_tokens, whiten};
use embodyflow_algos::grpo::{GroupNorm, episode_advantages};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Best of `repeats` timings, in seconds.
fn best_of(repeats: usize, mut f: impl FnMut()) -> f64 {
    (0..repeats)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let responses = env_or("BENCH_RESPONSES", 4096);
    let tokens = env_or("BENCH_TOKENS", 1024);
    let total = responses * tokens;
    // Deterministic pseudo-random inputs (xorshift).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let scores: Vec<f32> = (0..responses)
        .map(|_| if next() > 0.5 { 1.0 } else { 0.0 })
        .collect();
    let groups: Vec<u32> = (0..responses as u32).map(|i| i / 8).collect();
    let values: Vec<f32> = (0..total).map(|_| next() - 0.5).collect();
    let mut rewards = vec![0f32; total];
    for r in 0..responses {
        rewards[(r + 1) * tokens - 1] = scores[r];
    }
    let offsets: Vec<usize> = (0..=responses).map(|r| r * tokens).collect();

    // GRPO: group statistics, then the advantage broadcast to every token.
    let grpo = best_of(5, || {
        let adv = episode_advantages(black_box(&scores), black_box(&groups), GroupNorm::default());
        let mut out = Vec::with_capacity(total);
        for &a in &adv {
            out.resize(out.len() + tokens, a);
        }
        black_box(out);
    });
    // GAE: the recurrence over every row, then whitening over the batch.
    let gae = best_of(5, || {
        let (mut adv, ret) = gae_tokens(
            black_box(&rewards),
            black_box(&values),
            &offsets,
            GaeParams::default(),
        );
        whiten(&mut adv).unwrap();
        black_box((adv, ret));
    });
    let recurrence = best_of(5, || {
        black_box(gae_tokens(
            black_box(&rewards),
            black_box(&values),
            &offsets,
            GaeParams::default(),
        ));
    });
    let mut scratch = values.clone();
    let whitening = best_of(5, || {
        whiten(black_box(&mut scratch)).unwrap();
    });
    println!("shape {responses}x{tokens}");
    println!("gae_recurrence {:.0}", total as f64 / recurrence);
    println!("gae_whiten {:.0}", total as f64 / whitening);
    println!("grpo_kernel {:.0}", total as f64 / grpo);
    println!("gae_kernel {:.0}", total as f64 / gae);
}
