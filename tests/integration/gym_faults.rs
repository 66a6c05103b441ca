//! An episode ended by infrastructure never becomes training signal, at the
//! exact point: the `faulty` adapter's counter fails one episode of a group
//! of 4 (`fault_once`: only the first episode to reach step 1), by an env
//! that raises (one worker hosts the group: slot 0 fails, deterministic) or
//! a worker that crashes (a worker per episode: whichever gets there
//! first). Then collect-rollouts → score-rewards → compute-advantages
//! (GRPO and GiGPO) → update-policy: the faulted trajectory is marked
//! (`infra_fault`) in trajectories and rewards, has no advantages row, its
//! siblings' rows equal bit for bit those computed on the rollouts without
//! it, update-policy skips its steps, and every summary counts it.

use std::path::Path;

use embodyflow_core::schemas::{AdvantageRow, RewardRow, StepRow, TableName, TrajectoryRow};
use embodyflow_gym::{GymTaskSpec, task_row};
use embodyflow_tests::write_table;

use super::gym_stages::{TINY_VLA, ok, rows, s};

/// The rows as Debug text: every float in its shortest exact form (-0 and
/// 0 apart), so that equal text means bit-identical rows.
fn exact(rows: &[AdvantageRow]) -> String {
    format!("{rows:#?}")
}

/// compute-advantages with `estimator` on the rollouts and rewards under
/// `inputs`; its rows and summary.
fn advantages(inputs: &[&Path], out: &Path, estimator: &str) -> (Vec<AdvantageRow>, String) {
    let mut args = Vec::new();
    for input in inputs {
        args.extend(["--input", s(input)]);
    }
    let estimator = format!("estimator={estimator}");
    args.extend(["--out", s(out), "--set", &estimator]);
    let summary = ok("compute-advantages", &args);
    (rows(out, TableName::Advantages), summary)
}

/// collect-rollouts of `vla` on `tasks` into `out` at `--seed 3` with the
/// `--set` values.
fn collect(vla: &Path, tasks: &Path, out: &Path, sets: &[&str]) -> embodyflow_tests::Run {
    let mut args = vec!["--policy", s(vla), "--input", s(tasks), "--out", s(out)];
    args.extend(["--seed", "3"]);
    for set in sets {
        args.extend(["--set", set]);
    }
    embodyflow_tests::run("collect-rollouts", &args)
}

