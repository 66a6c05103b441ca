//! `reward.fn = "outcome"`: `reward.reward_coef` when the environment
//! reported success (`complete`), else 0; format 0, accuracy = score. The
//! only reward for closed-loop episodes, which write no plan (1.0 as in
//! SimpleVLA-RL, 5.0 as in LaST-R1).

use embodyflow_algos::rewards::{Scored, outcome};
use embodyflow_core::Result;
use embodyflow_core::config::{ConfigKeys, positive};
use embodyflow_core::section::{self, SectionConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::reward::{Reads, Reward, Rollout, Scorer, Section, Seen};

/// The outcome reward.
pub struct Outcome;

/// `reward.fn = "outcome"`.
pub static OUTCOME: Outcome = Outcome;

/// Its key in the `reward` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct OutcomeSettings {
    /// Outcome reward for a completed task (1.0 SimpleVLA-RL, 5.0 LaST-R1).
    pub reward_coef: f32,
}

impl Default for OutcomeSettings {
    fn default() -> Self {
        OutcomeSettings { reward_coef: 1.0 }
    }
}

impl SectionConfig for OutcomeSettings {
    /// `reward.reward_coef` above 0.
    fn check(&self, _: &()) -> Result<()> {
        positive("reward.reward_coef", f64::from(self.reward_coef))
    }
}

impl Reward for Outcome {
    fn name(&self) -> &'static str {
        "outcome"
    }

    fn settings(&self) -> Option<Section> {
        Some(Section::of::<OutcomeSettings>("reward"))
    }

    fn reads(&self) -> Reads {
        Reads {
            episodes: true,
            ..Reads::default()
        }
    }

    fn scorer(&self, tree: &Value) -> Result<Box<dyn Scorer>> {
        Ok(Box::new(section::read::<(), OutcomeSettings>(
            "reward", tree,
        )?))
    }
}

impl Scorer for OutcomeSettings {
    fn score(&self, rollout: &Rollout<'_>, _: &Seen) -> Scored {
        let score = outcome(rollout.complete, self.reward_coef);
        Scored {
            score,
            format: 0.0,
            accuracy: score,
            plan: None,
        }
    }
}
