//! What the cluster backends share: the Slurm backend ([`crate::slurm`])
//! and the Ray backend ([`crate::ray`]) hand the steps the cache says must
//! run to an existing cluster, as jobs that run the local backend's very
//! command lines ([`exec::stage_command`]) through `pipeline task`
//! ([`task`]).
//!
//! Here, once for both:
//!
//! - which instances are submitted ([`runs`]): a step whose record does not
//!   match (as locally), or one reading a step that is submitted too (its
//!   inputs do not exist yet, so it cannot be a cache hit);
//! - their preparation: the step directory cleared, `spec.json` (the stage
//!   command of each task) written under `OUT/_runner/<backend>/<step>/`;
//! - the wait ([`run_plan`]): each round, the backend's [`Queue`] says
//!   which jobs are still queued or running and submits what may start
//!   (Slurm everything at once, with `afterok` dependencies; Ray a step's
//!   jobs once the steps it reads have completed), and every step's state
//!   follows from that and the step records: pending, running, ran, failed,
//!   not run (a step it reads failed);
//! - a failure's report ([`failure`]): a task's exit code and the tail of
//!   its log, or for a job that ended without one the tail of the cluster's
//!   own log of it;
//! - the journal of submitted jobs (`OUT/_runner/<backend>/jobs.jsonl`),
//!   which `pipeline cancel` reads, and the refusal of a run directory whose
//!   earlier jobs still run ([`refuse_live_jobs`], for every backend);
//! - what the queue cost per step ([`queue_figures`]): submission to start,
//!   and end of the jobs waited for to start, from the submission times and
//!   the start and end times every task records on its node;
//! - the paths every node must see ([`check_shared`]) and the nodes that
//!   can hold a step ([`check_fits`]).
//!
//! ```text
//! OUT/_runner/slurm/jobs.jsonl       # or ray/: one line per submitted job
//! OUT/_runner/slurm/collect/spec.json
//! OUT/_runner/slurm/collect/task-0.json   # {"started_unix":…,"ended_unix":…,"code":0,"node":…}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use embodyflow_core::numerics::{CpuCapability, best_capability};

use crate::backend::{Backend, Resources};
use crate::cache::{self, KeyInputs, StepRecord, runner_dir};
use crate::check::binary;
use crate::error::{Result, RunnerError};
use crate::exec::{self, RunOptions, RunOutcome, Status, StepOutcome};
use crate::plan::{Instance, Plan};

/// How long the runner keeps asking a queue that does not answer before it
/// gives up on the run (its jobs may still run; a resumed run finds them).
const UNANSWERED: Duration = Duration::from_secs(300);

/// How long a finished run, or `pipeline cancel`, waits for its jobs to
/// leave the queue: the cluster lists a job a moment after its task
/// recorded its end (Slurm's completing state, Ray's job supervisor), and
/// a rerun or a cancel right after must not find it live.
const SETTLE: Duration = Duration::from_secs(60);

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

/// What a job runs: written before submission, read by `pipeline task`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskSpec {
    /// The run directory.
    pub out: PathBuf,
    /// The step instance.
    pub instance: Instance,
    /// What its cache key is computed from besides its arguments (the
    /// runner's: the record a job writes is keyed as the runner checks it).
    pub key_inputs: KeyInputs,
    /// The command line of each task.
    pub commands: Vec<Vec<String>>,
    /// What each task's stage process finds in its environment
    /// ([`cache::process_environment`]): its thread count and libtorch's
    /// dispatch level.
    pub environment: Vec<(String, String)>,
    /// That dispatch level, which the node's CPU must have.
    pub cpu_capability: CpuCapability,
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

/// A path made absolute against the working directory, `.` and `..`
/// resolved without touching the filesystem (outputs do not exist yet).
pub(crate) fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in cwd.join(path).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A path as the filesystem resolves it: made [`absolute`], then its
/// longest existing part with every symbolic link resolved
/// (`canonicalize`), the rest (outputs that do not exist yet) appended.
/// `/home/me/run` is `/mnt/home/me/run` when `/home` links to `/mnt/home`.
pub(crate) fn resolved(path: &Path, cwd: &Path) -> PathBuf {
    let full = absolute(path, cwd);
    let mut head = full.as_path();
    let mut tail = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(head) {
            return tail.iter().rev().fold(real, |p, part| p.join(part));
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                head = parent;
            }
            _ => return full,
        }
    }
}

/// A word for a shell command line, quoted only when needed.
pub(crate) fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-=:,+@".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The device a task passes its stage: CPU as it is, any CUDA device the
/// first of the GPUs the cluster grants the job (it sets
/// `CUDA_VISIBLE_DEVICES`).
pub(crate) fn cluster_device(device: &str) -> &'static str {
    if device == "cpu" { "cpu" } else { "cuda" }
}

/// One node as the cluster describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub name: String,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: u32,
}

/// Whether a node can run one process of a step.
pub(crate) fn fits(node: &Node, resources: &Resources) -> bool {
    resources.cpus.unwrap_or(1) <= node.cpus
        && resources.mem_mb.unwrap_or(0) <= node.mem_mb
        && resources.gpus <= node.gpus
}

