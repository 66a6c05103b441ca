//! The frame of a stage run: config resolved and inputs found before any work,
//! outputs checked before any work, tables written with lineage, and a
//! readable summary at the end.
//!
//! ```no_run
//! # use embodyflow_core::{stage::{Stage, StageConfig, OutputConfig, Summary}, cli::StageArgs};
//! # use embodyflow_schemas::{TableName, RewardRow};
//! #[derive(serde::Serialize, serde::Deserialize, Default)]
//! #[serde(default)]
//! struct Config { output: OutputConfig, reward_coef: f64 }
//! impl StageConfig for Config { fn output(&self) -> &OutputConfig { &self.output } }
//!
//! # fn run(args: &StageArgs) -> embodyflow_core::Result<()> {
//! let stage = Stage::<Config>::start("score-rewards", env!("CARGO_PKG_VERSION"), args)?;
//! stage.check_outputs(&[TableName::Rewards])?;      // exit 2 before work if it exists
//! let trajectories = stage.input(TableName::Trajectories)?; // recorded as lineage
//! let mut writer = stage.writer(TableName::Rewards)?;
//! # let rows: Vec<RewardRow> = vec![];
//! writer.write_rows(&rows)?;
//! stage.finish(writer)?;
//! let mut summary = Summary::new("score-rewards");
//! summary.add("rows", trajectories.num_rows());
//! stage.write_summary(&summary)?;
//! # Ok(()) }
//! ```

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Mutex;

use embodyflow_schemas::TableName;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::cli::StageArgs;
use crate::config::{ConfigReport, load_config};
use crate::dataset::{TableReader, TableWriter, WriteOptions};
use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::manifest::{InputRef, Manifest, Producer};

/// How a stage lays out the tables it writes (`output.*` keys of every stage).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutputConfig {
    /// Rows per Parquet shard file.
    pub rows_per_shard: usize,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
    /// zstd level (1-22).
    pub zstd_level: i32,
}

impl Default for OutputConfig {
    fn default() -> Self {
        let d = WriteOptions::default();
        OutputConfig {
            rows_per_shard: d.rows_per_shard,
            row_group_rows: d.row_group_rows,
            zstd_level: d.zstd_level,
        }
    }
}

/// A stage's config type.
pub trait StageConfig: Serialize + DeserializeOwned + Default {
    /// The output layout settings.
    fn output(&self) -> &OutputConfig;

    /// Checks what the types do not: ranges (a group size of at least 1, a
    /// temperature above 0, a probability in [0, 1]) and relations between
    /// keys, each failure a [`Error::BadValue`] naming the dotted key, what
    /// was expected and what was found (see the helpers in
    /// [`crate::config`]). [`crate::config::load_config`] calls it after
    /// `output.*` is checked, so `--print-config`, the runner's pre-check and
    /// the run reject the same values before any work. Reads no file.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
}

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
    inputs: Inputs,
    read: Mutex<Vec<InputRef>>,
}

impl<C: StageConfig> Stage<C> {
    /// Resolves the config and finds the input tables; fails before any work.
    ///
    /// With `--print-config` it prints the [`ConfigReport`] as JSON and ends
    /// the process (exit 0 when the config resolves, 2 when it does not)
    /// before looking at any input.
    pub fn start(name: &'static str, version: &'static str, args: &StageArgs) -> Result<Stage<C>> {
        if args.print_config {
            let report =
                ConfigReport::resolve::<C>(name, version, args.config.as_deref(), &args.sets);
            println!(
                "{}",
                serde_json::to_string(&report).expect("a config report serialises")
            );
            std::process::exit(if report.problem.is_none() { 0 } else { 2 });
        }
        let resolved = load_config::<C>(args.config.as_deref(), &args.sets)?;
        let inputs = Inputs::resolve(&args.inputs)?;
        tracing::info!(stage = name, out = %args.out.display(), shard = %args.shard, "starting");
        Ok(Stage {
            name,
            version,
            args: args.clone(),
            config: resolved.config,
            config_json: resolved.json,
            inputs,
            read: Mutex::new(Vec::new()),
        })
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
    pub fn check_outputs(&self, tables: &[TableName]) -> Result<()> {
        for table in tables {
            let dir = self.args.out.join(table.as_str());
            if dir.exists() && !self.args.overwrite {
                return Err(Error::OutputExists(dir));
            }
        }
        Ok(())
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

    /// Completes an output table with this run's producer and lineage.
    pub fn finish(&self, writer: TableWriter) -> Result<Manifest> {
        let lineage = self.read.lock().expect("lineage lock").clone();
        let manifest = writer.finish(&self.producer(), &lineage)?;
        tracing::info!(table = %manifest.table, rows = manifest.num_rows, shards = manifest.shards.len(), "wrote table");
        Ok(manifest)
    }

    /// Prints the summary and writes it to `<out>/_summary.<stage>.md`.
    pub fn write_summary(&self, summary: &Summary) -> Result<PathBuf> {
        let text = summary.to_markdown();
        print!("{text}");
        let path = self.args.out.join(format!("_summary.{}.md", self.name));
        std::fs::create_dir_all(&self.args.out).map_err(|e| Error::io(&self.args.out, e))?;
        let tmp = path.with_extension("md.tmp");
        std::fs::write(&tmp, &text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        Ok(path)
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
