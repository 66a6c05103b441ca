//! The pipeline runner (`pipeline` binary): runs the stage binaries as a
//! pipeline file says, skips every step whose inputs, config and binary are
//! unchanged, runs sharded steps as parallel processes (each on its own share
//! of the CPUs, [`exec`]) and merges their tables, expands sweeps over saved
//! rollouts, and writes a run report.
//!
//! ```text
//! pipeline run pipelines/household-grpo.toml --out runs/grpo [--dry-run]
//!          [--from STEP] [--only STEP] [--set var=value] [--set step.key=value]
//!          [--sweep var=a,b] [--backend local|slurm|ray]
//! pipeline cancel runs/grpo              # cancel the run's queued and running Slurm or Ray jobs
//! pipeline stages [--markdown]           # the stages a step may name (README's stage table)
//! ```
//!
//! # Pipeline files (TOML)
//!
//! ```toml
//! [pipeline]
//! name = "example"                      # defaults to the file stem
//! keep_workers = 2                      # Gymnasium bridge workers kept warm across
//!                                       # the steps (local backend, [`workers`])
//!
//! [vars]                                # `${name}` in any string; `--set name=value`
//! tasks = "runs/data/train"
//! lr = 3e-5
//!
//! [renamed]                             # former names: `--set learning_rate=…` exits 2,
//! learning_rate = "lr"                  # "variable `learning_rate` was renamed `lr`"
//!
//! [[step]]                              # setup steps run once, in order
//! name = "init"
//! stage = "init-policy"                 # a stage of embodyflow_core::spec::STAGES
//! seed = 0
//! set = { "model.n_layer" = 2 }         # --set model.n_layer=2 (nested tables flatten)
//!
//! [loop]                                # the iteration loop
//! iterations = 4                        # or "${iterations}"
//! init_policy = "${init}/policy"        # `${policy}` in iteration 0
//! policy = "${update}/policy"           # `${policy}` in the next iteration
//!
//! [[loop.step]]
//! name = "collect"
//! stage = "collect-rollouts"
//! policy = "${policy}"
//! inputs = ["${tasks}"]                 # paths, or `${step}` = that step's output dir
//! seed = "${iter}"
//! set = { iteration = "${iter}", group_size = 8 }
//! shards = 2                            # two processes at once, --shard 0/2 and 1/2,
//!                                       # each on its own half of the CPUs
//! devices = ["cpu"]                     # given to the shards in turn
//!
//! [[loop.step]]
//! name = "eval"
//! stage = "evaluate"
//! policy = "${update}/policy"
//! every = 4                             # iterations 3, 7, … and the last
//! when = "lr != 0"                      # run only when a variable has a value
//!
//! [sweep]                               # one cell per combination (keys sorted)
//! lr = [1e-5, 3e-5]                     # or on the command line: --sweep lr=1e-5,3e-5
//! ```
//!
//! Step fields: `name`, `stage`, `inputs`, `policy`, `teacher`, `config`,
//! `set`, `seed`, `shards`, `devices`, `every` (loop steps), `when`
//! (`VAR == VALUE` / `VAR != VALUE`), `instead` (setup steps with a
//! `when`: the directory `${step}` stands for where the step does not run,
//! e.g. an earlier run's output of the same stage), `args` (extra flags as
//! they are),
//! and what one process needs: `cpus` (also its thread count, on every
//! backend; 1 when the step says none), `mem`, `gpus` ([`backend`]). A
//! `[backend]` table says where the processes run: this
//! machine ([`exec`], the default), a Slurm cluster ([`slurm`]) or a Ray
//! cluster ([`ray`]), each implementing the backend interface
//! ([`cluster::Backend`]) and listed once in [`registry`]; the two clusters
//! share the submission, the wait and the reports ([`cluster`]).
//! Templates: `${var}`, `${step}` (an earlier step's output directory; in a
//! loop step, this iteration's instance), `${iter}`, `${policy}`, `${out}`
//! (the run directory). `${iter}` and `${policy}` (the iteration's policy)
//! exist in loop steps only: a pipeline without a `[loop]` may declare
//! variables of those names (an offline pipeline's `policy`, the checkpoint
//! it starts from), one with a loop may not; `out` is never a variable. An `inputs` entry naming a step that does not run
//! (its `when` or `every`) is left out; any other field naming one is an
//! error, unless the step has an `instead`, which it then names. Relative
//! paths are relative to the working directory.
//!
//! # Layout of a run
//!
//! `OUT/<step>/` (setup), `OUT/it<i>/<step>/` (loop), with `@var=value,…`
//! appended when a step depends on swept variables (directly or through what
//! it reads): cells agreeing on those share the step, so a sweep over
//! rewards and estimators collects its rollouts once. Each step directory
//! holds the stage's outputs, `_stage.log` (`_stage.<i>.log` and
//! `_shards/<i>/` for a sharded step; the log of a failed step stays in
//! `OUT/_runner/logs/`), and `_step.json`, the cache record ([`cache`]).
//! `OUT/report/` holds the run report ([`report`]) and the run log, every
//! step's scalars as CSV and TensorBoard event files ([`runlog`]).
//!
//! # Before any stage runs
//!
//! The file is parsed with a line number on every error (unknown field,
//! stage, `${name}`, sweep key; `shards`, `policy` or `teacher` on a stage
//! whose declaration, [`embodyflow_core::spec`], does not take it), the plan
//! is built (at most [`plan::MAX_INSTANCES`] step instances; a path read
//! from an earlier step's directory must be something its stage declares it
//! writes), every path a step reads that no step writes must exist, every
//! stage is asked to resolve its config with `--print-config` ([`check`]):
//! an unknown `--set` key or a bad value is reported at its line in the
//! pipeline file; and every table a stage reads always, or under a `key =
//! value` condition its resolved config meets, must be among its inputs.
//! The resolved configs, not the argument lists, are what the step cache
//! keys on ([`cache`]), with the numerics each step computes with.
//!
//! A run killed at any point resumes: complete steps are cache hits, the
//! step that was running has no `_step.json` and runs again from scratch.
//! Stage processes die with the runner, even under `kill -9` of the runner
//! alone, and a resumed run starts only once they are gone ([`exec`]).

