//! The `table` tool: the data contract from the command line.
//!
//! ```text
//! table schema [NAME]                         tables, or one table's columns and example rows
//! table import --table NAME --from F.jsonl --out DIR [--overwrite]
//!                                              JSON lines (one row each) -> a table
//! table import --format verl|trl --from DUMP.jsonl --tokenizer T --out DIR [--chat-template DIR]
//!       [--group-column KEY | --group-size N | --group-by-prompt] [--split S] [--temperature T]
//! table import --format parquet --from F.parquet... --column ROLE=COLUMN... [--tokenizer T] --out DIR
//!                                              another trainer's rollouts -> tasks,
//!                                              trajectories, steps, rewards (`foreign`)
//! table import --format libero-hdf5 --from F.hdf5... --tokenizer T --chunk-len K --out DIR
//!                                              LIBERO's demonstrations -> tasks, trajectories,
//!                                              steps (`libero_hdf5`)
//! table replay F.hdf5 [--demo demo_N]... [--steps S]
//!                                              a demonstration's actions replayed through the
//!                                              LIBERO adapter from its initial state
//! table show DIR [--limit N] [--columns a,b]  rows as JSON lines
//! table manifest DIR                          the manifest as JSON (shards, hashes, producer, lineage)
//! table validate DIR... [--deep]              decode every shard, refuse files the manifest
//!                                              does not list; --deep also re-hashes, and
//!                                              checks imported trajectories' source_row
//! table merge OUT IN... [--overwrite]         the shards of one run -> the unsharded tables
//! table export DIR --format csv|jsonl [--out FILE]
//!                                              every row as CSV or JSON lines (stdout without --out)
//! table export ADV --format verl --trajectories DIR [--rewards DIR] [--out FILE]
//!                                              advantages keyed by uid, step, sample_index (`foreign`)
//! ```
//! `export` writes what other tools read. `jsonl`: one JSON object per row,
//! the `table import` format (so `table import` reads it back to the same
//! table). `csv` (RFC 4180: comma-separated, `"`-quoted where a cell holds a
//! comma, quote or line break, quotes doubled, `\n` line ends): a header
//! with the schema's column names in schema order, then one record per row;
//! a null is an empty cell, numbers and booleans are written as in JSON,
//! strings as they are, and a list or binary cell is its JSON text (binary as
//! an array of byte values), e.g. `"[0.5,-1.25]"` — `json.loads` /
//! `pl.col(c).str.json_decode()` turn it back into a list.
//! `import` reads rows in the format `table schema NAME` prints (binary
//! columns as arrays of byte values), so external suites and simulators can
//! bring their own tasks; a missing `--from` file or a bad line (named by its
//! number) is bad input: exit 2, nothing written.
//!
//! `merge` joins the outputs of a stage run by hand as `--shard 0/n` …
//! `--shard n-1/n` (make, Slurm): each IN is a table directory, or a stage's
//! `--out` directory whose every table is merged (all committed together,
//! as the stage commits them). The result is the unsharded run's table, byte
//! for byte (`embodyflow_core::dataset::stage_merged_table`): parts of other
//! tables, schema versions, stage versions, configs, seeds or inputs, a
//! missing or repeated shard, and a row key in two parts are refused.
//!
//! ```text
//! collect-rollouts --shard 0/2 --out runs/it0/_shards/0 …   # on one node
//! collect-rollouts --shard 1/2 --out runs/it0/_shards/1 …   # on another
//! table merge runs/it0/rollouts runs/it0/_shards/0 runs/it0/_shards/1
//! ```

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use embodyflow_core::commit::{self, Commit};
use embodyflow_core::dataset::{
    TableReader, TableWriter, WriteOptions, batch_to_rows, stage_merged_table,
};
use embodyflow_core::manifest::{MANIFEST_FILE, Manifest, Producer, is_table_dir};
use embodyflow_core::schemas::{
    Examples, Row, TableName, TrajectoryRow, format_type, with_row_type,
};
use embodyflow_core::{Error, Result, progress};

pub mod foreign;
pub mod libero_hdf5;
mod rows;

use rows::{csv_cell, f32_columns, json_text, refused_row};

