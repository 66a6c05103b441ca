//! The learning loop end to end on a tiny model: generate-tasks, init-policy,
//! SFT, collect-rollouts, score-rewards, compute-advantages, update-policy
//! (PPO) and evaluate, each as a user runs it; then the bad inputs of the
//! policy stages.

use std::path::{Path, PathBuf};

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{
    EvalRow, MetricRow, StepRow, TableName, TaskRow, TeacherLogpRow, TrajectoryRow,
};
use embodyflow_tests::{TINY_POLICY, run, write_table};

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Tasks, a tiny checkpoint and its SFT successor in `root`.
fn prepare(root: &Path) {
    let data = root.join("data");
    ok(
        "generate-tasks",
        &[
            "--out",
            s(&data.join("train")),
            "--seed",
            "1",
            "--set",
            "split=train",
            "--set",
            "count=14",
        ],
    );
    ok(
        "generate-tasks",
        &[
            "--out",
            s(&data.join("val")),
            "--seed",
            "2",
            "--set",
            "split=val",
            "--set",
            "count=4",
        ],
    );
    let init_dir = root.join("init");
    let mut init = vec!["--out", s(&init_dir), "--seed", "0"];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
    let sft = ok(
        "update-policy",
        &[
            "--policy",
            s(&root.join("init")),
            "--input",
            s(&data.join("train")),
            "--out",
            s(&root.join("sft")),
            "--set",
            "objective=sft",
            "--set",
            "sft.demos_per_task_type=1",
            "--set",
            "epochs=3",
            "--set",
            "mini_batch=4",
            "--set",
            "micro_batch=2",
            "--set",
            "optim.lr=1e-3",
        ],
    );
    assert!(sft.contains("| objective | sft |"), "{sft}");
}

#[test]
fn one_iteration_through_every_stage() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let policy = root.join("sft/policy");
    sft_metrics_are_finite_and_leave_ppo_figures_null(root);
    let (rollouts, checkpoint_id) = rollouts_are_the_policys_and_reproducible(root, &policy);
    rewards_and_step_advantages(root, &policy, &rollouts);
    ppo_starts_at_the_behaviour_policy_and_resumes(root, &policy, &rollouts, &checkpoint_id);
    evaluate_writes_a_row_per_val_task_and_run(root);
    pass_at_k_is_reproducible_and_refuses_greedy_sampling(root);
}

/// The SFT metrics `prepare` wrote: finite losses and gradients, PPO-only
/// figures null (not 0.0).
fn sft_metrics_are_finite_and_leave_ppo_figures_null(root: &Path) {
    let metrics: Vec<MetricRow> = TableReader::open(&root.join("sft/metrics"), TableName::Metrics)
        .unwrap()
        .read_rows()
        .unwrap();
    // 7 task types, one demonstration each, 4 per mini-batch, 3 epochs.
    assert_eq!(metrics.len(), 2 * 3);
    assert!(
        metrics
            .iter()
            .all(|m| m.loss.is_finite() && m.grad_norm > 0.0)
    );
    // PPO-only figures are null on SFT rows, not 0.0.
    assert!(
        metrics
            .iter()
            .all(|m| m.clipfrac.is_none() && m.clipfrac_lower.is_none() && m.approx_kl.is_none()),
        "{metrics:?}"
    );
}

