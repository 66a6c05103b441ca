//! What a cluster job runs on its node: `pipeline task SPEC [--index I]
//! [--merge]` ([`task`]) reads the step's `spec.json` ([`TaskSpec`],
//! written by the runner before submission), runs the local backend's very
//! command line of its shard ([`crate::exec::stage_command`]) and records
//! its exit status and times ([`TaskRecord`]); a step of one process is then
//! checked and recorded as locally, and a sharded step's merge job merges
//! the shards' tables and writes `_step.json`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use embodyflow_core::numerics::{CpuCapability, best_capability};

use super::journal::{TaskRecord, bad, now, read_task, write_file};
use crate::cache::{self, KeyInputs};
use crate::error::{Result, RunnerError};
use crate::exec;
use crate::plan::Instance;

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
    use crate::plan::one_step;

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
    fn words_are_quoted_for_the_shell_only_when_needed() {
        assert_eq!(quote("--set"), "--set");
        assert_eq!(quote("match.mode=exact"), "match.mode=exact");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }
}
