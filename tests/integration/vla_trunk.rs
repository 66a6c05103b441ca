//! A VLA on a vision-language trunk through the stages, in the embedded
//! tabletop world and in a world of the Gymnasium bridge (BabyAI, its view
//! rendered as RGB frames): a tiny random Qwen2.5-VL saved by transformers
//! (`scripts/vla_trunk_fixture.py`) with a tokenizer trained on the
//! world's instructions → `init-policy --set vla.trunk=hf:DIR` (the action
//! bins as the model's last 256 vocabulary ids, the vision encoder frozen)
//! → behaviour cloning on the world's expert demonstrations → closed-loop
//! rollouts (G = 2) → `score-rewards` → GRPO advantages → one
//! policy-gradient update → `evaluate`. Every checkpoint stays a VLA on
//! that trunk; the vision encoder's weights stay the model directory's
//! while the language model's move; the update's first step rescores the
//! sampled tokens at the log-probs the rollouts recorded (approx_kl ~ 0),
//! and the same update on the rollouts with their frames blanked does not,
//! so the frames reach the trunk. A trunk directory that does not exist is
//! refused naming the key.

use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::observation::{decode, encode_named};
use embodyflow_core::schemas::{AdvantageRow, EvalRow, MetricRow, StepRow, TableName, TaskRow};
use embodyflow_tests::{
    Run, read_advantages, run, tabletop_tasks_and_tiny_vla, tensor_bytes, update_policy,
    write_table,
};

use super::gym_stages::{ok, rows, s};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../scripts/vla_trunk_fixture.py"
);

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn update(policy: &Path, inputs: &[&Path], out: &Path, sets: &[&str]) -> String {
    let result = update_policy(policy, inputs, out, sets);
    assert_eq!(result.code, 0, "{result}");
    result.stdout
}

/// The tiny Qwen2.5-VL in `root/qwen-vl`, its tokenizer `tokenizer` (a BPE
/// of ours) with the vision tokens added.
fn tiny_qwen_vl(root: &Path, tokenizer: &Path) -> PathBuf {
    let vlm = root.join("qwen-vl");
    std::fs::create_dir_all(&vlm).unwrap();
    let made = Command::new(PYTHON)
        .args([SCRIPT, s(&vlm), s(tokenizer)])
        .output()
        .expect("the project venv's python (scripts/setup)");
    let stderr = String::from_utf8_lossy(&made.stderr);
    assert!(made.status.success(), "{stderr}");
    vlm
}

/// `init-policy` of a VLA on trunk `trunk` (a `vla.trunk=…` setting) into
/// `out`, shaped by the world of `tasks` when given (else the default,
/// tabletop), with more `--set` values.
fn init_on_trunk(out: &Path, tasks: Option<&Path>, trunk: &str, sets: &[&str]) -> Run {
    let mut args = vec!["--out", s(out), "--seed", "0"];
    if let Some(tasks) = tasks {
        args.extend(["--input", s(tasks)]);
    }
    let common = [
        "kind=vla",
        trunk,
        "vla.action_tokens=vocab",
        "vla.freeze_vision=true",
    ];
    for set in common.iter().chain(sets) {
        args.extend(["--set", set]);
    }
    run("init-policy", &args)
}

/// What [`clone_update_and_evaluate`] leaves for a world's own checks.
struct Chain {
    /// collect-rollouts' summary.
    collected: String,
    /// The rollouts' steps, as collected.
    steps: Vec<StepRow>,
    advantages: Vec<AdvantageRow>,
    /// The SFT policy, which collected the rollouts.
    sft: PathBuf,
    /// The policy after the GRPO update.
    grpo: PathBuf,
}

