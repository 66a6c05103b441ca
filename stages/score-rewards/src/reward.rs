//! What a reward function is to the stage: a [`Reward`] says its name
//! (`reward.fn = NAME`, and every row's `reward_fn`), its keys in the
//! `reward` table (a [`Section`] of its own type: defaults, meanings from
//! doc comments, checks), what it reads beyond the trajectories
//! ([`Reads`]), and readies a [`Scorer`] that scores one trajectory from
//! what the stage found in it ([`Seen`]: the tolerant plan, the rule match,
//! the plan run in its environment).
//!
//! Each reward is one module (`outcome.rs`, `embodied_r1.rs`, `verify.rs`)
//! and one line of [`crate::REWARDS`]; the stage iterates that list for the
//! config, `--help` and the checks and never names a reward.
//!
//! ```text
//! pub static BREVITY: Brevity = Brevity;
//! impl Reward for Brevity {
//!     fn name(&self) -> &'static str { "brevity" }
//!     fn settings(&self) -> Option<Section> { Some(Section::of::<BrevitySettings>("reward")) }
//!     fn reads(&self) -> Reads { Reads::default() }
//!     fn scorer(&self, tree: &Value) -> Result<Box<dyn Scorer>> { ... }
//! }
//! ```

use embodyflow_algos::plan::{GtStep, Plan};
use embodyflow_algos::rewards::Scored;
use embodyflow_core::Result;
use embodyflow_core::stage::Summary;
use embodyflow_envs::{Outcome, TaskEnv};
use serde_json::Value;

/// A reward's keys: part of the `reward` table.
pub type Section = embodyflow_core::section::Section<()>;

/// A reward function.
pub trait Reward: Sync {
    /// `reward.fn = NAME`, and every row's `reward_fn`.
    fn name(&self) -> &'static str;

    /// Its keys in the `reward` table (`reward.reward_coef`), if it has any.
    fn settings(&self) -> Option<Section>;

    /// What it reads beyond the trajectories.
    fn reads(&self) -> Reads;

    /// Its scorer, with its settings read from the config's tree and what
    /// they name loaded (bad settings, such as an unreadable file, are bad
    /// input naming the key).
    fn scorer(&self, tree: &Value) -> Result<Box<dyn Scorer>>;
}

/// What a reward reads beyond the trajectories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    /// Why it needs the tasks table (`ground-truth plans`); `None`: it
    /// scores the trajectories as given.
    pub tasks: Option<&'static str>,
    /// Whether it runs each plan in its task's built-in environment (the
    /// tasks' observations).
    pub scenes: bool,
    /// Whether it scores closed-loop episodes, which write no plan (only an
    /// outcome reward does; others refuse them).
    pub episodes: bool,
}

/// One trajectory as scoring sees it.
#[derive(Debug, Clone)]
pub struct Rollout<'a> {
    /// Trajectory id.
    pub trajectory_id: &'a str,
    /// Group id.
    pub group_id: &'a str,
    /// Whether the environment reported success.
    pub complete: bool,
    /// The response text of a one-shot plan.
    pub response_text: Option<&'a str>,
    /// The task's ground-truth plan.
    pub gt: Option<&'a [GtStep]>,
    /// The task in its environment (a built-in `env` with an observation,
    /// loaded when the reward runs plans: [`Reads::scenes`]).
    pub env: Option<&'a TaskEnv>,
    /// Whether the episode ever grasped a goal's object (closed loop; null
    /// for a one-shot plan): copied to the row.
    pub ever_grasped: Option<bool>,
    /// Whether infrastructure ended the episode: copied to the row.
    pub infra_fault: bool,
}

/// What the stage found in a trajectory before scoring it, whatever the
/// reward: the plan extracted tolerantly, its rule match against the
/// ground truth under `match.mode`, and its run in the task's environment.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The plan extracted from the response (tolerant parsing).
    pub plan: Option<Plan>,
    /// The rule match of each predicted step (empty without a plan; `None`
    /// without a ground truth).
    pub matches: Option<Vec<i8>>,
    /// The plan run in the task's environment (when one was loaded).
    pub execution: Option<Outcome>,
}

/// A reward ready to score: pure, called on rows in parallel.
pub trait Scorer: Sync {
    /// The score of one trajectory.
    fn score(&self, rollout: &Rollout<'_>, seen: &Seen) -> Scored;

    /// Its lines of the summary, from the run's tally.
    fn add_lines(&self, tally: &Tally, summary: &mut Summary) {
        let _ = (tally, summary);
    }
}

/// What a run counted over the rows it wrote that ran (not ended by
/// infrastructure).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Rows whose plan ran in an environment.
    pub executed: u64,
    /// Of those, rows whose plan reached the goal.
    pub executed_ok: u64,
}