/// Command line of `table`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "table",
    version,
    about = "Inspect, import and validate embodyflow tables"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// List the tables, or show one table's columns and example rows.
    Schema {
        /// Table name.
        name: Option<TableName>,
    },
    /// Import JSON lines (one row per line) as a table, another trainer's
    /// rollout dump (`--format verl|trl|parquet`) as tasks, trajectories, steps and rewards,
    /// or LIBERO's HDF5 demonstrations (`--format libero-hdf5`) as tasks, trajectories and steps.
    Import {
        /// Table the rows belong to (rows in our own format).
        #[arg(long, required_unless_present = "format", conflicts_with = "format")]
        table: Option<TableName>,
        /// A trainer's dump instead: veRL rollout/validation JSON lines, TRL-style
        /// JSON lines, Parquet with `--column`; or LIBERO's HDF5 demonstrations.
        #[arg(long)]
        format: Option<ImportFormat>,
        /// JSON-lines file; with `--format parquet`, one or more Parquet files
        /// (`--from a.parquet b.parquet`), with `--format libero-hdf5` one or
        /// more HDF5 files (one task each), read in order.
        #[arg(long, value_name = "FILE", required = true, num_args = 1..)]
        from: Vec<PathBuf>,
        /// `--format`: tokenizer.json (or a directory holding one) that tokenises the texts
        /// (`parquet`: needed only for text columns without token ids).
        #[arg(long, value_name = "DIR_OR_TOKENIZER_JSON", requires = "format")]
        tokenizer: Option<PathBuf>,
        /// `--format trl|parquet`: model directory whose chat template
        /// (chat_template.jinja or tokenizer_config.json) renders prompts given
        /// as chat messages (default: the --tokenizer's directory).
        #[arg(long, value_name = "DIR", requires = "format")]
        chat_template: Option<PathBuf>,
        /// `--format parquet`: ROLE=COLUMN, repeated; roles: prompt, prompt_ids,
        /// response, response_ids, reward, token_rewards, response_mask, values,
        /// step, group. Needs reward or token_rewards, prompt or prompt_ids,
        /// response or response_ids; `group=C` is --group-column C.
        #[arg(long = "column", value_name = "ROLE=COLUMN", requires = "format")]
        columns: Vec<String>,
        /// `--format`: the key whose value names a row's group (veRL default: `uid`).
        #[arg(long, requires = "format", conflicts_with = "group_size")]
        group_column: Option<String>,
        /// `--format`: groups are this many consecutive rows (veRL's rollout.n).
        #[arg(long, requires = "format", conflicts_with = "group_by_prompt")]
        group_size: Option<std::num::NonZeroUsize>,
        /// `--format`: rows of one step with the same prompt form a group (TRL's and Parquet's default).
        #[arg(long, requires = "format", conflicts_with = "group_column")]
        group_by_prompt: bool,
        /// `--format libero-hdf5`: actions per decision (the policy's chunk_len, K).
        #[arg(long, value_name = "K", requires = "format")]
        chunk_len: Option<usize>,
        /// `--format`: the split of the imported tasks.
        #[arg(long, default_value = "train", requires = "format")]
        split: String,
        /// `--format`: sampling temperature recorded in trajectories (the dumps do not hold it).
        #[arg(long, default_value_t = 1.0, requires = "format")]
        temperature: f32,
        /// Output directory; the table is written to DIR/<table>.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace the table if it exists.
        #[arg(long)]
        overwrite: bool,
        /// Rows per Parquet shard file.
        #[arg(long, default_value_t = WriteOptions::default().rows_per_shard)]
        rows_per_shard: usize,
        /// Rows per Parquet row group.
        #[arg(long, default_value_t = WriteOptions::default().row_group_rows)]
        row_group_rows: usize,
    },
    /// Replay LIBERO demonstrations (an HDF5 file) through the LIBERO
    /// adapter from each demo's initial state, and report how far the
    /// replayed observations and states are from the file's.
    Replay {
        /// The demonstration file.
        file: PathBuf,
        /// Only these demos (`demo_0`; repeated); all by default.
        #[arg(long = "demo", value_name = "NAME")]
        demos: Vec<String>,
        /// Replay at most this many actions of each demo (all by default).
        #[arg(long, value_name = "N")]
        steps: Option<usize>,
    },
    /// Print a table's rows as JSON lines.
    Show {
        /// Table directory.
        dir: PathBuf,
        /// Print at most this many rows.
        #[arg(long)]
        limit: Option<usize>,
        /// Only these columns (comma-separated).
        #[arg(long, value_delimiter = ',')]
        columns: Vec<String>,
    },
    /// Merge the shards of one stage run (`--shard i/n`) into the unsharded tables.
    Merge {
        /// Output directory; each table is written to OUT/<table>.
        out: PathBuf,
        /// The parts: table directories, or stage output directories holding
        /// the same tables.
        #[arg(required = true)]
        parts: Vec<PathBuf>,
        /// Replace tables that exist.
        #[arg(long)]
        overwrite: bool,
    },
    /// Write every row of a table as CSV or JSON lines, or advantages for veRL/TRL users.
    Export {
        /// Table directory.
        dir: PathBuf,
        /// `csv` (header of column names; lists as JSON text), `jsonl` (the
        /// import format) or `verl` (advantages keyed by uid, step, sample_index).
        #[arg(long)]
        format: ExportFormat,
        /// `verl`: the trajectories table (uid, step and sample_index of each row).
        #[arg(long, value_name = "DIR")]
        trajectories: Option<PathBuf>,
        /// `verl`: a rewards table whose score is written as `rescored`.
        #[arg(long, value_name = "DIR", requires = "trajectories")]
        rewards: Option<PathBuf>,
        /// `verl`: the tasks table of an import, whose prompt's SHA-256 is
        /// written as `prompt_sha256` (the join checks it).
        #[arg(long, value_name = "DIR", requires = "trajectories")]
        tasks: Option<PathBuf>,
        /// Write to this file instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print a table's manifest (shards, hashes, producer, lineage) as JSON.
    Manifest {
        /// Table directory.
        dir: PathBuf,
    },
    /// Decode every shard of each table and check it against the schema;
    /// a file in the directory that the manifest does not list is an error
    /// (dataset readers would take its rows for the table's).
    Validate {
        /// Table directories.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Also recompute every shard's content hash, and check that the
        /// `source_row`s of a trajectories table number its dump's rows
        /// (unique, below the count of trajectories that have one).
        #[arg(long)]
        deep: bool,
    },
}

