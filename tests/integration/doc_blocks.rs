//! Every shell (`sh`, `bash`, `shell`, `console`) and Python code block of
//! README.md and of the book (docs/src/**/*.md) runs here, or carries the
//! marker `<!-- examples: skip (why) -->` on the line before its fence, so
//! the reader sees why it cannot run on a laptop in seconds (a GPU, a
//! cluster, hours, the demo itself).
//!
//! A shell block can be run when each of its commands is one this test
//! runs: a workspace binary, bare (the stage pages' spelling: the binaries
//! are in `target/release/`) or as `target/release/NAME`; `make -f
//! pipelines/Makefile`; `just -f pipelines/justfile`; `pipeline run` of a
//! file under `pipelines/`. A Python block runs with `.venv/bin/python`
//! (polars, pandas and duckdb come from scripts/setup).
//! [`every_shell_and_python_block_is_run_or_marked`] fails, naming the page
//! and line, for any unmarked block with another command, and for a block
//! without a language whose lines call a workspace binary (commands are
//! `sh`; output and syntax are `text`); it runs nothing.
//!
//! [`every_shell_and_python_block_runs`] runs each page's blocks in their
//! order, command by command with `sh` (a failure names the page line the
//! command starts on), in a fresh copy of one layout per page: scripts/demo's
//! `runs/demo` at tiny scale ([`crate::examples::demo_layout`], with the
//! veRL dump `rollouts/3.jsonl`), `docs/examples/` as in the repository, and
//! the paths the book's examples use ([`BOOK_LAYOUT`]), less what the page's
//! commands write (`--out`, `table merge OUT`: a stage refuses an output
//! that exists, and a reader of the page has not run its commands yet).
//! `target/release` and `.venv/bin` come first on the PATH. The make, just
//! and `target/release/pipeline run` commands are left to
//! [`crate::examples`], which reads the same blocks, runs them in the same
//! demo layout (pipelines as dry runs: the file, its variables and every
//! stage's config checked; they run at tiny scale in runner.rs) and checks
//! what make reruns; the pipelines of [`RUN_FOR_REAL`], whose steps take
//! seconds, run here for real. A command that would train or sample at full
//! scale gets the `--set` values of [`TINY`] appended (later values win), so
//! the loop of Getting started runs in seconds with its own flags. A page's
//! results are then checked against what its prose says ([`check_page`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use embodyflow_tests::{Run, bin, read_advantages};

use crate::examples::{Block, blocks, demo_layout, repo, sh_ok, sh_with_path};

/// The info strings of the blocks this test runs.
const SHELL: [&str; 4] = ["sh", "bash", "shell", "console"];
const PYTHON: [&str; 2] = ["python", "py"];

/// Pipeline files whose documented runs run for real: their steps take
/// seconds on the layout's data.
const RUN_FOR_REAL: [&str; 1] = ["pipelines/verl-rescore.toml"];

/// `--set` values appended to a documented command of a stage, so that it
/// runs at the layout's tiny scale: the tests' tiny plan policy (unless the
/// command builds a VLA), a few tasks, epochs and samples.
const TINY: [(&str, &[&str]); 5] = [
    (
        "init-policy",
        &[
            "model.n_embd=32",
            "model.n_layer=1",
            "model.n_head=2",
            "model.n_ctx=1024",
            "tokenizer.vocab_size=400",
            "tokenizer.corpus_tasks=60",
        ],
    ),
    ("generate-tasks", &["count=8"]),
    ("update-policy", &["epochs=2"]),
    (
        "collect-rollouts",
        &[
            "tasks_per_iteration=4",
            "group_size=2",
            "max_new_tokens=40",
            "dynamic_sampling.enabled=false",
        ],
    ),
    ("evaluate", &["runs=1", "max_new_tokens=40"]),
];

