//! Checks before any stage runs: every stage binary is built, every path a
//! step reads that no step writes exists, every step's config resolves
//! (each stage is asked with `--print-config`, which resolves defaults,
//! `--config` and `--set` exactly as a run would and exits without reading
//! anything; an unknown key or bad value is reported at the line of the
//! `set` entry that gave it), and every table a stage reads (its
//! declaration, [`embodyflow_core::spec`]) is among the step's inputs —
//! written by the earlier step an input names, or on disk. A table read on
//! every run must be there; one read under a condition (update-policy's
//! `tasks` when `objective = sft`, compute-advantages' `step_gates` when its
//! estimator gates steps by prompt) must be there when the stage says its
//! resolved config reads it: `--print-config` reports those tables
//! (`reads`, [`embodyflow_core::config::StageConfig::reads`]), computed by
//! the stage from the declarations it runs, so the pre-check decides every
//! conditional read the way the run opens it.
//!
//! The resolved configs are what the cache keys on ([`crate::cache`]). One
//! `--print-config` per distinct stage binary, `--config` file and `--set`
//! list, in parallel; a resolved config and its reads are remembered in
//! `OUT/_runner/configs.json` by the binary's hash, the config file's
//! identity and the `--set`s, so a resumed or repeated run starts no
//! process for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::config::ConfigReport;
use embodyflow_core::manifest::{Manifest, is_table_dir};
use embodyflow_core::schemas::TableName;
use embodyflow_core::spec::Need;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, RunnerError};
use crate::plan::{Instance, Plan};

/// Where stage `stage`'s binary is.
pub fn binary(bin_dir: &Path, stage: &str) -> PathBuf {
    bin_dir.join(stage)
}

/// The line of the setting a config problem is about.
pub fn line_of_key(instance: &Instance, key: Option<&str>) -> usize {
    let Some(key) = key else {
        return instance.config_line;
    };
    instance
        .sets
        .iter()
        .rev()
        .find(|(k, _, _)| {
            k == key || k.starts_with(&format!("{key}.")) || key.starts_with(&format!("{k}."))
        })
        .map_or(instance.config_line, |(_, _, line)| *line)
}

/// What the checks found: notes (a stage not built, under a dry run) and
/// each instance's resolved config (none for a stage not built).
#[derive(Debug, Default)]
pub struct Checked {
    /// Notes for the user.
    pub notes: Vec<String>,
    /// The resolved config of each instance, in plan order.
    pub configs: Vec<Option<Value>>,
}

/// What `--print-config` resolved for a step: its config and the tables
/// that config reads beyond the stage's every-run reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepConfig {
    config: Value,
    /// Table names, each a conditional read of the stage (checked when
    /// resolved).
    reads: Vec<String>,
}

impl StepConfig {
    fn tables(&self) -> Vec<TableName> {
        self.reads
            .iter()
            .filter_map(|name| name.parse().ok())
            .collect()
    }
}

