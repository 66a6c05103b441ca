//! Every documented example, run as a user runs it, so that the manual and
//! the shipped files cannot drift apart: the make, just and `pipeline run`
//! commands in the code blocks of README.md and of every page of the book
//! (docs/src/**/*.md), and in the headers of pipelines/*, are read from the
//! files themselves and run by `sh` in a directory laid out like
//! scripts/demo's `runs/demo` at tiny scale (tasks, the RL task pool, a tiny
//! policy, one saved rollout set), with `target/release` and `pipelines/` as
//! in the repository.
//!
//! A page keeps a code block out with a marker on the line before its fence
//! that says why, e.g. `<!-- examples: skip (needs a GPU) -->`; a marker
//! without a reason, or not followed by a fence, fails the test.
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

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The commands `text` documents: lines that start with `prefix` (after a
/// comment's `#` and indentation), `\` continuations joined, a trailing
/// `# comment` cut.
pub(crate) fn documented(text: &str, prefix: &str) -> Vec<String> {
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

/// How the documented make and just commands start.
pub(crate) const MAKE: &str = "make -f pipelines/Makefile";
pub(crate) const JUST: &str = "just -f pipelines/justfile";

/// The marker a page puts on the line before a code block's fence to keep
/// the block out of this test: `<!-- examples: skip (REASON) -->`.
const SKIP: &str = "<!-- examples: skip";

/// A fenced code block of a Markdown page.
pub(crate) struct Block {
    /// The page line of its opening fence (from 1).
    pub(crate) line: usize,
    /// Its info string's first word (`sh`, `python`, `text`; empty when none).
    pub(crate) lang: String,
    /// Its lines.
    pub(crate) text: String,
    /// The reason of the [`SKIP`] marker before it, if there is one.
    pub(crate) skip: Option<String>,
}

/// The code blocks of a Markdown text that this test runs, each as its
/// lines; blocks after a [`SKIP`] marker are left out (see [`blocks`]).
fn code_blocks(text: &str) -> Result<Vec<String>, String> {
    Ok(blocks(text)?
        .into_iter()
        .filter(|b| b.skip.is_none())
        .map(|b| b.text)
        .collect())
}

/// Every fenced code block of a Markdown text, with the reason of the
/// [`SKIP`] marker before it. A marker without a reason in parentheses, or
/// not on the line right before a fence, is an error naming its line.
pub(crate) fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut fence: Option<(String, Block)> = None;
    let mut skip_next: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some((marker, block)) = &mut fence {
            if trimmed.starts_with(marker.as_str()) {
                blocks.push(fence.take().unwrap().1);
            } else {
                block.text.push_str(line);
                block.text.push('\n');
            }
            continue;
        }
        let is_fence = trimmed.starts_with("```") || trimmed.starts_with("~~~");
        let skipped = skip_next.take();
        if is_fence {
            let first = trimmed.chars().next().unwrap();
            let marker: String = trimmed.chars().take_while(|&c| c == first).collect();
            let lang = trimmed[marker.len()..]
                .split(|c: char| c.is_whitespace() || c == ',' || c == '{')
                .next()
                .unwrap_or("")
                .to_string();
            let block = Block {
                line: n + 1,
                lang,
                text: String::new(),
                skip: skipped.map(|(_, reason)| reason),
            };
            fence = Some((marker, block));
        } else if let Some((at, _)) = skipped {
            return Err(format!(
                "line {at}: `{SKIP} (…) -->` must be on the line right before a code block's fence"
            ));
        } else if let Some(rest) = trimmed.strip_prefix(SKIP) {
            let reason = rest
                .trim()
                .strip_suffix("-->")
                .map(str::trim)
                .and_then(|r| r.strip_prefix('('))
                .and_then(|r| r.strip_suffix(')'))
                .map(str::trim);
            let Some(reason) = reason.filter(|r| !r.is_empty()) else {
                return Err(format!(
                    "line {}: `{trimmed}` gives no reason: write `{SKIP} (why) -->`",
                    n + 1
                ));
            };
            skip_next = Some((n + 1, reason.to_string()));
        }
    }
    if let Some((at, _)) = skip_next {
        return Err(format!(
            "line {at}: `{SKIP}` is not followed by a code block"
        ));
    }
    Ok(blocks)
}

