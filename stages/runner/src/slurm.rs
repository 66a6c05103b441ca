//! The Slurm backend (`pipeline run FILE --out DIR --backend slurm`): the
//! steps the cache says must run are handed to an existing Slurm cluster,
//! the very command lines the local backend runs ([`exec::stage_command`]).
//!
//! Each such step instance becomes one `sbatch` job, a sharded step one job
//! array (task `i` runs shard `i`, `--shard $SLURM_ARRAY_TASK_ID/n`) and a
//! small merge job `afterok` on the array; a step's jobs wait `afterok` for
//! the last job of every step it reads, and `--kill-on-invalid-dep=yes`
//! lets Slurm cancel what depends on a failed job. A job asks for the step's
//! `cpus`, `mem` and `gpus` ([`crate::backend`]; `--cpus-per-task`, `--mem`,
//! `--gres=gpu:N`), and a CUDA device becomes `--device cuda`, the first of
//! the GPUs Slurm grants (it sets `CUDA_VISIBLE_DEVICES`).
//!
//! A job runs `pipeline task SPEC` on its node ([`task`]): the stage command
//! of its shard, its log in `OUT/_runner/logs/<step>/<i>.log` as locally,
//! then a record of its exit status and times (`task-<i>.json`), and for a
//! step of one process the checks, the log moves and `_step.json` that the
//! local backend writes; the merge job (`pipeline task SPEC --merge`)
//! merges the shards' tables and writes `_step.json`. So the cluster
//! finishes a submitted pipeline on its own, and records appear as on a
//! local run.
//!
//! The runner meanwhile prints each step's state as it changes (pending,
//! running, done, failed, from `squeue` and the step records) and reports a
//! failed task with its exit code and the tail of its log; a task that ended
//! without an exit status (cancelled, out of time or memory) is reported
//! with the tail of Slurm's own log of the job. Every submitted job is
//! listed in `OUT/_runner/slurm/jobs.jsonl`; `pipeline cancel OUT` cancels
//! those still queued or running.
//!
//! A resumed run submits only what is missing: a step is submitted when its
//! record does not match (as locally) or when a step it reads is submitted
//! too (its inputs do not exist yet, so it cannot be a cache hit). A run
//! directory whose earlier jobs are still queued or running is refused.
//!
//! Every node must see the run directory, the inputs, the binaries and the
//! directory `pipeline` runs in (jobs start there): `[backend] shared`
//! names the roots of such filesystems, and a path outside them is bad
//! input, as is a missing `sbatch`, an unknown partition, or a step asking
//! for more CPUs, memory or GPUs than any node of the partition has. All of
//! that is checked before the first job is submitted.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Resources};
use crate::cache::{self, StepRecord, runner_dir};
use crate::check::binary;
use crate::error::{Result, RunnerError};
use crate::exec::{self, RunOptions, RunOutcome, Status, StepOutcome};
use crate::plan::{Instance, Plan};

/// The Slurm commands the backend uses.
const TOOLS: [&str; 4] = ["sbatch", "squeue", "scancel", "sinfo"];

/// How long a step may be missing from `squeue` without a record before
/// it counts as failed: time for a record written on a node to show on the
/// submitting machine's view of a network filesystem.
const GRACE: Duration = Duration::from_secs(3);

/// `OUT/_runner/slurm`.
pub fn slurm_dir(out: &Path) -> PathBuf {
    runner_dir(out).join("slurm")
}

/// `OUT/_runner/slurm/<step id>`: the job scripts, the spec, the task
/// records and Slurm's own logs of one step instance.
fn step_dir(out: &Path, instance: &Instance) -> PathBuf {
    slurm_dir(out).join(&instance.id)
}

