//! The content-addressed step cache.
//!
//! A step instance's key is BLAKE3 over: the stage name and its binary's
//! BLAKE3 hash; its resolved config (what `STAGE --print-config` prints for
//! the step's `--config` and `--set`s: defaults, file and overrides layered
//! by the stage's own code, [`embodyflow_core::config`]), in its canonical
//! form (serde_json's text of the tree, keys sorted); its other arguments
//! (inputs, policy, teacher, seed, extra flags) with every path replaced by
//! the identity of what it holds; the shard count; the device kind; and the
//! numerics it computes with ([`embodyflow_core::numerics`]: the thread
//! count its step's `cpus` and `threads` key give, libtorch's CPU dispatch
//! level and version). So two argument lists that resolve to the same
//! config (a `--set` given twice, a default set explicitly, keys in another
//! order) have one key, and a step computed with another thread count or
//! dispatch level is not taken for this one. The identity of a table is
//! its manifest's `content_hash`, of a dataset directory the content hashes
//! of the tables in it (what a stage's `--input` finds), of a checkpoint its
//! `manifest.json` id plus the hashes of its small files (config,
//! tokenizer), of a config file its bytes' hash. Only manifests are read:
//! no data is rehashed, so hashing reads each shard zero times (the writer
//! hashed it once while writing).
//!
//! After a stage succeeds the runner writes `_step.json` into the step's
//! directory, last: the key, what it was computed from, the command, and
//! the content hashes of what the step wrote (the tables and checkpoints its
//! stage declares). A step is cached when that file exists, its key equals
//! the key computed now, and every output it lists still has that content
//! hash. A step killed midway has no `_step.json` and is run again.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use embodyflow_core::manifest::{Manifest, is_table_dir};
use embodyflow_core::numerics::{Fingerprint, Machine, fingerprint, libtorch_version};
use embodyflow_core::spec;
use embodyflow_core::threads::{ThreadsConfig, step_threads, thread_environment};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RunnerError};
use crate::plan::Instance;

/// File name of the completion record in a step's directory.
pub const STEP_FILE: &str = "_step.json";
/// Format tag of `_step.json`.
pub const STEP_FORMAT: &str = "embodyflow.step/2";

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

/// What an instance's key is computed from besides its arguments: the
/// hash of its stage binary, its resolved config and its numerics. The
/// runner computes it before the step runs; a cluster job is handed it
/// (`spec.json`) and keys the record it writes with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyInputs {
    /// BLAKE3 of the stage binary.
    pub binary: String,
    /// The resolved config (`--print-config`).
    pub config: serde_json::Value,
    /// The numerics it computes with.
    pub numerics: Fingerprint,
}

impl KeyInputs {
    /// The key inputs of `instance`, whose stage binary hashes to `binary`
    /// and whose config resolves to `config`, run on `machine`: its thread
    /// count is [`step_threads`] of its stage's pool, its resolved thread
    /// keys and its step's `cpus`.
    pub fn of(
        instance: &Instance,
        binary: &str,
        config: &serde_json::Value,
        machine: &Machine,
    ) -> KeyInputs {
        let pool = instance.stage.threads;
        // The stage resolved and checked these keys; defaults otherwise.
        let keys = ThreadsConfig::take_from(&mut config.clone(), pool).unwrap_or_default();
        let threads = step_threads(pool, &keys, instance.resources.cpus_or_default() as usize);
        KeyInputs {
            binary: binary.to_string(),
            config: config.clone(),
            numerics: fingerprint(pool, threads.unwrap_or(1), machine),
        }
    }
}

/// The environment every backend starts a process of `instance` with, on
/// `machine`: the thread count its step's `cpus` gives, in the variables
/// libtorch and rayon read ([`thread_environment`]), and libtorch's dispatch
/// level (`ATEN_CPU_CAPABILITY`), so that the process computes with the
/// numerics of its key wherever it runs.
pub fn process_environment(instance: &Instance, machine: &Machine) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        thread_environment(instance.resources.cpus_or_default() as usize)
            .into_iter()
            .map(|(var, value)| (var.to_string(), value))
            .collect();
    env.push((
        embodyflow_core::numerics::CAPABILITY_VAR.to_string(),
        machine.cpu_capability.to_string(),
    ));
    env
}