/// README.md and every page of the book, with their code blocks
/// ([`code_blocks`]) joined into one text for [`documented`].
fn documentation() -> Vec<(String, String)> {
    let mut pages = vec![repo().join("README.md")];
    pages.extend(crate::docs::book_pages());
    pages
        .into_iter()
        .map(|page| {
            let text = std::fs::read_to_string(&page).unwrap();
            let name = page
                .strip_prefix(crate::docs::repo())
                .unwrap_or(&page)
                .display()
                .to_string();
            let blocks = code_blocks(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, blocks.concat())
        })
        .collect()
}

/// The commands with `prefix` the documentation shows, each once, in the
/// order of [`documentation`].
fn documented_in_docs(docs: &[(String, String)], prefix: &str) -> Vec<String> {
    let mut commands: Vec<String> = Vec::new();
    for (_, text) in docs {
        for command in documented(text, prefix) {
            if !commands.contains(&command) {
                commands.push(command);
            }
        }
    }
    commands
}

/// Runs a binary and fails the test unless it exits 0.
pub(crate) fn ok(name: &str, args: &[&str]) {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
}

/// scripts/demo's layout at tiny scale in `root`: runs/demo/data/{train,val,
/// pool}, runs/demo/sft/policy, runs/demo/rollouts (collected by that
/// policy on the pool, as the demo's household part does), runs/demo/rl-data/{train ->
/// pool, val} (relative links, so a copy of `root` stands alone), a second
/// checkpoint at runs/generalist/policy, and a veRL dump at rollouts/3.jsonl
/// (the manual's name for one) imported to runs/verl/imported
/// (pipelines/verl-rescore.toml reads it), and the README's one-minute
/// import of docs/examples/verl-batch.parquet at runs/quick/imported and the
/// book's of docs/examples/trl-rows.jsonl at runs/trl/imported (the pages
/// rescore them with that file).
pub(crate) fn demo_layout(root: &Path) {
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
            &p("rollouts"),
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
    let dump = root.join("rollouts/3.jsonl");
    std::fs::create_dir_all(dump.parent().unwrap()).unwrap();
    let line = |output: &str, score: f64| {
        serde_json::json!({"input": "put a Mug in the Sink", "output": output, "gts": null,
            "score": score, "step": 3, "uid": "u0"})
        .to_string()
    };
    std::fs::write(&dump, format!("{}\n{}\n", line("{}", 1.0), line("[]", 0.0))).unwrap();
    ok(
        "table",
        &[
            "import",
            "--format",
            "verl",
            "--from",
            dump.to_str().unwrap(),
            "--tokenizer",
            &p("sft/policy"),
            "--out",
            verl.join("imported").to_str().unwrap(),
        ],
    );
    let batch = repo().join("docs/examples/verl-batch.parquet");
    let mut import = vec![
        "import",
        "--format",
        "parquet",
        "--from",
        batch.to_str().unwrap(),
    ];
    for column in [
        "prompt=prompt",
        "response=response",
        "prompt_ids=prompts",
        "response_ids=responses",
        "token_rewards=token_level_rewards",
        "response_mask=response_mask",
        "values=values",
        "group=uid",
        "step=step",
    ] {
        import.extend(["--column", column]);
    }
    let quick = root.join("runs/quick/imported");
    import.extend(["--out", quick.to_str().unwrap()]);
    ok("table", &import);
    ok(
        "table",
        &[
            "import",
            "--format",
            "trl",
            "--from",
            repo()
                .join("docs/examples/trl-rows.jsonl")
                .to_str()
                .unwrap(),
            "--tokenizer",
            &p("sft/policy"),
            "--out",
            root.join("runs/trl/imported").to_str().unwrap(),
        ],
    );
    std::fs::create_dir_all(demo.join("rl-data")).unwrap();
    std::os::unix::fs::symlink("../data/pool", demo.join("rl-data/train")).unwrap();
    std::os::unix::fs::symlink("../data/val", demo.join("rl-data/val")).unwrap();
}

