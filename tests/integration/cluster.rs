//! What the Slurm and Ray tests share: one test body run per backend
//! ([`runs_resumes_and_refuses`], each backend's differences behind
//! [`TestCluster`]), the sharded pipeline both run, the jobs a run
//! directory lists, a pipeline whose task fails, and the means to catch a
//! stage process while it runs.
//!
//! The body, in phases: bad input refused before anything is submitted; the
//! pipeline through the cluster with outputs equal to the local backend's
//! and a rerun that submits nothing; a failed task reported with its exit
//! code and log tail; a job stopped mid-run and a resumed run that submits
//! only what is missing; a runner killed midway, whose jobs refuse new runs
//! into the directory until `pipeline cancel` takes them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_tests::{Run, bin, run_with_env};

use crate::runner::{outputs, statuses};

/// A bad-input case: the pipeline file, the run directory, extra
/// environment, what the error says.
pub(crate) type Case = (
    PathBuf,
    PathBuf,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

/// What differs between the clusters the shared body runs on.
pub(crate) trait TestCluster {
    /// The backend's name (`--backend`, `_runner/<name>/`).
    fn name(&self) -> &'static str;
    /// What every `pipeline` command of the test finds in its environment.
    fn env(&self) -> Vec<(&'static str, String)>;
    /// The `[backend]` table, with `shared` (the `shared = […]` line).
    fn backend(&self, shared: &str) -> String;
    /// Its bad inputs, from the test's directory, its `[backend]` table,
    /// the `shared` line and the good pipeline file.
    fn bad_inputs(&self, dir: &Path, backend: &str, shared: &str, file: &Path) -> Vec<Case>;
    /// What a run's journal and its stages' summaries must show beyond
    /// the outputs (one job per …, the threads, the cluster's own view).
    fn check_run(&self, out: &Path);
    /// Stops collect's first shard job while it runs under `child`.
    fn stop_collect(&self, child: &mut Child, out: &Path);
    /// What the runner's report of the stopped job says.
    fn stopped_says(&self) -> &'static str;
    /// What is left of the stopped run on the cluster and in its directory.
    fn check_stopped(&self, out: &Path);
    /// The instances a resumed run submits again, in order.
    fn resubmitted(&self) -> Vec<&'static str>;
    /// Waits until the jobs of the runner `child` are there to cancel.
    fn wait_submitted(&self, child: &mut Child, out: &Path);
    /// That none of `out`'s jobs still runs after `pipeline cancel`.
    fn check_cancelled(&self, out: &Path);
}

/// `pipeline ARGS` with the cluster's environment.
pub(crate) fn pipeline(cluster: &dyn TestCluster, args: &[&str]) -> Run {
    let env = cluster.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_with_env("pipeline", args, &env)
}

/// `pipeline run FILE --out OUT` in the background, its output to `log`.
fn spawn_run(cluster: &dyn TestCluster, file: &Path, out: &Path, log: &Path) -> Child {
    Command::new(bin("pipeline"))
        .args(["run", s(file), "--out", s(out), "--poll", "0.2"])
        .envs(cluster.env())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The workspace root.
pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The shared test body on `cluster`.
pub(crate) fn runs_resumes_and_refuses(cluster: &dyn TestCluster) {
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = bin("pipeline").parent().unwrap().to_path_buf();
    let shared = format!(
        "shared = [{:?}, {:?}, {:?}]",
        s(dir.path()),
        s(&workspace()),
        s(&bin_dir)
    );
    let backend = cluster.backend(&shared);
    let file = pipeline_file(dir.path(), "p.toml", &backend, "");
    refuses_bad_input(
        cluster,
        &cluster.bad_inputs(dir.path(), &backend, &shared, &file),
    );
    let local = same_as_local(cluster, dir.path(), &file);
    reports_a_failed_task(cluster, dir.path(), &backend);
    resumes_after_a_stopped_job(cluster, dir.path(), &file, &local);
    refuses_runs_until_cancelled(cluster, dir.path(), &file);
}

/// Bad input: exit 2 before anything is submitted.
fn refuses_bad_input(cluster: &dyn TestCluster, cases: &[Case]) {
    for (file, out, env, says) in cases {
        let mut all_env = cluster.env();
        all_env.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        let all_env: Vec<(&str, &str)> = all_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let result = run_with_env(
            "pipeline",
            &["run", s(file), "--out", s(out), "--backend", cluster.name()],
            &all_env,
        );
        assert_eq!(result.code, 2, "{says}\n{result}");
        assert!(result.stderr.contains(says), "expected `{says}`:\n{result}");
        assert!(
            jobs(out, cluster.name()).is_empty(),
            "{says}: jobs were submitted"
        );
    }
}

/// The same pipeline on this machine and through the cluster: equal
/// outputs, the cluster's own checks, and a rerun that submits nothing.
/// Returns the local run's directory.
fn same_as_local(cluster: &dyn TestCluster, dir: &Path, file: &Path) -> PathBuf {
    let local = dir.join("local");
    let result = pipeline(
        cluster,
        &["run", s(file), "--out", s(&local), "--backend", "local"],
    );
    assert_eq!(result.code, 0, "{result}");
    let out = dir.join(cluster.name());
    let started = Instant::now();
    let result = pipeline(
        cluster,
        &["run", s(file), "--out", s(&out), "--poll", "0.2"],
    );
    assert_eq!(result.code, 0, "{result}");
    eprintln!(
        "{}({} run: {:.1} s)",
        result.stdout,
        cluster.name(),
        started.elapsed().as_secs_f64()
    );
    let ran = statuses(&result);
    assert_eq!(ran.len(), 5, "{ran:?}");
    assert!(ran.values().all(|s| s == "ran"), "{ran:?}");
    assert_eq!(
        outputs(&local),
        outputs(&out),
        "{}'s outputs differ from the local backend's",
        cluster.name()
    );
    assert!(out.join("score/_stage.2.log").is_file());
    assert!(out.join("train/_stage.log").is_file());
    let figures = format!("{} queue: submission to start: median", cluster.name());
    assert!(result.stdout.contains(&figures), "{result}");
    cluster.check_run(&out);
    let listed = jobs(&out, cluster.name()).len();
    let again = pipeline(cluster, &["run", s(file), "--out", s(&out)]);
    assert_eq!(again.code, 0, "{again}");
    assert!(statuses(&again).values().all(|s| s == "cached"), "{again}");
    assert_eq!(
        jobs(&out, cluster.name()).len(),
        listed,
        "a cached run submitted jobs"
    );
    local
}

/// A failed task: its exit code and the tail of its log.
fn reports_a_failed_task(cluster: &dyn TestCluster, dir: &Path, backend: &str) {
    let out = dir.join(cluster.name());
    let failing = failing_pipeline(dir, &out.join("train/tasks"), &out.join("init"), backend);
    let failed = pipeline(
        cluster,
        &[
            "run",
            s(&failing),
            "--out",
            s(&dir.join("failed")),
            "--poll",
            "0.2",
        ],
    );
    assert_eq!(failed.code, 1, "{failed}");
    assert_eq!(statuses(&failed)["collect"], "failed", "{failed}");
    assert!(
        failed
            .stderr
            .contains("step `collect` (collect-rollouts) failed with exit code 2; log ")
            && failed.stderr.contains("content hash is"),
        "the exit code and the log's tail:\n{failed}"
    );
}

/// A job stopped mid-run: collect's shard 0 is frozen while it runs (so
/// that it cannot finish first), then the cluster stops its job; the run
/// reports it, and a resumed run submits only what is missing.
fn resumes_after_a_stopped_job(cluster: &dyn TestCluster, dir: &Path, file: &Path, local: &Path) {
    let stopped = dir.join("stopped");
    let log = dir.join("stopped.log");
    let mut child = spawn_run(cluster, file, &stopped, &log);
    cluster.stop_collect(&mut child, &stopped);
    let code = exit_code(&mut child, Duration::from_secs(60));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(1), "{text}");
    let seen = statuses(&Run {
        code: 1,
        stdout: text.clone(),
        stderr: String::new(),
    });
    assert_eq!(seen["train"], "ran", "{text}");
    assert_eq!(seen["collect"], "failed", "{text}");
    assert_eq!(seen["score"], "not", "{text}");
    assert_eq!(seen["adv"], "not", "{text}");
    assert!(
        text.contains(cluster.stopped_says()),
        "the stopped job is reported:\n{text}"
    );
    cluster.check_stopped(&stopped);
    assert!(!stopped.join("collect/_step.json").exists());
    let before = jobs(&stopped, cluster.name()).len();
    let resumed = pipeline(
        cluster,
        &["run", s(file), "--out", s(&stopped), "--poll", "0.2"],
    );
    assert_eq!(resumed.code, 0, "{resumed}");
    let seen = statuses(&resumed);
    for (id, status) in [
        ("train", "cached"),
        ("init", "cached"),
        ("collect", "ran"),
        ("score", "ran"),
        ("adv", "ran"),
    ] {
        assert_eq!(seen[id], status, "{id}: {resumed}");
    }
    let resubmitted: Vec<String> = jobs(&stopped, cluster.name())[before..]
        .iter()
        .map(|j| j["instance"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        resubmitted,
        cluster.resubmitted(),
        "only the missing steps are submitted again"
    );
    assert_eq!(outputs(local), outputs(&stopped));
}

/// The runner killed midway: its jobs go on, and no run into that
/// directory starts until they end or `pipeline cancel` takes them.
fn refuses_runs_until_cancelled(cluster: &dyn TestCluster, dir: &Path, file: &Path) {
    let cancelled = dir.join("cancelled");
    let log = dir.join("cancelled.log");
    let mut child = spawn_run(cluster, file, &cancelled, &log);
    cluster.wait_submitted(&mut child, &cancelled);
    child.kill().unwrap();
    child.wait().unwrap();
    for backend in ["local", cluster.name()] {
        let refused = pipeline(
            cluster,
            &["run", s(file), "--out", s(&cancelled), "--backend", backend],
        );
        assert_eq!(refused.code, 2, "{backend}: {refused}");
        assert!(
            refused
                .stderr
                .contains("jobs of an earlier submission into"),
            "{backend}: {refused}"
        );
    }
    let result = pipeline(cluster, &["cancel", s(&cancelled)]);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.starts_with("cancelled "), "{result}");
    cluster.check_cancelled(&cancelled);
    let again = pipeline(cluster, &["cancel", s(&cancelled)]);
    assert!(again.stdout.starts_with("no job of "), "{again}");
}

/// Freezes shard 0 of `out`'s collect once it runs, so that its job stays
/// running, and returns that job's id (of `backend`'s journal).
pub(crate) fn catch_collect(child: &mut Child, out: &Path, backend: &str) -> String {
    let shard = out.join("collect/_shards/0");
    let mut pid = None;
    wait_until(
        "collect's shard 0 starts",
        child,
        Duration::from_secs(90),
        || {
            pid = process_writing(&shard);
            pid.is_some()
        },
    );
    freeze(pid.unwrap());
    jobs(out, backend)
        .iter()
        .find(|j| j["instance"] == "collect" && j["kind"] == "stage" && j["first"] == 0)
        .map(|j| j["job"].as_str().unwrap().to_string())
        .unwrap()
}

/// The ids of the jobs a run directory lists.
pub(crate) fn job_ids(out: &Path, backend: &str) -> Vec<String> {
    jobs(out, backend)
        .iter()
        .map(|j| j["job"].as_str().unwrap().to_string())
        .collect()
}

/// Each job's `(instance, kind, field)` as the journal lists them.
pub(crate) fn described(out: &Path, backend: &str, field: &str) -> Vec<(String, String, u64)> {
    jobs(out, backend)
        .iter()
        .map(|j| {
            (
                j["instance"].as_str().unwrap().to_string(),
                j["kind"].as_str().unwrap().to_string(),
                j[field].as_u64().unwrap(),
            )
        })
        .collect()
}

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
