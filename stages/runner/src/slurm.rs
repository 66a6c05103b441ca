//! The Slurm backend (`pipeline run FILE --out DIR --backend slurm`): the
//! steps the cache says must run are handed to an existing Slurm cluster,
//! the very command lines the local backend runs ([`exec::stage_command`]).
//!
//! Each such step instance becomes one `sbatch` job, a sharded step one job
//! array (task `i` runs shard `i`, `--shard $SLURM_ARRAY_TASK_ID/n`) and a
//! small merge job `afterok` on the array; a step's jobs wait `afterok` for
//! the last job of every step it reads, and `--kill-on-invalid-dep=yes`
//! lets Slurm cancel what depends on a failed job. A job asks for the step's
//! `cpus`, `mem` and `gpus` ([`crate::backend`]; `--cpus-per-task`, always,
//! one when the step says none; `--mem`, `--gres=gpu:N`), and a CUDA device
//! becomes `--device cuda`, the first of the GPUs Slurm grants (it sets
//! `CUDA_VISIBLE_DEVICES`). Its stage process computes with as many threads
//! as the step's `cpus`, whatever the node has, and at the runner's libtorch
//! dispatch level ([`crate::cache::process_environment`]), as locally.
//!
//! A job runs `pipeline task SPEC` on its node ([`cluster::task`]): the stage command
//! of its shard, its log in `OUT/_runner/logs/<step>/<i>.log` as locally,
//! then a record of its exit status and times (`task-<i>.json`), and for a
//! step of one process the checks, the log moves and `_step.json` that the
//! local backend writes; the merge job (`pipeline task SPEC --merge`)
//! merges the shards' tables and writes `_step.json`. So the cluster
//! finishes a submitted pipeline on its own, and records appear as on a
//! local run.
//!
//! The runner meanwhile prints each step's state as it changes (pending,
//! running, done, failed, from `squeue` and the step records; the wait and
//! the reports are the Ray backend's too, [`crate::cluster`]) and reports a
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
//! Each step's Slurm directory (`OUT/_runner/slurm/<step>/`) keeps the
//! batch scripts (`stage.sh`, `merge.sh`) and the `sbatch` command of each
//! job as submitted (`sbatch.sh`, [`SBATCH_FILE`]), so a job can be
//! resubmitted by hand.
//!
//! Every node must see the run directory, the inputs, the binaries and the
//! directory `pipeline` runs in (jobs start there): `[backend] shared`
//! names the roots of such filesystems, and a path outside them is bad
//! input, as is a missing `sbatch`, an unknown partition, or a step asking
//! for more CPUs, memory or GPUs than any node of the partition has. All of
//! that is checked before the first job is submitted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::config::{ConfigKeys, keys_of};
use serde::Deserialize;

use crate::backend::Table;
use crate::cluster::journal::{Journal, bad, jobs_file, now, read_jobs, step_dir, write_file};
use crate::cluster::nodes::{Node, check_fits, check_shared};
use crate::cluster::task::quote;
use crate::cluster::{self, Backend, JobEntry, JobState, Lost, Queue, Run, Submitted};
use crate::error::{Result, RunnerError};
use crate::exec::{RunOptions, RunOutcome};
use crate::plan::{Instance, Plan};

/// `OUT/_runner/slurm`.
const NAME: &str = "slurm";

/// The `[backend]` keys Slurm reads.
#[derive(Debug, Clone, Default, Deserialize, ConfigKeys)]
struct Settings {
    /// Slurm partition (default: the cluster's default partition).
    partition: Option<String>,
    /// Slurm account.
    account: Option<String>,
    /// Time limit of every job (`02:00:00`).
    time: Option<String>,
    /// Extra `sbatch` flags of every job.
    #[serde(default)]
    sbatch: Vec<String>,
}

/// The `[backend.step.NAME]` keys Slurm reads.
#[derive(Debug, Clone, Default, Deserialize, ConfigKeys)]
struct StepSettings {
    /// Its jobs' time limit (replaces the backend's).
    time: Option<String>,
    /// Extra `sbatch` flags, after the backend's.
    #[serde(default)]
    sbatch: Vec<String>,
}

