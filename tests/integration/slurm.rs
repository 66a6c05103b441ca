//! The runner's Slurm backend on a real single-node cluster that
//! `scripts/slurm-local` installs and starts (root, Debian packages): bad
//! input refused before anything is submitted, a sharded pipeline whose
//! outputs equal the local backend's, a failed task reported with its exit
//! code, a job cancelled mid-run and a resumed run that submits only what is
//! missing, and a runner killed after submitting, whose jobs refuse new runs
//! into the directory until `pipeline cancel` takes them; each job bound to
//! the CPUs it was granted, computing with its step's thread count, and its
//! sbatch command kept to resubmit it by hand. The daemons are stopped at
//! the end, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_tests::{Run, bin, run_with_env};

use crate::cluster::{
    exit_code, failing_pipeline, freeze, jobs as journal, pipeline_file, process_writing, s,
    wait_until,
};
use crate::runner::{outputs, statuses};

/// The jobs a run directory lists (`_runner/slurm/jobs.jsonl`).
fn jobs(out: &Path) -> Vec<serde_json::Value> {
    journal(out, "slurm")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm-local")
}

/// The local cluster while the test runs: started unless it already ran,
/// and then stopped when the guard drops (a panic included).
struct Cluster {
    conf: String,
    started: bool,
}

impl Cluster {
    fn up() -> Cluster {
        let running = Command::new(script())
            .arg("status")
            .output()
            .unwrap()
            .status
            .success();
        let cluster = Cluster {
            conf: String::from_utf8(Command::new(script()).arg("env").output().unwrap().stdout)
                .unwrap()
                .trim()
                .trim_start_matches("export SLURM_CONF=")
                .to_string(),
            started: !running,
        };
        if !running {
            let started = Instant::now();
            let output = Command::new(script()).arg("start").output().unwrap();
            assert!(
                output.status.success(),
                "scripts/slurm-local start: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            eprintln!(
                "local Slurm started in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        cluster
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("SLURM_CONF", self.conf.as_str())]
    }

    /// Runs `pipeline` with the cluster's configuration.
    fn pipeline(&self, args: &[&str]) -> Run {
        run_with_env("pipeline", args, &self.env())
    }

    /// The jobs of `ids` Slurm still has queued or running.
    fn queued(&self, ids: &[String]) -> Vec<String> {
        let output = Command::new("squeue")
            .args(["--noheader", "--array", "--format=%F"])
            .arg(format!("--jobs={}", ids.join(",")))
            .envs(self.env())
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new(script()).arg("stop").status();
        }
    }
}

fn job_ids(out: &Path) -> Vec<String> {
    jobs(out)
        .iter()
        .map(|j| j["job"].as_str().unwrap().to_string())
        .collect()
}