/// The paths the book's examples read, made from the demo layout by the
/// stages themselves, in `root` (`sh` with `target/release` on the PATH):
/// `data/{train,val}` (the demo's), `runs/sft/policy` and `runs/it0/policy`
/// and `runs/init` (its tiny policy), one iteration under `runs/it0` (rollouts, rewards, the
/// policy's own teacher log-probs, step gates, advantages of grpo, the rule
/// and the forward proxy), `runs/it1/policy`, the rewards of the README's
/// one-minute import (`runs/quick/rewards`), a thinking VLA's iteration on
/// a few tabletop tasks (`runs/vla/init`, `runs/vla/it0/{rollouts,rewards}`:
/// decision-level GAE reads its values), a curve file as scripts/rl_loop
/// writes one, and a few BabyAI tasks.
const BOOK_LAYOUT: [&str; 17] = [
    "mkdir -p data runs/sft runs/it0 && cp -r runs/demo/data/train runs/demo/data/val data/",
    "cp -r runs/demo/sft/policy runs/init && cp -r runs/demo/sft/policy runs/sft/policy \
     && cp -r runs/demo/sft/policy runs/it0/policy",
    "collect-rollouts --policy runs/sft/policy --input data/train --out runs/it0/rollouts \
     --set tasks_per_iteration=4 --set group_size=3 --set max_new_tokens=40",
    "score-rewards --input runs/it0/rollouts --input data/train --out runs/it0/rewards",
    "teacher-logp --policy runs/it0/policy --teacher self --input runs/it0/rollouts \
     --input data/train --out runs/it0/teacher",
    "judge-steps --input runs/it0/rollouts --input runs/it0/rewards --input data/train \
     --out runs/it0/judge",
    "compute-advantages --input runs/it0/rollouts --input runs/it0/rewards --out runs/it0/adv",
    "compute-advantages --input runs/it0/rollouts --input runs/it0/rewards --out runs/it0/adv-rule \
     --policy runs/it0/policy --set estimator=grpo_step --set step.kind=rule",
    "compute-advantages --policy runs/it0/policy --input runs/it0/rollouts --input runs/it0/rewards \
     --input runs/it0/teacher --input runs/it0/judge --out runs/it0/adv-proxy \
     --set estimator=grpo_step --set step.kind=forward_proxy --set step.gate=prompt",
    "update-policy --policy runs/sft/policy --input runs/it0/rollouts --input runs/it0/adv \
     --out runs/it1 --set iteration=0",
    "score-rewards --input runs/quick/imported/trajectories --out runs/quick/rewards",
    "generate-tasks --out data/tabletop --seed 1 --set env=tabletop --set count=4",
    "init-policy --out runs/vla/init --seed 0 --set kind=vla --set tokenizer.vocab_size=300 \
     --set tokenizer.corpus_tasks=200 --set vla.max_instruction=48 --set vla.n_embd=32 \
     --set vla.n_head=2 --set vla.n_layer=1 --set vla.chunk_len=8 --set vla.latent_length=2",
    "collect-rollouts --policy runs/vla/init --input data/tabletop --out runs/vla/it0/rollouts \
     --set tasks_per_iteration=2 --set group_size=2",
    "score-rewards --input runs/vla/it0/rollouts --input data/tabletop --out runs/vla/it0/rewards",
    "mkdir -p runs/long && printf 'iteration\\ttrain_success\\tval_success\\nbefore\\t-\\t0.25\\n0\\t0.125\\t-\\n1\\t0.25\\t0.5\\n' \
     > runs/long/curve.tsv",
    "generate-tasks --out data/babyai-train --seed 7 --set env=gym --set gym.adapter=babyai \
     --set 'gym.env_ids=[\"BabyAI-GoToLocal-v0\"]' --set count=2",
];

/// One command of a shell block: the page line it starts on and its text,
/// `\` continuations joined.
struct Documented {
    line: usize,
    text: String,
}

