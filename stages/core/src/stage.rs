//! The frame of a stage run: config resolved and inputs found before any work,
//! outputs checked before any work, tables written with lineage, and a
//! readable summary at the end. Every output of a run — its tables, a
//! checkpoint, the summary — is committed together by [`Stage::commit`]
//! ([`crate::commit`]): a run that fails or is killed before that leaves
//! nothing a reader accepts, and one killed during it is completed by the next
//! reader.
//!
//! [`Stage::start`] also sets up the process's threads and CPUs for the pool
//! the stage's spec declares ([`crate::threads`]: `threads`,
//! `omp_wait_policy`, `EMBODYFLOW_CPUS`; a torch stage may re-execute itself
//! there), and [`Stage::commit`] ends the summary with what it ran with.
//!
//! ```no_run
//! # use embodyflow_core::{stage::{Stage, StageConfig, OutputConfig, Summary}, cli::StageArgs};
//! # use embodyflow_schemas::{TableName, RewardRow};
//! #[derive(serde::Serialize, serde::Deserialize, Default)]
//! #[serde(default)]
//! struct Config { output: OutputConfig, reward_coef: f64 }
//! impl StageConfig for Config {
//!     const KEYS: &'static [(&'static str, &'static str)] = &[("reward_coef", "reward of a success")];
//!     fn output(&self) -> &OutputConfig { &self.output }
//! }
//!
//! # fn run(args: &StageArgs) -> embodyflow_core::Result<()> {
//! let spec = &embodyflow_core::spec::SCORE_REWARDS;
//! let stage = Stage::<Config>::start(spec, env!("CARGO_PKG_VERSION"), args)?;
//! stage.check_outputs(&[TableName::Rewards])?;      // exit 2 before work if it exists
//! let trajectories = stage.input(TableName::Trajectories)?; // recorded as lineage
//! let mut writer = stage.writer(TableName::Rewards)?;
//! # let rows: Vec<RewardRow> = vec![];
//! writer.write_rows(&rows)?;
//! stage.finish(writer)?;                           // staged, not yet visible
//! let mut summary = Summary::new("score-rewards");
//! summary.add("rows", trajectories.num_rows());
//! stage.commit(&summary)?;                           // every output at once

//! # Ok(()) }
//! ```

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Mutex;

use embodyflow_schemas::TableName;

use crate::cli::StageArgs;
use crate::commit::{self, Commit, Digest};
use crate::config::{ConfigReport, load_stage_config};
pub use crate::config::{OutputConfig, StageConfig};
use crate::dataset::{TableReader, TableWriter, WriteOptions};
use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::manifest::{InputRef, Manifest, Producer};
use crate::spec::{Sharding, StageSpec};
use crate::threads::Applied;

/// A running stage.
pub struct Stage<C> {
    /// Stage binary name.
    pub name: &'static str,
    /// Stage version.
    pub version: &'static str,
    /// The command line.
    pub args: StageArgs,
    /// The resolved config.
    pub config: C,
    config_json: serde_json::Value,
    threads: Applied,
    inputs: Inputs,
    read: Mutex<Vec<InputRef>>,
    pending: Mutex<Commit>,
    /// The outputs of an interrupted earlier run whose commit this run
    /// completed (in [`Self::start`], before its inputs are opened).
    completed: Vec<String>,
}

