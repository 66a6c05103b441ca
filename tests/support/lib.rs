//! Helpers for the integration tests: find the workspace's built binaries,
//! run them, and forge shards with one chosen defect.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow::array::RecordBatch;
use embodyflow_core::manifest::{Manifest, ShardEntry};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

/// The tiny VLA of the closed-loop tests, as `init-policy --set` values: 32 × 32
/// images in 8 × 8 patches, chunks of 8, width 32, one block, a 300-token
/// tokenizer trained on 200 tabletop instructions.
pub const TINY_VLA: [&str; 8] = [
    "kind=vla",
    "tokenizer.vocab_size=300",
    "tokenizer.corpus_tasks=200",
    "vla.max_instruction=48",
    "vla.n_embd=32",
    "vla.n_head=2",
    "vla.n_layer=1",
    "vla.chunk_len=8",
];

/// `init-policy` arguments writing the [`TINY_VLA`] to `out` (seed 0).
pub fn tiny_vla_init(out: &str) -> Vec<&str> {
    let mut args = vec!["--out", out, "--seed", "0"];
    for set in TINY_VLA {
        args.extend(["--set", set]);
    }
    args
}

/// `update-policy --policy POLICY --input …  --out OUT --seed 3 --set …`.
pub fn update_policy(policy: &Path, inputs: &[&Path], out: &Path, sets: &[&str]) -> Run {
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let mut args = vec!["--policy".into(), path(policy), "--out".into(), path(out)];
    args.extend(["--seed".into(), "3".into()]);
    for input in inputs {
        args.extend(["--input".into(), path(input)]);
    }
    for set in sets {
        args.extend(["--set".into(), set.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("update-policy", &args)
}

/// `count` generated tabletop train tasks (seed 1) in `root/tasks` and the
/// [`TINY_VLA`] in `root/vla`: the start of the closed-loop tests.
pub fn tabletop_tasks_and_tiny_vla(root: &Path, count: usize) {
    let tasks = root.join("tasks");
    let count = format!("count={count}");
    let tasks_args = [
        "--out",
        tasks.to_str().unwrap(),
        "--seed",
        "1",
        "--set",
        "env=tabletop",
        "--set",
        &count,
    ];
    let vla = root.join("vla");
    for (stage, args) in [
        ("generate-tasks", tasks_args.to_vec()),
        ("init-policy", tiny_vla_init(vla.to_str().unwrap())),
    ] {
        let result = run(stage, &args);
        assert_eq!(result.code, 0, "{stage} {args:?}\n{result}");
    }
}

/// The `init-policy` flags of the tests' tiny policy (one layer of width 32,
/// a 400-token BPE vocabulary, 1 024 positions): it trains and samples in
/// seconds on a CPU and fits the household prompts.
pub const TINY_POLICY: [&str; 12] = [
    "--set",
    "model.n_embd=32",
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_head=2",
    "--set",
    "model.n_ctx=1024",
    "--set",
    "tokenizer.vocab_size=400",
    "--set",
    "tokenizer.corpus_tasks=60",
];

/// Path of a workspace binary built in the same profile as this test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --release --workspace` first",
        path.display()
    );
    path
}

/// The output of a finished command, with its exit code.
pub struct Run {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs binary `name` with `args` and captures everything.
pub fn run(name: &str, args: &[&str]) -> Run {
    run_with_env(name, args, &[])
}

/// Runs binary `name` with `args` and extra environment variables.
pub fn run_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    Command::new(bin(name))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("spawn binary")
        .into()
}

/// Runs `scripts/NAME` with `args` and extra environment variables, its
/// `BIN` the workspace binaries this test runs, and captures everything.
pub fn run_script(name: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name);
    let bin_dir = bin("pipeline").parent().expect("a directory").to_path_buf();
    Command::new(script)
        .args(args)
        .env("BIN", bin_dir)
        .envs(env.iter().copied())
        .output()
        .expect("spawn script")
        .into()
}

/// Replaces the first shard of the table at `table_dir` with `batch`, written
/// as plain Parquet with the given key-value metadata, and rewrites the
/// manifest so that sizes and hashes agree: only the defect in the batch or
/// metadata remains for the reader to find.
pub fn forge_first_shard(table_dir: &Path, batch: &RecordBatch, metadata: &[(&str, &str)]) {
    let mut manifest = Manifest::read(table_dir).expect("valid table to forge");
    let file = &manifest.shards[0].file;
    let path = table_dir.join(file);
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(
            metadata
                .iter()
                .map(|(k, v)| KeyValue::new(k.to_string(), v.to_string()))
                .collect(),
        ))
        .build();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let mut hasher = embodyflow_core::shard_hash::TreeHasher::default();
    hasher.update(&bytes);
    let (hash, blocks) = hasher.finish();
    manifest.shards[0] = ShardEntry {
        file: file.clone(),
        rows: batch.num_rows() as u64,
        bytes: bytes.len() as u64,
        hash: hash.to_hex().to_string(),
        blocks: embodyflow_core::shard_hash::to_hex(&blocks),
    };
    reseal(table_dir, manifest);
}

/// Rewrites a manifest after its shard list changed, with consistent totals.
pub fn reseal(table_dir: &Path, mut manifest: Manifest) {
    manifest.num_rows = manifest.shards.iter().map(|s| s.rows).sum();
    manifest.content_hash =
        Manifest::compute_content_hash(&manifest.table, manifest.schema_version, &manifest.shards);
    manifest.write(table_dir).unwrap();
}

