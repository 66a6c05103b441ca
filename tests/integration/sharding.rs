//! Sharding merges to the unsharded tables exactly: every shardable stage
//! (collect-rollouts, score-rewards, judge-steps, teacher-logp,
//! compute-advantages, evaluate) run whole and as 2 or 3 `--shard` processes
//! whose outputs `table merge` joins gives the same content hash, producer
//! and lineage per table (compute-advantages under grpo, gae at both levels
//! and grpo_step); collect-rollouts' shards split one draw; the
//! runner's merged step leaves the next step's cache key unchanged; and
//! `table merge` refuses parts that are not the shards of one run.

use std::path::{Path, PathBuf};

use embodyflow_core::dataset::TableReader;
use embodyflow_core::manifest::Manifest;
use embodyflow_core::schemas::{StepRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_tests::{TINY_POLICY, run, write_table};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

/// Train and val tasks and a tiny untrained policy under `root`.
fn prepare(root: &Path) {
    for (split, seed, count) in [("train", "1", "10"), ("val", "2", "4")] {
        ok(
            "generate-tasks",
            &[
                "--out",
                s(&root.join("data").join(split)),
                "--seed",
                seed,
                "--set",
                &format!("split={split}"),
                "--set",
                &format!("count={count}"),
            ],
        );
    }
    let init_dir = root.join("init");
    let mut init = vec!["--out", s(&init_dir)];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
}

/// The table names (subdirectories with a manifest) in `dir`, sorted.
fn tables_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| Manifest::read(&e.path()).is_ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs `stage ARGS --out DIR/whole`, then as `count` processes `--shard
/// i/count --out DIR/_shards/i`, merges those with `table merge DIR/merged
/// …`, and checks every table of the whole run against the merge: same
/// content hash, shards, producer and lineage, rows split among the parts.
/// Returns the whole run's directory.
fn sharded_equals_whole(stage: &str, args: &[&str], dir: &Path, count: u32) -> PathBuf {
    let whole = dir.join("whole");
    let with_out = |out: &Path, shard: Option<String>| {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--out".to_string(), s(out).to_string()]);
        if let Some(shard) = shard {
            all.extend(["--shard".to_string(), shard]);
        }
        all
    };
    let call = |all: Vec<String>| {
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        ok(stage, &refs)
    };
    call(with_out(&whole, None));
    let parts: Vec<PathBuf> = (0..count)
        .map(|i| dir.join("_shards").join(i.to_string()))
        .collect();
    for (i, part) in parts.iter().enumerate() {
        call(with_out(part, Some(format!("{i}/{count}"))));
    }
    let merged = dir.join("merged");
    let mut merge = vec!["merge", s(&merged)];
    merge.extend(parts.iter().map(|p| s(p)));
    let printed = ok("table", &merge);
    let tables = tables_in(&whole);
    assert!(!tables.is_empty(), "{stage} wrote no table");
    assert_eq!(tables_in(&merged), tables, "{printed}");
    for table in &tables {
        let a = Manifest::read(&whole.join(table)).unwrap();
        let b = Manifest::read(&merged.join(table)).unwrap();
        let context = format!("{stage} {args:?} as {count} shards: table `{table}`");
        assert_eq!(a.content_hash, b.content_hash, "{context}");
        assert_eq!(a.shards, b.shards, "{context}");
        assert_eq!(a.producer, b.producer, "{context}");
        assert_eq!(a.inputs, b.inputs, "{context}");
        let part_rows: Vec<u64> = parts
            .iter()
            .map(|p| Manifest::read(&p.join(table)).unwrap().num_rows)
            .collect();
        assert_eq!(part_rows.iter().sum::<u64>(), a.num_rows, "{context}");
        if a.num_rows >= 8 {
            assert!(
                part_rows.iter().filter(|&&r| r > 0).count() >= 2,
                "{context}: every row in one part {part_rows:?}"
            );
        }
        assert!(
            printed.contains(&format!("content hash {}", a.content_hash)),
            "{printed}"
        );
    }
    whole
}

/// The number in a summary line `| key | N … |`.
fn summary_count(text: &str, key: &str) -> usize {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("| {key} |")))
        .unwrap_or_else(|| panic!("no `{key}` in\n{text}"));
    line.split('|')
        .nth(2)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn model_stages_merge_to_their_unsharded_tables() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let init = root.join("init");
    let train = root.join("data/train");
    let collect = [
        "--policy",
        s(&init),
        "--input",
        s(&train),
        "--seed",
        "7",
        "--set",
        "group_size=3",
        "--set",
        "tasks_per_iteration=5",
        "--set",
        "max_new_tokens=24",
        "--set",
        "batch_rows=4",
        "--set",
        "output.rows_per_shard=4",
        "--set",
        "output.row_group_rows=3",
    ];
    let rollouts = sharded_equals_whole("collect-rollouts", &collect, &root.join("collect"), 2);
    // The shards split the 5 drawn groups; they do not draw 5 each.
    let trajectories: Vec<TrajectoryRow> =
        TableReader::open(&rollouts.join("trajectories"), TableName::Trajectories)
            .unwrap()
            .read_rows()
            .unwrap();
    assert_eq!(trajectories.len(), 5 * 3);
    let groups: std::collections::BTreeSet<&str> =
        trajectories.iter().map(|t| t.group_id.as_str()).collect();
    assert_eq!(groups.len(), 5);
    let ids: Vec<&str> = trajectories
        .iter()
        .map(|t| t.trajectory_id.as_str())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "rows are stored in key order");

    // Dynamic sampling: a slot draws again while its groups are all-equal;
    // the shards' draws add up to the unsharded run's.
    let mut dynamic: Vec<&str> = collect.to_vec();
    dynamic.extend([
        "--set",
        "dynamic_sampling.enabled=true",
        "--set",
        "dynamic_sampling.max_extra_draws=4",
    ]);
    let dyn_dir = root.join("dynamic");
    sharded_equals_whole("collect-rollouts", &dynamic, &dyn_dir, 3);
    let draws = |dir: &Path| {
        summary_count(
            &std::fs::read_to_string(dir.join("_summary.collect-rollouts.md")).unwrap(),
            "task draws",
        )
    };
    let whole_draws = draws(&dyn_dir.join("whole"));
    assert!((5..=9).contains(&whole_draws), "{whole_draws}");
    let shard_draws: usize = (0..3)
        .map(|i| draws(&dyn_dir.join("_shards").join(i.to_string())))
        .sum();
    assert_eq!(shard_draws, whole_draws);

    sharded_equals_whole(
        "teacher-logp",
        &[
            "--policy",
            s(&init),
            "--teacher",
            "self",
            "--input",
            s(&rollouts),
            "--input",
            s(&train),
            "--set",
            "batch_rows=3",
        ],
        &root.join("teacher"),
        2,
    );
    sharded_equals_whole(
        "evaluate",
        &[
            "--policy",
            s(&init),
            "--input",
            s(&root.join("data/val")),
            "--set",
            "runs=2",
            "--set",
            "max_new_tokens=24",
            "--set",
            "batch_rows=3",
        ],
        &root.join("eval"),
        3,
    );
}