/// Runs the checks and resolves every instance's config.
pub fn check_plan(plan: &Plan, bin_dir: &Path, dry_run: bool) -> Result<Checked> {
    let mut notes = Vec::new();
    for instance in &plan.instances {
        for path in &instance.external {
            if !path.exists() {
                return Err(RunnerError::Pipeline {
                    file: plan.file.clone(),
                    line: instance.line,
                    message: format!(
                        "step `{}`: {} does not exist and no earlier step writes it",
                        instance.id,
                        path.display()
                    ),
                });
            }
        }
    }
    let mut built = BTreeMap::new();
    let mut hashes = crate::cache::BinaryHashes::load(
        &crate::cache::runner_dir(&plan.out).join("binaries.json"),
    );
    for instance in &plan.instances {
        let name = instance.stage.name;
        if built.contains_key(name) {
            continue;
        }
        let bin = binary(bin_dir, name);
        if bin.is_file() {
            built.insert(name, Some(hashes.hash(&bin)?));
        } else if dry_run {
            notes.push(format!(
                "stage `{name}` is not built ({}): keys of its steps not checked",
                bin.display()
            ));
            built.insert(name, None);
        } else {
            return Err(RunnerError::MissingBinary {
                step: instance.id.clone(),
                path: bin,
            });
        }
    }
    // The instances by what their config resolves from.
    let memo_path = crate::cache::runner_dir(&plan.out).join("configs.json");
    let mut memo: BTreeMap<String, StepConfig> = std::fs::read_to_string(&memo_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let mut memo_keys: Vec<Option<String>> = Vec::new();
    let mut todo: BTreeMap<String, &Instance> = BTreeMap::new();
    for instance in &plan.instances {
        let Some(Some(hash)) = built.get(instance.stage.name) else {
            memo_keys.push(None);
            continue;
        };
        let config = match &instance.config {
            Some(path) => Some(crate::cache::identity(path)?),
            None => None,
        };
        let sets: Vec<(&str, &str)> = instance
            .sets
            .iter()
            .map(|(k, v, _)| (k.as_str(), v.as_str()))
            .collect();
        let key = blake3::hash(
            serde_json::json!([hash, config, sets, instance.extra])
                .to_string()
                .as_bytes(),
        )
        .to_hex()
        .to_string();
        if !memo.contains_key(&key) {
            todo.entry(key.clone()).or_insert(instance);
        }
        memo_keys.push(Some(key));
    }
    let todo: Vec<(String, &Instance)> = todo.into_iter().collect();
    let results: Vec<Result<(String, StepConfig)>> = todo
        .par_iter()
        .map(|(key, instance)| resolve_config(plan, instance, bin_dir).map(|c| (key.clone(), c)))
        .collect();
    // Report the first problem in plan order.
    let mut problems = Vec::new();
    for result in results {
        match result {
            Ok((key, config)) => {
                memo.insert(key, config);
            }
            Err(e) => problems.push(e),
        }
    }
    if let Some(first) = problems.into_iter().min_by_key(|e| match e {
        RunnerError::Pipeline { line, .. } => *line,
        _ => usize::MAX,
    }) {
        return Err(first);
    }
    if !dry_run && crate::exec::private_runner_dir(&plan.out).is_ok() {
        let _ = std::fs::write(
            &memo_path,
            serde_json::to_string(&memo).expect("serialises"),
        );
    }
    let resolved: Vec<Option<StepConfig>> = memo_keys
        .into_iter()
        .map(|key| key.and_then(|k| memo.get(&k).cloned()))
        .collect();
    for (instance, step) in plan.instances.iter().zip(&resolved) {
        check_reads(
            plan,
            instance,
            step.as_ref().map(StepConfig::tables).as_deref(),
        )?;
    }
    let configs = resolved.into_iter().map(|s| s.map(|s| s.config)).collect();
    Ok(Checked { notes, configs })
}

/// The tables input `input` of `instance` holds: those its producing step's
/// stage declares when it names an earlier step's directory (or one table
/// in it), those on disk otherwise; `None` when that cannot be known.
fn tables_of(plan: &Plan, instance: &Instance, input: &Path) -> Option<Vec<TableName>> {
    for &dep in &instance.deps {
        let producer = &plan.instances[dep];
        if input == producer.dir {
            return Some(producer.stage.written_tables().collect());
        }
        if let Ok(rest) = input.strip_prefix(&producer.dir) {
            let table: TableName = rest.to_str()?.parse().ok()?;
            return producer.stage.writes_table(table).then(|| vec![table]);
        }
    }
    if is_table_dir(input) {
        return Some(vec![Manifest::read(input).ok()?.table.parse().ok()?]);
    }
    let tables = crate::cache::tables_in(input).ok()?;
    Some(tables.keys().filter_map(|t| t.parse().ok()).collect())
}

/// Every table the stage reads on every run, and every table its resolved
/// config reads (`reads`: none known when its stage is not built), is held
/// by one of the inputs.
fn check_reads(plan: &Plan, instance: &Instance, reads: Option<&[TableName]>) -> Result<()> {
    let mut held = Vec::new();
    let mut described = Vec::new();
    for input in &instance.inputs {
        // An input whose tables cannot be known leaves the stage to decide.
        let Some(tables) = tables_of(plan, instance, input) else {
            return Ok(());
        };
        let names: Vec<&str> = tables.iter().map(|t| t.as_str()).collect();
        described.push(format!("{} ({})", input.display(), names.join(", ")));
        held.extend(tables);
    }
    let needed = instance.stage.reads.iter().find(|read| {
        let needed = match read.need {
            Need::Always => true,
            Need::When(_) => reads.is_some_and(|reads| reads.contains(&read.table)),
        };
        needed && !held.contains(&read.table)
    });
    match needed {
        None => Ok(()),
        Some(read) => Err(RunnerError::Pipeline {
            file: plan.file.clone(),
            line: instance.line,
            message: format!(
                "step `{}` ({}) reads table `{}` {}, and none of its inputs holds it; inputs: [{}]",
                instance.id,
                instance.stage.name,
                read.table,
                match read.need {
                    Need::Always => "on every run".to_string(),
                    Need::When(condition) => format!("when {condition}, as its config has it"),
                },
                described.join(", ")
            ),
        }),
    }
}

/// The config `instance`'s stage resolves (`--print-config`); a problem
/// is reported at the line of the setting it names.
fn resolve_config(plan: &Plan, instance: &Instance, bin_dir: &Path) -> Result<StepConfig> {
    let bin = binary(bin_dir, instance.stage.name);
    let output = Command::new(&bin)
        .args(instance.stage_args())
        .arg("--out")
        .arg(&instance.dir)
        .arg("--print-config")
        .output()
        .map_err(|e| RunnerError::io(&bin, e))?;
    let report: Option<ConfigReport> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok());
    let err = |line: usize, message: String| RunnerError::Pipeline {
        file: plan.file.clone(),
        line,
        message: format!(
            "step `{}` ({}): {message}",
            instance.id, instance.stage.name
        ),
    };
    match report {
        Some(ConfigReport {
            problem: Some(problem),
            ..
        }) => Err(err(
            line_of_key(instance, problem.key.as_deref()),
            problem.message,
        )),
        Some(ConfigReport {
            config: Some(config),
            reads,
            ..
        }) if output.status.success() => {
            let tables = reads
                .iter()
                .map(|name| {
                    name.parse::<TableName>().map_err(|_| {
                        err(
                            instance.line,
                            format!(
                                "`{} --print-config` reports reading an unknown table `{name}`",
                                bin.display()
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            // Only a table the stage declares as a conditional read.
            if let Some(table) = tables.iter().find(|table| {
                !instance
                    .stage
                    .reads
                    .iter()
                    .any(|read| read.table == **table && matches!(read.need, Need::When(_)))
            }) {
                return Err(err(
                    instance.line,
                    format!(
                        "`{} --print-config` reports reading table `{table}`, which its stage does not declare as a conditional read",
                        bin.display()
                    ),
                ));
            }
            Ok(StepConfig { config, reads })
        }
        _ => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(err(
                instance.line,
                format!(
                    "`{} --print-config` did not report its config (exit {}): {}{}",
                    bin.display(),
                    output.status.code().unwrap_or(-1),
                    tail.join(" / "),
                    if stderr.contains("--print-config") {
                        " (the binary predates --print-config: rebuild with `cargo build --release --bins`)"
                    } else {
                        ""
                    }
                ),
            ))
        }
    }
}
