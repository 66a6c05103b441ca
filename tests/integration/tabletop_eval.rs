//! `evaluate` on the tabletop world: tabletop tasks of two splits
//! → a tiny VLA (`init-policy kind=vla`) → `evaluate`: one greedy
//! closed-loop episode per task and run (3 runs by default), the eval table
//! valid, the same content on a rerun and under another `--seed` (greedy),
//! the summary with success by split / suite / task type, the grasp line,
//! throughput and pass@k. A plan policy on tabletop tasks and a VLA on
//! household tasks are refused (exit 2, named, nothing written).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::manifest::Manifest;
use embodyflow_core::schemas::{EvalRow, TableName, TaskRow};
use embodyflow_tests::{TINY_POLICY, run, tiny_vla_init, write_table};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn generate(out: &Path, env: &str, split: &str, count: &str) -> Vec<TaskRow> {
    ok(
        "generate-tasks",
        &[
            "--out",
            s(out),
            "--seed",
            "3",
            "--set",
            &format!("env={env}"),
            "--set",
            &format!("split={split}"),
            "--set",
            &format!("count={count}"),
        ],
    );
    TableReader::open(&out.join("tasks"), TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap()
}

/// Four val and four unseen tabletop tasks in one table (`root/tasks`) and
/// a tiny VLA (`root/vla`, chunks of 8).
fn setup(root: &Path) -> Vec<TaskRow> {
    let mut tasks = generate(&root.join("val"), "tabletop", "val", "4");
    tasks.extend(generate(&root.join("unseen"), "tabletop", "unseen", "4"));
    assert_eq!(tasks.len(), 8);
    write_table(&root.join("tasks"), &tasks);
    let vla = root.join("vla");
    ok("init-policy", &tiny_vla_init(s(&vla)));
    // In the table's order (by key): the first is the one a refusal names.
    TableReader::open(&root.join("tasks/tasks"), TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap()
}

fn evaluate(root: &Path, out: &Path, seed: &str, extra: &[&str]) -> String {
    let (vla, tasks) = (root.join("vla"), root.join("tasks"));
    let mut args = vec![
        "--policy",
        s(&vla),
        "--input",
        s(&tasks),
        "--out",
        s(out),
        "--seed",
        seed,
        "--set",
        "batch_rows=8",
    ];
    args.extend(extra);
    ok("evaluate", &args)
}

fn content_hash(out: &Path) -> String {
    Manifest::read(&out.join("eval")).unwrap().content_hash
}

#[test]
fn a_vla_is_evaluated_in_greedy_closed_loop_episodes_per_task_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tasks = setup(root);
    let out = root.join("eval");
    let passk = [
        "--set",
        "pass_at_k.samples=2",
        "--set",
        "pass_at_k.temperature=1.6",
    ];
    let summary = evaluate(root, &out, "1", &passk);
    let printed = ok("table", &["validate", s(&out.join("eval"))]);
    assert!(printed.starts_with("ok eval"), "{printed}");
    let rows: Vec<EvalRow> = TableReader::open(&out.join("eval"), TableName::Eval)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(rows.len(), tasks.len() * 3, "tasks x 3 runs by default");
    let by_id: HashMap<&str, &TaskRow> = tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let keys: HashSet<(&str, i32)> = rows.iter().map(|r| (r.task_id.as_str(), r.run)).collect();
    assert_eq!(keys.len(), rows.len(), "one row per task and run");
    for row in &rows {
        let task = by_id[row.task_id.as_str()];
        assert!((0..3).contains(&row.run));
        assert_eq!((&row.split, &row.task_type), (&task.split, &task.task_type));
        assert!(row.num_steps >= 1, "{row:?}");
        // Every decision but the last runs K = 8 env steps.
        assert!(row.env_steps > (row.num_steps - 1) * 8, "{row:?}");
        assert!(row.env_steps <= row.num_steps * 8, "{row:?}");
        assert!(
            row.ever_grasped.is_some(),
            "a closed-loop episode's grasp fact"
        );
    }
    for line in [
        "(vla, closed loop)",
        "24 (8 tasks x 3 runs, greedy)",
        "success, split val",
        "success, split unseen",
        "success, suite val / tabletop-",
        "success, task type unseen / ",
        "successful episodes that never grasped",
        "decisions/s",
        "env steps/s",
        "world ",
        "pass@k episodes",
        "48 (8 tasks x 3 runs x 2 samples, T 1.6)",
        "pass@k, split val",
        "pass@k, suite unseen / tabletop-",
        "@1 ",
        "@2 ",
    ] {
        assert!(summary.contains(line), "`{line}` in\n{summary}");
    }

    // A rerun writes the same content; greedy episodes ignore --seed.
    let again = root.join("again");
    evaluate(root, &again, "1", &passk);
    assert_eq!(content_hash(&out), content_hash(&again));
    let other = root.join("other-seed");
    evaluate(root, &other, "2", &[]);
    assert_eq!(
        content_hash(&out),
        content_hash(&other),
        "greedy is deterministic"
    );
}

#[test]
fn a_policy_of_the_other_kind_is_refused_naming_the_task_and_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tasks = setup(root);
    let household = generate(&root.join("household"), "household", "val", "2");
    let plan = root.join("plan");
    let mut init = vec!["--out", s(&plan), "--seed", "0"];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
    for (policy, input, task, words) in [
        (&plan, root.join("tasks"), &tasks[0].task_id, "plan policy"),
        (
            &root.join("vla"),
            root.join("household"),
            &household[0].task_id,
            "is a VLA",
        ),
    ] {
        let out = root.join("refused");
        let result = run(
            "evaluate",
            &[
                "--policy",
                s(policy),
                "--input",
                s(&input),
                "--out",
                s(&out),
            ],
        );
        assert_eq!(result.code, 2, "{result}");
        for needle in [&format!("`{task}`"), words, s(policy)] {
            assert!(result.stderr.contains(needle), "`{needle}` in\n{result}");
        }
        assert!(!out.join("eval").exists(), "nothing written");
    }
}
