//! A test-only cluster backend, added the way the manual's extending page
//! documents: this one module implementing the backend interface and one
//! line in `registry::BACKENDS`. Its cluster is this process: a job is a
//! thread running what `pipeline task` runs on a node
//! ([`crate::cluster::task`]), submitted once the steps it reads have
//! completed (as Ray's are), at most `slots` of them running at once, the
//! others queued. The runner drives it through a pipeline whose outputs
//! equal the local backend's.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use embodyflow_core::config::{ConfigKeys, keys_of};
use serde::Deserialize;

use crate::backend::Table;
use crate::cache::STEP_FILE;
use crate::cluster::journal::{Journal, bad, now, read_jobs, step_dir};
use crate::cluster::{self, Backend, JobEntry, JobState, Lost, Queue, Run, Submitted};
use crate::error::Result;
use crate::exec::{RunOptions, RunOutcome};
use crate::plan::{Instance, Plan};

const NAME: &str = "fake";

/// The jobs of this process still running, by id.
static RUNNING: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The `[backend]` keys the fake backend reads.
#[derive(Debug, Clone, Deserialize, ConfigKeys)]
struct Settings {
    /// Jobs that run at once; the others wait in the queue.
    #[serde(default = "one")]
    slots: u32,
}

fn one() -> u32 {
    1
}

/// The fake backend, as the registry lists it.
pub struct FakeCluster;

/// The fake backend.
pub static FAKE: FakeCluster = FakeCluster;

impl Backend for FakeCluster {
    fn name(&self) -> &'static str {
        NAME
    }

    fn title(&self) -> &'static str {
        "Fake"
    }

    fn about(&self) -> &'static str {
        "Threads of this process (tests only)"
    }

    fn keys(&self) -> Vec<(String, &'static str)> {
        keys_of::<Settings>()
    }

    fn check(&self, table: &Table) -> std::result::Result<(), String> {
        let settings: Settings = table.settings()?;
        if settings.slots == 0 {
            return Err("[backend] slots = 0: expected at least one job at once".into());
        }
        Ok(())
    }

    fn queued(&self) -> bool {
        true
    }

    fn run_plan(&self, run: &Run, say: &mut dyn FnMut(&str)) -> Result<RunOutcome> {
        let settings: Settings = run.table.settings().map_err(bad)?;
        let mut queue = Threads {
            slots: settings.slots as usize,
            journal: Journal::new(&run.plan.out, NAME),
            waiting: VecDeque::new(),
            started: BTreeMap::new(),
            succeeded: BTreeSet::new(),
        };
        cluster::run_plan(run, self, &mut queue, say)
    }

    fn live_jobs(&self, out: &Path) -> Result<Vec<JobEntry>> {
        let running = RUNNING.lock().expect("not poisoned").clone();
        Ok(read_jobs(out, NAME)?
            .into_iter()
            .filter(|e| running.contains(&e.job))
            .collect())
    }

    /// A thread cannot be stopped: waits for the jobs to end.
    fn cancel(&self, out: &Path) -> Result<Vec<String>> {
        let live: Vec<String> = self.live_jobs(out)?.into_iter().map(|e| e.job).collect();
        while !self.live_jobs(out)?.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(live)
    }
}

/// A job: the task it runs.
struct Job {
    id: String,
    spec: PathBuf,
    merge: bool,
    index: u32,
}

/// One run's queue.
struct Threads {
    slots: usize,
    journal: Journal,
    waiting: VecDeque<Job>,
    started: BTreeMap<String, JoinHandle<Result<()>>>,
    succeeded: BTreeSet<String>,
}

impl Threads {
    fn submit(&mut self, instance: &Instance, spec: &Path, task: Option<u32>) -> Result<String> {
        let id = format!(
            "{}-{}",
            instance.id,
            task.map_or("merge".to_string(), |i| i.to_string())
        );
        self.journal.append(&JobEntry {
            job: id.clone(),
            instance: instance.id.clone(),
            kind: if task.is_some() { "stage" } else { "merge" }.into(),
            tasks: 1,
            first: task.unwrap_or(0),
            after: Vec::new(),
            submitted_unix: now(),
            address: None,
        })?;
        self.waiting.push_back(Job {
            id: id.clone(),
            spec: spec.to_path_buf(),
            merge: task.is_none(),
            index: task.unwrap_or(0),
        });
        Ok(id)
    }

    /// Starts waiting jobs while a slot is free.
    fn start(&mut self) {
        while self.started.values().filter(|h| !h.is_finished()).count() < self.slots {
            let Some(job) = self.waiting.pop_front() else {
                return;
            };
            RUNNING.lock().expect("not poisoned").insert(job.id.clone());
            let id = job.id.clone();
            let handle = std::thread::spawn(move || {
                let result = cluster::task(&job.spec, job.merge, Some(job.index));
                RUNNING.lock().expect("not poisoned").remove(&job.id);
                result
            });
            self.started.insert(id, handle);
        }
    }
}

impl Queue for Threads {
    fn submits_when_ready(&self) -> bool {
        true
    }

    fn preflight(&mut self, _: &Plan, _: &RunOptions, _: &Path) -> Result<()> {
        Ok(())
    }

    fn describe(&self, _: &Plan, instance: &Instance, _: &[String]) -> String {
        format!("  fake job × {}", instance.shards)
    }

