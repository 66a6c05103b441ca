//! Every documented example, run as a user runs it, so that README and the
//! shipped files cannot drift apart: the make, just and `pipeline run`
//! commands in README.md and in the headers of pipelines/* are read from the
//! files themselves and run by `sh` in a directory laid out like scripts/demo's
//! `runs/demo` at tiny scale (tasks, the RL task pool, a tiny policy, one saved
//! rollout set), with `target/release` and `pipelines/` as in the repository.
//!
//! make and just commands run for real (just from `.venv/bin`, installed by
//! scripts/setup; without it the just commands are skipped with a note);
//! `pipeline run` commands run with `--dry-run` (the file, its variables and
//! every stage's config are checked, nothing runs: the household pipelines
//! run at tiny scale in runner.rs), and the ablation over the saved rollouts
//! runs for real through the Makefile's `ablation` target. Besides exit 0, the
//! test checks that make reruns exactly what a changed variable affects.

use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{RewardRow, TableName};
use embodyflow_tests::{Run, TINY_POLICY, bin, run};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The commands `text` documents: lines that start with `prefix` (after a
/// comment's `#` and indentation), `\` continuations joined, a trailing
/// `# comment` cut.
fn documented(text: &str, prefix: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut lines = text
        .lines()
        .map(|l| l.trim_start_matches('#').trim().to_string());
    while let Some(line) = lines.next() {
        if !line.starts_with(prefix) {
            continue;
        }
        let mut command = line;
        while command.ends_with('\\') {
            command.pop();
            command.push(' ');
            command.push_str(&lines.next().expect("a continuation line"));
        }
        if let Some(at) = command.find(" #") {
            command.truncate(at);
        }
        commands.push(command.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    commands
}

/// Runs a binary and fails the test unless it exits 0.
fn ok(name: &str, args: &[&str]) {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
}

/// scripts/demo's layout at tiny scale in `root`: runs/demo/data/{train,val,
/// pool}, runs/demo/sft/policy, runs/demo/rl/it0/rollouts (collected by that
/// policy on the pool, as the demo's RL does), runs/demo/rl-data/{train ->
/// pool, val}, a second checkpoint at runs/generalist/policy, and a veRL dump
/// imported to runs/verl/imported (pipelines/verl-rescore.toml reads it).
fn demo_layout(root: &Path) {
    let release = bin("pipeline").parent().unwrap().to_path_buf();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::os::unix::fs::symlink(&release, root.join("target/release")).unwrap();
    std::fs::create_dir_all(root.join("pipelines")).unwrap();
    for entry in std::fs::read_dir(repo().join("pipelines")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(
            &path,
            root.join("pipelines").join(path.file_name().unwrap()),
        )
        .unwrap();
    }
    let demo = root.join("runs/demo");
    let p = |rel: &str| demo.join(rel).to_str().unwrap().to_string();
    for (split_dir, split, seed, count) in [
        ("data/train", "train", "1", "14"),
        ("data/val", "val", "2", "4"),
        ("data/pool", "train", "21", "14"),
    ] {
        ok(
            "generate-tasks",
            &[
                "--out",
                &p(split_dir),
                "--seed",
                seed,
                "--set",
                &format!("split={split}"),
                "--set",
                &format!("count={count}"),
            ],
        );
    }
    for (out, seed) in [
        (p("sft/policy"), "0"),
        (
            root.join("runs/generalist/policy")
                .to_str()
                .unwrap()
                .to_string(),
            "1",
        ),
    ] {
        let mut init = vec!["--out", out.as_str(), "--seed", seed];
        init.extend(TINY_POLICY);
        ok("init-policy", &init);
    }
    ok(
        "collect-rollouts",
        &[
            "--policy",
            &p("sft/policy"),
            "--input",
            &p("data/pool"),
            "--out",
            &p("rl/it0/rollouts"),
            "--set",
            "tasks_per_iteration=4",
            "--set",
            "group_size=3",
            "--set",
            "max_new_tokens=40",
        ],
    );
    // A veRL rollout dump imported where pipelines/verl-rescore.toml reads it.
    let verl = root.join("runs/verl");
    std::fs::create_dir_all(&verl).unwrap();
    let line = |output: &str, score: f64| {
        serde_json::json!({"input": "put a Mug in the Sink", "output": output, "gts": null,
            "score": score, "step": 3, "uid": "u0"})
        .to_string()
    };
    std::fs::write(
        verl.join("3.jsonl"),
        format!("{}\n{}\n", line("{}", 1.0), line("[]", 0.0)),
    )
    .unwrap();
    ok(
        "table",
        &[
            "import",
            "--format",
            "verl",
            "--from",
            verl.join("3.jsonl").to_str().unwrap(),
            "--tokenizer",
            &p("sft/policy"),
            "--out",
            verl.join("imported").to_str().unwrap(),
        ],
    );
    std::fs::create_dir_all(demo.join("rl-data")).unwrap();
    std::os::unix::fs::symlink(demo.join("data/pool"), demo.join("rl-data/train")).unwrap();
    std::os::unix::fs::symlink(demo.join("data/val"), demo.join("rl-data/val")).unwrap();
}

/// Runs `command` with `sh -c` in `root`, `.venv/bin` first on the PATH.
fn sh(root: &Path, command: &str) -> Run {
    let path = format!(
        "{}:{}",
        repo().join(".venv/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .env("PATH", path)
        .output()
        .expect("spawn sh");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn sh_ok(root: &Path, command: &str) -> Run {
    let result = sh(root, command);
    assert_eq!(result.code, 0, "`{command}`\n{result}");
    result
}

/// The stages a make or just run invoked, in order (the commands make echoes
/// on stdout, just on stderr).
fn invoked(result: &Run) -> Vec<String> {
    result
        .stdout
        .lines()
        .chain(result.stderr.lines())
        .filter_map(|l| l.strip_prefix("target/release/"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

fn reward_fns(table: &Path) -> Vec<String> {
    let rows: Vec<RewardRow> = TableReader::open(table, TableName::Rewards)
        .unwrap()
        .read_rows()
        .unwrap();
    assert!(!rows.is_empty(), "{}", table.display());
    let mut fns: Vec<String> = rows.into_iter().map(|r| r.reward_fn).collect();
    fns.dedup();
    fns
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap()
}

#[test]
fn every_documented_make_just_and_pipeline_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    demo_layout(root);
    let readme = read("README.md");
    let makefile = read("pipelines/Makefile");
    let justfile = read("pipelines/justfile");

    // make: README's example, then the Makefile's own, in order.
    let make_prefix = "make -f pipelines/Makefile";
    let readme_make = documented(&readme, make_prefix);
    assert_eq!(
        readme_make.len(),
        1,
        "README's make example: {readme_make:?}"
    );
    let header_make = documented(&makefile, make_prefix);
    assert!(
        header_make.len() >= 2,
        "the Makefile's examples: {header_make:?}"
    );
    let rewards = root.join("runs/offline/rewards/rewards");
    let first = sh_ok(root, &readme_make[0]);
    assert_eq!(
        invoked(&first),
        [
            "score-rewards",
            "compute-advantages",
            "compute-advantages",
            "compute-advantages"
        ],
        "{first}"
    );
    assert_eq!(reward_fns(&rewards), ["verify"]);
    // Nothing changed: nothing reruns.
    let again = sh_ok(root, &readme_make[0]);
    assert!(invoked(&again).is_empty(), "{again}");
    // A changed variable reruns what depends on it, and only that.
    let policy = sh_ok(
        root,
        &format!("{} POLICY=runs/generalist/policy", readme_make[0]),
    );
    assert_eq!(invoked(&policy), ["compute-advantages"], "{policy}");
    assert!(policy.stdout.contains("--policy runs/generalist/policy"));
    for command in &header_make {
        let result = sh_ok(root, command);
        if command.contains(" ablation") {
            let ablation =
                std::fs::read_to_string(root.join("runs/offline/ablation/report/ablation.md"))
                    .unwrap();
            assert_eq!(
                ablation.lines().count(),
                2 + 8,
                "one row per cell: {ablation}"
            );
        } else {
            let want = if command.contains("REWARD=verify") {
                "verify"
            } else {
                "embodied_r1"
            };
            assert_eq!(reward_fns(&rewards), [want], "`{command}`\n{result}");
            assert!(
                invoked(&result).contains(&"score-rewards".to_string()),
                "`{command}`\n{result}"
            );
        }
    }
    // The old README example, the demo's rollouts over the wrong tasks, fails.
    let wrong = sh(
        root,
        &readme_make[0].replace("runs/demo/data/pool", "runs/demo/data/train"),
    );
    assert_ne!(wrong.code, 0, "{wrong}");
    assert!(wrong.stderr.contains("runs/demo/data/train"), "{wrong}");

    // just: README's example and the justfile's own.
    let just_prefix = "just -f pipelines/justfile";
    let mut just = documented(&readme, just_prefix);
    assert_eq!(just.len(), 1, "README's just example: {just:?}");
    just.extend(documented(&justfile, just_prefix));
    assert!(just.len() >= 4, "{just:?}");
    if sh(root, "command -v just").code == 0 {
        for command in &just {
            // The iteration at tiny scale: a few draws, and no dynamic
            // sampling (the tiny policy solves nothing, so every group
            // would be dropped); the variables go before the recipe.
            let command = command.replacen(
                just_prefix,
                &format!("{just_prefix} draws=2 group=2 dynamic=false"),
                1,
            );
            let result = sh_ok(root, &command);
            assert!(!invoked(&result).is_empty(), "`{command}`\n{result}");
            if command.ends_with(" offline") {
                let want = if command.contains("reward=verify") {
                    "verify"
                } else {
                    "embodied_r1"
                };
                assert_eq!(
                    reward_fns(&root.join("runs/offline-just/rewards/rewards")),
                    [want]
                );
            }
        }
        assert!(root.join("runs/offline-just/adv-step/advantages").is_dir());
        assert!(root.join("runs/just-it0/eval").is_dir());
    } else {
        eprintln!(
            "note: just is not installed (scripts/setup puts it in .venv/bin): the justfile's {} documented commands were not run",
            just.len()
        );
    }

    // pipeline run: README's and every shipped pipeline's header, dry runs.
    let pipeline_prefix = "target/release/pipeline run pipelines/";
    let mut pipelines = documented(&readme, pipeline_prefix);
    assert!(
        pipelines.len() >= 3,
        "README's pipeline examples: {pipelines:?}"
    );
    let mut files = 0;
    for entry in std::fs::read_dir(repo().join("pipelines")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            let header = documented(&text, pipeline_prefix);
            assert!(
                !header.is_empty(),
                "{} documents no command",
                path.display()
            );
            pipelines.extend(header);
        }
    }
    assert_eq!(files, 10);
    for command in &pipelines {
        let command = if command.contains("--dry-run") {
            command.clone()
        } else {
            format!("{command} --dry-run")
        };
        let result = sh_ok(root, &command);
        assert!(result.stdout.contains("dry run:"), "`{command}`\n{result}");
    }
}

#[test]
fn documented_commands_are_read_with_their_continuations() {
    let text = "intro\n#   make -f M A=1 \\\n#       B=2   # a note\n  make -f M C=3\nmake\n";
    assert_eq!(
        documented(text, "make -f M"),
        ["make -f M A=1 B=2", "make -f M C=3"]
    );
}
