//! The pipeline runner end to end on tiny models: cache hits and misses, a
//! run killed mid-step resumes to the same outputs, a runner killed alone
//! takes its stage processes with it and resumes at once, a sweep collects
//! its rollouts once, sharded steps equal unsharded ones, and a bad pipeline
//! fails before any stage runs.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{AdvantageRow, MetricRow, RewardRow, TableName};
use embodyflow_tests::{Run, TINY_VLA, bin, run};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pipelines")
        .join(name)
}

/// The household-grpo pipeline at test scale (tiny model, few tasks).
const TINY: &[&str] = &[
    "train_tasks=14",
    "val_tasks=4",
    "sft_epochs=2",
    "iterations=2",
    "draws=4",
    "group=3",
    "init.model.n_embd=32",
    "init.model.n_layer=1",
    "init.model.n_head=2",
    "init.model.n_ctx=1024",
    "init.tokenizer.vocab_size=400",
    "init.tokenizer.corpus_tasks=60",
    "collect.max_new_tokens=40",
    "sft.mini_batch=4",
    "sft.micro_batch=2",
    "sft.sft.demos_per_task_type=1",
];

fn args<'a>(file: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", s(file), "--out", s(out)];
    for set in TINY.iter().chain(extra) {
        args.push("--set");
        args.push(set);
    }
    args
}

/// Runs the pipeline and returns each instance's status word, by id.
pub(crate) fn statuses(result: &Run) -> BTreeMap<String, String> {
    result
        .stdout
        .lines()
        .filter(|l| l.starts_with('['))
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            // [ n/N] id stage status...
            let at = if fields[0] == "[" { 2 } else { 1 };
            let status = if fields[at + 2] == "passed" || fields[at + 2] == "would" {
                format!("{} {}", fields[at + 2], fields[at + 3])
            } else {
                fields[at + 2].to_string()
            };
            (fields[at].to_string(), status)
        })
        .collect()
}

fn ok(args: &[&str]) -> BTreeMap<String, String> {
    let result = run("pipeline", args);
    assert_eq!(result.code, 0, "pipeline {args:?}\n{result}");
    statuses(&result)
}

/// The run report's train success of iteration 0 is a number in [0, 1]: the
/// share of every sampled rollout, even when dynamic sampling kept no group.
fn assert_train_success_is_a_rate(report: &str) {
    let train = report
        .lines()
        .find_map(|l| l.strip_prefix("| 0 | "))
        .and_then(|rest| rest.split(" |").next())
        .unwrap_or_else(|| panic!("no metrics row for iteration 0\n{report}"));
    assert!(
        train.parse::<f64>().is_ok_and(|v| (0.0..=1.0).contains(&v)),
        "train success `{train}`\n{report}"
    );
}

/// Every step's recorded outputs (`_step.json`), by instance directory.
pub(crate) fn outputs(out: &Path) -> BTreeMap<String, serde_json::Value> {
    let mut found = BTreeMap::new();
    let mut stack = vec![out.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            } else if entry.file_name() == "_step.json" {
                let record: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let id = dir.strip_prefix(out).unwrap().display().to_string();
                found.insert(id, record["outputs"].clone());
            }
        }
    }
    found
}

#[test]
fn cache_hits_when_nothing_changed_and_misses_when_one_key_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = shipped("household-grpo.toml");
    let out = dir.path().join("run");
    let first = ok(&args(&file, &out, &["iterations=1"]));
    assert_eq!(first.len(), 9, "{first:?}");
    assert!(
        first.values().all(|s| s == "ran" || s == "passed on"),
        "{first:?}"
    );
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(
        report.contains("| it0/collect | collect-rollouts | ran |"),
        "{report}"
    );
    assert!(out.join("report/success-default.png").is_file());
    // Train success is the share of every sampled rollout: a number even when
    // dynamic sampling kept no group (the tiny policy solves nothing).
    assert_train_success_is_a_rate(&report);

    let dry = ok(&{
        let mut a = args(&file, &out, &["iterations=1"]);
        a.push("--dry-run");
        a
    });
    assert!(dry.values().all(|s| s == "cached"), "{dry:?}");
    let again = ok(&args(&file, &out, &["iterations=1"]));
    assert!(again.values().all(|s| s == "cached"), "{again:?}");

    // One key of the evaluate step changes: only that step reruns.
    let changed = ok(&args(&file, &out, &["iterations=1", "eval_runs=2"]));
    let ran: Vec<&str> = changed
        .iter()
        .filter(|(_, s)| *s != "cached")
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(ran, ["it0/eval"], "{changed:?}");
    // An SFT key changes: SFT and the steps reading its policy rerun, tasks
    // and init do not. Steps downstream of those rerun only when their
    // inputs' content changed (content addressing, not timestamps).
    let before = outputs(&out);
    let changed = ok(&args(
        &file,
        &out,
        &["iterations=1", "eval_runs=2", "sft.optim.lr=1e-3"],
    ));
    let after = outputs(&out);
    for id in ["train", "val", "init"] {
        assert_eq!(changed[id], "cached", "{changed:?}");
    }
    for id in ["sft", "it0/collect", "it0/eval"] {
        assert_ne!(changed[id], "cached", "{id}: {changed:?}");
    }
    assert_ne!(before["sft"], after["sft"]);
    let same_rollouts = before["it0/collect"] == after["it0/collect"];
    assert_eq!(
        changed["it0/score"] == "cached",
        same_rollouts,
        "{changed:?}"
    );
    // --only reruns one step whatever the cache says.
    let mut only = args(
        &file,
        &out,
        &["iterations=1", "eval_runs=2", "sft.optim.lr=1e-3"],
    );
    only.extend(["--only", "score"]);
    let only = ok(&only);
    assert_eq!(only["it0/score"], "ran");
    assert_eq!(only["it0/collect"], "kept");
}

