//! The environments a stage can run, chosen by each task row's `env` column,
//! behind one interface: the prompt a policy reads, the expert's answer (for
//! supervised fine-tuning) and the execution of an answer. Stages that run a
//! policy (`collect-rollouts`, `evaluate`, `update-policy --set
//! objective=sft`) go through here, so a new environment plugs in at one
//! place.
//!
//! One-shot planners answer with a JSON plan; the plan is extracted with the
//! tolerant parser shared with `score-rewards` and `compute-advantages`
//! ([`embodyflow_algos::plan::extract`]) and executed step by step: a broken
//! answer executes as an empty plan (no success), never a panic.
//!
//! A closed-loop world's rows (`tabletop`, `gym:<adapter>`) are no
//! environment of this crate: the registry of worlds, `embodyflow_worlds`,
//! tells them apart ([`ONE_SHOT`] lists the environments here).
//!
//! `score-rewards` executes already-extracted plans through
//! [`TaskEnv::execute_plan`]; `embodyflow_rollout` runs a policy on
//! many tasks through [`TaskEnv::prompt`] and [`TaskEnv::execute`].
//! [`context`] builds the teacher and student contexts around a prompt
//! (forward_proxy step rewards, and SFT of a teacher with reference plans).
//!
//! ```no_run
//! use embodyflow_envs::TaskEnv;
//! # let row: embodyflow_core::schemas::TaskRow = todo!();
//! let env = TaskEnv::from_row(&row, 0).unwrap();
//! let outcome = env.execute(&env.expert_answer().unwrap());
//! assert!(outcome.success);
//! ```

use embodyflow_algos::plan::{IdKind, Plan, PlanStep, extract};
use embodyflow_core::schemas::{PredictedAction, TaskRow};
use embodyflow_core::{Error, Result};
use embodyflow_household as household;
pub use household::StepJudgement;

pub mod context;

/// A task ready to run in its environment.
#[derive(Debug, Clone)]
pub enum TaskEnv {
    /// The embedded household planning world; `image_size`: the side of
    /// the scene image the task carries, if it does.
    Household {
        /// The task (its scene drawn for the run).
        task: household::Task,
        /// The scene image's side in pixels (`None`: the task has none).
        image_size: Option<usize>,
    },
}

/// The image a task shows the policy beside its prompt, RGB, rows top to
/// bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SceneImage {
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
    /// `height × width × 3` bytes.
    pub rgb: Vec<u8>,
}

/// What executing an answer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the goal was reached.
    pub success: bool,
    /// Environment steps executed.
    pub env_steps: usize,
    /// Whether a plan could be extracted from the answer.
    pub parsed: bool,
    /// Validity of each executed plan step.
    pub step_valid: Vec<bool>,
}

impl TaskEnv {
    /// The environment of `row`; `run` > 0 draws another scene layout for the
    /// same goal (evaluation averages over runs).
    pub fn from_row(row: &TaskRow, run: u32) -> Result<TaskEnv> {
        match row.env.as_str() {
            "household" => {
                let bad = |e: household::HouseholdError| {
                    Error::BadInput(format!("task `{}`: {e}", row.task_id))
                };
                let task = household::task_from_row(row).map_err(bad)?;
                Ok(TaskEnv::Household {
                    task: household::reseed(&task, run),
                    image_size: household::image_size(row).map_err(bad)?,
                })
            }
            other => Err(Error::BadInput(format!(
                "task `{}`: environment `{other}` is not built in (known: {})",
                row.task_id,
                ONE_SHOT.join(", ")
            ))),
        }
    }

    /// The task's id.
    pub fn task_id(&self) -> &str {
        match self {
            TaskEnv::Household { task, .. } => &task.task_id,
        }
    }

    /// The prompt text the policy reads.
    pub fn prompt(&self) -> String {
        match self {
            TaskEnv::Household { task, .. } => household::prompt(task),
        }
    }

