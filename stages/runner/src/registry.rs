//! The backends, listed once ([`BACKENDS`]). The runner never names a
//! backend: `--backend` takes their names ([`possible_values`]), a file's
//! `[backend]` table is checked against what they declare ([`chosen`]:
//! `kind` one of their names, every key one a listed backend reads, each
//! backend's values), the run goes through the chosen one, and `pipeline
//! cancel` and the refusal of a run directory whose earlier jobs still run
//! ask every one of them.
//!
//! ```
//! use embodyflow_runner::registry::BACKENDS;
//! let names: Vec<&str> = BACKENDS.iter().map(|b| b.name()).collect();
//! assert_eq!(&names[..3], ["local", "slurm", "ray"]);
//! ```

use clap::builder::{PossibleValue, PossibleValuesParser};
use embodyflow_core::checks::either;

use crate::cluster::Backend;
use crate::error::{Result, RunnerError};
use crate::pipeline::Pipeline;
use crate::{local, ray, slurm};

/// Every backend the runner runs on, in the order `--help` names them.
pub static BACKENDS: &[&dyn Backend] = &[
    &local::LOCAL,
    &slurm::SLURM,
    &ray::RAY,
    #[cfg(test)]
    &crate::fake::FAKE,
];

/// The `[backend]` keys every backend reads.
const COMMON_KEYS: [&str; 4] = ["kind", "shared", "record_grace_s", "step"];

/// The backend named `name`.
pub fn find(name: &str) -> Option<&'static dyn Backend> {
    BACKENDS.iter().copied().find(|b| b.name() == name)
}

/// `--backend`'s values, each with its one line of help.
pub fn possible_values() -> PossibleValuesParser {
    PossibleValuesParser::new(
        BACKENDS
            .iter()
            .map(|b| PossibleValue::new(b.name()).help(b.about())),
    )
}

/// The backend a run uses (`--backend`, else the file's `[backend] kind`,
/// else local), once the file's `[backend]` table is checked: `kind` a
/// listed name, every key one that a listed backend reads (a file may hold
/// every backend's keys), each backend's values.
pub fn chosen(pipeline: &Pipeline, backend: Option<&str>) -> Result<&'static dyn Backend> {
    let table = &pipeline.backend;
    let err = |line: usize, message: String| RunnerError::Pipeline {
        file: pipeline.path.clone(),
        line,
        message,
    };
    check_keys("[backend]", table.keys.keys(), |b| b.keys(), &COMMON_KEYS)
        .map_err(|m| err(table.line, m))?;
    for (name, keys) in &table.steps {
        check_keys(
            &format!("[backend.step.{name}]"),
            keys.keys(),
            |b| b.step_keys(),
            &[],
        )
        .map_err(|m| err(table.line, m))?;
    }
    let kind = match &table.kind {
        None => local::LOCAL.name(),
        Some((kind, line)) => find(kind).map(|b| b.name()).ok_or_else(|| {
            let names: Vec<String> = BACKENDS.iter().map(|b| format!("`{}`", b.name())).collect();
            err(
                *line,
                format!("[backend] kind `{kind}`: expected {}", either(&names)),
            )
        })?,
    };
    for listed in BACKENDS {
        listed.check(table).map_err(|m| err(table.line, m))?;
    }
    let name = backend.unwrap_or(kind);
    find(name).ok_or_else(|| RunnerError::Usage(format!("--backend {name}: no such backend")))
}

/// Refuses a key of `table` that no listed backend reads.
fn check_keys<'a>(
    table: &str,
    keys: impl Iterator<Item = &'a String>,
    declared: impl Fn(&dyn Backend) -> Vec<(String, &'static str)>,
    common: &[&str],
) -> std::result::Result<(), String> {
    for key in keys {
        let known = common.contains(&key.as_str())
            || BACKENDS
                .iter()
                .any(|b| declared(*b).iter().any(|(k, _)| k == key));
        if !known {
            let mut read: Vec<String> = common.iter().map(|k| k.to_string()).collect();
            for b in BACKENDS {
                let keys: Vec<String> = declared(*b).into_iter().map(|(k, _)| k).collect();
                if !keys.is_empty() {
                    read.push(format!("{} ({})", keys.join(", "), b.name()));
                }
            }
            return Err(format!(
                "{table} unknown key `{key}`; the backends read {}",
                read.join(", ")
            ));
        }
    }
    Ok(())
}