/// Bad input when a step asks for more than any of `nodes` has; `of`
/// names them (`partition `gpu``).
pub(crate) fn check_fits(plan: &Plan, nodes: &[Node], of: &str) -> Result<()> {
    let mut seen = BTreeSet::new();
    for instance in &plan.instances {
        if !seen.insert(&instance.step) || nodes.iter().any(|n| fits(n, &instance.resources)) {
            continue;
        }
        let r = &instance.resources;
        let described: Vec<String> = nodes
            .iter()
            .take(8)
            .map(|n| {
                format!(
                    "{}: {} CPUs, {} MiB, {} GPUs",
                    n.name, n.cpus, n.mem_mb, n.gpus
                )
            })
            .collect();
        return Err(bad(format!(
            "{}:{}: step `{}` asks for {} CPU(s), {} and {} GPU(s) per process; no node of {of} has that ({}{})",
            plan.file.display(),
            instance.line,
            instance.step,
            r.cpus.unwrap_or(1),
            r.mem_mb
                .map_or("the default memory".to_string(), |m| format!("{m} MiB")),
            r.gpus,
            if described.is_empty() {
                "no node is up".to_string()
            } else {
                described.join("; ")
            },
            if nodes.len() > 8 { "; …" } else { "" }
        )));
    }
    Ok(())
}

