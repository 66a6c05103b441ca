//! Throughput of the default policy shape (init-policy: width 96, 4 layers) on this machine: KV-cached
//! sampling (batch 128, 400-token prompts, 150 new tokens) and training
//! (forward + backward over prompt + response, micro-batches of 16, every
//! prompt distinct, then in groups of 8 rows sharing a prompt).
//! Prints `sampling_tokens_per_s N`, `training_tokens_per_s N` and
//! `training_groups_of_8_tokens_per_s N` (response tokens per second) and
//! their `_all_tokens_per_s` (prompt tokens included, each row's counted).

use std::time::Instant;

use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::gpt::GptConfig;
use embodyflow_models::policy::{Entropy, Sampling, sample, score_responses};
use embodyflow_models::tokenizer::train_bpe;
use tch::Kind;

fn main() {
    tch::manual_seed(0);
    let corpus: Vec<String> = (0..3000)
        .map(|i| {
            format!(
                "find a Thing{} then pick up the Object{} and put it in Place{}",
                i % 97,
                i % 53,
                i % 31
            )
        })
        .collect();
    let tokenizer = train_bpe(&corpus, 768).unwrap();
    let config = GptConfig {
        vocab_size: tokenizer.get_vocab_size(true) as i64,
        n_ctx: 640,
        n_embd: 96,
        n_head: 4,
        n_layer: 4,
    };
    let policy = Checkpoint::init(&config, tokenizer, tch::Device::Cpu).unwrap();
    let vocab = config.vocab_size as i32;
    let (batch, prompt_len, new_tokens) = (128usize, 400usize, 150usize);
    let prompts: Vec<Vec<i32>> = (0..batch)
        .map(|row| {
            (0..prompt_len)
                .map(|t| 3 + ((row * 31 + t * 7) as i32 % (vocab - 3)))
                .collect()
        })
        .collect();
    let seeds: Vec<u64> = (0..batch as u64).collect();
    let prefill_only = Sampling {
        temperature: 1.6,
        top_p: 1.0,
        max_new_tokens: 1,
    };
    let started = Instant::now();
    sample(&policy, &prompts, &seeds, &prefill_only);
    let prefill_seconds = started.elapsed().as_secs_f64();
    println!(
        "prefill_tokens_per_s {:.0}",
        (batch * prompt_len) as f64 / prefill_seconds
    );
    let sampling = Sampling {
        temperature: 1.6,
        top_p: 1.0,
        max_new_tokens: new_tokens,
    };
    let started = Instant::now();
    let samples = sample(&policy, &prompts, &seeds, &sampling);
    let seconds = started.elapsed().as_secs_f64();
    let sampled: usize = samples.iter().map(|s| s.response_ids.len()).sum();
    println!("sampling_tokens_per_s {:.0}", sampled as f64 / seconds);
    println!(
        "decode_tokens_per_s {:.0}",
        sampled as f64 / (seconds - prefill_seconds)
    );

    let micro = 16usize;
    let responses: Vec<Vec<i32>> = samples.iter().map(|s| s.response_ids.clone()).collect();
    // Distinct prompts (every row its own), then groups of 8 rows sharing a
    // prompt (a GRPO group, as update-policy's micro-batches hold them).
    for (name, group) in [("training", 1usize), ("training_groups_of_8", 8)] {
        let started = Instant::now();
        let (mut response_tokens, mut all_tokens) = (0usize, 0usize);
        for chunk in 0..batch / micro {
            let rows = chunk * micro..(chunk + 1) * micro;
            let p: Vec<&[i32]> = rows
                .clone()
                .map(|row| prompts[row - row % group].as_slice())
                .collect();
            let r: Vec<&[i32]> = responses[rows].iter().map(Vec::as_slice).collect();
            let scores = score_responses(&policy, &p, &r, 1.6, Entropy::Metric);
            let loss =
                -(scores.logprobs * &scores.mask).sum(Kind::Float) / scores.mask.sum(Kind::Float);
            loss.backward();
            response_tokens += r.iter().map(|x| x.len()).sum::<usize>();
            all_tokens +=
                r.iter().map(|x| x.len()).sum::<usize>() + p.iter().map(|x| x.len()).sum::<usize>();
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{name}_tokens_per_s {:.0}",
            response_tokens as f64 / seconds
        );
        println!("{name}_all_tokens_per_s {:.0}", all_tokens as f64 / seconds);
    }
}