pub mod backend;
pub mod cache;
pub mod check;
pub mod cluster;
pub mod error;
pub mod exec;
#[cfg(test)]
mod fake;
pub mod figures;
pub mod local;
pub mod pipeline;
pub mod plan;
pub mod ray;
pub mod registry;
pub mod report;
pub mod runlog;
pub mod slurm;
pub mod tfevents;
pub mod watch;
pub mod workers;

use std::path::PathBuf;

pub use error::{Result, RunnerError};

/// Command line of `pipeline`.
#[derive(Debug, clap::Parser)]
#[command(name = "pipeline", version, about = "Run embodyflow pipeline files")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run a pipeline (or with --dry-run, print its plan and what is cached).
    Run {
        /// The pipeline file.
        file: PathBuf,
        /// Run directory.
        #[arg(long)]
        out: PathBuf,
        /// Print the plan and which steps are cached; run nothing.
        #[arg(long)]
        dry_run: bool,
        /// Rerun this step (name or instance id) and everything after it.
        #[arg(long, value_name = "STEP")]
        from: Option<String>,
        /// Run only this step's instances; the others must be complete.
        #[arg(long, value_name = "STEP", conflicts_with = "from")]
        only: Option<String>,
        /// `var=value` or `step.key=value`; repeatable.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// `var=a,b,…`: sweep a variable over these values (one cell per
        /// combination with the file's `[sweep]`, whose axis of the same
        /// variable it replaces); repeatable.
        #[arg(long = "sweep", value_name = "VAR=A,B")]
        sweeps: Vec<String>,
        /// Directory of the stage binaries (default: beside this binary).
        #[arg(long, value_name = "DIR")]
        bin_dir: Option<PathBuf>,
        /// Where the stage processes run (default: the file's `[backend]
        /// kind`, else local).
        #[arg(long, value_parser = registry::possible_values())]
        backend: Option<String>,
        /// Slurm, Ray: seconds between two looks at the queue.
        #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
        poll: f64,
    },
    /// List the stages a pipeline step may name: each with what it does,
    /// or with --markdown a table of what each reads, loads, writes and
    /// whether it shards (README.md's stage table).
    Stages {
        /// Print the Markdown table.
        #[arg(long)]
        markdown: bool,
    },
    /// Cancel the queued and running Slurm or Ray jobs of a run directory.
    Cancel {
        /// The run directory.
        out: PathBuf,
    },
    /// Run one task of a step in a cluster job (the jobs call it).
    #[command(hide = true)]
    Task {
        /// The step's `spec.json`.
        spec: PathBuf,
        /// Merge the shards' tables instead of running a shard.
        #[arg(long)]
        merge: bool,
        /// The task (shard) to run (default: `$SLURM_ARRAY_TASK_ID`, else 0).
        #[arg(long, conflicts_with = "merge")]
        index: Option<u32>,
    },
}

