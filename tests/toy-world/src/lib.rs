//! A toy closed-loop world for tests, added the way
//! `docs/src/extending.md` says: this crate (a [`World`] and its episodes
//! implementing [`ClosedLoopWorld`], and a [`Generator`] of its tasks with
//! a key of its own) and one line in the registry's `WORLDS`, under
//! `#[cfg(test)]` (a dev-dependency of `embodyflow-worlds`: no shipped
//! binary lists it). A task row `env = toy` is a corridor of `seed`
//! cells; an action > 0 moves one cell on, and reaching the end is
//! success; its expert always moves on. `generate-tasks --set env=toy`
//! writes task `i` as a corridor of `corridor + i` cells. The registry's
//! tests (`stages/worlds/src/toy_tests.rs`) write its tasks with
//! `generate-tasks` and run them through the registry, the closed-loop
//! driver and the demonstrations update-policy's behaviour cloning asks
//! for.
//!
//! ```
//! use embodyflow_toy_world::TOY;
//! use embodyflow_world::generator::Generator;
//! use embodyflow_world::world::World;
//! assert_eq!((TOY.env(), Generator::name(&TOY)), ("toy", "toy"));
//! ```

use embodyflow_core::Error;
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::config::{ConfigKeys, at_least};
use embodyflow_core::observation::ObservationShape;
use embodyflow_core::schemas::TaskRow;
use embodyflow_core::section::SectionConfig;
use embodyflow_world::{ChunkReport, ClosedLoopWorld, WorldError};
use serde::{Deserialize, Serialize};

use embodyflow_world::demonstrations::{DemoDecision, DemoRequest, Demonstration};
use embodyflow_world::generator::{Generator, ROOT, Settings, TaskRequest, TaskSink};
use embodyflow_world::workers::WorkerSettings;
use embodyflow_world::world::{
    Kept, PolicyShape, World, WorldEpisodes, WorldOptions, WorldTask, WorldsError, specs,
};

/// `env = toy`.
pub static TOY: Toy = Toy;

/// The toy world.
pub struct Toy;

/// A corridor of `length` cells.
#[derive(Clone, Debug, PartialEq)]
struct Corridor {
    length: u32,
}

/// Its observations: the cell as one pixel and as proprio.
pub fn shape() -> ObservationShape {
    ObservationShape {
        height: 1,
        width: 1,
        channels: 1,
        proprio: 1,
    }
}

impl World for Toy {
    fn env(&self) -> &'static str {
        "toy"
    }

    fn claims(&self, env: &str) -> bool {
        env == "toy"
    }

    fn task(&'static self, row: &TaskRow) -> Result<WorldTask, Error> {
        let length = u32::try_from(row.seed)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                Error::BadInput(format!("task `{}`: seed is its length", row.task_id))
            })?;
        Ok(WorldTask::new(
            self,
            "toy",
            row.task_id.clone(),
            row.instruction.clone(),
            2 * length,
            Corridor { length },
        ))
    }

    fn reseed(&'static self, task: &WorldTask, _: u32) -> Result<WorldTask, Error> {
        Ok(task.clone())
    }

    fn policy_shape(
        &self,
        _: &WorldTask,
        _: usize,
        _: &WorkerSettings,
    ) -> Result<PolicyShape, WorldsError> {
        Ok(PolicyShape {
            observation: shape(),
            action_dim: 1,
            bins: None,
            observation_text: 0,
        })
    }

    fn episodes(
        &self,
        tasks: &[WorldTask],
        group: usize,
        _: &WorldOptions,
        _: &mut Kept,
    ) -> Result<Box<dyn WorldEpisodes>, WorldsError> {
        let mut episodes = Corridors::default();
        for (task, corridor) in tasks.iter().zip(specs::<Corridor>(tasks)) {
            for _ in 0..group {
                episodes.ids.push(task.task_id());
                episodes.instructions.push(task.instruction().to_string());
                episodes.corridors.push((corridor.clone(), 0, 0));
            }
        }
        Ok(Box::new(episodes))
    }

    /// The expert moves on at every step: a corridor of `n` cells is
    /// `ceil(n / K)` decisions, observed at cells `0, K, 2K, ...`.
    fn demonstrations(
        &self,
        tasks: &[WorldTask],
        request: &DemoRequest<'_>,
        each: &mut dyn FnMut(Demonstration) -> Result<(), Error>,
    ) -> Result<String, Error> {
        let k = request.chunk_len;
        for (task, corridor) in tasks.iter().zip(specs::<Corridor>(tasks)) {
            let length = corridor.length as usize;
            let mut decisions = Vec::new();
            for at in (0..length).step_by(k) {
                let actions = vec![1.0; k.min(length - at)];
                let observation =
                    embodyflow_core::observation::encode(&shape(), &[at as u8], &[at as f32])
                        .map_err(|e| Error::BadInput(e.to_string()))?;
                decisions.push(DemoDecision {
                    observation,
                    text: None,
                    tokens: request
                        .bins
                        .encode(&actions)
                        .map_err(|e| Error::BadInput(e.to_string()))?,
                });
            }
            let step_frames = match request.step_frames {
                true => (0..length).map(|at| vec![at as u8]).collect(),
                false => Vec::new(),
            };
            each(Demonstration {
                task_id: task.task_id(),
                instruction: task.instruction().to_string(),
                success: true,
                decisions,
                step_frames,
                failure: None,
            })?;
        }
        Ok("always on".into())
    }
}

