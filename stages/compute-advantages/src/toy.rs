//! A toy outcome estimator, added the way `docs/src/extending.md` says: its
//! kernel, `toy.scale * R_i` for every trajectory i, and its declaration
//! (with its section) on the outcome shape ([`crate::outcome`]), plus its
//! line in [`crate::registry::ESTIMATORS`], nothing else. It lives in a
//! test-only module of its own so that no shipped binary lists it. The
//! tests run it through the stage as a user would: `--set
//! estimator=toy_scale`, its key in the config and its value check.

use embodyflow_core::Result;
use embodyflow_core::config::{ConfigKeys, positive};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Section};
use crate::estimator::Estimator;
use crate::outcome::{self, Kernel};
use embodyflow_core::section::SectionConfig;

/// `estimator = "toy_scale"`.
pub(crate) static TOY: Estimator = Estimator {
    name: "toy_scale",
    about: "toy.scale * R_i",
    sections: &[Section::of::<ToyConfig>("toy")],
    group_relative: false,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |build| {
        let scale = build.config.section::<ToyConfig>("toy").scale;
        outcome::build(
            build,
            Kernel::scores(move |scores, _| Ok(scores.iter().map(|r| scale * r).collect())),
        )
    },
};

/// `toy.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct ToyConfig {
    /// Factor applied to each trajectory's score.
    pub scale: f32,
}

impl Default for ToyConfig {
    fn default() -> Self {
        ToyConfig { scale: 2.0 }
    }
}

impl SectionConfig<Config> for ToyConfig {
    fn check(&self, _: &Config) -> Result<()> {
        positive("toy.scale", f64::from(self.scale))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use embodyflow_core::config::{keys_help, refused_key};
    use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
    use embodyflow_core::manifest::Producer;
    use embodyflow_core::schemas::{RewardRow, Row, StepRow, TableName, TrajectoryRow};

    use crate::{Args, Config, run};

    fn write<R: Row>(dir: &std::path::Path, rows: &[R]) {
        let mut writer =
            TableWriter::create(dir, R::TABLE, WriteOptions::default(), false).unwrap();
        writer.write_rows(rows).unwrap();
        let producer = Producer {
            stage: "toy test".into(),
            version: "0".into(),
            config: serde_json::json!({}),
            seed: 0,
            shard: "0/1".into(),
        };
        writer.finish(&producer, &[]).unwrap();
    }

    /// One group of two one-step trajectories scored 1 and 0.5.
    fn rollouts(dir: &std::path::Path) {
        let ids = ["g/s0", "g/s1"];
        let trajectories: Vec<TrajectoryRow> = ids
            .iter()
            .enumerate()
            .map(|(s, id)| TrajectoryRow {
                source_row: None,
                trajectory_id: id.to_string(),
                group_id: "g".into(),
                task_id: "t".into(),
                sample_index: s as i32,
                iteration: 0,
                policy: "test".into(),
                temperature: 1.0,
                num_steps: 1,
                env_steps: 1,
                complete: s == 0,
                response_text: None,
                seed: 0,
                ever_grasped: None,
                failure_reason: None,
                infra_fault: None,
            })
            .collect();
        let rewards: Vec<RewardRow> = ids
            .iter()
            .zip([1.0, 0.5])
            .map(|(id, score)| RewardRow {
                trajectory_id: id.to_string(),
                group_id: "g".into(),
                score,
                format: 0.0,
                accuracy: score,
                success: score == 1.0,
                parse_ok: true,
                pred_actions: None,
                step_match: None,
                step_valid: None,
                reward_fn: "outcome".into(),
                ever_grasped: None,
                token_rewards: None,
                infra_fault: None,
            })
            .collect();
        let steps: Vec<StepRow> = ids
            .iter()
            .map(|id| StepRow::one_shot(id.to_string(), vec![1], vec![5, 6, 7], vec![-1.0; 3]))
            .collect();
        write(dir, &trajectories);
        write(dir, &rewards);
        write(dir, &steps);
    }

    #[test]
    fn its_section_joins_the_config_with_its_key_doc_and_check() {
        assert_eq!(refused_key::<Config>(&["estimator=toy_scale"]), None);
        assert_eq!(
            refused_key::<Config>(&["toy.scale=0"]).as_deref(),
            Some("toy.scale")
        );
        let help = keys_help::<Config>();
        let line = help.lines().find(|l| l.contains("toy.scale")).unwrap();
        assert!(
            line.contains("toy.scale = 2.0")
                && line.ends_with("factor applied to each trajectory's score"),
            "{line}"
        );
        assert!(help.contains(" or toy_scale\n"), "{help}");
    }

    #[test]
    fn the_stage_runs_it_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("rollouts");
        rollouts(&input);
        let out = dir.path().join("adv");
        let args = Args::parse_from([
            "compute-advantages",
            "--input",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--set",
            "estimator=toy_scale",
            "--set",
            "toy.scale=3",
        ]);
        run(args).unwrap();
        let table = out.join(TableName::Advantages.as_str());
        let mut rows: Vec<embodyflow_core::schemas::AdvantageRow> =
            TableReader::open(&table, TableName::Advantages)
                .unwrap()
                .read_rows()
                .unwrap();
        rows.sort_by(|a, b| a.trajectory_id.cmp(&b.trajectory_id));
        let got: Vec<(&str, Vec<f32>, &str)> = rows
            .iter()
            .map(|r| {
                (
                    r.trajectory_id.as_str(),
                    r.advantages.clone(),
                    r.estimator.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("g/s0", vec![3.0; 3], "toy_scale"),
                ("g/s1", vec![1.5; 3], "toy_scale")
            ]
        );
        let diagnostics = std::fs::read_to_string(out.join("diagnostics.json")).unwrap();
        assert!(
            diagnostics.contains("\"estimator\": \"toy_scale\""),
            "{diagnostics}"
        );
    }
}
