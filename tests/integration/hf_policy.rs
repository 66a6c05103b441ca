//! A Hugging Face decoder as the plan policy: a tiny random Qwen3 that
//! transformers saved (`scripts/hf_golden.py plan-policy`, with our
//! household tokenizer plus Qwen's chat tokens and template) goes through
//! the household loop with the stages unchanged — SFT, collect-rollouts,
//! score-rewards, compute-advantages, a PPO update, evaluate and
//! teacher-logp — and what we wrote is transformers': the prompt ids are
//! its `apply_chat_template`, the trained checkpoint loads in transformers,
//! and its log-probs of our rollouts are the ones we recorded.

use std::path::Path;
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

    let sft = ok(
        "update-policy",
        &[
            "--policy",
            s(&qwen),
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

    let rollouts = root.join("it0/rollouts");
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(&policy),
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

    // transformers, loading what update-policy saved, gives the log-probs
    // collect-rollouts recorded (T = 1.6, each row alone).
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
    python(&["logprobs", s(&policy), s(&input), s(&output)]);
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

    ok(
        "score-rewards",
        &[
            "--input",
            s(&rollouts),
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
            s(&rollouts),
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
            s(&policy),
            "--input",
            s(&rollouts),
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
            s(&policy),
            "--teacher",
            "self",
            "--input",
            s(&rollouts),
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
    assert_eq!(teacher.len(), steps.len());
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