#[test]
fn a_swept_loop_draws_every_cells_curves_on_one_chart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("swept.toml");
    let text = std::fs::read_to_string(shipped("household-grpo.toml")).unwrap();
    std::fs::write(
        &file,
        format!("{text}\n[sweep]\nlr = [\"1e-4\", \"3e-5\"]\n"),
    )
    .unwrap();
    let out = dir.path().join("run");
    let statuses = ok(&args(&file, &out, &["iterations=1"]));
    assert_eq!(statuses["sft"], "ran", "setup is shared: {statuses:?}");
    assert_eq!(statuses["it0/collect"], "ran", "{statuses:?}");
    assert_eq!(
        statuses
            .keys()
            .filter(|id| id.starts_with("it0/update@"))
            .count(),
        2,
        "{statuses:?}"
    );
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    let every = report
        .split("## Every cell")
        .nth(1)
        .unwrap_or_else(|| panic!("no every-cell section\n{report}"));
    for series in [
        "lr=1e-4: train (sampled rollouts)",
        "lr=1e-4: eval step eval",
        "lr=3e-5: train (sampled rollouts)",
        "lr=3e-5: eval step eval",
    ] {
        assert!(every.contains(series), "{series} missing\n{report}");
    }
    let png = embodyflow_plots::Png::read(&out.join("report/success-cells.png")).unwrap();
    assert_eq!((png.width, png.height), (640, 400));
    assert!(png.colours() > 20, "{} colours", png.colours());
    assert_run_log(&out, &["lr=1e-4", "lr=3e-5"]);
}

/// The run log of a run in `out` with these cells: the CSV holds every
/// update row's loss at global steps that count SFT's rows first, and
/// TensorBoard's own loader reads each cell's event file to the same
/// values.
fn assert_run_log(out: &Path, cells: &[&str]) {
    let csv = std::fs::read_to_string(out.join("report/runlog.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("cell,iteration,global_step,step,stage,name,value,wall_time")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let loss = |cell: &str, step: &str| -> Vec<(u64, f64)> {
        rows.iter()
            .filter(|r| r[0] == cell && r[3] == step && r[5] == "loss")
            .map(|r| (r[2].parse().unwrap(), r[6].parse().unwrap()))
            .collect()
    };
    let sft = loss(cells[0], "sft");
    assert!(!sft.is_empty(), "{csv}");
    assert_eq!(sft[0].0, 1, "SFT's first optimizer step is global step 1");
    for cell in cells {
        // An update passed on (no group kept) has no rows; one that ran
        // counts on from SFT's.
        let update = loss(cell, "update");
        if let Some(first) = update.first() {
            assert_eq!(first.0, sft.len() as u64 + 1, "{cell}: {update:?}");
        }
        assert_eq!(loss(cell, "sft"), sft, "the shared SFT in every cell");
        for name in ["success", "samples", "wall_s"] {
            assert!(
                rows.iter().any(|r| r[0] == *cell && r[5] == name),
                "{cell}: no {name}\n{csv}"
            );
        }
    }
    let png =
        embodyflow_plots::Png::read(&out.join("report/curve-update-policy-loss.png")).unwrap();
    assert!(png.colours() > 20, "{} colours", png.colours());
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(report.contains("## Run log"), "{report}");
    for cell in cells {
        let text = tensorboard_scalars(out, cell);
        for step in ["sft", "update"] {
            let tag = format!("{step}/loss ");
            let read: Vec<(u64, f64)> = text
                .lines()
                .filter_map(|l| l.strip_prefix(tag.as_str()))
                .map(|l| {
                    let (step, value) = l.split_once(' ').unwrap();
                    (step.parse().unwrap(), value.parse().unwrap())
                })
                .collect();
            let written = loss(cell, step);
            assert_eq!(read.len(), written.len(), "{cell} {step}:\n{text}");
            for ((at, value), (want_at, want)) in read.iter().zip(&written) {
                assert_eq!(at, want_at);
                assert_eq!(*value as f32, *want as f32, "{cell} {step} at {at}");
            }
        }
    }
}

/// The scalars of a cell's event files as TensorBoard's own loader reads
/// them (as `tensorboard --logdir` does): `tag step value` lines, by tag.
fn tensorboard_scalars(out: &Path, cell: &str) -> String {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let script = r#"
import sys
from tensorboard.backend.event_processing import event_accumulator
acc = event_accumulator.EventAccumulator(sys.argv[1])
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print(f"{tag} {e.step} {e.value!r}")
"#;
    let dir = out
        .join("report/tensorboard")
        .join(cell.replace([',', '='], "_"));
    let output = Command::new(&python)
        .args(["-c", script, s(&dir)])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// The run log's figures as (iteration, global step, step, name), sorted:
/// what two runs of one plan share (values and wall times differ).
fn run_log_keys(out: &Path) -> Vec<(String, u64, String, String)> {
    let csv = std::fs::read_to_string(out.join("report/runlog.csv")).unwrap();
    let mut keys: Vec<_> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let r: Vec<&str> = l.split(',').collect();
            (
                r[1].to_string(),
                r[2].parse().unwrap(),
                r[3].to_string(),
                r[5].to_string(),
            )
        })
        .collect();
    keys.sort();
    keys
}

