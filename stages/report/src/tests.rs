//! The report over written tables: credit figures, heatmap rows and the
//! Markdown of a variant whose rewards and steps are found through its
//! lineage, a teacher's contrast, bad input that leaves nothing written.

use std::path::{Path, PathBuf};

use super::*;
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::manifest::Producer;
use embodyflow_core::schemas::{AdvantageRow, RewardRow, StepRow, TableName, TeacherLogpRow};

fn producer(stage: &str, config: serde_json::Value) -> Producer {
    Producer {
        stage: stage.into(),
        version: "test".into(),
        config,
        seed: 0,
        shard: "0/1".into(),
    }
}

fn reward(id: &str, success: bool) -> RewardRow {
    RewardRow {
        infra_fault: None,
        trajectory_id: id.into(),
        group_id: "g".into(),
        score: if success { 1.0 } else { -1.0 },
        format: 1.0,
        accuracy: if success { 1.0 } else { -1.0 },
        success,
        parse_ok: true,
        pred_actions: None,
        step_match: None,
        step_valid: None,
        reward_fn: "verify".into(),
        ever_grasped: None,
        token_rewards: None,
    }
}

fn write_rewards(root: &Path, rows: &[RewardRow], overwrite: bool) -> TableReader {
    let mut writer = TableWriter::create(
        &root.join("rewards"),
        TableName::Rewards,
        WriteOptions::default(),
        overwrite,
    )
    .unwrap();
    writer.write_rows(rows).unwrap();
    writer
        .finish(
            &producer(
                "score-rewards",
                serde_json::json!({"match": {"mode": "prefix"}}),
            ),
            &[],
        )
        .unwrap();
    TableReader::open(&root.join("rewards/rewards"), TableName::Rewards).unwrap()
}

/// Two successful and two failed trajectories, one step each; A^E = +1 /
/// -1 and A = A^E + A^S on every token.
fn advantage_rows() -> Vec<AdvantageRow> {
    let row = |id: &str, episode: f32, step: Vec<f32>| AdvantageRow {
        trajectory_id: id.into(),
        step_index: 0,
        advantages: step.iter().map(|s| episode + s).collect(),
        returns: None,
        episode_adv: episode,
        step_adv: Some(step),
        estimator: "grpo_step".into(),
    };
    vec![
        // Success: one credited token flips (1 - 1.5 < 0), one does not.
        row("a", 1.0, vec![0.0, 0.5, -1.5]),
        row("b", 1.0, vec![0.0, 0.0, 0.5]),
        // Failure: one credited token flips (-1 + 2 > 0).
        row("c", -1.0, vec![2.0, 0.0, 0.0]),
        row("d", -1.0, vec![0.0, -0.5, 0.0]),
        // A group that scored the same throughout: A^E = 0, the credited
        // token counts as flipped in "all" but not among A^E != 0.
        row("e", 0.0, vec![0.0, 0.0, 0.5]),
    ]
}

/// The steps of [`advantage_rows`]: three response tokens each, ids
/// 10 * k + t for the k-th trajectory.
fn write_steps(root: &Path) -> TableReader {
    let mut writer = TableWriter::create(
        &root.join("rollouts"),
        TableName::Steps,
        WriteOptions::default(),
        false,
    )
    .unwrap();
    let rows: Vec<StepRow> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let ids = (0..3).map(|t| 10 * k as i32 + t).collect();
            StepRow::one_shot(id.to_string(), vec![1, 2], ids, vec![-0.5; 3])
        })
        .collect();
    writer.write_rows(&rows).unwrap();
    writer
        .finish(&producer("collect-rollouts", serde_json::json!({})), &[])
        .unwrap();
    TableReader::open(&root.join("rollouts/steps"), TableName::Steps).unwrap()
}

fn write_variant(root: &Path, rewards: &TableReader) -> PathBuf {
    let steps = write_steps(root);
    let dir = root.join("adv");
    let mut writer =
        TableWriter::create(&dir, TableName::Advantages, WriteOptions::default(), false).unwrap();
    writer.write_rows(&advantage_rows()).unwrap();
    let config = serde_json::json!({
        "estimator": "grpo_step",
        "step": {"kind": "rule", "credit_target": "action_id", "score_source": "action_name",
                 "omega": 1.0, "gate": "none"},
        "stepopsd": {"enabled": false}
    });
    writer
        .finish(
            &producer("compute-advantages", config),
            &[rewards.input_ref(), steps.input_ref()],
        )
        .unwrap();
    dir
}

#[test]
fn bad_input_found_after_a_png_leaves_nothing_written() {
    let root = tempfile::tempdir().unwrap();
    let rewards = write_rewards(root.path(), &[reward("a", true), reward("b", false)], false);
    let variant = write_variant(root.path(), &rewards);
    let out = root.path().join("report");
    // The first variant draws its PNGs; the second, named the same, is
    // bad input.
    let args = Args {
        variants: vec![("v".into(), variant.clone()), ("v".into(), variant)],
        teachers: Vec::new(),
        curves: Vec::new(),
        tokenizer: None,
        policy: None,
        out: out.clone(),
    };
    let err = run(args).unwrap_err();
    assert_eq!(
        embodyflow_core::Classify::kind(&err),
        embodyflow_core::ErrorKind::BadInput,
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "written before the bad input: {left:?}");
}

