//! The shared core of every embodyflow stage.
//!
//! - [`dataset`]: tables as directories of zstd Parquet shards, written
//!   atomically, read as validated streams of record batches;
//! - [`canonical`]: rows in key order and whole row groups, so the same rows
//!   give the same bytes (sharded runs merge to the unsharded table);
//! - [`commit`]: a run's outputs swapped into place together, crash-safe;
//! - [`manifest`]: `_manifest.parquet` (the manifest JSON in its metadata) with shard hashes, producer config and lineage;
//! - [`inputs`]: finding tables by name among `--input` directories;
//! - [`config`]: defaults, TOML file and `--set` overrides with checked keys;
//! - [`checks`]: value checks naming the key, the expectation and the value;
//! - [`section`]: config tables declared at run time by a stage's registered
//!   parts (an estimator's `gae.*`, a reward's `reward.reward_coef`);
//! - [`cli`]: the uniform stage command line, exit codes and error reports;
//! - [`spec`]: what each stage is (reads, writes, sharding), declared once;
//! - [`stage`]: the frame of a stage run (config, inputs, outputs, summary);
//! - [`threads`]: a stage process's threads, OpenMP wait policy and CPUs;
//! - [`numerics`]: what bit-identical results depend on besides inputs and
//!   config (thread count, libtorch's CPU dispatch level and version);
//! - [`progress`]: progress bars for long loops;
//! - [`observation`]: the bytes of a closed-loop observation (image and
//!   proprio) in `steps.observation`;
//! - [`image_list`]: a prompt's images of different sizes in the same column
//!   (its format version 3), and every version read as a list of images;
//! - [`observation_store`]: those observations written once into an Arrow
//!   IPC file and served zero-copy from a memory mapping, epoch after epoch;
//! - [`values`]: finite floats and declared integer ranges, checked on every read and write;
//! - [`private_dir`]: directories for this user alone (made exclusively
//!   0700, owner checked, never through a symbolic link).
//!
//! The table schemas themselves live in `embodyflow_schemas`, re-exported as
//! [`schemas`].

// The paths `#[derive(ConfigKeys)]` writes (`::embodyflow_core::config`)
// resolve inside this crate too.
extern crate self as embodyflow_core;

pub mod canonical;
pub mod checks;
pub mod cli;
pub mod codecs;
pub mod commit;
pub mod config;
pub mod dataset;
pub mod diagnostics;
pub mod error;
pub mod image_list;
pub mod inputs;
pub mod manifest;
pub mod numerics;
pub mod observation;
pub mod observation_store;
pub mod private_dir;
pub mod progress;
pub mod section;
pub mod shard_hash;
pub mod spec;
pub mod stage;
pub mod threads;
pub mod values;

pub use embodyflow_schemas as schemas;
pub use error::{Classify, Error, ErrorKind, Result};

/// The start of `trajectories.policy` for rollouts imported from another
/// trainer's dump (`table import --format verl|trl`): `imported:verl:3.jsonl`.
/// Their `old_logprobs` are placeholders (a dump holds no behaviour
/// log-probs), so rewards and advantages may be recomputed on them but a
/// policy update must refuse them.
pub const IMPORTED_POLICY_PREFIX: &str = "imported:";
