//! The Gymnasium bridge's workers kept warm across stage processes
//! (`[pipeline] keep_workers`): consecutive stages take the same served
//! workers and build no environment again; a socket that does not exist
//! is a note and the stage runs as without it; the runner keeps its
//! workers across steps and leaves none behind after a run that succeeds,
//! a run whose step fails and a run stopped with Ctrl-C (SIGINT); the
//! Slurm and Ray backends refuse the key; a `module:function` adapter
//! the pipeline's steps name runs on the kept workers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_core::schemas::{TableName, TrajectoryRow};
use embodyflow_gym::served::{POOL_VAR, ServedWorkers};
use embodyflow_gym::{BridgeConfig, GymTaskSpec, task_row};
use embodyflow_tests::{bin, run, run_with_env, write_table};

use super::gym_stages::{TINY_VLA, ok, rows, s};

/// Two counter tasks of the `faulty` adapter in `dir`, each environment
/// build appended to `built`, with more `kwargs` (a step `delay`, an
/// `env_id` of none).
fn counter_tasks(dir: &Path, built: &Path, env_id: &str, kwargs: serde_json::Value) {
    let task_rows: Vec<_> = (0..2)
        .map(|t| {
            let mut spec = GymTaskSpec::new("faulty", env_id, t, 6);
            spec.kwargs = kwargs.clone();
            spec.kwargs["built"] = serde_json::json!(built);
            task_row(&format!("counter/{t}"), "train", &spec).unwrap()
        })
        .collect();
    write_table(dir, &task_rows);
}

/// A tiny VLA for the counter tasks of `tasks` (its probe builds one
/// environment).
fn vla(tasks: &Path, out: &Path) {
    let mut init = vec!["--out", s(out), "--input", s(tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    ok("init-policy", &init);
}

/// Lines of a file the counter appends to (0 when it does not exist).
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// Each served worker's (pid, environments built).
fn census(workers: &ServedWorkers) -> Vec<(u32, u64)> {
    workers.builds(Duration::from_secs(10)).unwrap()
}

/// The arguments of a closed-loop stage run of `policy` on `tasks` into
/// `out`, with `sets`.
fn stage_args(policy: &Path, tasks: &Path, out: &Path, sets: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["--policy", s(policy), "--input", s(tasks), "--out", s(out)]
        .map(String::from)
        .to_vec();
    for set in sets {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args
}

/// `stage` with `args` and `POOL_VAR = pool`, which must exit 0; its stderr.
fn stage(name: &str, args: &[String], pool: &str) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = run_with_env(name, &args, &[(POOL_VAR, pool)]);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stderr
}

#[test]
fn consecutive_stages_take_the_same_served_workers_and_build_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, built) = (dir.path().join("tasks"), dir.path().join("built"));
    counter_tasks(&tasks, &built, "Counter-v0", serde_json::json!({}));
    let workers = ServedWorkers::start(
        &dir.path().join("workers"),
        2,
        &BridgeConfig::default().python,
        &[],
    )
    .unwrap();
    let pool = workers.sockets_var().into_string().unwrap();
    let policy = dir.path().join("vla");
    let mut init = vec!["--out", s(&policy), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    stage(
        "init-policy",
        &init.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        &pool,
    );
    assert_eq!(lines(&built), 1, "init-policy's probe, on a served worker");
    let pids = workers.pids();
    assert_eq!(census(&workers), vec![(pids[0], 1), (pids[1], 0)]);
    let sets = ["bridge.workers=2", "group_size=2"];
    let out = dir.path().join("rollouts");
    stage(
        "collect-rollouts",
        &stage_args(&policy, &tasks, &out, &sets),
        &pool,
    );
    // 2 tasks x G = 2 on 2 workers: two slots each, so one environment
    // each beyond the probe's, by the same processes.
    let warm = census(&workers);
    assert_eq!(warm, vec![(pids[0], 2), (pids[1], 2)]);
    assert_eq!(lines(&built), 4, "every build on a served worker");
    let out = dir.path().join("eval");
    let eval = stage_args(&policy, &tasks, &out, &["bridge.workers=2", "runs=2"]);
    stage("evaluate", &eval, &pool);
    let out = dir.path().join("again");
    stage(
        "collect-rollouts",
        &stage_args(&policy, &tasks, &out, &sets),
        &pool,
    );
    assert_eq!(census(&workers), warm, "the next stages built nothing");
    assert_eq!(lines(&built), 4);
}

#[test]
fn a_missing_socket_is_a_note_and_the_stage_runs_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, built) = (dir.path().join("tasks"), dir.path().join("built"));
    counter_tasks(&tasks, &built, "Counter-v0", serde_json::json!({}));
    let policy = dir.path().join("vla");
    vla(&tasks, &policy);
    let outcome = |out: &Path| -> Vec<(String, bool, i64, Option<String>)> {
        rows::<TrajectoryRow>(out, TableName::Trajectories)
            .into_iter()
            .map(|t| {
                (
                    t.task_id,
                    t.complete,
                    i64::from(t.num_steps),
                    t.failure_reason,
                )
            })
            .collect()
    };
    let plain = dir.path().join("plain");
    let args = stage_args(&policy, &tasks, &plain, &["group_size=2"]);
    ok(
        "collect-rollouts",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let missing = dir.path().join("gone/0.sock");
    let noted = dir.path().join("noted");
    let args = stage_args(&policy, &tasks, &noted, &["group_size=2"]);
    // The pool names it with a pid, as the runner does; nothing listens.
    let entry = format!("{}@{}", std::process::id(), missing.display());
    let stderr = stage("collect-rollouts", &args, &entry);
    assert!(
        stderr.contains(&format!(
            "note: the served worker at {} cannot be reached",
            missing.display()
        )) && stderr.contains("this stage starts a worker of its own"),
        "{stderr}"
    );
    assert_eq!(outcome(&noted), outcome(&plain));
    assert_eq!(outcome(&plain).len(), 4);
}

