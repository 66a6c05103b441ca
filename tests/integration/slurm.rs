//! The runner's Slurm backend on a real single-node cluster that
//! `scripts/slurm-local` installs and starts (root, Debian packages): the
//! cluster test body ([`crate::cluster::runs_resumes_and_refuses`]) with a
//! sharded pipeline's job arrays, each job bound to the CPUs it was granted
//! and computing with its step's thread count, its sbatch command kept to
//! resubmit it by hand, and a job cancelled with `scancel`. The daemons are
//! stopped at the end, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::cluster::{
    Case, TestCluster, catch_collect, described, job_ids, jobs, pipeline_file,
    runs_resumes_and_refuses, wait_until, workspace,
};

fn script() -> PathBuf {
    workspace().join("scripts/slurm-local")
}

/// The jobs a sharded pipeline submits: one per step, an array and a merge
/// job per sharded step (instance, kind, tasks).
const JOBS: [(&str, &str, u64); 8] = [
    ("train", "stage", 1),
    ("init", "stage", 1),
    ("collect", "stage", 2),
    ("collect", "merge", 1),
    ("score", "stage", 3),
    ("score", "merge", 1),
    ("adv", "stage", 2),
    ("adv", "merge", 1),
];

/// The local cluster while the test runs: started unless it already ran,
/// and then stopped when the guard drops (a panic included).
struct Cluster {
    conf: String,
    started: bool,
    /// A directory outside the shared roots.
    elsewhere: tempfile::TempDir,
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
            elsewhere: tempfile::tempdir_in("/var/tmp").unwrap(),
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

    /// The sbatch command kept for `train` submits it again by hand.
    fn resubmit_by_hand(&self, out: &Path) {
        let kept = out.join("_runner/slurm/train/sbatch.sh");
        let text = std::fs::read_to_string(&kept).unwrap();
        assert!(
            text.contains("--cpus-per-task=1") && text.contains("/train/stage.sh"),
            "{text}"
        );
        let by_hand = Command::new("bash")
            .arg(&kept)
            .envs(self.env())
            .output()
            .unwrap();
        assert!(by_hand.status.success(), "{by_hand:?}");
        let job = String::from_utf8_lossy(&by_hand.stdout).trim().to_string();
        let started = Instant::now();
        while !self.queued(std::slice::from_ref(&job)).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "job {job} still queued"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(out.join("train/_step.json").is_file());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new(script()).arg("stop").status();
        }
    }
}

impl TestCluster for Cluster {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("SLURM_CONF", self.conf.clone())]
    }

    /// A record shows at once on this machine's own filesystem: a cancelled
    /// job is reported after 5 s, not the default grace for NFS.
    fn backend(&self, shared: &str) -> String {
        format!(
            "[backend]\nkind = \"slurm\"\ntime = \"00:10:00\"\nrecord_grace_s = 5\n{shared}\n\n[backend.step.collect]\nsbatch = [\"--comment=collect\"]\n"
        )
    }

    fn bad_inputs(&self, dir: &Path, backend: &str, _shared: &str, file: &Path) -> Vec<Case> {
        vec![
            (
                file.to_path_buf(),
                dir.join("no-sbatch"),
                vec![("PATH", "/nonexistent")],
                "`sbatch` is not on PATH",
            ),
            (
                pipeline_file(
                    dir,
                    "partition.toml",
                    &backend.replace("kind = ", "partition = \"nope\"\nkind = "),
                    "",
                ),
                dir.join("partition"),
                vec![],
                "partition `nope` does not exist; the cluster's partitions: debug*",
            ),
            (
                pipeline_file(
                    dir,
                    "gpus.toml",
                    backend,
                    "devices = [\"cuda\"]\ngpus = 2\n",
                ),
                dir.join("gpus"),
                vec![],
                "step `score` asks for 1 CPU(s), the default memory and 2 GPU(s) per process; no node of partition `debug` has that",
            ),
            (
                file.to_path_buf(),
                self.elsewhere.path().join("run"),
                vec![],
                "the run directory, /var/tmp/",
            ),
        ]
    }

    fn check_run(&self, out: &Path) {
        let expected: Vec<(String, String, u64)> = JOBS
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
            .collect();
        assert_eq!(described(out, "slurm", "tasks"), expected);
        // Each shard ran bound to the one CPU Slurm granted it, with one thread.
        for i in 0..2 {
            let summary = out.join(format!("collect/_shards/{i}/_summary.collect-rollouts.md"));
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
        self.resubmit_by_hand(out);
    }

    /// `scancel` of collect's job array.
    fn stop_collect(&self, child: &mut Child, out: &Path) {
        let collect_job = catch_collect(child, out, "slurm");
        let status = Command::new("scancel")
            .arg(&collect_job)
            .envs(self.env())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn stopped_says(&self) -> &'static str {
        "ended without an exit status"
    }

    fn check_stopped(&self, out: &Path) {
        assert!(
            self.queued(&job_ids(out, "slurm")).is_empty(),
            "Slurm still runs jobs of the cancelled run"
        );
    }

    fn resubmitted(&self) -> Vec<&'static str> {
        vec!["collect", "collect", "score", "score", "adv", "adv"]
    }

    /// Every job is submitted at once.
    fn wait_submitted(&self, child: &mut Child, out: &Path) {
        wait_until(
            "every job is submitted",
            child,
            Duration::from_secs(60),
            || jobs(out, "slurm").len() == JOBS.len(),
        );
    }

    fn check_cancelled(&self, out: &Path) {
        assert!(self.queued(&job_ids(out, "slurm")).is_empty());
    }
}

#[test]
fn slurm_runs_the_local_commands_resumes_after_a_cancelled_job_and_refuses_bad_input() {
    runs_resumes_and_refuses(&Cluster::up());
}