/// What `table import --format` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
    /// veRL's `rollout_data_dir` / `validation_data_dir` JSON lines.
    Verl,
    /// TRL / prime-rl / open-instruct JSON lines (prompt, completion, reward).
    Trl,
    /// Any Parquet file, its columns named with `--column ROLE=COLUMN`.
    Parquet,
    /// LIBERO's HDF5 demonstration files (LIBERO's own and OpenVLA's
    /// regenerations), read with h5py in the bridge's Python.
    LiberoHdf5,
}

impl ImportFormat {
    /// The trainer's dump format, for the formats `foreign` reads.
    fn dump(self) -> Option<foreign::Source> {
        match self {
            ImportFormat::Verl => Some(foreign::Source::Verl),
            ImportFormat::Trl => Some(foreign::Source::Trl),
            ImportFormat::Parquet => Some(foreign::Source::Parquet),
            ImportFormat::LiberoHdf5 => None,
        }
    }
}

/// The row-by-row export formats (any table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowFormat {
    Csv,
    Jsonl,
}

/// Where `table export` sends a table: row by row, or joined for veRL.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    Rows(RowFormat),
    Verl(&'a Path),
}

/// What `table export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Comma-separated values with a header (RFC 4180).
    Csv,
    /// One JSON object per line (the `table import` format).
    Jsonl,
    /// Advantages as JSON lines keyed by uid, step and sample_index
    /// (`foreign::export_verl`), for veRL and TRL users.
    Verl,
}

/// Runs the tool: one named phase per subcommand.
pub fn run(args: Args) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.command {
        Command::Schema { name } => schema(name, &mut out),
        Command::Import {
            table,
            format,
            from,
            tokenizer,
            chat_template,
            columns,
            group_column,
            group_size,
            group_by_prompt,
            split,
            temperature,
            chunk_len,
            out: out_dir,
            overwrite,
            rows_per_shard,
            row_group_rows,
        } => {
            let options = WriteOptions {
                rows_per_shard,
                row_group_rows,
                ..WriteOptions::default()
            };
            if let Some(table) = table {
                return import_rows(table, &from, &out_dir, options, overwrite, &mut out);
            }
            let format = format.ok_or_else(|| {
                Error::Usage(
                    "table import: give --table NAME or --format verl|trl|parquet|libero-hdf5"
                        .into(),
                )
            })?;
            let Some(source) = format.dump() else {
                let tokenizer = tokenizer.ok_or_else(|| {
                    Error::Usage(format!(
                        "table import --format {}: --tokenizer DIR_OR_TOKENIZER_JSON is required (the policy's: the instruction is tokenised with it)",
                        libero_hdf5::FORMAT
                    ))
                })?;
                let chunk_len = chunk_len.ok_or_else(|| {
                    Error::Usage(format!(
                        "table import --format {}: --chunk-len K is required (the policy's chunk_len: actions per decision)",
                        libero_hdf5::FORMAT
                    ))
                })?;
                let import = libero_hdf5::ImportOptions {
                    from,
                    tokenizer,
                    chunk_len,
                    split,
                    python: embodyflow_gym::BridgeConfig::python(None),
                };
                return import_demos(&import, &out_dir, options, overwrite, &mut out);
            };
            if chunk_len.is_some() {
                return Err(Error::Usage(format!(
                    "table import --format {}: --chunk-len goes with --format {} only",
                    source.name(),
                    libero_hdf5::FORMAT
                )));
            }
            check_dump_flags(source, &from, tokenizer.is_some())?;
            let (columns, group) = column_mapping(source, &columns)?;
            let grouping = grouping(source, group, group_column, group_size, group_by_prompt)?;
            if !temperature.is_finite() || temperature <= 0.0 {
                return Err(Error::Usage(format!(
                    "table import: --temperature {temperature}: expected a positive number"
                )));
            }
            let import = foreign::ImportOptions {
                source,
                from,
                tokenizer,
                chat_template,
                columns,
                grouping,
                split,
                temperature,
            };
            import_dump(&import, &out_dir, options, overwrite, &mut out)
        }
        Command::Replay { file, demos, steps } => {
            let python = embodyflow_gym::BridgeConfig::python(None);
            let replays = libero_hdf5::replay(&python, &file, &demos, steps.unwrap_or(usize::MAX))?;
            for r in &replays {
                writeln!(out, "{}", replay_line(r)).map_err(write_err)?;
            }
            Ok(())
        }
        Command::Manifest { dir } => {
            settle_around(&dir)?;
            out.write_all(Manifest::read(&dir)?.to_json().as_bytes())
                .map_err(write_err)
        }
        Command::Show {
            dir,
            limit,
            columns,
        } => {
            let table = table_of(&dir)?;
            with_row_type!(table, R => show::<R>(&dir, limit, &columns, &mut out))
        }
        Command::Export {
            dir,
            format,
            trajectories,
            rewards,
            tasks,
            out: file,
        } => {
            let table = table_of(&dir)?;
            let target = export_target(format, trajectories.as_deref(), table, &dir)?;
            export_to(
                &dir,
                table,
                target,
                (rewards.as_deref(), tasks.as_deref()),
                file,
                &mut out,
            )
        }
        Command::Merge {
            out: out_dir,
            parts,
            overwrite,
        } => merge_into(&out_dir, &parts, overwrite, &mut out),
        Command::Validate { dirs, deep } => {
            for dir in dirs {
                validate(&dir, deep, &mut out)?;
            }
            Ok(())
        }
    }
}