    /// The scene image the policy sees beside the prompt, when the task
    /// carries one: the household's top-down map of the run's scene
    /// (`embodyflow_household::render`), drawn again from the task row
    /// each time (the same bytes every time).
    pub fn image(&self) -> Option<SceneImage> {
        match self {
            TaskEnv::Household { task, image_size } => image_size.map(|size| SceneImage {
                height: size,
                width: size,
                rgb: household::render::render(task, size)
                    .expect("the size was checked when the row was read"),
            }),
        }
    }

    /// The expert's answer text, when the environment has an expert.
    pub fn expert_answer(&self) -> Option<String> {
        match self {
            TaskEnv::Household { task, .. } => {
                Some(household::response_json(&household::expert_plan(task)))
            }
        }
    }

    /// Extracts the plan of an answer and executes it; an answer without a
    /// plan executes as an empty plan.
    pub fn execute(&self, answer: &str) -> Outcome {
        match extract(answer) {
            Some(plan) => self.execute_plan(&plan),
            None => Outcome {
                parsed: false,
                ..self.execute_steps(&[])
            },
        }
    }

    /// Executes an extracted plan step by step.
    pub fn execute_plan(&self, plan: &Plan) -> Outcome {
        self.execute_steps(&plan.steps)
    }

    fn execute_steps(&self, steps: &[PlanStep]) -> Outcome {
        match self {
            TaskEnv::Household { task, .. } => {
                let steps = household_steps(steps.iter().map(|s| (executed_id(s), &s.action_name)));
                let execution = household::execute(task, &steps);
                Outcome {
                    success: execution.success,
                    env_steps: execution.env_steps,
                    parsed: true,
                    step_valid: execution.step_valid,
                }
            }
        }
    }

    /// The built-in rule judge's verdict on each step of a predicted plan
    /// (decision, redundancy, causality: see [`StepJudgement`]).
    pub fn judge(&self, plan: &[PredictedAction]) -> Vec<StepJudgement> {
        match self {
            TaskEnv::Household { task, .. } => {
                let steps = household_steps(plan.iter().map(|s| (s.action_id, &s.action_name)));
                household::judge(task, &steps)
            }
        }
    }

    /// Whether `env` names an environment built in here.
    pub fn is_built_in(env: &str) -> bool {
        ONE_SHOT.contains(&env)
    }
}

/// The `env` of every one-shot environment built in here. Closed-loop
/// worlds are not environments of this crate: `embodyflow_worlds` (above
/// it) lists them and refuses their rows in a one-shot stage by name
/// (`embodyflow_worlds::one_shot`).
pub const ONE_SHOT: &[&str] = &["household"];

/// The language of the built-in environments, for training a policy's
/// tokenizer: the prompts and expert answers of `count` generated training
/// tasks per environment (household), drawn from `seed`.
pub fn corpus(count: usize, seed: u64) -> Vec<String> {
    household::corpus(count, seed)
}

/// The id a predicted step is executed by: its integer id; none when it has
/// no id (the executor then looks its name up); and an id that names no
/// action (-1: an invalid step) when its id is an integer beyond i64 or a
/// bool — ids that exist but name nothing, never replaced by the name.
fn executed_id(step: &PlanStep) -> Option<i64> {
    match step.id_kind {
        IdKind::BigInteger | IdKind::Bool => Some(-1),
        IdKind::Integer | IdKind::Missing | IdKind::Other => step.action_id,
    }
}

