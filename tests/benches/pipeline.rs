//! Whole-process benchmarks of the offline stages, run as a user runs them
//! (Parquet read and write included, one thread), printing `name value`
//! lines for `scripts/bench`:
//! - `process_gae_tokens_per_s` and `process_grpo_tokens_per_s`:
//!   compute-advantages, token-level GAE and GRPO, on 4096 responses x 1024
//!   tokens, every row full length (BENCH_RESPONSES, BENCH_TOKENS); best of
//!   three runs after a warm-up run, hash checks on (the default);
//! - `gae_peak_rss_mib_1x` / `_10x` and `grpo_peak_rss_mib_1x` / `_10x`: peak
//!   resident memory of those runs, and of the same runs on ten times as many
//!   rows of the same length;
//! - `hash_check_on_read_overhead_pct`: the GAE run with shard hash checks on
//!   vs off (alternating, best of five each);
//! - `score_rewards_responses_per_s`, `grpo_step_rule_responses_per_s` and
//!   `grpo_step_rule_word_level_responses_per_s`: one thread, 20 000 one-shot
//!   plans of about 200 tokens (grpo_step aligns every response's tokens with
//!   its plan steps: a byte-level BPE takes the prefix-sum path, a word-level
//!   vocabulary with a Metaspace decoder the re-encode path).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use embodyflow_algos::spans::test_tokenizer;
use embodyflow_core::dataset::{TableWriter, WriteOptions};
use embodyflow_core::manifest::Producer;
use embodyflow_core::schemas::{
    PlanAction, RewardRow, Row, StepRow, TableName, TaskRow, TrajectoryRow,
};
use embodyflow_tests::bin;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn producer() -> Producer {
    Producer {
        stage: "bench".into(),
        version: "0".into(),
        config: serde_json::json!({}),
        seed: 0,
        shard: "0/1".into(),
    }
}

fn write_in_chunks<R: Row>(dir: &Path, table: TableName, count: usize, make: impl Fn(usize) -> R) {
    let mut writer = TableWriter::create(dir, table, WriteOptions::default(), false).unwrap();
    let mut chunk = Vec::with_capacity(4096);
    for i in 0..count {
        chunk.push(make(i));
        if chunk.len() == 4096 {
            writer.write_rows(&chunk).unwrap();
            chunk.clear();
        }
    }
    writer.write_rows(&chunk).unwrap();
    writer.finish(&producer(), &[]).unwrap();
}

fn trajectory(i: usize, text: Option<String>) -> TrajectoryRow {
    TrajectoryRow {
        source_row: None,
        infra_fault: None,
        failure_reason: None,
        trajectory_id: format!("it0/task{:06}/d0/s{}", i / 8, i % 8),
        group_id: format!("it0/task{:06}/d0", i / 8),
        task_id: format!("task{:06}", i / 8),
        sample_index: (i % 8) as i32,
        iteration: 0,
        policy: "bench".into(),
        temperature: 1.6,
        num_steps: 1,
        env_steps: 1,
        complete: i.is_multiple_of(3),
        response_text: text,
        seed: i as i64,
        ever_grasped: None,
    }
}

/// The values a step's float columns hold: none, a short repeating pattern
/// that zstd shrinks, or uniform random floats that no codec shrinks (the
/// realistic case: a critic's values and a policy's log-probs).
#[derive(Clone, Copy, PartialEq)]
enum Floats {
    None,
    Pattern,
    Random,
}

