//! A toy closed-loop world, added the way `docs/src/extending.md` says:
//! this module (a [`World`] and its episodes implementing
//! [`ClosedLoopWorld`], and a [`Generator`] of its tasks with a key of its
//! own) and one line in [`WORLDS`](crate::WORLDS). A task row `env = toy`
//! is a corridor of `seed` cells; an action > 0 moves one cell on, and
//! reaching the end is success; its expert always moves on.
//! `generate-tasks --set env=toy` writes task `i` as a corridor of
//! `corridor + i` cells. Its tests write its tasks with `generate-tasks`
//! and run them through the registry, the closed-loop driver and the
//! demonstrations update-policy's behaviour cloning asks for.

use embodyflow_core::Error;
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::config::{ConfigKeys, at_least};
use embodyflow_core::observation::ObservationShape;
use embodyflow_core::schemas::TaskRow;
use embodyflow_core::section::SectionConfig;
use embodyflow_gym::BridgeConfig;
use embodyflow_world::{ChunkReport, ClosedLoopWorld, WorldError};
use serde::{Deserialize, Serialize};

use crate::demonstrations::{DemoDecision, DemoRequest, Demonstration};
use crate::generate::{Config, Generator, ROOT, Settings, TaskSink};
use crate::world::{Kept, World, WorldEpisodes, WorldTask, specs};
use crate::{PolicyShape, WorldOptions, WorldsError};

/// `env = toy`.
pub static TOY: Toy = Toy;

/// The toy world.
pub struct Toy;

/// A corridor of `length` cells.
#[derive(Clone, Debug, PartialEq)]
struct Corridor {
    length: u32,
}