    fn advance(&mut self, plan: &Plan, submitted: &mut [Submitted]) -> Result<Vec<usize>> {
        let mut new = Vec::new();
        for (k, s) in submitted.iter_mut().enumerate() {
            let instance = &plan.instances[s.index];
            let ready = instance
                .deps
                .iter()
                .all(|d| plan.instances[*d].dir.join(STEP_FILE).is_file());
            if s.jobs.is_empty() && ready && !s.state.finished() {
                s.submitted_unix = now();
                for i in 0..instance.shards {
                    let job = self.submit(instance, &s.spec, Some(i))?;
                    s.jobs.push(job);
                }
                s.label = s.jobs.join(", ");
                new.push(k);
            } else if instance.shards > 1
                && s.jobs.len() == instance.shards as usize
                && s.jobs.iter().all(|j| self.succeeded.contains(j))
            {
                let merge = self.submit(instance, &s.spec, None)?;
                s.jobs.push(merge);
            }
        }
        self.start();
        Ok(new)
    }

    fn live(
        &mut self,
        ids: &[String],
    ) -> std::result::Result<BTreeMap<String, Vec<JobState>>, String> {
        self.start();
        let mut live = BTreeMap::new();
        for id in ids {
            match self.started.get(id) {
                Some(handle) if handle.is_finished() => {
                    let handle = self.started.remove(id).expect("started");
                    if matches!(handle.join(), Ok(Ok(()))) {
                        self.succeeded.insert(id.clone());
                    }
                }
                Some(_) => {
                    live.insert(id.clone(), vec![JobState::Running]);
                }
                None if self.waiting.iter().any(|j| &j.id == id) => {
                    live.insert(id.clone(), vec![JobState::Queued]);
                }
                None => {}
            }
        }
        Ok(live)
    }

    fn lost(&mut self, out: &Path, instance: &Instance, jobs: &[String], _: Option<u32>) -> Lost {
        Lost {
            job: jobs.join(", "),
            what: "ended without an exit status".into(),
            log: step_dir(out, NAME, instance).join("none.out"),
        }
    }

    fn cancel(&mut self, _: &[String]) -> std::result::Result<(), String> {
        self.waiting.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cache::StepRecord;

    /// The directory of the built stage binaries (`target/release`).
    fn bin_dir() -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        assert!(
            dir.join("generate-tasks").is_file(),
            "{} has no generate-tasks: run `cargo build --release --workspace` first",
            dir.display()
        );
        dir
    }

    /// `pipeline run FILE --out OUT ARGS…` in this process.
    fn pipeline(file: &Path, out: &Path, args: &[&str]) -> Result<()> {
        let bins = bin_dir();
        let mut line = vec![
            "pipeline",
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--bin-dir",
            bins.to_str().unwrap(),
            "--poll",
            "0.05",
        ];
        line.extend(args);
        crate::run(crate::Args::parse_from(line))
    }

    /// What each step of a run directory recorded it wrote.
    fn outputs(out: &Path) -> Vec<String> {
        ["train", "eval"]
            .iter()
            .map(|step| {
                let text = std::fs::read_to_string(out.join(step).join(STEP_FILE)).unwrap();
                let record: StepRecord = serde_json::from_str(&text).unwrap();
                serde_json::to_string(&record.outputs).unwrap()
            })
            .collect()
    }

    const PIPELINE: &str = "[[step]]\nname = \"train\"\nstage = \"generate-tasks\"\nseed = 1\nset = { count = 6 }\n\n[[step]]\nname = \"eval\"\nstage = \"generate-tasks\"\nseed = 2\nset = { count = 4 }\n\n[backend]\nkind = \"fake\"\nslots = 1\n";

    #[test]
    fn the_runner_drives_a_backend_added_by_one_module_and_one_registry_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.toml");
        std::fs::write(&file, PIPELINE).unwrap();
        let local = dir.path().join("local");
        pipeline(&file, &local, &["--backend", "local"]).unwrap();
        let fake = dir.path().join("fake");
        pipeline(&file, &fake, &[]).unwrap();
        assert_eq!(outputs(&local), outputs(&fake));
        // The run log is written as the backend reports each step done.
        let logged = |out: &Path| -> Vec<(String, String)> {
            let text = std::fs::read_to_string(out.join("report/runlog.csv")).unwrap();
            let mut rows: Vec<(String, String)> = text
                .lines()
                .skip(1)
                .map(|l| {
                    let r: Vec<&str> = l.split(',').collect();
                    (r[3].to_string(), r[5].to_string())
                })
                .collect();
            rows.sort();
            rows
        };
        assert_eq!(logged(&local), logged(&fake));
        for step in ["train", "eval"] {
            assert!(logged(&fake).contains(&(step.to_string(), "wall_s".to_string())));
        }
        let jobs: Vec<(String, String)> = read_jobs(&fake, NAME)
            .unwrap()
            .into_iter()
            .map(|j| (j.instance, j.kind))
            .collect();
        assert_eq!(
            jobs,
            [
                ("train".into(), "stage".into()),
                ("eval".into(), "stage".into())
            ]
        );
        assert!(fake.join("_runner/fake/train/task-0.json").is_file());
        // A rerun submits nothing; `pipeline cancel` reads the journal.
        pipeline(&file, &fake, &[]).unwrap();
        assert_eq!(read_jobs(&fake, NAME).unwrap().len(), 2);
        assert_eq!(
            cluster::cancel(&fake, crate::registry::BACKENDS).unwrap(),
            Vec::<String>::new()
        );
        // Its key is checked when the file is loaded, and named among the
        // keys the backends read.
        for (text, says) in [
            (
                "slots = 0",
                "p.toml:13: [backend] slots = 0: expected at least one job at once",
            ),
            (
                "slot = 2",
                "[backend] unknown key `slot`; the backends read kind, shared, record_grace_s, step, partition, account, time, sbatch (slurm), address (ray), slots (fake)",
            ),
        ] {
            std::fs::write(&file, PIPELINE.replace("slots = 1", text)).unwrap();
            let err = pipeline(&file, &dir.path().join("bad"), &[]).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
