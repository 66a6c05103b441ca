//! One serde row struct per table, field for field the columns of its schema
//! file (same names, order, types and nullability: `Option` for nullable).
//! The shard layer converts between slices of rows and record batches with
//! the schema of the file, so rows are the convenient path; hot loops read the
//! Arrow columns directly instead.

use serde::{Deserialize, Serialize};

use crate::TableName;

/// A row type of one table.
pub trait Row: Serialize + for<'de> Deserialize<'de> + Send + Sync + 'static {
    /// The table the row belongs to.
    const TABLE: TableName;
}

macro_rules! row {
    ($table:ident, $(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub struct $name { $($body)* }
        impl Row for $name {
            const TABLE: TableName = TableName::$table;
        }
    };
}

/// One action of a plan: an id in the environment's action list and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PlanAction {
    /// Index in the environment's enumerated action list (i64, as in
    /// [`PredictedAction`] and the rewards table).
    pub action_id: i64,
    /// The action's text, e.g. `find a Mug`.
    pub action_name: String,
}

/// One predicted plan step as parsed from a response; either part may be
/// missing or malformed in model output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PredictedAction {
    /// The id when the response gave an integer.
    pub action_id: Option<i64>,
    /// The name when the response gave a string.
    pub action_name: Option<String>,
}

row!(
    Tasks,
    /// A row of `tasks` (see `schemas/tasks.toml` for each column's meaning).
    #[allow(missing_docs)]
    pub struct TaskRow {
        pub task_id: String,
        pub suite: String,
        pub env: String,
        pub split: String,
        pub task_type: Option<String>,
        pub seed: i64,
        pub instruction: String,
        #[serde(with = "serde_bytes", default)]
        pub observation: Option<Vec<u8>>,
        pub gt_actions: Option<Vec<PlanAction>>,
    }
);

row!(
    Trajectories,
    /// A row of `trajectories` (see `schemas/trajectories.toml`).
    #[allow(missing_docs)]
    pub struct TrajectoryRow {
        pub trajectory_id: String,
        pub group_id: String,
        pub task_id: String,
        pub sample_index: i32,
        pub iteration: i32,
        pub policy: String,
        pub temperature: f32,
        pub num_steps: i32,
        pub env_steps: i32,
        pub complete: bool,
        pub response_text: Option<String>,
        pub seed: i64,
        pub ever_grasped: Option<bool>,
        pub failure_reason: Option<String>,
        pub infra_fault: Option<bool>,
        pub source_row: Option<i64>,
    }
);

/// What separates a task from its initial state in a task id:
/// `<task>@<initial state>` (the tabletop world's LIBERO protocol writes
/// `tabletop-goal/1/000003@train/0007`).
pub const INITIAL_STATE_SEPARATOR: char = '@';

impl TaskRow {
    /// The task a row poses: its id up to [`INITIAL_STATE_SEPARATOR`], so
    /// the rows of one task drawn at several initial states share it; a
    /// row without one is a task of its own.
    ///
    /// ```
    /// use embodyflow_schemas::TaskRow;
    /// let row = |id: &str| TaskRow {
    ///     task_id: id.into(), suite: "s".into(), env: "tabletop".into(), split: "train".into(),
    ///     task_type: None, seed: 0, instruction: "i".into(), observation: None, gt_actions: None,
    /// };
    /// assert_eq!(row("tabletop-goal/1/000003@train/0007").task_key(), "tabletop-goal/1/000003");
    /// assert_eq!(row("household/train/7/000042").task_key(), "household/train/7/000042");
    /// ```
    pub fn task_key(&self) -> &str {
        task_key(&self.task_id)
    }
}

/// The task a task id poses ([`TaskRow::task_key`]): the id up to
/// [`INITIAL_STATE_SEPARATOR`], for tables that carry the id alone (`eval`,
/// `trajectories`).
///
/// ```
/// assert_eq!(embodyflow_schemas::task_key("tabletop-goal/1/000003@test/0002"), "tabletop-goal/1/000003");
/// ```
pub fn task_key(task_id: &str) -> &str {
    task_id
        .split_once(INITIAL_STATE_SEPARATOR)
        .map_or(task_id, |(task, _)| task)
}

