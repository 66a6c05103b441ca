//! Tasks-table rows: a generated task as a row of `tasks` (see
//! `schemas/tasks.toml`), and back.
//!
//! | column | value |
//! |---|---|
//! | `task_id` | `tabletop-<suite>/<split>/<seed>/<index>`; an initial state (LIBERO's protocol): `tabletop-<suite>/<seed>/<index>@<split>/<state>` |
//! | `suite` | `tabletop-<suite>` (`tabletop-spatial`, ...) |
//! | `env` | `tabletop` |
//! | `split` | `train`, `val`, `unseen`, or (initial states) `test` |
//! | `task_type` | the task family (`place_in_bowl`, `open_drawer`, `in_bowl_then_bowl_on_plate`, ...) |
//! | `seed` | a 64-bit mix of (suite, split, seed, index and the initial state, if any) ([`crate::suite::task_seed`]) |
//! | `instruction` | the instruction |
//! | `observation` | the whole [`TaskSpec`] as JSON: the world is rebuilt from it exactly, whatever later versions of the generator draw |
//! | `gt_actions` | null (the expert is a controller, not a plan of named actions) |
//!
//! ```
//! use embodyflow_tabletop::{Split, Suite, generate, task_from_row, task_row};
//! let task = generate(Suite::Long, Split::Unseen, 3, 5);
//! let row = task_row(&task);
//! assert_eq!((row.env.as_str(), row.suite.as_str()), ("tabletop", "tabletop-long"));
//! assert_eq!(task_from_row(&row).unwrap(), task);
//! ```

use embodyflow_core::schemas::TaskRow;

use crate::TabletopError;
use crate::scene::TaskSpec;
use crate::suite::task_seed;

/// The `env` column of a tabletop task.
pub const ENV: &str = "tabletop";

/// The tasks-table row of a task.
pub fn task_row(task: &TaskSpec) -> TaskRow {
    TaskRow {
        task_id: task.task_id(),
        suite: format!("{ENV}-{}", task.suite),
        env: ENV.into(),
        split: task.split.clone(),
        task_type: Some(task.task_type.clone()),
        seed: task_seed(&task.suite, &task.split, task.seed, task.index, task.state) as i64,
        instruction: task.instruction.clone(),
        observation: Some(serde_json::to_vec(task).expect("a task spec serializes")),
        gt_actions: None,
    }
}

/// The task of a tasks-table row: its JSON scene spec, checked against the
/// row's other columns and against the world's rules
/// ([`TaskSpec::validate`]).
pub fn task_from_row(row: &TaskRow) -> Result<TaskSpec, TabletopError> {
    let bad = |reason: String| TabletopError::BadRow {
        task_id: row.task_id.clone(),
        reason,
    };
    if row.env != ENV {
        return Err(bad(format!("env is `{}`, expected `{ENV}`", row.env)));
    }
    let bytes = row
        .observation
        .as_deref()
        .ok_or_else(|| bad("the observation column (the scene spec) is null".into()))?;
    let task: TaskSpec = serde_json::from_slice(bytes).map_err(|e| {
        bad(format!(
            "the observation column is not a tabletop scene spec: {e}"
        ))
    })?;
    let checks = [
        ("task_id", task.task_id(), row.task_id.clone()),
        ("suite", format!("{ENV}-{}", task.suite), row.suite.clone()),
        ("split", task.split.clone(), row.split.clone()),
        (
            "instruction",
            task.instruction.clone(),
            row.instruction.clone(),
        ),
    ];
    for (column, spec, found) in checks {
        if spec != found {
            return Err(bad(format!(
                "column `{column}` is `{found}` but the scene spec says `{spec}`"
            )));
        }
    }
    task.validate().map_err(|e| bad(e.to_string()))?;
    Ok(task)
}