/// Rollouts with known answers for the first `groups` train tasks, 3
/// samples each: the expert plan, the plan with its second action id
/// wrong, and the first action alone; with values for GAE.
fn fixture_rollouts(root: &Path, groups: usize) -> PathBuf {
    let tasks: Vec<TaskRow> = TableReader::open(&root.join("data/train/tasks"), TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap();
    let tokenizer = tokenizers::Tokenizer::from_file(root.join("init/tokenizer.json")).unwrap();
    let encode = |text: &str| -> Vec<i32> {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        ids.into_iter().map(|id| id as i32).collect()
    };
    let (mut trajectories, mut steps) = (Vec::new(), Vec::new());
    for task in tasks.iter().take(groups) {
        let actions = task.gt_actions.as_ref().unwrap();
        for sample in 0..3usize {
            let kept = if sample == 2 { 1 } else { actions.len() };
            let executable: Vec<serde_json::Value> = actions[..kept]
                .iter()
                .enumerate()
                .map(|(k, a)| {
                    let id = if sample == 1 && k == 1 {
                        9_999
                    } else {
                        a.action_id
                    };
                    serde_json::json!({"action_id": id, "action_name": a.action_name})
                })
                .collect();
            let names: Vec<&str> = actions.iter().map(|a| a.action_name.as_str()).collect();
            let answer = serde_json::json!({"language_plan": names, "executable_plan": executable});
            let group_id = format!("it0/{}/d0", task.task_id);
            let trajectory_id = format!("{group_id}/s{sample}");
            let prompt = encode(&format!("Task: {}\n", task.instruction));
            let response = encode(&answer.to_string());
            let logprobs = vec![-1.0; response.len()];
            // Values for GAE at both levels.
            let value = 0.1 * sample as f32 - 0.05 * (trajectories.len() % 4) as f32;
            let values = (0..response.len()).map(|k| value + 0.01 * (k % 7) as f32);
            steps.push(StepRow {
                old_value: Some(value),
                old_values: Some(values.collect()),
                ..StepRow::one_shot(trajectory_id.clone(), prompt, response, logprobs)
            });
            trajectories.push(TrajectoryRow {
                source_row: None,
                infra_fault: None,
                failure_reason: None,
                trajectory_id,
                group_id,
                task_id: task.task_id.clone(),
                sample_index: sample as i32,
                iteration: 0,
                policy: "fixture".into(),
                temperature: 1.0,
                num_steps: 1,
                env_steps: kept as i32,
                complete: sample == 0,
                response_text: Some(answer.to_string()),
                seed: 0,
                ever_grasped: None,
            });
        }
    }
    let rollouts = root.join("fixture");
    write_table(&rollouts, &trajectories);
    write_table(&rollouts, &steps);
    rollouts
}

#[test]
fn offline_stages_merge_to_their_unsharded_tables() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let init = root.join("init");
    let train = root.join("data/train");
    let rollouts = fixture_rollouts(root, 8);
    let (r, t) = (s(&rollouts), s(&train));
    let rewards = sharded_equals_whole(
        "score-rewards",
        &["--input", r, "--input", t, "--set", "reward.fn=verify"],
        &root.join("verify"),
        3,
    );
    sharded_equals_whole(
        "score-rewards",
        &[
            "--input",
            r,
            "--input",
            t,
            "--set",
            "reward.fn=embodied_r1",
            "--set",
            "reward.tolerant=true",
            "--set",
            "match.mode=lcs",
            "--set",
            "output.rows_per_shard=5",
        ],
        &root.join("r1"),
        2,
    );
    let w = s(&rewards);
    let judge = sharded_equals_whole(
        "judge-steps",
        &["--input", r, "--input", w, "--input", t],
        &root.join("judge"),
        2,
    );
    let teacher = sharded_equals_whole(
        "teacher-logp",
        &[
            "--policy",
            s(&init),
            "--teacher",
            "self",
            "--input",
            r,
            "--input",
            t,
        ],
        &root.join("teacher"),
        3,
    );
    let p = s(&init);
    for (name, sets, count) in [
        ("grpo", vec!["estimator=grpo"], 2),
        ("gae", vec!["estimator=gae", "gae.level=token"], 3),
        (
            "gae-decision",
            vec!["estimator=gae", "gae.level=decision"],
            2,
        ),
        (
            "rule",
            vec!["estimator=grpo_step", "step.kind=rule", "step.omega=0.5"],
            3,
        ),
        (
            "proxy",
            vec![
                "estimator=grpo_step",
                "step.kind=forward_proxy",
                "step.gate=prompt",
                "stepopsd.enabled=true",
            ],
            2,
        ),
    ] {
        let mut args = vec![
            "--policy",
            p,
            "--input",
            r,
            "--input",
            w,
            "--input",
            s(&teacher),
            "--input",
            s(&judge),
        ];
        for set in &sets {
            args.extend(["--set", set]);
        }
        sharded_equals_whole("compute-advantages", &args, &root.join(name), count);
    }
}