impl TrajectoryRow {
    /// Whether infrastructure ended the episode (`infra_fault`; null, as
    /// in tables written before the column, is no fault).
    pub fn faulted(&self) -> bool {
        self.infra_fault == Some(true)
    }
}

row!(
    Steps,
    /// A row of `steps` (see `schemas/steps.toml`).
    #[allow(missing_docs)]
    pub struct StepRow {
        pub trajectory_id: String,
        pub step_index: i32,
        pub prompt_ids: Vec<i32>,
        pub response_ids: Vec<i32>,
        pub old_logprobs: Vec<f32>,
        #[serde(with = "serde_bytes", default)]
        pub observation: Option<Vec<u8>>,
        pub old_value: Option<f32>,
        pub old_values: Option<Vec<f32>>,
        pub latents: Option<Vec<f32>>,
        pub latent_dim: Option<i32>,
        pub chosen_latent_len: Option<i32>,
        pub old_latent_end_logprob: Option<f32>,
        pub anchor_key: Option<String>,
        pub response_mask: Option<Vec<bool>>,
    }
);

impl StepRow {
    /// The single step of a one-shot plan (a whole JSON plan is one
    /// decision): token ids and behaviour log-probs, no values or latents.
    pub fn one_shot(
        trajectory_id: String,
        prompt_ids: Vec<i32>,
        response_ids: Vec<i32>,
        old_logprobs: Vec<f32>,
    ) -> StepRow {
        StepRow {
            trajectory_id,
            step_index: 0,
            prompt_ids,
            response_ids,
            old_logprobs,
            observation: None,
            old_value: None,
            old_values: None,
            latents: None,
            latent_dim: None,
            chosen_latent_len: None,
            old_latent_end_logprob: None,
            anchor_key: None,
            response_mask: None,
        }
    }
}

row!(
    Rewards,
    /// A row of `rewards` (see `schemas/rewards.toml`).
    #[allow(missing_docs)]
    pub struct RewardRow {
        pub trajectory_id: String,
        pub group_id: String,
        pub score: f32,
        pub format: f32,
        pub accuracy: f32,
        pub success: bool,
        pub parse_ok: bool,
        pub pred_actions: Option<Vec<PredictedAction>>,
        pub step_match: Option<Vec<i8>>,
        pub step_valid: Option<Vec<bool>>,
        pub reward_fn: String,
        pub ever_grasped: Option<bool>,
        pub token_rewards: Option<Vec<f32>>,
        pub infra_fault: Option<bool>,
    }
);

impl RewardRow {
    /// Whether infrastructure ended the scored episode (`infra_fault`;
    /// null is no fault).
    pub fn faulted(&self) -> bool {
        self.infra_fault == Some(true)
    }
}

/// Relative tolerance (absolute below 1) within which a rewards row's
/// `score` must equal the sum of its `token_rewards`: compute-advantages
/// and `table import` check it alike.
pub const TOKEN_SUM_TOLERANCE: f64 = 1e-4;

/// The sum of `token_rewards` accumulated in f64, and whether `score`
/// agrees with it within [`TOKEN_SUM_TOLERANCE`] relative (absolute below 1).
///
/// ```
/// use embodyflow_schemas::token_sum;
/// assert_eq!(token_sum(1.0, &[0.25, 0.75]), (1.0, true));
/// assert_eq!(token_sum(1.0, &[0.25, 0.5]), (0.75, false));
/// ```
pub fn token_sum(score: f32, token_rewards: &[f32]) -> (f64, bool) {
    let sum = token_rewards.iter().map(|&r| f64::from(r)).sum::<f64>();
    let score = f64::from(score);
    let scale = score.abs().max(sum.abs()).max(1.0);
    (sum, (score - sum).abs() <= TOKEN_SUM_TOLERANCE * scale)
}

row!(
    TeacherLogp,
    /// A row of `teacher_logp` (see `schemas/teacher_logp.toml`).
    #[allow(missing_docs)]
    pub struct TeacherLogpRow {
        pub trajectory_id: String,
        pub step_index: i32,
        pub teacher_logp: Vec<f32>,
        pub student_logp: Vec<f32>,
        pub teacher: String,
        pub template: String,
    }
);

