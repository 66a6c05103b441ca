//! The `household` planning world: an embedded, EB-ALFRED-like environment
//! for one-shot JSON action plans.
//!
//! - [`world`]: receptacles, objects, the fixed global action list (EB-ALFRED
//!   wording: `find a Apple`, `pick up the Apple`, `put down the object in
//!   hand`, `open the Fridge`, `turn on the Faucet`, `slice the Apple`) and
//!   the skills' preconditions and effects;
//! - [`task`]: the seven ALFRED task types, seeded scenes, the
//!   train/val/unseen splits, the expert planner (shortest plans) and the
//!   plan executor;
//! - [`text`]: what a policy reads and writes (prompt, expert response), the
//!   tasks-table rows and a tokenizer corpus;
//! - [`render`]: a task's scene image (a top-down map of its initial
//!   state) for a vision-language planner, carried by rows that ask for it.
//!
//! The `generate-tasks` stage (`embodyflow_worlds::generate`) draws this
//! world's tasks with [`generate_tasks`].
//!
//! Everything is pure Rust and deterministic from seeds; the executor keeps
//! the state in a few bytes and runs millions of plan steps per second.
//!
//! ```
//! use embodyflow_household::*;
//! let task = &generate_tasks(Split::Train, 7, 1)[0];
//! let plan = expert_plan(task);
//! let run = execute_ids(task, &plan);
//! assert!(run.success && run.step_valid.iter().all(|&v| v));
//! let text = prompt(task);
//! assert!(text.contains("put down the object in hand"));
//! let row = task_row(task);
//! assert_eq!(&task_from_row(&row).unwrap(), task);
//! ```

pub mod render;
pub mod task;
pub mod text;
pub mod world;

pub use task::{
    Execution, Goal, ObjectSpot, PlanStep, ReceptacleSpot, Scene, Split, StepJudgement, Task,
    TaskType, execute, execute_ids, expert_plan, generate_tasks, judge, reseed,
};
pub use text::{
    corpus, image_size, image_task_row, prompt, response_json, task_from_row, task_image, task_row,
};
pub use world::{Action, action_id, action_list};

/// Errors of the household world.
#[derive(Debug, thiserror::Error)]
pub enum HouseholdError {
    /// A split name other than train, val, unseen.
    #[error(transparent)]
    UnknownSplit(#[from] embodyflow_schemas::UnknownSplit),
    /// A task type name that is not an ALFRED task type.
    #[error(
        "unknown task type `{0}`; expected one of: pick_and_place, pick_clean_then_place, pick_heat_then_place, pick_cool_then_place, pick_two_obj_and_place, look_at_obj_in_light, pick_and_place_with_movable_recep"
    )]
    UnknownTaskType(String),
    /// A scene image size the renderer does not draw
    /// ([`render::check_size`]).
    #[error("scene image size {size} is outside {min}..={max} pixels")]
    ImageSize {
        /// The size asked for.
        size: usize,
        /// The smallest size drawn.
        min: usize,
        /// The largest size drawn.
        max: usize,
    },
    /// A tasks-table row that does not describe a household task.
    #[error("task `{task_id}`: {reason}")]
    BadTask {
        /// The row's task id.
        task_id: String,
        /// What was wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests;
