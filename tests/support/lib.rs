//! Helpers for the integration tests: find the workspace's built binaries,
//! run them, and forge shards with one chosen defect.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow::array::RecordBatch;
use embodyflow_core::manifest::{Manifest, ShardEntry};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

/// Path of a workspace binary built in the same profile as this test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let path = profile_dir.join(name);
    assert!(path.exists(), "{} is not built; run `cargo build --release --workspace` first", path.display());
    path
}

/// The output of a finished command, with its exit code.
pub struct Run {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// Runs binary `name` with `args` and captures everything.
pub fn run(name: &str, args: &[&str]) -> Run {
    let output: Output = Command::new(bin(name)).args(args).output().expect("spawn binary");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Replaces the first shard of the table at `table_dir` with `batch`, written
/// as plain Parquet with the given key-value metadata, and rewrites the
/// manifest so that sizes and hashes agree: only the defect in the batch or
/// metadata remains for the reader to find.
pub fn forge_first_shard(table_dir: &Path, batch: &RecordBatch, metadata: &[(&str, &str)]) {
    let mut manifest = Manifest::read(table_dir).expect("valid table to forge");
    let file = &manifest.shards[0].file;
    let path = table_dir.join(file);
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(metadata.iter().map(|(k, v)| KeyValue::new(k.to_string(), v.to_string())).collect()))
        .build();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
    std::fs::write(&path, &bytes).unwrap();
    manifest.shards[0] = ShardEntry {
        file: file.clone(),
        rows: batch.num_rows() as u64,
        bytes: bytes.len() as u64,
        hash: blake3_hex(&bytes),
    };
    reseal(table_dir, manifest);
}

/// Rewrites a manifest after its shard list changed, with consistent totals.
pub fn reseal(table_dir: &Path, mut manifest: Manifest) {
    manifest.num_rows = manifest.shards.iter().map(|s| s.rows).sum();
    manifest.content_hash = Manifest::compute_content_hash(&manifest.table, manifest.schema_version, &manifest.shards);
    std::fs::write(table_dir.join("_manifest.json"), manifest.to_json()).unwrap();
}

fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}