fn jobs_file(out: &Path) -> PathBuf {
    slurm_dir(out).join("jobs.jsonl")
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What a job runs: written at submission, read by `pipeline task`.
#[derive(Debug, Serialize, Deserialize)]
struct TaskSpec {
    /// The run directory.
    out: PathBuf,
    /// The step instance.
    instance: Instance,
    /// BLAKE3 of its stage binary (part of the cache key).
    binary_hash: String,
    /// The command line of each task.
    commands: Vec<Vec<String>>,
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
    /// The node (`SLURMD_NODENAME`).
    pub node: String,
}

/// One submitted job: a line of `jobs.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobEntry {
    /// Slurm job id (of the array, for a job array).
    pub job: String,
    /// The step instance.
    pub instance: String,
    /// `stage` or `merge`.
    pub kind: String,
    /// Tasks (array size; 1 for a plain job).
    pub tasks: u32,
    /// Jobs it waits for (`afterok`).
    pub after: Vec<String>,
    /// Unix time of the submission.
    pub submitted_unix: f64,
}

fn bad(message: String) -> RunnerError {
    RunnerError::Backend(message)
}

/// The file on `PATH` named `tool`.
fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(tool))
        .find(|path| path.is_file())
}

/// Runs a Slurm command and returns its standard output, or its exit code
/// and standard error.
fn slurm(tool: &str, args: &[String]) -> std::result::Result<String, String> {
    let output = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`{tool} {}` exited {}: {}",
            args.join(" "),
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A path made absolute against the working directory, `.` and `..`
/// resolved without touching the filesystem (outputs do not exist yet).
fn absolute(path: &Path, cwd: &Path) -> PathBuf {
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

/// One node as `sinfo` sees it.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    name: String,
    cpus: u32,
    mem_mb: u64,
    gpus: u32,
}

/// GPUs in a `sinfo %G` field: `gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:2,mps:100`
/// or `(null)`.
fn gres_gpus(gres: &str) -> u32 {
    gres.split(',')
        .filter(|entry| entry.starts_with("gpu"))
        .filter_map(|entry| {
            let entry = entry.split('(').next()?;
            entry.rsplit(':').next()?.parse::<u32>().ok()
        })
        .sum()
}

/// Reads `sinfo --Node --format=%N|%c|%m|%G` lines.
fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.trim().split('|').collect();
            let [name, cpus, mem, gres] = fields[..] else {
                return None;
            };
            Some(Node {
                name: name.to_string(),
                cpus: cpus.trim_end_matches('+').parse().ok()?,
                mem_mb: mem.trim_end_matches('+').parse().ok()?,
                gpus: gres_gpus(gres),
            })
        })
        .collect()
}

/// Whether a node can run one process of a step.
fn fits(node: &Node, resources: &Resources) -> bool {
    resources.cpus.unwrap_or(1) <= node.cpus
        && resources.mem_mb.unwrap_or(0) <= node.mem_mb
        && resources.gpus <= node.gpus
}

/// The bad input a Slurm run must not start with: Slurm's commands missing,
/// an unknown partition, a step no node can hold, a path outside the shared
/// roots.
fn preflight(plan: &Plan, backend: &Backend, options: &RunOptions, exe: &Path) -> Result<()> {
    for tool in TOOLS {
        if on_path(tool).is_none() {
            return Err(bad(format!(
                "`{tool}` is not on PATH: the Slurm backend submits with {}; run on a machine of the cluster (a login node) or use --backend local",
                TOOLS.join(", ")
            )));
        }
    }
    let partitions = slurm("sinfo", &["--noheader".into(), "--format=%P".into()])
        .map_err(|e| bad(format!("cannot list the cluster's partitions: {e}")))?;
    let partitions: Vec<&str> = partitions.lines().map(str::trim).collect();
    let default = partitions
        .iter()
        .find_map(|p| p.strip_suffix('*'))
        .map(str::to_string);
    let partition = match (&backend.partition, default) {
        (Some(p), _) => {
            if !partitions.iter().any(|q| q.trim_end_matches('*') == p) {
                return Err(bad(format!(
                    "{}:{}: [backend] partition `{p}` does not exist; the cluster's partitions: {}",
                    plan.file.display(),
                    backend.line,
                    partitions.join(", ")
                )));
            }
            p.clone()
        }
        (None, Some(p)) => p,
        (None, None) => {
            return Err(bad(format!(
                "the cluster has no default partition (partitions: {}): set [backend] partition",
                partitions.join(", ")
            )));
        }
    };
    let nodes = slurm(
        "sinfo",
        &[
            "--noheader".into(),
            "--Node".into(),
            format!("--partition={partition}"),
            "--format=%N|%c|%m|%G".into(),
        ],
    )
    .map_err(|e| {
        bad(format!(
            "cannot list the nodes of partition `{partition}`: {e}"
        ))
    })?;
    let nodes = parse_nodes(&nodes);
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
            "{}:{}: step `{}` asks for {} CPU(s), {} and {} GPU(s) per process; no node of partition `{partition}` has that ({}{})",
            plan.file.display(),
            instance.line,
            instance.step,
            r.cpus.unwrap_or(1),
            r.mem_mb
                .map_or("the default memory".to_string(), |m| format!("{m} MiB")),
            r.gpus,
            described.join("; "),
            if nodes.len() > 8 { "; …" } else { "" }
        )));
    }
    let cwd = std::env::current_dir().map_err(|e| RunnerError::io(".", e))?;
    if backend.shared.is_empty() {
        return Err(bad(format!(
            "{}: the Slurm backend needs [backend] shared = [\"/path\", …]: the roots of the filesystems every node sees; the run directory, the inputs, the binaries and the directory `pipeline` runs in must be under them",
            plan.file.display()
        )));
    }
    let roots: Vec<PathBuf> = backend.shared.iter().map(|r| absolute(r, &cwd)).collect();
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
        let full = absolute(&path, &cwd);
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