#[test]
fn a_faulted_episode_gets_no_advantage_and_leaves_its_siblings_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let vla = root.join("vla");
    for (fault, workers, reason) in [("raise", "1", "counter broke"), ("crash", "4", "crashed")] {
        let case = root.join(fault);
        let tasks = case.join("tasks");
        let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 1, 6);
        spec.kwargs = serde_json::json!({
            "fault": fault,
            "at_step": 1,
            "fault_once": s(&case.join("fault-once")),
            "goal": 2,
        });
        write_table(&tasks, &[task_row("counter/0", "train", &spec).unwrap()]);
        if !vla.exists() {
            let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
            init.extend_from_slice(TINY_VLA);
            ok("init-policy", &init);
        }

        let rollouts = case.join("rollouts");
        let workers = format!("bridge.workers={workers}");
        let run = collect(
            &vla,
            &tasks,
            &rollouts,
            &["group_size=4", &workers, "bridge.timeout_s=5"],
        );
        assert_eq!(run.code, 0, "{fault}: {run}");
        let collected = run.stdout;
        assert!(
            collected.contains("1 ended by an infrastructure fault, left out"),
            "{fault}: {collected}"
        );
        let trajectories: Vec<TrajectoryRow> = rows(&rollouts, TableName::Trajectories);
        assert_eq!(trajectories.len(), 4, "{fault}");
        let faulted: Vec<&TrajectoryRow> = trajectories.iter().filter(|t| t.faulted()).collect();
        assert_eq!(faulted.len(), 1, "{fault}: {trajectories:?}");
        let faulted = faulted[0].clone();
        let why = faulted.failure_reason.as_deref().unwrap_or_default();
        assert!(why.contains(reason), "{fault}: {why}");
        assert!(
            trajectories
                .iter()
                .filter(|t| !t.faulted())
                .all(|t| t.infra_fault == Some(false) && t.failure_reason.is_none()),
            "{fault}: the siblings ran"
        );
        if fault == "raise" {
            assert_eq!(faulted.sample_index, 0, "one worker steps slot 0 first");
        }

        let rewards = case.join("rewards");
        let scored = ok(
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
        assert!(
            scored
                .contains("| ended by an infrastructure fault (no outcome, left out below) | 1 |"),
            "{fault}: {scored}"
        );
        let reward_rows: Vec<RewardRow> = rows(&rewards, TableName::Rewards);
        for row in &reward_rows {
            assert_eq!(
                row.faulted(),
                row.trajectory_id == faulted.trajectory_id,
                "{fault}: the fault is carried"
            );
        }

        // The same rollouts without the faulted trajectory.
        let without = case.join("without");
        let others = |id: &str| id != faulted.trajectory_id;
        let kept_trajectories: Vec<TrajectoryRow> = trajectories
            .iter()
            .filter(|t| others(&t.trajectory_id))
            .cloned()
            .collect();
        let steps: Vec<StepRow> = rows(&rollouts, TableName::Steps);
        let kept_steps: Vec<StepRow> = steps
            .iter()
            .filter(|t| others(&t.trajectory_id))
            .cloned()
            .collect();
        let kept_rewards: Vec<RewardRow> = reward_rows
            .iter()
            .filter(|t| others(&t.trajectory_id))
            .cloned()
            .collect();
        write_table(&without, &kept_trajectories);
        write_table(&without, &kept_steps);
        write_table(&without.join("rewards"), &kept_rewards);

        for estimator in ["grpo", "gigpo"] {
            let (with_fault, summary) = advantages(
                &[&rollouts, &rewards],
                &case.join(format!("adv-{estimator}")),
                estimator,
            );
            assert!(
                summary
                    .contains("| trajectories ended by an infrastructure fault (left out) | 1 |"),
                "{fault} {estimator}: {summary}"
            );
            assert!(
                with_fault
                    .iter()
                    .all(|r| r.trajectory_id != faulted.trajectory_id),
                "{fault} {estimator}: the faulted trajectory has no advantage"
            );
            assert_eq!(with_fault.len(), kept_steps.len(), "{fault} {estimator}");
            let (reference, _) = advantages(
                &[&without, &without.join("rewards")],
                &case.join(format!("adv-{estimator}-without")),
                estimator,
            );
            assert_eq!(exact(&with_fault), exact(&reference), "{fault} {estimator}");
            if fault == "raise" {
                // With this seed the siblings' outcomes differ: a real signal.
                assert!(with_fault.iter().any(|r| r.episode_adv > 0.0));
                assert!(with_fault.iter().any(|r| r.episode_adv < 0.0));
            }
        }

        let updated = ok(
            "update-policy",
            &[
                "--policy",
                s(&vla),
                "--input",
                s(&rollouts),
                "--input",
                s(&case.join("adv-grpo")),
                "--out",
                s(&case.join("ppo")),
                "--set",
                "objective=ppo",
                "--set",
                &format!("mini_batch={}", kept_steps.len()),
            ],
        );
        let skipped = format!(
            "| skipped: ended by an infrastructure fault | 1 trajectories ({} steps) |",
            faulted.num_steps
        );
        assert!(updated.contains(&skipped), "{fault}: {updated}");
        assert!(
            updated.contains(&format!("| examples | {} |", kept_steps.len())),
            "{fault}: {updated}"
        );
    }
}