/// The toy world's key in generate-tasks' config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
struct ToyKeys {
    /// Cells of task 0's corridor with env = toy (task i's has i more; at
    /// least 1).
    corridor: u32,
}

impl Default for ToyKeys {
    fn default() -> Self {
        ToyKeys { corridor: 3 }
    }
}

impl SectionConfig<TaskRequest> for ToyKeys {
    fn check(&self, _: &TaskRequest) -> embodyflow_core::Result<()> {
        at_least("corridor", self.corridor, 1)
    }
}

impl Generator for Toy {
    fn name(&self) -> &'static str {
        "toy"
    }

    fn settings(&self) -> Option<Settings> {
        Some(Settings::of::<ToyKeys>(ROOT))
    }

    fn write(
        &self,
        config: &TaskRequest,
        shard: ShardSpec,
        seed: u64,
        sink: &mut TaskSink,
    ) -> Result<(), WorldsError> {
        let keys: ToyKeys = config.keys()?;
        let mut owned = 0;
        for index in 0..config.count {
            let task_id = format!("toy/{}/{seed}/{index}", config.split);
            if shard.owns(&task_id) {
                let length = i64::from(keys.corridor) + index as i64;
                sink.push(row(&task_id, config.split.as_str(), length))?;
                owned += 1;
            }
        }
        sink.summary.add("tasks", owned);
        Ok(())
    }
}

/// Task `task_id` of `split`: a corridor of `length` cells.
fn row(task_id: &str, split: &str, length: i64) -> TaskRow {
    TaskRow {
        task_id: task_id.into(),
        suite: "toy".into(),
        env: "toy".into(),
        split: split.into(),
        task_type: None,
        seed: length,
        instruction: "walk on".into(),
        observation: None,
        gt_actions: None,
    }
}

/// Episodes: each corridor with its position and steps taken.
#[derive(Default)]
struct Corridors {
    ids: Vec<String>,
    instructions: Vec<String>,
    corridors: Vec<(Corridor, u32, u32)>,
    frames: Vec<u8>,
    proprio: Vec<f32>,
}

impl Corridors {
    fn success(&self, i: usize) -> bool {
        let (corridor, at, _) = &self.corridors[i];
        *at == corridor.length
    }
}

impl ClosedLoopWorld for Corridors {
    fn len(&self) -> usize {
        self.corridors.len()
    }
    fn observation_shape(&self) -> ObservationShape {
        shape()
    }
    fn image_names(&self) -> &[String] {
        &[]
    }
    fn action_dim(&self) -> usize {
        1
    }
    fn task_id(&self, i: usize) -> &str {
        &self.ids[i]
    }
    fn instruction(&self, i: usize) -> &str {
        &self.instructions[i]
    }
    fn running(&self, i: usize) -> bool {
        let (corridor, _, steps) = &self.corridors[i];
        !self.success(i) && *steps < 2 * corridor.length
    }
    fn observe(&mut self) {
        self.frames = self.corridors.iter().map(|c| c.1 as u8).collect();
        self.proprio = self.corridors.iter().map(|c| c.1 as f32).collect();
    }
    fn frames(&self) -> &[u8] {
        &self.frames
    }
    fn proprio(&self) -> &[f32] {
        &self.proprio
    }
    fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError> {
        let mut reports = Vec::with_capacity(self.len());
        for (i, chunk) in actions.chunks(k).enumerate() {
            let mut env_steps = 0;
            for &action in chunk {
                if !self.running(i) {
                    break;
                }
                let (_, at, steps) = &mut self.corridors[i];
                *at += u32::from(action > 0.0);
                *steps += 1;
                env_steps += 1;
            }
            reports.push(ChunkReport {
                env_steps,
                done: !self.running(i),
                success: self.success(i),
                failure: None,
            });
        }
        Ok(reports)
    }
    fn target_ever_grasped(&self, _: usize) -> Option<bool> {
        None
    }
    fn observation_text(&self, _: usize) -> Option<&str> {
        None
    }
    fn start_failure(&self, _: usize) -> Option<&str> {
        None
    }
}

impl WorldEpisodes for Corridors {}