/// Refuses a run directory whose earlier Slurm jobs are still queued or
/// running (they would write into the steps a new run fills). Without
/// `squeue` on `PATH` this machine is not the cluster's, and there is
/// nothing to ask.
pub fn refuse_live_jobs(out: &Path) -> Result<()> {
    if !jobs_file(out).is_file() || on_path("squeue").is_none() {
        return Ok(());
    }
    let live = live_jobs(out)?;
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

/// The jobs of `out`'s earlier submissions that are still queued or running.
pub fn live_jobs(out: &Path) -> Result<Vec<JobEntry>> {
    let entries = read_jobs(out)?;
    if entries.is_empty() {
        return Ok(entries);
    }
    let ids: Vec<String> = entries.iter().map(|e| e.job.clone()).collect();
    let live = squeue(&ids).map_err(|e| {
        bad(format!(
            "{} lists Slurm jobs and squeue cannot say whether they still run: {e}",
            jobs_file(out).display()
        ))
    })?;
    Ok(entries
        .into_iter()
        .filter(|e| live.contains_key(&e.job))
        .collect())
}

fn read_jobs(out: &Path) -> Result<Vec<JobEntry>> {
    let path = jobs_file(out);
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

/// The states of the jobs among `ids` that are queued or running, by job
/// id (an array's tasks under the array's id). Jobs Slurm has forgotten
/// are simply absent.
fn squeue(ids: &[String]) -> std::result::Result<BTreeMap<String, Vec<String>>, String> {
    let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if ids.is_empty() {
        return Ok(live);
    }
    let args = vec![
        "--noheader".to_string(),
        "--array".to_string(),
        format!("--jobs={}", ids.join(",")),
        "--format=%F|%T".to_string(),
    ];
    match slurm("squeue", &args) {
        Ok(text) => {
            for line in text.lines() {
                if let Some((job, state)) = line.trim().split_once('|') {
                    live.entry(job.to_string())
                        .or_default()
                        .push(state.to_string());
                }
            }
            Ok(live)
        }
        // Every id is unknown to the controller: none is queued.
        Err(e) if e.contains("Invalid job id") => Ok(live),
        Err(e) => Err(e),
    }
}

/// `pipeline cancel OUT`: cancels the run's jobs that are queued or
/// running; returns their ids.
pub fn cancel(out: &Path) -> Result<Vec<String>> {
    if !jobs_file(out).is_file() {
        return Err(RunnerError::Usage(format!(
            "{} lists no Slurm jobs: {} was not run with --backend slurm",
            jobs_file(out).display(),
            out.display()
        )));
    }
    let live: Vec<String> = live_jobs(out)?.into_iter().map(|e| e.job).collect();
    if !live.is_empty() {
        slurm("scancel", &live).map_err(|e| RunnerError::Slurm(format!("cancelling: {e}")))?;
    }
    Ok(live)
}

/// Slurm expands `%` in `--output`; `%%` is a plain `%`.
fn slurm_path(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

fn quote(word: &str) -> String {
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
/// first of the GPUs Slurm grants the job.
fn slurm_device(device: &str) -> &'static str {
    if device == "cpu" { "cpu" } else { "cuda" }
}

/// The `sbatch` arguments of a step's stage job (`merge: false`) or merge job.
fn sbatch_args(
    plan: &Plan,
    backend: &Backend,
    instance: &Instance,
    merge: bool,
    after: &[String],
    cwd: &Path,
) -> Vec<String> {
    let dir = step_dir(&plan.out, instance);
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name={}:{}", plan.name, instance.id),
        format!("--chdir={}", cwd.display()),
        "--kill-on-invalid-dep=yes".to_string(),
    ];
    let log = if merge {
        "slurm-merge.out"
    } else if instance.shards > 1 {
        "slurm-%a.out"
    } else {
        "slurm-0.out"
    };
    args.push(format!("--output={}/{log}", slurm_path(&dir)));
    if !after.is_empty() {
        args.push(format!("--dependency=afterok:{}", after.join(":")));
    }
    if !merge && instance.shards > 1 {
        args.push(format!("--array=0-{}", instance.shards - 1));
    }
    let step = backend.steps.get(&instance.step);
    if let Some(partition) = &backend.partition {
        args.push(format!("--partition={partition}"));
    }
    if let Some(account) = &backend.account {
        args.push(format!("--account={account}"));
    }
    if let Some(time) = step.and_then(|s| s.time.as_ref()).or(backend.time.as_ref()) {
        args.push(format!("--time={time}"));
    }
    let r = &instance.resources;
    if merge {
        args.push("--cpus-per-task=1".to_string());
    } else {
        if let Some(cpus) = r.cpus {
            args.push(format!("--cpus-per-task={cpus}"));
        }
        if r.gpus > 0 {
            args.push(format!("--gres=gpu:{}", r.gpus));
        }
    }
    if let Some(mem) = r.mem_mb {
        args.push(format!("--mem={mem}M"));
    }
    args.extend(backend.sbatch.iter().cloned());
    if let Some(step) = step {
        args.extend(step.sbatch.iter().cloned());
    }
    args
}

/// The batch script of a stage or merge job: it runs `pipeline task`, and
/// lists the stage command of each task for whoever reads it.
fn script(
    plan: &Plan,
    instance: &Instance,
    spec: &Path,
    commands: &[Vec<String>],
    merge: bool,
    exe: &Path,
) -> String {
    let mut text = format!(
        "#!/bin/bash\n# pipeline {}: step {} ({}), run directory {}\n",
        plan.name,
        instance.id,
        instance.stage.name,
        plan.out.display()
    );
    if merge {
        text.push_str("# Merges the tables of the step's shards and writes its _step.json.\n");
    } else {
        text.push_str("# `pipeline task` runs the stage command of task $SLURM_ARRAY_TASK_ID (0 when not an array), records its exit status, and for a step of one process writes its _step.json:\n");
        for (i, command) in commands.iter().enumerate() {
            let words: Vec<String> = command.iter().map(|w| quote(w)).collect();
            text.push_str(&format!("#   task {i}: {}\n", words.join(" ")));
        }
    }
    // The runner's CPU list names CPUs of the machine it ran on.
    text.push_str("unset EMBODYFLOW_CPUS\n");
    text.push_str(&format!(
        "exec {} task {}{}\n",
        quote(&exe.display().to_string()),
        quote(&spec.display().to_string()),
        if merge { " --merge" } else { "" }
    ));
    text
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| RunnerError::io(path, e))
}

/// The state of a submitted step instance while the runner waits.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Pending,
    Running,
    Done(StepRecord),
    Failed(String),
    /// A step it reads failed: Slurm cancelled its jobs.
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

    fn finished(&self) -> bool {
        matches!(self, State::Done(_) | State::Failed(_) | State::NotRun(_))
    }
}