/// Slurm's settings of a run: the `[backend]` table's and each step's.
struct Config {
    settings: Settings,
    steps: BTreeMap<String, StepSettings>,
    /// Line of `[backend]`.
    line: usize,
}

impl Config {
    fn of(table: &Table) -> std::result::Result<Config, String> {
        let steps = table
            .steps
            .keys()
            .map(|name| Ok((name.clone(), table.step_settings(name)?)))
            .collect::<std::result::Result<_, String>>()?;
        Ok(Config {
            settings: table.settings()?,
            steps,
            line: table.line,
        })
    }
}

/// The Slurm backend, as the registry lists it.
pub struct SlurmCluster;

/// The Slurm backend.
pub static SLURM: SlurmCluster = SlurmCluster;

impl Backend for SlurmCluster {
    fn name(&self) -> &'static str {
        NAME
    }

    fn title(&self) -> &'static str {
        "Slurm"
    }

    fn about(&self) -> &'static str {
        "A Slurm cluster: one job (or job array) per step"
    }

    fn keys(&self) -> Vec<(String, &'static str)> {
        keys_of::<Settings>()
    }

    fn step_keys(&self) -> Vec<(String, &'static str)> {
        keys_of::<StepSettings>()
    }

    fn check(&self, table: &Table) -> std::result::Result<(), String> {
        Config::of(table).map(|_| ())
    }

    fn queued(&self) -> bool {
        true
    }

    fn run_plan(&self, run: &Run, say: &mut dyn FnMut(&str)) -> Result<RunOutcome> {
        let mut queue = Slurm {
            config: Config::of(run.table).map_err(bad)?,
            table: run.table,
            cwd: std::env::current_dir().map_err(|e| RunnerError::io(".", e))?,
            exe: std::env::current_exe().map_err(|e| RunnerError::io("pipeline", e))?,
            journal: Journal::new(&run.plan.out, NAME),
            submitted: false,
        };
        cluster::run_plan(run, self, &mut queue, say)
    }

    fn live_jobs(&self, out: &Path) -> Result<Vec<JobEntry>> {
        live_jobs(out)
    }

    fn cancel(&self, out: &Path) -> Result<Vec<String>> {
        cancel(out)
    }
}

/// The Slurm commands the backend uses.
const TOOLS: [&str; 4] = ["sbatch", "squeue", "scancel", "sinfo"];

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