#[test]
fn table_merge_refuses_parts_that_are_not_one_runs_shards() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let rollouts = fixture_rollouts(root, 4);
    let score = |out: &Path, shard: &str, seed: &str| {
        ok(
            "score-rewards",
            &[
                "--input",
                s(&rollouts),
                "--input",
                s(&root.join("data/train")),
                "--out",
                s(out),
                "--shard",
                shard,
                "--seed",
                seed,
            ],
        )
    };
    let (a, b, c) = (root.join("a"), root.join("b"), root.join("c"));
    score(&a, "0/2", "0");
    score(&b, "1/2", "1");
    score(&c, "0/2", "0");
    let out = root.join("m");
    let (a_rewards, tasks) = (a.join("rewards"), root.join("data/train/tasks"));
    let cases: [(Vec<&Path>, &str); 5] = [
        (vec![&a, &b], "seed 1"),
        (vec![&a], "expected i/1"),
        (vec![&a, &c], "are both shard 0/2"),
        (
            vec![&a_rewards, &tasks],
            "field `table` is tasks, expected rewards",
        ),
        (
            vec![&a_rewards, &b],
            "give table directories or output directories",
        ),
    ];
    for (parts, needle) in cases {
        let mut args = vec!["merge", s(&out)];
        args.extend(parts.iter().map(|p| s(p)));
        let result = run("table", &args);
        assert_eq!(result.code, 2, "{args:?}\n{result}");
        assert!(
            result.stderr.contains(needle),
            "expected {needle}\n{result}"
        );
        assert!(!out.exists(), "nothing written: {args:?}");
    }
}

