//! compute-advantages run as a binary over rollout sets written to disk.

use std::path::Path;

use embodyflow_algos::gae::{GaeParams, gae_tokens, whiten};
use embodyflow_algos::grpo::{GroupNorm, episode_advantages};
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::schemas::{RewardRow, TableName};
use embodyflow_tests::{Run, read_advantages, rollout_set, run};

fn compute(rollouts: &Path, rewards: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec![
        "--input",
        rollouts.to_str().unwrap(),
        "--input",
        rewards.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run("compute-advantages", &args)
}

fn groups() -> Vec<Vec<f32>> {
    vec![
        vec![1.0, 0.0, 0.0, 1.0],
        vec![1.0, 1.0, 1.0, 1.0],
        vec![0.0, 0.5, 2.0, 0.0],
        vec![3.0],
    ]
}

#[test]
fn grpo_broadcasts_the_group_normalised_score_to_every_token() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 2, 5);
    let out = dir.path().join("adv");
    let result = compute(&rollouts, &rewards, &out, &[]);
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    assert_eq!(rows.len(), 13 * 2);
    let scores: Vec<f32> = groups().concat();
    let index: Vec<u32> = groups()
        .iter()
        .enumerate()
        .flat_map(|(g, s)| vec![g as u32; s.len()])
        .collect();
    let expected = episode_advantages(&scores, &index, GroupNorm::default());
    // Trajectory ids sort as group then sample, the order of `scores`.
    for (i, pair) in rows.chunks(2).enumerate() {
        for row in pair {
            assert_eq!(
                row.advantages,
                vec![expected[i]; 5],
                "{}",
                row.trajectory_id
            );
            assert_eq!(row.episode_adv, expected[i]);
            assert_eq!(row.estimator, "grpo");
            assert!(row.returns.is_none() && row.step_adv.is_none());
        }
    }
    assert!((rows[0].episode_adv - 0.866_025).abs() < 1e-5);
    assert!(out.join("_summary.compute-advantages.md").exists());
    let lineage = TableReader::open(&out.join("advantages"), TableName::Advantages)
        .unwrap()
        .manifest()
        .inputs
        .clone();
    let tables: Vec<&str> = lineage.iter().map(|i| i.table.as_str()).collect();
    assert_eq!(tables, ["trajectories", "rewards", "steps"]);
}

#[test]
fn dr_grpo_and_dynamic_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 1, 3);
    let out = dir.path().join("adv");
    let result = compute(
        &rollouts,
        &rewards,
        &out,
        &[
            "--set",
            "estimator=dr_grpo",
            "--set",
            "filter.dynamic_sampling=true",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    // The all-equal group and the group of one are dropped.
    let kept: Vec<&str> = rows.iter().map(|r| r.trajectory_id.as_str()).collect();
    assert!(
        kept.iter()
            .all(|id| id.starts_with("it0/task000") || id.starts_with("it0/task002")),
        "{kept:?}"
    );
    assert_eq!(rows.len(), 8);
    assert_eq!(rows[0].advantages, vec![0.5; 3]); // 1 - mean(1, 0, 0, 1)
    assert_eq!(rows[6].episode_adv, 2.0 - 0.625);
    let diagnostics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("diagnostics.json")).unwrap())
            .unwrap();
    assert_eq!(diagnostics["kept_groups"], 2);
    assert_eq!(diagnostics["dropped_groups"], 2);
}

#[test]
fn sharded_outputs_together_equal_the_unsharded_output() {
    for estimator in ["grpo", "gae"] {
        let dir = tempfile::tempdir().unwrap();
        let many: Vec<Vec<f32>> = (0..20)
            .map(|g| (0..4).map(|s| ((g * 7 + s * 3) % 5) as f32).collect())
            .collect();
        let (rollouts, rewards) = rollout_set(dir.path(), &many, 2, 4);
        let set = format!("estimator={estimator}");
        let whole = dir.path().join("whole");
        assert_eq!(
            compute(&rollouts, &rewards, &whole, &["--set", &set]).code,
            0
        );
        let mut merged = Vec::new();
        for i in 0..3 {
            let out = dir.path().join(format!("shard{i}"));
            let shard = format!("{i}/3");
            let result = compute(
                &rollouts,
                &rewards,
                &out,
                &["--set", &set, "--shard", &shard],
            );
            assert_eq!(result.code, 0, "{result}");
            let rows = read_advantages(&out.join("advantages"));
            assert!(!rows.is_empty(), "shard {i} got no groups");
            merged.extend(rows);
        }
        merged.sort_by(|a, b| {
            (&a.trajectory_id, a.step_index).cmp(&(&b.trajectory_id, b.step_index))
        });
        assert_eq!(
            merged,
            read_advantages(&whole.join("advantages")),
            "{estimator}"
        );
    }
}

