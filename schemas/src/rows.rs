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
    /// Index in the environment's enumerated action list.
    pub action_id: i32,
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

row!(Tasks,
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
});

row!(Trajectories,
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
});

row!(Steps,
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
});

row!(Rewards,
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
});

row!(TeacherLogp,
/// A row of `teacher_logp` (see `schemas/teacher_logp.toml`).
#[allow(missing_docs)]
pub struct TeacherLogpRow {
    pub trajectory_id: String,
    pub step_index: i32,
    pub teacher_logp: Vec<f32>,
    pub student_logp: Vec<f32>,
    pub teacher: String,
    pub template: String,
});

row!(StepGates,
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
});

row!(Advantages,
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
});

row!(Metrics,
/// A row of `metrics` (see `schemas/metrics.toml`).
#[allow(missing_docs)]
pub struct MetricRow {
    pub iteration: i32,
    pub update: i32,
    pub loss: f32,
    pub pg_loss: f32,
    pub clipfrac: f32,
    pub clipfrac_lower: Option<f32>,
    pub approx_kl: f32,
    pub entropy: f32,
    pub kl_loss: Option<f32>,
    pub latent_loss: Option<f32>,
    pub end_loss: Option<f32>,
    pub value_loss: Option<f32>,
    pub grad_norm: f32,
    pub lr: f32,
});

row!(Eval,
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
});

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
        fields.iter().map(|f| (f.name().clone(), format_type(f.data_type()), f.is_nullable())).collect()
    }

    fn declared(table: TableName) -> Vec<(String, String, bool)> {
        table.def().columns.iter().map(|c| (c.name.clone(), format_type(&c.data_type), c.nullable)).collect()
    }

    fn check<R: Row>() {
        assert_eq!(traced::<R>(), declared(R::TABLE), "row struct and schemas/{}.toml drifted apart", R::TABLE);
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