/// The run log of a run killed while it1/collect ran: exactly the figures
/// of the steps that finished (setup and iteration 0), as the whole run
/// logged them, and TensorBoard reads each one.
fn assert_killed_run_log(killed: &Path, whole: &Path) {
    let logged = run_log_keys(killed);
    let finished: Vec<_> = run_log_keys(whole)
        .into_iter()
        .filter(|k| k.0.is_empty() || k.0 == "0")
        .collect();
    for (iteration, step, name) in [("", "sft", "loss"), ("0", "collect", "success")] {
        assert!(
            finished
                .iter()
                .any(|k| k.0 == iteration && k.2 == step && k.3 == name),
            "no {step}/{name}"
        );
    }
    assert_eq!(logged, finished, "the killed run's log");
    let mut read: Vec<(String, u64)> = tensorboard_scalars(killed, "default")
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            (
                f.next().unwrap().to_string(),
                f.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    read.sort();
    let mut want: Vec<(String, u64)> = logged
        .iter()
        .map(|k| (format!("{}/{}", k.2, k.3), k.1))
        .collect();
    want.sort();
    assert_eq!(read, want, "TensorBoard reads every logged figure");
}

#[test]
fn a_run_killed_mid_step_resumes_and_gives_the_same_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let file = shipped("household-grpo.toml");
    let whole = dir.path().join("whole");
    ok(&args(&file, &whole, &[]));

    let killed = dir.path().join("killed");
    let mut child = Command::new(bin("pipeline"))
        .args(args(&file, &killed, &[]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    // Kill the runner and its stage processes while it-1's rollouts are collected.
    let running = killed.join("_runner/logs/it1/collect");
    let started = Instant::now();
    while !running.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "it1/collect never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the runner ended before it1/collect"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let group = format!("-{}", child.id());
    let status = Command::new("kill")
        .args(["-KILL", "--", &group])
        .status()
        .unwrap();
    assert!(status.success());
    child.wait().unwrap();
    assert!(
        !killed.join("it1/collect/_step.json").exists(),
        "killed before it1/collect completed"
    );
    assert_killed_run_log(&killed, &whole);

    let resumed = ok(&args(&file, &killed, &[]));
    for id in ["train", "sft", "it0/collect", "it0/update"] {
        assert_eq!(resumed[id], "cached", "{id}: {resumed:?}");
    }
    assert_eq!(resumed["it1/collect"], "ran", "{resumed:?}");
    let (a, b) = (outputs(&whole), outputs(&killed));
    assert_eq!(a.len(), 13);
    assert_same_outputs(&a, &b, &whole, &killed);
    assert_eq!(
        run_log_keys(&killed),
        run_log_keys(&whole),
        "the resumed run's log"
    );
    assert_run_log(&killed, &["default"]);
}

/// Asserts that two runs of one pipeline wrote the same outputs: every
/// table and checkpoint bit for bit, except that a metrics table (the
/// optimizer's reported figures) may differ within float rounding. CI once
/// saw the `sft` step's metrics table differ between two fresh runs while
/// its checkpoint (the weights) and every other table were identical: the
/// reported sums (loss, entropy, gradient norm) are libtorch CPU reductions
/// whose last bit is not guaranteed from one process to the next. On a real
/// difference this names the step, the column and the row.
fn assert_same_outputs(
    a: &BTreeMap<String, serde_json::Value>,
    b: &BTreeMap<String, serde_json::Value>,
    a_dir: &Path,
    b_dir: &Path,
) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the two runs completed different steps"
    );
    for (id, a_outputs) in a {
        let b_outputs = &b[id];
        if a_outputs == b_outputs {
            continue;
        }
        let (a_list, b_list) = (a_outputs.as_array().unwrap(), b_outputs.as_array().unwrap());
        assert_eq!(
            a_list.len(),
            b_list.len(),
            "{id}: {a_outputs} vs {b_outputs}"
        );
        for (x, y) in a_list.iter().zip(b_list) {
            if x == y {
                continue;
            }
            let identity = x["identity"].as_str().unwrap();
            assert!(
                identity.starts_with("table metrics ") && x["path"] == y["path"],
                "{id}: the resumed run's output {y} differs from the uninterrupted run's {x}"
            );
            let path = x["path"].as_str().unwrap();
            let rows = |dir: &Path| -> Vec<MetricRow> {
                TableReader::open(&dir.join(id).join(path), TableName::Metrics)
                    .unwrap()
                    .read_rows()
                    .unwrap()
            };
            assert_metrics_close(id, &rows(a_dir), &rows(b_dir));
        }
    }
}

/// Metrics rows equal in their keys and within 1e-5 (relative) in every figure.
fn assert_metrics_close(id: &str, a: &[MetricRow], b: &[MetricRow]) {
    assert_eq!(a.len(), b.len(), "{id}: metrics rows");
    let figures = |m: &MetricRow| -> Vec<(&'static str, Option<f32>)> {
        vec![
            ("loss", Some(m.loss)),
            ("pg_loss", Some(m.pg_loss)),
            ("clipfrac", m.clipfrac),
            ("clipfrac_lower", m.clipfrac_lower),
            ("approx_kl", m.approx_kl),
            ("entropy", Some(m.entropy)),
            ("kl_loss", m.kl_loss),
            ("latent_loss", m.latent_loss),
            ("end_loss", m.end_loss),
            ("value_loss", m.value_loss),
            ("grad_norm", Some(m.grad_norm)),
            ("lr", Some(m.lr)),
        ]
    };
    for (x, y) in a.iter().zip(b) {
        assert_eq!((x.iteration, x.update), (y.iteration, y.update), "{id}");
        for ((name, u), (_, v)) in figures(x).into_iter().zip(figures(y)) {
            let close = match (u, v) {
                (Some(u), Some(v)) => {
                    u.is_finite()
                        && v.is_finite()
                        && (u - v).abs() <= 1e-5 * u.abs().max(v.abs()).max(1.0)
                }
                (None, None) => true,
                _ => false,
            };
            assert!(
                close,
                "{id}: metrics update {} column {name}: {u:?} (uninterrupted) vs {v:?} (resumed)",
                x.update
            );
        }
    }
}

/// Tasks, a policy, rollouts (COLLECT_SHARDS processes) and their rewards:
/// enough rollouts that collecting them takes a few seconds.
const KILLED: &str = r#"
[[step]]
name = "train"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 40 }

[[step]]
name = "init"
stage = "init-policy"
set = { model = { n_embd = 32, n_layer = 1, n_head = 2, n_ctx = 1024 }, tokenizer = { vocab_size = 400, corpus_tasks = 60 } }

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "${init}"
inputs = ["${train}"]
seed = 3
set = { group_size = 4, max_new_tokens = 96, temperature = 1.6 }
COLLECT_SHARDS