#[test]
fn gae_matches_the_reference_recurrence_at_both_levels() {
    let dir = tempfile::tempdir().unwrap();
    let scores = vec![vec![1.0, 0.0], vec![0.0, 2.0]];
    let (rollouts, rewards) = rollout_set(dir.path(), &scores, 2, 3);
    let params = GaeParams::default();

    // Token level: each trajectory is one row of 2 x 3 tokens with the fixture's values.
    let out = dir.path().join("token");
    let result = compute(&rollouts, &rewards, &out, &["--set", "estimator=gae"]);
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    let (mut values, mut rewards_flat, mut offsets) = (Vec::new(), Vec::new(), vec![0]);
    for (g, group) in scores.iter().enumerate() {
        let _ = g;
        for (s, &score) in group.iter().enumerate() {
            for k in 0..2 {
                values.extend((0..3).map(|t| 0.05 * t as f32 + 0.01 * (k + s) as f32));
            }
            rewards_flat.resize(values.len(), 0.0);
            *rewards_flat.last_mut().unwrap() = score;
            offsets.push(values.len());
        }
    }
    let (mut adv, ret) = gae_tokens(&rewards_flat, &values, &offsets, params);
    whiten(&mut adv).unwrap();
    let got: Vec<f32> = rows.iter().flat_map(|r| r.advantages.clone()).collect();
    let got_ret: Vec<f32> = rows
        .iter()
        .flat_map(|r| r.returns.clone().unwrap())
        .collect();
    assert_eq!(got, adv);
    assert_eq!(got_ret, ret);

    // Decision level by hand for trajectory 0 (score 1, V = [0.1, 0.2]) before whitening:
    //   A_1 = 1 - 0.2 = 0.8; A_0 = 0.99 * 0.2 - 0.1 + 0.99 * 0.95 * 0.8 = 0.8504
    let out = dir.path().join("decision");
    let result = compute(
        &rollouts,
        &rewards,
        &out,
        &["--set", "estimator=gae", "--set", "gae.level=decision"],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    let returns: Vec<f32> = rows
        .iter()
        .map(|r| r.returns.as_ref().unwrap()[0])
        .collect();
    assert!((returns[0] - (0.8504 + 0.1)).abs() < 1e-5, "{returns:?}");
    assert!((returns[1] - 1.0).abs() < 1e-6, "{returns:?}");
    assert!(
        rows.iter()
            .all(|r| r.advantages.iter().all(|&a| a == r.advantages[0]) && r.advantages.len() == 3)
    );
    let all: Vec<f32> = rows.iter().map(|r| r.episode_adv).collect();
    let mean: f32 = all.iter().sum::<f32>() / all.len() as f32;
    assert!(mean.abs() < 1e-5, "whitened over the batch: {all:?}");
}

fn assert_bad_input(result: &Run, out: &Path, needles: &[&str]) {
    assert_eq!(result.code, 2, "{result}");
    for needle in needles {
        assert!(
            result.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{result}"
        );
    }
    assert!(
        !out.join("advantages").exists(),
        "bad input must write nothing"
    );
}

fn rewrite_rewards(rewards: &Path, edit: impl FnOnce(&mut Vec<RewardRow>)) {
    let table = rewards.join("rewards");
    let mut rows: Vec<RewardRow> = TableReader::open(&table, TableName::Rewards)
        .unwrap()
        .read_rows()
        .unwrap();
    edit(&mut rows);
    let producer = TableReader::open(&table, TableName::Rewards)
        .unwrap()
        .manifest()
        .producer
        .clone();
    let mut w =
        TableWriter::create(rewards, TableName::Rewards, WriteOptions::default(), true).unwrap();
    w.write_rows(&rows).unwrap();
    w.finish(&producer, &[]).unwrap();
}

#[test]
fn bad_inputs_exit_2_naming_the_trajectory_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 1, 2);
    let out = dir.path().join("adv");

    rewrite_rewards(&rewards, |rows| {
        rows.remove(2);
    });
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &[]),
        &out,
        &["`it0/task000/d0/s2`", "no rewards row"],
    );

    let (rollouts, rewards) = rollout_set(&dir.path().join("b"), &groups(), 1, 2);
    // Writers refuse NaN, so the NaN is forged into the shard, as a foreign
    // tool or a corrupted copy would leave it.
    rewrite_rewards(&rewards, |_| {});
    let table = rewards.join("rewards");
    let mut rows: Vec<RewardRow> = TableReader::open(&table, TableName::Rewards)
        .unwrap()
        .read_rows()
        .unwrap();
    rows[1].score = f32::NAN;
    let batch = embodyflow_core::dataset::rows_to_batch(TableName::Rewards.def(), &rows).unwrap();
    embodyflow_tests::forge_first_shard(
        &table,
        &batch,
        &[
            (embodyflow_core::schemas::META_TABLE, "rewards"),
            (embodyflow_core::schemas::META_VERSION, "1"),
        ],
    );
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &[]),
        &out,
        &["`score`", "trajectory_id=it0/task000/d0/s1", "NaN"],
    );

    let (rollouts, rewards) = rollout_set(&dir.path().join("c"), &groups(), 1, 2);
    rewrite_rewards(&rewards, |rows| {
        rows[0].group_id = "it9/elsewhere/d0".into()
    });
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &[]),
        &out,
        &["`it0/task000/d0/s0`", "`it9/elsewhere/d0`"],
    );

    let (rollouts, rewards) = rollout_set(&dir.path().join("d"), &groups(), 1, 2);
    rewrite_rewards(&rewards, |rows| {
        rows[0].trajectory_id = "it0/ghost/d0/s0".into()
    });
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &[]),
        &out,
        &["`it0/ghost/d0/s0`", "unknown"],
    );
}