/// A submitted instance.
struct Submitted {
    index: usize,
    /// The stage job (array) and, for a sharded step, the merge job.
    jobs: Vec<String>,
    submitted_unix: f64,
    state: State,
    gone_since: Option<Instant>,
}

fn read_task(path: &Path) -> Option<TaskRecord> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Why a step whose jobs are gone left no record: a task's exit code and
/// log tail, or the tail of Slurm's log of a job that ended without an
/// exit status.
fn failure(out: &Path, instance: &Instance, jobs: &[String]) -> RunnerError {
    let dir = step_dir(out, instance);
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
                let log = dir.join(format!("slurm-{i}.out"));
                return RunnerError::JobFailed {
                    step: instance.id.clone(),
                    job: if instance.shards > 1 {
                        format!("{}_{i}", jobs[0])
                    } else {
                        jobs[0].clone()
                    },
                    what: "ended without an exit status (cancelled, or killed by Slurm: time limit, memory, node failure)".into(),
                    tail: exec::tail(&log, 10),
                    log,
                };
            }
        }
    }
    let log = dir.join(if instance.shards > 1 {
        "slurm-merge.out"
    } else {
        "slurm-0.out"
    });
    RunnerError::JobFailed {
        step: instance.id.clone(),
        job: jobs.last().cloned().unwrap_or_default(),
        what: if instance.shards > 1 {
            "its shards succeeded and its merge job wrote no record"
        } else {
            "its stage succeeded and the job wrote no record"
        }
        .into(),
        tail: exec::tail(&log, 10),
        log,
    }
}

