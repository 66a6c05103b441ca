//! The runner's errors. A bad pipeline file, variable, key or input is the
//! user's to fix (exit 2, before any stage runs); a stage that fails while
//! running, or an I/O error, is a failure (exit 1).

use std::path::PathBuf;

use embodyflow_core::{Classify, ErrorKind};

/// Result of the runner.
pub type Result<T, E = RunnerError> = std::result::Result<T, E>;

/// Errors of the runner.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// Something wrong in a pipeline file, at a line (0 = the command line).
    #[error("{}: {message}", location(file, *line))]
    Pipeline {
        /// The pipeline file.
        file: PathBuf,
        /// 1-based line, 0 when the problem came from the command line.
        line: usize,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A stage binary the pipeline needs is not built.
    #[error(
        "stage binary {path} is missing (step `{step}`); build it with `cargo build --release --bins`"
    )]
    MissingBinary {
        /// Step naming the stage.
        step: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A stage process exited with an error.
    #[error("step `{step}` ({stage}) failed with exit code {code}; log {log}:\n{tail}")]
    StageFailed {
        /// The step instance.
        step: String,
        /// Its stage.
        stage: &'static str,
        /// Exit code (-1 when killed by a signal).
        code: i32,
        /// Log file with the stage's stdout and stderr.
        log: PathBuf,
        /// The last lines of the log.
        tail: String,
    },
    /// A stage exited 0 without writing an output its declaration lists.
    #[error(
        "step `{step}` ({stage}) exited 0 but did not write {path}, which the stage declares as an output (embodyflow_core::spec); log {log}"
    )]
    MissingOutput {
        /// The step instance.
        step: String,
        /// Its stage.
        stage: &'static str,
        /// The missing output.
        path: PathBuf,
        /// The stage's log.
        log: PathBuf,
    },
    /// Another runner holds the run directory.
    #[error(
        "run directory {dir} is in use by runner process {pid} (lock {lock}); wait for it or remove the lock if that process is gone"
    )]
    Locked {
        /// Run directory.
        dir: PathBuf,
        /// The other runner's process id.
        pid: u32,
        /// The lock file.
        lock: PathBuf,
    },
    /// The stage processes of a runner that is gone still hold the run
    /// directory's lock.
    #[error(
        "run directory {dir} is still held by stage processes of runner {}, which is gone (lock {lock}); they did not exit within {waited_s:.1} s: `fuser -v {lock}` lists them",
        pid.map_or("(unknown pid)".to_string(), |p| p.to_string())
    )]
    Leftovers {
        /// Run directory.
        dir: PathBuf,
        /// The gone runner's process id, when the lock names one.
        pid: Option<u32>,
        /// The lock file.
        lock: PathBuf,
        /// Seconds waited.
        waited_s: f64,
    },
    /// The runner's own directory of a run directory, or its lock, is not
    /// the running user's alone: other users could take or hold the lock.
    #[error(
        "{path} {problem}: the runner's directory and its lock must belong to the user running it, and no other user may write the directory or read the lock"
    )]
    UnsafeRunDir {
        /// `OUT/_runner` or `OUT/_runner/lock`.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Bad command-line usage.
    #[error("{0}")]
    Usage(String),
    /// A backend that cannot run this pipeline as asked (no `sbatch`, an
    /// unknown partition, an unreachable Ray cluster, a step no node holds,
    /// a path no node sees), found before anything is submitted.
    #[error("{0}")]
    Backend(String),
    /// A cluster (Slurm, Ray) that failed while the run was submitted or
    /// waited for.
    #[error("{backend}: {message}")]
    Cluster {
        /// `Slurm` or `Ray`.
        backend: &'static str,
        /// What failed.
        message: String,
    },
    /// A cluster job of a step that ended without completing it.
    #[error("step `{step}` failed: job {job} {what}; {backend}'s log {log}:\n{tail}")]
    JobFailed {
        /// The step instance.
        step: String,
        /// The job (Slurm: `id` or `id_task`; Ray: its submission id).
        job: String,
        /// What happened.
        what: String,
        /// `Slurm` or `Ray`.
        backend: &'static str,
        /// The cluster's log of the job.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// An error of the shared core (manifests, merges, I/O).
    #[error(transparent)]
    Core(#[from] embodyflow_core::Error),
    /// A plot that could not be drawn.
    #[error("drawing {path}: {reason}")]
    Plot {
        /// The PNG.
        path: PathBuf,
        /// The backend's message.
        reason: String,
    },
}

fn location(file: &std::path::Path, line: usize) -> String {
    if line == 0 {
        format!("{} (command line)", file.display())
    } else {
        format!("{}:{line}", file.display())
    }
}

impl RunnerError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> RunnerError {
        RunnerError::Core(embodyflow_core::Error::io(path, source))
    }
}

impl Classify for RunnerError {
    fn kind(&self) -> ErrorKind {
        match self {
            RunnerError::StageFailed { .. }
            | RunnerError::Cluster { .. }
            | RunnerError::JobFailed { .. }
            | RunnerError::MissingOutput { .. }
            | RunnerError::Plot { .. } => ErrorKind::Failure,
            RunnerError::Core(e) => e.kind(),
            RunnerError::Pipeline { .. }
            | RunnerError::MissingBinary { .. }
            | RunnerError::Locked { .. }
            | RunnerError::Leftovers { .. }
            | RunnerError::UnsafeRunDir { .. }
            | RunnerError::Usage(_)
            | RunnerError::Backend(_) => ErrorKind::BadInput,
        }
    }
}