/// Runs `command` with `sh -c` in `root`, `.venv/bin` first on the PATH.
pub(crate) fn sh(root: &Path, command: &str) -> Run {
    sh_with_path(root, command, &[])
}

/// Runs `command` with `sh -c` in `root`, `first` and then `.venv/bin`
/// ahead of the PATH.
pub(crate) fn sh_with_path(root: &Path, command: &str, first: &[&Path]) -> Run {
    let venv = repo().join(".venv/bin");
    let mut path: Vec<String> = first
        .iter()
        .chain([&venv.as_path()])
        .map(|dir| dir.display().to_string())
        .collect();
    path.push(std::env::var("PATH").unwrap_or_default());
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .env("PATH", path.join(":"))
        .output()
        .expect("spawn sh")
        .into()
}

pub(crate) fn sh_ok(root: &Path, command: &str) -> Run {
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
    let docs = documentation();
    let makefile = read("pipelines/Makefile");
    let justfile = read("pipelines/justfile");

    // make: the documentation's examples, then the Makefile's own, in order.
    let make_prefix = MAKE;
    let docs_make = documented_in_docs(&docs, make_prefix);
    assert!(
        !docs_make.is_empty(),
        "no make example in README.md or docs/src"
    );
    let header_make = documented(&makefile, make_prefix);
    assert!(
        header_make.len() >= 2,
        "the Makefile's examples: {header_make:?}"
    );
    let rewards = root.join("runs/offline/rewards/rewards");
    let first = sh_ok(root, &docs_make[0]);
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
    let again = sh_ok(root, &docs_make[0]);
    assert!(invoked(&again).is_empty(), "{again}");
    // A changed variable reruns what depends on it, and only that.
    let policy = sh_ok(
        root,
        &format!("{} policy=runs/generalist/policy", docs_make[0]),
    );
    assert_eq!(invoked(&policy), ["compute-advantages"], "{policy}");
    assert!(policy.stdout.contains("--policy runs/generalist/policy"));
    let mut reward = "verify";
    for command in docs_make[1..]
        .iter()
        .chain(header_make.iter().filter(|c| !docs_make.contains(c)))
    {
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
            let want = if command.contains("reward=verify") {
                "verify"
            } else {
                "embodied_r1"
            };
            assert_eq!(reward_fns(&rewards), [want], "`{command}`\n{result}");
            // Another reward rescores the rollouts.
            if want != reward {
                assert!(
                    invoked(&result).contains(&"score-rewards".to_string()),
                    "`{command}`\n{result}"
                );
            }
            reward = want;
        }
    }
    // The demo's rollouts scored against the wrong tasks fail, naming them.
    let wrong = sh(
        root,
        &docs_make[0].replace("runs/demo/data/pool", "runs/demo/data/train"),
    );
    assert_ne!(wrong.code, 0, "{wrong}");
    assert!(wrong.stderr.contains("runs/demo/data/train"), "{wrong}");

    // just: the documentation's examples and the justfile's own.
    let just_prefix = JUST;
    let mut just = documented_in_docs(&docs, just_prefix);
    assert!(!just.is_empty(), "no just example in README.md or docs/src");
    for command in documented(&justfile, just_prefix) {
        if !just.contains(&command) {
            just.push(command);
        }
    }
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

    // pipeline run: the documentation's and every shipped pipeline's
    // header, dry runs.
    let pipeline_prefix = "target/release/pipeline run pipelines/";
    let mut pipelines = documented_in_docs(&docs, pipeline_prefix);
    assert!(
        pipelines.len() >= 3,
        "the documentation's pipeline examples: {pipelines:?}"
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
    assert_eq!(files, 11);
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

/// The Makefile's former variable names, given on the command line, stop
/// make before it runs anything, naming the new (lowercase) name; the same
/// word from the environment (`OUT` set for something else) is left alone.
#[test]
fn the_makefile_refuses_its_former_variable_names() {
    for (old, new) in [
        ("BIN", "bin"),
        ("ROLLOUTS", "rollouts"),
        ("DATA", "tasks"),
        ("OUT", "out"),
        ("REWARD", "reward"),
        ("MATCH", "match"),
        ("POLICY", "policy"),
        ("VAL", "val"),
    ] {
        let result = sh(&repo(), &format!("make -f pipelines/Makefile -n {old}=x"));
        assert_eq!(result.code, 2, "{old}: {result}");
        assert!(
            result
                .stderr
                .contains(&format!("variable `{old}` was renamed `{new}`")),
            "{old}: {result}"
        );
        assert!(invoked(&result).is_empty(), "{old}: {result}");
    }
    let from_env = sh(
        &repo(),
        "OUT=/elsewhere make -f pipelines/Makefile -n FORCE",
    );
    assert_eq!(from_env.code, 0, "{from_env}");
}

/// The justfile's former `data` (a folder holding train/ and val/) stops
/// just before any recipe runs, naming the two variables that replace it.
#[test]
fn the_justfile_refuses_its_former_variable_name() {
    if sh(&repo(), "command -v just").code != 0 {
        eprintln!("note: just is not installed (scripts/setup puts it in .venv/bin): not run");
        return;
    }
    let result = sh(
        &repo(),
        "just -f pipelines/justfile data=runs/demo/rl-data iteration",
    );
    assert_ne!(result.code, 0, "{result}");
    assert!(
        result.stderr.contains(
            "variable `data` was replaced by `tasks` and `val`: tasks=runs/demo/rl-data/train val=runs/demo/rl-data/val"
        ),
        "{result}"
    );
    assert!(invoked(&result).is_empty(), "{result}");
}

#[test]
fn documented_commands_are_read_with_their_continuations() {
    let text = "intro\n#   make -f M A=1 \\\n#       B=2   # a note\n  make -f M C=3\nmake\n";
    assert_eq!(
        documented(text, "make -f M"),
        ["make -f M A=1 B=2", "make -f M C=3"]
    );
}

#[test]
fn code_blocks_leave_out_skipped_blocks_and_refuse_a_marker_without_reason() {
    let page = "make -f M A=0\n```sh\nmake -f M A=1\n```\n\
                <!-- examples: skip (needs a GPU) -->\n```sh\nmake -f M A=2\n```\n\
                ~~~text\n# make -f M A=3 \\\n#   B=4\n~~~\n";
    let blocks = code_blocks(page).unwrap();
    assert_eq!(blocks, ["make -f M A=1\n", "# make -f M A=3 \\\n#   B=4\n"]);
    assert_eq!(
        documented(&blocks.concat(), "make -f M"),
        ["make -f M A=1", "make -f M A=3 B=4"]
    );
    for (bad, why) in [
        (
            "<!-- examples: skip -->\n```sh\nmake\n```\n",
            "gives no reason",
        ),
        (
            "<!-- examples: skip () -->\n```sh\nmake\n```\n",
            "gives no reason",
        ),
        (
            "<!-- examples: skip (GPU) -->\n\n```sh\nmake\n```\n",
            "right before",
        ),
        ("text\n<!-- examples: skip (GPU) -->\n", "not followed"),
    ] {
        let err = code_blocks(bad).unwrap_err();
        assert!(
            err.contains(why) && err.starts_with("line "),
            "{bad:?}: {err}"
        );
    }
}