/// Submits jobs and lists them in `jobs.jsonl` as it goes.
struct Submitter<'a> {
    plan: &'a Plan,
    backend: &'a Backend,
    cwd: &'a Path,
    exe: &'a Path,
    journal: Option<std::fs::File>,
    /// Every job submitted so far.
    jobs: Vec<String>,
}

impl Submitter<'_> {
    /// Submits one job with `sbatch` and appends it to `jobs.jsonl`.
    fn submit(
        &mut self,
        instance: &Instance,
        merge: bool,
        after: Vec<String>,
        script_path: &Path,
    ) -> Result<String> {
        let out = &self.plan.out;
        let mut args = sbatch_args(self.plan, self.backend, instance, merge, &after, self.cwd);
        args.push(script_path.display().to_string());
        let submitted_unix = now();
        let text = slurm("sbatch", &args)
            .map_err(|e| RunnerError::Slurm(format!("submitting step `{}`: {e}", instance.id)))?;
        let job = text
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        self.jobs.push(job.clone());
        let entry = JobEntry {
            job: job.clone(),
            instance: instance.id.clone(),
            kind: if merge { "merge" } else { "stage" }.into(),
            tasks: if merge { 1 } else { instance.shards },
            after,
            submitted_unix,
        };
        let journal = match &mut self.journal {
            Some(file) => file,
            None => self.journal.insert(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(jobs_file(out))
                    .map_err(|e| RunnerError::io(jobs_file(out), e))?,
            ),
        };
        let line = serde_json::to_string(&entry).expect("a job entry serialises") + "\n";
        journal
            .write_all(line.as_bytes())
            .map_err(|e| RunnerError::io(jobs_file(out), e))?;
        Ok(job)
    }

    /// Submits every instance of `to_run` (in plan order, so that the jobs
    /// of the steps it reads exist): its directory cleared, its spec and
    /// scripts written, its stage job and, when sharded, its merge job.
    fn submit_all(
        &mut self,
        to_run: &BTreeSet<usize>,
        options: &RunOptions,
        binaries: &BTreeMap<String, String>,
        submitted: &mut Vec<Submitted>,
    ) -> Result<()> {
        let plan = self.plan;
        let mut last_job: BTreeMap<usize, String> = BTreeMap::new();
        for &index in to_run {
            let instance = &plan.instances[index];
            exec::clear(instance)?;
            let dir = step_dir(&plan.out, instance);
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
                    exec::stage_command(instance, &bin, i, slurm_device(device))
                })
                .collect();
            let spec_path = dir.join("spec.json");
            let spec = TaskSpec {
                out: plan.out.clone(),
                instance: instance.clone(),
                binary_hash: binaries[instance.stage.name].clone(),
                commands,
            };
            write_file(
                &spec_path,
                &serde_json::to_string_pretty(&spec).expect("a task spec serialises"),
            )?;
            let after: Vec<String> = instance
                .deps
                .iter()
                .filter_map(|d| last_job.get(d).cloned())
                .collect();
            let submitted_unix = now();
            let stage_script = dir.join("stage.sh");
            write_file(
                &stage_script,
                &script(plan, instance, &spec_path, &spec.commands, false, self.exe),
            )?;
            let mut jobs = vec![self.submit(instance, false, after, &stage_script)?];
            if instance.shards > 1 {
                let merge_script = dir.join("merge.sh");
                write_file(
                    &merge_script,
                    &script(plan, instance, &spec_path, &spec.commands, true, self.exe),
                )?;
                jobs.push(self.submit(instance, true, vec![jobs[0].clone()], &merge_script)?);
            }
            last_job.insert(index, jobs.last().cloned().expect("a job"));
            submitted.push(Submitted {
                index,
                jobs,
                submitted_unix,
                state: State::Pending,
                gone_since: None,
            });
        }
        Ok(())
    }
}