/// A pipeline collecting rollouts of `policy` on `tasks`, then evaluating
/// it on `eval_tasks`, two bridge workers each, with `head` under
/// `[pipeline]`.
fn pipeline(
    dir: &Path,
    name: &str,
    head: &str,
    policy: &Path,
    tasks: &Path,
    eval_tasks: &Path,
) -> PathBuf {
    let file = dir.join(format!("{name}.toml"));
    let text = format!(
        r#"[pipeline]
name = "kept"
{head}

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "{policy}"
inputs = ["{tasks}"]
set = {{ group_size = 2, "bridge.workers" = 2 }}

[[step]]
name = "eval"
stage = "evaluate"
policy = "{policy}"
inputs = ["{eval_tasks}"]
set = {{ runs = 1, "bridge.workers" = 2 }}
"#,
        policy = policy.display(),
        tasks = tasks.display(),
        eval_tasks = eval_tasks.display()
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// The live (not zombie) processes whose command line names `dir`.
fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = dir.to_str().unwrap().as_bytes();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let (Ok(cmdline), Ok(stat)) = (
            std::fs::read(entry.path().join("cmdline")),
            std::fs::read_to_string(entry.path().join("stat")),
        ) else {
            continue;
        };
        let zombie = stat
            .rfind(')')
            .is_some_and(|at| stat[at + 2..].starts_with('Z'));
        if !zombie && cmdline.windows(needle.len()).any(|w| w == needle) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn the_runner_keeps_workers_across_steps_and_leaves_none_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, built) = (dir.path().join("tasks"), dir.path().join("built"));
    counter_tasks(&tasks, &built, "Counter-v0", serde_json::json!({}));
    let policy = dir.path().join("vla");
    vla(&tasks, &policy);
    // Without the key each step's processes build their own environments.
    let cold = pipeline(dir.path(), "cold", "", &policy, &tasks, &tasks);
    std::fs::remove_file(&built).unwrap();
    ok(
        "pipeline",
        &["run", s(&cold), "--out", s(&dir.path().join("cold"))],
    );
    let cold_builds = lines(&built);
    assert!(
        cold_builds >= 6,
        "{cold_builds}: 4 for collect, 2 or more for eval"
    );
    // With it: collect's builds only, all on the two kept workers.
    let warm = pipeline(
        dir.path(),
        "warm",
        "keep_workers = 2",
        &policy,
        &tasks,
        &tasks,
    );
    let out = dir.path().join("warm");
    std::fs::remove_file(&built).unwrap();
    let stdout = ok("pipeline", &["run", s(&warm), "--out", s(&out)]);
    assert_eq!(lines(&built), 4, "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("kept bridge workers: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(line.matches(" built 2 environment(s)").count(), 2, "{line}");
    let workers = out.join("_runner/workers");
    assert!(workers.is_dir());
    assert_eq!(
        processes_naming(&workers),
        Vec::<u32>::new(),
        "after success"
    );

    // A step that fails (an env id the adapter does not have) ends the run
    // and its workers.
    let bad = dir.path().join("bad-tasks");
    counter_tasks(&bad, &built, "Nope-v0", serde_json::json!({}));
    let failing = pipeline(
        dir.path(),
        "failing",
        "keep_workers = 2",
        &policy,
        &tasks,
        &bad,
    );
    let out = dir.path().join("failing");
    let result = run("pipeline", &["run", s(&failing), "--out", s(&out)]);
    assert_ne!(result.code, 0, "{result}");
    assert!(result.stderr.contains("Nope-v0"), "{result}");
    assert!(out.join("collect/_step.json").exists(), "{result}");
    assert_eq!(
        processes_naming(&out.join("_runner/workers")),
        Vec::<u32>::new(),
        "after a failed step"
    );

    // Ctrl-C while the first step runs (slow steps): the runner dies, its
    // workers follow.
    let slow = dir.path().join("slow-tasks");
    counter_tasks(
        &slow,
        &built,
        "Counter-v0",
        serde_json::json!({"delay": 0.5}),
    );
    let file = pipeline(
        dir.path(),
        "stopped",
        "keep_workers = 2",
        &policy,
        &slow,
        &slow,
    );
    let out = dir.path().join("stopped");
    let mut runner = Command::new(bin("pipeline"))
        .args(["run", s(&file), "--out", s(&out)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let workers = out.join("_runner/workers");
    let started = Instant::now();
    while processes_naming(&workers).len() < 2 || !out.join("_runner/logs/collect").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no kept workers"
        );
        assert!(runner.try_wait().unwrap().is_none(), "the runner ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let status = Command::new("kill")
        .args(["-INT", &runner.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    runner.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while !processes_naming(&workers).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        processes_naming(&workers),
        Vec::<u32>::new(),
        "after Ctrl-C"
    );
}

/// A pipeline that generates counter tasks of the `module:function`
/// adapter `counting:make` (the `faulty` fixture under another name, each
/// build appended to `built`), shapes a tiny VLA on them and collects
/// rollouts, two bridge workers each, with `head` under `[pipeline]`.
fn plugin_pipeline(dir: &Path, head: &str, built: &Path) -> PathBuf {
    let file = dir.join("plugin.toml");
    let text = format!(
        r#"[pipeline]
name = "plugin"
{head}

[[step]]
name = "tasks"
stage = "generate-tasks"
seed = 1
set = {{ env = "gym", count = 2, "gym.adapter" = "counting:make", "gym.env_ids" = ["Counter-v0"], "gym.max_steps" = 6, "gym.workers" = 2, "gym.kwargs" = {{ built = "{built}" }} }}

[[step]]
name = "init"
stage = "init-policy"
inputs = ["${{tasks}}"]
seed = 0
set = {{ kind = "vla", "vla.patch_size" = 1, "vla.chunk_len" = 1, "vla.n_layer" = 1, "vla.n_embd" = 32, "vla.n_head" = 2, "tokenizer.vocab_size" = 280, "bridge.workers" = 2 }}

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "${{init}}"
inputs = ["${{tasks}}"]
set = {{ group_size = 2, "bridge.workers" = 2 }}
"#,
        built = built.display()
    );
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_module_function_adapter_the_steps_name_runs_on_the_kept_workers() {
    let dir = tempfile::tempdir().unwrap();
    // `counting` is importable by the workers' Python through PYTHONPATH.
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::write(
        plugins.join("counting.py"),
        "from embodyflow_gym.adapters.faulty import make\n",
    )
    .unwrap();
    let built = dir.path().join("built");
    let file = plugin_pipeline(dir.path(), "keep_workers = 2", &built);
    let out = dir.path().join("run");
    let python_path = plugins.to_str().unwrap();
    let result = run_with_env(
        "pipeline",
        &["run", s(&file), "--out", s(&out)],
        &[("PYTHONPATH", python_path)],
    );
    assert_eq!(result.code, 0, "{result}");
    // Every environment was built on a kept worker: the workers' counts
    // add up to the adapter's.
    let line = result
        .stdout
        .lines()
        .find(|l| l.starts_with("kept bridge workers: "))
        .unwrap_or_else(|| panic!("{result}"));
    let on_kept: usize = line
        .split(" built ")
        .skip(1)
        .map(|part| part.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert!(on_kept > 0, "{line}");
    assert_eq!(on_kept, lines(&built), "{line}");
    let trajectories: Vec<TrajectoryRow> = rows(&out.join("collect"), TableName::Trajectories);
    assert_eq!(trajectories.len(), 4);
    assert!(trajectories.iter().all(|t| t.failure_reason.is_none()));
}

#[test]
fn cluster_backends_refuse_keep_workers_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks");
    counter_tasks(
        &tasks,
        &dir.path().join("built"),
        "Counter-v0",
        serde_json::json!({}),
    );
    let file = pipeline(
        dir.path(),
        "cluster",
        "keep_workers = 2",
        &dir.path().join("vla"),
        &tasks,
        &tasks,
    );
    for backend in ["slurm", "ray"] {
        let result = run(
            "pipeline",
            &[
                "run",
                s(&file),
                "--out",
                s(&dir.path().join("out")),
                "--backend",
                backend,
                "--dry-run",
            ],
        );
        assert_eq!(result.code, 2, "{backend}: {result}");
        assert!(
            result.stderr.contains(&format!(
                "cluster.toml:3: `keep_workers` (under [pipeline])"
            )) && result.stderr.contains(&format!("not `{backend}`")),
            "{backend}: {result}"
        );
    }
}
