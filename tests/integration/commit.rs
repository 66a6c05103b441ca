//! Crash-safe replacement and multi-output commits, each reproduced at the
//! exact point with the fault hooks of `embodyflow_core::commit`: a process
//! SIGKILLed between the two renames of the fallback replacement, right after
//! an exchange, between two outputs of one stage and before its journal; a
//! full disk at the summary. Every case ends with the data intact and a
//! rerun that simply works.

use std::path::{Path, PathBuf};

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{EvalRow, MetricRow, TableName};
use embodyflow_tests::{TINY_POLICY, run, run_with_env};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn hidden_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    names.sort();
    names
}

/// An eval table of `rows` rows as JSONL at `path`.
fn eval_jsonl(path: &Path, rows: usize, split: &str) {
    let text: String = (0..rows)
        .map(|i| {
            let row = EvalRow {
                failure_reason: None,
                task_id: format!("t{i}"),
                run: 0,
                split: split.into(),
                task_type: Some("pick".into()),
                policy: "p".into(),
                success: i % 2 == 0,
                num_steps: 1,
                env_steps: 3,
                ever_grasped: None,
            };
            serde_json::to_string(&row).unwrap() + "\n"
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

fn import(jsonl: &Path, out: &Path, env: &[(&str, &str)]) -> embodyflow_tests::Run {
    run_with_env(
        "table",
        &[
            "import",
            "--table",
            "eval",
            "--from",
            s(jsonl),
            "--out",
            s(out),
            "--overwrite",
        ],
        env,
    )
}

fn eval_rows(table: &Path) -> Vec<EvalRow> {
    TableReader::open(table, TableName::Eval)
        .unwrap()
        .read_rows()
        .unwrap()
}

/// In `dir`: an eval table of 5 `val` rows imported into `out`, and a JSONL
/// file of 7 `unseen` rows to replace it; returns (old rows, new rows, out).
fn old_table_and_new_rows(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (old, new) = (dir.join("old.jsonl"), dir.join("new.jsonl"));
    eval_jsonl(&old, 5, "val");
    eval_jsonl(&new, 7, "unseen");
    let out = dir.join("out");
    assert_eq!(import(&old, &out, &[]).code, 0);
    (old, new, out)
}

#[test]
fn overwrite_killed_between_the_two_renames_of_the_fallback_keeps_the_new_table() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new, out) = old_table_and_new_rows(dir.path());

    let killed = import(
        &new,
        &out,
        &[
            ("EMBODYFLOW_NO_RENAME_EXCHANGE", "1"),
            ("EMBODYFLOW_FAULT_AT", "commit:aside:1"),
        ],
    );
    assert_eq!(killed.code, -1, "the hook must kill the writer\n{killed}");
    // Exactly the gap the old code lost data in: no table in place, the old
    // one aside, the new one staged, and the journal.
    assert!(!out.join("eval").exists());
    let hidden = hidden_entries(&out);
    assert!(
        hidden.iter().any(|n| n.starts_with(".eval.old-")),
        "{hidden:?}"
    );
    assert!(
        hidden.iter().any(|n| n.starts_with(".eval.tmp-")),
        "{hidden:?}"
    );
    assert!(
        hidden.iter().any(|n| n.starts_with(".commit-")),
        "{hidden:?}"
    );

    // The next reader completes the commit: the new table, whole.
    let rows = eval_rows(&out.join("eval"));
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|r| r.split == "unseen"));
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
    // And the next writer neither deletes it nor fails.
    let again = import(&old, &out, &[]);
    assert_eq!(again.code, 0, "{again}");
    assert_eq!(eval_rows(&out.join("eval")).len(), 5);
}

#[test]
fn overwrite_killed_right_after_the_exchange_is_completed_by_the_next_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (_, new, out) = old_table_and_new_rows(dir.path());
    let killed = import(&new, &out, &[("EMBODYFLOW_FAULT_AT", "commit:swapped:1")]);
    assert_eq!(killed.code, -1, "{killed}");
    // The exchange is one step: the table was never absent.
    assert!(out.join("eval/_manifest.parquet").exists());
    // A writer (not a reader) comes next: it settles the journal, removes the
    // old table left at the staged name, and replaces the table again.
    let third = dir.path().join("third.jsonl");
    eval_jsonl(&third, 3, "train");
    let rerun = import(&third, &out, &[]);
    assert_eq!(rerun.code, 0, "{rerun}");
    assert_eq!(eval_rows(&out.join("eval")).len(), 3);
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
}

#[test]
fn a_legacy_table_moved_aside_is_restored_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("rows.jsonl");
    eval_jsonl(&jsonl, 4, "val");
    let out = dir.path().join("out");
    assert_eq!(import(&jsonl, &out, &[]).code, 0);
    // What an older writer killed between its two renames left: the table
    // aside under a dead pid, nothing in place.
    std::fs::rename(out.join("eval"), out.join(".eval.old-999999999-1")).unwrap();
    embodyflow_core::commit::clean_stale(&out).unwrap();
    assert_eq!(eval_rows(&out.join("eval")).len(), 4);
    assert!(hidden_entries(&out).is_empty());
}

