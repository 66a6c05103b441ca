//! A Hugging Face decoder as the plan policy: a tiny random Qwen3 that
//! transformers saved (`scripts/hf_golden.py plan-policy`, with our
//! household tokenizer plus Qwen's chat tokens and template) goes through
//! the household loop with the stages unchanged — SFT, collect-rollouts,
//! score-rewards, compute-advantages, a PPO update, evaluate and
//! teacher-logp — and what we wrote is transformers': the prompt ids are
//! its `apply_chat_template`, the trained checkpoint loads in transformers,
//! and its log-probs of our rollouts are the ones we recorded. Greedy
//! rollouts (`temperature = 0`) are transformers' `generate(do_sample=False)`
//! with its log-probs at T = 1; a teacher of another chat template reads the
//! policy's prompts; sizes the weights do not hold exit 2.

use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{EvalRow, StepRow, TableName, TeacherLogpRow, TrajectoryRow};
use embodyflow_tests::{TINY_POLICY, run};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/hf_golden.py");

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn python(args: &[&str]) -> String {
    let out = Command::new(PYTHON)
        .arg(SCRIPT)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON} ({e}): run scripts/setup"));
    assert!(
        out.status.success(),
        "{SCRIPT} {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rows<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(dir, table).unwrap().read_rows().unwrap()
}

#[test]
fn a_tiny_qwen3_goes_through_the_household_loop_and_stays_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let data = household_tasks(root);
    let (qwen, made) = tiny_qwen3(root);
    let policy = sft_saves_transformers_layout(root, &qwen, &data);
    let (rollouts, steps) = rollouts_open_with_the_chat_template(root, &policy, &data, &made);
    transformers_gives_the_recorded_logprobs(root, &policy, &steps);
    the_loop_runs_on(root, &policy, &rollouts, &data, steps.len());
}

/// 14 train and 4 val household tasks under `root/data`.
fn household_tasks(root: &Path) -> PathBuf {
    let data = root.join("data");
    for (split, seed, count) in [("train", "1", "14"), ("val", "2", "4")] {
        ok(
            "generate-tasks",
            &[
                "--out",
                s(&data.join(split)),
                "--seed",
                seed,
                "--set",
                &format!("split={split}"),
                "--set",
                &format!("count={count}"),
            ],
        );
    }
    data
}

/// A tiny random Qwen3 that transformers saved, with our household
/// tokenizer plus Qwen's chat tokens, and what the script reports of it
/// (`prompt_ids`: a prompt through `apply_chat_template`).
fn tiny_qwen3(root: &Path) -> (PathBuf, serde_json::Value) {
    // Our household tokenizer, which the Qwen3 takes with Qwen's chat tokens.
    let init_dir = root.join("init");
    let mut init = vec!["--out", s(&init_dir), "--seed", "0"];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
    let qwen = root.join("qwen3");
    let made = python(&[
        "plan-policy",
        s(&qwen),
        s(&root.join("init/tokenizer.json")),
    ]);
    let made: serde_json::Value = serde_json::from_str(made.lines().last().unwrap()).unwrap();
    (qwen, made)
}

/// SFT of the Qwen3 saves a checkpoint in transformers' layout, carrying
/// the tokenizer and generation files; returns its directory.
fn sft_saves_transformers_layout(root: &Path, qwen: &Path, data: &Path) -> PathBuf {
    let sft = ok(
        "update-policy",
        &[
            "--policy",
            s(qwen),
            "--input",
            s(&data.join("train")),
            "--out",
            s(&root.join("sft")),
            "--set",
            "objective=sft",
            "--set",
            "sft.demos_per_task_type=1",
            "--set",
            "epochs=2",
            "--set",
            "mini_batch=4",
            "--set",
            "micro_batch=2",
            "--set",
            "optim.lr=1e-3",
        ],
    );
    assert!(sft.contains("| objective | sft |"), "{sft}");
    let policy = root.join("sft/policy");
    // Saved in transformers' layout, carrying the tokenizer and generation files.
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "manifest.json",
    ] {
        assert!(policy.join(file).is_file(), "{file}");
    }
    let config = std::fs::read_to_string(policy.join("config.json")).unwrap();
    assert!(config.contains("\"model_type\": \"qwen3\"") && !config.contains("\"kind\""));
    policy
}