[[step]]
name = "score"
stage = "score-rewards"
inputs = ["${collect}", "${train}"]
set = { "reward.fn" = "embodied_r1", "reward.tolerant" = true }
"#;

/// The processes whose parent is `parent` and whose command line has
/// `--out OUT` for one of `outs` (a stage process after `exec`), by pid.
fn stage_processes(parent: u32, outs: &[PathBuf]) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if parent_of(pid) != Some(parent) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let print_config = args.iter().any(|a| *a == b"--print-config");
        let out = args
            .windows(2)
            .find(|w| w[0] == b"--out")
            .map(|w| PathBuf::from(String::from_utf8_lossy(w[1]).into_owned()));
        if !print_config && out.is_some_and(|o| outs.contains(&o)) {
            found.push(pid);
        }
    }
    found
}

/// Field `at` (0 = state) after the command name of `/proc/PID/stat`.
fn stat_field(pid: u32, at: usize) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    rest.split_whitespace().nth(at).map(str::to_string)
}

fn parent_of(pid: u32) -> Option<u32> {
    stat_field(pid, 1)?.parse().ok()
}

/// Whether `pid` runs or is stopped (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|state| state != "Z" && state != "X")
}

fn signal(name: &str, pids: &[u32]) {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .args(&pids)
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pids:?}");
}

/// Hidden entries (a writer's unfinished `.<name>.tmp-…`) anywhere under `dir`.
fn hidden_entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                found.push(path.clone());
            }
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            }
        }
    }
    found
}