fn spawn_run(cluster: &Cluster, file: &Path, out: &Path, log: &Path) -> Child {
    Command::new(bin("pipeline"))
        .args(["run", s(file), "--out", s(out), "--backend", "slurm"])
        .args(["--poll", "0.2"])
        .envs(cluster.env())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[test]
fn slurm_runs_the_local_commands_resumes_after_a_cancelled_job_and_refuses_bad_input() {
    let cluster = Cluster::up();
    let dir = tempfile::tempdir().unwrap();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin_dir = bin("pipeline").parent().unwrap().to_path_buf();
    let shared = format!(
        "shared = [{:?}, {:?}, {:?}]",
        s(dir.path()),
        s(&workspace.canonicalize().unwrap()),
        s(&bin_dir)
    );
    // A record shows at once on this machine's own filesystem: a cancelled
    // job is reported after 5 s, not the default grace for NFS.
    let backend = format!(
        "[backend]\nkind = \"slurm\"\ntime = \"00:10:00\"\nrecord_grace_s = 5\n{shared}\n\n[backend.step.collect]\nsbatch = [\"--comment=collect\"]\n"
    );
    let file = pipeline_file(dir.path(), "p.toml", &backend, "");

    // Bad input: exit 2 before anything is submitted.
    let elsewhere = tempfile::tempdir_in("/var/tmp").unwrap();
    // The pipeline file, the run directory, extra environment, the message.
    type Case<'a> = (PathBuf, PathBuf, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            file.clone(),
            dir.path().join("no-sbatch"),
            vec![("PATH", "/nonexistent")],
            "`sbatch` is not on PATH",
        ),
        (
            pipeline_file(
                dir.path(),
                "partition.toml",
                &backend.replace("kind = ", "partition = \"nope\"\nkind = "),
                "",
            ),
            dir.path().join("partition"),
            vec![],
            "partition `nope` does not exist; the cluster's partitions: debug*",
        ),
        (
            pipeline_file(
                dir.path(),
                "gpus.toml",
                &backend,
                "devices = [\"cuda\"]\ngpus = 2\n",
            ),
            dir.path().join("gpus"),
            vec![],
            "step `score` asks for 1 CPU(s), the default memory and 2 GPU(s) per process; no node of partition `debug` has that",
        ),
        (
            file.clone(),
            elsewhere.path().join("run"),
            vec![],
            "the run directory, /var/tmp/",
        ),
    ];
    for (file, out, env, says) in &cases {
        let mut all_env = cluster.env().to_vec();
        all_env.extend(env.iter().copied());
        let result = run_with_env(
            "pipeline",
            &["run", s(file), "--out", s(out), "--backend", "slurm"],
            &all_env,
        );
        assert_eq!(result.code, 2, "{says}\n{result}");
        assert!(result.stderr.contains(says), "expected `{says}`:\n{result}");
        assert!(jobs(out).is_empty(), "{says}: jobs were submitted");
    }

    // The same pipeline on this machine and through Slurm.
    let local = dir.path().join("local");
    let result = cluster.pipeline(&["run", s(&file), "--out", s(&local), "--backend", "local"]);
    assert_eq!(result.code, 0, "{result}");
    let slurm = dir.path().join("slurm");
    let result = cluster.pipeline(&["run", s(&file), "--out", s(&slurm), "--poll", "0.2"]);
    assert_eq!(result.code, 0, "{result}");
    eprintln!("{}", result.stdout);
    let ran = statuses(&result);
    assert_eq!(ran.len(), 5, "{ran:?}");
    assert!(ran.values().all(|s| s == "ran"), "{ran:?}");
    assert_eq!(
        outputs(&local),
        outputs(&slurm),
        "Slurm's outputs differ from the local backend's"
    );
    // One job per step, an array and a merge job per sharded step.
    let listed = jobs(&slurm);
    let described: Vec<(String, String, u64)> = listed
        .iter()
        .map(|j| {
            (
                j["instance"].as_str().unwrap().to_string(),
                j["kind"].as_str().unwrap().to_string(),
                j["tasks"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, String, u64)> = [
        ("train", "stage", 1),
        ("init", "stage", 1),
        ("collect", "stage", 2),
        ("collect", "merge", 1),
        ("score", "stage", 3),
        ("score", "merge", 1),
        ("adv", "stage", 2),
        ("adv", "merge", 1),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
    .collect();
    assert_eq!(described, expected);
    assert!(slurm.join("score/_stage.2.log").is_file());
    assert!(slurm.join("train/_stage.log").is_file());
    assert!(
        result
            .stdout
            .contains("slurm queue: submission to start: median"),
        "{result}"
    );
    // Each shard ran bound to the one CPU Slurm granted it, with one thread.
    for i in 0..2 {
        let summary = slurm.join(format!("collect/_shards/{i}/_summary.collect-rollouts.md"));
        let text = std::fs::read_to_string(&summary).unwrap();
        let threads = text
            .lines()
            .find_map(|l| l.strip_prefix("| threads | "))
            .unwrap_or_else(|| panic!("{text}"));
        let cpus = threads
            .strip_prefix("1 (CPUs ")
            .and_then(|t| t.strip_suffix(") |"))
            .unwrap_or_else(|| panic!("shard {i}: {threads}"));
        assert!(
            cpus.parse::<u32>().is_ok(),
            "shard {i}: not bound to one CPU: {threads}"
        );
    }
    // The sbatch commands are kept: a job is resubmitted by hand.
    let kept = slurm.join("_runner/slurm/train/sbatch.sh");
    let text = std::fs::read_to_string(&kept).unwrap();
    assert!(
        text.contains("--cpus-per-task=1") && text.contains("/train/stage.sh"),
        "{text}"
    );
    let by_hand = Command::new("bash")
        .arg(&kept)
        .envs(cluster.env())
        .output()
        .unwrap();
    assert!(by_hand.status.success(), "{by_hand:?}");
    let job = String::from_utf8_lossy(&by_hand.stdout).trim().to_string();
    let started = Instant::now();
    while !cluster.queued(std::slice::from_ref(&job)).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "job {job} still queued"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(slurm.join("train/_step.json").is_file());
    // A rerun submits nothing.
    let again = cluster.pipeline(&["run", s(&file), "--out", s(&slurm)]);
    assert_eq!(again.code, 0, "{again}");
    assert!(statuses(&again).values().all(|s| s == "cached"), "{again}");
    assert_eq!(
        jobs(&slurm).len(),
        listed.len(),
        "a cached run submitted jobs"
    );

    // A failed task: its exit code and the tail of its log.
    let failing = failing_pipeline(
        dir.path(),
        &slurm.join("train/tasks"),
        &slurm.join("init"),
        &backend,
    );
    let failed = cluster.pipeline(&[
        "run",
        s(&failing),
        "--out",
        s(&dir.path().join("failed")),
        "--poll",
        "0.2",
    ]);
    assert_eq!(failed.code, 1, "{failed}");
    assert_eq!(statuses(&failed)["collect"], "failed", "{failed}");
    assert!(
        failed
            .stderr
            .contains("step `collect` (collect-rollouts) failed with exit code 2; log ")
            && failed.stderr.contains("content hash is"),
        "the exit code and the log's tail:\n{failed}"
    );

    // A job cancelled mid-run: collect's shard 0 is stopped while it runs
    // (so that it cannot finish first), then its job array cancelled.
    let killed = dir.path().join("killed");
    let log = dir.path().join("killed.log");
    let mut child = spawn_run(&cluster, &file, &killed, &log);
    let shard = killed.join("collect/_shards/0");
    let mut pid = None;
    wait_until(
        "collect's shard 0 starts",
        &mut child,
        Duration::from_secs(60),
        || {
            pid = process_writing(&shard);
            pid.is_some()
        },
    );
    freeze(pid.unwrap());
    let collect_job = jobs(&killed)
        .iter()
        .find(|j| j["instance"] == "collect" && j["kind"] == "stage")
        .map(|j| j["job"].as_str().unwrap().to_string())
        .unwrap();
    let status = Command::new("scancel")
        .arg(&collect_job)
        .envs(cluster.env())
        .status()
        .unwrap();
    assert!(status.success());
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
        text.contains("ended without an exit status"),
        "the cancelled job is reported:\n{text}"
    );
    assert!(
        cluster.queued(&job_ids(&killed)).is_empty(),
        "Slurm still runs jobs of the cancelled run"
    );
    assert!(!killed.join("collect/_step.json").exists());
    let before = jobs(&killed).len();
    let resumed = cluster.pipeline(&["run", s(&file), "--out", s(&killed), "--poll", "0.2"]);
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
    let resubmitted: Vec<String> = jobs(&killed)[before..]
        .iter()
        .map(|j| j["instance"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        resubmitted,
        ["collect", "collect", "score", "score", "adv", "adv"],
        "only the missing steps are submitted again"
    );
    assert_eq!(outputs(&local), outputs(&killed));

    // The runner killed after submitting: its jobs go on, and no run into
    // that directory starts until they end or `pipeline cancel` takes them.
    let cancelled = dir.path().join("cancelled");
    let log = dir.path().join("cancelled.log");
    let mut child = spawn_run(&cluster, &file, &cancelled, &log);
    wait_until(
        "every job is submitted",
        &mut child,
        Duration::from_secs(60),
        || jobs(&cancelled).len() == expected.len(),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    for backend in ["local", "slurm"] {
        let refused = cluster.pipeline(&[
            "run",
            s(&file),
            "--out",
            s(&cancelled),
            "--backend",
            backend,
        ]);
        assert_eq!(refused.code, 2, "{backend}: {refused}");
        assert!(
            refused
                .stderr
                .contains("jobs of an earlier submission into"),
            "{backend}: {refused}"
        );
    }
    let result = cluster.pipeline(&["cancel", s(&cancelled)]);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.starts_with("cancelled "), "{result}");
    assert!(cluster.queued(&job_ids(&cancelled)).is_empty());
    let again = cluster.pipeline(&["cancel", s(&cancelled)]);
    assert!(again.stdout.starts_with("no job of "), "{again}");
}