/// Rollouts of the SFT policy under `root/it0/rollouts`: one step per
/// trajectory, the policy's id, log-probs at most 0, SimpleVLA-RL's
/// temperature; the same seed gives the same rollouts, whatever the
/// sampling batch size. Returns them and the policy's manifest.
fn rollouts_are_the_policys_and_reproducible(root: &Path, policy: &Path) -> (PathBuf, String) {
    let rollouts = root.join("it0/rollouts");
    let collect = |out: &Path| {
        ok(
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
                "group_size=3",
                "--set",
                "tasks_per_iteration=4",
                "--set",
                "max_new_tokens=40",
                "--set",
                "batch_rows=5",
            ],
        )
    };
    collect(&rollouts);
    let trajectories: Vec<TrajectoryRow> =
        TableReader::open(&rollouts.join("trajectories"), TableName::Trajectories)
            .unwrap()
            .read_rows()
            .unwrap();
    let steps: Vec<StepRow> = TableReader::open(&rollouts.join("steps"), TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(trajectories.len(), 12);
    assert_eq!(steps.len(), 12);
    let checkpoint_id = std::fs::read_to_string(policy.join("manifest.json")).unwrap();
    for (trajectory, step) in trajectories.iter().zip(&steps) {
        assert_eq!(trajectory.trajectory_id, step.trajectory_id);
        assert!(trajectory.trajectory_id.starts_with(&trajectory.group_id));
        assert!(checkpoint_id.contains(&trajectory.policy));
        assert_eq!(step.response_ids.len(), step.old_logprobs.len());
        assert!(!step.response_ids.is_empty() && step.response_ids.len() <= 40);
        assert!(
            step.old_logprobs
                .iter()
                .all(|&lp| lp <= 0.0 && lp.is_finite())
        );
        assert_eq!(trajectory.temperature, 1.6);
    }
    // The same seed gives the same rollouts, whatever the sampling batch size.
    let again = root.join("again");
    collect(&again);
    let hash = |dir: &Path| {
        TableReader::open(&dir.join("steps"), TableName::Steps)
            .unwrap()
            .manifest()
            .content_hash
            .clone()
    };
    assert_eq!(hash(&rollouts), hash(&again));
    (rollouts, checkpoint_id)
}

/// Rewards (verify) and step advantages (grpo_step, rule) of the rollouts,
/// under `root/it0`.
fn rewards_and_step_advantages(root: &Path, policy: &Path, rollouts: &Path) {
    ok(
        "score-rewards",
        &[
            "--input",
            s(rollouts),
            "--input",
            s(&root.join("data/train")),
            "--out",
            s(&root.join("it0/rewards")),
            "--set",
            "reward.fn=verify",
        ],
    );
    ok(
        "compute-advantages",
        &[
            "--policy",
            s(policy),
            "--input",
            s(rollouts),
            "--input",
            s(&root.join("it0/rewards")),
            "--out",
            s(&root.join("it0/adv")),
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.kind=rule",
        ],
    );
}

/// A PPO update from the SFT policy starts at the behaviour policy (ratio
/// 1, nothing clipped), records its parent, moves the weights through the
/// entropy bonus alone, and a second update resumes PPO's AdamW moments
/// (not SFT's).
fn ppo_starts_at_the_behaviour_policy_and_resumes(
    root: &Path,
    policy: &Path,
    rollouts: &Path,
    checkpoint_id: &str,
) {
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
            s(&root.join("it0/update")),
            "--set",
            "iteration=0",
            "--set",
            "mini_batch=6",
            "--set",
            "micro_batch=4",
            "--set",
            "epochs=2",
            "--set",
            "ppo.entropy_coef=0.01",
        ],
    );
    assert!(update.contains("mean clipfrac"), "{update}");
    let metrics: Vec<MetricRow> =
        TableReader::open(&root.join("it0/update/metrics"), TableName::Metrics)
            .unwrap()
            .read_rows()
            .unwrap();
    assert_eq!(metrics.len(), 4);
    // The first update starts at the behaviour policy: ratio 1, nothing clipped.
    assert!(
        metrics[0].approx_kl.unwrap().abs() < 1e-3,
        "{:?}",
        metrics[0]
    );
    assert_eq!(metrics[0].clipfrac, Some(0.0));
    let manifest = std::fs::read_to_string(root.join("it0/update/policy/manifest.json")).unwrap();
    let sft_id: serde_json::Value = serde_json::from_str(checkpoint_id).unwrap();
    let new: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(new["parent"], sft_id["id"]);
    // All-equal rewards give zero advantages; the entropy bonus still moves the weights.
    assert_ne!(new["id"], sft_id["id"]);
    // The SFT moments are not carried into PPO; PPO's own are, call after call.
    assert!(update.contains("another objective"), "{update}");
    let again = ok(
        "update-policy",
        &[
            "--policy",
            s(&root.join("it0/update/policy")),
            "--input",
            s(rollouts),
            "--input",
            s(&root.join("it0/adv")),
            "--out",
            s(&root.join("it1/update")),
            "--set",
            "mini_batch=6",
            "--set",
            "micro_batch=4",
        ],
    );
    assert!(again.contains("AdamW resumed at step 4"), "{again}");
}