fn shape() -> ObservationShape {
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
        _: &BridgeConfig,
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

impl SectionConfig<Config> for ToyKeys {
    fn check(&self, _: &Config) -> embodyflow_core::Result<()> {
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
        config: &Config,
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

#[cfg(test)]
mod tests {
    use embodyflow_algos::action_tokens::ActionBins;
    use embodyflow_rollout::closed_loop::{
        ChunkDecision, ChunkPolicy, ClosedLoopConfig, DecisionBatch, run_closed_loop,
    };

    use super::*;
    use crate::{
        WorldOptions, Worlds, is_closed_loop, max_decisions, policy_shape, world_of, world_of_tasks,
    };

    /// Always the same bin, `K = 2` actions per decision.
    struct Constant(u32);

    impl ChunkPolicy for Constant {
        type Error = Error;
        fn chunk_len(&self) -> usize {
            2
        }
        fn action_dim(&self) -> usize {
            1
        }
        fn observation_shape(&self) -> ObservationShape {
            shape()
        }
        fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Error> {
            Ok(instruction.bytes().map(i32::from).collect())
        }
        fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Error> {
            Ok((0..batch.len())
                .map(|_| ChunkDecision {
                    tokens: vec![self.0; 2],
                    token_logprobs: vec![0.0; 2],
                    thought: None,
                })
                .collect())
        }
    }

    /// The toy's tasks as `generate-tasks --set env=toy` writes them:
    /// corridors of 3 and 5 cells (`corridor = 3`, every other task).
    fn generated() -> Vec<TaskRow> {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let args = crate::generate::Args::parse_from([
            "generate-tasks",
            "--out",
            out.to_str().unwrap(),
            "--set",
            "env=toy",
            "--set",
            "count=3",
            "--seed",
            "4",
        ]);
        crate::generate::run(args).unwrap();
        let tasks = embodyflow_core::dataset::TableReader::open(
            &out.join("tasks"),
            embodyflow_core::schemas::TableName::Tasks,
        )
        .unwrap();
        let rows: Vec<TaskRow> = tasks.read_rows().unwrap();
        let ids: Vec<&str> = rows.iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(ids, ["toy/train/4/0", "toy/train/4/1", "toy/train/4/2"]);
        rows.into_iter().step_by(2).collect()
    }

    #[test]
    fn the_toy_worlds_tasks_come_from_generate_tasks_through_the_registry() {
        let rows = generated();
        let lengths: Vec<i64> = rows.iter().map(|r| r.seed).collect();
        assert_eq!(lengths, [3, 5]);
        assert!(rows.iter().all(|r| r.env == "toy" && r.split == "train"));
        let problem = embodyflow_core::config::refused_key::<Config>(&["env=toy", "corridor=0"]);
        assert_eq!(problem.as_deref(), Some("corridor"));
    }

    #[test]
    fn the_toy_world_runs_through_the_registry_and_the_driver() {
        assert!(is_closed_loop("toy"));
        let tasks: Vec<WorldTask> = generated()
            .iter()
            .map(WorldTask::from_row)
            .collect::<Result<_, _>>()
            .unwrap();
        let bins = ActionBins::openvla();
        let options = WorldOptions {
            image_size: 32,
            bins: bins.clone(),
            bridge: BridgeConfig::default(),
        };
        let bridge = BridgeConfig::default();
        assert_eq!(policy_shape(&tasks[0], 32, &bridge).unwrap().action_dim, 1);
        let mut worlds = Worlds::new(options);
        for (bin, success) in [(255, true), (0, false)] {
            let mut episodes = worlds.episodes(&tasks, 2).unwrap(); // G = 2
            let config = ClosedLoopConfig {
                max_decisions: max_decisions(&tasks, 2),
                label: "toy",
            };
            let run = run_closed_loop(
                &mut episodes,
                &mut Constant(bin),
                &bins,
                &[0, 1, 2, 3],
                &config,
            )
            .unwrap();
            worlds.done(episodes);
            let ids: Vec<&str> = run.episodes.iter().map(|e| e.task_id.as_str()).collect();
            assert_eq!(
                ids,
                [
                    "toy/train/4/0",
                    "toy/train/4/0",
                    "toy/train/4/2",
                    "toy/train/4/2"
                ]
            );
            let steps: Vec<u32> = run.episodes.iter().map(|e| e.env_steps).collect();
            let expected = if success {
                [3, 3, 5, 5]
            } else {
                [6, 6, 10, 10]
            };
            assert_eq!(steps, expected, "bin {bin}");
            assert!(
                run.episodes
                    .iter()
                    .all(|e| e.success == success && !e.truncated)
            );
        }
        assert_eq!(worlds.faults(), None, "a world without workers");
    }

    #[test]
    fn the_toy_experts_demonstrations_come_through_the_registry() {
        let tasks: Vec<WorldTask> = generated()
            .iter()
            .map(WorldTask::from_row)
            .collect::<Result<_, _>>()
            .unwrap();
        let world = world_of_tasks(&tasks).unwrap();
        assert!(std::ptr::addr_eq(world, world_of("toy").unwrap()));
        let bins = ActionBins::openvla();
        let bridge = BridgeConfig::default();
        let request = DemoRequest {
            observation: shape(),
            action_dim: 1,
            bins: &bins,
            chunk_len: 2,
            noise: 0.0,
            seeds: &[0, 0],
            step_frames: true,
            bridge: &bridge,
        };
        let mut demos = Vec::new();
        let about = world
            .demonstrations(&tasks, &request, &mut |demo| {
                demos.push(demo);
                Ok(())
            })
            .unwrap();
        assert_eq!(about, "always on");
        let ids: Vec<&str> = demos.iter().map(|d| d.task_id.as_str()).collect();
        assert_eq!(ids, ["toy/train/4/0", "toy/train/4/2"]);
        // Cells 0 and 2 of the short corridor; its last decision moves once.
        let short = &demos[0];
        let cells: Vec<u8> = short
            .decisions
            .iter()
            .map(|d| {
                embodyflow_core::observation::decode(&d.observation)
                    .unwrap()
                    .pixels[0]
            })
            .collect();
        assert_eq!(cells, [0, 2]);
        let top = bins.encode(&[1.0]).unwrap()[0];
        assert_eq!(short.decisions[0].tokens, [top, top]);
        assert_eq!(short.decisions[1].tokens, [top]);
        assert_eq!(short.step_frames.len(), 3);
        assert_eq!(demos[1].decisions.len(), 3);
        // A callback's error stops the demonstrations.
        let stopped = world
            .demonstrations(&tasks, &request, &mut |_| Err(Error::BadInput("no".into())))
            .unwrap_err();
        assert_eq!(
            stopped.to_string(),
            Error::BadInput("no".into()).to_string()
        );
    }
}
