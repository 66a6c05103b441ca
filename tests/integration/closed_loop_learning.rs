//! Closed-loop rows through the learning stages: tabletop tasks →
//! a tiny VLA → `collect-rollouts` (G = 4) → `score-rewards` (outcome:
//! `reward_coef` on success, no plan columns) → `compute-advantages` (GRPO,
//! Dr. GRPO): one advantages row per decision, the episode advantage on every
//! action token of every decision, summing to zero within a group. A plan
//! reward asked on closed-loop episodes is refused (exit 2, nothing written).
//! The untrained VLA succeeds in none of its episodes (every group scores
//! 0, so GRPO gives 0), hence mixed groups come from the same rows with
//! rewards set by hand: sample 0 of each group succeeds.

use std::collections::HashMap;
use std::path::Path;

use embodyflow_algos::grpo::{GroupNorm, episode_advantages};
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::schemas::{AdvantageRow, RewardRow, StepRow, TableName, TrajectoryRow};
use embodyflow_tests::{read_advantages, run, tabletop_tasks_and_tiny_vla};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

/// Six tabletop train tasks, a tiny VLA (width 32, one block, chunks of 8)
/// and its closed-loop rollouts (G = 4) under `root`.
fn rollouts(root: &Path) {
    tabletop_tasks_and_tiny_vla(root, 6);
    let vla = root.join("vla");
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(&vla),
            "--input",
            s(&root.join("tasks")),
            "--out",
            s(&root.join("rollouts")),
            "--seed",
            "5",
            "--set",
            "group_size=4",
            "--set",
            "batch_rows=8",
        ],
    );
}

fn read<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(dir, table).unwrap().read_rows().unwrap()
}

fn advantages(root: &Path, rewards: &Path, out: &Path, extra: &[&str]) -> Vec<AdvantageRow> {
    let collected = root.join("rollouts");
    let mut args = vec![
        "--input",
        s(&collected),
        "--input",
        s(rewards),
        "--out",
        s(out),
    ];
    args.extend(extra);
    ok("compute-advantages", &args);
    read_advantages(&out.join("advantages"))
}

/// Every steps row has one advantages row carrying its episode's advantage
/// on each of its K × D action tokens, but 0 on the tokens of actions that
/// never ran (the tail its `response_mask` marks, a chunk the episode's end
/// cut); returns the episode advantage by trajectory id.
fn check_broadcast(steps: &[StepRow], rows: &[AdvantageRow]) -> HashMap<String, f32> {
    assert_eq!(rows.len(), steps.len(), "one advantages row per decision");
    let steps: HashMap<(&str, i32), &StepRow> = steps
        .iter()
        .map(|s| ((s.trajectory_id.as_str(), s.step_index), s))
        .collect();
    let mut episode: HashMap<String, f32> = HashMap::new();
    for row in rows {
        let step = steps[&(row.trajectory_id.as_str(), row.step_index)];
        assert_eq!(
            row.advantages.len(),
            step.response_ids.len(),
            "{} {}",
            row.trajectory_id,
            row.step_index
        );
        let ran = |t: usize| step.response_mask.as_ref().is_none_or(|m| m[t]);
        for (t, &a) in row.advantages.iter().enumerate() {
            let want = if ran(t) { row.episode_adv } else { 0.0 };
            assert_eq!(
                a, want,
                "{} {} token {t}",
                row.trajectory_id, row.step_index
            );
        }
        let first = *episode
            .entry(row.trajectory_id.clone())
            .or_insert(row.episode_adv);
        assert_eq!(
            first, row.episode_adv,
            "{}: decisions disagree",
            row.trajectory_id
        );
    }
    episode
}