/// Evaluate on val: 2 runs of the 4 tasks, each row with its split and
/// task type.
fn evaluate_writes_a_row_per_val_task_and_run(root: &Path) {
    let eval = ok(
        "evaluate",
        &[
            "--policy",
            s(&root.join("it0/update/policy")),
            "--input",
            s(&root.join("data/val")),
            "--out",
            s(&root.join("it0/eval")),
            "--set",
            "runs=2",
            "--set",
            "max_new_tokens=40",
        ],
    );
    assert!(eval.contains("success, split val"), "{eval}");
    let rows: Vec<EvalRow> = TableReader::open(&root.join("it0/eval/eval"), TableName::Eval)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(rows.len(), 4 * 2);
    assert!(
        rows.iter()
            .all(|r| r.split == "val" && r.task_type.is_some())
    );
}

/// pass@k: 4 sampled answers per task and layout, the same with the same
/// seed; the eval table keeps the greedy answers only; temperature 0 is
/// refused, naming the key.
fn pass_at_k_is_reproducible_and_refuses_greedy_sampling(root: &Path) {
    let pass_at_k = |out: &str, temperature: &str| {
        run(
            "evaluate",
            &[
                "--policy",
                s(&root.join("it0/update/policy")),
                "--input",
                s(&root.join("data/val")),
                "--out",
                s(&root.join(out)),
                "--seed",
                "3",
                "--set",
                "runs=2",
                "--set",
                "max_new_tokens=40",
                "--set",
                "pass_at_k.samples=4",
                "--set",
                &format!("pass_at_k.temperature={temperature}"),
            ],
        )
    };
    let first = pass_at_k("it0/passk", "1.0");
    assert_eq!(first.code, 0, "{first}");
    let summary =
        |out: &str| std::fs::read_to_string(root.join(out).join("_summary.evaluate.md")).unwrap();
    let passk_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("| pass@k"))
            .map(String::from)
            .collect()
    };
    let lines = passk_lines(&summary("it0/passk"));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("pass@k, split val") && l.contains("@1 ") && l.contains("@4 ")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("pass@k answers") && l.contains("32 (4 tasks x 2 runs x 4 samples")),
        "{lines:?}"
    );
    let second = pass_at_k("it0/passk-again", "1.0");
    assert_eq!(second.code, 0, "{second}");
    assert_eq!(lines, passk_lines(&summary("it0/passk-again")));
    let rows: Vec<EvalRow> = TableReader::open(&root.join("it0/passk/eval"), TableName::Eval)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(rows.len(), 4 * 2);
    let greedy = pass_at_k("it0/passk-greedy", "0");
    assert_eq!(greedy.code, 2, "{greedy}");
    assert!(greedy.stderr.contains("pass_at_k.temperature"), "{greedy}");
}