/// Dynamic sampling that drops every draw says so, with the reasons: a
/// counter whose goal no episode reaches in 6 steps (all failure) and one
/// whose env raises in every episode (faults leave no episode that ran).
#[test]
fn dynamic_sampling_that_drops_every_draw_warns_with_the_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (tasks, vla, rollouts) = (root.join("tasks"), root.join("vla"), root.join("rollouts"));
    let mut unreachable = GymTaskSpec::new("faulty", "Counter-v0", 1, 6);
    unreachable.kwargs = serde_json::json!({"goal": 100});
    let mut raising = GymTaskSpec::new("faulty", "Counter-v0", 2, 6);
    raising.kwargs = serde_json::json!({"fault": "raise", "at_step": 1});
    write_table(
        &tasks,
        &[
            task_row("counter/0", "train", &unreachable).unwrap(),
            task_row("counter/1", "train", &raising).unwrap(),
        ],
    );
    let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    ok("init-policy", &init);
    let result = collect(
        &vla,
        &tasks,
        &rollouts,
        &[
            "group_size=2",
            "bridge.workers=1",
            "dynamic_sampling.enabled=true",
            "dynamic_sampling.max_extra_draws=2",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let dropped = "4 groups dropped (0 all success, 2 all failure, 2 too few valid after faults)";
    assert!(
        result
            .stdout
            .contains(&format!("| task draws | 4 ({dropped}) |")),
        "{result}"
    );
    let warning = format!(
        "dynamic sampling filled 0 of 2 slots; {dropped} within dynamic_sampling.max_extra_draws; no group written: the update has nothing to learn from"
    );
    assert!(
        result.stdout.contains(&format!("| warning | {warning} |")),
        "{result}"
    );
    assert!(result.stderr.contains(&warning), "{result}");
    let summary = std::fs::read_to_string(rollouts.join("_summary.collect-rollouts.md")).unwrap();
    assert!(summary.contains(&warning), "{summary}");
    let trajectories: Vec<TrajectoryRow> = rows(&rollouts, TableName::Trajectories);
    assert!(trajectories.is_empty());
}

#[test]
fn a_worker_past_its_start_up_deadline_is_reported_naming_the_key() {
    // The counter's build sleeps 30 s (LIBERO's scene on a loaded machine)
    // past a start-up deadline of 1 s: init-policy's hello fails its three
    // attempts within seconds, naming the key and its value.
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks");
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 1, 6);
    spec.kwargs = serde_json::json!({"start_delay": 30});
    write_table(&tasks, &[task_row("counter/0", "train", &spec).unwrap()]);
    let vla = dir.path().join("vla");
    let mut args = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    args.extend_from_slice(TINY_VLA);
    args.extend(["--set", "bridge.timeout_s=1"]);
    args.extend(["--set", "bridge.startup_timeout_s=1"]);
    let started = std::time::Instant::now();
    let result = embodyflow_tests::run("init-policy", &args);
    let took = started.elapsed();
    // init-policy reports whatever stops its probe as bad input (exit 2).
    assert_ne!(result.code, 0, "{result}");
    let text = result.to_string();
    assert!(
        text.contains(
            "did not answer hello (faulty Counter-v0) within 1 s (bridge.startup_timeout_s = 1; raise it on a busy machine), the last of 3 attempts"
        ),
        "{text}"
    );
    assert!(took < std::time::Duration::from_secs(25), "{took:?}");
    assert!(!vla.exists(), "nothing written");

    // generate-tasks' workers take the same deadline as gym.startup_timeout_s.
    let out = dir.path().join("generated");
    let args = [
        "--out",
        s(&out),
        "--set",
        "env=gym",
        "--set",
        "gym.adapter=faulty",
        "--set",
        "gym.env_ids=[\"Counter-v0\"]",
        "--set",
        "gym.kwargs={start_delay = 30}",
        "--set",
        "gym.timeout_s=1",
        "--set",
        "gym.startup_timeout_s=1",
    ];
    let result = embodyflow_tests::run("generate-tasks", &args);
    assert_eq!(result.code, 1, "{result}");
    assert!(
        result.to_string().contains(
            "within 1 s (gym.startup_timeout_s = 1; raise it on a busy machine), the last of 3 attempts"
        ),
        "{result}"
    );
}

#[test]
fn a_slow_build_within_the_start_up_deadline_is_no_fault() {
    // Each build sleeps 3 s, past bridge.timeout_s = 1 but within the
    // default start-up deadline: the workers say they are building, so
    // the hellos (the second task's on a worker already up) and the resets
    // wait for them.
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks");
    let rows_of: Vec<_> = [1, 2]
        .into_iter()
        .map(|goal| {
            let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 1, 6);
            spec.kwargs = serde_json::json!({"start_delay": 3, "goal": goal});
            task_row(&format!("counter/{goal}"), "train", &spec).unwrap()
        })
        .collect();
    write_table(&tasks, &rows_of);
    let vla = dir.path().join("vla");
    let mut args = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    args.extend_from_slice(TINY_VLA);
    args.extend(["--set", "bridge.timeout_s=1"]);
    ok("init-policy", &args);
    let rollouts = dir.path().join("rollouts");
    let run = collect(
        &vla,
        &tasks,
        &rollouts,
        &["group_size=2", "bridge.workers=2", "bridge.timeout_s=1"],
    );
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout
            .contains("worker faults: 0 crashed, 0 hung, 0 malformed"),
        "{run}"
    );
    let trajectories: Vec<TrajectoryRow> = rows(&rollouts, TableName::Trajectories);
    assert_eq!(trajectories.len(), 4);
    assert!(
        trajectories.iter().all(|t| !t.faulted()),
        "{trajectories:?}"
    );
}
