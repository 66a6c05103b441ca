//! Bad config values and missing input files are bad input (exit 2, nothing
//! written), found before any work: `--print-config` (what the pipeline
//! runner's pre-check calls) rejects the same values the run does, naming the
//! key; a `--config` file or a `table import --from` file that does not exist
//! exits 2; a pipeline file without steps is an error. A checkpoint whose
//! `config.json` sizes its weights do not hold, or whose
//! `model.safetensors` is a FIFO or a directory, exits 2 naming the file.

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

/// The tests' tiny plan policy in `root/plan` and two household tasks in
/// `root/tasks`.
fn plan_policy_and_tasks(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let plan = root.join("plan");
    let mut init = vec!["--out", s(&plan), "--seed", "0"];
    init.extend(embodyflow_tests::TINY_POLICY);
    let made = run("init-policy", &init);
    assert_eq!(made.code, 0, "{made}");
    let tasks = root.join("tasks");
    let made = run("generate-tasks", &["--out", s(&tasks), "--set", "count=2"]);
    assert_eq!(made.code, 0, "{made}");
    (plan, tasks)
}

/// Rewrites key `key` of the JSON file `file` to `value`.
fn set_json(file: &Path, key: &str, value: serde_json::Value) {
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    json[key] = value;
    std::fs::write(file, json.to_string()).unwrap();
}

/// Sizes no weights hold in a checkpoint's `config.json` (10^9 layers, a
/// width of 2^31, 2^40 positions, bins or chunk steps, 2^31-pixel images)
/// exit 2 naming the file, the tensor and the key, and write nothing: they
/// are compared with the weights' header before anything is allocated
/// (allocating them panicked or aborted the stage).
#[test]
fn absurd_model_sizes_exit_2_naming_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (plan, tasks) = plan_policy_and_tasks(root);
    embodyflow_tests::tabletop_tasks_and_tiny_vla(&root.join("tabletop"), 2);
    let vla = root.join("tabletop/vla");
    let plan_config = std::fs::read(plan.join("config.json")).unwrap();
    let vla_config = std::fs::read(vla.join("config.json")).unwrap();
    let cases: [(&Path, &Path, &[u8], &str, i64, &str); 6] = [
        (
            &plan,
            &tasks,
            &plan_config,
            "n_layer",
            1_000_000_000,
            "`h.1.ln_1.weight` is missing",
        ),
        (
            &plan,
            &tasks,
            &plan_config,
            "n_embd",
            1 << 31,
            "`wte.weight` has shape",
        ),
        (
            &plan,
            &tasks,
            &plan_config,
            "n_ctx",
            1 << 40,
            "`wpe.weight` has shape",
        ),
        (
            &vla,
            &root.join("tabletop/tasks"),
            &vla_config,
            "n_bins",
            1 << 40,
            "`action_head.weight` has shape",
        ),
        (
            &vla,
            &root.join("tabletop/tasks"),
            &vla_config,
            "chunk_len",
            1 << 40,
            "`wpe.weight` has shape",
        ),
        (
            &vla,
            &root.join("tabletop/tasks"),
            &vla_config,
            "image_size",
            1 << 31,
            "`wpe.weight` has shape",
        ),
    ];
    for (policy, input, original, key, value, tensor) in cases {
        let config = policy.join("config.json");
        std::fs::write(&config, original).unwrap();
        set_json(&config, key, value.into());
        let out = root.join(format!("eval-{key}"));
        let result = run(
            "evaluate",
            &[
                "--policy",
                s(policy),
                "--input",
                s(input),
                "--out",
                s(&out),
                "--set",
                "runs=1",
            ],
        );
        assert_bad_input(&result, &["model.safetensors", tensor, key]);
        assert!(!out.join("eval").exists(), "{key}: nothing written");
    }
}

/// A FIFO named `model.safetensors` exits 2 naming it instead of blocking
/// the stage in `open` until a writer comes; a directory there exits 2
/// (it exited 1). The stage runs under `timeout` so that a regression fails
/// the test rather than hanging it.
#[test]
fn a_fifo_or_a_directory_named_model_safetensors_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (plan, tasks) = plan_policy_and_tasks(root);
    let weights = plan.join("model.safetensors");
    std::fs::remove_file(&weights).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&weights)
        .status()
        .unwrap();
    assert!(made.success());
    for what in ["a FIFO", "a directory"] {
        if what == "a directory" {
            std::fs::remove_file(&weights).unwrap();
            std::fs::create_dir(&weights).unwrap();
        }
        let out = root.join("out");
        let output = std::process::Command::new("timeout")
            .arg("120")
            .arg(embodyflow_tests::bin("collect-rollouts"))
            .args(["--policy", s(&plan), "--input", s(&tasks), "--out", s(&out)])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
        assert!(
            stderr.contains(s(&weights)) && stderr.contains(&format!("is {what}")),
            "{stderr}"
        );
        assert!(!out.join("trajectories").exists());
    }
}
