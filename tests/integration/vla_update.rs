//! `update-policy` on a VLA, both objectives, through the
//! stages: tabletop tasks → a tiny VLA → behaviour cloning on the expert's
//! demonstrations (`objective = sft`: the loss falls over the epochs, the
//! checkpoint stays a VLA and `collect-rollouts` loads it) → closed-loop
//! rollouts (G = 4) → `score-rewards` → `compute-advantages` on rewards in
//! which sample 0 of each group wins → `objective = ppo` (a new VLA
//! checkpoint whose parent is the SFT one, finite clipfrac / approx_kl /
//! entropy, AdamW state for the next call). A steps row whose observation
//! is corrupted makes the PPO update exit 2 naming its trajectory and step,
//! with nothing written.

use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{MetricRow, RewardRow, StepRow, TableName};
use embodyflow_tests::update_policy as update;
use embodyflow_tests::{read_advantages, run, tabletop_tasks_and_tiny_vla, write_table};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn read<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(dir, table).unwrap().read_rows().unwrap()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_vla_is_cloned_from_demonstrations_and_updated_on_its_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tasks = root.join("tasks");
    tabletop_tasks_and_tiny_vla(root, 4);
    let vla = root.join("vla");

    // Behaviour cloning.
    let sft = root.join("sft");
    let result = update(
        &vla,
        &[&tasks],
        &sft,
        &[
            "objective=sft",
            "epochs=6",
            "mini_batch=32",
            "micro_batch=16",
            "optim.lr=3e-3",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let summary = result.stdout;
    for line in [
        "| objective | sft |",
        "| demonstrations | 4 successful expert demonstrations",
        "| dropped demonstrations | 0 |",
        "decisions/s",
    ] {
        assert!(summary.contains(line), "{line}\n{summary}");
    }
    let metrics: Vec<MetricRow> = read(&sft.join("metrics"), TableName::Metrics);
    let per_epoch = metrics.len() / 6;
    assert!(per_epoch >= 1 && metrics.len() == 6 * per_epoch);
    let epoch_loss = |e: usize| {
        metrics[e * per_epoch..(e + 1) * per_epoch]
            .iter()
            .map(|m| f64::from(m.loss))
            .sum::<f64>()
            / per_epoch as f64
    };
    assert!(
        epoch_loss(5) < 0.8 * epoch_loss(0),
        "the loss falls: {:?}",
        metrics.iter().map(|m| m.loss).collect::<Vec<_>>()
    );
    assert!(
        metrics
            .iter()
            .all(|m| m.clipfrac.is_none() && m.grad_norm > 0.0)
    );
    let config = json(&sft.join("policy/config.json"));
    assert_eq!(config["kind"], "vla");
    assert_eq!(config["chunk_len"], 8);
    assert!(sft.join("policy/optimizer.safetensors").exists());

    // Its rollouts, scored; sample 0 of each group wins.
    let rollouts = root.join("rollouts");
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(&sft.join("policy")),
            "--input",
            s(&tasks),
            "--out",
            s(&rollouts),
            "--seed",
            "5",
            "--set",
            "group_size=4",
            "--set",
            "batch_rows=8",
        ],
    );
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
    let scored: Vec<RewardRow> = read(&rewards.join("rewards"), TableName::Rewards);
    let mixed: Vec<RewardRow> = scored
        .iter()
        .map(|r| {
            let win = r.trajectory_id.ends_with("/s0");
            let score = if win { 1.0 } else { 0.0 };
            RewardRow {
                infra_fault: None,
                score,
                accuracy: score,
                success: win,
                ..r.clone()
            }
        })
        .collect();
    write_table(&root.join("mixed"), &mixed);
    let adv = root.join("adv");
    ok(
        "compute-advantages",
        &[
            "--input",
            s(&rollouts),
            "--input",
            s(&root.join("mixed")),
            "--out",
            s(&adv),
        ],
    );
    let advantages = read_advantages(&adv.join("advantages"));
    let steps: Vec<StepRow> = read(&rollouts.join("steps"), TableName::Steps);
    assert_eq!(advantages.len(), steps.len());

    // PPO on the rollouts.
    let ppo = root.join("ppo");
    let ppo_sets = [
        "objective=ppo",
        "mini_batch=16",
        "micro_batch=8",
        "optim.lr=1e-3",
    ];
    let result = update(&sft.join("policy"), &[&rollouts, &adv], &ppo, &ppo_sets);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.contains("mean clipfrac"), "{}", result.stdout);
    let metrics: Vec<MetricRow> = read(&ppo.join("metrics"), TableName::Metrics);
    assert_eq!(metrics.len(), steps.len().div_ceil(16));
    assert!(
        metrics[0].approx_kl.is_some_and(|kl| kl.abs() < 1e-3),
        "starts at the behaviour policy: {:?}",
        metrics[0]
    );
    for m in &metrics {
        let figures = [
            m.loss,
            m.entropy,
            m.clipfrac.unwrap(),
            m.approx_kl.unwrap(),
            m.grad_norm,
        ];
        assert!(figures.iter().all(|v| v.is_finite()), "{m:?}");
        assert!(m.entropy > 0.0 && m.grad_norm > 0.0, "{m:?}");
    }
    let config = json(&ppo.join("policy/config.json"));
    assert_eq!(config["kind"], "vla");
    let (before, after) = (
        json(&sft.join("policy/manifest.json")),
        json(&ppo.join("policy/manifest.json")),
    );
    assert_eq!(after["parent"], before["id"]);
    assert_ne!(after["id"], before["id"], "the weights moved");
    let state = json(&ppo.join("policy/optimizer.json"));
    assert_eq!(state["objective"], "ppo", "{state}");

    // A corrupted observation: exit 2, the row named, nothing written.
    let victim = steps
        .iter()
        .find(|r| r.step_index > 0)
        .unwrap_or(&steps[0])
        .clone();
    let corrupted: Vec<StepRow> = steps
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if (&r.trajectory_id, r.step_index) == (&victim.trajectory_id, victim.step_index) {
                let bytes = r.observation.as_mut().unwrap();
                bytes.truncate(bytes.len() - 7);
            }
            r
        })
        .collect();
    write_table(&root.join("corrupt"), &corrupted);
    let out = root.join("refused");
    let result = update(
        &sft.join("policy"),
        &[
            &root.join("corrupt/steps"),
            &rollouts.join("trajectories"),
            &adv,
        ],
        &out,
        &ppo_sets,
    );
    assert_eq!(result.code, 2, "{result}");
    let named = format!(
        "trajectory `{}` step {}",
        victim.trajectory_id, victim.step_index
    );
    let text = result.to_string();
    assert!(
        text.contains(&named) && text.contains("observation"),
        "{named}\n{result}"
    );
    assert!(!out.join("policy").exists() && !out.join("metrics").exists());
}
