//! What LAPO (LaST-R1) reads, made from the command line: a
//! thinking tiny VLA (`init-policy --set vla.latent_length=L --set
//! vla.latent_group=2`) → `collect-rollouts` → `score-rewards` (outcome) →
//! `compute-advantages --set estimator=gae --set gae.level=decision`.
//!
//! - The thinking VLA's `steps` rows carry `old_value`, all `L × latent_dim`
//!   latents, the chosen latent length (2 or 4 of L = 4) and the stop's
//!   log-prob, and decision-level GAE over them equals the recurrence
//!   computed here by hand from the stored values and scores: per
//!   trajectory `delta_t = r_t + gamma V_{t+1} - V_t` (the score on the last
//!   decision, V after it 0), `A_t = delta_t + gamma lambda A_{t+1}`,
//!   returns `A + V`, then A whitened over every decision, `(A - mean) /
//!   sqrt(var_unbiased + 1e-8)`; gamma 0.99, lambda 0.95.
//! - A plain VLA's steps have no `old_value`: decision-level GAE on them
//!   exits 2 naming the steps table and the field, and writes nothing.
//! - `evaluate` on a thinking VLA (L = 8) adds the distribution of the
//!   chosen latent lengths over its greedy decisions, whole percentages
//!   summing to 100, and the mean first-decision value of successful and
//!   failed episodes; a plain VLA's summary has neither line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::schemas::{AdvantageRow, EvalRow, RewardRow, StepRow, TableName};
use embodyflow_tests::{read_advantages, run, tabletop_tasks_and_tiny_vla, tiny_vla_init};

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

/// Writes the tiny VLA thinking in up to `length` latents, a stop
/// candidate every 2, to `out`.
fn thinking_vla(out: &Path, length: &str) {
    let length = format!("vla.latent_length={length}");
    let mut args = tiny_vla_init(s(out));
    args.extend(["--set", &length, "--set", "vla.latent_group=2"]);
    ok("init-policy", &args);
}

/// `collect-rollouts` of `policy` on `root/tasks` (G = 2) into `out`, then
/// `score-rewards` (outcome, reward_coef 5 as LaST-R1) into `out/rewards`.
fn collect_and_score(root: &Path, policy: &Path, out: &Path) {
    ok(
        "collect-rollouts",
        &[
            "--policy",
            s(policy),
            "--input",
            s(&root.join("tasks")),
            "--out",
            s(out),
            "--seed",
            "7",
            "--set",
            "group_size=2",
            "--set",
            "batch_rows=8",
        ],
    );
    ok(
        "score-rewards",
        &[
            "--input",
            s(out),
            "--input",
            s(&root.join("tasks")),
            "--out",
            s(&out.join("rewards")),
            "--set",
            "reward.reward_coef=5",
        ],
    );
}

/// `count` tabletop tasks, a tiny VLA thinking in up to 4 latents
/// (`root/thinking`), and its scored rollouts (`root/rollouts`).
fn thinking_rollouts(root: &Path, count: usize) -> (PathBuf, PathBuf) {
    tabletop_tasks_and_tiny_vla(root, count);
    let policy = root.join("thinking");
    thinking_vla(&policy, "4");
    let rollouts = root.join("rollouts");
    collect_and_score(root, &policy, &rollouts);
    (policy, rollouts)
}

/// Decision-level GAE of `rollouts` (and its `rewards` directory) into `out`.
fn decision_gae(rollouts: &Path, rewards: &Path, out: &Path) -> embodyflow_tests::Run {
    run(
        "compute-advantages",
        &[
            "--input",
            s(rollouts),
            "--input",
            s(rewards),
            "--out",
            s(out),
            "--set",
            "estimator=gae",
            "--set",
            "gae.level=decision",
        ],
    )
}