#[test]
fn gae_without_values_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 1, 2);
    // Replace the steps with copies that lack per-token values.
    let steps_dir = rollouts.join("steps");
    let reader = TableReader::open(&steps_dir, TableName::Steps).unwrap();
    let mut rows: Vec<embodyflow_core::schemas::StepRow> = reader.read_rows().unwrap();
    rows[3].old_values = Some(vec![0.5]);
    let producer = reader.manifest().producer.clone();
    let mut w =
        TableWriter::create(&rollouts, TableName::Steps, WriteOptions::default(), true).unwrap();
    w.write_rows(&rows).unwrap();
    w.finish(&producer, &[]).unwrap();
    let out = dir.path().join("adv");
    let result = compute(&rollouts, &rewards, &out, &["--set", "estimator=gae"]);
    assert_bad_input(
        &result,
        &out,
        &[
            &format!("`{}`", rows[3].trajectory_id),
            "old_values has 1 entries, expected 2",
        ],
    );
}

#[test]
fn config_errors_name_the_key_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 1, 2);
    let out = dir.path().join("adv");
    let result = compute(&rollouts, &rewards, &out, &["--set", "gae.lamda=0.9"]);
    assert_bad_input(
        &result,
        &out,
        &["unknown config key `gae.lamda`", "gae.lam, gae.level"],
    );
    let result = compute(&rollouts, &rewards, &out, &["--set", "gae.lam=high"]);
    assert_bad_input(&result, &out, &["config key `gae.lam`", "high"]);
    let result = compute(&rollouts, &rewards, &out, &["--set", "estimator=ppo"]);
    assert_bad_input(&result, &out, &["config key `estimator`", "ppo"]);
    let result = compute(&rollouts, &rewards, &out, &["--shard", "3/3"]);
    assert_eq!(result.code, 2, "{result}");
    // A second run refuses to overwrite without --overwrite.
    assert_eq!(compute(&rollouts, &rewards, &out, &[]).code, 0);
    let again = compute(&rollouts, &rewards, &out, &[]);
    assert_eq!(again.code, 2, "{again}");
    assert!(again.stderr.contains("--overwrite"), "{again}");
}

/// Rewrites the steps table of a rollout set through `edit`.
fn rewrite_steps(rollouts: &Path, edit: impl FnOnce(&mut Vec<embodyflow_core::schemas::StepRow>)) {
    let reader = TableReader::open(&rollouts.join("steps"), TableName::Steps).unwrap();
    let mut rows: Vec<embodyflow_core::schemas::StepRow> = reader.read_rows().unwrap();
    edit(&mut rows);
    embodyflow_tests::write_table(rollouts, &rows);
}

