//! GiGPO through the compute-advantages binary: a rollout set
//! whose decisions carry anchor keys gets A = A^E + omega * A^S on every
//! response token, the step group sizes in diagnostics.json and the
//! summary; a decision without an anchor key is bad input that names the
//! table, the column, the trajectory and the step, and nothing is written.

use std::path::Path;

use embodyflow_algos::gigpo::{EpisodeStats, Gigpo, GigpoInput, StepNorm, gigpo};
use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{StepRow, TableName};
use embodyflow_tests::{Run, read_advantages, rollout_set, run, write_table};

fn compute(rollouts: &Path, rewards: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec![
        "--input",
        rollouts.to_str().unwrap(),
        "--input",
        rewards.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--set",
        "estimator=gigpo",
    ];
    args.extend_from_slice(extra);
    run("compute-advantages", &args)
}

/// Group 0: four copies scored 1, 0, 0, 1; group 1: two copies scored 1, 1;
/// group 2: one copy scored 2.
fn groups() -> Vec<Vec<f32>> {
    vec![vec![1.0, 0.0, 0.0, 1.0], vec![1.0, 1.0], vec![2.0]]
}

/// The anchor of decision k of copy s in group g: every copy starts in the
/// same state; at decision 1 copies 0, 2 and copies 1, 3 share states; at
/// decision 2 every copy is alone.
fn anchor(group: &str, k: i32, s: usize) -> String {
    match k {
        0 => format!("{group}/start"),
        1 => format!("{group}/mid{}", s % 2),
        _ => format!("{group}/end{s}"),
    }
}

/// Rewrites the rollout set's steps with their anchor keys.
fn add_anchor_keys(rollouts: &Path) {
    let reader = TableReader::open(&rollouts.join("steps"), TableName::Steps).unwrap();
    let mut rows: Vec<StepRow> = reader.read_rows().unwrap();
    for row in &mut rows {
        // Trajectory ids are it0/taskGGG/d0/sS.
        let (group, sample) = row.trajectory_id.rsplit_once("/s").unwrap();
        row.anchor_key = Some(anchor(group, row.step_index, sample.parse().unwrap()));
    }
    write_table(rollouts, &rows);
}

#[test]
fn gigpo_adds_the_step_group_advantage_to_every_token_of_a_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 3, 2);
    add_anchor_keys(&rollouts);
    let out = dir.path().join("adv");
    let result = compute(&rollouts, &rewards, &out, &["--set", "gigpo.gamma=0.9"]);
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    assert_eq!(rows.len(), 7 * 3);

    // By hand: copy 0 of group 0 at decision 0. A^E = 0.5 / (std(1, 0, 0, 1) + eps);
    // returns at decision 0 are 0.81 * score: 0.81, 0, 0, 0.81, so
    // A^S = 0.405 / (std + eps) with std = 0.405 * sqrt(4 / 3).
    let episode = 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-6);
    let step = 0.405 / (0.405 * (4.0f64 / 3.0).sqrt() + 1e-6);
    let first = &rows[0];
    assert_eq!(
        (first.trajectory_id.as_str(), first.step_index),
        ("it0/task000/d0/s0", 0)
    );
    assert!(
        (f64::from(first.episode_adv) - episode).abs() < 1e-5,
        "{first:?}"
    );
    assert!((f64::from(first.step_adv.as_ref().unwrap()[0]) - step).abs() < 1e-5);
    assert!((f64::from(first.advantages[0]) - (episode + step)).abs() < 1e-5);

    // Every row against the library on the same batch.
    let mut offsets = vec![0];
    let (mut index, mut scores, mut rewards_, mut anchors) = (vec![], vec![], vec![], vec![]);
    for (g, group) in groups().iter().enumerate() {
        for (s, &score) in group.iter().enumerate() {
            index.push(g as u32);
            scores.push(score);
            rewards_.extend([0.0, 0.0, score]);
            for k in 0..3 {
                anchors.push(anchor(&format!("it0/task{g:03}/d0"), k, s));
            }
            offsets.push(rewards_.len());
        }
    }
    let expected = gigpo(
        &GigpoInput {
            offsets: &offsets,
            episode_groups: &index,
            episode_scores: &scores,
            rewards: &rewards_,
            anchors: &anchors,
        },
        Gigpo {
            gamma: 0.9,
            step_weight: 1.0,
            norm: StepNorm::Std,
            eps: 1e-6,
            episode_stats: EpisodeStats::Episodes,
        },
    )
    .unwrap();
    // Trajectory ids sort as group then copy, steps by index: the library's order.
    for (t, row) in rows.iter().enumerate() {
        assert_eq!(row.advantages, vec![expected.advantages[t]; 2], "{row:?}");
        assert_eq!(row.step_adv, Some(vec![expected.step[t]; 2]), "{row:?}");
        assert_eq!(row.episode_adv, expected.episode[t]);
        assert_eq!(row.estimator, "gigpo");
        assert!(row.returns.is_none());
    }
    // Decision 2 is alone in its step group: A^S = 0; the group of one
    // (group 2) has no step signal at all.
    assert_eq!(rows[2].step_adv, Some(vec![0.0; 2]));
    assert!(rows[18..].iter().all(|r| r.step_adv == Some(vec![0.0; 2])));

    // Step groups: per 4-copy group start (4), mid0 (2), mid1 (2), 4 ends;
    // the 2-copy group start (2), mid0, mid1, 2 ends; the lone copy 3 singletons.
    let diagnostics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("diagnostics.json")).unwrap())
            .unwrap();
    let sizes = &diagnostics["step_groups"];
    assert_eq!(sizes["steps"], 21);
    assert_eq!(sizes["shared_steps"], 10);
    assert_eq!(
        sizes["histogram"],
        serde_json::json!([[1, 11], [2, 3], [4, 1]])
    );
    let summary = std::fs::read_to_string(out.join("_summary.compute-advantages.md")).unwrap();
    assert!(summary.contains("compute-advantages (gigpo)"), "{summary}");
    assert!(
        summary.contains("decisions in step groups of >= 2 | 10 of 21 (47.6 %)"),
        "{summary}"
    );

    // omega = 0: plain GRPO on every token.
    let grpo_out = dir.path().join("grpo");
    let plain = run(
        "compute-advantages",
        &[
            "--input",
            rollouts.to_str().unwrap(),
            "--input",
            rewards.to_str().unwrap(),
            "--out",
            grpo_out.to_str().unwrap(),
        ],
    );
    assert_eq!(plain.code, 0, "{plain}");
    let zero = dir.path().join("zero");
    let result = compute(
        &rollouts,
        &rewards,
        &zero,
        &["--set", "gigpo.step_weight=0"],
    );
    assert_eq!(result.code, 0, "{result}");
    let (grpo_rows, zero_rows) = (
        read_advantages(&grpo_out.join("advantages")),
        read_advantages(&zero.join("advantages")),
    );
    assert_eq!(grpo_rows.len(), zero_rows.len());
    for (g, z) in grpo_rows.iter().zip(&zero_rows) {
        assert_eq!(g.advantages, z.advantages);
    }
}

#[test]
fn a_decision_without_an_anchor_key_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 2, 2);
    let out = dir.path().join("adv");
    let result = compute(&rollouts, &rewards, &out, &[]);
    assert_eq!(result.code, 2, "{result}");
    for needle in [
        "steps table, trajectory `it0/task",
        "step 0: `anchor_key` is null",
        "estimator = gigpo",
    ] {
        assert!(
            result.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{result}"
        );
    }
    assert!(!out.join("advantages").exists());
    assert!(!out.join("diagnostics.json").exists());
}