/// The decision-level GAE of every step by hand, in f64: `(whitened
/// advantage, return)` by `(trajectory, step)`.
fn expected_gae(steps: &[StepRow], rewards: &[RewardRow]) -> HashMap<(String, i32), (f64, f64)> {
    let (gamma, lambda) = (0.99, 0.95);
    let mut by_trajectory: HashMap<&str, Vec<&StepRow>> = HashMap::new();
    for step in steps {
        by_trajectory
            .entry(&step.trajectory_id)
            .or_default()
            .push(step);
    }
    let mut raw: Vec<((String, i32), f64, f64)> = Vec::new();
    for reward in rewards {
        let mut decisions = by_trajectory[reward.trajectory_id.as_str()].clone();
        decisions.sort_by_key(|d| d.step_index);
        let values: Vec<f64> = decisions
            .iter()
            .map(|d| f64::from(d.old_value.unwrap()))
            .collect();
        let last = values.len() - 1;
        let (mut next_value, mut next_advantage) = (0.0, 0.0);
        for t in (0..values.len()).rev() {
            let r = if t == last {
                f64::from(reward.score)
            } else {
                0.0
            };
            let delta = r + gamma * next_value - values[t];
            let advantage = delta + gamma * lambda * next_advantage;
            raw.push((
                (reward.trajectory_id.clone(), t as i32),
                advantage,
                advantage + values[t],
            ));
            (next_value, next_advantage) = (values[t], advantage);
        }
    }
    let n = raw.len() as f64;
    let mean = raw.iter().map(|r| r.1).sum::<f64>() / n;
    let var = raw.iter().map(|r| (r.1 - mean).powi(2)).sum::<f64>() / (n - 1.0);
    raw.into_iter()
        .map(|(key, a, ret)| (key, ((a - mean) / (var + 1e-8).sqrt(), ret)))
        .collect()
}

/// Every steps row has its advantages row, the hand GAE on each of its
/// response tokens and its return, to 1e-5.
fn check_gae(steps: &[StepRow], rewards: &[RewardRow], rows: &[AdvantageRow]) {
    let expected = expected_gae(steps, rewards);
    assert_eq!(rows.len(), steps.len(), "one advantages row per decision");
    let steps: HashMap<(&str, i32), &StepRow> = steps
        .iter()
        .map(|s| ((s.trajectory_id.as_str(), s.step_index), s))
        .collect();
    for row in rows {
        let key = (row.trajectory_id.clone(), row.step_index);
        let (advantage, ret) = expected[&key];
        let step = steps[&(row.trajectory_id.as_str(), row.step_index)];
        assert_eq!(row.estimator, "gae");
        assert_eq!(row.advantages.len(), step.response_ids.len(), "{key:?}");
        let returns = row.returns.as_ref().expect("gae writes returns");
        assert_eq!(returns.len(), row.advantages.len());
        // The tokens of actions that never ran (the mask's tail of holes,
        // a chunk the episode's end cut) get 0, the others the decision's.
        let ran = |t: usize| step.response_mask.as_ref().is_none_or(|m| m[t]);
        for (t, (&a, &r)) in row.advantages.iter().zip(returns).enumerate() {
            let (a_want, r_want) = if ran(t) { (advantage, ret) } else { (0.0, 0.0) };
            assert!(
                (f64::from(a) - a_want).abs() < 1e-5,
                "{key:?} token {t}: {a} vs {a_want}"
            );
            assert!(
                (f64::from(r) - r_want).abs() < 1e-5,
                "{key:?} token {t}: {r} vs {r_want}"
            );
        }
    }
}

#[test]
fn decision_gae_on_a_thinking_vlas_steps_is_the_hand_recurrence() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (_, rollouts) = thinking_rollouts(root, 4);
    let printed = ok("table", &["validate", s(&rollouts.join("steps"))]);
    assert!(printed.starts_with("ok steps"), "{printed}");
    let steps: Vec<StepRow> = read(&rollouts.join("steps"), TableName::Steps);
    let mut lengths = [0usize; 2];
    for step in &steps {
        let at = format!("{} step {}", step.trajectory_id, step.step_index);
        assert!(step.old_value.unwrap().is_finite(), "{at}");
        assert_eq!(step.latent_dim, Some(32), "{at}: the VLA's width");
        assert_eq!(step.latents.as_ref().unwrap().len(), 4 * 32, "{at}");
        assert!(step.latents.as_ref().unwrap().iter().all(|z| z.is_finite()));
        let chosen = step.chosen_latent_len.unwrap();
        assert!(chosen == 2 || chosen == 4, "{at}: {chosen}");
        lengths[chosen as usize / 2 - 1] += 1;
        let stop = step.old_latent_end_logprob.unwrap();
        assert!(stop.is_finite() && stop <= 0.0, "{at}: {stop}");
        assert!(step.old_values.is_none(), "{at}: no token values");
    }
    assert!(steps.len() > 8, "episodes of several decisions");
    assert_eq!(lengths.iter().sum::<usize>(), steps.len());

    // The scores as score-rewards wrote them (the untrained VLA may fail
    // everywhere), then mixed for sure: sample 0 of each group succeeds.
    let scored_dir = rollouts.join("rewards");
    let scored: Vec<RewardRow> = read(&scored_dir.join("rewards"), TableName::Rewards);
    let producer = TableReader::open(&scored_dir.join("rewards"), TableName::Rewards)
        .unwrap()
        .manifest()
        .producer
        .clone();
    let mixed: Vec<RewardRow> = scored
        .iter()
        .map(|r| {
            let win = r.trajectory_id.ends_with("/s0");
            let score = if win { 5.0 } else { 0.0 };
            RewardRow {
                infra_fault: None,
                score,
                accuracy: score,
                success: win,
                ..r.clone()
            }
        })
        .collect();
    let mixed_dir = root.join("mixed");
    let mut writer = TableWriter::create(
        &mixed_dir,
        TableName::Rewards,
        WriteOptions::default(),
        true,
    )
    .unwrap();
    writer.write_rows(&mixed).unwrap();
    writer.finish(&producer, &[]).unwrap();

    for (name, rewards_dir, rewards) in [
        ("scored", &scored_dir, &scored),
        ("mixed", &mixed_dir, &mixed),
    ] {
        let out = root.join(format!("adv-{name}"));
        let result = decision_gae(&rollouts, rewards_dir, &out);
        assert_eq!(result.code, 0, "{name}\n{result}");
        let rows = read_advantages(&out.join("advantages"));
        check_gae(&steps, rewards, &rows);
    }
}

