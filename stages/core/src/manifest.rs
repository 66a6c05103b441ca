//! `_manifest.parquet`: what a table directory holds and where it came from.
//!
//! A manifest lists the shards with their row counts, sizes and BLAKE3 content
//! hashes (computed while writing, so hashing reads nothing twice), the
//! producing stage with its version and fully resolved config, and the
//! content hashes of the tables it read (lineage). The table's
//! `content_hash` is BLAKE3 over its name, schema version and each shard's row
//! count and hash: the same rows written twice give the same hash, and the
//! runner keys its cache on (stage version, resolved config, input content
//! hashes).
//!
//! **Where it lives.** The manifest is JSON, stored in the Parquet key-value
//! metadata (key `embodyflow.manifest`) of `_manifest.parquet`: a zero-row
//! Parquet file with the table's own schema. A table directory thus holds only
//! Parquet files, so it opens directly as a dataset in polars
//! (`pl.read_parquet(dir)`, which refuses directories holding other file
//! types), pandas / pyarrow (which skip `_`-prefixed files) and duckdb
//! (`read_parquet('dir/*.parquet')`, where the manifest adds no rows), while it
//! is still written and swapped in with the shards, atomically. `table
//! manifest DIR` prints the JSON. Tables written before this change, with a
//! `_manifest.json` beside the shards, are still read.
//!
//! ```json
//! { "format": "embodyflow.manifest/1", "table": "rewards", "schema_version": 3,
//!   "num_rows": 4096, "content_hash": "4f1c…",
//!   "shards": [{ "file": "part-00000.parquet", "rows": 4096, "bytes": 81234, "hash": "9ab2…" }],
//!   "producer": { "stage": "score-rewards", "version": "0.1.0", "config": {…}, "seed": 0, "shard": "0/1" },
//!   "inputs": [{ "table": "trajectories", "path": "runs/it0/rollouts/trajectories", "content_hash": "…" }] }
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use embodyflow_schemas::{META_TABLE, META_VERSION, TableName};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// File name of the manifest inside a table directory.
pub const MANIFEST_FILE: &str = "_manifest.parquet";
/// File name of the manifest in tables written before it moved into Parquet
/// metadata (still read).
pub const LEGACY_MANIFEST_FILE: &str = "_manifest.json";
/// Parquet key-value metadata key holding the manifest JSON.
pub const META_MANIFEST: &str = "embodyflow.manifest";

/// Whether `dir` is a table directory (it holds a manifest).
pub fn is_table_dir(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file() || dir.join(LEGACY_MANIFEST_FILE).is_file()
}
/// Format tag of the manifests this build writes and reads.
pub const MANIFEST_FORMAT: &str = "embodyflow.manifest/1";

/// One Parquet shard of a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// File name inside the table directory.
    pub file: String,
    /// Rows in the shard.
    pub rows: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// BLAKE3 hash of the file bytes, hex.
    pub hash: String,
    /// The BLAKE3 chaining values of the file's 1 MiB blocks, 64 hex
    /// digits each, joined ([`crate::shard_hash`]): a reader checks the
    /// blocks it reads against them, and they merge to `hash`. Empty for a
    /// file of one block or less, and in manifests written before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub blocks: String,
}

/// The stage run that produced a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Producer {
    /// Stage binary name.
    pub stage: String,
    /// Stage version.
    pub version: String,
    /// The fully resolved config (defaults, file and `--set` overrides merged).
    pub config: serde_json::Value,
    /// `--seed` of the run.
    pub seed: u64,
    /// `--shard` of the run, `i/n`.
    pub shard: String,
}

/// A table the producing stage read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRef {
    /// Table name.
    pub table: String,
    /// Directory it was read from, as given.
    pub path: PathBuf,
    /// Its content hash when read.
    pub content_hash: String,
}

/// The manifest of one table directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Table name.
    pub table: String,
    /// Schema version of every shard.
    pub schema_version: u32,
    /// Total rows.
    pub num_rows: u64,
    /// BLAKE3 over the table name, version and shard rows and hashes, hex.
    pub content_hash: String,
    /// Shards in order.
    pub shards: Vec<ShardEntry>,
    /// Who wrote it.
    pub producer: Producer,
    /// What the producer read.
    pub inputs: Vec<InputRef>,
}

impl Manifest {
    /// The content hash of a table with these shards.
    pub fn compute_content_hash(table: &str, schema_version: u32, shards: &[ShardEntry]) -> String {
        let mut hasher = blake3::Hasher::new();
        hasher.update(format!("{table}\n{schema_version}\n").as_bytes());
        for shard in shards {
            hasher.update(format!("{} {}\n", shard.rows, shard.hash).as_bytes());
        }
        hasher.finalize().to_hex().to_string()
    }