/// An error writing to stdout.
fn write_err(e: std::io::Error) -> Error {
    Error::io("<stdout>", e)
}

/// `table schema`: every table with its version and key, or one table's
/// columns and example rows.
fn schema(name: Option<TableName>, out: &mut impl Write) -> Result<()> {
    let Some(table) = name else {
        for table in TableName::ALL {
            let def = table.def();
            writeln!(
                out,
                "{:<14} v{}  key: {}",
                def.name,
                def.version,
                def.key.join(", ")
            )
            .map_err(write_err)?;
        }
        return Ok(());
    };
    out.write_all(describe(table).as_bytes()).map_err(write_err)
}

/// `table import --table NAME`: rows in our own format.
fn import_rows(
    table: TableName,
    from: &[PathBuf],
    out_dir: &Path,
    options: WriteOptions,
    overwrite: bool,
    out: &mut impl Write,
) -> Result<()> {
    let from = one_file(from, "--table")?;
    let manifest = with_row_type!(table, R => import::<R>(from, out_dir, options, overwrite))?;
    writeln!(
        out,
        "imported {} rows into {} ({} shards)",
        manifest.num_rows,
        out_dir.join(table.as_str()).display(),
        manifest.shards.len()
    )
    .map_err(write_err)
}

/// A JSON-lines dump (veRL, TRL) is one file, tokenised with `--tokenizer`.
fn check_dump_flags(source: foreign::Source, from: &[PathBuf], tokenizer: bool) -> Result<()> {
    if source == foreign::Source::Parquet {
        return Ok(());
    }
    one_file(from, &format!("--format {}", source.name()))?;
    if !tokenizer {
        return Err(Error::Usage(format!(
            "table import --format {}: --tokenizer DIR_OR_TOKENIZER_JSON is required (the texts are tokenised with it)",
            source.name()
        )));
    }
    Ok(())
}

/// How a dump's rows form groups: one of `--column group=COLUMN`,
/// `--group-column`, `--group-size`, `--group-by-prompt`; by default veRL's
/// `uid`, else the prompt.
fn grouping(
    source: foreign::Source,
    group: Option<String>,
    group_column: Option<String>,
    group_size: Option<std::num::NonZeroUsize>,
    group_by_prompt: bool,
) -> Result<foreign::Grouping> {
    Ok(
        match (group, group_column, group_size, group_by_prompt, source) {
            (Some(_), Some(_), ..) | (Some(_), _, Some(_), ..) | (Some(_), _, _, true, _) => {
                return Err(Error::Usage(
                    "table import: --column group=COLUMN is --group-column COLUMN; give one grouping"
                        .into(),
                ));
            }
            (Some(key), ..) | (None, Some(key), ..) => foreign::Grouping::Column(key),
            (None, None, Some(n), ..) => foreign::Grouping::Size(n),
            (None, None, None, false, foreign::Source::Verl) => {
                foreign::Grouping::Column("uid".into())
            }
            (None, None, None, ..) => foreign::Grouping::Prompt,
        },
    )
}

/// `table import --format`: another trainer's dump as tasks, trajectories,
/// steps and rewards.
fn import_dump(
    import: &foreign::ImportOptions,
    out_dir: &Path,
    options: WriteOptions,
    overwrite: bool,
    out: &mut impl Write,
) -> Result<()> {
    let summary = foreign::import(import, out_dir, options, overwrite)?;
    let names: Vec<String> = import
        .from
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    writeln!(
        out,
        "imported {} into {} (tasks, trajectories, steps, rewards): {summary}",
        names.join(", "),
        out_dir.display()
    )
    .map_err(write_err)
}

/// `table import --format libero-hdf5`: LIBERO's demonstrations as tasks,
/// trajectories and steps.
fn import_demos(
    import: &libero_hdf5::ImportOptions,
    out_dir: &Path,
    options: WriteOptions,
    overwrite: bool,
    out: &mut impl Write,
) -> Result<()> {
    let s = libero_hdf5::import(import, out_dir, options, overwrite)?;
    writeln!(
        out,
        "imported {} files ({} layout) into {} (tasks, trajectories, steps): {} demonstrations, \
         {} decisions of up to {} actions, {} actions, {} px observations (agentview, wrist), \
         {} demonstrations not marked done",
        s.files,
        s.layouts.join(", "),
        out_dir.display(),
        s.demos,
        s.decisions,
        import.chunk_len,
        s.actions,
        s.resolution,
        s.incomplete
    )
    .map_err(write_err)
}

/// One line of `table replay`'s report.
fn replay_line(r: &libero_hdf5::Replay) -> String {
    let pixels: Vec<String> = r
        .pixel_error
        .iter()
        .map(|(image, e)| format!("{image} {e:.2}"))
        .collect();
    let state = r
        .state_error
        .map_or_else(|| "none".to_string(), |e| format!("{e:.4}"));
    let mut digest = blake3::Hasher::new();
    for observation in &r.observations {
        digest.update(observation);
    }
    format!(
        "{}: {} actions replayed, success {}; observations {}x{}x{} + {} proprio, digest {}; \
         mean |pixel difference| (of 255) {}; max |proprio difference| {:.4}; \
         max state error (L2, LIBERO warns above 0.01) {state}",
        r.demo,
        r.steps,
        r.success,
        r.shape.height,
        r.shape.width,
        r.shape.channels,
        r.shape.proprio,
        &digest.finalize().to_hex()[..16],
        pixels.join(", "),
        r.proprio_error,
    )
}