/// Tasks, a tiny policy, its rollouts, their rewards (SCORE_SHARDS
/// processes) and advantages.
const PIPELINE: &str = r#"
[[step]]
name = "train"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 10 }

[[step]]
name = "init"
stage = "init-policy"
set = { model = { n_embd = 32, n_layer = 1, n_head = 2, n_ctx = 1024 }, tokenizer = { vocab_size = 400, corpus_tasks = 60 } }

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "${init}"
inputs = ["${train}"]
seed = 3
set = { group_size = 3, max_new_tokens = 24, tasks_per_iteration = 6 }
COLLECT_SHARDS

[[step]]
name = "score"
stage = "score-rewards"
inputs = ["${collect}", "${train}"]
set = { "reward.fn" = "embodied_r1", "reward.tolerant" = true }
SCORE_SHARDS

[[step]]
name = "adv"
stage = "compute-advantages"
inputs = ["${collect}", "${score}"]
"#;

#[test]
fn the_runner_merges_shards_into_what_the_next_step_has_cached() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    let out = dir.path().join("run");
    let pipeline = |collect: u32, score: u32| {
        let text = PIPELINE
            .replace("COLLECT_SHARDS", &format!("shards = {collect}"))
            .replace("SCORE_SHARDS", &format!("shards = {score}"));
        std::fs::write(&file, text).unwrap();
        let result = run("pipeline", &["run", s(&file), "--out", s(&out)]);
        assert_eq!(result.code, 0, "{result}");
        result.stdout
    };
    let hash = |step: &str, table: &str| {
        Manifest::read(&out.join(step).join(table))
            .unwrap()
            .content_hash
    };
    pipeline(1, 1);
    let before: Vec<String> = [
        ("collect", "trajectories"),
        ("collect", "steps"),
        ("score", "rewards"),
    ]
    .iter()
    .map(|(step, table)| hash(step, table))
    .collect();
    // Both steps rerun sharded; their merged tables are the same, so the
    // advantages step is a cache hit.
    let printed = pipeline(2, 3);
    let status = |id: &str| {
        printed
            .lines()
            .filter(|l| l.starts_with('['))
            .find(|l| l.split_whitespace().any(|w| w == id))
            .unwrap_or_else(|| panic!("no step {id} in\n{printed}"))
            .to_string()
    };
    assert!(status("collect").contains("ran"), "{printed}");
    assert!(status("score").contains("ran"), "{printed}");
    assert!(status("adv").contains("cached"), "{printed}");
    let after: Vec<String> = [
        ("collect", "trajectories"),
        ("collect", "steps"),
        ("score", "rewards"),
    ]
    .iter()
    .map(|(step, table)| hash(step, table))
    .collect();
    assert_eq!(before, after);
}
