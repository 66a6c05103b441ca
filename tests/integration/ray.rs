//! The runner's Ray backend on a real single-node Ray cluster that
//! `scripts/ray-local` starts from the project's `.venv` (`ray[default]`,
//! scripts/setup): bad input refused before anything is submitted, the
//! sharded pipeline of the Slurm test with outputs equal to the local
//! backend's, a failed task reported with its exit code and log tail, a job
//! stopped mid-run (with Ray's own `ray job stop`) and a resumed run that
//! submits only what is missing, and a runner killed midway, whose running
//! jobs refuse new runs into the directory until `pipeline cancel` stops
//! them. The head is stopped at the end, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_tests::{Run, bin, run_with_env};

use crate::cluster::{
    exit_code, failing_pipeline, freeze, jobs as journal, pipeline_file, process_writing, s,
    wait_until,
};
use crate::runner::{outputs, statuses};

/// The dashboard of `scripts/ray-local` (its default port).
const ADDRESS: &str = "http://127.0.0.1:8365";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn script() -> PathBuf {
    workspace().join("scripts/ray-local")
}

/// The local head while the test runs: started unless it already ran, and
/// then stopped when the guard drops (a panic included).
struct Head {
    started: bool,
}

impl Head {
    fn up() -> Head {
        let running = Command::new(script())
            .arg("status")
            .output()
            .unwrap()
            .status
            .success();
        if !running {
            let started = Instant::now();
            let output = Command::new(script()).arg("start").output().unwrap();
            assert!(
                output.status.success(),
                "scripts/ray-local start: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            eprintln!(
                "local Ray head started in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Head { started: !running }
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new(script()).arg("stop").status();
        }
    }
}

/// The jobs a run directory lists (`_runner/ray/jobs.jsonl`).
fn jobs(out: &Path) -> Vec<serde_json::Value> {
    journal(out, "ray")
}

/// The status Ray gives each of the jobs a run directory lists (one
/// `GET /api/jobs/` from the .venv's Python).
fn ray_states(out: &Path) -> Vec<String> {
    let output = Command::new(workspace().join(".venv/bin/python"))
        .args([
            "-c",
            "import json, sys, urllib.request\n\
             jobs = json.load(urllib.request.urlopen(sys.argv[1] + '/api/jobs/'))\n\
             print(json.dumps({j['submission_id']: j['status'] for j in jobs}))",
            ADDRESS,
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let states: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    jobs(out)
        .iter()
        .map(|j| {
            states[j["job"].as_str().unwrap()]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

fn pipeline(args: &[&str]) -> Run {
    run_with_env("pipeline", args, &[])
}

fn spawn_run(file: &Path, out: &Path, log: &Path) -> Child {
    Command::new(bin("pipeline"))
        .args(["run", s(file), "--out", s(out), "--poll", "0.2"])
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Freezes shard 0 of `out`'s collect once it runs, so that its job stays
/// running, and returns that job's id.
fn catch_collect(child: &mut Child, out: &Path) -> String {
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
    jobs(out)
        .iter()
        .find(|j| j["instance"] == "collect" && j["kind"] == "stage" && j["first"] == 0)
        .map(|j| j["job"].as_str().unwrap().to_string())
        .unwrap()
}

#[test]
fn ray_runs_the_local_commands_resumes_after_a_stopped_job_and_refuses_bad_input() {
    let _head = Head::up();
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = bin("pipeline").parent().unwrap().to_path_buf();
    let shared = format!(
        "shared = [{:?}, {:?}, {:?}]",
        s(dir.path()),
        s(&workspace()),
        s(&bin_dir)
    );
    // A record shows at once on this machine's own filesystem: a stopped
    // job is reported after 5 s, not the default grace for NFS.
    let backend = format!(
        "[backend]\nkind = \"ray\"\naddress = \"{ADDRESS}\"\nrecord_grace_s = 5\n{shared}\n"
    );
    let file = pipeline_file(dir.path(), "p.toml", &backend, "");

    // Bad input: exit 2 before anything is submitted.
    let cases: Vec<(PathBuf, Vec<(&str, &str)>, &str)> = vec![
        (
            pipeline_file(
                dir.path(),
                "unreachable.toml",
                &backend.replace(ADDRESS, "http://127.0.0.1:9"),
                "",
            ),
            vec![],
            "cannot reach the Ray cluster's dashboard at http://127.0.0.1:9",
        ),
        (
            pipeline_file(
                dir.path(),
                "no-address.toml",
                &backend.replace(&format!("address = \"{ADDRESS}\"\n"), ""),
                "",
            ),
            vec![("RAY_API_SERVER_ADDRESS", "")],
            "the Ray backend needs the address of the Ray cluster's dashboard",
        ),
        (
            pipeline_file(
                dir.path(),
                "gpus.toml",
                &backend,
                "devices = [\"cuda\"]\ngpus = 2\n",
            ),
            vec![],
            "step `score` asks for 1 CPU(s), the default memory and 2 GPU(s) per process; no node of the Ray cluster at http://127.0.0.1:8365 has that",
        ),
        (
            pipeline_file(dir.path(), "cpus.toml", &backend, "cpus = 4096\n"),
            vec![],
            "step `score` asks for 4096 CPU(s)",
        ),
        (
            pipeline_file(
                dir.path(),
                "shared.toml",
                &backend.replace(&shared, "shared = [\"/nonexistent\"]"),
                "",
            ),
            vec![],
            "is not under a shared root",
        ),
    ];
    for (case, env, says) in &cases {
        let out = dir.path().join(case.file_stem().unwrap());
        let result = run_with_env("pipeline", &["run", s(case), "--out", s(&out)], env);
        assert_eq!(result.code, 2, "{says}\n{result}");
        assert!(result.stderr.contains(says), "expected `{says}`:\n{result}");
        assert!(jobs(&out).is_empty(), "{says}: jobs were submitted");
    }

    // The same pipeline on this machine and through Ray.
    let local = dir.path().join("local");
    let result = pipeline(&["run", s(&file), "--out", s(&local), "--backend", "local"]);
    assert_eq!(result.code, 0, "{result}");
    let ray = dir.path().join("ray");
    let started = Instant::now();
    let result = pipeline(&["run", s(&file), "--out", s(&ray), "--poll", "0.2"]);
    assert_eq!(result.code, 0, "{result}");
    eprintln!(
        "{}(ray run: {:.1} s)",
        result.stdout,
        started.elapsed().as_secs_f64()
    );
    let ran = statuses(&result);
    assert_eq!(ran.len(), 5, "{ran:?}");
    assert!(ran.values().all(|s| s == "ran"), "{ran:?}");
    assert_eq!(
        outputs(&local),
        outputs(&ray),
        "Ray's outputs differ from the local backend's"
    );
    // Ray grants CPUs without binding them: each process still computes
    // with its step's one thread (libtorch's and rayon's pools alike).
    for summary in [
        "collect/_shards/0/_summary.collect-rollouts.md",
        "init/_summary.init-policy.md",
        "score/_shards/1/_summary.score-rewards.md",
    ] {
        let text = std::fs::read_to_string(ray.join(summary)).unwrap();
        assert!(text.contains("| threads | 1 (CPUs "), "{summary}: {text}");
    }
    // One job per process, and a merge job per sharded step once its
    // shards succeeded; a step's jobs after the steps it reads.
    let listed = jobs(&ray);
    let described: Vec<(String, String, u64)> = listed
        .iter()
        .map(|j| {
            (
                j["instance"].as_str().unwrap().to_string(),
                j["kind"].as_str().unwrap().to_string(),
                j["first"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut expected: Vec<(String, String, u64)> = vec![
        ("train".into(), "stage".into(), 0),
        ("init".into(), "stage".into(), 0),
    ];
    for (step, shards) in [("collect", 2), ("score", 3), ("adv", 2)] {
        for i in 0..shards {
            expected.push((step.into(), "stage".into(), i));
        }
        expected.push((step.into(), "merge".into(), 0));
    }
    assert_eq!(described, expected);
    assert!(listed.iter().all(|j| j["address"] == ADDRESS));
    assert!(ray_states(&ray).iter().all(|s| s == "SUCCEEDED"));
    assert!(ray.join("score/_stage.2.log").is_file());
    assert!(ray.join("train/_stage.log").is_file());
    assert!(
        result
            .stdout
            .contains("ray queue: submission to start: median"),
        "{result}"
    );
    // A rerun submits nothing.
    let again = pipeline(&["run", s(&file), "--out", s(&ray)]);
    assert_eq!(again.code, 0, "{again}");
    assert!(statuses(&again).values().all(|s| s == "cached"), "{again}");
    assert_eq!(
        jobs(&ray).len(),
        listed.len(),
        "a cached run submitted jobs"
    );

    // A failed task: its exit code and the tail of its log.
    let failing = failing_pipeline(
        dir.path(),
        &ray.join("train/tasks"),
        &ray.join("init"),
        &backend,
    );
    let failed = pipeline(&[
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

    // A job stopped mid-run: collect's shard 0 is frozen while it runs (so
    // that it cannot finish first), then Ray stops its job.
    let stopped = dir.path().join("stopped");
    let log = dir.path().join("stopped.log");
    let mut child = spawn_run(&file, &stopped, &log);
    let collect_job = catch_collect(&mut child, &stopped);
    let status = Command::new(workspace().join(".venv/bin/ray"))
        .args([
            "job",
            "stop",
            "--no-wait",
            "--address",
            ADDRESS,
            &collect_job,
        ])
        .stdout(Stdio::null())
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
        text.contains("ended without an exit status (Ray: STOPPED"),
        "the stopped job is reported:\n{text}"
    );
    assert!(
        stopped.join("_runner/ray/collect/ray-0.out").is_file(),
        "Ray's log of the stopped job is kept"
    );
    assert!(
        !jobs(&stopped).iter().any(|j| j["instance"] == "score"),
        "the steps reading the failed one were submitted"
    );
    assert!(!stopped.join("collect/_step.json").exists());
    let before = jobs(&stopped).len();
    let resumed = pipeline(&["run", s(&file), "--out", s(&stopped), "--poll", "0.2"]);
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
    let resubmitted: Vec<String> = jobs(&stopped)[before..]
        .iter()
        .map(|j| j["instance"].as_str().unwrap().to_string())
        .collect();
    let expected: Vec<&str> = [["collect"; 3].as_slice(), &["score"; 4], &["adv"; 3]].concat();
    assert_eq!(
        resubmitted, expected,
        "only the missing steps are submitted again"
    );
    assert_eq!(outputs(&local), outputs(&stopped));

    // The runner killed midway: its running job goes on, and no run into
    // that directory starts until it ends or `pipeline cancel` stops it.
    let cancelled = dir.path().join("cancelled");
    let log = dir.path().join("cancelled.log");
    let mut child = spawn_run(&file, &cancelled, &log);
    catch_collect(&mut child, &cancelled);
    child.kill().unwrap();
    child.wait().unwrap();
    for backend in ["local", "ray"] {
        let refused = pipeline(&[
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
    let result = pipeline(&["cancel", s(&cancelled)]);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.starts_with("cancelled "), "{result}");
    assert!(
        ray_states(&cancelled)
            .iter()
            .all(|s| s == "STOPPED" || s == "SUCCEEDED"),
        "{:?}",
        ray_states(&cancelled)
    );
    let again = pipeline(&["cancel", s(&cancelled)]);
    assert!(again.stdout.starts_with("no job of "), "{again}");
}
