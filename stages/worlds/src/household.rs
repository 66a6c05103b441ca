//! The household planning world (`env = household`,
//! [`embodyflow_household`]) in the registry: a one-shot world (a policy
//! answers each task with one plan, run by `embodyflow_envs`), so it
//! declares only how `generate-tasks` writes its tasks.
//!
//! Task `index` of a split is `embodyflow_household::task::generate_task`
//! of (split, `--seed`, index), id `household/<split>/<seed>/<index>`,
//! with its scene and the expert's ground-truth plan (`gt_actions`). With
//! `image_size` each row also carries a scene image of that side (a
//! top-down map of its initial state, `embodyflow_household::render`);
//! unset, rows are text only. The summary counts tasks by type and gives
//! the mean expert plan length.
//!
//! ```
//! use embodyflow_worlds::generator;
//! let household = generator("household").unwrap();
//! assert!(household.settings().is_some() && !household.initial_states());
//! ```

use std::collections::BTreeMap;

use embodyflow_core::Result;
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::config::{ConfigKeys, ensure};
use embodyflow_core::section::SectionConfig;
use embodyflow_household::task::generate_task;
use embodyflow_household::{TaskType, image_task_row, render};
use serde::{Deserialize, Serialize};

use embodyflow_world::generator::{Generator, ROOT, Settings, TaskRequest, TaskSink};
use embodyflow_world::world::WorldsError;

/// `env = household`.
pub static HOUSEHOLD: Household = Household;

/// The household world.
pub struct Household;

/// Its name in `env`.
const NAME: &str = "household";

/// The household world's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct HouseholdKeys {
    /// env = household: each task carries a scene image (a top-down map of
    /// its initial state) of image_size x image_size pixels, 32 to 1024;
    /// unset: text only.
    pub image_size: Option<usize>,
}

impl SectionConfig<TaskRequest> for HouseholdKeys {
    /// A scene image only for household tasks, of a size the renderer
    /// draws.
    fn check(&self, config: &TaskRequest) -> Result<()> {
        let Some(size) = self.image_size else {
            return Ok(());
        };
        ensure(
            config.is(NAME),
            "image_size",
            "env = household (the other worlds render their own frames)",
            size,
        )?;
        ensure(
            render::check_size(size).is_ok(),
            "image_size",
            "32 to 1024 pixels",
            size,
        )
    }
}

impl Generator for Household {
    fn name(&self) -> &'static str {
        NAME
    }

    fn settings(&self) -> Option<Settings> {
        Some(Settings::of::<HouseholdKeys>(ROOT))
    }

    /// The shard's tasks, counted by type.
    fn write(
        &self,
        config: &TaskRequest,
        shard: ShardSpec,
        seed: u64,
        sink: &mut TaskSink,
    ) -> std::result::Result<(), WorldsError> {
        let keys: HouseholdKeys = config.keys()?;
        let split = config.split;
        let mut by_type: BTreeMap<&'static str, usize> =
            TaskType::ALL.iter().map(|t| (t.as_str(), 0)).collect();
        let (mut steps, mut owned) = (0usize, 0usize);
        for index in 0..config.count {
            let id = format!("household/{split}/{seed}/{index:06}");
            if !shard.owns(&id) {
                continue;
            }
            let task = generate_task(split, seed, index);
            let row =
                image_task_row(&task, keys.image_size).expect("validate checked the image size");
            *by_type.entry(task.task_type.as_str()).or_default() += 1;
            steps += row.gt_actions.as_ref().map_or(0, Vec::len);
            owned += 1;
            sink.push(row)?;
        }
        sink.summary.add("tasks", owned).add(
            "mean expert plan length",
            format!("{:.2}", steps as f64 / owned.max(1) as f64),
        );
        sink.add_counts(by_type);
        Ok(())
    }
}