/// Submits the steps that must run and waits for them; `say` receives a
/// line per step whenever its state changes.
pub fn run_plan(
    plan: &Plan,
    options: &RunOptions,
    backend: &Backend,
    poll: Duration,
    say: &mut dyn FnMut(&str),
) -> Result<RunOutcome> {
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| RunnerError::io("pipeline", e))?;
    preflight(plan, backend, options, &exe)?;
    let notes = crate::check::check_plan(plan, &options.bin_dir, options.dry_run)?;
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
    let from = match &options.from {
        Some(name) => plan.select(name)?.into_iter().next(),
        None => None,
    };
    let only = match &options.only {
        Some(name) => Some(plan.select(name)?),
        None => None,
    };

    // What runs: a miss, a forced step, or a step reading one that runs.
    let mut steps: Vec<StepOutcome> = Vec::new();
    let mut to_run: BTreeSet<usize> = BTreeSet::new();
    for (index, instance) in plan.instances.iter().enumerate() {
        let mut outcome = StepOutcome {
            index,
            status: Status::Cached,
            wall_s: 0.0,
            overhead_s: 0.0,
        };
        if let Some(only) = &only
            && !only.contains(&index)
        {
            if !options.dry_run && !instance.dir.join(cache::STEP_FILE).is_file() {
                return Err(RunnerError::Usage(format!(
                    "--only: step `{}` has not completed in {}; run the pipeline without --only first",
                    instance.id,
                    plan.out.display()
                )));
            }
            outcome.status = Status::Kept;
            steps.push(outcome);
            continue;
        }
        let forced =
            from.is_some_and(|f| index >= f) || only.as_ref().is_some_and(|o| o.contains(&index));
        let blocked = instance.deps.iter().any(|d| to_run.contains(d));
        let hit = match binaries.get(instance.stage.name) {
            Some(hash) if !forced && !blocked => {
                let (key, _) = cache::step_key(instance, hash)?;
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
    let cwd = std::env::current_dir().map_err(|e| RunnerError::io(".", e))?;
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
            let args = sbatch_args(plan, backend, instance, false, &[], &cwd);
            say(&format!(
                "  sbatch {}{}{}",
                args[1..].join(" "),
                if after.is_empty() {
                    String::new()
                } else {
                    format!(" --dependency=afterok:<{}>", after.join(", "))
                },
                if instance.shards > 1 {
                    " (and a merge job afterok on the array)"
                } else {
                    ""
                }
            ));
        }
        return Ok(RunOutcome {
            steps,
            notes,
            check_s,
            binary_hash_s,
            total_s: started.elapsed().as_secs_f64(),
        });
    }

    let mut submitter = Submitter {
        plan,
        backend,
        cwd: &cwd,
        exe: &exe,
        journal: None,
        jobs: Vec::new(),
    };
    let mut submitted: Vec<Submitted> = Vec::new();
    if let Err(e) = submitter.submit_all(&to_run, options, &binaries, &mut submitted) {
        if !submitter.jobs.is_empty() {
            let _ = slurm("scancel", &submitter.jobs);
            say(&format!(
                "cancelled the jobs submitted before the failure: {}",
                submitter.jobs.join(", ")
            ));
        }
        return Err(e);
    }
    for s in &submitted {
        say(&line(
            s.index,
            "submitted",
            &format!("job {}", s.jobs.join(" + merge ")),
        ));
    }

    // Wait, saying each change.
    let ids: Vec<String> = submitted.iter().flat_map(|s| s.jobs.clone()).collect();
    let mut squeue_errors = 0usize;
    let mut failures: Vec<RunnerError> = Vec::new();
    while submitted.iter().any(|s| !s.state.finished()) {
        std::thread::sleep(poll);
        let live = match squeue(&ids) {
            Ok(live) => {
                squeue_errors = 0;
                live
            }
            Err(e) => {
                squeue_errors += 1;
                if squeue_errors == 1 {
                    say(&format!("squeue failed (retrying): {e}"));
                }
                continue;
            }
        };
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
            let instance = &plan.instances[s.index];
            let states: Vec<&String> = s
                .jobs
                .iter()
                .filter_map(|j| live.get(j))
                .flatten()
                .collect();
            let record = std::fs::read_to_string(instance.dir.join(cache::STEP_FILE))
                .ok()
                .and_then(|t| serde_json::from_str::<StepRecord>(&t).ok());
            let mut error = None;
            let new = if let Some(record) = record {
                State::Done(record)
            } else if let Some(dep) = instance.deps.iter().find(|d| failed.contains(d)) {
                State::NotRun(plan.instances[*dep].id.clone())
            } else if states
                .iter()
                .any(|st| matches!(st.as_str(), "RUNNING" | "COMPLETING" | "CONFIGURING"))
            {
                State::Running
            } else if !states.is_empty() {
                // A sharded step whose merge job waits has been running.
                if s.state == State::Running {
                    State::Running
                } else {
                    State::Pending
                }
            } else if instance.deps.iter().any(|d| unfinished.contains(d)) {
                // Slurm cancels a job whose input failed: wait for the verdict on it.
                s.state.clone()
            } else {
                let gone = *s.gone_since.get_or_insert_with(Instant::now);
                let why = failure(&plan.out, instance, &s.jobs);
                if matches!(why, RunnerError::StageFailed { .. }) || gone.elapsed() >= GRACE {
                    let text = why.to_string();
                    error = Some(why);
                    State::Failed(text)
                } else {
                    s.state.clone()
                }
            };
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
                _ => (new.word(), format!("job {}", s.jobs.join(" + merge "))),
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
    if let Some(figures) = queue_figures(&plan.out, &read_jobs(&plan.out)?, &ids) {
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
/// times and the task records: from submission to start of the jobs that
/// waited for nothing, and from the end of the last job a job waited for to
/// its start. `None` when no job of the submission started.
pub fn queue_figures(out: &Path, entries: &[JobEntry], ids: &[String]) -> Option<String> {
    let plan_dirs: BTreeMap<&str, &JobEntry> = entries
        .iter()
        .filter(|e| ids.contains(&e.job))
        .map(|e| (e.job.as_str(), e))
        .collect();
    // Start and end of every task of a job.
    let tasks = |entry: &JobEntry| -> Vec<TaskRecord> {
        let dir = slurm_dir(out).join(&entry.instance);
        if entry.kind == "merge" {
            read_task(&dir.join("merge.json")).into_iter().collect()
        } else {
            (0..entry.tasks)
                .filter_map(|i| read_task(&dir.join(format!("task-{i}.json"))))
                .collect()
        }
    };
    let mut to_start = Vec::new();
    let mut after_end = Vec::new();
    for entry in plan_dirs.values() {
        let starts: Vec<f64> = tasks(entry).iter().map(|t| t.started_unix).collect();
        if entry.after.is_empty() {
            to_start.extend(starts.iter().map(|s| s - entry.submitted_unix));
            continue;
        }
        let ends: Option<Vec<f64>> = entry
            .after
            .iter()
            .map(|dep| {
                let dep = plan_dirs.get(dep.as_str())?;
                let ends: Vec<f64> = tasks(dep).iter().filter_map(|t| t.ended_unix).collect();
                (ends.len() as u32 == dep.tasks).then(|| ends.into_iter().fold(f64::MIN, f64::max))
            })
            .collect();
        if let Some(ends) = ends {
            let ready = ends.into_iter().fold(entry.submitted_unix, f64::max);
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
        "slurm queue: {}; {}",
        describe("submission to start", &mut to_start),
        describe("end of the jobs waited for to start", &mut after_end)
    ))
}

/// `pipeline task SPEC [--merge]`, in a job on a node: runs the stage
/// command of task `$SLURM_ARRAY_TASK_ID` (0 outside an array) and records
/// its exit status; a step of one process is then checked and recorded as
/// locally. With `merge`, merges the shards' tables and records the step.
pub fn task(spec_path: &Path, merge: bool) -> Result<()> {
    let text = std::fs::read_to_string(spec_path).map_err(|e| RunnerError::io(spec_path, e))?;
    let spec: TaskSpec = serde_json::from_str(&text)
        .map_err(|e| bad(format!("{}: not a task spec: {e}", spec_path.display())))?;
    let dir = spec_path.parent().unwrap_or(Path::new("."));
    let i: u32 = match std::env::var("SLURM_ARRAY_TASK_ID") {
        Ok(id) if !merge => id
            .parse()
            .map_err(|_| bad(format!("SLURM_ARRAY_TASK_ID `{id}` is not a task number")))?,
        _ => 0,
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
        node: std::env::var("SLURMD_NODENAME").unwrap_or_default(),
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
            let key = cache::step_key(instance, &spec.binary_hash)?;
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
    let bin = Path::new(&command[0]);
    let started = Instant::now();
    let status = exec::spawn(bin, &command[1..], &log, &[])?
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
        let key = cache::step_key(instance, &spec.binary_hash)?;
        exec::complete(instance, key, spec.commands.clone(), wall)?;
    }
    Ok(())
}

/// The merge job of a sharded step: every shard succeeded (Slurm started
/// it `afterok`, the task records say so too), their tables merged, the
/// logs moved in, the record written.
fn finish_sharded(spec: &TaskSpec, dir: &Path) -> Result<()> {
    let instance = &spec.instance;
    if exec::is_empty(instance.skip_if_empty.as_deref())? {
        exec::pass_on(instance)?;
        let key = cache::step_key(instance, &spec.binary_hash)?;
        return exec::complete(instance, key, Vec::new(), 0.0);
    }
    let mut span = (f64::MAX, f64::MIN);
    for i in 0..instance.shards {
        let path = dir.join(format!("task-{i}.json"));
        let record = read_task(&path)
            .filter(|t| t.code == Some(0))
            .ok_or_else(|| {
                RunnerError::Slurm(format!(
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
    let key = cache::step_key(instance, &spec.binary_hash)?;
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

    #[test]
    fn gpus_are_counted_from_sinfo_gres() {
        for (gres, gpus) in [
            ("(null)", 0),
            ("gpu:4", 4),
            ("gpu:a100:4(S:0-1)", 4),
            ("gpu:a100:2,gpu:v100:1", 3),
            ("gpu:2,mps:100", 2),
            ("mps:100", 0),
        ] {
            assert_eq!(gres_gpus(gres), gpus, "{gres}");
        }
        let nodes = parse_nodes("vm|2|24105|(null)\ng1|64+|512000|gpu:h100:8(S:0-1)\n");
        assert_eq!(nodes[1].gpus, 8);
        assert_eq!(nodes[1].cpus, 64);
        let ask = |cpus, mem_mb, gpus| Resources {
            cpus: Some(cpus),
            mem_mb: Some(mem_mb),
            gpus,
        };
        assert!(fits(&nodes[0], &ask(2, 24105, 0)));
        assert!(!fits(&nodes[0], &ask(3, 100, 0)));
        assert!(!fits(&nodes[0], &ask(1, 100, 1)));
        assert!(fits(&nodes[1], &ask(8, 100, 8)));
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
}