/// Where `table export` sends table `table` at `dir`: rows as CSV or JSON
/// lines, or an advantages table joined for veRL.
fn export_target<'a>(
    format: ExportFormat,
    trajectories: Option<&'a Path>,
    table: TableName,
    dir: &Path,
) -> Result<Target<'a>> {
    Ok(match (format, trajectories) {
        (ExportFormat::Csv, None) => Target::Rows(RowFormat::Csv),
        (ExportFormat::Jsonl, None) => Target::Rows(RowFormat::Jsonl),
        (ExportFormat::Verl, Some(t)) if table == TableName::Advantages => Target::Verl(t),
        (ExportFormat::Verl, Some(_)) => {
            return Err(Error::Usage(format!(
                "table export --format verl: {} is a `{table}` table; give an advantages table",
                dir.display()
            )));
        }
        (ExportFormat::Verl, None) => {
            return Err(Error::Usage(
                "table export --format verl: --trajectories DIR is required (it holds each row's uid, step and sample_index)".into(),
            ));
        }
        (_, Some(_)) => {
            return Err(Error::Usage(
                "table export: --trajectories and --rewards go with --format verl only".into(),
            ));
        }
    })
}

/// `table export`: to `file`, or to stdout.
fn export_to(
    dir: &Path,
    table: TableName,
    target: Target<'_>,
    (rewards, tasks): (Option<&Path>, Option<&Path>),
    file: Option<PathBuf>,
    out: &mut impl Write,
) -> Result<()> {
    let write_to = |writer: &mut dyn Write, label: &str| match target {
        Target::Rows(f) => {
            with_row_type!(table, R => export::<R>(dir, f, &mut &mut *writer, label))
        }
        Target::Verl(t) => foreign::export_verl(dir, t, rewards, tasks, &mut &mut *writer, label),
    };
    let Some(path) = file else {
        write_to(out, "<stdout>")?;
        return Ok(());
    };
    let mut writer =
        std::io::BufWriter::new(std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?);
    let label = path.display().to_string();
    let rows = write_to(&mut writer, &label)?;
    writer.flush().map_err(|e| Error::io(&path, e))?;
    writeln!(out, "exported {rows} rows of {table} to {label}").map_err(write_err)
}

/// `table merge`: the shards of one stage run merged into `out_dir`.
fn merge_into(
    out_dir: &Path,
    parts: &[PathBuf],
    overwrite: bool,
    out: &mut impl Write,
) -> Result<()> {
    for manifest in merge(out_dir, parts, overwrite)? {
        writeln!(
            out,
            "merged {} parts into {}: {} rows, {} shards, content hash {}",
            parts.len(),
            out_dir.join(&manifest.table).display(),
            manifest.num_rows,
            manifest.shards.len(),
            manifest.content_hash
        )
        .map_err(write_err)?;
    }
    Ok(())
}

/// `table validate`: every shard decoded and counted against the manifest,
/// no file the manifest does not list, and with `deep` every shard's hash.
fn validate(dir: &Path, deep: bool, out: &mut impl Write) -> Result<()> {
    let table = table_of(dir)?;
    let reader = TableReader::open(dir, table)?;
    let mut rows = 0;
    for batch in reader.batches(None, 65_536)? {
        rows += batch?.num_rows() as u64;
    }
    if rows != reader.num_rows() {
        return Err(Error::BadInput(format!(
            "table `{table}` at {}: shards hold {rows} rows, expected {} from the manifest",
            dir.display(),
            reader.num_rows()
        )));
    }
    let unlisted = reader.unlisted_files()?;
    if !unlisted.is_empty() {
        return Err(Error::BadInput(format!(
            "table `{table}` at {}: files not listed in its manifest: {}; pandas, polars and duckdb would read them as part of the table, beyond its {} rows: remove them",
            dir.display(),
            unlisted.join(", "),
            reader.num_rows()
        )));
    }
    if deep {
        reader.verify_hashes()?;
        if table == TableName::Trajectories {
            foreign::check_source_rows(dir, &reader)?;
        }
    }
    writeln!(
        out,
        "ok {table} {} rows, {} shards, content hash {} ({})",
        rows,
        reader.manifest().shards.len(),
        reader.manifest().content_hash,
        dir.display()
    )
    .map_err(write_err)
}

/// Merges `parts` (table directories, or output directories of tables) into
/// `out`, every table committed together.
fn merge(out: &Path, parts: &[PathBuf], overwrite: bool) -> Result<Vec<Manifest>> {
    let groups: Vec<Vec<PathBuf>> = if parts.iter().all(|p| is_table_dir(p)) {
        vec![parts.to_vec()]
    } else if let Some(table) = parts.iter().find(|p| is_table_dir(p)) {
        return Err(Error::Usage(format!(
            "table merge: {} is a table and {} is not; give table directories or output directories, not both",
            table.display(),
            parts
                .iter()
                .find(|p| !is_table_dir(p))
                .expect("one is not")
                .display()
        )));
    } else {
        let names = tables_in(&parts[0])?;
        if names.is_empty() {
            return Err(Error::BadInput(format!(
                "table merge: {} holds no table (no subdirectory with a {MANIFEST_FILE})",
                parts[0].display()
            )));
        }
        for part in &parts[1..] {
            let found = tables_in(part)?;
            if found != names {
                return Err(Error::BadInput(format!(
                    "table merge: {} holds tables [{}], {} holds [{}]; the parts must be the outputs of one sharded run",
                    parts[0].display(),
                    names.join(", "),
                    part.display(),
                    found.join(", ")
                )));
            }
        }
        names
            .iter()
            .map(|name| parts.iter().map(|p| p.join(name)).collect())
            .collect()
    };
    let mut commit = Commit::new(out);
    let mut manifests = Vec::new();
    for group in &groups {
        let (manifest, staged) = stage_merged_table(group, out, overwrite)?.into_parts();
        commit.absorb(staged)?;
        manifests.push(manifest);
    }
    commit.apply()?;
    Ok(manifests)
}