impl<C: StageConfig> Stage<C> {
    /// Resolves the config and finds the input tables; fails before any work.
    ///
    /// With `--print-config` it prints the [`ConfigReport`] as JSON and ends
    /// the process (exit 0 when the config resolves, 2 when it does not)
    /// before looking at any input. `spec` declares the stage
    /// ([`crate::spec`]): one that cannot shard refuses `--shard i/n` with
    /// n > 1 (a usage error) instead of doing the whole work. Then the
    /// process's threads and CPUs are set up for the stage's pool
    /// ([`crate::threads::apply`]; a torch stage whose OpenMP environment
    /// differs re-executes itself here, before any input is opened).
    pub fn start(
        spec: &'static StageSpec,
        version: &'static str,
        args: &StageArgs,
    ) -> Result<Stage<C>> {
        let name = spec.name;
        if let Sharding::Refused(why) = spec.sharding
            && args.shard.count > 1
        {
            return Err(Error::Usage(format!(
                "{name} --shard {}: this stage cannot shard ({why}); run it once, without --shard",
                args.shard
            )));
        }
        if args.print_config {
            let report = ConfigReport::for_stage::<C>(
                spec.name,
                spec.threads,
                version,
                args.config.as_deref(),
                &args.sets,
            );
            println!(
                "{}",
                serde_json::to_string(&report).expect("a config report serialises")
            );
            std::process::exit(if report.problem.is_none() { 0 } else { 2 });
        }
        let resolved = load_stage_config::<C>(spec.threads, args.config.as_deref(), &args.sets)?;
        let threads = crate::threads::apply(name, spec.threads, &resolved.threads)?;
        // Before the inputs, which may share the output directory.
        let completed = commit::settle(&args.out)?;
        let inputs = Inputs::resolve(&args.inputs)?;
        tracing::info!(stage = name, out = %args.out.display(), shard = %args.shard, "starting");
        Ok(Stage {
            name,
            version,
            args: args.clone(),
            config: resolved.config,
            config_json: resolved.json,
            threads,
            inputs,
            read: Mutex::new(Vec::new()),
            pending: Mutex::new(Commit::new(&args.out)),
            completed,
        })
    }

    /// The threads and CPUs this run computes with.
    pub fn threads(&self) -> &Applied {
        &self.threads
    }

    /// Opens an input table and records it as lineage of every output.
    pub fn input(&self, table: TableName) -> Result<TableReader> {
        let reader = self.inputs.table(table)?;
        self.read
            .lock()
            .expect("lineage lock")
            .push(reader.input_ref());
        Ok(reader)
    }

    /// Opens an input table if present (recorded as lineage when it is).
    pub fn optional_input(&self, table: TableName) -> Result<Option<TableReader>> {
        let reader = self.inputs.optional(table)?;
        if let Some(reader) = &reader {
            self.read
                .lock()
                .expect("lineage lock")
                .push(reader.input_ref());
        }
        Ok(reader)
    }

    /// Fails when an output table exists and `--overwrite` was not given.
    /// An interrupted earlier run is settled first (its commit completed, its
    /// staged leftovers removed), so a rerun after a kill simply works: when
    /// the outputs that exist are those of a commit this run completed, and
    /// that run was this one's twin (same producer record — stage, version,
    /// resolved config, seed, shard — and read the inputs this run finds, by
    /// content hash), it fails with [`Error::AlreadyDone`]: exit 0, nothing
    /// to do.
    pub fn check_outputs(&self, tables: &[TableName]) -> Result<()> {
        let names: Vec<&str> = tables.iter().map(|t| t.as_str()).collect();
        self.check_output_names(&names)
    }

