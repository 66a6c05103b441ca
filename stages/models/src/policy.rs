//! Running a policy on token sequences: batched sampling with a key/value
//! cache, and the per-token log-probs the update recomputes.
//!
//! Both use one layout, so the log-probs the sampler records and the ones the
//! update recomputes come from the same positions and masks (the PPO ratio
//! starts at 1): prompts are left-padded to a common length `L` and every
//! row's real tokens start at position 0; attention is causal, never reaches a
//! pad key, and a pad query attends to itself only (a fully masked row would
//! be NaN). Responses start at column `L`.
//!
//! Sampling: logits of the last position are divided by the temperature `T`,
//! `log p = log_softmax(logits / T)`, and each row draws its token from its
//! own ChaCha8 stream seeded by the rollout's seed (inverse CDF; with `top_p <
//! 1` from the smallest set of tokens whose probability reaches `top_p`,
//! renormalised). The recorded log-prob is `log p` of the drawn token under
//! the full `logits / T` distribution, as veRL's actor recomputes it. Greedy
//! decoding takes the arg max and records `log_softmax(logits)`. A row stops
//! after writing `<|eos|>` or `max_new_tokens`; finished rows leave the batch
//! (the cache keeps only the running rows) once a quarter of it is done.
//! Identical prompts in a batch (a group's G samples) are encoded once.
//!
//! ```no_run
//! use embodyflow_models::{checkpoint::Checkpoint, policy::{sample, Sampling}};
//! let policy = Checkpoint::load("ckpt".as_ref(), tch::Device::Cpu).unwrap();
//! let prompts = vec![vec![5, 9, 1], vec![7, 1]];
//! let out = sample(&policy, &prompts, &[11, 12], &Sampling { temperature: 1.6, top_p: 1.0, max_new_tokens: 64 });
//! assert_eq!(out[0].response_ids.len(), out[0].logprobs.len());
//! ```

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::checkpoint::Checkpoint;

/// How to draw responses.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 means greedy.
    pub temperature: f64,
    /// Nucleus mass (1 = the whole distribution).
    pub top_p: f64,
    /// Most tokens per response (also bounded by the model's context).
    pub max_new_tokens: usize,
}

/// One sampled response.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The response's token ids (ending with `<|eos|>` unless cut at the limit).
    pub response_ids: Vec<i32>,
    /// Log-prob of each response token under `logits / T`.
    pub logprobs: Vec<f32>,
}

/// Left-pads `prompts` into `[batch, width]` ids; returns them with each
/// row's pad count.
fn left_padded(prompts: &[&[i32]], width: usize, pad: i32) -> (Vec<i64>, Vec<i64>) {
    let mut ids = Vec::with_capacity(prompts.len() * width);
    let mut pads = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let pad_count = width - prompt.len();
        pads.push(pad_count as i64);
        ids.extend(std::iter::repeat_n(pad as i64, pad_count));
        ids.extend(prompt.iter().map(|&id| id as i64));
    }
    (ids, pads)
}

/// Positions `[batch, time]` of columns `start..start + time`: column minus
/// the row's pad count, never below 0.
fn positions(pads: &Tensor, start: i64, time: i64) -> Tensor {
    let columns = Tensor::arange_start(start, start + time, (Kind::Int64, pads.device()));
    (columns.unsqueeze(0) - pads.unsqueeze(1)).clamp_min(0)
}

/// Attention mask `[batch, 1, time, time]` of a full left-padded forward pass.
fn prefix_mask(pads: &Tensor, time: i64) -> Tensor {
    let device = pads.device();
    let columns = Tensor::arange(time, (Kind::Int64, device));
    let causal = columns.unsqueeze(1).ge_tensor(&columns.unsqueeze(0)); // [q, k]: k <= q
    let key_valid = columns.unsqueeze(0).ge_tensor(&pads.unsqueeze(1)); // [b, k]
    let diagonal = Tensor::eye(time, (Kind::Bool, device));
    (causal.unsqueeze(0).logical_and(&key_valid.unsqueeze(1)))
        .logical_or(&diagonal.unsqueeze(0))
        .unsqueeze(1)
}

/// Draws responses for `prompts` (each ending with `<|plan|>`), one stream per
/// row seeded by `seeds[row]`.
pub fn sample(
    policy: &Checkpoint,
    prompts: &[Vec<i32>],
    seeds: &[u64],
    sampling: &Sampling,
) -> Vec<Sampled> {
    assert_eq!(prompts.len(), seeds.len(), "one seed per prompt");
    if prompts.is_empty() {
        return Vec::new();
    }
    tch::no_grad(|| sample_batch(policy, prompts, seeds, sampling))
}