/// Collected rollouts of the SFT policy: their prompts open with the chat
/// template's system turn, their log-probs are finite and at most 0.
fn rollouts_open_with_the_chat_template(
    root: &Path,
    policy: &Path,
    data: &Path,
    made: &serde_json::Value,
) -> (PathBuf, Vec<StepRow>) {
    let rollouts = root.join("it0/rollouts");
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(policy),
            "--input",
            s(&data.join("train")),
            "--out",
            s(&rollouts),
            "--seed",
            "5",
            "--set",
            "group_size=3",
            "--set",
            "tasks_per_iteration=4",
            "--set",
            "max_new_tokens=24",
            "--set",
            "batch_rows=5",
        ],
    );
    let trajectories: Vec<TrajectoryRow> =
        rows(&rollouts.join("trajectories"), TableName::Trajectories);
    let steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    assert_eq!(trajectories.len(), 12);
    let manifest = std::fs::read_to_string(policy.join("manifest.json")).unwrap();
    assert!(manifest.contains(&trajectories[0].policy));
    // The prompt is the chat template's rendering of the task's text.
    let template_prefix: Vec<i64> = made["prompt_ids"].as_array().unwrap()[..5]
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    for step in &steps {
        let head: Vec<i64> = step.prompt_ids[..5].iter().map(|&i| i64::from(i)).collect();
        assert_eq!(
            head, template_prefix,
            "prompts open with the template's system turn"
        );
        assert_eq!(step.response_ids.len(), step.old_logprobs.len());
        assert!(
            step.old_logprobs
                .iter()
                .all(|lp| lp.is_finite() && *lp <= 0.0)
        );
    }
    (rollouts, steps)
}

/// transformers, loading what update-policy saved, gives the log-probs
/// collect-rollouts recorded (T = 1.6, each row alone).
fn transformers_gives_the_recorded_logprobs(root: &Path, policy: &Path, steps: &[StepRow]) {
    let input = root.join("logprobs-in.json");
    let rows_json: Vec<serde_json::Value> = steps
        .iter()
        .take(4)
        .map(|step| serde_json::json!({"prompt_ids": step.prompt_ids, "response_ids": step.response_ids}))
        .collect();
    std::fs::write(
        &input,
        serde_json::json!({"temperature": 1.6, "rows": rows_json}).to_string(),
    )
    .unwrap();
    let output = root.join("logprobs-out.json");
    python(&["logprobs", s(policy), s(&input), s(&output)]);
    let theirs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    let mut worst = 0.0f64;
    for (step, row) in steps.iter().zip(theirs["logprobs"].as_array().unwrap()) {
        for (&ours, theirs) in step.old_logprobs.iter().zip(row.as_array().unwrap()) {
            worst = worst.max((f64::from(ours) - theirs.as_f64().unwrap()).abs());
        }
    }
    eprintln!("log-probs: max |ours - transformers'| = {worst:.2e}");
    assert!(worst < 1e-4, "max |ours - transformers'| = {worst}");
}

/// The rest of the loop on the SFT policy's rollouts: rewards, advantages,
/// a PPO update, evaluate on val and teacher-logp with the policy as its
/// own teacher (one row per step).
fn the_loop_runs_on(root: &Path, policy: &Path, rollouts: &Path, data: &Path, step_count: usize) {
    ok(
        "score-rewards",
        &[
            "--input",
            s(rollouts),
            "--input",
            s(&data.join("train")),
            "--out",
            s(&root.join("it0/rewards")),
            "--set",
            "reward.fn=verify",
        ],
    );
    ok(
        "compute-advantages",
        &[
            "--input",
            s(rollouts),
            "--input",
            s(&root.join("it0/rewards")),
            "--out",
            s(&root.join("it0/adv")),
        ],
    );
    let update = ok(
        "update-policy",
        &[
            "--policy",
            s(policy),
            "--input",
            s(rollouts),
            "--input",
            s(&root.join("it0/adv")),
            "--out",
            s(&root.join("it1")),
            "--set",
            "mini_batch=6",
            "--set",
            "micro_batch=3",
        ],
    );
    assert!(update.contains("| objective | ppo |"), "{update}");
    ok(
        "evaluate",
        &[
            "--policy",
            s(&root.join("it1/policy")),
            "--input",
            s(&data.join("val")),
            "--out",
            s(&root.join("it1/eval")),
            "--set",
            "max_new_tokens=24",
            "--set",
            "runs=1",
        ],
    );
    let eval: Vec<EvalRow> = rows(&root.join("it1/eval/eval"), TableName::Eval);
    assert_eq!(eval.len(), 4);
    ok(
        "teacher-logp",
        &[
            "--policy",
            s(policy),
            "--teacher",
            "self",
            "--input",
            s(rollouts),
            "--input",
            s(&data.join("train")),
            "--out",
            s(&root.join("it0/teacher")),
        ],
    );
    let teacher: Vec<TeacherLogpRow> = rows(
        &root.join("it0/teacher/teacher_logp"),
        TableName::TeacherLogp,
    );
    assert_eq!(teacher.len(), step_count);
}