/// A uniform float in [0, 1) from (`row`, `position`): SplitMix64.
fn uniform(row: usize, position: usize) -> f32 {
    let mut z = ((row as u64) << 32 | position as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
}

fn step(i: usize, ids: Vec<i32>, floats: Floats) -> StepRow {
    let n = ids.len();
    let (old_logprobs, old_values) = match floats {
        Floats::None => (vec![-1.0; n], None),
        Floats::Pattern => (
            vec![-1.0; n],
            Some((0..n).map(|t| ((t * 31 + i) % 97) as f32 / 97.0).collect()),
        ),
        Floats::Random => (
            (0..n).map(|t| -8.0 * uniform(2 * i, t)).collect(),
            Some((0..n).map(|t| uniform(2 * i + 1, t) - 0.5).collect()),
        ),
    };
    StepRow {
        anchor_key: None,
        response_mask: None,
        trajectory_id: format!("it0/task{:06}/d0/s{}", i / 8, i % 8),
        step_index: 0,
        prompt_ids: vec![1, 2, 3],
        response_ids: ids,
        old_logprobs,
        observation: None,
        old_value: None,
        old_values,
        latents: None,
        latent_dim: None,
        chosen_latent_len: None,
        old_latent_end_logprob: None,
    }
}

fn reward(i: usize) -> RewardRow {
    RewardRow {
        infra_fault: None,
        trajectory_id: format!("it0/task{:06}/d0/s{}", i / 8, i % 8),
        group_id: format!("it0/task{:06}/d0", i / 8),
        score: i.is_multiple_of(3) as i32 as f32,
        format: 0.0,
        accuracy: 0.0,
        success: i.is_multiple_of(3),
        parse_ok: true,
        pred_actions: None,
        step_match: None,
        step_valid: None,
        reward_fn: "outcome".into(),
        ever_grasped: None,
        token_rewards: None,
    }
}

/// Runs a binary to completion; returns wall time and peak RSS (MiB: the
/// kernel's high-water mark `VmHWM`, polled every millisecond).
/// `env` is added to the process environment (e.g. `RAYON_NUM_THREADS`).
fn measure(name: &str, args: &[&str], env: &[(&str, &str)]) -> (f64, f64) {
    let mut command = Command::new(bin(name));
    command
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let start = Instant::now();
    let mut child = command.spawn().unwrap();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status_path)
            && let Some(line) = text.lines().find(|l| l.starts_with("VmHWM:"))
        {
            let kib: u64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{name} {args:?} failed");
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (start.elapsed().as_secs_f64(), peak_kib as f64 / 1024.0)
}

fn plan_text(i: usize) -> String {
    let names = [
        "find a Mug",
        "pick up the Mug",
        "find a Sink",
        "put down the object in hand",
        "find a Apple",
        "pick up the Apple",
    ];
    let steps: Vec<String> = (0..6)
        .map(|k| {
            let id = (i + k) % names.len();
            format!(
                "{{\"action_id\": {}, \"action_name\": \"{}\"}}",
                id, names[id]
            )
        })
        .collect();
    let language: Vec<String> = (0..6)
        .map(|k| format!("\"{}\"", names[(i + k) % names.len()]))
        .collect();
    format!(
        "{{\"language_plan\": [{}], \"executable_plan\": [{}]}}<|im_end|>",
        language.join(", "),
        steps.join(", ")
    )
}

/// The GAE/GRPO input of `responses` full-length rows of `tokens` tokens:
/// rollouts (trajectories, steps with token-level values and log-probs as
/// `floats` says) and rewards.
fn write_advantage_input(dir: &Path, responses: usize, tokens: usize, floats: Floats) {
    write_in_chunks(
        &dir.join("rollouts"),
        TableName::Trajectories,
        responses,
        |i| trajectory(i, None),
    );
    write_in_chunks(&dir.join("rollouts"), TableName::Steps, responses, |i| {
        step(i, (0..tokens as i32).collect(), floats)
    });
    write_in_chunks(&dir.join("rewards"), TableName::Rewards, responses, reward);
}

/// The path as a string argument.
fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// One compute-advantages run on `dir`'s input into `out` with `estimator`,
/// one thread; returns (seconds, peak RSS in MiB). `env` is added.
fn advantages_run(dir: &Path, out: &Path, estimator: &str, env: &[(&str, &str)]) -> (f64, f64) {
    let mut env = env.to_vec();
    env.push(("RAYON_NUM_THREADS", "1"));
    let result = measure(
        "compute-advantages",
        &[
            "--input",
            &s(&dir.join("rollouts")),
            "--input",
            &s(&dir.join("rewards")),
            "--out",
            &s(out),
            "--set",
            &format!("estimator={estimator}"),
        ],
        &env,
    );
    std::fs::remove_dir_all(out).unwrap();
    result
}

/// A word-level vocabulary over `texts` (every space-separated piece, spaces
/// as Metaspace's `▁`), with a Metaspace decoder that restores the spaces and
/// `<|im_end|>` as a special token: a tokenizer that is not byte-level.
fn word_level_tokenizer(texts: impl Iterator<Item = String>) -> tokenizers::Tokenizer {
    let mut vocab: Vec<String> = vec!["<unk>".into()];
    for text in texts {
        let text = text.replace("<|im_end|>", " ");
        for (k, piece) in text.split(' ').enumerate() {
            if piece.is_empty() {
                continue;
            }
            let piece = if k == 0 {
                piece.to_string()
            } else {
                format!("\u{2581}{piece}")
            };
            if !vocab.contains(&piece) {
                vocab.push(piece);
            }
        }
    }
    let end = vocab.len();
    let vocab: serde_json::Map<String, serde_json::Value> = vocab
        .into_iter()
        .enumerate()
        .map(|(id, piece)| (piece, id.into()))
        .collect();
    let metaspace = serde_json::json!({
        "type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "never", "split": true
    });
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": end, "content": "<|im_end|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": metaspace, "post_processor": null,
        "decoder": metaspace,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    json.to_string().parse().unwrap()
}

/// Writes the plans' steps tokenized by `tokenizer` into `dir/rollouts`
/// (with their trajectories) and returns the mean tokens per plan.
fn write_plans(dir: &Path, plans: usize, tokenizer: &tokenizers::Tokenizer) -> usize {
    write_in_chunks(&dir.join("rollouts"), TableName::Trajectories, plans, |i| {
        trajectory(i, Some(plan_text(i)))
    });
    let ids = |i: usize| -> Vec<i32> {
        let encoding = tokenizer.encode(plan_text(i).as_str(), false).unwrap();
        assert_eq!(
            tokenizer.decode(encoding.get_ids(), false).unwrap(),
            plan_text(i),
            "the tokenizer round-trips the plan"
        );
        encoding.get_ids().iter().map(|&t| t as i32).collect()
    };
    write_in_chunks(&dir.join("rollouts"), TableName::Steps, plans, |i| {
        step(i, ids(i), Floats::None)
    });
    (0..64).map(|i| ids(i).len()).sum::<usize>() / 64
}

/// compute-advantages with GAE and with GRPO on `dir`'s input (`tokens`
/// response tokens in all), one thread: a warm-up run, then the best of
/// three, printed as `process_{estimator}{label}_tokens_per_s`; returns each
/// estimator's peak memory over those runs.
fn process_rates(dir: &Path, tokens: usize, label: &str) -> Vec<(&'static str, f64)> {
    let out = dir.join("out");
    let mut peaks = Vec::new();
    for estimator in ["gae", "grpo"] {
        advantages_run(dir, &out, estimator, &[]);
        let (secs, peak) = (0..3)
            .map(|_| advantages_run(dir, &out, estimator, &[]))
            .fold((f64::INFINITY, 0f64), |(s, p), (t, q)| (s.min(t), p.max(q)));
        println!(
            "process_{estimator}{label}_tokens_per_s {:.0}",
            tokens as f64 / secs
        );
        peaks.push((estimator, peak));
    }
    peaks
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // 1. compute-advantages, token-level GAE and GRPO, whole process, one
    // thread: a warm-up run, then the best of three; peak memory of the best.
    let (responses, tokens) = (
        env_or("BENCH_RESPONSES", 4096),
        env_or("BENCH_TOKENS", 1024),
    );
    let one = d.join("adv1x");
    write_advantage_input(&one, responses, tokens, Floats::Pattern);
    let out = one.join("out");
    let peaks = process_rates(&one, responses * tokens, "");
    // The cost of checking every shard's BLAKE3 as it is read: the GAE run
    // with the check off and on, alternating, best of five each.
    let mut best = [f64::INFINITY; 2];
    for round in 0..10 {
        let verify = round % 2;
        let flag = if verify == 1 { "1" } else { "0" };
        let (secs, _) = advantages_run(&one, &out, "gae", &[("EMBODYFLOW_VERIFY_HASHES", flag)]);
        best[verify] = best[verify].min(secs);
    }
    println!("process_gae_s_hash_check_off {:.3}", best[0]);
    println!("process_gae_s_hash_check_on {:.3}", best[1]);
    println!(
        "hash_check_on_read_overhead_pct {:.1}",
        100.0 * (best[1] / best[0] - 1.0)
    );
    std::fs::remove_dir_all(&one).unwrap();
    // The same on random floats (values and log-probs as a real run has
    // them), in BENCH_DATA when it is set, kept there for a peer to read.
    let random = std::env::var_os("BENCH_DATA").map_or_else(|| d.join("random"), Into::into);
    write_advantage_input(&random, responses, tokens, Floats::Random);
    process_rates(&random, responses * tokens, "_random");
    if std::env::var_os("BENCH_DATA").is_none() {
        std::fs::remove_dir_all(&random).unwrap();
    }
    // The same runs on ten times the rows (one run each: memory, not time).
    let ten = d.join("adv10x");
    write_advantage_input(&ten, 10 * responses, tokens, Floats::Pattern);
    for (estimator, peak) in peaks {
        let (_, peak10) = advantages_run(&ten, &ten.join("out"), estimator, &[]);
        println!("{estimator}_peak_rss_mib_1x {peak:.1}");
        println!("{estimator}_peak_rss_mib_10x {peak10:.1}");
    }
    std::fs::remove_dir_all(&ten).unwrap();

    // 2. score-rewards and grpo_step rule on ~200-token plans, one thread.
    let plans = 20_000;
    let p = d.join("plans");
    let gt: Vec<PlanAction> = ["find a Mug", "pick up the Mug", "find a Sink"]
        .iter()
        .enumerate()
        .map(|(id, n)| PlanAction {
            action_id: id as i64,
            action_name: n.to_string(),
        })
        .collect();
    write_in_chunks(&p.join("data"), TableName::Tasks, plans / 8, |g| TaskRow {
        task_id: format!("task{g:06}"),
        suite: "bench".into(),
        env: "household".into(),
        split: "train".into(),
        task_type: None,
        seed: g as i64,
        instruction: "bench".into(),
        observation: None,
        gt_actions: Some(gt.clone()),
    });
    let byte_level = test_tokenizer();
    let mean_tokens = write_plans(&p, plans, &byte_level);
    let (secs, _) = measure(
        "score-rewards",
        &[
            "--input",
            &s(&p.join("rollouts")),
            "--input",
            &s(&p.join("data")),
            "--out",
            &s(&p.join("rewards")),
            "--set",
            "reward.fn=verify",
        ],
        &[("RAYON_NUM_THREADS", "1")],
    );
    println!("plan_tokens_mean {mean_tokens}");
    println!("score_rewards_responses_per_s {:.0}", plans as f64 / secs);
    let word_level = word_level_tokenizer((0..6).map(plan_text));
    for (label, tokenizer) in [("", &byte_level), ("_word_level", &word_level)] {
        if !label.is_empty() {
            std::fs::remove_dir_all(p.join("rollouts")).unwrap();
            let mean = write_plans(&p, plans, tokenizer);
            println!("plan_tokens_mean{label} {mean}");
        }
        let file = p.join(format!("tokenizer{label}.json"));
        tokenizer.save(&file, false).unwrap();
        let set_tokenizer = format!("step.tokenizer={}", s(&file));
        let (secs, _) = measure(
            "compute-advantages",
            &[
                "--input",
                &s(&p.join("rollouts")),
                "--input",
                &s(&p.join("rewards")),
                "--out",
                &s(&p.join(format!("adv{label}"))),
                "--set",
                "estimator=grpo_step",
                "--set",
                &set_tokenizer,
            ],
            &[("RAYON_NUM_THREADS", "1")],
        );
        println!(
            "grpo_step_rule{label}_responses_per_s {:.0}",
            plans as f64 / secs
        );
    }
}