fn sample_batch(
    policy: &Checkpoint,
    prompts: &[Vec<i32>],
    seeds: &[u64],
    sampling: &Sampling,
) -> Vec<Sampled> {
    let model = &policy.model;
    let device = policy.vars.device();
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let n_ctx = model.config().n_ctx as usize;
    assert!(
        width < n_ctx,
        "prompt of {width} tokens leaves no room in n_ctx {n_ctx}"
    );
    let max_new = sampling.max_new_tokens.min(n_ctx - width);
    // Identical prompts (the G samples of a group) are encoded once and
    // their cache rows copied.
    let mut unique: Vec<&[i32]> = Vec::new();
    let mut index_of: HashMap<&[i32], i64> = HashMap::new();
    let rows: Vec<i64> = prompts
        .iter()
        .map(|prompt| {
            *index_of.entry(prompt.as_slice()).or_insert_with(|| {
                unique.push(prompt.as_slice());
                unique.len() as i64 - 1
            })
        })
        .collect();
    let (ids, pads) = left_padded(&unique, width, policy.special.pad);
    let width = width as i64;
    let ids = Tensor::from_slice(&ids)
        .view([unique.len() as i64, width])
        .to(device);
    let pads = Tensor::from_slice(&pads).to(device);
    let mut cache = model.empty_cache(unique.len() as i64, width + max_new as i64);
    let hidden = model.hidden_masked(
        &ids,
        &positions(&pads, 0, width),
        &prefix_mask(&pads, width),
        Some(&mut cache),
    );
    let rows = Tensor::from_slice(&rows).to(device);
    let mut last = model
        .logits(&hidden.select(1, width - 1))
        .index_select(0, &rows);
    let mut pads = pads.index_select(0, &rows);
    cache.keep_rows(&rows);
    let mut outputs: Vec<Sampled> = prompts
        .iter()
        .map(|_| Sampled {
            response_ids: Vec::new(),
            logprobs: Vec::new(),
        })
        .collect();
    let mut rngs: Vec<ChaCha8Rng> = seeds
        .iter()
        .map(|&s| ChaCha8Rng::seed_from_u64(s))
        .collect();
    // Batch row -> output index, for the rows still running.
    let mut running: Vec<usize> = (0..prompts.len()).collect();
    let mut done = vec![false; prompts.len()];
    let vocab = model.config().vocab_size as usize;
    for step in 0..max_new {
        let logp = if sampling.temperature > 0.0 {
            (last / sampling.temperature).log_softmax(-1, Kind::Float)
        } else {
            last.log_softmax(-1, Kind::Float)
        };
        let logp: Vec<f32> =
            Vec::<f32>::try_from(logp.to(Device::Cpu).view([-1])).expect("f32 log-probs");
        let mut next = Vec::with_capacity(running.len());
        for (row, &out) in running.iter().enumerate() {
            if done[out] {
                next.push(policy.special.pad as i64);
                continue;
            }
            let row_logp = &logp[row * vocab..(row + 1) * vocab];
            let token = if sampling.temperature > 0.0 {
                draw(row_logp, sampling.top_p, &mut rngs[out])
            } else {
                arg_max(row_logp)
            };
            outputs[out].response_ids.push(token as i32);
            outputs[out].logprobs.push(row_logp[token]);
            next.push(token as i64);
            done[out] = token as i32 == policy.special.eos;
        }
        let still: Vec<usize> = (0..running.len())
            .filter(|&row| !done[running[row]])
            .collect();
        if still.is_empty() || step + 1 == max_new {
            break;
        }
        let mut next = Tensor::from_slice(&next).to(device);
        if still.len() * 4 <= running.len() * 3 {
            let keep =
                Tensor::from_slice(&still.iter().map(|&r| r as i64).collect::<Vec<_>>()).to(device);
            cache.keep_rows(&keep);
            pads = pads.index_select(0, &keep);
            next = next.index_select(0, &keep);
            running = still.iter().map(|&row| running[row]).collect();
        }
        let column = width + step as i64;
        let keys = Tensor::arange(column + 1, (Kind::Int64, device));
        let mask = keys
            .unsqueeze(0)
            .ge_tensor(&pads.unsqueeze(1))
            .view([-1, 1, 1, column + 1]);
        let hidden = model.hidden_masked(
            &next.unsqueeze(1),
            &positions(&pads, column, 1),
            &mask,
            Some(&mut cache),
        );
        last = model.logits(&hidden.select(1, 0));
    }
    outputs
}

