//! Progress and logs as a user sees them off a terminal (stderr piped, as
//! under nohup or a cluster job): periodic plain progress lines, INFO lines
//! in the run's log file and not on stderr, a cached pipeline rerun that
//! keeps the recorded timings, and `table export` to CSV and JSON lines.

use std::path::Path;

use embodyflow_tests::{run, run_with_env};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The records of a CSV text (line breaks inside quotes do not end one).
fn csv_records(text: &str) -> usize {
    let (mut records, mut quoted) = (0, false);
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '\n' if !quoted => records += 1,
            _ => {}
        }
    }
    records
}

#[test]
fn info_goes_to_the_run_log_and_progress_lines_appear_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tasks");
    let args = [
        "--out",
        s(&out),
        "--seed",
        "1",
        "--set",
        "split=train",
        "--set",
        "count=3000",
    ];
    let result = run("generate-tasks", &args);
    assert_eq!(result.code, 0, "{result}");
    assert!(!result.stderr.contains("INFO"), "INFO on stderr:\n{result}");
    let log = std::fs::read_to_string(out.join("_log.generate-tasks.txt")).unwrap();
    assert!(
        log.contains("INFO") && log.contains("staged table"),
        "{log}"
    );

    // Asked for, INFO goes to stderr as well.
    let again = dir.path().join("again");
    let mut loud = args;
    loud[1] = s(&again);
    let result = run_with_env("generate-tasks", &loud, &[("EMBODYFLOW_LOG", "stderr")]);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stderr.contains("staged table"), "{result}");

    // Bad input writes nothing, not even a log.
    let bad = dir.path().join("bad");
    let result = run("generate-tasks", &["--out", s(&bad), "--set", "count=0"]);
    assert_eq!(result.code, 2, "{result}");
    assert!(!bad.exists(), "{}", bad.display());

    // Export with a short progress interval: plain lines with rate and ETA,
    // then a last line.
    let table = out.join("tasks");
    let jsonl = dir.path().join("tasks.jsonl");
    let result = run_with_env(
        "table",
        &["export", s(&table), "--format", "jsonl", "--out", s(&jsonl)],
        &[("EMBODYFLOW_PROGRESS_SECS", "0.0005")],
    );
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.contains("exported 3000 rows"), "{result}");
    let line = result
        .stderr
        .lines()
        .find(|l| l.starts_with("exporting: ") && !l.contains("done"))
        .unwrap_or_else(|| panic!("no progress line:\n{result}"));
    assert!(
        line.contains("/3000 (") && line.contains("/s, elapsed ") && line.contains(", eta "),
        "{line}"
    );
    assert!(
        result.stderr.contains("exporting: done 3000/3000 in "),
        "{result}"
    );
    // The default interval (10 s) prints nothing for a short loop.
    let quiet = run("table", &["export", s(&table), "--format", "csv"]);
    assert_eq!(quiet.code, 0, "{quiet}");
    assert!(!quiet.stderr.contains("exporting"), "{quiet}");
    assert_eq!(csv_records(&quiet.stdout), 3001, "header + rows");

    // The JSON lines import back to the same table.
    let back = dir.path().join("back");
    let result = run(
        "table",
        &[
            "import",
            "--table",
            "tasks",
            "--from",
            s(&jsonl),
            "--out",
            s(&back),
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let hash = |dir: &Path| {
        embodyflow_core::manifest::Manifest::read(dir)
            .unwrap()
            .content_hash
    };
    assert_eq!(hash(&back.join("tasks")), hash(&table));
}

#[test]
fn a_cached_rerun_keeps_the_recorded_timings_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.toml");
    std::fs::write(
        &file,
        r#"
[pipeline]
name = "tasks"

[[step]]
name = "train"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 2000 }

[[step]]
name = "val"
stage = "generate-tasks"
seed = 2
set = { split = "val", count = 500 }
"#,
    )
    .unwrap();
    let out = dir.path().join("run");
    let timings = |status: &str| {
        let result = run("pipeline", &["run", s(&file), "--out", s(&out)]);
        assert_eq!(result.code, 0, "{result}");
        let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
        let mut lines: Vec<String> = report
            .lines()
            .filter(|l| l.contains("stage processes (all steps"))
            .map(String::from)
            .collect();
        for step in ["train", "val"] {
            let row = report
                .lines()
                .find(|l| l.starts_with(&format!("| {step} |")))
                .unwrap_or_else(|| panic!("no row for {step}:\n{report}"));
            assert!(row.contains(&format!("| {status} |")), "{row}");
            lines.push(row.rsplit('|').nth(1).unwrap().trim().to_string());
        }
        assert!(
            std::fs::read_to_string(out.join("train/_log.generate-tasks.txt"))
                .unwrap()
                .contains("staged table")
        );
        lines
    };
    let first = timings("ran");
    assert_eq!(first.len(), 3, "{first:?}");
    assert_eq!(timings("cached"), first);
}