row!(
    StepGates,
    /// A row of `step_gates` (see `schemas/step_gates.toml`).
    #[allow(missing_docs)]
    pub struct StepGateRow {
        pub trajectory_id: String,
        pub plan_step: i32,
        pub decision_gate: f32,
        pub redundancy_gate: f32,
        pub causal_gate: f32,
        pub prompt_kl_score: Option<f32>,
        pub reason: Option<String>,
    }
);

row!(
    Advantages,
    /// A row of `advantages` (see `schemas/advantages.toml`).
    #[allow(missing_docs)]
    pub struct AdvantageRow {
        pub trajectory_id: String,
        pub step_index: i32,
        pub advantages: Vec<f32>,
        pub returns: Option<Vec<f32>>,
        pub episode_adv: f32,
        pub step_adv: Option<Vec<f32>>,
        pub estimator: String,
    }
);

row!(
    Metrics,
    /// A row of `metrics` (see `schemas/metrics.toml`).
    #[allow(missing_docs)]
    pub struct MetricRow {
        pub iteration: i32,
        pub update: i32,
        pub loss: f32,
        pub pg_loss: f32,
        pub clipfrac: Option<f32>,
        pub clipfrac_lower: Option<f32>,
        pub approx_kl: Option<f32>,
        pub entropy: f32,
        pub kl_loss: Option<f32>,
        pub latent_loss: Option<f32>,
        pub end_loss: Option<f32>,
        pub value_loss: Option<f32>,
        pub grad_norm: f32,
        pub lr: f32,
    }
);

row!(
    Eval,
    /// A row of `eval` (see `schemas/eval.toml`).
    #[allow(missing_docs)]
    pub struct EvalRow {
        pub task_id: String,
        pub run: i32,
        pub split: String,
        pub task_type: Option<String>,
        pub policy: String,
        pub success: bool,
        pub num_steps: i32,
        pub env_steps: i32,
        pub ever_grasped: Option<bool>,
        pub failure_reason: Option<String>,
    }
);

/// Example rows of a table: realistic values, nulls and non-ASCII text
/// included. `table schema NAME` prints them as JSON lines to show the import
/// format, and tests round-trip them.
pub trait Examples: Row {
    /// A few rows of the table.
    fn examples() -> Vec<Self>;
}

fn plan(steps: &[(i64, &str)]) -> Vec<PlanAction> {
    steps
        .iter()
        .map(|&(action_id, name)| PlanAction {
            action_id,
            action_name: name.to_string(),
        })
        .collect()
}

impl Examples for TaskRow {
    fn examples() -> Vec<Self> {
        vec![
            TaskRow {
                task_id: "household/train/7/000000".into(),
                suite: "household".into(),
                env: "household".into(),
                split: "train".into(),
                task_type: Some("pick_heat_then_place".into()),
                seed: 7,
                instruction: "Put a warm apple on the dining table.".into(),
                observation: Some(b"{\"objects\":[\"Apple\"]}".to_vec()),
                gt_actions: Some(plan(&[
                    (12, "find a Apple"),
                    (40, "pick up the Apple"),
                    (3, "find a Microwave"),
                ])),
            },
            TaskRow {
                task_id: "eb-alfred/unseen/0/000001".into(),
                suite: "eb-alfred".into(),
                env: "bridge:eb-alfred".into(),
                split: "unseen".into(),
                task_type: None,
                seed: -1,
                instruction: "把杯子放进水槽 — rinse the mug".into(),
                observation: None,
                gt_actions: None,
            },
        ]
    }
}

impl Examples for TrajectoryRow {
    fn examples() -> Vec<Self> {
        (0..2)
            .map(|s| TrajectoryRow {
                source_row: None,
                failure_reason: None,
                trajectory_id: format!("it0/household/train/7/000000/d0/s{s}"),
                group_id: "it0/household/train/7/000000/d0".into(),
                task_id: "household/train/7/000000".into(),
                sample_index: s,
                iteration: 0,
                policy: "sft-0".into(),
                temperature: 1.6,
                num_steps: 1,
                env_steps: 3 + s,
                complete: s == 0,
                response_text: (s == 0).then(|| "{\"executable_plan\": []}".into()),
                seed: 1000 + i64::from(s),
                ever_grasped: None,
                infra_fault: Some(false),
            })
            .collect()
    }
}