/// Bad input when the run directory, the working directory, the binaries or
/// an input of a step are not under `[backend] shared`: every node must see
/// them. `who` names the backend.
pub(crate) fn check_shared(
    plan: &Plan,
    backend: &Backend,
    options: &RunOptions,
    exe: &Path,
    who: &str,
) -> Result<()> {
    let cwd = std::env::current_dir().map_err(|e| RunnerError::io(".", e))?;
    if backend.shared.is_empty() {
        return Err(bad(format!(
            "{}: the {who} backend needs [backend] shared = [\"/path\", …]: the roots of the filesystems every node sees; the run directory, the inputs, the binaries and the directory `pipeline` runs in must be under them",
            plan.file.display()
        )));
    }
    // Compared as the filesystem resolves them: a root or a path may be
    // reached through a symbolic link.
    let roots: Vec<PathBuf> = backend.shared.iter().map(|r| resolved(r, &cwd)).collect();
    let mut paths: Vec<(String, PathBuf)> = vec![
        ("the run directory".into(), plan.out.clone()),
        (
            "the directory `pipeline` runs in (jobs start there)".into(),
            cwd.clone(),
        ),
        ("the stage binaries".into(), options.bin_dir.clone()),
        ("the `pipeline` binary".into(), exe.to_path_buf()),
    ];
    for instance in &plan.instances {
        for path in &instance.external {
            paths.push((format!("an input of step `{}`", instance.id), path.clone()));
        }
    }
    for (what, path) in paths {
        let full = resolved(&path, &cwd);
        if !roots.iter().any(|root| full.starts_with(root)) {
            return Err(bad(format!(
                "{}: {what}, {}, is not under a shared root ([backend] shared: {}); every node must see it",
                plan.file.display(),
                full.display(),
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

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
    fn word(&self) -> &'static str {
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
    gone_since: Option<Instant>,
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
    /// `slurm` or `ray`: the directory under `OUT/_runner/`.
    fn name(&self) -> &'static str;
    /// `Slurm` or `Ray`, in messages.
    fn title(&self) -> &'static str;
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

/// Why a step whose jobs are gone left no record: a task's exit code and
/// log tail, or the cluster's account of a job that ended without an exit
/// status.
pub(crate) fn failure(
    out: &Path,
    queue: &mut dyn Queue,
    instance: &Instance,
    jobs: &[String],
) -> RunnerError {
    let dir = step_dir(out, queue.name(), instance);
    for i in 0..instance.shards {
        match read_task(&dir.join(format!("task-{i}.json"))) {
            Some(TaskRecord {
                code: Some(code), ..
            }) if code != 0 => {
                let log = exec::process_log(out, instance, i);
                return RunnerError::StageFailed {
                    step: instance.id.clone(),
                    stage: instance.stage.name,
                    code,
                    tail: exec::tail(&log, 20),
                    log,
                };
            }
            Some(TaskRecord { code: Some(_), .. }) => {}
            _ => {
                let lost = queue.lost(out, instance, jobs, Some(i));
                return RunnerError::JobFailed {
                    step: instance.id.clone(),
                    job: lost.job,
                    what: lost.what,
                    backend: queue.title(),
                    tail: exec::tail(&lost.log, 10),
                    log: lost.log,
                };
            }
        }
    }
    let lost = queue.lost(out, instance, jobs, None);
    let what = if instance.shards > 1 {
        "its shards succeeded and its merge job wrote no record"
    } else {
        "its stage succeeded and the job wrote no record"
    };
    RunnerError::JobFailed {
        step: instance.id.clone(),
        job: lost.job,
        what: if lost.what.is_empty() {
            what.to_string()
        } else {
            format!("{what} ({})", lost.what)
        },
        backend: queue.title(),
        tail: exec::tail(&lost.log, 10),
        log: lost.log,
    }
}

/// Which instances run: a miss, a forced step (`--from`, `--only`), or a
/// step reading one that runs. Returns every instance's outcome so far
/// (cached, kept, or to run) and the set that runs.
pub(crate) fn runs(
    plan: &Plan,
    options: &RunOptions,
    keys: &[Option<KeyInputs>],
) -> Result<(Vec<StepOutcome>, BTreeSet<usize>)> {
    let selection = exec::Selection::of(plan, options)?;
    let mut steps: Vec<StepOutcome> = Vec::new();
    let mut to_run: BTreeSet<usize> = BTreeSet::new();
    for (index, instance) in plan.instances.iter().enumerate() {
        let mut outcome = StepOutcome {
            index,
            status: Status::Cached,
            wall_s: 0.0,
            overhead_s: 0.0,
        };
        if selection.kept(plan, index, options.dry_run)? {
            outcome.status = Status::Kept;
            steps.push(outcome);
            continue;
        }
        let forced = selection.forced(index);
        let blocked = instance.deps.iter().any(|d| to_run.contains(d));
        let hit = match &keys[index] {
            Some(inputs) if !forced && !blocked => {
                let (key, _) = cache::step_key(instance, inputs)?;
                cache::cached(instance, &key)
            }
            _ => None,
        };
        match hit {
            Some(record) => outcome.wall_s = record.wall_s,
            None => {
                outcome.status = if options.dry_run {
                    Status::WouldRun
                } else {
                    Status::Ran
                };
                to_run.insert(index);
            }
        }
        steps.push(outcome);
    }
    Ok((steps, to_run))
}

/// Clears an instance that runs (its step directory, its earlier backend
/// directory and logs) and writes its `spec.json`.
fn prepare(
    plan: &Plan,
    backend: &str,
    index: usize,
    options: &RunOptions,
    keys: &[Option<KeyInputs>],
    machine: &embodyflow_core::numerics::Machine,
) -> Result<Submitted> {
    let instance = &plan.instances[index];
    exec::clear(instance)?;
    let dir = step_dir(&plan.out, backend, instance);
    let logs = runner_dir(&plan.out).join("logs").join(&instance.id);
    for old in [&dir, &logs] {
        if old.exists() {
            std::fs::remove_dir_all(old).map_err(|e| RunnerError::io(old, e))?;
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| RunnerError::io(&dir, e))?;
    let bin = binary(&options.bin_dir, instance.stage.name);
    let commands: Vec<Vec<String>> = (0..instance.shards)
        .map(|i| {
            let device = &instance.devices[i as usize % instance.devices.len()];
            exec::stage_command(instance, &bin, i, cluster_device(device))
        })
        .collect();
    let spec_path = dir.join("spec.json");
    let spec = TaskSpec {
        out: plan.out.clone(),
        instance: instance.clone(),
        key_inputs: keys[index]
            .clone()
            .expect("checked: every stage is built and every config resolved"),
        commands,
        environment: cache::process_environment(instance, machine),
        cpu_capability: machine.cpu_capability,
    };
    write_file(
        &spec_path,
        &serde_json::to_string_pretty(&spec).expect("a task spec serialises"),
    )?;
    Ok(Submitted {
        index,
        spec: spec_path,
        commands: spec.commands,
        jobs: Vec::new(),
        label: String::new(),
        submitted_unix: 0.0,
        state: State::Pending,
        gone_since: None,
    })
}

/// The state of submitted step `s` this round, from the jobs `live` says
/// are queued or running, its record, and the verdicts on the steps it
/// reads (`failed`, `unfinished`); with the error of a step that failed.
/// A step whose jobs are gone without a record fails at once when a task
/// recorded a non-zero exit, else once its record has not shown for
/// `grace` (a network filesystem may show a file written on a node late).
fn next_state(
    plan: &Plan,
    queue: &mut dyn Queue,
    s: &mut Submitted,
    live: &BTreeMap<String, Vec<JobState>>,
    failed: &BTreeSet<usize>,
    unfinished: &BTreeSet<usize>,
    grace: Duration,
) -> (State, Option<RunnerError>) {
    let instance = &plan.instances[s.index];
    let states: Vec<JobState> = s
        .jobs
        .iter()
        .filter_map(|j| live.get(j))
        .flatten()
        .copied()
        .collect();
    let record = std::fs::read_to_string(instance.dir.join(cache::STEP_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<StepRecord>(&t).ok());
    if !states.is_empty() {
        s.gone_since = None;
    }
    let new = if let Some(record) = record {
        State::Done(record)
    } else if let Some(dep) = instance.deps.iter().find(|d| failed.contains(d)) {
        State::NotRun(plan.instances[*dep].id.clone())
    } else if states.contains(&JobState::Running) {
        State::Running
    } else if !states.is_empty() {
        // A sharded step whose merge job waits has been running.
        if s.state == State::Running {
            State::Running
        } else {
            State::Pending
        }
    } else if s.jobs.is_empty() || instance.deps.iter().any(|d| unfinished.contains(d)) {
        // Not submitted yet, or Slurm cancels a job whose input
        // failed: wait for the verdict on what it reads.
        s.state.clone()
    } else {
        let gone = *s.gone_since.get_or_insert_with(Instant::now);
        let why = failure(&plan.out, queue, instance, &s.jobs);
        if matches!(why, RunnerError::StageFailed { .. }) || gone.elapsed() >= grace {
            let text = why.to_string();
            return (State::Failed(text), Some(why));
        }
        s.state.clone()
    };
    (new, None)
}

/// Submits the steps that must run through `queue` and waits for them;
/// `say` receives a line per step whenever its state changes.
pub(crate) fn run_plan(
    plan: &Plan,
    options: &RunOptions,
    queue: &mut dyn Queue,
    poll: Duration,
    grace: Duration,
    say: &mut dyn FnMut(&str),
) -> Result<RunOutcome> {
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| RunnerError::io("pipeline", e))?;
    queue.preflight(plan, options, &exe)?;
    let checked = crate::check::check_plan(plan, &options.bin_dir, options.dry_run)?;
    let machine = cache::machine(&options.bin_dir);
    let check_s = started.elapsed().as_secs_f64();
    let _lock = if options.dry_run {
        None
    } else {
        Some(exec::Lock::take(&plan.out, exec::LEFTOVER_WAIT)?)
    };
    refuse_live_jobs(&plan.out)?;
    let hash_started = Instant::now();
    let binaries = exec::hash_binaries(plan, options)?;
    let binary_hash_s = hash_started.elapsed().as_secs_f64();
    let keys: Vec<Option<KeyInputs>> = (0..plan.instances.len())
        .map(|index| exec::key_inputs(plan, &checked, &binaries, &machine, index))
        .collect();
    let (mut steps, to_run) = runs(plan, options, &keys)?;
    let notes = checked.notes;
    let total = plan.instances.len();
    let line = |index: usize, word: &str, detail: &str| {
        let instance = &plan.instances[index];
        format!(
            "[{:>3}/{total}] {:<40} {:<19} {:<9} {detail}",
            index + 1,
            instance.id,
            instance.stage.name,
            word
        )
    };
    for step in &steps {
        if step.status == Status::Cached || step.status == Status::Kept {
            let detail = if step.status == Status::Cached {
                format!("(ran in {:.1} s)", step.wall_s)
            } else {
                String::new()
            };
            say(&line(step.index, step.status.word(), &detail));
        }
    }
    if options.dry_run {
        for &index in &to_run {
            let instance = &plan.instances[index];
            let after: Vec<String> = instance
                .deps
                .iter()
                .filter(|d| to_run.contains(d))
                .map(|d| plan.instances[*d].id.clone())
                .collect();
            say(&queue.describe(plan, instance, &after));
        }
        return Ok(RunOutcome {
            steps,
            notes,
            check_s,
            binary_hash_s,
            total_s: started.elapsed().as_secs_f64(),
        });
    }

    let mut submitted: Vec<Submitted> = to_run
        .iter()
        .map(|&index| prepare(plan, queue.name(), index, options, &keys, &machine))
        .collect::<Result<_>>()?;
    let mut ids: Vec<String> = Vec::new();
    let mut unanswered: Option<Instant> = None;
    let mut failures: Vec<RunnerError> = Vec::new();
    let mut settling: Option<Instant> = None;
    loop {
        let mut live = match queue.live(&ids) {
            Ok(live) => {
                unanswered = None;
                live
            }
            Err(e) => {
                let since = *unanswered.get_or_insert_with(|| {
                    say(&format!(
                        "{} does not answer (retrying): {e}",
                        queue.title()
                    ));
                    Instant::now()
                });
                if since.elapsed() >= UNANSWERED {
                    return Err(RunnerError::Cluster {
                        backend: queue.title(),
                        message: format!(
                            "no answer for {} s, giving up (jobs may still run; a resumed run waits for them): {e}",
                            UNANSWERED.as_secs()
                        ),
                    });
                }
                std::thread::sleep(poll);
                continue;
            }
        };
        let new = match queue.advance(plan, &mut submitted) {
            Ok(new) => new,
            Err(e) => {
                let all: Vec<String> = submitted.iter().flat_map(|s| s.jobs.clone()).collect();
                if !all.is_empty() {
                    let _ = queue.cancel(&all);
                    say(&format!(
                        "cancelled the jobs submitted before the failure: {}",
                        all.join(", ")
                    ));
                }
                return Err(e);
            }
        };
        for s in &submitted {
            for job in &s.jobs {
                if !ids.contains(job) {
                    ids.push(job.clone());
                    live.insert(job.clone(), vec![JobState::Queued]);
                }
            }
        }
        // In plan order, so that a step sees this round's verdict on the
        // steps it reads.
        let mut unfinished: BTreeSet<usize> = submitted
            .iter()
            .filter(|s| !s.state.finished())
            .map(|s| s.index)
            .collect();
        let mut failed: BTreeSet<usize> = submitted
            .iter()
            .filter(|s| matches!(s.state, State::Failed(_) | State::NotRun(_)))
            .map(|s| s.index)
            .collect();
        for s in submitted.iter_mut().filter(|s| !s.state.finished()) {
            let (new, error) = next_state(plan, queue, s, &live, &failed, &unfinished, grace);
            if new.finished() {
                unfinished.remove(&s.index);
            }
            if matches!(new, State::Failed(_) | State::NotRun(_)) {
                failed.insert(s.index);
            }
            if new == s.state {
                continue;
            }
            let (word, detail) = match &new {
                State::Done(record) if record.commands.is_empty() => {
                    (Status::PassedOn.word(), String::new())
                }
                State::Done(record) => (Status::Ran.word(), format!("{:.1} s", record.wall_s)),
                State::NotRun(dep) => (new.word(), format!("(it reads {dep}, which failed)")),
                State::Failed(_) => (new.word(), String::new()),
                _ => (new.word(), s.label.clone()),
            };
            say(&line(s.index, word, &detail));
            if let Some(error) = error {
                // Indented: only the state lines start with `[`.
                for text in error.to_string().lines() {
                    say(&format!("    {text}"));
                }
                failures.push(error);
            }
            s.state = new;
        }
        // After the states of this round, which made them submittable.
        for &k in &new {
            say(&line(submitted[k].index, "submitted", &submitted[k].label));
        }
        if submitted.iter().all(|s| s.state.finished()) {
            let since = *settling.get_or_insert_with(Instant::now);
            if live.is_empty() || since.elapsed() >= SETTLE {
                break;
            }
        }
        std::thread::sleep(poll);
    }
    for s in &submitted {
        let step = &mut steps[s.index];
        if let State::Done(record) = &s.state {
            step.wall_s = record.wall_s;
            step.status = if record.commands.is_empty() {
                Status::PassedOn
            } else {
                Status::Ran
            };
            step.overhead_s =
                (record.finished_unix as f64 - s.submitted_unix - record.wall_s).max(0.0);
        }
    }
    let entries = read_jobs(&plan.out, queue.name())?;
    if let Some(figures) = queue_figures(
        &plan.out,
        queue.name(),
        &entries,
        &ids,
        queue.submits_when_ready(),
    ) {
        say(&figures);
    }
    if !failures.is_empty() {
        let count = failures.len();
        let first = failures.remove(0);
        if count > 1 {
            say(&format!("{count} steps failed; the first:"));
        }
        return Err(first);
    }
    Ok(RunOutcome {
        steps,
        notes,
        check_s,
        binary_hash_s,
        total_s: started.elapsed().as_secs_f64(),
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// What the queue cost this submission (`ids`), from the jobs' submission
/// times and the task records: from submission to start, and from the end
/// of the last job a job waited for to its start. With `when_ready` (the
/// runner submits a job once what it waits for has ended, Ray) the first
/// covers every job and the second includes the runner's own wait and
/// submission; otherwise (Slurm, every job submitted at once) the first
/// covers the jobs that waited for nothing. `None` when no job started.
pub fn queue_figures(
    out: &Path,
    backend: &str,
    entries: &[JobEntry],
    ids: &[String],
    when_ready: bool,
) -> Option<String> {
    let by_id: BTreeMap<&str, &JobEntry> = entries
        .iter()
        .filter(|e| ids.contains(&e.job))
        .map(|e| (e.job.as_str(), e))
        .collect();
    // Start and end of every task of a job.
    let tasks = |entry: &JobEntry| -> Vec<TaskRecord> {
        let dir = backend_dir(out, backend).join(&entry.instance);
        if entry.kind == "merge" {
            read_task(&dir.join("merge.json")).into_iter().collect()
        } else {
            (entry.first..entry.first + entry.tasks)
                .filter_map(|i| read_task(&dir.join(format!("task-{i}.json"))))
                .collect()
        }
    };
    let mut to_start = Vec::new();
    let mut after_end = Vec::new();
    for entry in by_id.values() {
        let starts: Vec<f64> = tasks(entry).iter().map(|t| t.started_unix).collect();
        if entry.after.is_empty() || when_ready {
            to_start.extend(starts.iter().map(|s| s - entry.submitted_unix));
        }
        if entry.after.is_empty() {
            continue;
        }
        let ends: Option<Vec<f64>> = entry
            .after
            .iter()
            .map(|dep| {
                let dep = by_id.get(dep.as_str())?;
                let ends: Vec<f64> = tasks(dep).iter().filter_map(|t| t.ended_unix).collect();
                (ends.len() as u32 == dep.tasks).then(|| ends.into_iter().fold(f64::MIN, f64::max))
            })
            .collect();
        if let Some(ends) = ends {
            let from = if when_ready {
                f64::MIN
            } else {
                entry.submitted_unix
            };
            let ready = ends.into_iter().fold(from, f64::max);
            after_end.extend(starts.iter().map(|s| s - ready));
        }
    }
    if to_start.is_empty() && after_end.is_empty() {
        return None;
    }
    let describe = |what: &str, values: &mut Vec<f64>| {
        if values.is_empty() {
            return format!("{what}: none");
        }
        let (lo, hi) = (
            values.iter().copied().fold(f64::MAX, f64::min),
            values.iter().copied().fold(f64::MIN, f64::max),
        );
        format!(
            "{what}: median {:.2} s over {} task(s) ({lo:.2} to {hi:.2} s)",
            median(values),
            values.len()
        )
    };
    Some(format!(
        "{backend} queue: {}; {}",
        describe("submission to start", &mut to_start),
        describe("end of the jobs waited for to start", &mut after_end)
    ))
}

/// Refuses a run directory whose earlier Slurm or Ray jobs are still
/// queued or running (they would write into the steps a new run fills).
pub fn refuse_live_jobs(out: &Path) -> Result<()> {
    let mut live = crate::slurm::live_jobs(out)?;
    live.extend(crate::ray::live_jobs(out)?);
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

/// `pipeline cancel OUT`: cancels the run's Slurm and Ray jobs that are
/// queued or running; returns their ids.
pub fn cancel(out: &Path) -> Result<Vec<String>> {
    let journals: Vec<PathBuf> = ["slurm", "ray"].iter().map(|b| jobs_file(out, b)).collect();
    if !journals.iter().any(|j| j.is_file()) {
        return Err(RunnerError::Usage(format!(
            "{} lists no cluster jobs (no {}): it was not run with --backend slurm or ray",
            out.display(),
            journals
                .iter()
                .map(|j| j.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        )));
    }
    let mut cancelled = crate::slurm::cancel(out)?;
    cancelled.extend(crate::ray::cancel(out)?);
    // Cancelling is asynchronous: return once the jobs have left the queue.
    let started = Instant::now();
    while started.elapsed() < SETTLE
        && !(crate::slurm::live_jobs(out)?.is_empty() && crate::ray::live_jobs(out)?.is_empty())
    {
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(cancelled)
}

/// The node this process runs on (Slurm's name for it, else the host name).
fn node_name() -> String {
    std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default()
    })
}

/// `pipeline task SPEC [--index I] [--merge]`, in a job on a node: runs the
/// stage command of task `I` (else `$SLURM_ARRAY_TASK_ID`, else 0) and
/// records its exit status; a step of one process is then checked and
/// recorded as locally. With `merge`, merges the shards' tables and records
/// the step.
pub fn task(spec_path: &Path, merge: bool, index: Option<u32>) -> Result<()> {
    let text = std::fs::read_to_string(spec_path).map_err(|e| RunnerError::io(spec_path, e))?;
    let spec: TaskSpec = serde_json::from_str(&text)
        .map_err(|e| bad(format!("{}: not a task spec: {e}", spec_path.display())))?;
    let dir = spec_path.parent().unwrap_or(Path::new("."));
    let i: u32 = match (index, std::env::var("SLURM_ARRAY_TASK_ID")) {
        _ if merge => 0,
        (Some(i), _) => i,
        (None, Ok(id)) => id
            .parse()
            .map_err(|_| bad(format!("SLURM_ARRAY_TASK_ID `{id}` is not a task number")))?,
        (None, Err(_)) => 0,
    };
    let status_path = if merge {
        dir.join("merge.json")
    } else {
        dir.join(format!("task-{i}.json"))
    };
    let mut status = TaskRecord {
        started_unix: now(),
        ended_unix: None,
        code: None,
        node: node_name(),
    };
    let write_status = |status: &TaskRecord| {
        write_file(
            &status_path,
            &serde_json::to_string(status).expect("a task record serialises"),
        )
    };
    write_status(&status)?;
    let result = if merge {
        finish_sharded(&spec, dir)
    } else {
        run_task(&spec, i)
    };
    status.ended_unix = Some(now());
    status.code = Some(match &result {
        Ok(()) => 0,
        Err(RunnerError::StageFailed { code, .. }) => *code,
        Err(_) => 1,
    });
    write_status(&status)?;
    result
}

/// Task `i` of a step: its stage process; for a step of one process, the
/// checks and the record.
fn run_task(spec: &TaskSpec, i: u32) -> Result<()> {
    let instance = &spec.instance;
    let command = spec.commands.get(i as usize).ok_or_else(|| {
        bad(format!(
            "task {i} of step `{}`, which has {} task(s)",
            instance.id,
            spec.commands.len()
        ))
    })?;
    if exec::is_empty(instance.skip_if_empty.as_deref())? {
        // The merge job (or, for one process, this task) passes the policy on.
        if instance.shards == 1 {
            exec::pass_on(instance)?;
            let key = cache::step_key(instance, &spec.key_inputs)?;
            exec::complete(instance, key, Vec::new(), 0.0)?;
        }
        return Ok(());
    }
    // A requeued job starts again from scratch.
    let out = exec::process_out(instance, i);
    if instance.shards == 1 {
        exec::clear(instance)?;
    } else if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| RunnerError::io(&out, e))?;
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| RunnerError::io(parent, e))?;
    }
    let log = exec::process_log(&spec.out, instance, i);
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent).map_err(|e| RunnerError::io(parent, e))?;
    }
    check_capability(spec, &embodyflow_core::numerics::cpuinfo())?;
    let bin = Path::new(&command[0]);
    let started = Instant::now();
    let status = exec::spawn(bin, &command[1..], &log, &spec.environment)?
        .wait()
        .map_err(|e| RunnerError::io(bin, e))?;
    let wall = started.elapsed().as_secs_f64();
    if !status.success() {
        return Err(RunnerError::StageFailed {
            step: instance.id.clone(),
            stage: instance.stage.name,
            code: status.code().unwrap_or(-1),
            tail: exec::tail(&log, 20),
            log,
        });
    }
    if let Some(path) = exec::missing_output(instance, &out) {
        return Err(RunnerError::MissingOutput {
            step: instance.id.clone(),
            stage: instance.stage.name,
            path,
            log,
        });
    }
    if instance.shards == 1 {
        exec::keep_logs(&spec.out, instance);
        let key = cache::step_key(instance, &spec.key_inputs)?;
        exec::complete(instance, key, spec.commands.clone(), wall)?;
    }
    Ok(())
}

/// Bad input when this node's CPU (its `/proc/cpuinfo`) lacks the libtorch
/// dispatch level the run computes at: the runner's, which every step's
/// key holds; a node without it would compute other numerics, or fault.
fn check_capability(spec: &TaskSpec, cpuinfo: &str) -> Result<()> {
    let best = best_capability(cpuinfo);
    if spec.cpu_capability <= best {
        return Ok(());
    }
    Err(bad(format!(
        "step `{}`: node {} dispatches libtorch at most at {best}, and the run computes at {} (the level of the machine `pipeline run` ran on, which the cache keys hold): run `pipeline` with ATEN_CPU_CAPABILITY={best}, or keep the step off this node",
        spec.instance.id,
        node_name(),
        spec.cpu_capability
    )))
}

/// The merge job of a sharded step: every shard succeeded (the cluster
/// started it after them, the task records say so too), their tables
/// merged, the logs moved in, the record written.
fn finish_sharded(spec: &TaskSpec, dir: &Path) -> Result<()> {
    let instance = &spec.instance;
    if exec::is_empty(instance.skip_if_empty.as_deref())? {
        exec::pass_on(instance)?;
        let key = cache::step_key(instance, &spec.key_inputs)?;
        return exec::complete(instance, key, Vec::new(), 0.0);
    }
    let mut span = (f64::MAX, f64::MIN);
    for i in 0..instance.shards {
        let path = dir.join(format!("task-{i}.json"));
        let record = read_task(&path)
            .filter(|t| t.code == Some(0))
            .ok_or_else(|| {
                bad(format!(
                    "step `{}`: shard {i} has no successful task record ({})",
                    instance.id,
                    path.display()
                ))
            })?;
        span.0 = span.0.min(record.started_unix);
        span.1 = span.1.max(record.ended_unix.unwrap_or(record.started_unix));
    }
    exec::merge_shards(instance, &instance.dir)?;
    exec::keep_logs(&spec.out, instance);
    let key = cache::step_key(instance, &spec.key_inputs)?;
    exec::complete(
        instance,
        key,
        spec.commands.clone(),
        (span.1 - span.0).max(0.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Pipeline;
    use crate::plan::Overrides;

    /// A plan of one step (generate-tasks) writing under `out`.
    fn one_step(out: &Path) -> Plan {
        let text = "[[step]]\nname = \"tasks\"\nstage = \"generate-tasks\"\n";
        let pipeline = Pipeline::parse(Path::new("p.toml"), text).unwrap();
        Plan::build(&pipeline, out, &Overrides::default()).unwrap()
    }

    /// A queue whose jobs have all left it, leaving no exit status.
    struct Gone;

    impl Queue for Gone {
        fn name(&self) -> &'static str {
            "slurm"
        }
        fn title(&self) -> &'static str {
            "Slurm"
        }
        fn submits_when_ready(&self) -> bool {
            false
        }
        fn preflight(&mut self, _: &Plan, _: &RunOptions, _: &Path) -> Result<()> {
            Ok(())
        }
        fn describe(&self, _: &Plan, _: &Instance, _: &[String]) -> String {
            String::new()
        }
        fn advance(&mut self, _: &Plan, _: &mut [Submitted]) -> Result<Vec<usize>> {
            Ok(Vec::new())
        }
        fn live(
            &mut self,
            _: &[String],
        ) -> std::result::Result<BTreeMap<String, Vec<JobState>>, String> {
            Ok(BTreeMap::new())
        }
        fn lost(&mut self, out: &Path, _: &Instance, jobs: &[String], _: Option<u32>) -> Lost {
            Lost {
                job: jobs[0].clone(),
                what: "ended without an exit status".into(),
                log: out.join("slurm-0.out"),
            }
        }
        fn cancel(&mut self, _: &[String]) -> std::result::Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_record_that_shows_late_on_a_shared_filesystem_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let plan = one_step(&dir.path().join("run"));
        let instance = &plan.instances[0];
        std::fs::create_dir_all(&instance.dir).unwrap();
        let mut step = Submitted {
            index: 0,
            spec: PathBuf::new(),
            commands: Vec::new(),
            jobs: vec!["7".into()],
            label: String::new(),
            submitted_unix: 0.0,
            state: State::Running,
            // The job left the queue 4 s ago; its record is not visible yet
            // (an NFS attribute cache hides it for 30 to 60 s).
            gone_since: Some(Instant::now() - Duration::from_secs(4)),
        };
        let none = BTreeSet::new();
        let round = |grace: Duration, step: &mut Submitted| {
            next_state(
                &plan,
                &mut Gone,
                step,
                &BTreeMap::new(),
                &none,
                &none,
                grace,
            )
        };
        let grace = Backend::default().record_grace;
        assert!(grace >= Duration::from_secs(60), "{grace:?}");
        let (state, error) = round(grace, &mut step);
        assert_eq!(state, State::Running, "still waiting for the record");
        assert!(error.is_none());
        // The record shows: the step ran.
        let record = StepRecord {
            format: cache::STEP_FORMAT.into(),
            key: "k".into(),
            key_parts: serde_json::Value::Null,
            id: instance.id.clone(),
            stage: instance.stage.name.into(),
            commands: Vec::new(),
            outputs: Vec::new(),
            wall_s: 1.0,
            finished_unix: 0,
        };
        cache::write_record(&instance.dir, &record).unwrap();
        assert!(matches!(round(grace, &mut step).0, State::Done(_)));
        // Past a shorter grace, a step without a record has failed.
        std::fs::remove_file(instance.dir.join(cache::STEP_FILE)).unwrap();
        let (state, error) = round(Duration::from_secs(3), &mut step);
        assert!(matches!(state, State::Failed(_)), "{state:?}");
        assert!(
            matches!(error, Some(RunnerError::JobFailed { .. })),
            "{error:?}"
        );
    }

    #[test]
    fn shared_roots_and_paths_are_compared_with_their_links_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("mnt/home");
        std::fs::create_dir_all(real.join("me/data")).unwrap();
        let home = dir.path().join("home");
        std::os::unix::fs::symlink(&real, &home).unwrap();
        let cwd = real.join("me");
        // A root given through the link, paths reached without it (and a
        // run directory that does not exist yet), and the other way round.
        let root = resolved(&home, &cwd);
        for path in ["data", "run/it0/collect", "../me/./data"] {
            let full = resolved(Path::new(path), &cwd);
            assert!(
                full.starts_with(&root),
                "{} under {}",
                full.display(),
                root.display()
            );
        }
        let through_link = resolved(&home.join("me/run"), &cwd);
        assert!(through_link.starts_with(resolved(&real, &cwd)));
        assert_eq!(through_link, real.canonicalize().unwrap().join("me/run"));
        // Not under it.
        assert!(!resolved(Path::new("/tmp"), &cwd).starts_with(&root));
    }

    #[test]
    fn a_node_without_the_runs_dispatch_level_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plan = one_step(&dir.path().join("run"));
        let spec = TaskSpec {
            out: plan.out.clone(),
            instance: plan.instances[0].clone(),
            key_inputs: KeyInputs {
                binary: "b".into(),
                config: serde_json::Value::Null,
                numerics: embodyflow_core::numerics::Fingerprint {
                    threads: None,
                    cpu_capability: None,
                    libtorch: None,
                },
            },
            commands: Vec::new(),
            environment: Vec::new(),
            cpu_capability: CpuCapability::Avx512,
        };
        let avx2 = "flags\t: fpu avx avx2 fma\n";
        let avx512 = "flags\t: fpu avx avx2 fma avx512f avx512dq avx512bw avx512vl\n";
        check_capability(&spec, avx512).unwrap();
        let err = check_capability(&spec, avx2).unwrap_err().to_string();
        assert!(
            err.contains("at most at avx2, and the run computes at avx512")
                && err.contains("ATEN_CPU_CAPABILITY=avx2"),
            "{err}"
        );
    }

    #[test]
    fn paths_are_made_absolute_without_the_filesystem() {
        let cwd = Path::new("/shared/me/work");
        assert_eq!(
            absolute(Path::new("../data/./x"), cwd),
            Path::new("/shared/me/data/x")
        );
        assert_eq!(absolute(Path::new("/tmp/run"), cwd), Path::new("/tmp/run"));
    }

    #[test]
    fn words_are_quoted_for_the_shell_only_when_needed() {
        assert_eq!(quote("--set"), "--set");
        assert_eq!(quote("match.mode=exact"), "match.mode=exact");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn nodes_hold_a_step_when_each_resource_fits() {
        let node = Node {
            name: "vm".into(),
            cpus: 2,
            mem_mb: 24105,
            gpus: 0,
        };
        let ask = |cpus, mem_mb, gpus| Resources {
            cpus: Some(cpus),
            mem_mb: Some(mem_mb),
            gpus,
        };
        assert!(fits(&node, &ask(2, 24105, 0)));
        assert!(!fits(&node, &ask(3, 100, 0)));
        assert!(!fits(&node, &ask(1, 100, 1)));
        assert!(!fits(&node, &ask(1, 24106, 0)));
    }
}