/// Tasks and a tiny initial policy in `root`.
fn tasks_and_policy(root: &Path) {
    let ok = |name: &str, args: &[&str]| {
        let result = run(name, args);
        assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    };
    ok(
        "generate-tasks",
        &[
            "--out",
            s(&root.join("train")),
            "--seed",
            "1",
            "--set",
            "split=train",
            "--set",
            "count=7",
        ],
    );
    let init = root.join("init");
    let mut args = vec!["--out", s(&init)];
    args.extend(TINY_POLICY);
    ok("init-policy", &args);
}

fn sft(root: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> embodyflow_tests::Run {
    let (init, train) = (root.join("init"), root.join("train"));
    let mut args = vec![
        "--policy",
        s(&init),
        "--input",
        s(&train),
        "--out",
        s(out),
        "--set",
        "objective=sft",
        "--set",
        "sft.demos_per_task_type=1",
        "--set",
        "mini_batch=8",
        "--set",
        "micro_batch=8",
    ];
    args.extend_from_slice(extra);
    run_with_env("update-policy", &args, env)
}

#[test]
fn a_stage_killed_between_its_outputs_shows_both_or_neither() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tasks_and_policy(root);

    // Killed before the journal: nothing appears, and a rerun just works.
    let out = root.join("sft");
    let killed = sft(root, &out, &[], &[("EMBODYFLOW_FAULT_AT", "commit:staged")]);
    assert_eq!(killed.code, -1, "{killed}");
    assert!(!out.join("metrics").exists() && !out.join("policy").exists());
    let rerun = sft(root, &out, &[], &[]);
    assert_eq!(rerun.code, 0, "{rerun}");
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );

    // Killed after `metrics` is in place and before `policy`: the first
    // reader of the directory sees both.
    let out = root.join("sft2");
    let killed = sft(
        root,
        &out,
        &[],
        &[("EMBODYFLOW_FAULT_AT", "commit:swapped:1")],
    );
    assert_eq!(killed.code, -1, "{killed}");
    assert!(out.join("metrics").exists() && !out.join("policy").exists());
    let metrics: Vec<MetricRow> = TableReader::open(&out.join("metrics"), TableName::Metrics)
        .unwrap()
        .read_rows()
        .unwrap();
    assert!(!metrics.is_empty());
    assert!(out.join("policy/model.safetensors").exists());
    assert!(out.join("_summary.update-policy.md").exists());

    // --overwrite killed mid-commit never leaves the directory without a
    // policy, and the policy that is there loads.
    let killed = sft(
        root,
        &out,
        &["--overwrite", "--seed", "3"],
        &[("EMBODYFLOW_FAULT_AT", "commit:swapped:2")],
    );
    assert_eq!(killed.code, -1, "{killed}");
    assert!(out.join("policy/manifest.json").exists());
    let evaluate = run(
        "update-policy",
        &[
            "--policy",
            s(&out.join("policy")),
            "--input",
            s(&root.join("train")),
            "--out",
            s(&root.join("sft3")),
            "--set",
            "objective=sft",
            "--set",
            "sft.demos_per_task_type=1",
        ],
    );
    assert_eq!(evaluate.code, 0, "{evaluate}");
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
}

#[test]
fn a_full_disk_at_the_summary_leaves_nothing_and_the_rerun_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train");
    let args = ["--out", s(&out), "--set", "split=train", "--set", "count=5"];
    let failed = run_with_env(
        "generate-tasks",
        &args,
        &[("EMBODYFLOW_FAULT_ERR", "stage:summary")],
    );
    assert_eq!(failed.code, 1, "{failed}");
    assert!(
        failed.stderr.contains("_summary.generate-tasks.md"),
        "{failed}"
    );
    assert!(!out.join("tasks").exists());
    let rerun = run("generate-tasks", &args);
    assert_eq!(rerun.code, 0, "{rerun}");
    assert!(out.join("tasks/_manifest.parquet").exists());
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
}

#[test]
fn an_eio_right_after_the_journal_leaves_the_old_table_and_no_wedge() {
    let dir = tempfile::tempdir().unwrap();
    let (_, new, out) = old_table_and_new_rows(dir.path());

    // The directory fsync right after the journal is renamed in fails: the
    // run fails, and takes its journal with its staged outputs.
    let failed = import(
        &new,
        &out,
        &[("EMBODYFLOW_FAULT_ERR", "commit:journal-sync")],
    );
    assert_eq!(failed.code, 1, "{failed}");
    assert!(failed.stderr.contains("Input/output error"), "{failed}");
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
    assert_eq!(eval_rows(&out.join("eval")).len(), 5);

    // What a run that could not remove its journal either leaves: the
    // journal, its staged outputs gone. Every reader and writer rolls it
    // back by itself; the old table is intact.
    let killed = import(&new, &out, &[("EMBODYFLOW_FAULT_AT", "commit:journaled")]);
    assert_eq!(killed.code, -1, "{killed}");
    for name in hidden_entries(&out) {
        if name.starts_with(".eval.tmp-") {
            std::fs::remove_dir_all(out.join(name)).unwrap();
        }
    }
    assert!(
        hidden_entries(&out)
            .iter()
            .any(|n| n.starts_with(".commit-")),
        "{:?}",
        hidden_entries(&out)
    );
    let validated = run("table", &["validate", s(&out.join("eval"))]);
    assert_eq!(validated.code, 0, "{validated}");
    assert!(
        validated.stdout.starts_with("ok eval 5 rows"),
        "{validated}"
    );
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
    let again = import(&new, &out, &[]);
    assert_eq!(again.code, 0, "{again}");
    assert_eq!(eval_rows(&out.join("eval")).len(), 7);
}