impl Examples for StepRow {
    fn examples() -> Vec<Self> {
        vec![
            StepRow {
                anchor_key: None,
                trajectory_id: "it0/household/train/7/000000/d0/s0".into(),
                step_index: 0,
                prompt_ids: vec![1, 5, 9, 2],
                response_ids: vec![7, 8, 3],
                old_logprobs: vec![-0.5, -1.25, -0.01],
                observation: None,
                old_value: None,
                old_values: Some(vec![0.1, 0.2, 0.3]),
                latents: None,
                latent_dim: None,
                chosen_latent_len: None,
                old_latent_end_logprob: None,
                response_mask: Some(vec![true, false, true]),
            },
            StepRow {
                anchor_key: None,
                trajectory_id: "it0/tabletop/train/1/000003/d0/s1".into(),
                step_index: 4,
                prompt_ids: vec![],
                response_ids: vec![255, 0],
                old_logprobs: vec![-2.0, -3.5],
                observation: Some(vec![0, 255, 17]),
                old_value: Some(0.75),
                old_values: None,
                latents: Some(vec![0.5; 8]),
                latent_dim: Some(4),
                chosen_latent_len: Some(2),
                old_latent_end_logprob: Some(-0.3),
                response_mask: None,
            },
        ]
    }
}

impl Examples for RewardRow {
    fn examples() -> Vec<Self> {
        vec![
            RewardRow {
                trajectory_id: "it0/household/train/7/000000/d0/s0".into(),
                group_id: "it0/household/train/7/000000/d0".into(),
                score: 1.5,
                format: 0.5,
                accuracy: 1.0,
                success: true,
                parse_ok: true,
                pred_actions: Some(vec![
                    PredictedAction {
                        action_id: Some(12),
                        action_name: Some("find a Apple".into()),
                    },
                    PredictedAction {
                        action_id: None,
                        action_name: Some("pick up the Äpple".into()),
                    },
                    PredictedAction {
                        action_id: Some(3),
                        action_name: None,
                    },
                ]),
                step_match: Some(vec![1, 0, 0]),
                step_valid: Some(vec![true, false, true]),
                reward_fn: "embodied_r1".into(),
                ever_grasped: None,
                token_rewards: None,
                infra_fault: Some(false),
            },
            RewardRow {
                trajectory_id: "it0/household/train/7/000000/d0/s1".into(),
                group_id: "it0/household/train/7/000000/d0".into(),
                score: 0.0,
                format: 0.0,
                accuracy: 0.0,
                success: false,
                parse_ok: false,
                pred_actions: None,
                step_match: None,
                step_valid: None,
                reward_fn: "embodied_r1".into(),
                ever_grasped: None,
                token_rewards: Some(vec![0.0, -0.25, 0.25]),
                infra_fault: None,
            },
        ]
    }
}

impl Examples for TeacherLogpRow {
    fn examples() -> Vec<Self> {
        vec![TeacherLogpRow {
            trajectory_id: "it0/household/train/7/000000/d0/s0".into(),
            step_index: 0,
            teacher_logp: vec![-0.1, -0.2, -0.05],
            student_logp: vec![-0.5, -1.25, -0.01],
            teacher: "generalist".into(),
            template: "reference_plan".into(),
        }]
    }
}

impl Examples for StepGateRow {
    fn examples() -> Vec<Self> {
        vec![
            StepGateRow {
                trajectory_id: "it0/household/train/7/000000/d0/s0".into(),
                plan_step: 0,
                decision_gate: 1.0,
                redundancy_gate: 0.0,
                causal_gate: 1.0,
                prompt_kl_score: Some(0.3),
                reason: Some("chooses the object".into()),
            },
            StepGateRow {
                trajectory_id: "it0/household/train/7/000000/d0/s0".into(),
                plan_step: 1,
                decision_gate: 0.0,
                redundancy_gate: 1.0,
                causal_gate: 0.0,
                prompt_kl_score: None,
                reason: None,
            },
        ]
    }
}