#[test]
fn a_tokenizer_larger_than_the_embedding_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let init_dir = root.join("init");
    let mut init = vec!["--out", s(&init_dir), "--seed", "0"];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
    let qwen = root.join("qwen3");
    python(&[
        "plan-policy",
        s(&qwen),
        s(&root.join("init/tokenizer.json")),
    ]);
    let config_file = qwen.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
    config["vocab_size"] = serde_json::json!(64);
    std::fs::write(&config_file, config.to_string()).unwrap();
    ok(
        "generate-tasks",
        &["--out", s(&root.join("tasks")), "--set", "count=2"],
    );
    let result = run(
        "evaluate",
        &[
            "--policy",
            s(&qwen),
            "--input",
            s(&root.join("tasks")),
            "--out",
            s(&root.join("eval")),
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("tokenizer.json") && result.stderr.contains("embedding"),
        "{result}"
    );
    assert!(!root.join("eval/eval").exists());
}

/// Generated household tasks in `root/data`, our tokenizer in `root/init`
/// and a tiny Qwen3 made by transformers in `root/qwen3` (`sharp`: logits
/// whole units apart, see `hf_golden.py plan-policy`).
fn tasks_and_qwen(root: &Path, sharp: bool) -> PathBuf {
    ok(
        "generate-tasks",
        &[
            "--out",
            s(&root.join("data")),
            "--seed",
            "1",
            "--set",
            "split=train",
            "--set",
            "count=6",
        ],
    );
    let init_dir = root.join("init");
    let mut init = vec!["--out", s(&init_dir), "--seed", "0"];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
    let qwen = root.join("qwen3");
    let tokenizer = root.join("init/tokenizer.json");
    let mut args = vec!["plan-policy", s(&qwen), s(&tokenizer)];
    if sharp {
        args.push("sharp");
    }
    python(&args);
    qwen
}

