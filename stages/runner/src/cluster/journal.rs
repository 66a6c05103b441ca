//! What a cluster submission leaves in `OUT/_runner/<backend>/`: the
//! journal of submitted jobs (`jobs.jsonl`, one [`JobEntry`] a line, which
//! `pipeline cancel` and a resumed run read) and the record each task
//! writes on its node ([`TaskRecord`]).
//!
//! ```text
//! OUT/_runner/slurm/jobs.jsonl            # or ray/: one line per submitted job
//! OUT/_runner/slurm/collect/spec.json     # what the step's jobs run (crate::cluster::task)
//! OUT/_runner/slurm/collect/task-0.json   # {"started_unix":…,"ended_unix":…,"code":0,"node":…}
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::runner_dir;
use crate::error::{Result, RunnerError};
use crate::plan::Instance;

/// `OUT/_runner/<backend>`: the backend's journal and a directory per step.
pub fn backend_dir(out: &Path, backend: &str) -> PathBuf {
    runner_dir(out).join(backend)
}

/// `OUT/_runner/<backend>/<step id>`: the spec, the task records and the
/// cluster's own logs of one step instance.
pub(crate) fn step_dir(out: &Path, backend: &str, instance: &Instance) -> PathBuf {
    backend_dir(out, backend).join(&instance.id)
}

pub(crate) fn jobs_file(out: &Path, backend: &str) -> PathBuf {
    backend_dir(out, backend).join("jobs.jsonl")
}

pub(crate) fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A task's record: `task-<i>.json` (a shard) or `merge.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Unix time it started.
    pub started_unix: f64,
    /// Unix time it ended (none while it runs).
    pub ended_unix: Option<f64>,
    /// Exit code of the stage (none while it runs; -1: killed by a signal).
    pub code: Option<i32>,
    /// The node it ran on.
    pub node: String,
}

/// One submitted job: a line of `jobs.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobEntry {
    /// The cluster's id of the job (Slurm: of the array, for a job array;
    /// Ray: its submission id).
    pub job: String,
    /// The step instance.
    pub instance: String,
    /// `stage` or `merge`.
    pub kind: String,
    /// Tasks it runs (a Slurm array's size; 1 for a plain job).
    pub tasks: u32,
    /// Its first task: the job runs tasks `first..first + tasks` of the step
    /// (a Ray job runs one shard).
    #[serde(default)]
    pub first: u32,
    /// Jobs it waits for.
    pub after: Vec<String>,
    /// Unix time of the submission.
    pub submitted_unix: f64,
    /// Where it was submitted (Ray: the dashboard's address; Slurm: the
    /// cluster of the machine, none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

pub(crate) fn bad(message: String) -> RunnerError {
    RunnerError::Backend(message)
}

pub(crate) fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| RunnerError::io(path, e))
}

pub(crate) fn read_task(path: &Path) -> Option<TaskRecord> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The jobs `OUT/_runner/<backend>/jobs.jsonl` lists (none without it).
pub(crate) fn read_jobs(out: &Path, backend: &str) -> Result<Vec<JobEntry>> {
    let path = jobs_file(out, backend);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RunnerError::io(&path, e)),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line)
                .map_err(|e| bad(format!("{}: a bad line ({e}): {line}", path.display())))
        })
        .collect()
}

/// Appends submitted jobs to `jobs.jsonl` as they are submitted.
pub(crate) struct Journal {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl Journal {
    pub(crate) fn new(out: &Path, backend: &str) -> Journal {
        Journal {
            path: jobs_file(out, backend),
            file: None,
        }
    }

    pub(crate) fn append(&mut self, entry: &JobEntry) -> Result<()> {
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)
                    .map_err(|e| RunnerError::io(&self.path, e))?,
            ),
        };
        let line = serde_json::to_string(entry).expect("a job entry serialises") + "\n";
        file.write_all(line.as_bytes())
            .map_err(|e| RunnerError::io(&self.path, e))
    }
}