/// A small rollout set: `scores[g]` are the scores of group g's samples; every
/// trajectory has `steps` decision steps of `tokens` response tokens, with a
/// value per step and per token. Writes `dir/rollouts/{trajectories,steps}`
/// and `dir/rewards/rewards` and returns those two directories.
pub fn rollout_set(
    dir: &Path,
    scores: &[Vec<f32>],
    steps: usize,
    tokens: usize,
) -> (PathBuf, PathBuf) {
    use embodyflow_core::dataset::{TableWriter, WriteOptions};
    use embodyflow_core::schemas::{RewardRow, StepRow, TrajectoryRow};
    let mut trajectories = Vec::new();
    let mut step_rows = Vec::new();
    let mut rewards = Vec::new();
    for (g, group) in scores.iter().enumerate() {
        let group_id = format!("it0/task{g:03}/d0");
        for (s, &score) in group.iter().enumerate() {
            let trajectory_id = format!("{group_id}/s{s}");
            trajectories.push(TrajectoryRow {
                source_row: None,
                infra_fault: None,
                failure_reason: None,
                trajectory_id: trajectory_id.clone(),
                group_id: group_id.clone(),
                task_id: format!("task{g:03}"),
                sample_index: s as i32,
                iteration: 0,
                policy: "test".into(),
                temperature: 1.0,
                num_steps: steps as i32,
                env_steps: steps as i32,
                complete: score > 0.0,
                response_text: None,
                seed: s as i64,
                ever_grasped: None,
            });
            for k in 0..steps {
                step_rows.push(StepRow {
                    anchor_key: None,
                    response_mask: None,
                    trajectory_id: trajectory_id.clone(),
                    step_index: k as i32,
                    prompt_ids: vec![1, 2, 3],
                    response_ids: (0..tokens as i32).collect(),
                    old_logprobs: vec![-1.0; tokens],
                    observation: None,
                    old_value: Some(0.1 * (k as f32 + 1.0) + 0.01 * s as f32),
                    old_values: Some(
                        (0..tokens)
                            .map(|t| 0.05 * t as f32 + 0.01 * (k + s) as f32)
                            .collect(),
                    ),
                    latents: None,
                    latent_dim: None,
                    chosen_latent_len: None,
                    old_latent_end_logprob: None,
                });
            }
            rewards.push(RewardRow {
                infra_fault: None,
                trajectory_id,
                group_id: group_id.clone(),
                score,
                format: 0.0,
                accuracy: score,
                success: score > 0.0,
                parse_ok: true,
                pred_actions: None,
                step_match: None,
                step_valid: None,
                reward_fn: "outcome".into(),
                ever_grasped: None,
                token_rewards: None,
            });
        }
    }
    let producer = fixture_producer();
    let options = WriteOptions {
        rows_per_shard: 7,
        ..WriteOptions::default()
    };
    let rollouts = dir.join("rollouts");
    let scored = dir.join("rewards");
    let mut w = TableWriter::create(
        &rollouts,
        embodyflow_core::schemas::TableName::Trajectories,
        options,
        false,
    )
    .unwrap();
    w.write_rows(&trajectories).unwrap();
    w.finish(&producer, &[]).unwrap();
    let mut w = TableWriter::create(
        &rollouts,
        embodyflow_core::schemas::TableName::Steps,
        options,
        false,
    )
    .unwrap();
    w.write_rows(&step_rows).unwrap();
    w.finish(&producer, &[]).unwrap();
    let mut w = TableWriter::create(
        &scored,
        embodyflow_core::schemas::TableName::Rewards,
        options,
        false,
    )
    .unwrap();
    w.write_rows(&rewards).unwrap();
    w.finish(&producer, &[]).unwrap();
    (rollouts, scored)
}

/// Reads a table's rows sorted by key (trajectory_id, step_index).
pub fn read_advantages(dir: &Path) -> Vec<embodyflow_core::schemas::AdvantageRow> {
    use embodyflow_core::dataset::TableReader;
    let reader = TableReader::open(dir, embodyflow_core::schemas::TableName::Advantages).unwrap();
    let mut rows: Vec<embodyflow_core::schemas::AdvantageRow> = reader.read_rows().unwrap();
    rows.sort_by(|a, b| (&a.trajectory_id, a.step_index).cmp(&(&b.trajectory_id, b.step_index)));
    rows
}

/// The bytes of tensor `name` in the safetensors file `file`.
pub fn tensor_bytes(file: &Path, name: &str) -> Vec<u8> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (
        offsets[0]
            .as_u64()
            .unwrap_or_else(|| panic!("no tensor `{name}` in {file:?}")) as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    bytes[8 + n + start..8 + n + end].to_vec()
}

/// The producer recorded in fixture tables.
pub fn fixture_producer() -> embodyflow_core::manifest::Producer {
    embodyflow_core::manifest::Producer {
        stage: "fixture".into(),
        version: "0".into(),
        config: serde_json::json!({}),
        seed: 0,
        shard: "0/1".into(),
    }
}

/// Writes `rows` as table `R::TABLE` under `dir` (replacing it if present).
pub fn write_table<R: embodyflow_core::schemas::Row>(dir: &Path, rows: &[R]) {
    use embodyflow_core::dataset::{TableWriter, WriteOptions};
    let mut writer = TableWriter::create(dir, R::TABLE, WriteOptions::default(), true).unwrap();
    writer.write_rows(rows).unwrap();
    writer.finish(&fixture_producer(), &[]).unwrap();
}

/// The single step of a one-shot plan: `response_ids`, behaviour log-probs of
/// -1 and no values.
pub fn one_shot_step(
    trajectory_id: &str,
    response_ids: Vec<i32>,
) -> embodyflow_core::schemas::StepRow {
    let old_logprobs = vec![-1.0; response_ids.len()];
    embodyflow_core::schemas::StepRow::one_shot(
        trajectory_id.to_string(),
        vec![1],
        response_ids,
        old_logprobs,
    )
}