#[test]
fn a_runner_killed_alone_takes_its_stage_processes_with_it_and_resumes_at_once() {
    for shards in [1u32, 2] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("killed.toml");
        let text = KILLED.replace(
            "COLLECT_SHARDS",
            &format!("shards = {shards}\ndevices = [\"cpu\"]"),
        );
        std::fs::write(&file, text).unwrap();
        let whole = dir.path().join("whole");
        ok(&["run", s(&file), "--out", s(&whole)]);

        let killed = dir.path().join("killed");
        // The runner in this test's process group: only it is killed below.
        let mut runner = Command::new(bin("pipeline"))
            .args(["run", s(&file), "--out", s(&killed)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let collect = killed.join("collect");
        let outs: Vec<PathBuf> = if shards == 1 {
            vec![collect.clone()]
        } else {
            (0..shards)
                .map(|i| collect.join("_shards").join(i.to_string()))
                .collect()
        };
        let started = Instant::now();
        let stages = loop {
            let found = stage_processes(runner.id(), &outs);
            if found.len() == outs.len() {
                break found;
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "collect never ran as {shards} process(es)"
            );
            assert!(
                runner.try_wait().unwrap().is_none(),
                "the runner ended before collect ran"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        // Stopped, the stage processes cannot finish on their own: only the
        // runner's death can end them now.
        signal("STOP", &stages);
        let stopped = |pid: u32| stat_field(pid, 0).as_deref() == Some("T");
        let stopping = Instant::now();
        while !stages.iter().all(|&pid| stopped(pid)) {
            let states: Vec<Option<String>> = stages.iter().map(|&p| stat_field(p, 0)).collect();
            assert!(
                stopping.elapsed() < Duration::from_secs(5),
                "collect finished before it could be stopped: states {states:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        runner.kill().unwrap();
        runner.wait().unwrap();
        let killed_at = Instant::now();
        while stages.iter().any(|&pid| alive(pid)) && killed_at.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let orphans: Vec<u32> = stages.iter().copied().filter(|&pid| alive(pid)).collect();
        if !orphans.is_empty() {
            signal("KILL", &orphans);
        }
        assert!(
            orphans.is_empty(),
            "{shards} shard(s): stage processes {orphans:?} outlived the runner killed with kill -9"
        );
        eprintln!(
            "{shards} shard(s): stage processes gone {:.0} ms after the runner was killed",
            killed_at.elapsed().as_secs_f64() * 1e3
        );
        assert!(!collect.join("_step.json").exists());

        let resumed = ok(&["run", s(&file), "--out", s(&killed)]);
        assert_eq!(resumed["train"], "cached", "{resumed:?}");
        assert_eq!(resumed["init"], "cached", "{resumed:?}");
        assert_eq!(resumed["collect"], "ran", "{resumed:?}");
        assert_eq!(resumed["score"], "ran", "{resumed:?}");
        assert_eq!(
            outputs(&whole),
            outputs(&killed),
            "{shards} shard(s): the resumed run's outputs differ from the uninterrupted run's"
        );
        let hidden = hidden_entries(&collect);
        assert!(
            hidden.is_empty(),
            "leftovers in the resumed step: {hidden:?}"
        );
    }
}

/// A pipeline over one saved rollout set: rewards and advantages swept.
const OFFLINE: &str = r#"
[vars]
mode = "exact"
estimator = "grpo"

[[step]]
name = "train"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 14 }

[[step]]
name = "init"
stage = "init-policy"
set = { model = { n_embd = 32, n_layer = 1, n_head = 2, n_ctx = 1024 }, tokenizer = { vocab_size = 400, corpus_tasks = 60 } }

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "${init}"
inputs = ["${train}"]
seed = 3
set = { group_size = 3, max_new_tokens = 40, temperature = 1.6 }

[[step]]
name = "score"
stage = "score-rewards"
inputs = ["${collect}", "${train}"]
set = { "reward.fn" = "embodied_r1", "reward.tolerant" = true, "match.mode" = "${mode}" }
SCORE_SHARDS

[[step]]
name = "adv"
stage = "compute-advantages"
policy = "${init}"
inputs = ["${collect}", "${score}"]
set = { estimator = "${estimator}", "step.kind" = "rule" }
ADV_SHARDS
"#;

fn offline(score_shards: u32, adv_shards: u32, sweep: bool) -> String {
    let mut text = OFFLINE
        .replace("SCORE_SHARDS", &format!("shards = {score_shards}"))
        .replace("ADV_SHARDS", &format!("shards = {adv_shards}"));
    if sweep {
        text.push_str(
            "\n[sweep]\nmode = [\"exact\", \"lcs\"]\nestimator = [\"grpo\", \"grpo_step\"]\n",
        );
    }
    text
}

#[test]
fn a_sweep_collects_rollouts_once_and_gathers_one_table() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sweep.toml");
    std::fs::write(&file, offline(1, 1, true)).unwrap();
    let out = dir.path().join("run");
    let statuses = ok(&["run", s(&file), "--out", s(&out)]);
    let count = |prefix: &str| statuses.keys().filter(|id| id.starts_with(prefix)).count();
    assert_eq!(count("collect"), 1, "{statuses:?}");
    assert_eq!(count("score@"), 2, "one per match mode: {statuses:?}");
    assert_eq!(count("adv@"), 4, "one per cell: {statuses:?}");
    assert!(statuses.values().all(|s| s == "ran"));
    let ablation = std::fs::read_to_string(out.join("report/ablation.md")).unwrap();
    assert_eq!(ablation.lines().count(), 2 + 4, "{ablation}");
    assert!(
        ablation.contains("| estimator=grpo_step,mode=lcs |"),
        "{ablation}"
    );
    // One metric per chart, rewards beside rewards of their own function.
    assert!(!out.join("report/ablation.png").exists());
    for chart in [
        "ablation-train-success.png",
        "ablation-reward-embodied_r1.png",
    ] {
        assert!(out.join("report").join(chart).is_file(), "{chart}");
    }
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(!report.contains("else mean reward"), "{report}");
    assert!(
        report.contains("height = mean reward (reward.fn embodied_r1)"),
        "{report}"
    );
    // A new estimator value reuses the saved rollouts and rewards.
    let more = ok(&[
        "run",
        s(&file),
        "--out",
        s(&out),
        "--set",
        "adv.step.omega=0.5",
    ]);
    assert_eq!(more["collect"], "cached");
    assert_eq!(more["score@mode=lcs"], "cached");
    assert_eq!(more["adv@estimator=grpo_step,mode=lcs"], "ran");
    // Settings the file already makes, given again on the command line: the
    // argument lists differ, the resolved configs do not, nothing reruns.
    let same = ok(&[
        "run",
        s(&file),
        "--out",
        s(&out),
        "--set",
        "adv.step.omega=0.5",
        "--set",
        "train.split=train",
        "--set",
        "collect.group_size=3",
        "--set",
        "collect.temperature=1.6",
        "--set",
        "score.output.zstd_level=3",
    ]);
    assert!(same.values().all(|s| s == "cached"), "{same:?}");
}

fn rows<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(&dir.join(table.as_str()), table)
        .unwrap()
        .read_rows()
        .unwrap()
}

#[test]
fn sharded_steps_equal_unsharded_ones() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.toml");
    let many = dir.path().join("many.toml");
    std::fs::write(&one, offline(1, 1, false)).unwrap();
    std::fs::write(&many, offline(3, 2, false)).unwrap();
    let out = dir.path().join("run");
    ok(&["run", s(&one), "--out", s(&out)]);
    let mut sorted_rewards: Vec<RewardRow> = rows(&out.join("score"), TableName::Rewards);
    let mut sorted_adv: Vec<AdvantageRow> = rows(&out.join("adv"), TableName::Advantages);
    // The same run directory: tasks, init and rollouts are cache hits, the
    // sharded steps run as 3 and 2 processes.
    let statuses = ok(&["run", s(&many), "--out", s(&out)]);
    assert_eq!(statuses["collect"], "cached");
    assert_eq!(statuses["score"], "ran");
    assert!(
        out.join("score/_shards/2/rewards/_manifest.parquet")
            .is_file()
    );
    let mut rewards: Vec<RewardRow> = rows(&out.join("score"), TableName::Rewards);
    let mut adv: Vec<AdvantageRow> = rows(&out.join("adv"), TableName::Advantages);
    assert!(!rewards.is_empty());
    for list in [&mut rewards, &mut sorted_rewards] {
        list.sort_by(|a, b| a.trajectory_id.cmp(&b.trajectory_id));
    }
    for list in [&mut adv, &mut sorted_adv] {
        list.sort_by(|a, b| {
            (&a.trajectory_id, a.step_index).cmp(&(&b.trajectory_id, b.step_index))
        });
    }
    assert_eq!(rewards, sorted_rewards);
    assert_eq!(adv, sorted_adv);
}

#[test]
fn a_bad_pipeline_fails_before_any_stage_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let cases = [
        (
            offline(1, 1, false).replace("stage = \"score-rewards\"", "stage = \"score-reward\""),
            "bad.toml:27:",
            "unknown stage `score-reward`",
        ),
        (
            offline(1, 1, false).replace(
                "\"${collect}\", \"${score}\"",
                "\"${collect}\", \"${scores}\"",
            ),
            "bad.toml:36:",
            "unknown name `${scores}`",
        ),
        (
            offline(1, 1, false).replace("\"match.mode\"", "\"match.mood\""),
            "bad.toml:29:",
            "unknown config key `match.mood`",
        ),
        (
            offline(1, 1, false).replace("temperature = 1.6", "temperature = \"hot\""),
            "bad.toml:23:",
            "`temperature`",
        ),
        (
            offline(1, 1, false).replace("[\"${train}\"]\nseed = 3", "[\"data/none\"]\nseed = 3"),
            "bad.toml:18:",
            "data/none does not exist",
        ),
        // Conditional reads the stage decides from the declarations it runs
        // (`--print-config`'s `reads`): the reward's, the estimator's.
        (
            offline(1, 1, false).replace(
                "inputs = [\"${collect}\", \"${train}\"]",
                "inputs = [\"${collect}\"]",
            ),
            "bad.toml:26:",
            "step `score` (score-rewards) reads table `tasks` when the chosen reward.fn needs them",
        ),
        (
            offline(1, 1, false)
                .replace("estimator = \"grpo\"", "estimator = \"grpo_step\"")
                .replace(
                    "\"step.kind\" = \"rule\"",
                    "\"step.kind\" = \"rule\", \"step.gate\" = \"prompt\"",
                ),
            "bad.toml:33:",
            "step `adv` (compute-advantages) reads table `step_gates` when estimator = grpo_step with step.gate = prompt, as its config has it",
        ),
        (
            offline(1, 1, false).replace("[\"${collect}\", \"${score}\"]", "[\"${collect}\"]"),
            "bad.toml:33:",
            "reads table `rewards` on every run, and none of its inputs holds it",
        ),
        (
            offline(1, 1, false).replace(
                "stage = \"init-policy\"",
                "stage = \"init-policy\"\nshards = 2",
            ),
            "bad.toml:14:",
            "stage `init-policy` cannot be sharded (it writes one checkpoint)",
        ),
        // Values out of range are found by the stages' own checks, via --print-config.
        (
            offline(1, 1, false).replace("group_size = 3", "group_size = 0"),
            "bad.toml:23:",
            "config key `group_size`: expected at least 1, found 0",
        ),
        (
            offline(1, 1, false).replace("split = \"train\"", "split = \"bogus\""),
            "bad.toml:10:",
            "config key `split`: unknown variant `bogus`",
        ),
    ];
    // SFT without its tasks: update-policy reads `tasks` when its resolved
    // config has objective = sft.
    let sft = format!(
        "{}\n[[step]]\nname = \"sft\"\nstage = \"update-policy\"\npolicy = \"${{init}}\"\ninputs = [\"${{collect}}\"]\nset = {{ objective = \"sft\", epochs = 1 }}\n",
        offline(1, 1, false)
    );
    let sft_line = format!(
        "bad.toml:{}:",
        sft.lines().position(|l| l == "name = \"sft\"").unwrap() + 1
    );
    let mut cases = cases.to_vec();
    cases.push((
        sft,
        sft_line.as_str(),
        "step `sft` (update-policy) reads table `tasks` when objective = sft, as its config has it, and none of its inputs holds it",
    ));
    for (text, line, needle) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let result = run("pipeline", &["run", s(&file), "--out", s(&out)]);
        assert_eq!(result.code, 2, "{result}");
        assert!(
            result.stderr.contains(line) && result.stderr.contains(needle),
            "expected {line} {needle}\n{result}"
        );
        assert!(
            !out.join("train").exists(),
            "a stage ran before the error was found:\n{result}"
        );
    }
    // A bad value given on the command line fails the dry run too.
    let file = dir.path().join("good.toml");
    std::fs::write(&file, offline(1, 1, false)).unwrap();
    let result = refused_dry_run(&file, &out, "collect.group_size=0");
    assert!(
        result.stderr.contains("(command line)")
            && result.stderr.contains("config key `group_size`"),
        "{result}"
    );
    assert!(!out.join("train").exists(), "{result}");
    // An absurd iteration count is refused at once, not planned.
    let started = Instant::now();
    let result = refused_dry_run(
        &shipped("household-grpo.toml"),
        &out,
        "iterations=100000000",
    );
    assert!(
        result
            .stderr
            .contains("loop `iterations` = 100000000 makes")
            && result.stderr.contains("a plan has at most 100000"),
        "{result}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The shipped pipeline naming teacher-logp at least plans.
    let forward = ok(&[
        "run",
        s(&shipped("household-forward-proxy.toml")),
        "--out",
        s(&out),
        "--dry-run",
    ]);
    assert!(
        forward.keys().any(|id| id.contains("teacher")),
        "{forward:?}"
    );
}

