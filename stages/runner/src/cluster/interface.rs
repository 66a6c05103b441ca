//! The backend interface: what the runner knows of a backend, declared once
//! in the backend's module and listed once in the registry
//! (`crate::registry::BACKENDS`). The runner never names a backend: it finds
//! the one `--backend` or `[backend] kind` names in the list, checks the
//! `[backend]` table's keys against what the listed backends declare,
//! runs the plan through the chosen one, and asks every listed backend for
//! the run directory's live jobs (a run into a directory whose earlier jobs
//! still run is refused, [`refuse_live_jobs`]) and to cancel them
//! ([`cancel`]).
//!
//! A cluster backend implements [`Backend::run_plan`] by handing its
//! [`super::Queue`] to the shared wait ([`super::run_plan`]); `slurm.rs`
//! (dependencies resolved by the cluster) and `ray.rs` (the runner submits
//! what is ready) are the two patterns, `local.rs` runs on this machine.

use std::path::Path;
use std::time::{Duration, Instant};

use super::journal::{JobEntry, bad, jobs_file};
use crate::backend::Table;
use crate::error::{Result, RunnerError};
use crate::exec::{RunOptions, RunOutcome};
use crate::plan::Plan;

/// How long a finished run, or `pipeline cancel`, waits for its jobs to
/// leave the queue: the cluster lists a job a moment after its task
/// recorded its end (Slurm's completing state, Ray's job supervisor), and
/// a rerun or a cancel right after must not find it live.
pub(crate) const SETTLE: Duration = Duration::from_secs(60);

/// One way to run a pipeline's stage processes.
pub trait Backend: Sync {
    /// What `--backend` and `[backend] kind` take; a queued backend's
    /// directory under `OUT/_runner/`.
    fn name(&self) -> &'static str;
    /// Its name in messages (`Slurm`).
    fn title(&self) -> &'static str;
    /// One line for `--help`.
    fn about(&self) -> &'static str;
    /// The `[backend]` keys it reads besides the ones every backend reads
    /// (`kind`, `shared`, `record_grace_s`), each with its meaning; a file
    /// may hold every backend's keys (`--backend` picks one).
    fn keys(&self) -> Vec<(String, &'static str)> {
        Vec::new()
    }
    /// The keys it reads in a step's `[backend.step.NAME]` table.
    fn step_keys(&self) -> Vec<(String, &'static str)> {
        Vec::new()
    }
    /// The values of its keys, checked when the file is loaded.
    fn check(&self, _table: &Table) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether it submits to a cluster's queue: `--poll` applies, and its
    /// jobs are journalled in `OUT/_runner/<name>/jobs.jsonl`.
    fn queued(&self) -> bool;
    /// Runs the steps the cache says must run (with `--dry-run`, says what
    /// it would submit); `say` receives the progress lines.
    fn run_plan(&self, run: &Run, say: &mut dyn FnMut(&str)) -> Result<RunOutcome>;
    /// The jobs of `out`'s earlier submissions that are still queued or
    /// running.
    fn live_jobs(&self, out: &Path) -> Result<Vec<JobEntry>>;
    /// Cancels them; returns their ids.
    fn cancel(&self, out: &Path) -> Result<Vec<String>>;
}

/// What a backend's run gets.
pub struct Run<'a> {
    /// The plan.
    pub plan: &'a Plan,
    /// `--bin-dir`, `--dry-run`, `--from`, `--only`.
    pub options: &'a RunOptions,
    /// The file's `[backend]` table.
    pub table: &'a Table,
    /// `--poll`: the time between two looks at a queue.
    pub poll: Duration,
    /// Every listed backend: the jobs of any of them block the run
    /// directory ([`refuse_live_jobs`]).
    pub backends: &'a [&'a dyn Backend],
    /// The run log, told of each step as it completes (none in a dry run).
    pub log: Option<&'a crate::runlog::Live<'a>>,
}

/// Refuses a run directory whose earlier jobs, of any of `backends`, are
/// still queued or running (they would write into the steps a new run
/// fills).
pub fn refuse_live_jobs(out: &Path, backends: &[&dyn Backend]) -> Result<()> {
    let mut live = Vec::new();
    for backend in backends {
        live.extend(backend.live_jobs(out)?);
    }
    if live.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = live.iter().map(|e| e.job.as_str()).collect();
    Err(bad(format!(
        "jobs of an earlier submission into {} are still queued or running ({}): wait for them, or cancel them with `pipeline cancel {}`",
        out.display(),
        ids.join(", "),
        out.display()
    )))
}

/// `pipeline cancel OUT`: cancels the run's jobs, of every queued backend
/// among `backends`, that are queued or running; returns their ids.
pub fn cancel(out: &Path, backends: &[&dyn Backend]) -> Result<Vec<String>> {
    let queued: Vec<&dyn Backend> = backends.iter().copied().filter(|b| b.queued()).collect();
    let journals: Vec<String> = queued
        .iter()
        .map(|b| jobs_file(out, b.name()).display().to_string())
        .collect();
    if !queued.iter().any(|b| jobs_file(out, b.name()).is_file()) {
        let names: Vec<&str> = queued.iter().map(|b| b.name()).collect();
        return Err(RunnerError::Usage(format!(
            "{} lists no cluster jobs (no {}): it was not run with --backend {}",
            out.display(),
            journals.join(" or "),
            names.join(" or ")
        )));
    }
    let mut cancelled = Vec::new();
    for backend in &queued {
        cancelled.extend(backend.cancel(out)?);
    }
    // Cancelling is asynchronous: return once the jobs have left the queue.
    let started = Instant::now();
    while started.elapsed() < SETTLE && !all_gone(out, &queued)? {
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(cancelled)
}

/// Whether none of `backends` has a live job of `out`.
fn all_gone(out: &Path, backends: &[&dyn Backend]) -> Result<bool> {
    for backend in backends {
        if !backend.live_jobs(out)?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}
