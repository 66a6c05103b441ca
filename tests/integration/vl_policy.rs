//! A vision-language model as the plan policy: a tiny random Qwen2.5-VL
//! that transformers saved (`scripts/hf_vl_golden.py plan-policy`, our
//! household tokenizer plus Qwen's chat and vision tokens, Qwen2-VL's chat
//! template) plans household tasks that carry a scene image through the
//! stages — collect-rollouts, score-rewards, compute-advantages (grpo and
//! grpo_step), one GRPO update with a KL reference, evaluate, and
//! teacher-logp with a vision-language teacher. The image rides with the
//! prompt: each step records the task's scene image (`steps.observation`)
//! beside prompt ids holding its expanded placeholders, and update-policy,
//! rescoring from that row, starts at ratio 1 (approx_kl 0); with
//! `freeze_vision` the same update leaves the vision encoder's weights as
//! they were (they move without it), and a text policy refuses the key. An
//! image the processor cannot take and a prompt whose placeholders miss
//! their image exit 2 naming the file, key or row, writing nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::observation::decode;
use embodyflow_core::schemas::{
    EvalRow, MetricRow, StepRow, TableName, TaskRow, TeacherLogpRow, TrajectoryRow,
};
use embodyflow_tests::{Run, TINY_POLICY, run, tensor_bytes, write_table};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/hf_vl_golden.py");
/// The side of the tasks' scene images: 32 × 32 pixels are an 8 × 8 patch
/// grid at patch 4, 16 tokens after the 2 × 2 merge.
const IMAGE_SIZE: usize = 32;
const IMAGE_TOKENS: usize = 16;

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn rows<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(dir, table).unwrap().read_rows().unwrap()
}

/// Household tasks with scene images under `root/data/{train,val}` and the
/// tiny Qwen2.5-VL in `root/qwen-vl`; returns the model directory and the
/// template's ids of a user turn with one image (unexpanded).
fn tasks_and_qwen_vl(root: &Path) -> (PathBuf, serde_json::Value) {
    for (split, seed, count) in [("train", "1", "6"), ("val", "2", "2")] {
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
                "--set",
                &format!("image_size={IMAGE_SIZE}"),
            ],
        );
    }
    let init = root.join("init");
    let mut args = vec!["--out", s(&init), "--seed", "0"];
    args.extend(TINY_POLICY);
    ok("init-policy", &args);
    let model = root.join("qwen-vl");
    let out = Command::new(PYTHON)
        .arg(SCRIPT)
        .args(["plan-policy", s(&model), s(&init.join("tokenizer.json"))])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON} ({e}): run scripts/setup"));
    assert!(
        out.status.success(),
        "{SCRIPT} plan-policy:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let made = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (model, made)
}

fn collect(root: &Path, policy: &Path, out: &Path) -> Run {
    run(
        "collect-rollouts",
        &[
            "--policy",
            s(policy),
            "--input",
            s(&root.join("data/train")),
            "--out",
            s(out),
            "--seed",
            "5",
            "--set",
            "group_size=2",
            "--set",
            "tasks_per_iteration=3",
            "--set",
            "max_new_tokens=12",
            "--set",
            "batch_rows=4",
        ],
    )
}

/// The verify rewards of `rollouts` (once) and their advantages under
/// `estimator`, beside them in `adv-<estimator>`.
fn advantages(root: &Path, policy: &Path, rollouts: &Path, estimator: &str) -> PathBuf {
    let at = rollouts.parent().unwrap();
    let (rewards, out) = (at.join("rewards"), at.join(format!("adv-{estimator}")));
    let tasks = root.join("data/train");
    if !rewards.exists() {
        let args = [
            "--input",
            s(rollouts),
            "--input",
            s(&tasks),
            "--out",
            s(&rewards),
        ];
        ok(
            "score-rewards",
            &[&args[..], &["--set", "reward.fn=verify"]].concat(),
        );
    }
    ok(
        "compute-advantages",
        &[
            "--policy",
            s(policy),
            "--input",
            s(rollouts),
            "--input",
            s(&rewards),
            "--input",
            s(&tasks),
            "--out",
            s(&out),
            "--set",
            &format!("estimator={estimator}"),
        ],
    );
    out
}

