//! The runner's Ray backend on a real single-node Ray cluster that
//! `scripts/ray-local` starts from the project's `.venv` (`ray[default]`,
//! scripts/setup): the cluster test body
//! ([`crate::cluster::runs_resumes_and_refuses`]) with one Ray job per
//! process and a merge job once a step's shards succeeded, each process
//! computing with its step's thread count, and a job stopped with Ray's own
//! `ray job stop`. The head is stopped at the end, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::cluster::{
    Case, TestCluster, catch_collect, described, jobs, pipeline_file, runs_resumes_and_refuses,
    workspace,
};

/// The dashboard of `scripts/ray-local` (its default port).
const ADDRESS: &str = "http://127.0.0.1:8365";

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
    jobs(out, "ray")
        .iter()
        .map(|j| {
            states[j["job"].as_str().unwrap()]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

impl TestCluster for Head {
    fn name(&self) -> &'static str {
        "ray"
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// A record shows at once on this machine's own filesystem: a stopped
    /// job is reported after 5 s, not the default grace for NFS.
    fn backend(&self, shared: &str) -> String {
        format!(
            "[backend]\nkind = \"ray\"\naddress = \"{ADDRESS}\"\nrecord_grace_s = 5\n{shared}\n"
        )
    }

    fn bad_inputs(&self, dir: &Path, backend: &str, shared: &str, _file: &Path) -> Vec<Case> {
        let case = |name: &str,
                    backend: &str,
                    extra: &str,
                    env: Vec<(&'static str, &'static str)>,
                    says: &'static str|
         -> Case {
            let file = pipeline_file(dir, &format!("{name}.toml"), backend, extra);
            (file, dir.join(name), env, says)
        };
        vec![
            case(
                "unreachable",
                &backend.replace(ADDRESS, "http://127.0.0.1:9"),
                "",
                vec![],
                "cannot reach the Ray cluster's dashboard at http://127.0.0.1:9",
            ),
            case(
                "no-address",
                &backend.replace(&format!("address = \"{ADDRESS}\"\n"), ""),
                "",
                vec![("RAY_API_SERVER_ADDRESS", "")],
                "the Ray backend needs the address of the Ray cluster's dashboard",
            ),
            case(
                "gpus",
                backend,
                "devices = [\"cuda\"]\ngpus = 2\n",
                vec![],
                "step `score` asks for 1 CPU(s), the default memory and 2 GPU(s) per process; no node of the Ray cluster at http://127.0.0.1:8365 has that",
            ),
            case(
                "cpus",
                backend,
                "cpus = 4096\n",
                vec![],
                "step `score` asks for 4096 CPU(s)",
            ),
            case(
                "shared",
                &backend.replace(shared, "shared = [\"/nonexistent\"]"),
                "",
                vec![],
                "is not under a shared root",
            ),
        ]
    }

    fn check_run(&self, out: &Path) {
        // Ray grants CPUs without binding them: each process still computes
        // with its step's one thread (libtorch's and rayon's pools alike).
        for summary in [
            "collect/_shards/0/_summary.collect-rollouts.md",
            "init/_summary.init-policy.md",
            "score/_shards/1/_summary.score-rewards.md",
        ] {
            let text = std::fs::read_to_string(out.join(summary)).unwrap();
            assert!(text.contains("| threads | 1 (CPUs "), "{summary}: {text}");
        }
        // One job per process, and a merge job per sharded step once its
        // shards succeeded; a step's jobs after the steps it reads.
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
        assert_eq!(described(out, "ray", "first"), expected);
        assert!(jobs(out, "ray").iter().all(|j| j["address"] == ADDRESS));
        assert!(ray_states(out).iter().all(|s| s == "SUCCEEDED"));
    }

    /// `ray job stop` of collect's shard 0.
    fn stop_collect(&self, child: &mut Child, out: &Path) {
        let collect_job = catch_collect(child, out, "ray");
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
    }

    fn stopped_says(&self) -> &'static str {
        "ended without an exit status (Ray: STOPPED"
    }

    fn check_stopped(&self, out: &Path) {
        assert!(
            out.join("_runner/ray/collect/ray-0.out").is_file(),
            "Ray's log of the stopped job is kept"
        );
        assert!(
            !jobs(out, "ray").iter().any(|j| j["instance"] == "score"),
            "the steps reading the failed one were submitted"
        );
    }

    fn resubmitted(&self) -> Vec<&'static str> {
        [["collect"; 3].as_slice(), &["score"; 4], &["adv"; 3]].concat()
    }

    /// Collect's running job is caught (frozen, so that it goes on).
    fn wait_submitted(&self, child: &mut Child, out: &Path) {
        catch_collect(child, out, "ray");
    }

    fn check_cancelled(&self, out: &Path) {
        let states = ray_states(out);
        assert!(
            states.iter().all(|s| s == "STOPPED" || s == "SUCCEEDED"),
            "{states:?}"
        );
    }
}

#[test]
fn ray_runs_the_local_commands_resumes_after_a_stopped_job_and_refuses_bad_input() {
    runs_resumes_and_refuses(&Head::up());
}
