//! The shared core of every embodyflow stage.
//!
//! - [`dataset`]: tables as directories of zstd Parquet shards, written
//!   atomically, read as validated streams of record batches;
//! - [`manifest`]: `_manifest.json` with shard hashes, producer config and lineage;
//! - [`inputs`]: finding tables by name among `--input` directories;
//! - [`config`]: defaults, TOML file and `--set` overrides with checked keys;
//! - [`cli`]: the uniform stage command line, exit codes and error reports;
//! - [`stage`]: the frame of a stage run (config, inputs, outputs, summary);
//! - [`progress`]: progress bars for long loops.
//!
//! The table schemas themselves live in `embodyflow_schemas`, re-exported as
//! [`schemas`].

pub mod cli;
pub mod config;
pub mod dataset;
pub mod error;
pub mod inputs;
pub mod manifest;
pub mod progress;
pub mod stage;

pub use embodyflow_schemas as schemas;
pub use error::{Classify, Error, ErrorKind, Result};