/// The commands of a shell block: every line but blank ones and comments
/// (a `console` block's `$ ` lines only), with the page line each starts on.
fn commands(block: &Block) -> Vec<Documented> {
    let mut commands = Vec::new();
    let mut open: Option<Documented> = None;
    for (n, line) in block.text.lines().enumerate() {
        let mut line = line.trim();
        if let Some(command) = &mut open {
            command.text.push(' ');
            command.text.push_str(line.trim_end_matches('\\').trim());
            if !line.ends_with('\\') {
                commands.push(open.take().unwrap());
            }
            continue;
        }
        if block.lang == "console" {
            match line.strip_prefix("$ ") {
                Some(command) => line = command,
                None => continue,
            }
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let command = Documented {
            line: block.line + 1 + n,
            text: line.trim_end_matches('\\').trim().to_string(),
        };
        if line.ends_with('\\') {
            open = Some(command);
        } else {
            commands.push(command);
        }
    }
    commands.extend(open);
    commands
}

/// The directory of the workspace's built binaries.
fn release() -> PathBuf {
    bin("pipeline").parent().unwrap().to_path_buf()
}

/// Why this test cannot run `command`, if it cannot (see the module doc).
fn not_runnable(command: &str) -> Option<String> {
    if command.starts_with("make -f pipelines/Makefile ")
        || command.starts_with("just -f pipelines/justfile ")
    {
        return None;
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    let name = words[0].strip_prefix("target/release/").unwrap_or(words[0]);
    if name.contains('/') || name.contains('=') || !release().join(name).is_file() {
        return Some(format!(
            "`{}` is not a workspace binary, `make -f pipelines/Makefile` or `just -f pipelines/justfile`",
            words[0]
        ));
    }
    if name == "pipeline" && words.get(1) == Some(&"run") {
        let file = words.get(2).copied().unwrap_or("");
        if !file.starts_with("pipelines/") || !repo().join(file).is_file() {
            return Some(format!(
                "`pipeline run {file}` is of no file under pipelines/"
            ));
        }
    }
    None
}

/// Whether `block` is one this test runs or skips: a shell or Python one.
fn is_code(block: &Block) -> bool {
    SHELL.contains(&block.lang.as_str()) || PYTHON.contains(&block.lang.as_str())
}

/// The README and the book's pages, each with its name and its code
/// blocks.
fn pages() -> Vec<(String, Vec<Block>)> {
    let mut files = vec![crate::docs::repo().join("README.md")];
    files.extend(crate::docs::book_pages());
    files
        .into_iter()
        .map(|file| {
            let name = file
                .strip_prefix(crate::docs::repo())
                .unwrap_or(&file)
                .display()
                .to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            let blocks = blocks(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, blocks)
        })
        .collect()
}

/// Whether a line of a block without a language calls a workspace binary,
/// by any path (`target/release/table`, `$B/table`, `table`).
fn calls_a_binary(line: &str) -> bool {
    let first = line.split_whitespace().next().unwrap_or("");
    let name = first.rsplit('/').next().unwrap_or("");
    !name.is_empty() && release().join(name).is_file()
}

/// The unmarked blocks of the pages that this test cannot run, and the
/// command blocks without a language, as `page:line: why`.
fn unrunnable(pages: &[(String, Vec<Block>)]) -> Vec<String> {
    let mut found = Vec::new();
    for (page, blocks) in pages {
        for block in blocks {
            if block.lang.is_empty() && block.text.lines().any(calls_a_binary) {
                found.push(format!(
                    "{page}:{}: a block of commands without a language: make it `sh`",
                    block.line
                ));
            }
        }
        for block in blocks.iter().filter(|b| b.skip.is_none() && is_code(b)) {
            if PYTHON.contains(&block.lang.as_str()) {
                continue;
            }
            for command in commands(block) {
                if let Some(why) = not_runnable(&command.text) {
                    found.push(format!("{page}:{}: {why}", command.line));
                }
            }
        }
    }
    found
}

#[test]
fn every_shell_and_python_block_is_run_or_marked() {
    let pages = pages();
    let total = pages
        .iter()
        .flat_map(|(_, b)| b)
        .filter(|b| is_code(b))
        .count();
    assert!(total >= 30, "{total} shell and Python blocks");
    let found = unrunnable(&pages);
    assert!(
        found.is_empty(),
        "code blocks no test runs: make each command one that \
         tests/integration/doc_blocks.rs runs, or put \
         `<!-- examples: skip (why) -->` on the line before the fence:\n{}",
        found.join("\n")
    );
}

/// Whether `command` is one that [`crate::examples`] runs, reading the same
/// blocks: make and just commands, and dry runs of `target/release/pipeline
/// run` (those of [`RUN_FOR_REAL`] run here, for real).
fn ran_by_examples(command: &str) -> bool {
    let pipeline = "target/release/pipeline run pipelines/";
    command.starts_with(crate::examples::MAKE)
        || command.starts_with(crate::examples::JUST)
        || (command.starts_with(pipeline)
            && !RUN_FOR_REAL
                .iter()
                .any(|file| command.starts_with(&format!("target/release/pipeline run {file} "))))
}

/// `command` as this test runs it (see the module doc): a dry run of a
/// pipeline not in [`RUN_FOR_REAL`], the [`TINY`] values of its stage
/// appended.
fn as_run(command: &str) -> String {
    let mut command = command.to_string();
    if let Some(at) = command.find(" #") {
        command.truncate(at);
    }
    command.truncate(command.trim_end().len());
    let words: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    let name = words[0]
        .strip_prefix("target/release/")
        .unwrap_or(&words[0]);
    if name == "pipeline"
        && words.get(1).is_some_and(|w| w == "run")
        && !RUN_FOR_REAL.contains(&words[2].as_str())
        && !words.iter().any(|w| w == "--dry-run")
    {
        command.push_str(" --dry-run");
    }
    for (stage, sets) in TINY {
        if stage != name || (stage == "init-policy" && command.contains("kind=vla")) {
            continue;
        }
        // Under LIBERO's protocol `count` is the suite's number of tasks.
        if stage == "generate-tasks" && command.contains("protocol=initial-states") {
            continue;
        }
        for set in sets {
            command.push_str(&format!(" --set {set}"));
        }
    }
    command
}

/// Runs `command` with `sh -c` in `dir`, `target/release` and `.venv/bin`
/// first on the PATH.
fn sh_in(dir: &Path, command: &str) -> Run {
    sh_with_path(dir, command, &[&release()])
}

/// The paths `command` writes: its `--out`, `table merge`'s first path.
fn outputs(command: &str) -> Vec<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut outputs: Vec<String> = words
        .windows(2)
        .filter(|pair| pair[0] == "--out")
        .map(|pair| pair[1].to_string())
        .collect();
    if words.len() > 2 && words[0].ends_with("table") && words[1] == "merge" {
        outputs.push(words[2].to_string());
    }
    outputs
}

/// Runs a page's blocks in order in `dir`, after removing from it what the
/// page's commands write; the first failure, naming the page line, ends the
/// page.
fn run_page(
    page: &str,
    blocks: &[Block],
    dir: &Path,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let python = repo().join(".venv/bin/python");
    let shell = |b: &&Block| b.skip.is_none() && SHELL.contains(&b.lang.as_str());
    for block in blocks.iter().filter(shell) {
        for command in commands(block) {
            for out in outputs(&command.text) {
                let path = dir.join(out);
                if path.is_dir() {
                    std::fs::remove_dir_all(&path).unwrap();
                } else if path.exists() {
                    std::fs::remove_file(&path).unwrap();
                }
            }
        }
    }
    for block in blocks.iter().filter(|b| b.skip.is_none() && is_code(b)) {
        if PYTHON.contains(&block.lang.as_str()) {
            if !python.is_file() {
                notes.push(format!(
                    "{page}:{}: not run: no .venv/bin/python (scripts/setup makes it)",
                    block.line
                ));
                continue;
            }
            let output = Command::new(&python)
                .arg("-c")
                .arg(&block.text)
                .current_dir(dir)
                .output()
                .expect("spawn python");
            if !output.status.success() {
                return Err(format!(
                    "{page}:{}: the Python block fails:\n{}",
                    block.line,
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
            continue;
        }
        for command in commands(block) {
            if let Some(why) = not_runnable(&command.text) {
                return Err(format!("{page}:{}: {why}", command.line));
            }
            if ran_by_examples(&command.text) {
                continue;
            }
            if command.text.starts_with("just ") && sh_in(dir, "command -v just").code != 0 {
                notes.push(format!(
                    "{page}:{}: not run: just is not installed (scripts/setup puts it in .venv/bin)",
                    command.line
                ));
                continue;
            }
            let run = as_run(&command.text);
            let result = sh_in(dir, &run);
            if result.code != 0 {
                return Err(format!("{page}:{}: `{run}`\n{result}", command.line));
            }
        }
    }
    check_page(page, dir)
}

/// What a page's prose says of the results of its blocks, checked in `dir`
/// after they ran.
fn check_page(page: &str, dir: &Path) -> Result<(), String> {
    let missing = |files: &[&str]| -> Result<(), String> {
        for file in files {
            if !dir.join(file).exists() {
                return Err(format!("{page}: its blocks left no {file}"));
            }
        }
        Ok(())
    };
    match page {
        "README.md" => {
            // Each stage leaves its summary in its output.
            missing(&[
                "runs/quick/rewards/_summary.score-rewards.md",
                "runs/quick/grpo/_summary.compute-advantages.md",
                "runs/quick/gae/_summary.compute-advantages.md",
                "runs/verl/rescore/report/ablation.md",
            ])?;
            let mut magnitudes: Vec<String> =
                read_advantages(&dir.join("runs/quick/grpo/advantages"))
                    .iter()
                    .map(|row| format!("{:.2}", row.episode_adv))
                    .collect();
            magnitudes.sort();
            magnitudes.dedup();
            let documented = ["-0.50", "-0.87", "-1.50", "0.00", "0.50", "0.87", "1.50"];
            if magnitudes != documented {
                return Err(format!(
                    "README.md: GRPO's episode advantages on the one-minute example are {magnitudes:?}, the README says {documented:?}"
                ));
            }
            Ok(())
        }
        "docs/src/interoperability.md" => missing(&[
            "adv.jsonl",
            "runs/trl/imported/trajectories",
            "runs/trl/rescore/report/ablation.md",
        ]),
        "docs/src/stages/table.md" => missing(&["rewards.csv", "data/copy/tasks"]),
        _ => Ok(()),
    }
}

#[test]
fn every_shell_and_python_block_runs() {
    let pages = pages();
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    demo_layout(&base);
    std::fs::create_dir_all(base.join("docs")).unwrap();
    sh_ok(
        &base,
        &format!(
            "cp -r {} docs/examples",
            repo().join("docs/examples").display()
        ),
    );
    for command in BOOK_LAYOUT {
        let result = sh_in(&base, command);
        assert_eq!(result.code, 0, "`{command}`\n{result}");
    }
    eprintln!("the layout: {:.1} s", started.elapsed().as_secs_f64());
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let mut ran = 0;
    for (n, (page, blocks)) in pages.iter().enumerate() {
        if !blocks.iter().any(|b| b.skip.is_none() && is_code(b)) {
            continue;
        }
        let at = Instant::now();
        let sandbox = dir.path().join(format!("page-{n}"));
        sh_ok(
            dir.path(),
            &format!("cp -a {} {}", base.display(), sandbox.display()),
        );
        match run_page(page, blocks, &sandbox, &mut notes) {
            Ok(()) => {
                ran += blocks
                    .iter()
                    .filter(|b| b.skip.is_none() && is_code(b))
                    .count()
            }
            Err(e) => failures.push(e),
        }
        eprintln!("{page}: {:.1} s", at.elapsed().as_secs_f64());
        std::fs::remove_dir_all(&sandbox).unwrap();
    }
    for note in &notes {
        eprintln!("note: {note}");
    }
    eprintln!(
        "{ran} blocks ran in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} page(s) with a failing block:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn shell_blocks_split_into_commands_at_their_page_lines() {
    let page = "text\n```sh\n# a comment\nmake -f M A=1 \\\n    B=2   # note\n\n\
                table show x\n```\n```console\n$ table schema\noutput\n```\n";
    let blocks = blocks(page).unwrap();
    let got: Vec<(usize, String)> = blocks
        .iter()
        .flat_map(commands)
        .map(|c| (c.line, c.text))
        .collect();
    assert_eq!(
        got,
        [
            (4, "make -f M A=1 B=2   # note".to_string()),
            (7, "table show x".to_string()),
            (10, "table schema".to_string()),
        ]
    );
    assert_eq!(
        as_run("target/release/pipeline run pipelines/household-grpo.toml --out r  # a note"),
        "target/release/pipeline run pipelines/household-grpo.toml --out r --dry-run"
    );
    assert_eq!(
        as_run("target/release/pipeline run pipelines/verl-rescore.toml --out r"),
        "target/release/pipeline run pipelines/verl-rescore.toml --out r"
    );
    assert_eq!(
        as_run("update-policy --policy p --out o --set epochs=40"),
        "update-policy --policy p --out o --set epochs=40 --set epochs=2"
    );
    assert!(not_runnable("scripts/demo").is_some());
    assert!(not_runnable("cargo build --release").is_some());
    assert!(not_runnable("target/release/pipeline run FILE --out DIR").is_some());
    assert!(not_runnable("table show x").is_none());
}