#[test]
fn a_tiny_qwen_vl_plans_from_scene_images_through_the_stages() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (qwen, made) = tasks_and_qwen_vl(root);
    let rollouts = root.join("it0/rollouts");
    let result = collect(root, &qwen, &rollouts);
    assert_eq!(result.code, 0, "{result}");

    // Each step holds its task's scene image and the prompt the model read:
    // the template's ids with the one placeholder expanded to 16.
    let tasks: Vec<TaskRow> = rows(&root.join("data/train/tasks"), TableName::Tasks);
    let trajectories: Vec<TrajectoryRow> =
        rows(&rollouts.join("trajectories"), TableName::Trajectories);
    let steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    assert_eq!(steps.len(), 6);
    let image_token = made["image_token_id"].as_i64().unwrap() as i32;
    let template: Vec<i32> = made["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    let head = &template[..=template.iter().position(|&t| t == image_token).unwrap()];
    for step in &steps {
        let trajectory = trajectories
            .iter()
            .find(|t| t.trajectory_id == step.trajectory_id)
            .unwrap();
        let task = tasks
            .iter()
            .find(|t| t.task_id == trajectory.task_id)
            .unwrap();
        let (size, rgb) = embodyflow_household::task_image(task).unwrap().unwrap();
        let observation = decode(step.observation.as_deref().expect("the image")).unwrap();
        assert_eq!(
            (observation.shape.height, observation.shape.width),
            (size, size)
        );
        assert_eq!(observation.pixels, rgb.as_slice(), "{}", task.task_id);
        assert_eq!(&step.prompt_ids[..head.len()], head);
        let placeholders = step
            .prompt_ids
            .iter()
            .filter(|&&t| t == image_token)
            .count();
        assert_eq!(placeholders, IMAGE_TOKENS);
        assert_eq!(step.response_ids.len(), step.old_logprobs.len());
    }

    for estimator in ["grpo", "grpo_step"] {
        advantages(root, &qwen, &rollouts, estimator);
    }
    // One GRPO step over all six answers, against the model itself as the
    // KL reference: rescored from the steps rows (image included), the
    // log-probs are the sampler's, so the ratio and the KL start at 0. Its
    // entropy bonus moves every parameter the answers' logits depend on,
    // whatever their advantages.
    let adv = root.join("it0/adv-grpo_step");
    let grpo = |out: &str, policy: &Path, more: &[&str]| {
        let kl_reference = format!("kl_reference={}", s(&qwen));
        let mut args = vec![
            "--policy",
            s(policy),
            "--input",
            s(&rollouts),
            "--input",
            s(&adv),
            "--out",
            out,
        ];
        let sets = [
            "epochs=1",
            "mini_batch=6",
            "micro_batch=3",
            "ppo.kl_coef=0.01",
            "ppo.entropy_coef=0.01",
        ];
        for set in sets.iter().chain(&[kl_reference.as_str()]).chain(more) {
            args.extend(["--set", set]);
        }
        run("update-policy", &args)
    };
    let update = grpo(s(&root.join("it1")), &qwen, &[]);
    assert_eq!(update.code, 0, "{update}");
    assert!(update.stdout.contains("| objective | ppo |"), "{update}");
    let metrics: Vec<MetricRow> = rows(&root.join("it1/metrics"), TableName::Metrics);
    assert_eq!(metrics.len(), 1);
    let (approx_kl, kl) = (metrics[0].approx_kl.unwrap(), metrics[0].kl_loss.unwrap());
    assert!(
        approx_kl.abs() < 1e-5 && kl.abs() < 1e-5,
        "{approx_kl} {kl}"
    );
    let policy = root.join("it1/policy");
    assert!(policy.join("preprocessor_config.json").is_file());

    // The same step with `freeze_vision`: the vision encoder's weights stay
    // the model's, the language model's move as they did without it (the
    // step moved the vision encoder then). A text policy has none to freeze.
    let frozen = root.join("it1-frozen");
    let update = grpo(s(&frozen), &qwen, &["freeze_vision=true"]);
    assert_eq!(update.code, 0, "{update}");
    assert!(
        update.stdout.contains("| vision encoder | frozen"),
        "{update}"
    );
    let weight = |dir: &Path, name: &str| tensor_bytes(&dir.join("model.safetensors"), name);
    for (name, moves_when_frozen) in [
        ("visual.blocks.0.mlp.up_proj.weight", false),
        ("visual.merger.mlp.0.weight", false),
        ("model.layers.1.mlp.up_proj.weight", true),
    ] {
        let before = weight(&qwen, name);
        let moved = weight(&policy, name) != before;
        assert!(moved, "{name} moves without freeze_vision");
        let moved = weight(&frozen.join("policy"), name) != before;
        assert_eq!(moved, moves_when_frozen, "{name} with freeze_vision");
    }
    let text = root.join("text-frozen");
    let text_only = ["freeze_vision=true", "ppo.kl_coef=0"];
    let refused = grpo(s(&text), &root.join("init"), &text_only);
    assert_eq!(refused.code, 2, "{refused}");
    assert!(
        refused.stderr.contains("freeze_vision") && refused.stderr.contains("no vision encoder"),
        "{refused}"
    );
    assert!(!text.exists(), "nothing written");

    ok(
        "evaluate",
        &[
            "--policy",
            s(&policy),
            "--input",
            s(&root.join("data/val")),
            "--out",
            s(&root.join("it1/eval")),
            "--set",
            "max_new_tokens=12",
            "--set",
            "runs=1",
        ],
    );
    let eval: Vec<EvalRow> = rows(&root.join("it1/eval/eval"), TableName::Eval);
    assert_eq!(eval.len(), 2);

    // The trained model as the teacher of the rollouts of the first.
    ok(
        "teacher-logp",
        &[
            "--policy",
            s(&qwen),
            "--teacher",
            s(&policy),
            "--input",
            s(&rollouts),
            "--input",
            s(&root.join("data/train")),
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
fn images_the_processor_cannot_take_and_placeholders_without_their_image_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (qwen, _) = tasks_and_qwen_vl(root);

    // A processor whose pixel budget no resize of a 32 × 32 image meets.
    let small = root.join("qwen-vl-small");
    std::fs::create_dir(&small).unwrap();
    for entry in std::fs::read_dir(&qwen).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), small.join(entry.file_name())).unwrap();
    }
    let processor = small.join("preprocessor_config.json");
    let text = std::fs::read_to_string(&processor).unwrap();
    let budget = ["\"longest_edge\": 4096", "\"shortest_edge\": 256"];
    assert!(budget.iter().all(|b| text.contains(b)), "{text}");
    let text = text
        .replace(budget[0], "\"longest_edge\": 32")
        .replace(budget[1], "\"shortest_edge\": 16");
    std::fs::write(&processor, text).unwrap();
    let out = root.join("refused");
    let result = collect(root, &small, &out);
    assert_eq!(result.code, 2, "{result}");
    for needle in [
        "task `household/train/",
        "preprocessor_config.json",
        "`max_pixels`",
    ] {
        assert!(result.stderr.contains(needle), "lacks {needle}: {result}");
    }
    assert!(!out.exists(), "nothing written");

    // A step whose image is gone while its prompt keeps the placeholders.
    let rollouts = root.join("rollouts");
    let result = collect(root, &qwen, &rollouts);
    assert_eq!(result.code, 0, "{result}");
    let mut steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    let first = format!("trajectory `{}` step 0", steps[0].trajectory_id);
    steps[0].observation = None;
    write_table(&rollouts, &steps);
    let adv = advantages(root, &qwen, &rollouts, "grpo");
    for (stage, args) in [
        (
            "update-policy",
            vec!["--input", s(&adv), "--set", "mini_batch=6"],
        ),
        (
            "teacher-logp",
            vec!["--teacher", "self", "--input", s(&root.join("data/train"))],
        ),
    ] {
        let out = root.join(format!("{stage}-out"));
        let mut all = vec![
            "--policy",
            s(&qwen),
            "--input",
            s(&rollouts),
            "--out",
            s(&out),
        ];
        all.extend(args);
        let result = run(stage, &all);
        assert_eq!(result.code, 2, "{stage}: {result}");
        for needle in [
            first.as_str(),
            "1 image placeholder run(s)",
            "0 image(s) given",
        ] {
            assert!(
                result.stderr.contains(needle),
                "{stage} lacks {needle}: {result}"
            );
        }
        assert!(!out.exists(), "{stage}: nothing written");
    }
}
