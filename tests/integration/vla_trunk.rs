//! A VLA on a vision-language trunk through the stages: a tiny random
//! Qwen2.5-VL saved by transformers (`scripts/vla_trunk_fixture.py`) with a
//! tokenizer trained on tabletop instructions → `init-policy --set
//! vla.trunk=hf:DIR` (the action bins as the model's last 256 vocabulary
//! ids, the vision encoder frozen) → behaviour cloning on the expert's
//! demonstrations → closed-loop rollouts (G = 2) → `score-rewards` → GRPO
//! advantages → one policy-gradient update → `evaluate`. Every checkpoint
//! stays a VLA on that trunk; the vision encoder's weights stay the model
//! directory's while the language model's move. A trunk directory that
//! does not exist is refused naming the key.

use std::path::Path;
use std::process::Command;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{EvalRow, MetricRow, StepRow, TableName};
use embodyflow_tests::{read_advantages, run, tabletop_tasks_and_tiny_vla, update_policy};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../scripts/vla_trunk_fixture.py"
);

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The bytes of tensor `name` in a safetensors file.
fn tensor_bytes(file: &Path, name: &str) -> Vec<u8> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    bytes[8 + n + start..8 + n + end].to_vec()
}

fn update(policy: &Path, inputs: &[&Path], out: &Path, sets: &[&str]) -> String {
    let result = update_policy(policy, inputs, out, sets);
    assert_eq!(result.code, 0, "{result}");
    result.stdout
}

#[test]
fn a_vla_on_a_qwen_vl_trunk_is_cloned_updated_by_grpo_and_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tabletop_tasks_and_tiny_vla(root, 4);
    let tasks = root.join("tasks");
    let vlm = root.join("qwen-vl");
    // Its tokenizer: the tiny VLA's, trained on tabletop instructions.
    std::fs::create_dir_all(&vlm).unwrap();
    let made = Command::new(PYTHON)
        .args([SCRIPT, s(&vlm), s(&root.join("vla/tokenizer.json"))])
        .output()
        .expect("the project venv's python (scripts/setup)");
    let stderr = String::from_utf8_lossy(&made.stderr);
    assert!(made.status.success(), "{stderr}");
    let trunk = format!("vla.trunk=hf:{}", vlm.display());
    let init = |out: &Path, trunk: &str| {
        let sets = [
            "kind=vla",
            trunk,
            "vla.action_tokens=vocab",
            "vla.freeze_vision=true",
            "vla.chunk_len=4",
            "vla.max_instruction=48",
            "tokenizer.corpus_tasks=200",
        ];
        let mut args = vec!["--out", s(out), "--seed", "0"];
        for set in &sets {
            args.extend(["--set", set]);
        }
        run("init-policy", &args)
    };
    let missing = init(&root.join("nowhere"), "vla.trunk=hf:/no/such/model");
    assert_eq!(missing.code, 2, "{missing}");
    assert!(missing.stderr.contains("vla.trunk"), "{missing}");
    assert!(!root.join("nowhere").exists());

    let qvla = root.join("qvla");
    let result = init(&qvla, &trunk);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.contains("on the model in"), "{result}");
    let config = json(&qvla.join("config.json"));
    assert_eq!(config["kind"], "vla");
    assert_eq!(config["n_embd"], 48);
    assert_eq!(config["trunk"]["model"]["model_type"], "qwen2_5_vl");
    assert_eq!(config["trunk"]["action_tokens"], "vocab");

    // Behaviour cloning on the expert's demonstrations.
    let sft = root.join("sft");
    update(
        &qvla,
        &[&tasks],
        &sft,
        &[
            "objective=sft",
            "epochs=2",
            "mini_batch=16",
            "micro_batch=8",
            "optim.lr=1e-3",
        ],
    );
    let metrics: Vec<MetricRow> = TableReader::open(&sft.join("metrics"), TableName::Metrics)
        .unwrap()
        .read_rows()
        .unwrap();
    assert!(
        metrics
            .iter()
            .all(|m| m.loss.is_finite() && m.grad_norm > 0.0)
    );

    // Rollouts of the SFT policy, scored, GRPO advantages, one update.
    let rollouts = root.join("rollouts");
    let policy = sft.join("policy");
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(&policy),
            "--input",
            s(&tasks),
            "--out",
            s(&rollouts),
            "--seed",
            "5",
            "--set",
            "group_size=2",
            "--set",
            "batch_rows=8",
        ],
    );
    let steps: Vec<StepRow> = TableReader::open(&rollouts.join("steps"), TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    assert!(!steps.is_empty());
    let rewards = root.join("rewards");
    ok(
        "score-rewards",
        &[
            "--input",
            s(&rollouts),
            "--input",
            s(&tasks),
            "--out",
            s(&rewards),
        ],
    );
    let adv = root.join("adv");
    ok(
        "compute-advantages",
        &[
            "--input",
            s(&rollouts),
            "--input",
            s(&rewards),
            "--out",
            s(&adv),
            "--set",
            "estimator=grpo",
        ],
    );
    assert_eq!(read_advantages(&adv.join("advantages")).len(), steps.len());
    let grpo = root.join("grpo");
    let summary = update(
        &policy,
        &[&rollouts, &adv],
        &grpo,
        &[
            "objective=ppo",
            "mini_batch=16",
            "micro_batch=8",
            "optim.lr=1e-3",
        ],
    );
    assert!(summary.contains("mean clipfrac"), "{summary}");
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

    // Greedy evaluation of the updated policy.
    let eval = root.join("eval");
    ok(
        "evaluate",
        &[
            "--policy",
            s(&updated),
            "--input",
            s(&tasks),
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
    let rows: Vec<EvalRow> = TableReader::open(&eval.join("eval"), TableName::Eval)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(rows.len(), 4);
}