#[test]
fn decision_gae_on_a_plain_vlas_steps_names_the_steps_table_and_old_value() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tabletop_tasks_and_tiny_vla(root, 2);
    let rollouts = root.join("rollouts");
    collect_and_score(root, &root.join("vla"), &rollouts);
    let steps: Vec<StepRow> = read(&rollouts.join("steps"), TableName::Steps);
    assert!(steps.iter().all(|s| s.old_value.is_none()));
    let out = root.join("adv");
    let result = decision_gae(&rollouts, &rollouts.join("rewards"), &out);
    assert_eq!(result.code, 2, "{result}");
    for needle in ["steps table", "`old_value`", "gae.level = decision"] {
        assert!(result.stderr.contains(needle), "`{needle}` in\n{result}");
    }
    assert!(!out.join("advantages").exists(), "nothing written");
}

/// `evaluate` of `policy` on `root/tasks` (one run) into `out`: its summary.
fn evaluate(root: &Path, policy: &Path, out: &Path) -> String {
    ok(
        "evaluate",
        &[
            "--policy",
            s(policy),
            "--input",
            s(&root.join("tasks")),
            "--out",
            s(out),
            "--set",
            "runs=1",
            "--set",
            "batch_rows=8",
        ],
    )
}

/// The value of the summary line `| key | value |`.
fn summary_value<'a>(summary: &'a str, key: &str) -> Option<&'a str> {
    let start = format!("| {key} | ");
    summary
        .lines()
        .find_map(|line| line.strip_prefix(start.as_str()))
        .map(|rest| rest.trim_end_matches(" |"))
}

/// `"… (n = 12)"` → 12.
fn count_of(text: &str) -> usize {
    let (_, n) = text.rsplit_once("(n = ").unwrap();
    n.trim_end_matches(')').parse().unwrap()
}