#[test]
fn closed_loop_episodes_are_scored_by_outcome_and_get_group_advantages_on_every_token() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    rollouts(root);
    let trajectories: Vec<TrajectoryRow> =
        read(&root.join("rollouts/trajectories"), TableName::Trajectories);
    let steps: Vec<StepRow> = read(&root.join("rollouts/steps"), TableName::Steps);
    assert_eq!(trajectories.len(), 6 * 4);
    assert!(
        trajectories.iter().any(|t| t.num_steps > 1),
        "episodes of several decisions"
    );

    // score-rewards: outcome, reward_coef 2.
    let rewards = root.join("rewards");
    let summary = ok(
        "score-rewards",
        &[
            "--input",
            s(&root.join("rollouts")),
            "--input",
            s(&root.join("tasks")),
            "--out",
            s(&rewards),
            "--set",
            "reward.reward_coef=2",
        ],
    );
    assert!(summary.contains("closed-loop episodes"), "{summary}");
    let printed = ok("table", &["validate", s(&rewards.join("rewards"))]);
    assert!(printed.starts_with("ok rewards"), "{printed}");
    let scored: Vec<RewardRow> = read(&rewards.join("rewards"), TableName::Rewards);
    assert_eq!(scored.len(), trajectories.len(), "one row per episode");
    let by_id: HashMap<&str, &TrajectoryRow> = trajectories
        .iter()
        .map(|t| (t.trajectory_id.as_str(), t))
        .collect();
    for row in &scored {
        let episode = by_id[row.trajectory_id.as_str()];
        assert_eq!(row.group_id, episode.group_id);
        assert_eq!(row.score, if episode.complete { 2.0 } else { 0.0 });
        assert_eq!(row.success, episode.complete);
        assert_eq!((row.format, row.accuracy), (0.0, row.score));
        assert!(row.parse_ok);
        assert!(row.pred_actions.is_none() && row.step_match.is_none() && row.step_valid.is_none());
        assert_eq!(row.reward_fn, "outcome");
        assert!(row.ever_grasped.is_some());
        assert_eq!(row.ever_grasped, episode.ever_grasped, "copied");
    }

    // A plan reward on closed-loop episodes: exit 2, named, nothing written.
    for function in ["verify", "embodied_r1"] {
        let out = root.join(format!("refused-{function}"));
        let set = format!("reward.fn={function}");
        let result = run(
            "score-rewards",
            &[
                "--input",
                s(&root.join("rollouts")),
                "--input",
                s(&root.join("tasks")),
                "--out",
                s(&out),
                "--set",
                &set,
            ],
        );
        assert_eq!(result.code, 2, "{result}");
        let text = result.to_string();
        assert!(
            text.contains("closed-loop") && text.contains(function) && text.contains("tabletop-"),
            "{text}"
        );
        assert!(!out.join("rewards").exists());
    }

    // An episode's last chunk is cut unless it ends on a chunk boundary.
    assert!(
        steps.iter().any(|s| s.response_mask.is_some()),
        "no decision was cut by its episode's end"
    );
    // GRPO on the collected scores (whatever their mix).
    let rows = advantages(root, &rewards, &root.join("adv"), &[]);
    let episode = check_broadcast(&steps, &rows);
    let mut groups: Vec<&str> = scored.iter().map(|r| r.group_id.as_str()).collect();
    groups.sort();
    groups.dedup();
    let index: Vec<u32> = scored
        .iter()
        .map(|r| groups.binary_search(&r.group_id.as_str()).unwrap() as u32)
        .collect();
    let scores: Vec<f32> = scored.iter().map(|r| r.score).collect();
    let expected = episode_advantages(&scores, &index, GroupNorm::default());
    for (row, want) in scored.iter().zip(&expected) {
        assert_eq!(episode[&row.trajectory_id], *want, "{}", row.trajectory_id);
    }

    // Mixed groups for sure: sample 0 of each group succeeds, the others not.
    let table = rewards.join("rewards");
    let producer = TableReader::open(&table, TableName::Rewards)
        .unwrap()
        .manifest()
        .producer
        .clone();
    let mixed_dir = root.join("mixed");
    let mixed: Vec<RewardRow> = scored
        .iter()
        .map(|r| {
            let win = r.trajectory_id.ends_with("/s0");
            RewardRow {
                infra_fault: None,
                score: if win { 2.0 } else { 0.0 },
                accuracy: if win { 2.0 } else { 0.0 },
                success: win,
                ..r.clone()
            }
        })
        .collect();
    let mut writer = TableWriter::create(
        &mixed_dir,
        TableName::Rewards,
        WriteOptions::default(),
        true,
    )
    .unwrap();
    writer.write_rows(&mixed).unwrap();
    writer.finish(&producer, &[]).unwrap();

    for (estimator, winner, loser) in [
        // std of (2, 0, 0, 0) is 1 (unbiased): (2 - 0.5) / 1, (0 - 0.5) / 1.
        ("grpo", 1.5, -0.5),
        // Dr. GRPO: no division by the std.
        ("dr_grpo", 1.5, -0.5),
    ] {
        let set = format!("estimator={estimator}");
        let out = root.join(format!("adv-{estimator}"));
        let rows = advantages(
            root,
            &mixed_dir,
            &out,
            &["--set", &set, "--set", "filter.dynamic_sampling=true"],
        );
        let episode = check_broadcast(&steps, &rows);
        assert_eq!(episode.len(), 6 * 4, "every group is mixed and kept");
        let mut sums: HashMap<&str, f32> = HashMap::new();
        for row in &mixed {
            let a = episode[&row.trajectory_id];
            let want = if row.success { winner } else { loser };
            assert!(
                (a - want).abs() < 1e-4,
                "{estimator} {}: {a}",
                row.trajectory_id
            );
            *sums.entry(&row.group_id).or_default() += a;
        }
        for (group, sum) in sums {
            assert!(sum.abs() < 1e-4, "{estimator} group {group}: {sum}");
        }
    }
}