#[test]
fn a_failure_after_the_last_swap_is_a_committed_run() {
    let dir = tempfile::tempdir().unwrap();
    let (_, new, out) = old_table_and_new_rows(dir.path());
    // The directory fsync after the last swap fails: the new table is in
    // place, so the run succeeded; what is left to clean the next reader
    // finishes.
    let done = import(
        &new,
        &out,
        &[("EMBODYFLOW_FAULT_ERR", "commit:swapped-sync")],
    );
    assert_eq!(done.code, 0, "{done}");
    assert!(done.stderr.contains("the outputs are committed"), "{done}");
    let rows = eval_rows(&out.join("eval"));
    assert_eq!(rows.len(), 7);
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
}

#[test]
fn the_table_tool_completes_an_interrupted_commit_instead_of_saying_not_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new, out) = old_table_and_new_rows(dir.path());
    for command in ["validate", "manifest", "show"] {
        let killed = import(
            &new,
            &out,
            &[
                ("EMBODYFLOW_NO_RENAME_EXCHANGE", "1"),
                ("EMBODYFLOW_FAULT_AT", "commit:aside:1"),
            ],
        );
        assert_eq!(killed.code, -1, "{killed}");
        assert!(!out.join("eval").exists());
        let result = run("table", &[command, s(&out.join("eval"))]);
        assert_eq!(result.code, 0, "table {command}\n{result}");
        assert_eq!(eval_rows(&out.join("eval")).len(), 7, "table {command}");
        assert!(hidden_entries(&out).is_empty(), "table {command}");
        assert_eq!(import(&old, &out, &[]).code, 0);
    }
}

#[test]
fn a_rerun_after_a_kill_mid_commit_recognises_its_own_commit() {
    let dir = tempfile::tempdir().unwrap();
    let generate = |out: &Path, count: &str, env: &[(&str, &str)]| {
        let count = format!("count={count}");
        run_with_env(
            "generate-tasks",
            &["--out", s(out), "--set", "split=train", "--set", &count],
            env,
        )
    };
    let out = dir.path().join("train");
    let killed = generate(&out, "5", &[("EMBODYFLOW_FAULT_AT", "commit:swapped:1")]);
    assert_eq!(killed.code, -1, "{killed}");
    // The same command again: it completes the dead run's commit, sees that
    // run was its twin, and has nothing left to do.
    let rerun = generate(&out, "5", &[]);
    assert_eq!(rerun.code, 0, "{rerun}");
    assert!(rerun.stdout.contains("nothing to do"), "{rerun}");
    assert!(out.join("_summary.generate-tasks.md").exists());
    assert!(
        hidden_entries(&out).is_empty(),
        "{:?}",
        hidden_entries(&out)
    );
    // Run again once complete, it is refused as before: the table exists.
    let third = generate(&out, "5", &[]);
    assert_eq!(third.code, 2, "{third}");
    assert!(third.stderr.contains("already exists"), "{third}");

    // Another command (another config) is refused: those outputs are not its.
    let out = dir.path().join("train2");
    let killed = generate(&out, "5", &[("EMBODYFLOW_FAULT_AT", "commit:swapped:1")]);
    assert_eq!(killed.code, -1, "{killed}");
    let different = generate(&out, "6", &[]);
    assert_eq!(different.code, 2, "{different}");
    assert!(different.stderr.contains("already exists"), "{different}");

    // A stage with inputs: its twin read the same tables (by content hash).
    let (rollouts, rewards) = embodyflow_tests::rollout_set(dir.path(), &[vec![1.0, 0.0]], 1, 2);
    let adv = dir.path().join("adv");
    let advantages = |env: &[(&str, &str)]| {
        run_with_env(
            "compute-advantages",
            &[
                "--input",
                s(&rollouts),
                "--input",
                s(&rewards),
                "--out",
                s(&adv),
            ],
            env,
        )
    };
    let killed = advantages(&[("EMBODYFLOW_FAULT_AT", "commit:swapped:1")]);
    assert_eq!(killed.code, -1, "{killed}");
    let rerun = advantages(&[]);
    assert_eq!(rerun.code, 0, "{rerun}");
    assert!(rerun.stdout.contains("nothing to do"), "{rerun}");
}