fn default_bin_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("target/release"))
}

/// Runs the command line.
pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Run {
            file,
            out,
            dry_run,
            from,
            only,
            sets,
            sweeps,
            bin_dir,
            backend,
            poll,
        } => {
            let started = std::time::Instant::now();
            let mut pipeline = pipeline::Pipeline::load(&file)?;
            let chosen = registry::chosen(&pipeline, backend.as_deref())?;
            if let Some((_, line)) = pipeline.keep_workers
                && chosen.name() != "local"
            {
                return Err(RunnerError::Pipeline {
                    file: file.clone(),
                    line,
                    message: format!(
                        "`keep_workers` (under [pipeline]) keeps the Gymnasium bridge's workers on this machine across steps, which the local backend alone can do, not `{}`: remove it to run there",
                        chosen.name()
                    ),
                });
            }
            pipeline.sweep_from_command_line(&sweeps)?;
            let overrides = plan::Overrides::parse(&pipeline, &sets)?;
            let plan = plan::Plan::build(&pipeline, &out, &overrides)?;
            let plan_s = started.elapsed().as_secs_f64();
            let options = exec::RunOptions {
                bin_dir: bin_dir.unwrap_or_else(default_bin_dir),
                dry_run,
                from,
                only,
            };
            println!(
                "pipeline {} ({}): {} steps, {} sweep cell(s), run directory {}",
                plan.name,
                file.display(),
                plan.instances.len(),
                plan.cells.len(),
                out.display()
            );
            if chosen.queued() && (!poll.is_finite() || poll <= 0.0) {
                return Err(RunnerError::Usage(format!(
                    "--poll {poll}: expected a positive number of seconds"
                )));
            }
            let log = runlog::Live::new(&plan);
            let run = cluster::Run {
                plan: &plan,
                options: &options,
                table: &pipeline.backend,
                poll: std::time::Duration::try_from_secs_f64(poll).unwrap_or_default(),
                backends: registry::BACKENDS,
                log: (!dry_run).then_some(&log),
            };
            let outcome = chosen.run_plan(&run, &mut |line| println!("{line}"))?;
            for note in &outcome.notes {
                println!("note: {note}");
            }
            if dry_run {
                let would = outcome
                    .steps
                    .iter()
                    .filter(|s| s.status == exec::Status::WouldRun)
                    .count();
                println!(
                    "dry run: {would} step(s) would run, {} cached",
                    outcome.steps.len() - would
                );
                for step in &outcome.steps {
                    if step.status == exec::Status::WouldRun {
                        let instance = &plan.instances[step.index];
                        println!(
                            "  {} {} --out {}",
                            instance.stage.name,
                            instance.stage_args().join(" "),
                            instance.dir.display()
                        );
                    }
                }
                return Ok(());
            }
            let report = report::write_report(&plan, &outcome, plan_s)?;
            print!("{report}");
            Ok(())
        }
        Command::Stages { markdown } => {
            if markdown {
                print!("{}", embodyflow_core::spec::markdown_table());
            } else {
                for stage in embodyflow_core::spec::STAGES {
                    println!("{:<20} {}", stage.name, stage.purpose);
                }
            }
            Ok(())
        }
        Command::Cancel { out } => {
            let cancelled = cluster::cancel(&out, registry::BACKENDS)?;
            if cancelled.is_empty() {
                println!("no job of {} is queued or running", out.display());
            } else {
                println!(
                    "cancelled {} job(s) of {}: {}",
                    cancelled.len(),
                    out.display(),
                    cancelled.join(", ")
                );
            }
            Ok(())
        }
        Command::Task { spec, merge, index } => cluster::task(&spec, merge, index),
    }
}