/// The stages after `init-policy` on the VLA `qvla` (on the trunk in
/// `vlm`) and the world's `tasks`, in `root`, with groups of `group_size`
/// (a `group_size=G` setting), and the checks every world shares.
fn clone_update_and_evaluate(
    root: &Path,
    vlm: &Path,
    qvla: &Path,
    tasks: &Path,
    group_size: &str,
) -> Chain {
    let config = json(&qvla.join("config.json"));
    assert_eq!(config["kind"], "vla");
    assert_eq!(config["n_embd"], 48);
    assert_eq!(config["trunk"]["model"]["model_type"], "qwen2_5_vl");
    assert_eq!(config["trunk"]["action_tokens"], "vocab");

    // Behaviour cloning on the expert's demonstrations.
    let sft = root.join("sft");
    let batches = ["mini_batch=16", "micro_batch=8", "optim.lr=1e-3"];
    update(
        qvla,
        &[tasks],
        &sft,
        &[&["objective=sft", "epochs=2"], &batches[..]].concat(),
    );
    let metrics: Vec<MetricRow> = rows(&sft, TableName::Metrics);
    assert!(
        metrics
            .iter()
            .all(|m| m.loss.is_finite() && m.grad_norm > 0.0)
    );

    // Rollouts of the SFT policy, scored, GRPO advantages, one update.
    let rollouts = root.join("rollouts");
    let policy = sft.join("policy");
    let args = ["--policy", s(&policy), "--input", s(tasks), "--out"];
    let sets = ["--seed", "5", "--set", group_size, "--set", "batch_rows=8"];
    let collected = ok(
        "collect-rollouts",
        &[&args[..], &[s(&rollouts)], &sets[..]].concat(),
    );
    let steps: Vec<StepRow> = rows(&rollouts, TableName::Steps);
    assert!(!steps.is_empty());
    let rewards = root.join("rewards");
    let inputs = ["--input", s(&rollouts), "--input"];
    ok(
        "score-rewards",
        &[&inputs[..], &[s(tasks), "--out", s(&rewards)]].concat(),
    );
    let adv = root.join("adv");
    ok(
        "compute-advantages",
        &[
            &inputs[..],
            &[s(&rewards), "--out", s(&adv), "--set", "estimator=grpo"],
        ]
        .concat(),
    );
    let advantages = read_advantages(&adv.join("advantages"));
    assert_eq!(advantages.len(), steps.len());
    // One optimizer step over every decision: it rescores the rollouts
    // before it moves, so its approx_kl is theirs against the sampler's.
    let grpo = root.join("grpo");
    let one_step = ["objective=ppo", "mini_batch=512", "micro_batch=8"];
    let ppo = [&one_step[..], &["optim.lr=1e-3"]].concat();
    let summary = update(&policy, &[&rollouts, &adv], &grpo, &ppo);
    assert!(summary.contains("mean clipfrac"), "{summary}");
    let first: Vec<MetricRow> = rows(&grpo, TableName::Metrics);
    let approx_kl = first[0].approx_kl.unwrap();
    assert!(approx_kl.abs() < 1e-5, "rescored as sampled: {approx_kl}");
    let updated = grpo.join("policy");
    assert_eq!(json(&updated.join("config.json"))["trunk"], config["trunk"]);

    // The vision encoder is the model directory's; the language model moved.
    let weights = updated.join("model.safetensors");
    let vision = "visual.blocks.0.mlp.up_proj.weight";
    assert_eq!(
        tensor_bytes(&weights, &format!("model.{vision}")),
        tensor_bytes(&vlm.join("model.safetensors"), vision)
    );
    let language = "layers.1.mlp.up_proj.weight";
    assert_ne!(
        tensor_bytes(&weights, &format!("model.language_model.{language}")),
        tensor_bytes(&vlm.join("model.safetensors"), &format!("model.{language}"))
    );

    // The same rollouts with every frame blank rescore elsewhere: the
    // trunk reads the frames.
    let blank: Vec<StepRow> = steps
        .iter()
        .cloned()
        .map(|mut step| {
            let bytes = step.observation.take().expect("a frame");
            let seen = decode(&bytes).unwrap();
            let zeros = vec![0; seen.pixels.len()];
            step.observation =
                Some(encode_named(&seen.shape, &seen.names, &zeros, &seen.proprio).unwrap());
            step
        })
        .collect();
    assert!(
        steps[0].observation.as_ref().is_some_and(|o| decode(o)
            .unwrap()
            .pixels
            .iter()
            .any(|&p| p != 0))
    );
    write_table(&rollouts, &blank);
    update(&policy, &[&rollouts, &adv], &root.join("grpo-blank"), &ppo);
    let blanked: Vec<MetricRow> = rows(&root.join("grpo-blank"), TableName::Metrics);
    let approx_kl = blanked[0].approx_kl.unwrap();
    assert!(
        approx_kl.abs() > 1e-3,
        "blank frames rescored alike: {approx_kl}"
    );

    // Greedy evaluation of the updated policy.
    let eval = root.join("eval");
    ok(
        "evaluate",
        &[
            "--policy",
            s(&updated),
            "--input",
            s(tasks),
            "--out",
            s(&eval),
            "--seed",
            "1",
            "--set",
            "batch_rows=8",
            "--set",
            "runs=1",
        ],
    );
    let task_rows: Vec<TaskRow> = rows(tasks, TableName::Tasks);
    let eval_rows: Vec<EvalRow> = rows(&eval, TableName::Eval);
    assert_eq!(eval_rows.len(), task_rows.len());
    Chain {
        collected,
        steps,
        advantages,
        sft: policy,
        grpo: updated,
    }
}

