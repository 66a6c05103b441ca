//! `reward.fn = "verify"`: `0.8 * accuracy + 0.2 * format` (EasyR1's
//! embody reward). A trajectory whose task has a built-in environment
//! (`env = household`) and an observation is checked by executing the
//! extracted plan in it (`embodyflow_envs::TaskEnv::execute_plan`): accuracy
//! 1 when the plan reaches the goal, -1 otherwise, and `step_valid` holds
//! the executor's verdict per step; other tasks keep the step-match
//! accuracy (`2 * matched / max(predicted, gt) - 1`).

use embodyflow_algos::plan::GtStep;
use embodyflow_algos::rewards::{Scored, verify};
use embodyflow_core::Result;
use embodyflow_core::stage::Summary;
use serde_json::Value;

use crate::reward::{Reads, Reward, Rollout, Scorer, Section, Seen, Tally};

/// The verify reward.
pub struct Verify;

/// `reward.fn = "verify"`.
pub static VERIFY: Verify = Verify;

impl Reward for Verify {
    fn name(&self) -> &'static str {
        "verify"
    }

    fn settings(&self) -> Option<Section> {
        None
    }

    fn reads(&self) -> Reads {
        Reads {
            tasks: Some("the scenes plans run in"),
            scenes: true,
            ..Reads::default()
        }
    }

    fn scorer(&self, _: &Value) -> Result<Box<dyn Scorer>> {
        Ok(Box::new(Verify))
    }
}

impl Scorer for Verify {
    fn score(&self, rollout: &Rollout<'_>, seen: &Seen) -> Scored {
        let matched = seen
            .matches
            .as_ref()
            .map_or(0, |m| m.iter().filter(|&&x| x == 1).count());
        let executor_success = rollout
            .env
            .map(|_| seen.execution.as_ref().is_some_and(|e| e.success));
        verify(
            seen.plan.clone(),
            executor_success,
            matched,
            rollout.gt.map_or(0, <[GtStep]>::len),
        )
    }

    fn add_lines(&self, tally: &Tally, summary: &mut Summary) {
        summary
            .add("plans executed (household)", tally.executed)
            .add("executed plans reaching the goal", tally.executed_ok);
    }
}
