//! The content-addressed step cache.
//!
//! A step instance's key is BLAKE3 over: the stage name and its binary's
//! BLAKE3 hash; its arguments (inputs, policy, teacher, config, `--set`s,
//! seed, extra flags) with every path replaced by the identity of what it
//! holds; the shard count and the device kind. The identity of a table is
//! its manifest's `content_hash`, of a dataset directory the content hashes
//! of the tables in it (what a stage's `--input` finds), of a checkpoint its
//! `manifest.json` id plus the hashes of its small files (config,
//! tokenizer), of a config file its bytes' hash. Only manifests are read:
//! no data is rehashed, so hashing reads each shard zero times (the writer
//! hashed it once while writing).
//!
//! After a stage succeeds the runner writes `_step.json` into the step's
//! directory, last: the key, the command, and the content hashes of what the
//! step wrote (the tables and checkpoints its stage declares). A step is
//! cached when that file exists, its key equals the key computed now, and
//! every output it lists still has that content hash. A step killed midway
//! has no `_step.json` and is run again.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use embodyflow_core::manifest::{Manifest, is_table_dir};
use embodyflow_core::spec;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RunnerError};
use crate::plan::Instance;

/// File name of the completion record in a step's directory.
pub const STEP_FILE: &str = "_step.json";
/// Format tag of `_step.json`.
pub const STEP_FORMAT: &str = "embodyflow.step/1";

/// What a path holds, for cache keys.
pub fn identity(path: &Path) -> Result<String> {
    if is_table_dir(path) {
        let m = Manifest::read(path)?;
        return Ok(format!("table {} {}", m.table, m.content_hash));
    }
    if path.is_file() {
        let bytes = std::fs::read(path).map_err(|e| RunnerError::io(path, e))?;
        return Ok(format!("file {}", blake3::hash(&bytes).to_hex()));
    }
    let checkpoint = path.join("manifest.json");
    if checkpoint.is_file() {
        let mut hasher = blake3::Hasher::new();
        for name in ["manifest.json", "config.json", "tokenizer.json"] {
            let file = path.join(name);
            if let Ok(bytes) = std::fs::read(&file) {
                hasher.update(name.as_bytes());
                hasher.update(&bytes);
            }
        }
        return Ok(format!("checkpoint {}", hasher.finalize().to_hex()));
    }
    if path.is_dir() {
        let tables = tables_in(path)?;
        let parts: Vec<String> = tables
            .iter()
            .map(|(table, hash)| format!("{table}={hash}"))
            .collect();
        return Ok(format!("dataset {}", parts.join(",")));
    }
    Err(RunnerError::Core(embodyflow_core::Error::BadInput(
        format!("{}: no such file or directory", path.display()),
    )))
}

/// The tables directly under a dataset directory (as a stage's `--input`
/// finds them): name to content hash.
pub fn tables_in(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut tables = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| RunnerError::io(dir, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && is_table_dir(&path) {
            let m = Manifest::read(&path)?;
            tables.insert(m.table, m.content_hash);
        }
    }
    Ok(tables)
}

/// The key of an instance run with the binary whose hash is `binary`.
pub fn step_key(instance: &Instance, binary: &str) -> Result<(String, serde_json::Value)> {
    let mut args = Vec::new();
    let mut iter = instance.stage_args().into_iter();
    while let Some(arg) = iter.next() {
        let is_path = matches!(
            arg.as_str(),
            "--input" | "--policy" | "--teacher" | "--config"
        );
        args.push(arg);
        if is_path && let Some(path) = iter.next() {
            // `--teacher self` names the policy, already in the key.
            let self_teacher = path == "self" && args.last().is_some_and(|a| a == "--teacher");
            args.push(if self_teacher {
                path
            } else {
                identity(Path::new(&path))?
            });
        }
    }
    let device_kind = if instance.devices.iter().all(|d| d == "cpu") {
        "cpu"
    } else {
        "cuda"
    };
    let parts = serde_json::json!({
        "format": STEP_FORMAT,
        "stage": instance.stage.name,
        "binary": binary,
        "args": args,
        "shards": instance.shards,
        "device": device_kind,
    });
    let key = blake3::hash(parts.to_string().as_bytes())
        .to_hex()
        .to_string();
    Ok((key, parts))
}

/// One output of a completed step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// Path relative to the step directory (`rewards`, `policy`).
    pub path: String,
    /// Its identity when the step finished.
    pub identity: String,
}