/// The names of the tables (subdirectories with a manifest) in `dir`, sorted.
fn tables_in(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::BadInput(format!("table merge: {} does not exist", dir.display()))
        }
        _ => Error::io(dir, e),
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && is_table_dir(&entry.path()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The one `--from` file of a JSON-lines import.
fn one_file<'a>(from: &'a [PathBuf], what: &str) -> Result<&'a Path> {
    match from {
        [file] => Ok(file),
        _ => Err(Error::Usage(format!(
            "table import {what}: --from takes one JSON-lines file ({} given)",
            from.len()
        ))),
    }
}

/// `--column ROLE=COLUMN` values: role -> column, and the `group` column;
/// only `--format parquet` takes them, and it needs a reward (a score or
/// token rewards), a prompt and a response (text or token ids).
fn column_mapping(
    source: foreign::Source,
    values: &[String],
) -> Result<(std::collections::BTreeMap<String, String>, Option<String>)> {
    let usage = |m: String| Err(Error::Usage(format!("table import: {m}")));
    if source != foreign::Source::Parquet {
        if values.is_empty() {
            return Ok(Default::default());
        }
        return usage(format!(
            "--column goes with --format parquet (the {} mapping is fixed: see --help)",
            source.name()
        ));
    }
    let mut columns = std::collections::BTreeMap::new();
    for value in values {
        let Some((role, column)) = value.split_once('=') else {
            return usage(format!("--column {value}: expected ROLE=COLUMN"));
        };
        if !foreign::ROLES.contains(&role) || column.is_empty() {
            return usage(format!(
                "--column {value}: ROLE is one of {} and COLUMN a column name",
                foreign::ROLES.join(", ")
            ));
        }
        if columns
            .insert(role.to_string(), column.to_string())
            .is_some()
        {
            return usage(format!("--column {role}=…: given twice"));
        }
    }
    let group = columns.remove("group");
    for (needed, either) in [
        ("reward", "token_rewards"),
        ("prompt", "prompt_ids"),
        ("response", "response_ids"),
    ] {
        if !columns.contains_key(needed) && !columns.contains_key(either) {
            return usage(format!(
                "--format parquet needs --column {needed}=COLUMN or --column {either}=COLUMN"
            ));
        }
    }
    Ok((columns, group))
}

/// Completes an interrupted commit of the directory holding `dir`, as every
/// stage's reader does ([`commit::settle`]): a table a killed writer left
/// half-swapped is then whole, or the error says what is pending.
fn settle_around(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        commit::settle(parent)?;
    }
    Ok(())
}

/// The table a directory's manifest names (its directory settled first).
fn table_of(dir: &Path) -> Result<TableName> {
    settle_around(dir)?;
    let manifest = Manifest::read(dir)?;
    manifest.table.parse().map_err(
        |e: embodyflow_core::schemas::UnknownTable| Error::BadManifest {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        },
    )
}

/// A table's columns with types, nullability and docs, and its example rows.
pub fn describe(table: TableName) -> String {
    let def = table.def();
    let mut text = format!(
        "{} (schema version {}, key: {})\n\n",
        def.name,
        def.version,
        def.key.join(", ")
    );
    for column in &def.columns {
        text.push_str(&format!(
            "  {:<24} {:<48} {}\n      {}\n",
            column.name,
            format_type(&column.data_type),
            if column.nullable {
                "nullable"
            } else {
                "not null"
            },
            column.doc
        ));
    }
    text.push_str("\nexample rows (the `table import` format):\n");
    with_row_type!(table, R => {
        for row in R::examples() {
            text.push_str(&serde_json::to_string(&row).expect("rows serialise"));
            text.push('\n');
        }
    });
    text
}

