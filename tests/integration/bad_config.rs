//! Bad config values and missing input files are bad input (exit 2, nothing
//! written), found before any work: `--print-config` (what the pipeline
//! runner's pre-check calls) rejects the same values the run does, naming the
//! key; a `--config` file or a `table import --from` file that does not exist
//! exits 2; a pipeline file without steps is an error.

use std::path::Path;

use embodyflow_core::config::ConfigReport;
use embodyflow_tests::{Run, run};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn assert_bad_input(result: &Run, needles: &[&str]) {
    assert_eq!(result.code, 2, "{result}");
    for needle in needles {
        assert!(
            result.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{result}"
        );
    }
}

/// The report `--print-config` printed.
fn report(result: &Run) -> ConfigReport {
    let line = result.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: not a config report\n{result}"))
}

#[test]
fn print_config_and_the_run_reject_the_same_values_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // (stage, extra arguments the command line requires, bad --set, key)
    let cases: [(&str, &[&str], &str, &str); 4] = [
        ("generate-tasks", &[], "split=bogus", "split"),
        ("generate-tasks", &[], "count=0", "count"),
        (
            "collect-rollouts",
            &["--policy", "no/such/policy"],
            "group_size=0",
            "group_size",
        ),
        (
            "evaluate",
            &["--policy", "no/such/policy"],
            "runs=0",
            "runs",
        ),
    ];
    for (stage, extra, set, key) in cases {
        let mut args: Vec<&str> = vec!["--out", s(&out), "--set", set];
        args.extend_from_slice(extra);
        let mut print = args.clone();
        print.push("--print-config");
        let printed = run(stage, &print);
        assert_eq!(
            printed.code, 2,
            "{stage} --print-config --set {set}: {printed}"
        );
        let problem = report(&printed).problem.expect("a problem");
        assert_eq!(problem.key.as_deref(), Some(key), "{stage} {set}");
        // The run fails the same way, before reading its (missing) policy or inputs.
        let ran = run(stage, &args);
        assert_bad_input(&ran, &[&format!("config key `{key}`")]);
        assert!(!out.exists(), "{stage} wrote {}", out.display());
    }
    // The defaults pass.
    let good = run("generate-tasks", &["--out", s(&out), "--print-config"]);
    assert_eq!(good.code, 0, "{good}");
    assert!(report(&good).problem.is_none());
}

#[test]
fn a_missing_config_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let missing = dir.path().join("missing.toml");
    let result = run(
        "generate-tasks",
        &["--out", s(&out), "--config", s(&missing)],
    );
    assert_bad_input(&result, &["--config", "missing.toml"]);
    assert!(!out.exists());
    let printed = run(
        "generate-tasks",
        &["--out", s(&out), "--config", s(&missing), "--print-config"],
    );
    assert_eq!(printed.code, 2, "{printed}");
    let problem = report(&printed).problem.expect("a problem");
    assert!(problem.message.contains("missing.toml"), "{problem:?}");
}

#[test]
fn importing_a_missing_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("data");
    let missing = dir.path().join("missing.jsonl");
    let result = run(
        "table",
        &[
            "import",
            "--table",
            "tasks",
            "--from",
            s(&missing),
            "--out",
            s(&out),
        ],
    );
    assert_bad_input(&result, &["--from", "missing.jsonl"]);
    assert!(!out.join("tasks").exists());
}

#[test]
fn a_pipeline_without_steps_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.toml");
    std::fs::write(&file, "[pipeline]\nname = \"empty\"\n").unwrap();
    let out = dir.path().join("run");
    let result = run(
        "pipeline",
        &["run", s(&file), "--out", s(&out), "--dry-run"],
    );
    assert_bad_input(&result, &["empty.toml:1:", "the pipeline has no steps"]);
}