fn content_hash(table: &Path) -> String {
    TableReader::open(table, TableName::Advantages)
        .unwrap()
        .manifest()
        .content_hash
        .clone()
}

#[test]
fn gae_streams_interleaved_steps_and_is_deterministic_across_threads() {
    let many: Vec<Vec<f32>> = (0..12)
        .map(|g| (0..4).map(|s| ((g * 5 + s * 3) % 4) as f32).collect())
        .collect();
    for level in ["token", "decision"] {
        let dir = tempfile::tempdir().unwrap();
        let (rollouts, rewards) = rollout_set(dir.path(), &many, 3, 4);
        let level_set = format!("gae.level={level}");
        let args = [
            "--set",
            "estimator=gae",
            "--set",
            &level_set,
            "--set",
            "batch_rows=5",
        ];
        // Each trajectory's steps adjacent (the usual layout), one or two threads.
        let ordered = dir.path().join("ordered");
        let result = compute(&rollouts, &rewards, &ordered, &args);
        assert_eq!(result.code, 0, "{result}");
        let mut all = vec![
            "--input",
            rollouts.to_str().unwrap(),
            "--input",
            rewards.to_str().unwrap(),
        ];
        let two = dir.path().join("two");
        all.extend(["--out", two.to_str().unwrap()]);
        all.extend(args);
        let result = embodyflow_tests::run_with_env(
            "compute-advantages",
            &all,
            &[("RAYON_NUM_THREADS", "2")],
        );
        assert_eq!(result.code, 0, "{result}");
        assert_eq!(
            content_hash(&ordered.join("advantages")),
            content_hash(&two.join("advantages")),
            "{level}"
        );
        // Steps spread over the table, in reverse step order: held until each
        // trajectory is complete, same rows (in completion order).
        rewrite_steps(&rollouts, |rows| {
            rows.reverse();
            let (odd, even): (Vec<_>, Vec<_>) =
                rows.drain(..).enumerate().partition(|(i, _)| i % 2 == 1);
            rows.extend(odd.into_iter().chain(even).map(|(_, r)| r));
        });
        let spread = dir.path().join("spread");
        let result = compute(&rollouts, &rewards, &spread, &args);
        assert_eq!(result.code, 0, "{result}");
        assert_eq!(
            read_advantages(&spread.join("advantages")),
            read_advantages(&ordered.join("advantages")),
            "{level}"
        );
    }
}

#[test]
fn gae_missing_duplicated_or_extra_steps_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = rollout_set(dir.path(), &groups(), 2, 2);
    let out = dir.path().join("adv");
    let gae = ["--set", "estimator=gae"];
    // Step 1 of the first trajectory missing.
    rewrite_steps(&rollouts, |rows| {
        rows.remove(1);
    });
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &gae),
        &out,
        &["`it0/task000/d0/s0`", "step indices [0], expected 0..2"],
    );
    // Step 0 twice instead of steps 0 and 1.
    let (rollouts, rewards) = rollout_set(&dir.path().join("b"), &groups(), 2, 2);
    rewrite_steps(&rollouts, |rows| rows[3] = rows[2].clone());
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &gae),
        &out,
        &["`it0/task000/d0/s1`", "step indices [0, 0], expected 0..2"],
    );
    // A third step after the trajectory's two.
    let (rollouts, rewards) = rollout_set(&dir.path().join("c"), &groups(), 2, 2);
    rewrite_steps(&rollouts, |rows| {
        let mut extra = rows[1].clone();
        extra.step_index = 2;
        rows.push(extra);
    });
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &gae),
        &out,
        &["`it0/task000/d0/s0`", "more steps than num_steps = 2"],
    );
}