#[test]
fn credit_figures_count_flips_and_split_a_s_by_outcome() {
    let root = tempfile::tempdir().unwrap();
    let rewards = write_rewards(
        root.path(),
        &[
            reward("a", true),
            reward("b", true),
            reward("c", false),
            reward("d", false),
            reward("e", false),
        ],
        false,
    );
    let variant = write_variant(root.path(), &rewards);
    let (advantages, _) = scan(&variant.join("advantages"), TableName::Advantages).unwrap();
    let (rewards_scan, _) = scan(rewards.dir(), TableName::Rewards).unwrap();
    let figures = credit_figures(advantages.clone(), rewards_scan.clone()).unwrap();
    assert_eq!(figures.tokens, 15);
    assert_eq!(figures.credited, 6);
    assert_eq!(figures.flip[0], Some(3.0 / 6.0));
    assert_eq!(figures.flip_decided, Some(2.0 / 5.0));
    assert_eq!(figures.flip[1], Some(1.0 / 3.0));
    assert!((figures.flip[2].unwrap() - 2.0 / 3.0).abs() < 1e-12);
    // Successful A^S: 0.5, -1.5, 0.5 -> mean -1/6; failed: 2.0, -0.5, 0.5 -> 2/3.
    assert_eq!(figures.success.0, 3);
    assert!((figures.success.1 + 1.0 / 6.0).abs() < 1e-9);
    assert_eq!(figures.failure.0, 3);
    assert!((figures.failure.1 - 2.0 / 3.0).abs() < 1e-9);
    let mut won = figures.values.0.clone();
    won.sort_by(f32::total_cmp);
    assert_eq!(won, vec![-1.5, 0.5, 0.5]);

    let (steps_scan, _) = scan(&root.path().join("rollouts/steps"), TableName::Steps).unwrap();
    let rows = heatmap_rows(advantages, rewards_scan, steps_scan, 3).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].advantages, vec![1.0, 1.5, -0.5]);
    assert_eq!(rows[0].response_ids, vec![0, 1, 2]);
    assert_eq!(rows[2].response_ids, vec![20, 21, 22]);
    assert!(rows[0].success && rows[1].success && !rows[2].success);
    assert_eq!(rows[2].step_adv, Some(vec![2.0, 0.0, 0.0]));

    let out = root.path().join("report");
    std::fs::create_dir_all(&out).unwrap();
    let md = build_report(&[("rule".into(), variant)], &[], None, &out).unwrap();
    assert!(
        md.contains("grpo_step rule (match prefix, credit action_id, score action_name, omega 1.0, gate none)"),
        "{md}"
    );
    assert!(
        md.contains("| 6 / 15 | 0.500 | 0.400 | 0.333 | 0.667 |"),
        "{md}"
    );
    assert!(out.join("step_adv_rule.png").is_file());
    assert!(out.join("heatmap_rule.png").is_file());
}

#[test]
fn rewards_changed_since_the_advantages_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let rewards = write_rewards(root.path(), &[reward("a", true), reward("c", false)], false);
    let variant = write_variant(root.path(), &rewards);
    write_rewards(root.path(), &[reward("a", false), reward("c", false)], true);
    let out = root.path().join("report");
    let error = build_report(&[("rule".into(), variant)], &[], None, &out).unwrap_err();
    assert!(error.to_string().contains("changed since"), "{error}");
}

#[test]
fn contrast_figures_of_a_teacher_table() {
    let root = tempfile::tempdir().unwrap();
    let row = |id: &str, step: i32, teacher: Vec<f32>, student: Vec<f32>| TeacherLogpRow {
        trajectory_id: id.into(),
        step_index: step,
        teacher_logp: teacher,
        student_logp: student,
        teacher: "self".into(),
        template: "reference".into(),
    };
    let mut writer = TableWriter::create(
        root.path(),
        TableName::TeacherLogp,
        WriteOptions::default(),
        false,
    )
    .unwrap();
    // Contrasts: step a: 1, 3 (mean 2); step b: -2, 0 (mean -1).
    writer
        .write_rows(&[
            row("a", 0, vec![-1.0, -1.0], vec![-2.0, -4.0]),
            row("b", 0, vec![-3.0, -1.0], vec![-1.0, -1.0]),
        ])
        .unwrap();
    writer
        .finish(&producer("teacher-logp", serde_json::json!({})), &[])
        .unwrap();
    let (teacher, _) = scan(&root.path().join("teacher_logp"), TableName::TeacherLogp).unwrap();
    let c = contrast_figures(teacher).unwrap();
    assert_eq!((c.steps, c.tokens), (2, 4));
    assert!((c.token[0] - 0.5).abs() < 1e-9);
    // Population std of 1, 3, -2, 0 about the mean 0.5.
    assert!((c.token[1] - 1.8027756).abs() < 1e-6, "{c:?}");
    assert_eq!((c.token[2], c.token[3]), (-2.0, 3.0));
    assert!((c.step_mean_std - 1.5).abs() < 1e-9);
}
