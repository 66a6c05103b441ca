//! What the Slurm and Ray tests share: the sharded pipeline both run, the
//! jobs a run directory lists, a pipeline whose task fails, and the means
//! to catch a stage process while it runs.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub(crate) fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A small offline pipeline with sharded steps; `BACKEND` is replaced by
/// the `[backend]` table.
const PIPELINE: &str = r#"
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
shards = 2
cpus = 1
mem = "2G"

[[step]]
name = "score"
stage = "score-rewards"
inputs = ["${collect}", "${train}"]
set = { "reward.fn" = "embodied_r1", "reward.tolerant" = true }
shards = 3

[[step]]
name = "adv"
stage = "compute-advantages"
policy = "${init}"
inputs = ["${collect}", "${score}"]
set = { estimator = "grpo_step", "step.kind" = "rule" }
shards = 2

BACKEND
"#;

/// Writes the pipeline with `backend` as its `[backend]` table and
/// `step_extra` added to step `score`.
pub(crate) fn pipeline_file(dir: &Path, name: &str, backend: &str, step_extra: &str) -> PathBuf {
    let text = PIPELINE
        .replace("BACKEND", backend)
        .replace("shards = 3\n", &format!("shards = 3\n{step_extra}"));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The jobs a run directory lists (`_runner/<backend>/jobs.jsonl`).
pub(crate) fn jobs(out: &Path, backend: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join(format!("_runner/{backend}/jobs.jsonl")))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A one-step pipeline whose collect reads a copy of `tasks` with its
/// first shard zeroed (its content hash no longer matches), with the
/// policy `init`: its task exits 2.
pub(crate) fn failing_pipeline(dir: &Path, tasks: &Path, init: &Path, backend: &str) -> PathBuf {
    let spoiled = dir.join("spoiled");
    let copy = spoiled.join("tasks");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(tasks).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let shard = copy.join("part-00000.parquet");
    let size = std::fs::metadata(&shard).unwrap().len() as usize;
    std::fs::write(&shard, vec![0u8; size]).unwrap();
    let failing = dir.join("failing.toml");
    std::fs::write(
        &failing,
        format!(
            "[[step]]\nname = \"collect\"\nstage = \"collect-rollouts\"\npolicy = {:?}\ninputs = [{:?}]\n\n{backend}",
            s(init),
            s(&spoiled)
        ),
    )
    .unwrap();
    failing
}

/// The pid of the process whose command line has `--out OUT`.
pub(crate) fn process_writing(out: &Path) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args
            .windows(2)
            .any(|w| w[0] == b"--out" && w[1] == out.as_os_str().as_encoded_bytes())
        {
            return Some(pid);
        }
    }
    None
}

/// Waits until `done`, failing when `limit` passes or the runner ends first.
pub(crate) fn wait_until(
    what: &str,
    child: &mut Child,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        assert!(
            child.try_wait().unwrap().is_none(),
            "{what}: the runner ended first"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The exit code of the runner, which must end within `limit`.
pub(crate) fn exit_code(child: &mut Child, limit: Duration) -> Option<i32> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            started.elapsed() < limit,
            "the runner did not end within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops a process (SIGSTOP): a stage caught mid-run stays there.
pub(crate) fn freeze(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