/// The machine the runner's stage processes compute on: libtorch's
/// dispatch level for a process started from here, and the version of the
/// libtorch the stage binaries in `bin_dir` load (the one their rpath names,
/// `bin_dir/../../.venv/libtorch`, else the one they were built against).
pub fn machine(bin_dir: &Path) -> Machine {
    let linked = bin_dir.join("../../.venv/libtorch");
    let built = option_env!("LIBTORCH").map(PathBuf::from);
    let libtorch = std::iter::once(linked)
        .chain(built)
        .find_map(|dir| libtorch_version(&dir))
        .unwrap_or_else(|| "unknown".to_string());
    Machine {
        cpu_capability: embodyflow_core::numerics::this_process_capability(),
        libtorch,
    }
}

/// The key of an instance: its arguments other than `--config` and `--set`
/// (the resolved config stands for them) with paths replaced by
/// identities, and `inputs` (see the module documentation).
pub fn step_key(instance: &Instance, inputs: &KeyInputs) -> Result<(String, serde_json::Value)> {
    let mut args = Vec::new();
    let mut iter = instance.stage_args().into_iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            // In the resolved config.
            "--config" | "--set" => {
                iter.next();
            }
            "--input" | "--policy" | "--teacher" => {
                let flag = arg;
                if let Some(path) = iter.next() {
                    // `--teacher self` names the policy, already in the key.
                    let value = if path == "self" && flag == "--teacher" {
                        path
                    } else {
                        identity(Path::new(&path))?
                    };
                    args.push(flag);
                    args.push(value);
                }
            }
            _ => args.push(arg),
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
        "binary": inputs.binary,
        "config": inputs.config,
        "args": args,
        "shards": instance.shards,
        "device": device_kind,
        "numerics": inputs.numerics,
    });
    // serde_json's text of a tree is canonical: object keys sorted (its
    // maps are ordered), numbers in their shortest form.
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