/// Predicted steps (id, name) as the household executor takes them.
fn household_steps<'a>(
    steps: impl Iterator<Item = (Option<i64>, &'a Option<String>)>,
) -> Vec<household::PlanStep> {
    steps
        .map(|(action_id, action_name)| household::PlanStep {
            action_id,
            action_name: action_name.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envs() -> Vec<TaskEnv> {
        household::generate_tasks(household::Split::Train, 4, 21)
            .iter()
            .map(|task| TaskEnv::from_row(&household::task_row(task), 0).unwrap())
            .collect()
    }

    #[test]
    fn expert_answers_succeed_in_every_run() {
        for env in envs() {
            assert!(env.execute(&env.expert_answer().unwrap()).success);
            let TaskEnv::Household { task, .. } = &env;
            let row = household::task_row(task);
            for run in 1..3 {
                let other = TaskEnv::from_row(&row, run).unwrap();
                let outcome = other.execute(&other.expert_answer().unwrap());
                assert!(outcome.success && outcome.parsed);
                assert!(outcome.step_valid.iter().all(|&v| v));
            }
        }
    }

    #[test]
    fn an_id_beyond_i64_or_a_bool_id_is_an_invalid_step_never_run_by_name() {
        let env = &envs()[0];
        let answer = env.expert_answer().unwrap();
        let plan_at = answer.find("\"executable_plan\"").unwrap();
        let id_at = plan_at + answer[plan_at..].find("\"action_id\":").unwrap() + 12;
        let digits = answer[id_at..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .count();
        let start = id_at + (answer[id_at..].len() - answer[id_at..].trim_start().len());
        let with_id = |id: &str| format!("{}{id}{}", &answer[..start], &answer[start + digits..]);
        for id in ["99999999999999999999999", "true"] {
            let outcome = env.execute(&with_id(id));
            assert!(!outcome.step_valid[0], "{id}: {outcome:?}");
            assert!(!outcome.success, "{id}");
        }
        // The same step with its id as an integer runs.
        assert!(
            env.execute(&with_id(&answer[start..start + digits]))
                .step_valid[0]
        );
    }

    #[test]
    fn broken_answers_fail_without_panicking() {
        let env = &envs()[0];
        for answer in [
            "",
            "{\"executable_plan\": [",
            "not json at all",
            "{\"executable_plan\": [{\"action_id\": 99999, \"action_name\": \"fly\"}, {\"action_id\": -3}]}",
            "```json\n{\"executable_plan\": [{\"action_name\": \"put down the object in hand\"}]}\n```",
        ] {
            let outcome = env.execute(answer);
            assert!(!outcome.success, "{answer}");
            assert!(
                outcome.step_valid.iter().all(|&v| !v),
                "{answer}: {outcome:?}"
            );
        }
        assert!(!env.execute("not json at all").parsed);
    }

    /// A task row with a scene image shows it: run 0 the row's own
    /// (`household::task_image`), a later run the map of its own scene; a
    /// row without one shows none.
    #[test]
    fn a_task_with_a_scene_image_shows_the_map_of_its_runs_scene() {
        let task = &household::generate_tasks(household::Split::Train, 4, 21)[0];
        let row = household::image_task_row(task, Some(32)).unwrap();
        let (size, bytes) = household::task_image(&row).unwrap().unwrap();
        let image = TaskEnv::from_row(&row, 0).unwrap().image().unwrap();
        assert_eq!(
            (image.height, image.width, &image.rgb),
            (size, size, &bytes)
        );
        let TaskEnv::Household { task: other, .. } = TaskEnv::from_row(&row, 1).unwrap();
        let later = TaskEnv::from_row(&row, 1).unwrap().image().unwrap();
        assert_eq!(later.rgb, household::render::render(&other, 32).unwrap());
        assert!(
            TaskEnv::from_row(&household::task_row(task), 0)
                .unwrap()
                .image()
                .is_none()
        );
    }

    #[test]
    fn unknown_environments_are_named() {
        let TaskEnv::Household { task, .. } = &envs()[0];
        let mut row = household::task_row(task);
        for env in ["gym", "tabletop"] {
            row.env = env.into();
            let error = TaskEnv::from_row(&row, 0).unwrap_err().to_string();
            assert!(
                error.contains(&format!("`{env}` is not built in (known: household)"))
                    && error.contains(&row.task_id),
                "{error}"
            );
        }
        assert!(TaskEnv::is_built_in("household") && !TaskEnv::is_built_in("tabletop"));
    }
}