/// scripts/rl_loop's curve starts at the policy RL started from: its first
/// row (`before`) is the greedy val success of the init checkpoint, and the
/// report draws and tabulates it.
#[test]
fn the_rl_loop_curve_starts_at_the_policy_before_rl() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let rl = root.join("rl");
    let run = embodyflow_tests::run_script(
        "rl_loop",
        &[
            s(&rl),
            s(&root.join("sft/policy")),
            s(&root.join("data")),
            "1",
        ],
        &[("TASKS", "2"), ("G", "2")],
    );
    assert_eq!(run.code, 0, "{run}");
    let stdout = &run.stdout;
    // The init policy's val success, as evaluate states it.
    let summary = std::fs::read_to_string(rl.join("before/eval-val/_summary.evaluate.md")).unwrap();
    let before = summary
        .lines()
        .find_map(|l| l.strip_prefix("| success, split val | "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{summary}"))
        .to_string();
    let curve = std::fs::read_to_string(rl.join("curve.tsv")).unwrap();
    let rows: Vec<&str> = curve.lines().collect();
    assert_eq!(rows[0], "iteration\ttrain_success\tval_success");
    assert_eq!(rows[1], format!("before\t-\t{before}"), "{curve}");
    assert!(rows[2].starts_with("0\t"), "{curve}");
    assert!(
        stdout.contains(&format!("val success {before}")),
        "{stdout}"
    );
    let report = root.join("report");
    let md = ok(
        "report",
        &[
            "--curve",
            &format!("grpo={}", s(&rl.join("curve.tsv"))),
            "--out",
            s(&report),
        ],
    );
    assert!(md.contains("val before RL"), "{md}");
    assert!(md.contains(&format!("| grpo | 1 | {before} |")), "{md}");
    assert!(report.join("success.png").is_file());
}

#[test]
fn bad_checkpoints_and_bad_advantages_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let policy = root.join("sft/policy");
    let train = root.join("data/train");
    let (broken, config) = weights_of_another_shape_are_named(root, &policy, &train);
    a_tokenizer_of_another_vocabulary_is_named(root, &broken, &config);
    a_context_too_short_for_the_prompts_is_named(root);
    let (rollouts, steps) = advantages_of_another_length_are_named(root, &policy, &train);
    masks_with_holes_train_and_masks_of_another_length_are_named(root, &policy, &rollouts, &steps);
}

/// A config that disagrees with the weights: collect-rollouts exits 2
/// naming the weights file and writes nothing. Returns the broken
/// checkpoint (a copy of the policy) and the policy's config.
fn weights_of_another_shape_are_named(
    root: &Path,
    policy: &Path,
    train: &Path,
) -> (PathBuf, String) {
    let broken = root.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "manifest.json",
        "config.json",
    ] {
        std::fs::copy(policy.join(file), broken.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(policy.join("config.json")).unwrap();
    let missing = root.join("x");
    std::fs::write(
        broken.join("config.json"),
        config.replace("\"n_embd\": 32", "\"n_embd\": 64"),
    )
    .unwrap();
    let args = [
        "--policy",
        s(&broken),
        "--input",
        s(train),
        "--out",
        s(&missing),
    ];
    let result = run("collect-rollouts", &args);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("model.safetensors") && result.stderr.contains("shape"),
        "{result}"
    );
    assert!(!missing.exists(), "nothing written");
    (broken, config)
}