/// The bytes of the language model's parameter `layers.1.mlp.up_proj.weight`
/// in VLA checkpoint `policy`.
fn language_weight(policy: &Path) -> Vec<u8> {
    let name = "model.language_model.layers.1.mlp.up_proj.weight";
    tensor_bytes(&policy.join("model.safetensors"), name)
}

#[test]
fn a_vla_on_a_qwen_vl_trunk_is_cloned_updated_by_grpo_and_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tabletop_tasks_and_tiny_vla(root, 4);
    // Its tokenizer: the tiny VLA's, trained on tabletop instructions.
    let vlm = tiny_qwen_vl(root, &root.join("vla/tokenizer.json"));
    let trunk = format!("vla.trunk=hf:{}", vlm.display());
    let sets = [
        "vla.chunk_len=4",
        "vla.max_instruction=48",
        "tokenizer.corpus_tasks=200",
    ];
    let nowhere = root.join("nowhere");
    let missing = init_on_trunk(&nowhere, None, "vla.trunk=hf:/no/such/model", &sets);
    assert_eq!(missing.code, 2, "{missing}");
    assert!(missing.stderr.contains("vla.trunk"), "{missing}");
    assert!(!nowhere.exists());

    let qvla = root.join("qvla");
    let result = init_on_trunk(&qvla, None, &trunk, &sets);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.contains("on the model in"), "{result}");
    clone_update_and_evaluate(root, &vlm, &qvla, &root.join("tasks"), "group_size=2");
}

/// BabyAI through the bridge, the agent's view rendered as 28 × 28 RGB
/// frames (`view = "rgb"`, 4 pixels a cell): frames whose side is no
/// multiple of the trunk's patch, which the image processor resizes; the
/// BabyAI bot's demonstrations for behaviour cloning. A view the adapter
/// does not render is refused naming the views.
#[test]
fn a_vla_on_a_qwen_vl_trunk_runs_on_the_bridges_rgb_frames() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tasks = root.join("tasks");
    let generate = |out: &Path, view: &str| {
        let kwargs = format!("gym.kwargs={{view = \"{view}\", tile_size = 4}}");
        let sets = [
            "env=gym",
            "gym.adapter=babyai",
            "gym.env_ids=[\"BabyAI-GoToLocal-v0\"]",
            &kwargs,
            "gym.max_steps=12",
            "count=4",
        ];
        let mut args = vec!["--out", s(out), "--seed", "5"];
        for set in sets {
            args.extend(["--set", set]);
        }
        run("generate-tasks", &args)
    };
    let refused = generate(&root.join("depth"), "depth");
    assert_eq!(refused.code, 2, "{refused}");
    let views = "view 'depth': expected one of symbolic, rgb";
    assert!(refused.stderr.contains(views), "{refused}");
    assert!(!root.join("depth").exists());
    let made = generate(&tasks, "rgb");
    assert_eq!(made.code, 0, "{made}");
    // A tokenizer trained on the tasks' instructions: a small VLA's.
    let small = root.join("vla");
    ok(
        "init-policy",
        &[
            "--out",
            s(&small),
            "--input",
            s(&tasks),
            "--seed",
            "0",
            "--set",
            "kind=vla",
            "--set",
            "vla.patch_size=4",
            "--set",
            "vla.n_layer=1",
            "--set",
            "tokenizer.vocab_size=280",
        ],
    );
    assert_eq!(json(&small.join("config.json"))["image_size"], 28);
    let vlm = tiny_qwen_vl(root, &small.join("tokenizer.json"));
    let trunk = format!("vla.trunk=hf:{}", vlm.display());
    let qvla = root.join("qvla");
    let result = init_on_trunk(&qvla, Some(&tasks), &trunk, &["vla.chunk_len=1"]);
    assert_eq!(result.code, 0, "{result}");
    let config = json(&qvla.join("config.json"));
    assert_eq!(
        (config["image_size"].as_i64(), config["n_bins"].as_i64()),
        (Some(28), Some(8))
    );

    let chain = clone_update_and_evaluate(root, &vlm, &qvla, &tasks, "group_size=4");
    // A group of both outcomes: the policy gradient moved the policy.
    assert!(
        chain.advantages.iter().any(|a| a.episode_adv != 0.0),
        "{}",
        chain.collected
    );
    assert_ne!(language_weight(&chain.sft), language_weight(&chain.grpo));
    for step in &chain.steps {
        let seen = decode(step.observation.as_deref().expect("a frame")).unwrap();
        assert_eq!(
            (seen.shape.height, seen.shape.width, seen.shape.channels),
            (28, 28, 3)
        );
    }
}