impl Examples for AdvantageRow {
    fn examples() -> Vec<Self> {
        vec![AdvantageRow {
            trajectory_id: "it0/household/train/7/000000/d0/s0".into(),
            step_index: 0,
            advantages: vec![0.75, 1.75, 0.75],
            returns: None,
            episode_adv: 0.75,
            step_adv: Some(vec![0.0, 1.0, 0.0]),
            estimator: "grpo_step".into(),
        }]
    }
}

impl Examples for MetricRow {
    fn examples() -> Vec<Self> {
        vec![MetricRow {
            iteration: 3,
            update: 0,
            loss: 0.25,
            pg_loss: 0.2,
            clipfrac: Some(0.05),
            clipfrac_lower: Some(0.0),
            approx_kl: Some(0.001),
            entropy: 1.3,
            kl_loss: None,
            latent_loss: None,
            end_loss: None,
            value_loss: Some(0.05),
            grad_norm: 0.8,
            lr: 1e-5,
        }]
    }
}

impl Examples for EvalRow {
    fn examples() -> Vec<Self> {
        vec![EvalRow {
            failure_reason: None,
            task_id: "household/val/9/000004".into(),
            run: 2,
            split: "val".into(),
            task_type: Some("look_at_obj_in_light".into()),
            policy: "rl-it10".into(),
            success: true,
            num_steps: 1,
            env_steps: 5,
            ever_grasped: None,
        }]
    }
}

/// Runs `$body` with `$row` bound to the row type of table `$table`.
///
/// ```
/// use embodyflow_schemas::{with_row_type, Examples, TableName};
/// let n = with_row_type!(TableName::Eval, R => R::examples().len());
/// assert_eq!(n, 1);
/// ```
#[macro_export]
macro_rules! with_row_type {
    ($table:expr, $row:ident => $body:expr) => {
        match $table {
            $crate::TableName::Tasks => {
                type $row = $crate::TaskRow;
                $body
            }
            $crate::TableName::Trajectories => {
                type $row = $crate::TrajectoryRow;
                $body
            }
            $crate::TableName::Steps => {
                type $row = $crate::StepRow;
                $body
            }
            $crate::TableName::Rewards => {
                type $row = $crate::RewardRow;
                $body
            }
            $crate::TableName::TeacherLogp => {
                type $row = $crate::TeacherLogpRow;
                $body
            }
            $crate::TableName::StepGates => {
                type $row = $crate::StepGateRow;
                $body
            }
            $crate::TableName::Advantages => {
                type $row = $crate::AdvantageRow;
                $body
            }
            $crate::TableName::Metrics => {
                type $row = $crate::MetricRow;
                $body
            }
            $crate::TableName::Eval => {
                type $row = $crate::EvalRow;
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    //! The drift test: each row struct, traced by serde_arrow, must have the
    //! schema its file declares.
    use super::*;
    use crate::format_type;
    use arrow::datatypes::FieldRef;
    use serde_arrow::schema::{SchemaLike, TracingOptions};

    fn traced<R: Row>() -> Vec<(String, String, bool)> {
        let options = TracingOptions::default()
            .sequence_as_large_list(false)
            .strings_as_large_utf8(false)
            .bytes_as_large_binary(false);
        let fields = Vec::<FieldRef>::from_type::<R>(options).expect("trace row type");
        fields
            .iter()
            .map(|f| {
                (
                    f.name().clone(),
                    format_type(f.data_type()),
                    f.is_nullable(),
                )
            })
            .collect()
    }

    fn declared(table: TableName) -> Vec<(String, String, bool)> {
        table
            .def()
            .columns
            .iter()
            .map(|c| (c.name.clone(), format_type(&c.data_type), c.nullable))
            .collect()
    }

    fn check<R: Row>() {
        assert_eq!(
            traced::<R>(),
            declared(R::TABLE),
            "row struct and schemas/{}.toml drifted apart",
            R::TABLE
        );
    }

    #[test]
    fn rows_match_schema_files() {
        check::<TaskRow>();
        check::<TrajectoryRow>();
        check::<StepRow>();
        check::<RewardRow>();
        check::<TeacherLogpRow>();
        check::<StepGateRow>();
        check::<AdvantageRow>();
        check::<MetricRow>();
        check::<EvalRow>();
    }
}