/// `collect-rollouts` of `policy` on `root/data` (seed 5) with `sets`,
/// into `root/rollouts`.
fn collect(root: &Path, policy: &Path, sets: &[&str]) -> PathBuf {
    let rollouts = root.join("rollouts");
    let data = root.join("data");
    let mut args = vec![
        "--policy",
        s(policy),
        "--input",
        s(&data),
        "--out",
        s(&rollouts),
        "--seed",
        "5",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    ok("collect-rollouts", &args);
    rollouts
}

/// `collect-rollouts --set temperature=0` decodes greedily: every sample of
/// a group is the same answer, the answers are transformers'
/// `generate(do_sample=False)` on each prompt alone, the recorded log-probs
/// are transformers' at T = 1, and the rows record temperature 0.
#[test]
fn greedy_rollouts_are_transformers_generate_without_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let qwen = tasks_and_qwen(root, true);
    let rollouts = collect(
        root,
        &qwen,
        &[
            "temperature=0",
            "group_size=2",
            "tasks_per_iteration=3",
            "max_new_tokens=12",
        ],
    );
    let trajectories: Vec<TrajectoryRow> =
        rows(&rollouts.join("trajectories"), TableName::Trajectories);
    let steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    assert_eq!(steps.len(), 6);
    assert!(trajectories.iter().all(|t| t.temperature == 0.0));
    for pair in steps.chunks(2) {
        assert_eq!(
            pair[0].response_ids, pair[1].response_ids,
            "one answer per group"
        );
    }
    let rows_json: Vec<serde_json::Value> = steps
        .iter()
        .map(|step| serde_json::json!({"prompt_ids": step.prompt_ids, "response_ids": step.response_ids}))
        .collect();
    let input = root.join("greedy-in.json");
    std::fs::write(
        &input,
        serde_json::json!({"max_new_tokens": 12, "temperature": 1.0, "rows": rows_json})
            .to_string(),
    )
    .unwrap();
    let generated = root.join("greedy-out.json");
    python(&["greedy", s(&qwen), s(&input), s(&generated)]);
    let generated: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&generated).unwrap()).unwrap();
    for (step, theirs) in steps.iter().zip(generated["responses"].as_array().unwrap()) {
        let theirs: Vec<i32> = theirs
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect();
        assert_eq!(step.response_ids, theirs, "{}", step.trajectory_id);
    }
    let scored = root.join("logprobs-out.json");
    python(&["logprobs", s(&qwen), s(&input), s(&scored)]);
    let scored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&scored).unwrap()).unwrap();
    let mut worst = 0.0f64;
    for (step, row) in steps.iter().zip(scored["logprobs"].as_array().unwrap()) {
        for (&ours, theirs) in step.old_logprobs.iter().zip(row.as_array().unwrap()) {
            worst = worst.max((f64::from(ours) - theirs.as_f64().unwrap()).abs());
        }
    }
    assert!(
        worst < 1e-4,
        "max |ours - transformers' at T = 1| = {worst}"
    );

    // Sizes the weights do not hold exit 2 naming the file, the tensor and
    // the key, checked on the weights' header before anything is allocated.
    let config_file = qwen.join("config.json");
    let original = std::fs::read_to_string(&config_file).unwrap();
    for (key, value, tensor) in [
        (
            "vocab_size",
            1i64 << 40,
            "`model.embed_tokens.weight` has shape",
        ),
        (
            "hidden_size",
            1 << 31,
            "`model.embed_tokens.weight` has shape",
        ),
        (
            "num_hidden_layers",
            1_000_000_000,
            "`model.layers.1.input_layernorm.weight` is missing",
        ),
    ] {
        let mut config: serde_json::Value = serde_json::from_str(&original).unwrap();
        config[key] = serde_json::json!(value);
        std::fs::write(&config_file, config.to_string()).unwrap();
        let out = root.join(format!("eval-{key}"));
        let result = run(
            "evaluate",
            &[
                "--policy",
                s(&qwen),
                "--input",
                s(&root.join("data")),
                "--out",
                s(&out),
            ],
        );
        assert_eq!(result.code, 2, "{key}: {result}");
        assert!(
            result.stderr.contains("model.safetensors")
                && result.stderr.contains(tensor)
                && result.stderr.contains(key),
            "{key}: {result}"
        );
        assert!(!out.join("eval").exists());
    }
}

/// A teacher with the policy's tokenizer but another chat template: the
/// task text is read out of the rollout's prompt with the policy's template
/// and the contexts are rendered with the teacher's (the teacher's template
/// used to parse the policy's prompt, and the stage refused the teacher).
#[test]
fn a_teacher_with_another_chat_template_reads_the_policys_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let qwen = tasks_and_qwen(root, false);
    let rollouts = collect(
        root,
        &qwen,
        &["group_size=2", "tasks_per_iteration=2", "max_new_tokens=8"],
    );
    let teacher = root.join("teacher");
    std::fs::create_dir(&teacher).unwrap();
    for entry in std::fs::read_dir(&qwen).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), teacher.join(entry.file_name())).unwrap();
    }
    let template_file = teacher.join("chat_template.jinja");
    let template = std::fs::read_to_string(&template_file).unwrap();
    let default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    assert!(template.contains(default_system), "{template}");
    std::fs::write(
        &template_file,
        template.replace(default_system, "You are a careful teacher."),
    )
    .unwrap();
    let score = |teacher: &Path, out: &str| {
        ok(
            "teacher-logp",
            &[
                "--policy",
                s(&qwen),
                "--teacher",
                s(teacher),
                "--input",
                s(&rollouts),
                "--input",
                s(&root.join("data")),
                "--out",
                s(&root.join(out)),
            ],
        );
        rows::<TeacherLogpRow>(&root.join(out).join("teacher_logp"), TableName::TeacherLogp)
    };
    let other = score(&teacher, "other");
    let same = score(&qwen, "same");
    assert_eq!(other.len(), 4);
    assert_eq!(same.len(), 4);
    // The same weights under another system prompt: other contexts, other
    // log-probs of the same responses.
    assert!(
        other
            .iter()
            .zip(&same)
            .any(|(a, b)| a.student_logp != b.student_logp),
        "the teacher's template renders the contexts"
    );
}