/// `pipeline run FILE --out OUT --dry-run --set SET`, which must be
/// refused as bad input (exit 2).
fn refused_dry_run(file: &Path, out: &Path, set: &str) -> Run {
    let result = run(
        "pipeline",
        &["run", s(file), "--out", s(out), "--dry-run", "--set", set],
    );
    assert_eq!(result.code, 2, "{set}: {result}");
    result
}

/// The tabletop pipelines at test scale (a tiny VLA, few tasks): under
/// LIBERO's protocol, 2 tasks at 2 train and 1 val initial states.
const TINY_TABLETOP: &[&str] = &[
    "pretrain_count=4",
    "pretrain_epochs=2",
    "suite_tasks=2",
    "train_states=2",
    "val_states=1",
    "sft_epochs=2",
    "iterations=2",
    "draws=2",
    "group=2",
    "eval_runs=1",
];

/// The arguments of a shipped tabletop pipeline at [`TINY_TABLETOP`]
/// scale with the tiny VLA's keys (and `extra` keys) on its init step,
/// writing under `out`.
fn tiny_tabletop_args(name: &str, out: &Path, vars: &[&str], init_extra: &[&str]) -> Vec<String> {
    let file = shipped(name);
    // The tiny VLA's keys on the pipeline's init step (which sets kind = vla).
    let init = TINY_VLA
        .iter()
        .chain(init_extra)
        .map(|key| format!("init.{key}"));
    let mut args: Vec<String> = vec!["run".into(), s(&file).into(), "--out".into(), s(out).into()];
    for set in vars.iter().map(|v| v.to_string()).chain(init) {
        args.extend(["--set".to_string(), set]);
    }
    args
}

