//! Whole-process benchmarks of the offline stages, run as a user runs them
//! (Parquet read and write included), printing `name value` lines for
//! `scripts/bench`:
//! - `process_gae_tokens_per_s`: compute-advantages, token-level GAE, on
//!   4096 responses x 1024 tokens (BENCH_RESPONSES, BENCH_TOKENS);
//! - `score_rewards_responses_per_s` and `grpo_step_rule_responses_per_s`: one
//!   thread, 20 000 one-shot plans of about 200 tokens (the latter aligns
//!   every response's tokens with its plan steps);
//! - `grpo_peak_rss_mib_1x` / `_10x` and `gae_peak_rss_mib_1x` / `_10x`: peak
//!   resident memory of compute-advantages (GRPO; token-level GAE, which
//!   streams the steps twice) on 4096 responses of 256 tokens and on ten
//!   times as many.

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
    }
}

fn step(i: usize, ids: Vec<i32>, values: bool) -> StepRow {
    let n = ids.len();
    StepRow {
        trajectory_id: format!("it0/task{:06}/d0/s{}", i / 8, i % 8),
        step_index: 0,
        prompt_ids: vec![1, 2, 3],
        response_ids: ids,
        old_logprobs: vec![-1.0; n],
        observation: None,
        old_value: None,
        old_values: values.then(|| (0..n).map(|t| ((t * 31 + i) % 97) as f32 / 97.0).collect()),
        latents: None,
        latent_dim: None,
        chosen_latent_len: None,
        old_latent_end_logprob: None,
    }
}

fn reward(i: usize) -> RewardRow {
    RewardRow {
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
    }
}

/// Runs a binary to completion; returns wall time and peak RSS (MiB, polled).
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
        std::thread::sleep(Duration::from_millis(5));
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

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // 1. compute-advantages, token-level GAE, whole process.
    let (responses, tokens) = (
        env_or("BENCH_RESPONSES", 4096),
        env_or("BENCH_TOKENS", 1024),
    );
    let gae = d.join("gae");
    write_in_chunks(
        &gae.join("rollouts"),
        TableName::Trajectories,
        responses,
        |i| trajectory(i, None),
    );
    write_in_chunks(&gae.join("rollouts"), TableName::Steps, responses, |i| {
        step(i, (0..tokens as i32).collect(), true)
    });
    write_in_chunks(&gae.join("rewards"), TableName::Rewards, responses, reward);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // One token-level GAE run of compute-advantages into `out`, one thread.
    let gae_run = |out: &Path, env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push(("RAYON_NUM_THREADS", "1"));
        measure(
            "compute-advantages",
            &[
                "--input",
                &s(&gae.join("rollouts")),
                "--input",
                &s(&gae.join("rewards")),
                "--out",
                &s(out),
                "--set",
                "estimator=gae",
            ],
            &env,
        )
        .0
    };
    let secs = gae_run(&gae.join("adv"), &[]);
    println!(
        "process_gae_tokens_per_s {:.0}",
        (responses * tokens) as f64 / secs
    );
    // The cost of checking every shard's BLAKE3 as it is read: the same run
    // with the check off, alternating, best of five each (warmed up above).
    let mut best = [f64::INFINITY; 2];
    for round in 0..10 {
        let verify = round % 2;
        let out = gae.join(format!("adv-verify{round}"));
        let flag = if verify == 1 { "1" } else { "0" };
        let secs = gae_run(&out, &[("EMBODYFLOW_VERIFY_HASHES", flag)]);
        best[verify] = best[verify].min(secs);
        std::fs::remove_dir_all(&out).unwrap();
    }
    println!("process_gae_s_hash_check_off {:.3}", best[0]);
    println!("process_gae_s_hash_check_on {:.3}", best[1]);
    println!(
        "hash_check_on_read_overhead_pct {:.1}",
        100.0 * (best[1] / best[0] - 1.0)
    );

    // 2. score-rewards and grpo_step rule on ~200-token plans, one thread.
    let plans = 20_000;
    let tokenizer = test_tokenizer();
    let p = d.join("plans");
    std::fs::create_dir_all(&p).unwrap();
    tokenizer.save(p.join("tokenizer.json"), false).unwrap();
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
    write_in_chunks(&p.join("rollouts"), TableName::Trajectories, plans, |i| {
        trajectory(i, Some(plan_text(i)))
    });
    let mean_tokens = (0..64)
        .map(|i| {
            tokenizer
                .encode(plan_text(i).as_str(), false)
                .unwrap()
                .len()
        })
        .sum::<usize>()
        / 64;
    write_in_chunks(&p.join("rollouts"), TableName::Steps, plans, |i| {
        let ids = tokenizer
            .encode(plan_text(i).as_str(), false)
            .unwrap()
            .get_ids()
            .iter()
            .map(|&t| t as i32)
            .collect();
        step(i, ids, false)
    });
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
    let set_tokenizer = format!("step.tokenizer={}", s(&p.join("tokenizer.json")));
    let (secs, _) = measure(
        "compute-advantages",
        &[
            "--input",
            &s(&p.join("rollouts")),
            "--input",
            &s(&p.join("rewards")),
            "--out",
            &s(&p.join("adv")),
            "--set",
            "estimator=grpo_step",
            "--set",
            &set_tokenizer,
        ],
        &[("RAYON_NUM_THREADS", "1")],
    );
    println!("grpo_step_rule_responses_per_s {:.0}", plans as f64 / secs);

    // 3. Peak memory of compute-advantages (GRPO, then token-level GAE) on 1x
    // and 10x the rows.
    for (label, count) in [("1x", 4096usize), ("10x", 40_960)] {
        let m = d.join(format!("mem{label}"));
        write_in_chunks(&m.join("rollouts"), TableName::Trajectories, count, |i| {
            trajectory(i, None)
        });
        write_in_chunks(&m.join("rollouts"), TableName::Steps, count, |i| {
            step(i, (0..256).collect(), true)
        });
        write_in_chunks(&m.join("rewards"), TableName::Rewards, count, reward);
        for estimator in ["grpo", "gae"] {
            let (_, peak) = measure(
                "compute-advantages",
                &[
                    "--input",
                    &s(&m.join("rollouts")),
                    "--input",
                    &s(&m.join("rewards")),
                    "--out",
                    &s(&m.join(format!("adv-{estimator}"))),
                    "--set",
                    &format!("estimator={estimator}"),
                ],
                &[],
            );
            println!("{estimator}_peak_rss_mib_{label} {peak:.1}");
        }
        std::fs::remove_dir_all(&m).unwrap();
    }
}