/// Our own tables with `rewards.token_rewards` (veRL's token_level_rewards)
/// and `steps.response_mask` holes: GRPO takes the token rewards' sum as the
/// score and writes 0 at the holes; token-level GAE takes r_t from them,
/// skips the holes (veRL's masked recurrence) and whitens over the valid
/// tokens; bad lengths and sums exit 2 naming the trajectory.
#[test]
fn token_rewards_and_response_masks_with_holes() {
    let dir = tempfile::tempdir().unwrap();
    let scores = groups();
    let (rollouts, rewards) = rollout_set(dir.path(), &scores, 2, 5);
    // The score on three tokens: two of step 0, the last of step 1 (a hole).
    let spread = |score: f32| {
        let mut t = vec![0.0; 10];
        (t[1], t[3], t[9]) = (0.25 * score, 0.25 * score, 0.5 * score);
        t
    };
    rewrite_rewards(&rewards, |rows| {
        for r in rows {
            r.token_rewards = Some(spread(r.score));
        }
    });
    // Holes in step 1 at its first, middle and last token.
    let mask = vec![false, true, false, true, false];
    rewrite_steps(&rollouts, |rows| {
        for s in rows.iter_mut().filter(|s| s.step_index == 1) {
            s.response_mask = Some(mask.clone());
        }
    });

    let out = dir.path().join("grpo");
    let result = compute(&rollouts, &rewards, &out, &[]);
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    let index: Vec<u32> = scores
        .iter()
        .enumerate()
        .flat_map(|(g, s)| vec![g as u32; s.len()])
        .collect();
    let expected = episode_advantages(&scores.concat(), &index, GroupNorm::default());
    for (i, pair) in rows.chunks(2).enumerate() {
        assert_eq!(pair[0].advantages, vec![expected[i]; 5]);
        let holed: Vec<f32> = mask
            .iter()
            .map(|&m| if m { expected[i] } else { 0.0 })
            .collect();
        assert_eq!(pair[1].advantages, holed, "{}", pair[1].trajectory_id);
    }

    let out = dir.path().join("gae");
    let result = compute(&rollouts, &rewards, &out, &["--set", "estimator=gae"]);
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    let (mut values, mut token_rewards, mut valid, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), vec![0]);
    for (s, &score) in scores.iter().flat_map(|g| g.iter().enumerate()) {
        for k in 0..2 {
            values.extend((0..5).map(|t| 0.05 * t as f32 + 0.01 * (k + s) as f32));
            valid.extend(if k == 1 { mask.clone() } else { vec![true; 5] });
        }
        token_rewards.extend(spread(score));
        offsets.push(values.len());
    }
    let (mut adv, mut ret) = (Vec::new(), Vec::new());
    embodyflow_algos::gae::gae_tokens_masked_into(
        &token_rewards,
        &values,
        &valid,
        &offsets,
        GaeParams::default(),
        &mut adv,
        &mut ret,
    );
    let mut stats = embodyflow_algos::gae::WhitenStats::default();
    stats.add_masked(&adv, &valid);
    stats.whitening().unwrap().apply(&mut adv);
    embodyflow_algos::gae::zero_holes(&mut adv, &valid);
    let got: Vec<f32> = rows.iter().flat_map(|r| r.advantages.clone()).collect();
    let got_ret: Vec<f32> = rows
        .iter()
        .flat_map(|r| r.returns.clone().unwrap())
        .collect();
    assert_eq!(got.len(), adv.len());
    for (t, (x, y)) in got.iter().zip(&adv).enumerate() {
        assert!((x - y).abs() <= 1e-6, "token {t}: {x} vs {y}");
    }
    assert_eq!(got_ret, ret);
    // Half of each score sits on step 1's last token, a hole: it never
    // reaches GAE, so trajectory 0's last valid token (8) returns 0.
    assert_eq!((got[9], got_ret[9], got_ret[8]), (0.0, 0.0, 0.0));

    // A sum that is not the score; a length that is not the response's.
    let out = dir.path().join("bad");
    rewrite_rewards(&rewards, |rows| {
        rows[2].token_rewards.as_mut().unwrap()[0] += 0.5;
    });
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &[]),
        &out,
        &[
            "`it0/task000/d0/s2`",
            "rewards.score is 0",
            "token_rewards is 0.5",
        ],
    );
    rewrite_rewards(&rewards, |rows| {
        rows[2].token_rewards = Some(vec![0.0; 9]);
    });
    for estimator in ["grpo", "gae"] {
        assert_bad_input(
            &compute(
                &rollouts,
                &rewards,
                &out,
                &["--set", &format!("estimator={estimator}")],
            ),
            &out,
            &[
                "`it0/task000/d0/s2`",
                "token_rewards has 9 entries",
                "10 response tokens",
            ],
        );
    }
    rewrite_rewards(&rewards, |rows| rows[2].token_rewards = None);
    rewrite_steps(&rollouts, |rows| {
        rows[3].response_mask = Some(vec![true; 4])
    });
    let id = format!("`{}` step {}", "it0/task000/d0/s1", 1);
    assert_bad_input(
        &compute(&rollouts, &rewards, &out, &[]),
        &out,
        &[&id, "response_mask has 4 entries, expected 5"],
    );
}
