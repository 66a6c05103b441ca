//! A toy reward, added the way `docs/src/extending.md` says: this module
//! (its [`Reward`] and its key in the `reward` table) and its line in
//! [`crate::REWARDS`], nothing else. It scores `reward.per_char` times the
//! response's length in characters. The tests run it through the stage as
//! a user would (`--set reward.fn=toy_length`).

use embodyflow_algos::rewards::Scored;
use embodyflow_core::Result;
use embodyflow_core::config::{ConfigKeys, positive};
use embodyflow_core::section::{self, SectionConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::reward::{Reads, Reward, Rollout, Scorer, Section, Seen};

/// The toy reward.
pub struct ToyLength;

/// `reward.fn = "toy_length"`.
pub static TOY: ToyLength = ToyLength;

/// Its key in the `reward` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct ToySettings {
    /// toy_length: score per character of the response.
    pub per_char: f32,
}

impl Default for ToySettings {
    fn default() -> Self {
        ToySettings { per_char: 0.5 }
    }
}

impl SectionConfig for ToySettings {
    fn check(&self, _: &()) -> Result<()> {
        positive("reward.per_char", f64::from(self.per_char))
    }
}

impl Reward for ToyLength {
    fn name(&self) -> &'static str {
        "toy_length"
    }

    fn settings(&self) -> Option<Section> {
        Some(Section::of::<ToySettings>("reward"))
    }

    fn reads(&self) -> Reads {
        Reads::default()
    }

    fn scorer(&self, tree: &Value) -> Result<Box<dyn Scorer>> {
        Ok(Box::new(section::read::<(), ToySettings>("reward", tree)?))
    }
}

impl Scorer for ToySettings {
    fn score(&self, rollout: &Rollout<'_>, _: &Seen) -> Scored {
        let length = rollout.response_text.map_or(0, |t| t.chars().count());
        let score = self.per_char * length as f32;
        Scored {
            score,
            format: 0.0,
            accuracy: score,
            plan: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use embodyflow_core::config::{keys_help, refused_key};
    use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
    use embodyflow_core::manifest::Producer;
    use embodyflow_core::schemas::{RewardRow, TableName, TrajectoryRow};

    use crate::{Args, Config, run};

    #[test]
    fn its_key_joins_the_reward_table_with_its_doc_and_check() {
        assert_eq!(refused_key::<Config>(&["reward.fn=toy_length"]), None);
        assert_eq!(
            refused_key::<Config>(&["reward.per_char=0"]).as_deref(),
            Some("reward.per_char")
        );
        let help = keys_help::<Config>();
        let line = help
            .lines()
            .find(|l| l.contains("reward.per_char"))
            .unwrap();
        assert!(
            line.contains("reward.per_char = 0.5")
                && line.ends_with("toy_length: score per character of the response"),
            "{line}"
        );
        assert!(help.contains("verify or toy_length"), "{help}");
    }

    #[test]
    fn the_stage_scores_with_it_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("rollouts");
        let rows: Vec<TrajectoryRow> = ["abcd", "ab"]
            .iter()
            .enumerate()
            .map(|(s, text)| TrajectoryRow {
                source_row: None,
                trajectory_id: format!("g/s{s}"),
                group_id: "g".into(),
                task_id: "t".into(),
                sample_index: s as i32,
                iteration: 0,
                policy: "test".into(),
                temperature: 1.0,
                num_steps: 1,
                env_steps: 1,
                complete: false,
                response_text: Some(text.to_string()),
                seed: 0,
                ever_grasped: None,
                failure_reason: None,
                infra_fault: None,
            })
            .collect();
        let mut writer = TableWriter::create(
            &input,
            TableName::Trajectories,
            WriteOptions::default(),
            false,
        )
        .unwrap();
        writer.write_rows(&rows).unwrap();
        let producer = Producer {
            stage: "toy test".into(),
            version: "0".into(),
            config: serde_json::json!({}),
            seed: 0,
            shard: "0/1".into(),
        };
        writer.finish(&producer, &[]).unwrap();
        let out = dir.path().join("rewards");
        run(Args::parse_from([
            "score-rewards",
            "--input",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--set",
            "reward.fn=toy_length",
            "--set",
            "reward.per_char=2",
        ]))
        .unwrap();
        let table = out.join(TableName::Rewards.as_str());
        let mut rows: Vec<RewardRow> = TableReader::open(&table, TableName::Rewards)
            .unwrap()
            .read_rows()
            .unwrap();
        rows.sort_by(|a, b| a.trajectory_id.cmp(&b.trajectory_id));
        let got: Vec<(f32, &str)> = rows
            .iter()
            .map(|r| (r.score, r.reward_fn.as_str()))
            .collect();
        assert_eq!(got, [(8.0, "toy_length"), (4.0, "toy_length")]);
    }
}