fn import<R: Row + 'static>(
    from: &Path,
    out: &Path,
    options: WriteOptions,
    overwrite: bool,
) -> Result<Manifest> {
    // The file is the user's input: missing or unreadable is bad usage.
    let file = std::fs::File::open(from)
        .map_err(|e| Error::Usage(format!("--from {}: cannot read it: {e}", from.display())))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut writer = TableWriter::create(out, R::TABLE, options, overwrite)?;
    let bar = progress::bar(size, "importing");
    let mut rows: Vec<R> = Vec::with_capacity(8192);
    let mut source_rows = (R::TABLE == TableName::Trajectories)
        .then(|| foreign::SourceRows::new(from, |i| format!("line {}", i + 1)));
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => Error::BadInput(format!(
                "{}:{}: not UTF-8 text, expected one JSON row per line",
                from.display(),
                index + 1
            )),
            _ => Error::io(from, e),
        })?;
        bar.inc(line.len() as u64 + 1);
        if line.trim().is_empty() {
            continue;
        }
        let row: R = serde_json::from_str(&line).map_err(|e| {
            Error::BadInput(format!(
                "{}:{}: not a `{}` row: {e}",
                from.display(),
                index + 1,
                R::TABLE
            ))
        })?;
        if let Some(source_rows) = &mut source_rows
            && let Some(t) = (&row as &dyn std::any::Any).downcast_ref::<TrajectoryRow>()
        {
            source_rows.add(index as u64, &t.trajectory_id, t.source_row)?;
        }
        rows.push(row);
        if rows.len() == rows.capacity() {
            writer.write_rows(&rows).map_err(refused_row)?;
            rows.clear();
        }
    }
    writer.write_rows(&rows).map_err(refused_row)?;
    bar.finish_and_clear();
    if let Some(source_rows) = source_rows {
        source_rows.finish()?;
    }
    let producer = Producer {
        stage: "table import".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        config: serde_json::json!({ "from": from, "rows_per_shard": options.rows_per_shard, "row_group_rows": options.row_group_rows }),
        seed: 0,
        shard: "0/1".into(),
    };
    writer.finish(&producer, &[])
}

fn show<R: Row>(
    dir: &Path,
    limit: Option<usize>,
    columns: &[String],
    out: &mut impl Write,
) -> Result<()> {
    let reader = TableReader::open(dir, R::TABLE)?;
    let def = R::TABLE.def();
    for column in columns {
        if def.column(column).is_none() {
            return Err(Error::BadInput(format!(
                "table `{}` has no column `{column}`; its columns are: {}",
                def.name,
                def.column_names().join(", ")
            )));
        }
    }
    let mut printed = 0;
    for batch in reader.batches(None, 1024)? {
        for row in batch_to_rows::<R>(&batch?)? {
            if limit.is_some_and(|l| printed >= l) {
                return Ok(());
            }
            let mut value = serde_json::to_value(&row).expect("rows serialise");
            if let (false, Some(map)) = (columns.is_empty(), value.as_object_mut()) {
                map.retain(|k, _| columns.contains(k));
            }
            match writeln!(out, "{}", shown_row(&value, def)) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                other => other.map_err(|e| Error::io("<stdout>", e))?,
            }
            printed += 1;
        }
    }
    Ok(())
}

/// Bytes of a binary cell `table show` prints in hex.
const SHOWN_BYTES: usize = 16;