#[test]
fn evaluate_on_a_thinking_vla_reports_latent_lengths_and_first_values() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tabletop_tasks_and_tiny_vla(root, 4);
    let vla = root.join("thinking");
    thinking_vla(&vla, "8");
    let out = root.join("eval");
    let summary = evaluate(root, &vla, &out);
    assert_eq!(
        std::fs::read_to_string(out.join("_summary.evaluate.md")).unwrap(),
        summary,
        "the readable summary is the printed one"
    );
    let rows: Vec<EvalRow> = read(&out.join("eval"), TableName::Eval);
    let decisions: usize = rows.iter().map(|r| r.num_steps as usize).sum();

    // `2: 41 %, 4: 30 %, 6: 20 %, 8: 9 % (n = 812)`
    let lengths = summary_value(&summary, "latent lengths (greedy decisions)")
        .unwrap_or_else(|| panic!("no latent lengths line in\n{summary}"));
    assert_eq!(count_of(lengths), decisions, "{lengths}");
    let (shares, _) = lengths.rsplit_once(" (n = ").unwrap();
    let mut total = 0;
    for share in shares.split(", ") {
        let (length, percent) = share.split_once(": ").unwrap();
        assert!(["2", "4", "6", "8"].contains(&length), "{lengths}");
        total += percent.strip_suffix(" %").unwrap().parse::<u32>().unwrap();
    }
    assert_eq!(total, 100, "{lengths}");

    // `successful 0.412 (n = 1), failed 0.103 (n = 3)`
    let values = summary_value(&summary, "value at the first decision")
        .unwrap_or_else(|| panic!("no first-value line in\n{summary}"));
    let (successful, failed) = values.split_once(", failed ").unwrap();
    let wins = rows.iter().filter(|r| r.success).count();
    assert!(successful.starts_with("successful "), "{values}");
    assert_eq!(count_of(successful), wins, "{values}");
    assert_eq!(count_of(failed), rows.len() - wins, "{values}");
    let mean = failed.split_once(" (n = ").unwrap().0;
    if wins < rows.len() {
        assert!(mean.parse::<f64>().unwrap().is_finite(), "{values}");
    }

    // A VLA without latents: neither line.
    let plain = evaluate(root, &root.join("vla"), &root.join("eval-plain"));
    assert!(plain.contains("closed-loop throughput"), "{plain}");
    for key in ["latent lengths", "value at the first decision"] {
        assert!(!plain.contains(key), "`{key}` in\n{plain}");
    }
}

/// `update-policy --set objective=lapo` on a thinking tiny VLA's rollouts
/// and their decision-level GAE trains (value, latent and stop terms in
/// its metrics), a decision whole even where its chunk was cut (a tail of
/// mask holes); the same rollouts with a hole before a decision's own
/// tokens, a latent of the wrong width or a stop that is not a candidate
/// exit 2 naming the step or the table and field, and write nothing.
#[test]
fn lapo_updates_from_the_command_line_and_bad_latents_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (policy, rollouts) = thinking_rollouts(root, 2);
    let adv = root.join("adv");
    let gae = decision_gae(&rollouts, &rollouts.join("rewards"), &adv);
    assert_eq!(gae.code, 0, "{gae}");
    let update = |input: &Path, out: &Path| {
        run(
            "update-policy",
            &[
                "--policy",
                s(&policy),
                "--input",
                s(input),
                "--input",
                s(&adv),
                "--out",
                s(out),
                "--set",
                "objective=lapo",
                "--set",
                "mini_batch=4",
                "--set",
                "micro_batch=2",
            ],
        )
    };
    let good = root.join("lapo");
    let result = update(&rollouts, &good);
    assert_eq!(result.code, 0, "{result}");
    let metrics: Vec<embodyflow_core::schemas::MetricRow> =
        read(&good.join("metrics"), TableName::Metrics);
    assert!(
        metrics
            .iter()
            .all(|m| m.value_loss.is_some() && m.latent_loss.is_some() && m.end_loss.is_some())
    );
    assert!(
        result.stdout.contains("value explained variance"),
        "{result}"
    );
    let steps: Vec<StepRow> = read(&rollouts.join("steps"), TableName::Steps);
    let trajectories: Vec<embodyflow_core::schemas::TrajectoryRow> =
        read(&rollouts.join("trajectories"), TableName::Trajectories);
    let cases: [(&str, fn(&mut StepRow), &[&str]); 3] = [
        (
            "hole",
            |row| {
                let mut mask = vec![true; row.response_ids.len()];
                mask[0] = false;
                row.response_mask = Some(mask);
            },
            &["response_mask has holes before the policy's own tokens"],
        ),
        (
            "narrow",
            |row| {
                row.latent_dim = Some(16);
                row.latents = Some(vec![0.0; 8 * 16]);
            },
            &["table `steps` field `latent_dim`", "n_embd = 32"],
        ),
        (
            "beyond",
            |row| row.chosen_latent_len = Some(6),
            &["table `steps` field `chosen_latent_len`", "[2, 4]"],
        ),
    ];
    for (name, corrupt, words) in cases {
        let bad = root.join(name);
        let mut rows = steps.clone();
        corrupt(&mut rows[1]);
        embodyflow_tests::write_table(&bad, &rows);
        embodyflow_tests::write_table(&bad, &trajectories);
        let out = root.join(format!("{name}-out"));
        let result = update(&bad, &out);
        assert_eq!(result.code, 2, "{name}: {result}");
        for word in words {
            assert!(result.stderr.contains(word), "{name}: {word}\n{result}");
        }
        assert!(!out.join("policy").exists(), "{name}: nothing written");
    }
}