/// Runs a shipped tabletop pipeline ([`tiny_tabletop_args`]) whose `setup`
/// steps run before its loop; returns the statuses, the run directory
/// (kept by `dir`) and the arguments.
fn run_tiny_tabletop(
    dir: &Path,
    name: &str,
    vars: &[&str],
    init_extra: &[&str],
    setup: usize,
) -> (BTreeMap<String, String>, PathBuf, Vec<String>) {
    let out = dir.join("run");
    let args = tiny_tabletop_args(name, &out, vars, init_extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = ok(&refs);
    // The setup steps, 2 iterations of collect / score / adv / update, the last one's eval.
    assert_eq!(first.len(), setup + 2 * 4 + 1, "{first:?}");
    assert!(
        first.values().all(|s| s == "ran" || s == "passed on"),
        "{first:?}"
    );
    // The evaluation played closed-loop episodes.
    let eval = std::fs::read_to_string(out.join("it1/eval/_summary.evaluate.md")).unwrap();
    assert!(eval.contains("(vla, closed loop)"), "{eval}");
    assert!(
        eval.contains("| episodes | 2 (2 tasks x 1 runs, greedy) |"),
        "{eval}"
    );
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert_train_success_is_a_rate(&report);
    (first, out, args)
}

/// SimpleVLA-RL's pipeline at tiny scale with its gates reported only
/// (`gates=false`): pretraining, one-demo and full SFT, the two gate
/// evaluations (their figures and verdicts in their summaries), then RL.
#[test]
fn the_tabletop_pipeline_runs_closed_loop_iterations_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut vars = TINY_TABLETOP.to_vec();
    vars.extend(["extra_draws=2", "full_epochs=1", "gates=false"]);
    // train, val, pretraining tasks, init, pretrain, sft, sft_full, gate_full, gate_one_demo
    let (_, out, args) = run_tiny_tabletop(dir.path(), "tabletop-grpo.toml", &vars, &[], 9);
    let full = std::fs::read_to_string(out.join("gate_full/_summary.evaluate.md")).unwrap();
    for line in [
        "| gate gate.min_success = 0.7 |",
        "| gate gate.min_grasp_slope = 0.8 |",
        "| grasp slope",
    ] {
        assert!(full.contains(line), "{line}: {full}");
    }
    let one = std::fs::read_to_string(out.join("gate_one_demo/_summary.evaluate.md")).unwrap();
    for line in [
        "| gate gate.min_success = 0.05 |",
        "| gate gate.max_success = 0.35 |",
        "| gate gate.min_mixed_groups = 0.25 |",
        "| gate gate.min_sampled_ratio = 0.5 |",
        "| pass@k episodes | 4 (2 tasks x 1 runs x 2 samples, T 1.6) |",
    ] {
        assert!(one.contains(line), "{line}: {one}");
    }
    // A rerun finds every step cached.
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let again = ok(&refs);
    assert!(again.values().all(|s| s == "cached"), "{again:?}");

    // Another run from this one's pretrained VLA: the pretraining tasks,
    // init and pretrain do not run, and both SFTs start from it.
    let other = tempfile::tempdir().unwrap();
    let base = out.join("pretrain");
    let from_base = format!("base={}", base.display());
    vars.push(&from_base);
    // train, val, sft, sft_full, gate_full, gate_one_demo
    let (steps, second, _) = run_tiny_tabletop(other.path(), "tabletop-grpo.toml", &vars, &[], 6);
    for step in ["pretrain_tasks", "init", "pretrain"] {
        assert!(!steps.contains_key(step), "{step} ran: {steps:?}");
        assert!(!second.join(step).exists(), "{step}");
    }
    for step in ["sft", "sft_full"] {
        let record = std::fs::read_to_string(second.join(step).join("_step.json")).unwrap();
        let policy = base.join("policy").display().to_string();
        assert!(
            record.contains(&policy),
            "{step} starts from {policy}: {record}"
        );
    }
}

/// With its gates enforced (the default), a base that does not imitate
/// stops the tabletop pipeline at its first gate, naming the gate and the
/// figure; nothing of the RL loop runs and the gate's summary stays.
#[test]
fn the_tabletop_pipeline_refuses_rl_from_a_base_that_fails_its_gates() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut vars = TINY_TABLETOP.to_vec();
    // The area camera's frames, as every task of the run stores it.
    vars.extend(["full_epochs=1", "camera=area"]);
    let args = tiny_tabletop_args("tabletop-grpo.toml", &out, &vars, &[]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = run("pipeline", &refs);
    assert_ne!(result.code, 0, "{result}");
    let all = format!("{}{}", result.stdout, result.stderr);
    assert!(all.contains("gate_full"), "{result}");
    assert!(
        all.contains("is below gate.min_success = 0.7") && all.contains("gate.enforce=false"),
        "{result}"
    );
    let summary = std::fs::read_to_string(out.join("gate_full/_summary.evaluate.md")).unwrap();
    assert!(summary.contains("FAILED"), "{summary}");
    assert!(!out.join("it0").exists(), "RL ran from a gated-out base");
    for tasks in ["train", "val", "pretrain_tasks"] {
        let rows: Vec<embodyflow_core::schemas::TaskRow> =
            TableReader::open(&out.join(tasks).join("tasks"), TableName::Tasks)
                .unwrap()
                .read_rows()
                .unwrap();
        assert!(
            rows.iter().all(|r| {
                let spec: serde_json::Value =
                    serde_json::from_slice(r.observation.as_deref().unwrap()).unwrap();
                spec["camera"] == "area"
            }),
            "{tasks}: every task stores the area camera"
        );
    }
}

