//! `reward.fn = "embodied_r1"`: format + prefix accuracy of the plan against
//! the task's ground truth (Embodied-R1; formulas in
//! `embodyflow_algos::rewards`). `reward.tolerant` parses tolerantly instead
//! of the reference's strict parsing; `reward.action_list` names a JSON file
//! with the environment's action names (index = id) for the id/name
//! agreement part of the format reward, which is 0 without it.

use std::path::{Path, PathBuf};

use embodyflow_algos::plan::GtStep;
use embodyflow_algos::rewards::{ActionList, Scored, embodied_r1};
use embodyflow_core::config::ConfigKeys;
use embodyflow_core::section::{self, SectionConfig};
use embodyflow_core::stage::Summary;
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::reward::{Reads, Reward, Rollout, Scorer, Section, Seen, Tally};

/// The Embodied-R1 reward.
pub struct EmbodiedR1;

/// `reward.fn = "embodied_r1"`.
pub static EMBODIED_R1: EmbodiedR1 = EmbodiedR1;

/// Its keys in the `reward` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct EmbodiedR1Settings {
    /// embodied_r1: tolerant parsing instead of the reference's strict parsing.
    pub tolerant: bool,
    /// embodied_r1: JSON file with the action names (index = action id).
    pub action_list: Option<PathBuf>,
}

impl SectionConfig for EmbodiedR1Settings {}

impl Reward for EmbodiedR1 {
    fn name(&self) -> &'static str {
        "embodied_r1"
    }

    fn settings(&self) -> Option<Section> {
        Some(Section::of::<EmbodiedR1Settings>("reward"))
    }

    fn reads(&self) -> Reads {
        Reads {
            tasks: Some("ground-truth plans"),
            ..Reads::default()
        }
    }

    fn scorer(&self, tree: &Value) -> Result<Box<dyn Scorer>> {
        let settings = section::read::<(), EmbodiedR1Settings>("reward", tree)?;
        let actions = settings
            .action_list
            .as_deref()
            .map(read_action_list)
            .transpose()?;
        Ok(Box::new(EmbodiedR1Scorer {
            tolerant: settings.tolerant,
            actions,
        }))
    }
}

/// The settings with the action list read.
struct EmbodiedR1Scorer {
    tolerant: bool,
    actions: Option<ActionList>,
}

impl Scorer for EmbodiedR1Scorer {
    fn score(&self, rollout: &Rollout<'_>, _: &Seen) -> Scored {
        embodied_r1(
            rollout.response_text.unwrap_or(""),
            rollout.gt.unwrap_or(&[] as &[GtStep]),
            self.actions.as_ref(),
            self.tolerant,
        )
    }

    fn add_lines(&self, _: &Tally, summary: &mut Summary) {
        if self.actions.is_none() {
            summary.add(
                "note",
                "no reward.action_list: the id/name agreement part of the format reward is 0",
            );
        }
    }
}

/// The action names in `path`, a JSON list; missing or malformed is bad
/// input naming `reward.action_list` (the file is named by the config).
fn read_action_list(path: &Path) -> Result<ActionList> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::BadValue {
        key: "reward.action_list".into(),
        reason: format!("{}: cannot read it: {e}", path.display()),
    })?;
    let names: Vec<String> = serde_json::from_str(&text).map_err(|e| Error::BadValue {
        key: "reward.action_list".into(),
        reason: format!(
            "{}: expected a JSON list of action names: {e}",
            path.display()
        ),
    })?;
    Ok(ActionList::new(names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_action_list_is_bad_input_naming_the_key() {
        let err = read_action_list(Path::new("no/such/actions.json")).unwrap_err();
        assert!(
            matches!(&err, Error::BadValue { key, .. } if key == "reward.action_list"),
            "{err:?}"
        );
        assert!(err.to_string().contains("no/such/actions.json"), "{err}");
    }
}
