//! Checks before any stage runs: every stage binary is built, every path a
//! step reads that no step writes exists, every table a stage reads on every
//! run (its declaration, [`embodyflow_core::spec`]) is among the step's
//! inputs — written by the earlier step an input names, or on disk — and
//! every step's config resolves
//! (each stage is asked with `--print-config`, which resolves defaults,
//! `--config` and `--set` exactly as a run would and exits without reading
//! anything). One check per step and sweep variant, in parallel; an unknown
//! key or bad value is reported at the line of the `set` entry that gave it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::config::ConfigReport;
use embodyflow_core::manifest::{Manifest, is_table_dir};
use embodyflow_core::schemas::TableName;
use rayon::prelude::*;

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

/// Runs the checks; returns notes (e.g. a stage not built, under `dry_run`).
pub fn check_plan(plan: &Plan, bin_dir: &Path, dry_run: bool) -> Result<Vec<String>> {
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
    for instance in &plan.instances {
        check_reads(plan, instance)?;
    }
    // One check per step and variant: iterations differ only in values like
    // `${iter}`, which do not change the keys.
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&Instance> = Vec::new();
    for instance in &plan.instances {
        let variant = instance.id.split_once('@').map_or("", |(_, tag)| tag);
        if !seen.insert((instance.step.clone(), variant.to_string())) {
            continue;
        }
        let bin = binary(bin_dir, instance.stage.name);
        if !bin.is_file() {
            if dry_run {
                let note = format!(
                    "stage `{}` is not built ({}): keys of step `{}` not checked",
                    instance.stage.name,
                    bin.display(),
                    instance.step
                );
                if !notes.contains(&note) {
                    notes.push(note);
                }
                continue;
            }
            return Err(RunnerError::MissingBinary {
                step: instance.id.clone(),
                path: bin,
            });
        }
        todo.push(instance);
    }
    // A check that passed is remembered by the binary's hash and the
    // arguments, so a resumed or repeated run starts no process for it.
    let memo_path = crate::cache::runner_dir(&plan.out).join("checked.json");
    let mut memo: BTreeSet<String> = std::fs::read_to_string(&memo_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let mut hashes = crate::cache::BinaryHashes::load(
        &crate::cache::runner_dir(&plan.out).join("binaries.json"),
    );
    let mut keyed = Vec::new();
    for instance in todo {
        let hash = hashes.hash(&binary(bin_dir, instance.stage.name))?;
        let key = blake3::hash(format!("{hash}\n{:?}", instance.stage_args()).as_bytes())
            .to_hex()
            .to_string();
        if !memo.contains(&key) {
            keyed.push((instance, key));
        }
    }
    let results: Vec<Result<String>> = keyed
        .par_iter()
        .map(|(instance, key)| check_config(plan, instance, bin_dir).map(|()| key.clone()))
        .collect();
    for result in results {
        memo.insert(result?);
    }
    if !dry_run && std::fs::create_dir_all(crate::cache::runner_dir(&plan.out)).is_ok() {
        let _ = std::fs::write(
            &memo_path,
            serde_json::to_string(&memo).expect("serialises"),
        );
    }
    Ok(notes)
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

/// Every table the stage reads on every run is held by one of the inputs.
fn check_reads(plan: &Plan, instance: &Instance) -> Result<()> {
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
    match instance.stage.always_reads().find(|t| !held.contains(t)) {
        None => Ok(()),
        Some(table) => Err(RunnerError::Pipeline {
            file: plan.file.clone(),
            line: instance.line,
            message: format!(
                "step `{}` ({}) reads table `{table}` on every run, and none of its inputs holds it; inputs: [{}]",
                instance.id,
                instance.stage.name,
                described.join(", ")
            ),
        }),
    }
}

fn check_config(plan: &Plan, instance: &Instance, bin_dir: &Path) -> Result<()> {
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
        Some(_) if output.status.success() => Ok(()),
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
