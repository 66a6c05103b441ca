//! What a cluster backend does for the shared wait ([`super::wait`]): its
//! [`Queue`] submits what may start and says which jobs are queued or
//! running, and the wait follows each submitted step ([`Submitted`])
//! through its [`State`]s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cache::StepRecord;
use crate::error::Result;
use crate::exec::RunOptions;
use crate::plan::{Instance, Plan};

/// What the queue says of a job that is not over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Waiting for resources or for the jobs it depends on.
    Queued,
    /// Started.
    Running,
}

/// The state of a submitted step instance while the runner waits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    Pending,
    Running,
    Done(StepRecord),
    Failed(String),
    /// A step it reads failed: its jobs were cancelled or never submitted.
    NotRun(String),
}

impl State {
    pub(crate) fn word(&self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Done(_) => "ran",
            State::Failed(_) => "failed",
            State::NotRun(_) => "not run",
        }
    }

    pub(crate) fn finished(&self) -> bool {
        matches!(self, State::Done(_) | State::Failed(_) | State::NotRun(_))
    }
}

/// A step instance the run submits.
pub(crate) struct Submitted {
    /// Index into the plan.
    pub index: usize,
    /// Its `spec.json`.
    pub spec: PathBuf,
    /// The stage command of each task.
    pub commands: Vec<Vec<String>>,
    /// Its jobs so far, in submission order.
    pub jobs: Vec<String>,
    /// How its jobs are named on its progress line.
    pub label: String,
    /// Unix time its first job was submitted.
    pub submitted_unix: f64,
    pub state: State,
    /// When its jobs were first seen gone without a record.
    pub gone_since: Option<Instant>,
}

/// A job the queue no longer has, that left no exit status: the job as the
/// report names it, what became of it (empty: nothing known), and the
/// cluster's log of it.
pub(crate) struct Lost {
    pub job: String,
    pub what: String,
    pub log: PathBuf,
}

/// What a cluster backend does for the shared wait ([`run_plan`]).
pub(crate) trait Queue {
    /// Whether the runner submits a job only once what it waits for has
    /// completed (Ray) rather than all at once with dependencies the
    /// cluster resolves (Slurm). Decides what the figures measure.
    fn submits_when_ready(&self) -> bool;
    /// Bad input found before anything is submitted.
    fn preflight(&mut self, plan: &Plan, options: &RunOptions, exe: &Path) -> Result<()>;
    /// A dry run's line for an instance that would be submitted; `after`
    /// names the submitted steps it reads.
    fn describe(&self, plan: &Plan, instance: &Instance, after: &[String]) -> String;
    /// Submits what may be submitted now (a job's id is pushed on its
    /// instance's `jobs` and into the journal as it is submitted); returns
    /// the positions in `submitted` of the instances whose first jobs were
    /// submitted.
    fn advance(&mut self, plan: &Plan, submitted: &mut [Submitted]) -> Result<Vec<usize>>;
    /// The jobs among `ids` that are queued or running (an array's tasks
    /// under the array's id); jobs the cluster no longer has are absent.
    fn live(
        &mut self,
        ids: &[String],
    ) -> std::result::Result<BTreeMap<String, Vec<JobState>>, String>;
    /// The cluster's account of task `task` (`None`: the merge job) of an
    /// instance's `jobs`, which ended without an exit status.
    fn lost(&mut self, out: &Path, instance: &Instance, jobs: &[String], task: Option<u32>)
    -> Lost;
    /// Cancels jobs.
    fn cancel(&mut self, ids: &[String]) -> std::result::Result<(), String>;
}