/// `_step.json`: the record of a completed step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Always [`STEP_FORMAT`].
    pub format: String,
    /// The cache key.
    pub key: String,
    /// What the key was computed from.
    pub key_parts: serde_json::Value,
    /// Instance id.
    pub id: String,
    /// Stage.
    pub stage: String,
    /// The command lines run (one per shard).
    pub commands: Vec<Vec<String>>,
    /// What the step wrote.
    pub outputs: Vec<Output>,
    /// Seconds the stage processes ran (wall, shards together).
    pub wall_s: f64,
    /// Unix time when it finished.
    pub finished_unix: u64,
}

/// The outputs of a step that are on disk: the tables and checkpoints its
/// stage declares ([`embodyflow_core::spec`]), by path. Declared files
/// (`diagnostics.json`) are not part of the record.
pub fn outputs_of(instance: &Instance) -> Result<Vec<Output>> {
    let mut outputs = Vec::new();
    for output in instance.stage.writes {
        let path = instance.dir.join(output.path());
        let present = match output {
            spec::Output::Table(_) => is_table_dir(&path),
            spec::Output::Checkpoint(_) => path.join("manifest.json").is_file(),
            spec::Output::File(_) => false,
        };
        if present {
            outputs.push(Output {
                path: output.path().to_string(),
                identity: identity(&path)?,
            });
        }
    }
    outputs.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(outputs)
}

/// The record of `instance`'s directory when it is a completed run of `key`
/// whose outputs are unchanged.
pub fn cached(instance: &Instance, key: &str) -> Option<StepRecord> {
    let text = std::fs::read_to_string(instance.dir.join(STEP_FILE)).ok()?;
    let record: StepRecord = serde_json::from_str(&text).ok()?;
    if record.format != STEP_FORMAT || record.key != key {
        return None;
    }
    let now = outputs_of(instance).ok()?;
    (now == record.outputs).then_some(record)
}

/// Writes `_step.json` atomically (temporary file, fsync, rename).
pub fn write_record(dir: &Path, record: &StepRecord) -> Result<()> {
    let path = dir.join(STEP_FILE);
    let tmp = dir.join(format!(".{STEP_FILE}.tmp"));
    let text = serde_json::to_string_pretty(record).expect("a step record serialises") + "\n";
    let file = std::fs::File::create(&tmp).map_err(|e| RunnerError::io(&tmp, e))?;
    use std::io::Write;
    let mut writer = std::io::BufWriter::new(file);
    writer
        .write_all(text.as_bytes())
        .and_then(|_| writer.flush())
        .map_err(|e| RunnerError::io(&tmp, e))?;
    writer
        .get_ref()
        .sync_all()
        .map_err(|e| RunnerError::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| RunnerError::io(&path, e))
}

/// Binary hashes remembered by path, size, modification time and inode, so
/// a binary is hashed again only after it was rebuilt.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BinaryHashes {
    entries: BTreeMap<String, (u64, i64, i64, u64, String)>,
}

impl BinaryHashes {
    /// Loads the remembered hashes (none when the file is absent or unreadable).
    pub fn load(path: &Path) -> BinaryHashes {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    /// Saves them.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| RunnerError::io(parent, e))?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string(self).expect("serialises"))
            .map_err(|e| RunnerError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| RunnerError::io(path, e))
    }

    /// The BLAKE3 hash of binary `path` (hashed once per build of it).
    pub fn hash(&mut self, path: &Path) -> Result<String> {
        let meta = std::fs::metadata(path).map_err(|e| RunnerError::io(path, e))?;
        let stamp = (meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino());
        let key = path.display().to_string();
        if let Some((len, s, ns, ino, hash)) = self.entries.get(&key)
            && (*len, *s, *ns, *ino) == stamp
        {
            return Ok(hash.clone());
        }
        let file = std::fs::File::open(path).map_err(|e| RunnerError::io(path, e))?;
        let mut hasher = blake3::Hasher::new();
        hasher
            .update_reader(file)
            .map_err(|e| RunnerError::io(path, e))?;
        let hash = hasher.finalize().to_hex().to_string();
        self.entries
            .insert(key, (stamp.0, stamp.1, stamp.2, stamp.3, hash.clone()));
        Ok(hash)
    }
}

/// Paths under the run directory that belong to the runner.
pub fn runner_dir(out: &Path) -> PathBuf {
    out.join("_runner")
}