/// A row as `table show` prints it: JSON, a binary cell as a string
/// `<N bytes: hex of the first 16…>`, the floats of f32 columns with f32
/// digits ([`json_text`]).
fn shown_row(value: &serde_json::Value, def: &embodyflow_core::schemas::TableDef) -> String {
    use serde_json::Value;
    let Some(map) = value.as_object() else {
        return value.to_string();
    };
    let f32s = f32_columns(def);
    let fields: Vec<String> = map
        .iter()
        .map(|(name, cell)| {
            let at = def.columns.iter().position(|c| c.name == *name);
            let binary = at.is_some_and(|i| format_type(&def.columns[i].data_type) == "binary");
            let text = match cell {
                Value::Array(items) if binary => {
                    let bytes: Vec<u8> = items
                        .iter()
                        .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                        .collect();
                    let hex: String = bytes
                        .iter()
                        .take(SHOWN_BYTES)
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    let more = if bytes.len() > SHOWN_BYTES { "…" } else { "" };
                    Value::String(format!("<{} bytes: {hex}{more}>", bytes.len())).to_string()
                }
                other => json_text(other, at.is_some_and(|i| f32s[i])),
            };
            format!("{}:{text}", Value::String(name.clone()))
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// Writes every row of the table at `dir` to `out` in `format`; returns the
/// number of rows. A closed pipe (`| head`) ends the export quietly.
fn export<R: Row>(dir: &Path, format: RowFormat, out: &mut impl Write, label: &str) -> Result<u64> {
    let reader = TableReader::open(dir, R::TABLE)?;
    let def = R::TABLE.def();
    let columns = def.column_names();
    let f32s = f32_columns(def);
    let bar = progress::bar(reader.num_rows(), "exporting");
    let mut write = |text: &str| match out.write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Error::io(label, e)),
        Ok(()) => Ok(true),
    };
    if format == RowFormat::Csv && !write(&(columns.join(",") + "\n"))? {
        return Ok(0);
    }
    let mut rows = 0;
    for batch in reader.batches(None, 4096)? {
        let batch = batch?;
        let mut text = String::new();
        for row in batch_to_rows::<R>(&batch)? {
            match format {
                RowFormat::Jsonl => {
                    text.push_str(&serde_json::to_string(&row).expect("rows serialise"))
                }
                RowFormat::Csv => {
                    let value = serde_json::to_value(&row).expect("rows serialise");
                    let cells: Vec<String> = columns
                        .iter()
                        .zip(&f32s)
                        .map(|(c, f)| csv_cell(value.get(*c), *f))
                        .collect();
                    text.push_str(&cells.join(","));
                }
            }
            text.push('\n');
            rows += 1;
        }
        if !write(&text)? {
            return Ok(rows);
        }
        bar.inc(batch.num_rows() as u64);
    }
    bar.finish_and_clear();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::schemas::Examples;

    /// The records of a CSV text (line breaks inside quotes do not end one).
    fn csv_records(text: &str) -> Vec<Vec<String>> {
        let (mut records, mut record, mut cell) = (Vec::new(), Vec::new(), String::new());
        let mut quoted = false;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    cell.push('"');
                    chars.next();
                }
                (true, '"') => quoted = false,
                (true, c) => cell.push(c),
                (false, '"') => quoted = true,
                (false, ',') => record.push(std::mem::take(&mut cell)),
                (false, '\n') => {
                    record.push(std::mem::take(&mut cell));
                    records.push(std::mem::take(&mut record));
                }
                (false, c) => cell.push(c),
            }
        }
        records
    }

    /// Every table's example rows, imported, exported as JSON lines and CSV:
    /// the row counts match, the CSV header is the schema's columns and
    /// every field of a row is one of them, and the JSON lines import back
    /// to the same table (content hash).
    fn round_trip<R: Row + Examples>() {
        let tmp = tempfile::tempdir().unwrap();
        let rows = R::examples();
        let from = tmp.path().join("rows.jsonl");
        let text: String = rows
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        std::fs::write(&from, text).unwrap();
        let first =
            import::<R>(&from, &tmp.path().join("a"), WriteOptions::default(), false).unwrap();
        let dir = tmp.path().join("a").join(R::TABLE.as_str());

        let mut jsonl = Vec::new();
        let n = export::<R>(&dir, RowFormat::Jsonl, &mut jsonl, "jsonl").unwrap();
        assert_eq!(n, rows.len() as u64);
        let jsonl = String::from_utf8(jsonl).unwrap();
        assert_eq!(jsonl.lines().count(), rows.len(), "{}", R::TABLE);
        let again_from = tmp.path().join("export.jsonl");
        std::fs::write(&again_from, &jsonl).unwrap();
        let again = import::<R>(
            &again_from,
            &tmp.path().join("b"),
            WriteOptions::default(),
            false,
        )
        .unwrap();
        assert_eq!(again.content_hash, first.content_hash, "{}", R::TABLE);

        let mut csv = Vec::new();
        export::<R>(&dir, RowFormat::Csv, &mut csv, "csv").unwrap();
        let records = csv_records(&String::from_utf8(csv).unwrap());
        let columns = R::TABLE.def().column_names();
        assert_eq!(records[0], columns, "{}", R::TABLE);
        assert_eq!(records.len() - 1, rows.len(), "{}", R::TABLE);
        assert!(records.iter().all(|r| r.len() == columns.len()));
        for row in &rows {
            let value = serde_json::to_value(row).unwrap();
            for key in value.as_object().unwrap().keys() {
                assert!(columns.contains(&key.as_str()), "{}: field {key}", R::TABLE);
            }
        }
    }

    #[test]
    fn every_table_exports_to_csv_and_jsonl_and_jsonl_imports_back() {
        for table in TableName::ALL {
            with_row_type!(table, R => round_trip::<R>());
        }
    }

    #[test]
    fn show_prints_binary_cells_as_hex_summaries_and_f32_with_f32_digits() {
        use embodyflow_core::schemas::StepRow;
        let tmp = tempfile::tempdir().unwrap();
        let mut rows = StepRow::examples();
        rows[0].observation = Some((0..40).collect());
        rows[0].old_logprobs = vec![-0.99; rows[0].response_ids.len()];
        let from = tmp.path().join("rows.jsonl");
        let text: String = rows
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        std::fs::write(&from, text).unwrap();
        import::<StepRow>(&from, tmp.path(), WriteOptions::default(), false).unwrap();
        let dir = tmp.path().join(TableName::Steps.as_str());
        let mut out = Vec::new();
        show::<StepRow>(&dir, None, &[], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(r#""observation":"<40 bytes: 000102030405060708090a0b0c0d0e0f…>""#),
            "{text}"
        );
        assert!(
            text.contains(r#""observation":"<3 bytes: 00ff11>""#),
            "{text}"
        );
        assert!(
            text.contains("-0.99,") && !text.contains("0.9900000"),
            "{text}"
        );
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }

    #[test]
    fn csv_cells_quote_what_needs_it() {
        let cell = |v: serde_json::Value| csv_cell(Some(&v), false);
        assert_eq!(csv_cell(None, true), "");
        let f32s = |v: serde_json::Value| csv_cell(Some(&v), true);
        assert_eq!(f32s(serde_json::json!(0.99f32)), "0.99");
        assert_eq!(cell(serde_json::json!(0.99f32)), "0.9900000095367432");
        assert_eq!(f32s(serde_json::json!(2.0f32)), "2.0");
        assert_eq!(f32s(serde_json::json!(3)), "3");
        assert_eq!(f32s(serde_json::json!([0.1f32, -2.5f32])), "\"[0.1,-2.5]\"");
        assert_eq!(cell(serde_json::Value::Null), "");
        assert_eq!(cell(serde_json::json!("plain")), "plain");
        assert_eq!(
            cell(serde_json::json!("a, \"b\"\nc")),
            "\"a, \"\"b\"\"\nc\""
        );
        assert_eq!(cell(serde_json::json!([0.5, -1.25])), "\"[0.5,-1.25]\"");
        assert_eq!(cell(serde_json::json!(true)), "true");
        assert_eq!(cell(serde_json::json!(3)), "3");
    }
}
