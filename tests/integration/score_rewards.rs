//! score-rewards run as a binary, then compute-advantages on its output.

use std::path::Path;

use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::schemas::{PlanAction, RewardRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_tests::{
    Run, fixture_producer, one_shot_step, read_advantages, run, run_with_env, write_table,
};

const GT: [(i32, &str); 3] = [
    (0, "find a Mug"),
    (1, "pick up the Mug"),
    (2, "find a Sink"),
];

fn plan_json(steps: &[(i32, &str)]) -> String {
    let items: Vec<String> = steps
        .iter()
        .map(|(id, n)| format!("{{\"action_id\": {id}, \"action_name\": \"{n}\"}}"))
        .collect();
    format!(
        "{{\"language_plan\": [\"find a Mug\"], \"executable_plan\": [{}]}}",
        items.join(", ")
    )
}

/// Responses of one group, in sample order.
fn responses() -> Vec<Option<String>> {
    vec![
        Some(plan_json(&GT)),                                             // perfect
        Some(format!("```json\n{}\n```<|im_end|>", plan_json(&GT[..2]))), // fenced, prefix of 2
        Some(plan_json(&[
            (2, "find a Sink"),
            (0, "find a Mug"),
            (1, "pick up the Mug"),
        ])), // shifted
        Some("{\"executable_plan\": [{\"action_id\": 0, \"action_na".into()), // broken
        None,                                                             // closed-loop row
    ]
}

fn write_fixture(dir: &Path, groups: usize) {
    let producer = fixture_producer();
    let options = WriteOptions {
        rows_per_shard: 9,
        ..WriteOptions::default()
    };
    let mut tasks = Vec::new();
    let mut trajectories = Vec::new();
    for g in 0..groups {
        let task_id = format!("household/train/0/{g:06}");
        tasks.push(TaskRow {
            task_id: task_id.clone(),
            suite: "household".into(),
            env: "household".into(),
            split: "train".into(),
            task_type: Some("pick_and_place".into()),
            seed: g as i64,
            instruction: "Put the mug in the sink.".into(),
            observation: None,
            gt_actions: Some(
                GT.iter()
                    .map(|&(id, n)| PlanAction {
                        action_id: i64::from(id),
                        action_name: n.into(),
                    })
                    .collect(),
            ),
        });
        for (s, response) in responses().into_iter().enumerate() {
            trajectories.push(TrajectoryRow {
                source_row: None,
                infra_fault: None,
                failure_reason: None,
                trajectory_id: format!("it0/{task_id}/d0/s{s}"),
                group_id: format!("it0/{task_id}/d0"),
                task_id: task_id.clone(),
                sample_index: s as i32,
                iteration: 0,
                policy: "test".into(),
                temperature: 1.6,
                num_steps: 1,
                env_steps: 3,
                complete: s == 0,
                response_text: response,
                seed: 0,
                ever_grasped: None,
            });
        }
    }
    let mut w = TableWriter::create(&dir.join("data"), TableName::Tasks, options, false).unwrap();
    w.write_rows(&tasks).unwrap();
    w.finish(&producer, &[]).unwrap();
    let mut w = TableWriter::create(
        &dir.join("rollouts"),
        TableName::Trajectories,
        options,
        false,
    )
    .unwrap();
    w.write_rows(&trajectories).unwrap();
    w.finish(&producer, &[]).unwrap();
}

fn score(dir: &Path, out: &str, extra: &[&str]) -> Run {
    let (rollouts, data, out) = (dir.join("rollouts"), dir.join("data"), dir.join(out));
    let mut args = vec![
        "--input",
        rollouts.to_str().unwrap(),
        "--input",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run("score-rewards", &args)
}

fn rewards(dir: &Path) -> Vec<RewardRow> {
    let mut rows: Vec<RewardRow> = TableReader::open(&dir.join("rewards"), TableName::Rewards)
        .unwrap()
        .read_rows()
        .unwrap();
    rows.sort_by(|a, b| a.trajectory_id.cmp(&b.trajectory_id));
    rows
}

#[test]
fn embodied_r1_and_step_matches_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    write_fixture(dir.path(), 1);
    let result = score(dir.path(), "r1", &["--set", "reward.fn=embodied_r1"]);
    assert_eq!(result.code, 0, "{result}");
    let rows = rewards(&dir.path().join("r1"));
    let scores: Vec<f32> = rows.iter().map(|r| r.score).collect();
    // perfect: accuracy 1 + format 0.125 (valid items; no structure bonus: the
    // reference's needs all four answer keys, these answers have two; no
    // action list); fenced: 0 under strict parsing; shifted: accuracy 0,
    // format 0.125; broken and closed-loop: 0.
    assert_eq!(scores, vec![1.125, 0.0, 0.125, 0.0, 0.0]);
    let matches: Vec<Option<Vec<i8>>> = rows.iter().map(|r| r.step_match.clone()).collect();
    assert_eq!(
        matches,
        vec![
            Some(vec![1, 1, 1]),
            Some(vec![1, 1]),
            Some(vec![0, 0, 0]),
            Some(vec![]),
            Some(vec![])
        ]
    );
    let parsed: Vec<bool> = rows.iter().map(|r| r.parse_ok).collect();
    assert_eq!(parsed, vec![true, true, true, false, true]);
    assert_eq!(rows[1].pred_actions.as_ref().unwrap().len(), 2);

    // Tolerant parsing and an action list; lcs matching.
    let list = dir.path().join("actions.json");
    std::fs::write(&list, r#"["find a Mug", "pick up the Mug", "find a Sink"]"#).unwrap();
    let set_list = format!("reward.action_list={}", list.display());
    let result = score(
        dir.path(),
        "tolerant",
        &[
            "--set",
            "reward.fn=embodied_r1",
            "--set",
            "reward.tolerant=true",
            "--set",
            &set_list,
            "--set",
            "match.mode=lcs",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = rewards(&dir.path().join("tolerant"));
    // fenced prefix of 2 of 3: 2*3/(3*4) = 0.5, format 0.375 (valid items
    // 0.125 + id/name agreement 0.25; no structure bonus: two of the four
    // answer keys); perfect: 1 + 0.375.
    assert_eq!(rows[1].score, 0.875);
    assert_eq!(rows[0].score, 1.375);
    assert_eq!(rows[2].step_match, Some(vec![0, 1, 1]));
}

#[test]
fn output_is_the_same_for_any_thread_count_and_shard_split() {
    let dir = tempfile::tempdir().unwrap();
    write_fixture(dir.path(), 12);
    let rollouts = dir.path().join("rollouts");
    let data = dir.path().join("data");
    let hash_for = |out: &str, threads: &str| {
        let out = dir.path().join(out);
        let args = [
            "--input",
            rollouts.to_str().unwrap(),
            "--input",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--set",
            "reward.fn=verify",
        ];
        let result = run_with_env("score-rewards", &args, &[("RAYON_NUM_THREADS", threads)]);
        assert_eq!(result.code, 0, "{result}");
        TableReader::open(&out.join("rewards"), TableName::Rewards)
            .unwrap()
            .manifest()
            .content_hash
            .clone()
    };
    assert_eq!(hash_for("one", "1"), hash_for("two", "2"));
    let whole = rewards(&dir.path().join("one"));
    let mut merged = Vec::new();
    for i in 0..3 {
        let shard = format!("{i}/3");
        let out = format!("shard{i}");
        let result = score(
            dir.path(),
            &out,
            &["--set", "reward.fn=verify", "--shard", &shard],
        );
        assert_eq!(result.code, 0, "{result}");
        merged.extend(rewards(&dir.path().join(out)));
    }
    merged.sort_by(|a, b| a.trajectory_id.cmp(&b.trajectory_id));
    assert_eq!(merged, whole);
}

#[test]
fn rewards_feed_compute_advantages() {
    let dir = tempfile::tempdir().unwrap();
    write_fixture(dir.path(), 2);
    assert_eq!(
        score(dir.path(), "rewards", &["--set", "reward.fn=embodied_r1"]).code,
        0
    );
    // compute-advantages needs steps: a one-shot plan is one step per trajectory.
    let trajectories: Vec<TrajectoryRow> = TableReader::open(
        &dir.path().join("rollouts/trajectories"),
        TableName::Trajectories,
    )
    .unwrap()
    .read_rows()
    .unwrap();
    let steps: Vec<_> = trajectories
        .iter()
        .map(|t| one_shot_step(&t.trajectory_id, vec![5; 4]))
        .collect();
    write_table(&dir.path().join("rollouts"), &steps);
    let (rollouts, rewards_dir, out) = (
        dir.path().join("rollouts"),
        dir.path().join("rewards"),
        dir.path().join("adv"),
    );
    let result = run(
        "compute-advantages",
        &[
            "--input",
            rollouts.to_str().unwrap(),
            "--input",
            rewards_dir.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    assert_eq!(rows.len(), 10);
    assert!(
        rows[0].episode_adv > 0.0 && rows[3].episode_adv < 0.0,
        "the perfect plan is above its group mean"
    );
}

#[test]
fn embodied_r1_without_tasks_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    write_fixture(dir.path(), 1);
    let (rollouts, out) = (dir.path().join("rollouts"), dir.path().join("out"));
    let result = run(
        "score-rewards",
        &[
            "--input",
            rollouts.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--set",
            "reward.fn=embodied_r1",
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(result.stderr.contains("tasks table"), "{result}");
    assert!(!out.join("rewards").exists());
}

/// A household task written by hand: an apple in the closed fridge, to be
/// put on the counter. Action ids are those of the household world's fixed
/// list.
fn household_task() -> TaskRow {
    let observation = r#"{"split":"train","task_type":"pick_and_place","family":0,
        "goal":{"object":"Apple","receptacle":"CounterTop","container":null},
        "scene":{"run":0,
          "receptacles":[{"receptacle":"Fridge","open":false},{"receptacle":"CounterTop","open":false},
                         {"receptacle":"DiningTable","open":false}],
          "objects":[{"object":"Apple","on":"Fridge"},{"object":"Mug","on":"DiningTable"}]}}"#;
    TaskRow {
        task_id: "household/train/0/000000".into(),
        suite: "household".into(),
        env: "household".into(),
        split: "train".into(),
        task_type: Some("pick_and_place".into()),
        seed: 0,
        instruction: "Put an apple on the counter.".into(),
        observation: Some(observation.as_bytes().to_vec()),
        gt_actions: Some(
            HOUSEHOLD_GT
                .iter()
                .map(|&(id, n)| PlanAction {
                    action_id: i64::from(id),
                    action_name: n.into(),
                })
                .collect(),
        ),
    }
}

const HOUSEHOLD_GT: [(i32, &str); 5] = [
    (16, "find a Apple"),
    (65, "open the Fridge"),
    (40, "pick up the Apple"),
    (4, "find a CounterTop"),
    (64, "put down the object in hand"),
];

#[test]
fn verify_executes_household_plans() {
    let dir = tempfile::tempdir().unwrap();
    let task = household_task();
    let responses = [
        // The ground truth.
        plan_json(&HOUSEHOLD_GT),
        // Executable, but not the ground truth's first step.
        plan_json(&[
            (0, "find a Fridge"),
            (65, "open the Fridge"),
            (40, "pick up the Apple"),
            (4, "find a CounterTop"),
            (64, "put down the object in hand"),
        ]),
        // Unexecutable: picks the apple out of the closed fridge.
        plan_json(&[
            (16, "find a Apple"),
            (40, "pick up the Apple"),
            (4, "find a CounterTop"),
            (64, "put down the object in hand"),
        ]),
    ];
    let trajectories: Vec<TrajectoryRow> = responses
        .iter()
        .enumerate()
        .map(|(s, response)| TrajectoryRow {
            source_row: None,
            infra_fault: None,
            failure_reason: None,
            trajectory_id: format!("it0/{}/d0/s{s}", task.task_id),
            group_id: format!("it0/{}/d0", task.task_id),
            task_id: task.task_id.clone(),
            sample_index: s as i32,
            iteration: 0,
            policy: "test".into(),
            temperature: 1.6,
            num_steps: 1,
            env_steps: 5,
            complete: false,
            response_text: Some(response.clone()),
            seed: 0,
            ever_grasped: None,
        })
        .collect();
    write_table(&dir.path().join("data"), &[task]);
    write_table(&dir.path().join("rollouts"), &trajectories);

    let result = score(dir.path(), "verify", &["--set", "reward.fn=verify"]);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result.stdout.contains("plans executed (household)"),
        "{result}"
    );
    let rows = rewards(&dir.path().join("verify"));
    let accuracy: Vec<f32> = rows.iter().map(|r| r.accuracy).collect();
    assert_eq!(accuracy, vec![1.0, 1.0, -1.0]);
    let scores: Vec<f32> = rows.iter().map(|r| r.score).collect();
    assert_eq!(scores, vec![1.0, 1.0, -0.6]);
    // The step match still sees the executable alternative as a mismatch.
    assert_eq!(rows[1].step_match, Some(vec![0, 1, 1, 1, 1]));
    assert_eq!(rows[0].step_match, Some(vec![1, 1, 1, 1, 1]));
    assert_eq!(rows[2].step_valid, Some(vec![true, false, true, false]));
    assert_eq!(rows[1].step_valid, Some(vec![true; 5]));

    // Without the observation the same plans fall back to the step match.
    let mut bare = household_task();
    bare.observation = None;
    let fallback_dir = tempfile::tempdir().unwrap();
    write_table(&fallback_dir.path().join("data"), &[bare]);
    write_table(&fallback_dir.path().join("rollouts"), &trajectories);
    let result = score(
        fallback_dir.path(),
        "verify",
        &["--set", "reward.fn=verify"],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = rewards(&fallback_dir.path().join("verify"));
    let accuracy: Vec<f32> = rows.iter().map(|r| r.accuracy).collect();
    // 2 * matched / max(pred, gt) - 1: 5/5, 4/5, 1/5 (exact mode).
    assert!((accuracy[1] - 0.6).abs() < 1e-6, "{accuracy:?}");
    assert!(rows.iter().all(|r| r.step_valid.is_none()));

    // A malformed household observation is bad input, named by task id.
    let mut broken = household_task();
    broken.observation = Some(b"{\"scene\": 1}".to_vec());
    let broken_dir = tempfile::tempdir().unwrap();
    write_table(&broken_dir.path().join("data"), &[broken]);
    write_table(&broken_dir.path().join("rollouts"), &trajectories);
    let result = score(broken_dir.path(), "verify", &["--set", "reward.fn=verify"]);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("household/train/0/000000"),
        "{result}"
    );
}

#[test]
fn trajectories_whose_task_is_missing_are_an_error_or_skipped_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    write_fixture(dir.path(), 3);
    // A tasks table that holds only the first of the three tasks.
    let tasks: Vec<TaskRow> = TableReader::open(&dir.path().join("data/tasks"), TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap();
    embodyflow_tests::write_table(&dir.path().join("data"), &tasks[..1]);
    let result = score(dir.path(), "out", &[]);
    assert_eq!(result.code, 2, "{result}");
    for needle in [
        "2 tasks that the tasks table",
        "household/train/0/000001",
        "rollouts/trajectories",
        "data/tasks",
        "missing_tasks=skip",
    ] {
        assert!(result.stderr.contains(needle), "lacks `{needle}`\n{result}");
    }
    assert!(!dir.path().join("out/rewards").exists());

    let skipped = score(dir.path(), "out", &["--set", "missing_tasks=skip"]);
    assert_eq!(skipped.code, 0, "{skipped}");
    let per_task = responses().len();
    assert!(
        skipped.stdout.contains(&format!(
            "| skipped: task not in the tasks table | {} |",
            2 * per_task
        )),
        "{skipped}"
    );
    assert_eq!(rewards(&dir.path().join("out")).len(), per_task);
}