/// A shipped pipeline's former variable names (its `[renamed]` table) are
/// refused, with `--set` and with `--sweep`, naming the new name, before
/// anything runs (the ablation's new `policy` runs in examples.rs, through
/// the Makefile's `ablation` target).
#[test]
fn renamed_variables_are_refused_with_their_new_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    for (file, set, new) in [
        ("household-grpo.toml", "train_count=16", "train_tasks"),
        ("household-grpo.toml", "val_count=8", "val_tasks"),
        ("household-grpo.toml", "tasks=8", "draws"),
        ("textkeyroom-grpo.toml", "train_count=16", "train_tasks"),
        ("tabletop-grpo.toml", "task_count=2", "suite_tasks"),
        ("libero-spatial-grpo.toml", "tasks=2", "draws"),
        (
            "ablation-rule-vs-proxy.toml",
            "checkpoint=runs/demo/sft/policy",
            "policy",
        ),
    ] {
        let old = set.split_once('=').unwrap().0;
        let message = format!("variable `{old}` was renamed `{new}`");
        let result = refused_dry_run(&shipped(file), &out, set);
        assert!(
            result.stderr.contains(&format!("--set `{set}`: {message}")),
            "{file} {set}: {result}"
        );
        let sweep = run(
            "pipeline",
            &[
                "run",
                s(&shipped(file)),
                "--out",
                s(&out),
                "--dry-run",
                "--sweep",
                &format!("{old}=1,2"),
            ],
        );
        assert_eq!(sweep.code, 2, "{sweep}");
        assert!(sweep.stderr.contains(&message), "{file} {old}: {sweep}");
        assert!(!out.exists(), "{file} {set}: {result}");
    }
}

/// LaST-R1's pipeline at tiny scale: a thinking VLA's warm-up, rollouts
/// with latents, decision-level GAE on its values, LAPO updates (every
/// episode kept, so every iteration updates) and a greedy evaluation
/// reporting the chosen latent lengths; then its GRPO arm on the same
/// warm-up.
#[test]
fn the_lapo_pipeline_thinks_updates_with_lapo_and_reports_latent_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let (first, out, args) = run_tiny_tabletop(
        dir.path(),
        "tabletop-lapo.toml",
        TINY_TABLETOP,
        &["vla.latent_length=4", "vla.latent_group=2"],
        7,
    );
    assert_eq!(
        (&*first["it0/update"], &*first["it1/update"]),
        ("ran", "ran")
    );
    let sft = std::fs::read_to_string(out.join("sft/_summary.update-policy.md")).unwrap();
    assert!(
        sft.contains("latent targets") && sft.contains("PCA"),
        "{sft}"
    );
    // The last update's summary and metrics rows.
    let last_update = || -> (String, Vec<MetricRow>) {
        let update = out.join("it1/update");
        let summary = std::fs::read_to_string(update.join("_summary.update-policy.md")).unwrap();
        let metrics = TableReader::open(&update.join("metrics"), TableName::Metrics)
            .unwrap()
            .read_rows()
            .unwrap();
        (summary, metrics)
    };
    let (update, metrics) = last_update();
    for line in [
        "chosen latent lengths",
        "value explained variance",
        "mean LAPO terms",
    ] {
        assert!(update.contains(line), "{line}: {update}");
    }
    assert!(
        metrics
            .iter()
            .all(|m| m.value_loss.is_some_and(f32::is_finite)
                && m.latent_loss.is_some()
                && m.end_loss.is_some())
    );
    let eval = std::fs::read_to_string(out.join("it1/eval/_summary.evaluate.md")).unwrap();
    assert!(eval.contains("latent lengths (greedy decisions)"), "{eval}");
    // The GRPO arm from the same warm-up: the setup steps are cached, the
    // loop's GRPO advantages train the thinking VLA with objective = ppo
    // (its sampled tokens behind the stored latents, no value loss).
    let mut grpo = args;
    grpo.extend(["--set", "estimator=grpo", "--set", "objective=ppo"].map(String::from));
    let refs: Vec<&str> = grpo.iter().map(String::as_str).collect();
    let second = ok(&refs);
    assert_eq!(
        (&*second["sft"], &*second["it1/update"]),
        ("cached", "ran"),
        "{second:?}"
    );
    let (update, metrics) = last_update();
    assert!(
        update.contains("| objective | ppo |")
            && update.contains("chosen latent lengths")
            && !update.contains("value explained variance"),
        "{update}"
    );
    assert!(
        metrics
            .iter()
            .all(|m| m.value_loss.is_none() && m.loss.is_finite())
    );
}

/// scripts/tabletop_study at toy scale with two training seeds: the second
/// seed starts from the first's pretrained VLA (its setup steps are cache
/// hits), and every seed gets its three policy rows in `results.tsv`.
#[test]
fn the_tabletop_study_starts_every_seed_from_one_pretrained_vla() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("study");
    let knobs = [
        ("SEEDS", "0 1"),
        ("PRETRAIN_COUNT", "20"),
        ("PRETRAIN_EPOCHS", "1"),
        ("SFT_EPOCHS", "1"),
        ("FULL_EPOCHS", "1"),
        ("ITERATIONS", "1"),
        ("TASKS", "2"),
        ("G", "2"),
        ("TRAIN_STATES", "2"),
        ("VAL_STATES", "1"),
        ("TEST_STATES", "1"),
        ("SAMPLES", "1"),
        ("GEN_COUNT", "2"),
        ("GATES", "false"),
        ("OUT", s(&out)),
    ];
    let study = embodyflow_tests::run_script("tabletop_study", &[], &knobs);
    assert_eq!(study.code, 0, "{study}");
    let second = std::fs::read_to_string(out.join("seed1/rl.log")).unwrap();
    for step in ["train", "val", "pretrain_tasks", "init", "pretrain"] {
        let line = second
            .lines()
            .find(|l| {
                l.split(']')
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    == Some(step)
            })
            .unwrap_or_else(|| panic!("{step}: {second}"));
        assert!(line.contains("cached"), "{line}");
    }
    let results = std::fs::read_to_string(out.join("results.tsv")).unwrap();
    for seed in ["0", "1"] {
        let rows = results
            .lines()
            .filter(|l| l.split('\t').next() == Some(seed))
            .count();
        assert_eq!(rows, 3, "seed {seed}: {results}");
    }
    assert!(out.join("table.md").is_file() && out.join("curves.png").is_file());
}