    /// [`Self::check_outputs`] for outputs that are not tables (`policy`).
    pub fn check_output_names(&self, names: &[&str]) -> Result<()> {
        let mut completed = commit::clean_stale(&self.args.out)?;
        completed.extend(self.completed.iter().cloned());
        if self.args.overwrite {
            return Ok(());
        }
        let out = &self.args.out;
        let existing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| out.join(name).exists())
            .collect();
        let Some(first) = existing.first() else {
            return Ok(());
        };
        if existing
            .iter()
            .all(|name| completed.iter().any(|c| c == name))
            && self.made_by_twin(&existing)?
        {
            return Err(Error::AlreadyDone(format!(
                "{}: an identical earlier run of {} {} (same config, seed, shard and inputs) was killed while committing {}; its commit is now complete, nothing to do",
                out.display(),
                self.name,
                self.version,
                existing.join(", ")
            )));
        }
        Err(Error::OutputExists(out.join(first)))
    }

    /// Whether the tables among the outputs `names` were written by a run
    /// identical to this one: the same producer record, and a lineage that
    /// is what this run's inputs hold now. False when none is a table.
    fn made_by_twin(&self, names: &[&str]) -> Result<bool> {
        let producer = self.producer();
        let mut tables = 0;
        for name in names {
            let dir = self.args.out.join(name);
            if !crate::manifest::is_table_dir(&dir) {
                continue;
            }
            let manifest = Manifest::read(&dir)?;
            if manifest.producer != producer || !self.inputs.hold(&manifest.inputs)? {
                return Ok(false);
            }
            tables += 1;
        }
        Ok(tables > 0)
    }

    /// Starts writing an output table.
    pub fn writer(&self, table: TableName) -> Result<TableWriter> {
        let output = self.config.output();
        let options = WriteOptions {
            rows_per_shard: output.rows_per_shard,
            row_group_rows: output.row_group_rows,
            zstd_level: output.zstd_level,
        };
        TableWriter::create(&self.args.out, table, options, self.args.overwrite)
    }

    /// The producer record of this run.
    pub fn producer(&self) -> Producer {
        Producer {
            stage: self.name.to_string(),
            version: self.version.to_string(),
            config: self.config_json.clone(),
            seed: self.args.seed,
            shard: self.args.shard.to_string(),
        }
    }

    /// Completes an output table with this run's producer and lineage; it
    /// becomes visible with the run's other outputs at [`Self::commit`].
    pub fn finish(&self, writer: TableWriter) -> Result<Manifest> {
        let lineage = self.read.lock().expect("lineage lock").clone();
        let (manifest, table_commit) = writer
            .finish_staged(&self.producer(), &lineage)?
            .into_parts();
        self.pending
            .lock()
            .expect("commit lock")
            .absorb(table_commit)?;
        tracing::info!(table = %manifest.table, rows = manifest.num_rows, shards = manifest.shards.len(), "staged table");
        Ok(manifest)
    }

    /// Adds a complete, fsynced output that is not a table (a checkpoint
    /// directory) staged at `staged` (a hidden name in the output directory),
    /// to be committed as `target`, identified by `digest`.
    pub fn stage_output(&self, staged: &str, target: &str, digest: Digest) -> Result<()> {
        self.pending
            .lock()
            .expect("commit lock")
            .add(staged, target, digest, self.args.overwrite)
    }

    /// The summary as Markdown, ended by the lines of
    /// [`Applied::summary_lines`] (what a stage that commits its summary
    /// itself writes).
    pub fn summary_text(&self, summary: &Summary) -> String {
        let mut summary = summary.clone();
        for (key, value) in self.threads.summary_lines() {
            summary.add(key, value);
        }
        summary.to_markdown()
    }

    /// Writes the summary, ended by the lines of [`Applied::summary_lines`]
    /// (threads, CPUs, OpenMP wait policy), to `<out>/_summary.<stage>.md`
    /// and commits it with every staged output at once; then prints it.
    /// Returns the summary path.
    pub fn commit(&self, summary: &Summary) -> Result<PathBuf> {
        let text = self.summary_text(summary);
        let out = &self.args.out;
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        let name = format!("_summary.{}.md", self.name);
        let staged = commit::staging_name(&name);
        let staged_path = out.join(&staged);
        let mut pending = self.pending.lock().expect("commit lock");
        let mut run = std::mem::replace(&mut *pending, Commit::new(out));
        drop(pending);
        run.add(&staged, &name, Digest::File, true)?; // removed with the rest on failure
        commit::fault_error("stage:summary", rustix::io::Errno::NOSPC)
            .and_then(|_| std::fs::write(&staged_path, &text))
            .and_then(|_| std::fs::File::open(&staged_path)?.sync_all())
            .map_err(|e| Error::io(&staged_path, e))?;
        run.apply()?;
        print!("{text}");
        Ok(out.join(name))
    }
}

/// A run's readable summary: a title and key/value lines, as Markdown.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    title: String,
    lines: Vec<(String, String)>,
}

impl Summary {
    /// An empty summary titled `title`.
    pub fn new(title: impl Into<String>) -> Summary {
        Summary {
            title: title.into(),
            lines: Vec::new(),
        }
    }

    /// Adds one line.
    pub fn add(&mut self, key: impl Into<String>, value: impl Display) -> &mut Summary {
        self.lines.push((key.into(), value.to_string()));
        self
    }

    /// The summary as a Markdown table.
    pub fn to_markdown(&self) -> String {
        let mut text = format!("## {}\n\n| | |\n|---|---|\n", self.title);
        for (key, value) in &self.lines {
            text.push_str(&format!("| {key} | {value} |\n"));
        }
        text
    }
}