/// The bad input a Slurm run must not start with: Slurm's commands missing,
/// an unknown partition, a step no node can hold, a path outside the shared
/// roots.
fn preflight(
    plan: &Plan,
    table: &Table,
    config: &Config,
    options: &RunOptions,
    exe: &Path,
) -> Result<()> {
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
    let partition = match (&config.settings.partition, default) {
        (Some(p), _) => {
            if !partitions.iter().any(|q| q.trim_end_matches('*') == p) {
                return Err(bad(format!(
                    "{}:{}: [backend] partition `{p}` does not exist; the cluster's partitions: {}",
                    plan.file.display(),
                    config.line,
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
    check_fits(
        plan,
        &parse_nodes(&nodes),
        &format!("partition `{partition}`"),
    )?;
    check_shared(plan, table, options, exe, "Slurm")
}

/// The jobs of `out`'s earlier Slurm submissions that are still queued or
/// running. Without `squeue` on `PATH` this machine is not the cluster's,
/// and there is nothing to ask.
fn live_jobs(out: &Path) -> Result<Vec<JobEntry>> {
    let entries = read_jobs(out, NAME)?;
    if entries.is_empty() || on_path("squeue").is_none() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = entries.iter().map(|e| e.job.clone()).collect();
    let live = squeue(&ids).map_err(|e| {
        bad(format!(
            "{} lists Slurm jobs and squeue cannot say whether they still run: {e}",
            jobs_file(out, NAME).display()
        ))
    })?;
    Ok(entries
        .into_iter()
        .filter(|e| live.contains_key(&e.job))
        .collect())
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

/// Cancels the run's Slurm jobs that are queued or running; returns their
/// ids.
fn cancel(out: &Path) -> Result<Vec<String>> {
    let live: Vec<String> = live_jobs(out)?.into_iter().map(|e| e.job).collect();
    if !live.is_empty() {
        slurm("scancel", &live).map_err(|e| RunnerError::Cluster {
            backend: "Slurm",
            message: format!("cancelling: {e}"),
        })?;
    }
    Ok(live)
}

/// Slurm expands `%` in `--output`; `%%` is a plain `%`.
fn slurm_path(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

/// The `sbatch` arguments of a step's stage job (`merge: false`) or merge job.
fn sbatch_args(
    plan: &Plan,
    config: &Config,
    instance: &Instance,
    merge: bool,
    after: &[String],
    cwd: &Path,
) -> Vec<String> {
    let dir = step_dir(&plan.out, NAME, instance);
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
    let backend = &config.settings;
    let step = config.steps.get(&instance.step);
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
        // Always: the CPUs are the step's thread count too.
        args.push(format!("--cpus-per-task={}", r.cpus_or_default()));
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

/// The file in a step's Slurm directory that keeps the `sbatch` command of
/// each of its jobs, as submitted.
pub const SBATCH_FILE: &str = "sbatch.sh";

/// Appends the `sbatch` command of a job (its arguments `args`, the batch
/// script last) to the step's [`SBATCH_FILE`], so that a job can be
/// resubmitted by hand: `bash sbatch.sh` (or one of its lines) submits
/// again from the directory `pipeline` ran in.
fn keep_command(dir: &Path, cwd: &Path, args: &[String]) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(SBATCH_FILE);
    let new = !path.exists();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| RunnerError::io(&path, e))?;
    let mut text = String::new();
    if new {
        text.push_str(&format!(
            "#!/bin/bash\n# The sbatch commands of this step's jobs, as `pipeline run` submitted them.\n# To resubmit a job by hand, run its line again (drop a --dependency on jobs that are gone).\ncd {}\n",
            quote(&cwd.display().to_string())
        ));
    }
    let words: Vec<String> = args.iter().map(|w| quote(w)).collect();
    text.push_str(&format!("sbatch {}\n", words.join(" ")));
    file.write_all(text.as_bytes())
        .map_err(|e| RunnerError::io(&path, e))
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

/// The Slurm side of the shared wait: every instance is submitted in the
/// first round, chained with `afterok`.
struct Slurm<'a> {
    config: Config,
    table: &'a Table,
    cwd: PathBuf,
    exe: PathBuf,
    journal: Journal,
    submitted: bool,
}

impl Slurm<'_> {
    /// Submits one job with `sbatch` and appends it to `jobs.jsonl`.
    fn submit(
        &mut self,
        plan: &Plan,
        instance: &Instance,
        merge: bool,
        after: Vec<String>,
        script_path: &Path,
    ) -> Result<String> {
        let mut args = sbatch_args(plan, &self.config, instance, merge, &after, &self.cwd);
        args.push(script_path.display().to_string());
        keep_command(&step_dir(&plan.out, NAME, instance), &self.cwd, &args)?;
        let submitted_unix = now();
        let text = slurm("sbatch", &args).map_err(|e| RunnerError::Cluster {
            backend: "Slurm",
            message: format!("submitting step `{}`: {e}", instance.id),
        })?;
        let job = text
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        self.journal.append(&JobEntry {
            job: job.clone(),
            instance: instance.id.clone(),
            kind: if merge { "merge" } else { "stage" }.into(),
            tasks: if merge { 1 } else { instance.shards },
            first: 0,
            after,
            submitted_unix,
            address: None,
        })?;
        Ok(job)
    }
}

impl Queue for Slurm<'_> {
    fn submits_when_ready(&self) -> bool {
        false
    }

    fn preflight(&mut self, plan: &Plan, options: &RunOptions, exe: &Path) -> Result<()> {
        preflight(plan, self.table, &self.config, options, exe)
    }

    fn describe(&self, plan: &Plan, instance: &Instance, after: &[String]) -> String {
        let args = sbatch_args(plan, &self.config, instance, false, &[], &self.cwd);
        format!(
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
        )
    }

    /// Submits every instance in the first round (in plan order, so that
    /// the jobs of the steps it reads exist): its stage job (array) and,
    /// when sharded, its merge job.
    fn advance(&mut self, plan: &Plan, submitted: &mut [Submitted]) -> Result<Vec<usize>> {
        if self.submitted {
            return Ok(Vec::new());
        }
        self.submitted = true;
        let mut last_job: BTreeMap<usize, String> = BTreeMap::new();
        let mut new = Vec::new();
        for (k, s) in submitted.iter_mut().enumerate() {
            let instance = &plan.instances[s.index];
            let dir = step_dir(&plan.out, NAME, instance);
            let after: Vec<String> = instance
                .deps
                .iter()
                .filter_map(|d| last_job.get(d).cloned())
                .collect();
            s.submitted_unix = now();
            let stage_script = dir.join("stage.sh");
            write_file(
                &stage_script,
                &script(plan, instance, &s.spec, &s.commands, false, &self.exe),
            )?;
            let job = self.submit(plan, instance, false, after, &stage_script)?;
            s.jobs.push(job.clone());
            if instance.shards > 1 {
                let merge_script = dir.join("merge.sh");
                write_file(
                    &merge_script,
                    &script(plan, instance, &s.spec, &s.commands, true, &self.exe),
                )?;
                let merge = self.submit(plan, instance, true, vec![job], &merge_script)?;
                s.jobs.push(merge);
            }
            s.label = format!("job {}", s.jobs.join(" + merge "));
            last_job.insert(s.index, s.jobs.last().cloned().expect("a job"));
            new.push(k);
        }
        Ok(new)
    }

    fn live(
        &mut self,
        ids: &[String],
    ) -> std::result::Result<BTreeMap<String, Vec<JobState>>, String> {
        Ok(squeue(ids)?
            .into_iter()
            .map(|(job, states)| {
                let states = states
                    .iter()
                    .map(|s| match s.as_str() {
                        "RUNNING" | "COMPLETING" | "CONFIGURING" => JobState::Running,
                        _ => JobState::Queued,
                    })
                    .collect();
                (job, states)
            })
            .collect())
    }

    /// Slurm's log of the job (of the array task).
    fn lost(
        &mut self,
        out: &Path,
        instance: &Instance,
        jobs: &[String],
        task: Option<u32>,
    ) -> Lost {
        let dir = step_dir(out, NAME, instance);
        match task {
            Some(i) => Lost {
                job: if instance.shards > 1 {
                    format!("{}_{i}", jobs[0])
                } else {
                    jobs[0].clone()
                },
                what: "ended without an exit status (cancelled, or killed by Slurm: time limit, memory, node failure)".into(),
                log: dir.join(format!("slurm-{i}.out")),
            },
            None => Lost {
                job: jobs.last().cloned().unwrap_or_default(),
                what: String::new(),
                log: dir.join(if instance.shards > 1 {
                    "slurm-merge.out"
                } else {
                    "slurm-0.out"
                }),
            },
        }
    }

    fn cancel(&mut self, ids: &[String]) -> std::result::Result<(), String> {
        slurm("scancel", ids).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sbatch_commands_are_kept_to_resubmit_by_hand() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = Path::new("/shared/me/work dir");
        let stage = [
            "--parsable".to_string(),
            "--job-name=p:it0/collect@lr=1e-5".to_string(),
            "--cpus-per-task=2".to_string(),
            "/shared/run/_runner/slurm/collect/stage.sh".to_string(),
        ];
        keep_command(dir.path(), cwd, &stage).unwrap();
        let merge = [
            "--dependency=afterok:41".to_string(),
            "/shared/run/_runner/slurm/collect/merge.sh".to_string(),
        ];
        keep_command(dir.path(), cwd, &merge).unwrap();
        let text = std::fs::read_to_string(dir.path().join(SBATCH_FILE)).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "cd '/shared/me/work dir'",
                "sbatch --parsable --job-name=p:it0/collect@lr=1e-5 --cpus-per-task=2 /shared/run/_runner/slurm/collect/stage.sh",
                "sbatch --dependency=afterok:41 /shared/run/_runner/slurm/collect/merge.sh",
            ]
        );
        // A shell reads it back as the same words.
        let output = Command::new("bash")
            .arg("-n")
            .arg(dir.path().join(SBATCH_FILE))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
    }

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
        assert_eq!(nodes[0].mem_mb, 24105);
    }
}
