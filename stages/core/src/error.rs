//! The errors of the shared core, grouped by who must act: bad input or bad
//! usage (the user fixes a file, a flag or a config key; exit code 2, nothing
//! written) versus a failure while running (exit code 1, nothing
//! half-written). Messages name what was wrong, what was expected and what was
//! found, e.g. `table `rewards` shard `part-00000.parquet`: column `score` has
//! type f64, expected f32`.

use std::path::PathBuf;

/// The result type of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who must act on an error, and so the exit code of a binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad usage or bad input: exit code 2, nothing was written.
    BadInput,
    /// Something failed while running: exit code 1.
    Failure,
    /// Nothing was left to do (the run's outputs are already committed, by
    /// an identical earlier run): exit code 0, the message on stdout.
    Done,
}

impl ErrorKind {
    /// The process exit code for this kind.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::BadInput => 2,
            ErrorKind::Failure => 1,
            ErrorKind::Done => 0,
        }
    }
}

/// An error that knows whether the user or the run is at fault. Stage crates
/// implement it for their own error types so that every binary maps errors to
/// exit codes the same way.
pub trait Classify: std::error::Error {
    /// Who must act on the error.
    fn kind(&self) -> ErrorKind;
}

/// Errors of the shared core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A shard's column has another type than the schema file declares.
    #[error(
        "table `{table}` shard `{shard}`: column `{field}` has type {found}, expected {expected}"
    )]
    SchemaMismatch {
        /// Table name.
        table: String,
        /// Shard file name.
        shard: String,
        /// Column name.
        field: String,
        /// Type (and nullability) the schema declares.
        expected: String,
        /// Type found in the shard.
        found: String,
    },
    /// A shard lacks a column of the schema.
    #[error(
        "table `{table}` shard `{shard}`: column `{field}` is missing, expected {expected}, found no such column"
    )]
    MissingColumn {
        /// Table name.
        table: String,
        /// Shard file name.
        shard: String,
        /// Column name.
        field: String,
        /// Type the schema declares.
        expected: String,
    },
    /// A shard has a column the schema does not declare.
    #[error(
        "table `{table}` shard `{shard}`: column `{field}` of type {found} is not in the schema, expected only {expected}"
    )]
    UnexpectedColumn {
        /// Table name.
        table: String,
        /// Shard file name.
        shard: String,
        /// Column name.
        field: String,
        /// The schema's column names.
        expected: String,
        /// Type of the extra column.
        found: String,
    },
    /// A shard or manifest carries another schema version than this build reads.
    #[error(
        "table `{table}` shard `{shard}`: field `schema_version` is {found}, expected {expected} (written by another version of the pipeline; regenerate it)"
    )]
    SchemaVersion {
        /// Table name.
        table: String,
        /// Shard file name, or `_manifest.parquet`.
        shard: String,
        /// Version this build reads.
        expected: u32,
        /// Version found.
        found: String,
    },
    /// A Parquet file that this pipeline did not write, or written for another table.
    #[error(
        "table `{table}` shard `{shard}`: field `{field}` is {found}, expected {expected} (not a shard of this table written by embodyflow)"
    )]
    ForeignShard {
        /// Table expected.
        table: String,
        /// Shard file name.
        shard: String,
        /// The metadata field checked.
        field: String,
        /// What it should hold.
        expected: String,
        /// What it holds.
        found: String,
    },
    /// A shard that cannot be read: truncated, corrupt or missing.
    #[error("table `{table}` shard `{shard}`: {reason}")]
    CorruptShard {
        /// Table name.
        table: String,
        /// Shard file name.
        shard: String,
        /// What is wrong, with expected and found where they apply.
        reason: String,
    },
    /// A table directory whose manifest is missing or invalid.
    #[error("table directory {dir}: {reason}")]
    BadManifest {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A value that breaks its column's rule (a NaN or infinite float, an
    /// integer outside the schema's `range`) in a table being read.
    #[error("table `{table}` shard `{shard}`: column `{column}` holds {found} at row {key}")]
    InvalidValue {
        /// Table name.
        table: String,
        /// Shard file name.
        shard: String,
        /// Column name.
        column: String,
        /// The row's key (`trajectory_id=…, step_index=…`) or position.
        key: String,
        /// The value found and what is allowed.
        found: String,
    },
    /// A stage produced a value that breaks its column's rule: a bug or a
    /// diverged computation; nothing is written.
    #[error(
        "writing table `{table}`: column `{column}` would hold {found} at row {key}; nothing was written"
    )]
    InvalidOutputValue {
        /// Table name.
        table: String,
        /// Column name.
        column: String,
        /// The row's key or position.
        key: String,
        /// The value and what is allowed.
        found: String,
    },
    /// A table a stage needs is in none of its inputs.
    #[error("no `{table}` table in the inputs; searched {searched}")]
    TableNotFound {
        /// The table needed.
        table: String,
        /// What the inputs hold.
        searched: String,
    },
    /// The same table was found in two inputs.
    #[error("table `{table}` is in two inputs: {first} and {second}; pass only one")]
    DuplicateTable {
        /// Table name.
        table: String,
        /// First directory.
        first: PathBuf,
        /// Second directory.
        second: PathBuf,
    },
    /// An output table exists and `--overwrite` was not given.
    #[error("output table {0} already exists; pass --overwrite to replace it")]
    OutputExists(PathBuf),
    /// The outputs exist because an identical earlier run (same stage,
    /// version, config, seed, shard and input content) was killed while
    /// committing them, and this run completed its commit: nothing to do.
    #[error("{0}")]
    AlreadyDone(String),
    /// Rows that do not fit the table's schema (a bug in the producing code).
    #[error("rows do not fit the schema of table `{table}`: {reason}")]
    RowConversion {
        /// Table name.
        table: String,
        /// The converter's message.
        reason: String,
    },
    /// A config key that no setting has.
    #[error("unknown config key `{key}`; valid keys: {}", valid.join(", "))]
    UnknownKey {
        /// The dotted key given.
        key: String,
        /// Every valid dotted key.
        valid: Vec<String>,
    },
    /// A config value of the wrong type or out of range.
    #[error("config key `{key}`: {reason}")]
    BadValue {
        /// The dotted key.
        key: String,
        /// What was expected and found.
        reason: String,
    },
    /// A command-line value that does not parse (`--shard`, `--device`, `--set`).
    #[error("{0}")]
    Usage(String),
    /// Input data that violates a stage's expectations (named by the stage).
    #[error("{0}")]
    BadInput(String),
    /// An I/O error on a path.
    #[error("I/O error on {path}")]
    Io {
        /// The path being read or written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A Parquet error while writing.
    #[error("writing Parquet shard {path}")]
    ParquetWrite {
        /// The shard being written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: parquet::errors::ParquetError,
    },
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        // Every variant is classified here: a new one must choose.
        match self {
            Error::Io { .. }
            | Error::ParquetWrite { .. }
            | Error::RowConversion { .. }
            | Error::InvalidOutputValue { .. } => ErrorKind::Failure,
            Error::SchemaMismatch { .. }
            | Error::MissingColumn { .. }
            | Error::UnexpectedColumn { .. }
            | Error::SchemaVersion { .. }
            | Error::ForeignShard { .. }
            | Error::CorruptShard { .. }
            | Error::BadManifest { .. }
            | Error::InvalidValue { .. }
            | Error::TableNotFound { .. }
            | Error::DuplicateTable { .. }
            | Error::OutputExists(_)
            | Error::UnknownKey { .. }
            | Error::BadValue { .. }
            | Error::Usage(_)
            | Error::BadInput(_) => ErrorKind::BadInput,
            Error::AlreadyDone(_) => ErrorKind::Done,
        }
    }
}