/// Inverse-CDF draw from `logp`, restricted to the top-`top_p` nucleus.
fn draw(logp: &[f32], top_p: f64, rng: &mut ChaCha8Rng) -> usize {
    let u: f64 = rng.random();
    if top_p >= 1.0 {
        let mut cumulative = 0.0f64;
        for (token, &lp) in logp.iter().enumerate() {
            cumulative += (lp as f64).exp();
            if u < cumulative {
                return token;
            }
        }
        return arg_max(logp);
    }
    let mut order: Vec<usize> = (0..logp.len()).collect();
    order.sort_unstable_by(|&a, &b| logp[b].total_cmp(&logp[a]).then(a.cmp(&b)));
    let mut nucleus = 0.0f64;
    let mut size = 0;
    for &token in &order {
        nucleus += (logp[token] as f64).exp();
        size += 1;
        if nucleus >= top_p {
            break;
        }
    }
    let target = u * nucleus;
    let mut cumulative = 0.0f64;
    for &token in &order[..size] {
        cumulative += (logp[token] as f64).exp();
        if target < cumulative {
            return token;
        }
    }
    order[0]
}

fn arg_max(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Per-token results of a forward pass over prompt + response pairs, each
/// `[batch, longest response]`.
pub struct ResponseScores {
    /// Log-prob of each response token under `logits / T`.
    pub logprobs: Tensor,
    /// Entropy of the `logits / T` distribution at each response token.
    pub entropy: Tensor,
    /// 1 on real response tokens, 0 on padding (float).
    pub mask: Tensor,
}

/// Log-probs and entropies of `responses` after `prompts` under the policy at
/// temperature `temperature` (1 for supervised training), with gradients.
///
/// Each prompt + response must fit in `n_ctx`. The batch's layout is the
/// longest prompt plus the longest response; when those come from different
/// rows and do not fit together, the batch is scored in halves and the
/// results stacked (padded to the longest response), so any batch of rows
/// that fit alone can be scored.
pub fn score_responses(
    policy: &Checkpoint,
    prompts: &[&[i32]],
    responses: &[&[i32]],
    temperature: f64,
) -> ResponseScores {
    assert_eq!(prompts.len(), responses.len());
    let device = policy.vars.device();
    let batch = prompts.len() as i64;
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let longest = responses.iter().map(|r| r.len()).max().unwrap_or(0);
    if prompts.len() > 1 && width + longest > policy.model.config().n_ctx as usize {
        let half = prompts.len() / 2;
        let parts = [
            score_responses(policy, &prompts[..half], &responses[..half], temperature),
            score_responses(policy, &prompts[half..], &responses[half..], temperature),
        ];
        let stack = |pick: fn(&ResponseScores) -> &Tensor| {
            let padded: Vec<Tensor> = parts
                .iter()
                .map(|part| {
                    let t = pick(part);
                    t.constant_pad_nd([0, longest as i64 - t.size()[1]])
                })
                .collect();
            Tensor::cat(&padded, 0)
        };
        return ResponseScores {
            logprobs: stack(|s| &s.logprobs),
            entropy: stack(|s| &s.entropy),
            mask: stack(|s| &s.mask),
        };
    }
    let (ids, pads) = left_padded(prompts, width, policy.special.pad);
    let total = width + longest;
    // Append each response after its prompt row, right-padded.
    let mut sequences = Vec::with_capacity(prompts.len() * total);
    let mut mask = Vec::with_capacity(prompts.len() * longest);
    for (row, response) in responses.iter().enumerate() {
        sequences.extend_from_slice(&ids[row * width..(row + 1) * width]);
        sequences.extend(response.iter().map(|&id| id as i64));
        sequences.extend(std::iter::repeat_n(
            policy.special.pad as i64,
            longest - response.len(),
        ));
        mask.extend(std::iter::repeat_n(1.0f32, response.len()));
        mask.extend(std::iter::repeat_n(0.0f32, longest - response.len()));
    }
    let (width, longest, total) = (width as i64, longest as i64, total as i64);
    let sequences = Tensor::from_slice(&sequences)
        .view([batch, total])
        .to(device);
    let pads = Tensor::from_slice(&pads).to(device);
    let inputs = sequences.narrow(1, 0, total - 1);
    let hidden = policy.model.hidden_masked(
        &inputs,
        &positions(&pads, 0, total - 1),
        &prefix_mask(&pads, total - 1),
        None,
    );
    // The hidden state at column c predicts the token at column c + 1; only
    // the response's predictions need logits.
    let response_logits = policy.model.logits(&hidden.narrow(1, width - 1, longest)) / temperature;
    let log_probs = response_logits.log_softmax(-1, Kind::Float);
    let targets = sequences.narrow(1, width, longest);
    let logprobs = log_probs
        .gather(2, &targets.unsqueeze(2), false)
        .squeeze_dim(2);
    let entropy = -(log_probs.exp() * &log_probs).sum_dim_intlist(-1, false, Kind::Float);
    ResponseScores {
        logprobs,
        entropy,
        mask: Tensor::from_slice(&mask).view([batch, longest]).to(device),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared tiny policy with a context of 48 tokens.
    fn tiny_policy() -> Checkpoint {
        crate::testing::tiny_policy(48)
    }

    fn prompts() -> Vec<Vec<i32>> {
        // The last row repeats the first, as a group's samples do.
        vec![
            vec![5, 9, 12, 30, 1],
            vec![7, 1],
            vec![40, 41, 42, 1],
            vec![5, 9, 12, 30, 1],
        ]
    }

    #[test]
    fn sampled_logprobs_match_the_recomputed_ones() {
        let policy = tiny_policy();
        let sampling = Sampling {
            temperature: 1.6,
            top_p: 1.0,
            max_new_tokens: 20,
        };
        let samples = sample(&policy, &prompts(), &[1, 2, 3, 4], &sampling);
        let responses: Vec<&[i32]> = samples.iter().map(|s| s.response_ids.as_slice()).collect();
        let prompts = prompts();
        let prompt_refs: Vec<&[i32]> = prompts.iter().map(Vec::as_slice).collect();
        let scores = tch::no_grad(|| score_responses(&policy, &prompt_refs, &responses, 1.6));
        for (row, sampled) in samples.iter().enumerate() {
            assert!(!sampled.response_ids.is_empty());
            let recomputed: Vec<f32> = Vec::<f32>::try_from(
                scores
                    .logprobs
                    .get(row as i64)
                    .narrow(0, 0, sampled.logprobs.len() as i64),
            )
            .unwrap();
            for (a, b) in sampled.logprobs.iter().zip(&recomputed) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "row {row}: sampled {a} vs recomputed {b}"
                );
            }
            let mask_sum = scores
                .mask
                .get(row as i64)
                .sum(Kind::Float)
                .double_value(&[]);
            assert_eq!(mask_sum as usize, sampled.response_ids.len());
        }
    }

    #[test]
    fn a_batch_wider_than_n_ctx_is_scored_in_parts() {
        let policy = tiny_policy();
        // 30 + 6 and 6 + 30 tokens fit n_ctx = 48 alone; together the layout
        // would be 30 + 30.
        let long: Vec<i32> = (0..30).map(|i| 5 + i % 50).collect();
        let short: Vec<i32> = vec![7, 1, 9, 12, 30, 1];
        let prompts: [&[i32]; 3] = [&long, &short, &short];
        let responses: [&[i32]; 3] = [&short, &long, &short[..2]];
        let together = tch::no_grad(|| score_responses(&policy, &prompts, &responses, 1.0));
        assert_eq!(together.logprobs.size(), vec![3, 30]);
        for row in 0..3 {
            let alone = tch::no_grad(|| {
                score_responses(&policy, &prompts[row..=row], &responses[row..=row], 1.0)
            });
            let n = responses[row].len() as i64;
            let a = Vec::<f32>::try_from(alone.logprobs.get(0)).unwrap();
            let b =
                Vec::<f32>::try_from(together.logprobs.get(row as i64).narrow(0, 0, n)).unwrap();
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-4, "row {row}: {x} vs {y}");
            }
            let mask = together
                .mask
                .get(row as i64)
                .sum(Kind::Float)
                .double_value(&[]);
            assert_eq!(mask as i64, n);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sample_whatever_the_batch() {
        let policy = tiny_policy();
        let sampling = Sampling {
            temperature: 1.0,
            top_p: 0.9,
            max_new_tokens: 12,
        };
        let together = sample(&policy, &prompts(), &[4, 5, 6, 7], &sampling);
        let alone = sample(&policy, &prompts()[1..2], &[5], &sampling);
        assert_eq!(together[1].response_ids, alone[0].response_ids);
        let repeated = sample(&policy, &prompts()[..1], &[7], &sampling);
        assert_eq!(together[3].response_ids, repeated[0].response_ids);
    }

    #[test]
    fn greedy_stops_at_the_limit_or_at_eos() {
        let policy = tiny_policy();
        let sampling = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 7,
        };
        for sampled in sample(&policy, &prompts(), &[0, 0, 0, 0], &sampling) {
            let eos_at = sampled
                .response_ids
                .iter()
                .position(|&t| t == policy.special.eos);
            match eos_at {
                Some(i) => assert_eq!(i + 1, sampled.response_ids.len()),
                None => assert_eq!(sampled.response_ids.len(), 7),
            }
        }
    }
}