/// The record of a completed step that names only its instance, its wall
/// seconds and when it finished (tests that complete steps by hand).
#[cfg(test)]
pub(crate) fn test_record(instance: &Instance, wall_s: f64, finished_unix: u64) -> StepRecord {
    StepRecord {
        format: STEP_FORMAT.into(),
        key: "k".into(),
        key_parts: serde_json::Value::Null,
        id: instance.id.clone(),
        stage: instance.stage.name.into(),
        commands: Vec::new(),
        outputs: Vec::new(),
        wall_s,
        finished_unix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Pipeline;
    use crate::plan::{Overrides, Plan};
    use embodyflow_core::numerics::CpuCapability;
    use serde_json::json;

    /// Instances of a torch stage (collect-rollouts), a rayon stage
    /// (score-rewards) and a single-threaded one (generate-tasks), reading a
    /// policy file and a table directory under `dir`.
    fn instances(dir: &Path) -> Vec<Instance> {
        let policy = dir.join("policy.bin");
        std::fs::write(&policy, b"weights").unwrap();
        let text = format!(
            r#"
[[step]]
name = "tasks"
stage = "generate-tasks"
set = {{ split = "train" }}

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "{}"
set = {{ group_size = 3 }}

[[step]]
name = "score"
stage = "score-rewards"
"#,
            policy.display()
        );
        let pipeline = Pipeline::parse(Path::new("p.toml"), &text).unwrap();
        Plan::build(&pipeline, &dir.join("run"), &Overrides::default())
            .unwrap()
            .instances
    }

    fn machine() -> Machine {
        Machine {
            cpu_capability: CpuCapability::Avx2,
            libtorch: "2.13.0".into(),
        }
    }

    fn key(instance: &Instance, config: &serde_json::Value, machine: &Machine) -> String {
        step_key(instance, &KeyInputs::of(instance, "bin", config, machine))
            .unwrap()
            .0
    }

    #[test]
    fn argument_lists_that_resolve_to_one_config_have_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let all = instances(dir.path());
        let config = json!({"split": "train", "count": 8, "output": {"zstd_level": 3}});
        let tasks = &all[0];
        // The same setting given twice (a pipeline's `set` and a `--set
        // tasks.split=train`), or once in a config file: one resolved config.
        let mut twice = tasks.clone();
        twice.sets.push(("split".into(), "train".into(), 0));
        let mut by_file = tasks.clone();
        by_file.sets.clear();
        by_file.config = Some(dir.path().join("policy.bin"));
        for other in [&twice, &by_file] {
            assert_eq!(
                key(tasks, &config, &machine()),
                key(other, &config, &machine())
            );
        }
        // The canonical form: the order keys were written in does not count.
        let reordered: serde_json::Value =
            serde_json::from_str(r#"{"output": {"zstd_level": 3}, "count": 8, "split": "train"}"#)
                .unwrap();
        assert_eq!(
            key(tasks, &config, &machine()),
            key(tasks, &reordered, &machine())
        );
        // Another value is another key.
        let val = json!({"split": "val", "count": 8, "output": {"zstd_level": 3}});
        assert_ne!(
            key(tasks, &config, &machine()),
            key(tasks, &val, &machine())
        );
        // Paths, seeds and shards still count.
        let mut seeded = tasks.clone();
        seeded.seed = Some(4);
        assert_ne!(
            key(tasks, &config, &machine()),
            key(&seeded, &config, &machine())
        );
        let (_, parts) =
            step_key(tasks, &KeyInputs::of(tasks, "bin", &config, &machine())).unwrap();
        assert_eq!(parts["config"], config);
        assert!(
            !parts["args"].to_string().contains("--set"),
            "{}",
            parts["args"]
        );
    }

    #[test]
    fn the_key_holds_the_numerics_each_pool_depends_on() {
        let dir = tempfile::tempdir().unwrap();
        let all = instances(dir.path());
        let config = json!({"threads": 0});
        let (tasks, collect, score) = (&all[0], &all[1], &all[2]);
        let other_cpu = Machine {
            cpu_capability: CpuCapability::Avx512,
            ..machine()
        };
        let other_torch = Machine {
            libtorch: "2.14.0".into(),
            ..machine()
        };
        let mut two = [tasks.clone(), collect.clone(), score.clone()];
        for instance in &mut two {
            instance.resources.cpus = Some(2);
        }
        // A torch stage: threads, dispatch level and libtorch.
        let base = key(collect, &config, &machine());
        assert_ne!(base, key(&two[1], &config, &machine()));
        assert_ne!(base, key(collect, &config, &other_cpu));
        assert_ne!(base, key(collect, &config, &other_torch));
        // The `threads` key decides over `cpus`.
        let four = json!({"threads": 4});
        assert_eq!(
            key(collect, &four, &machine()),
            key(&two[1], &four, &machine())
        );
        let (_, parts) =
            step_key(collect, &KeyInputs::of(collect, "bin", &four, &machine())).unwrap();
        assert_eq!(
            parts["numerics"],
            json!({"threads": 4, "cpu_capability": "avx2", "libtorch": "2.13.0"})
        );
        // A rayon stage: threads alone.
        let base = key(score, &config, &machine());
        assert_ne!(base, key(&two[2], &config, &machine()));
        assert_eq!(base, key(score, &config, &other_cpu));
        // A single-threaded stage: none of them.
        let config = json!({"split": "train"});
        let base = key(tasks, &config, &machine());
        assert_eq!(base, key(&two[0], &config, &machine()));
        assert_eq!(base, key(tasks, &config, &other_torch));
    }

    #[test]
    fn every_process_gets_its_steps_thread_count_and_dispatch_level() {
        let dir = tempfile::tempdir().unwrap();
        let mut collect = instances(dir.path()).remove(1);
        let env = |instance: &Instance| -> Vec<String> {
            process_environment(instance, &machine())
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        assert_eq!(
            env(&collect),
            [
                "OMP_NUM_THREADS=1",
                "MKL_NUM_THREADS=1",
                "RAYON_NUM_THREADS=1",
                "ATEN_CPU_CAPABILITY=avx2"
            ]
        );
        collect.resources.cpus = Some(3);
        assert_eq!(
            env(&collect)[..3],
            [
                "OMP_NUM_THREADS=3",
                "MKL_NUM_THREADS=3",
                "RAYON_NUM_THREADS=3"
            ]
        );
    }
}