    /// Reads the manifest JSON of the table directory `dir`: from
    /// `_manifest.parquet`'s metadata, or from a legacy `_manifest.json`.
    fn read_text(dir: &Path) -> Result<String> {
        let bad = |reason: String| Error::BadManifest {
            dir: dir.to_path_buf(),
            reason,
        };
        let path = dir.join(MANIFEST_FILE);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let legacy = dir.join(LEGACY_MANIFEST_FILE);
                return match std::fs::read_to_string(&legacy) {
                    Ok(text) => Ok(text),
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(bad(format!(
                        "no {MANIFEST_FILE} (not a table, or its writer did not finish)"
                    ))),
                    Err(err) => Err(Error::io(legacy, err)),
                };
            }
            Err(err) => return Err(Error::io(path, err)),
        };
        let reader = SerializedFileReader::new(file).map_err(|e| {
            bad(format!(
                "{MANIFEST_FILE} is not a readable Parquet file: {e}"
            ))
        })?;
        reader
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .and_then(|kvs| kvs.iter().find(|kv| kv.key == META_MANIFEST))
            .and_then(|kv| kv.value.clone())
            .ok_or_else(|| bad(format!("{MANIFEST_FILE} has no `{META_MANIFEST}` metadata")))
    }

    /// Reads and checks the manifest of the table directory `dir`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let bad = |reason: String| Error::BadManifest {
            dir: dir.to_path_buf(),
            reason,
        };
        let text = Self::read_text(dir)?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| bad(format!("{MANIFEST_FILE} is not a valid manifest: {e}")))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(bad(format!(
                "{MANIFEST_FILE} field `format` is `{}`, expected `{MANIFEST_FORMAT}`",
                manifest.format
            )));
        }
        // Its numbers and names are untrusted until checked: sums without
        // overflow, shard files only inside the table directory.
        let rows = manifest
            .shards
            .iter()
            .try_fold(0u64, |sum, s| sum.checked_add(s.rows))
            .ok_or_else(|| {
                bad(format!(
                    "{MANIFEST_FILE} lists shard row counts whose sum overflows"
                ))
            })?;
        if rows != manifest.num_rows {
            return Err(bad(format!(
                "{MANIFEST_FILE} says {} rows but its shards add up to {rows}",
                manifest.num_rows
            )));
        }
        if let Some(shard) = manifest.shards.iter().find(|s| {
            s.file.is_empty()
                || s.file.starts_with('.')
                || s.file.contains(['/', '\\', '\0'])
                || !s.file.ends_with(".parquet")
        }) {
            return Err(bad(format!(
                "{MANIFEST_FILE} lists shard file `{}`, expected a `*.parquet` name inside the table directory",
                shard.file.escape_default()
            )));
        }
        let expected = Manifest::compute_content_hash(
            &manifest.table,
            manifest.schema_version,
            &manifest.shards,
        );
        if expected != manifest.content_hash {
            return Err(bad(format!(
                "{MANIFEST_FILE} field `content_hash` is {}, expected {expected} from its shard list",
                manifest.content_hash
            )));
        }
        Ok(manifest)
    }

    /// Serialises the manifest (pretty JSON, stable field order).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest always serialises") + "\n"
    }

    /// Writes `dir/_manifest.parquet` (zero rows, the table's schema, this
    /// manifest in its metadata) and fsyncs it; replaces a legacy
    /// `_manifest.json` there. Deterministic: the same manifest gives the
    /// same bytes.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let table: TableName =
            self.table
                .parse()
                .map_err(|e: embodyflow_schemas::UnknownTable| {
                    Error::BadInput(format!("manifest of {}: {e}", dir.display()))
                })?;
        let def = table.def();
        let path = dir.join(MANIFEST_FILE);
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![
                KeyValue::new(META_TABLE.to_string(), def.name.clone()),
                KeyValue::new(META_VERSION.to_string(), def.version.to_string()),
                KeyValue::new(META_MANIFEST.to_string(), self.to_json()),
            ]))
            .build();
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        let write_error = |source| Error::ParquetWrite {
            path: path.clone(),
            source,
        };
        let mut writer =
            ArrowWriter::try_new(file, def.arrow_schema(), Some(props)).map_err(write_error)?;
        writer
            .write(&RecordBatch::new_empty(def.arrow_schema()))
            .map_err(write_error)?;
        let file = writer.into_inner().map_err(write_error)?;
        file.sync_all().map_err(|e| Error::io(&path, e))?;
        let legacy = dir.join(LEGACY_MANIFEST_FILE);
        if legacy.exists() {
            std::fs::remove_file(&legacy).map_err(|e| Error::io(&legacy, e))?;
        }
        Ok(())
    }
}