/// A tokenizer from another vocabulary: evaluate exits 2 naming the file
/// and the vocabulary size.
fn a_tokenizer_of_another_vocabulary_is_named(root: &Path, broken: &Path, config: &str) {
    std::fs::write(broken.join("config.json"), config).unwrap();
    let other = root.join("other");
    ok(
        "init-policy",
        &[
            "--out",
            s(&other),
            "--set",
            "model.n_embd=32",
            "--set",
            "model.n_layer=1",
            "--set",
            "tokenizer.vocab_size=350",
            "--set",
            "tokenizer.corpus_tasks=40",
        ],
    );
    std::fs::copy(other.join("tokenizer.json"), broken.join("tokenizer.json")).unwrap();
    let result = run(
        "evaluate",
        &[
            "--policy",
            s(broken),
            "--input",
            s(&root.join("data/val")),
            "--out",
            s(&root.join("y")),
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("tokenizer.json") && result.stderr.contains("vocab_size"),
        "{result}"
    );
}

/// A context too short for the prompts: evaluate exits 2 naming n_ctx and
/// the task.
fn a_context_too_short_for_the_prompts_is_named(root: &Path) {
    let short = root.join("short");
    ok(
        "init-policy",
        &[
            "--out",
            s(&short),
            "--set",
            "model.n_embd=16",
            "--set",
            "model.n_layer=1",
            "--set",
            "model.n_ctx=64",
            "--set",
            "tokenizer.corpus_tasks=40",
        ],
    );
    let result = run(
        "evaluate",
        &[
            "--policy",
            s(&short),
            "--input",
            s(&root.join("data/val")),
            "--out",
            s(&root.join("w")),
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("n_ctx = 64") && result.stderr.contains("household/val/"),
        "{result}"
    );
}

/// Advantages whose length differs from the response: update-policy exits
/// 2 naming the trajectory and writes nothing. Returns the rollouts it read
/// and their steps.
fn advantages_of_another_length_are_named(
    root: &Path,
    policy: &Path,
    train: &Path,
) -> (PathBuf, Vec<StepRow>) {
    let rollouts = root.join("r");
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(policy),
            "--input",
            s(train),
            "--out",
            s(&rollouts),
            "--set",
            "group_size=2",
            "--set",
            "tasks_per_iteration=2",
            "--set",
            "max_new_tokens=12",
        ],
    );
    let steps: Vec<StepRow> = TableReader::open(&rollouts.join("steps"), TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    let advantages: Vec<embodyflow_core::schemas::AdvantageRow> = steps
        .iter()
        .map(|step| embodyflow_core::schemas::AdvantageRow {
            trajectory_id: step.trajectory_id.clone(),
            step_index: step.step_index,
            advantages: vec![0.5; step.response_ids.len() + 1],
            returns: None,
            episode_adv: 0.5,
            step_adv: None,
            estimator: "grpo".into(),
        })
        .collect();
    write_table(&root.join("adv"), &advantages);
    let result = run(
        "update-policy",
        &[
            "--policy",
            s(policy),
            "--input",
            s(&rollouts),
            "--input",
            s(&root.join("adv")),
            "--out",
            s(&root.join("z")),
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("old log-probs") && result.stderr.contains(&steps[0].trajectory_id),
        "{result}"
    );
    assert!(!root.join("z").exists(), "nothing written");
    (rollouts, steps)
}

/// collect-rollouts writes no response mask for one-shot answers. Our own steps with holes
/// (tool tokens) train; a mask of the wrong length is bad input naming the
/// step, and nothing is written.
fn masks_with_holes_train_and_masks_of_another_length_are_named(
    root: &Path,
    policy: &Path,
    rollouts: &Path,
    steps: &[StepRow],
) {
    assert!(steps.iter().all(|s| s.response_mask.is_none()));
    let advantages: Vec<embodyflow_core::schemas::AdvantageRow> = steps
        .iter()
        .map(|step| embodyflow_core::schemas::AdvantageRow {
            trajectory_id: step.trajectory_id.clone(),
            step_index: step.step_index,
            advantages: vec![0.5; step.response_ids.len()],
            returns: None,
            episode_adv: 0.5,
            step_adv: None,
            estimator: "grpo".into(),
        })
        .collect();
    write_table(&root.join("adv-ok"), &advantages);
    let trajectories: Vec<TrajectoryRow> =
        TableReader::open(&rollouts.join("trajectories"), TableName::Trajectories)
            .unwrap()
            .read_rows()
            .unwrap();
    let with_masks = |name: &str, mask: &dyn Fn(usize) -> Vec<bool>| {
        let dir = root.join(name);
        write_table(&dir, &trajectories);
        let masked: Vec<StepRow> = steps
            .iter()
            .map(|s| StepRow {
                response_mask: Some(mask(s.response_ids.len())),
                ..s.clone()
            })
            .collect();
        write_table(&dir, &masked);
        run(
            "update-policy",
            &[
                "--policy",
                s(policy),
                "--input",
                s(&dir),
                "--input",
                s(&root.join("adv-ok")),
                "--out",
                s(&root.join(format!("{name}-out"))),
            ],
        )
    };
    let holes = with_masks("holes", &|n| (0..n).map(|t| t % 3 != 1).collect());
    assert_eq!(holes.code, 0, "{holes}");
    let short = with_masks("short", &|n| vec![true; n + 1]);
    assert_eq!(short.code, 2, "{short}");
    assert!(
        short.stderr.contains("response_mask has")
            && short
                .stderr
                .contains(&format!("`{}` step 0", steps[0].trajectory_id)),
        "{short}"
    );
    assert!(!root.join("short-out").exists(), "nothing written");
}

/// Rollouts whose answers are the expert plans of the first `groups` train
/// tasks, sample 1 of each group with its second step's id broken; written
/// under `root/step-rollouts`.
fn expert_rollouts(root: &Path, groups: usize) -> std::path::PathBuf {
    let tasks: Vec<TaskRow> = TableReader::open(&root.join("data/train/tasks"), TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap();
    let tokenizer =
        tokenizers::Tokenizer::from_file(root.join("sft/policy/tokenizer.json")).unwrap();
    let encode = |text: &str| -> Vec<i32> {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        ids.into_iter().map(|id| id as i32).collect()
    };
    let plan_id = tokenizer.token_to_id("<|plan|>").unwrap() as i32;
    let (mut trajectories, mut steps) = (Vec::new(), Vec::new());
    for task in tasks.iter().take(groups) {
        let actions = task.gt_actions.as_ref().unwrap();
        for sample in 0..2 {
            let executable: Vec<serde_json::Value> = actions
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
            let mut prompt = encode(&format!("Task: {}\n", task.instruction));
            prompt.push(plan_id);
            let response = encode(&answer.to_string());
            let logprobs = vec![-1.0; response.len()];
            steps.push(StepRow::one_shot(
                trajectory_id.clone(),
                prompt,
                response,
                logprobs,
            ));
            trajectories.push(TrajectoryRow {
                source_row: None,
                infra_fault: None,
                failure_reason: None,
                trajectory_id,
                group_id,
                task_id: task.task_id.clone(),
                sample_index: sample,
                iteration: 0,
                policy: "fixture".into(),
                temperature: 1.0,
                num_steps: 1,
                env_steps: actions.len() as i32,
                complete: true,
                response_text: Some(answer.to_string()),
                seed: 0,
                ever_grasped: None,
            });
        }
    }
    let rollouts = root.join("step-rollouts");
    write_table(&rollouts, &trajectories);
    write_table(&rollouts, &steps);
    rollouts
}

#[test]
fn teacher_logp_and_the_rule_judge_feed_grpo_step() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let policy = root.join("sft/policy");
    let rollouts = expert_rollouts(root, 3);
    let train = root.join("data/train");
    ok(
        "score-rewards",
        &[
            "--input",
            s(&rollouts),
            "--input",
            s(&train),
            "--out",
            s(&root.join("rewards")),
            "--set",
            "reward.fn=verify",
        ],
    );
    // teacher-logp over the fixture rollouts: TEACHER, OUT and one --set.
    let teacher_args = |teacher: String, out: &Path, set: &str| -> Vec<String> {
        [
            "--policy",
            s(&policy),
            "--teacher",
            &teacher,
            "--input",
            s(&rollouts),
            "--input",
            s(&train),
            "--out",
            s(out),
            "--set",
            set,
        ]
        .map(String::from)
        .to_vec()
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let teacher = ok(
        "teacher-logp",
        &args(&teacher_args(
            "self".into(),
            &root.join("teacher"),
            "batch_rows=4",
        )),
    );
    assert!(teacher.contains("| steps scored | 6 |"), "{teacher}");
    let rows: Vec<TeacherLogpRow> =
        TableReader::open(&root.join("teacher/teacher_logp"), TableName::TeacherLogp)
            .unwrap()
            .read_rows()
            .unwrap();
    let steps: Vec<StepRow> = TableReader::open(&rollouts.join("steps"), TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    for (row, step) in rows.iter().zip(&steps) {
        assert_eq!(row.trajectory_id, step.trajectory_id);
        assert_eq!(row.teacher_logp.len(), step.response_ids.len());
        assert_eq!(row.student_logp.len(), step.response_ids.len());
        assert_eq!(row.teacher, "self");
    }
    let judge = ok(
        "judge-steps",
        &[
            "--input",
            s(&rollouts),
            "--input",
            s(&root.join("rewards")),
            "--input",
            s(&train),
            "--out",
            s(&root.join("judge")),
        ],
    );
    // The expert samples' steps and each broken sample's first step are ok;
    // every step from a broken sample's second one on is invalid or after one.
    let tasks: Vec<TaskRow> = TableReader::open(&train.join("tasks"), TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap();
    let plan_steps: usize = tasks
        .iter()
        .take(3)
        .map(|t| t.gt_actions.as_ref().unwrap().len())
        .sum();
    assert!(
        judge.contains(&format!("| plan steps | {} |", 2 * plan_steps)),
        "{judge}"
    );
    assert!(
        judge.contains(&format!("| steps: ok | {} ", plan_steps + 3)),
        "{judge}"
    );
    let advantages = ok(
        "compute-advantages",
        &[
            "--policy",
            s(&policy),
            "--input",
            s(&rollouts),
            "--input",
            s(&root.join("rewards")),
            "--input",
            s(&root.join("teacher")),
            "--input",
            s(&root.join("judge")),
            "--out",
            s(&root.join("adv")),
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.kind=forward_proxy",
            "--set",
            "step.gate=prompt",
        ],
    );
    assert!(
        advantages.contains("| responses with non-zero A^S | 6 of 6 |"),
        "{advantages}"
    );
    // The report gathers the variant (rewards found through its lineage) and the teacher.
    let report = ok(
        "report",
        &[
            "--variant",
            &format!("proxy={}", s(&root.join("adv"))),
            "--teacher",
            &format!("self={}", s(&root.join("teacher"))),
            "--out",
            s(&root.join("report")),
        ],
    );
    assert!(
        report.contains("| proxy | grpo_step forward_proxy"),
        "{report}"
    );
    assert!(report.contains("| self | 6 |"), "{report}");
    assert!(root.join("report/step_adv_proxy.png").is_file());
    assert!(root.join("report/step-credit.md").is_file());

    // A teacher with another tokenizer: exit 2 naming its tokenizer, nothing written.
    ok(
        "init-policy",
        &[
            "--out",
            s(&root.join("other")),
            "--set",
            "model.n_embd=16",
            "--set",
            "model.n_layer=1",
            "--set",
            "model.n_head=2",
            "--set",
            "tokenizer.vocab_size=350",
            "--set",
            "tokenizer.corpus_tasks=30",
        ],
    );
    let result = run(
        "teacher-logp",
        &args(&teacher_args(
            s(&root.join("other")).into(),
            &root.join("teacher-other"),
            "batch_rows=16",
        )),
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("other/tokenizer.json") && result.stderr.contains("differs"),
        "{result}"
    );
    assert!(!root.join("teacher-other/teacher_logp").exists());
    // A teacher template without its placeholder is a usage error.
    let result = run(
        "teacher-logp",
        &args(&teacher_args(
            "self".into(),
            &root.join("teacher-bad"),
            "template.teacher={prompt}",
        )),
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(result.stderr.contains("{reference_plan}"), "{result}");
}
