//! The toy world (`embodyflow_toy_world`) through the registry as a stage sees
//! it: its tasks from `generate-tasks --set env=toy`, run by `env` through
//! the registry and the closed-loop driver, and its expert's
//! demonstrations as behaviour cloning asks for them.

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_rollout::closed_loop::{
    ChunkDecision, ChunkPolicy, ClosedLoopConfig, DecisionBatch, run_closed_loop,
};

use embodyflow_core::Error;
use embodyflow_core::observation::ObservationShape;
use embodyflow_core::schemas::TaskRow;
use embodyflow_world::workers::WorkerSettings;

use crate::generate::{Args, Config, run};
use crate::registry::{
    Worlds, is_closed_loop, max_decisions, policy_shape, task_of, world_of, world_of_tasks,
};
use embodyflow_toy_world::shape;
use embodyflow_world::demonstrations::DemoRequest;
use embodyflow_world::world::{WorldOptions, WorldTask};

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
    let args = Args::parse_from([
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
    run(args).unwrap();
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
        .map(task_of)
        .collect::<Result<_, _>>()
        .unwrap();
    let bins = ActionBins::openvla();
    let options = WorldOptions {
        image_size: 32,
        bins: bins.clone(),
        workers: WorkerSettings::default(),
    };
    let workers = WorkerSettings::default();
    assert_eq!(policy_shape(&tasks[0], 32, &workers).unwrap().action_dim, 1);
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
        .map(task_of)
        .collect::<Result<_, _>>()
        .unwrap();
    let world = world_of_tasks(&tasks).unwrap();
    assert!(std::ptr::addr_eq(world, world_of("toy").unwrap()));
    let bins = ActionBins::openvla();
    let workers = WorkerSettings::default();
    let request = DemoRequest {
        observation: shape(),
        action_dim: 1,
        bins: &bins,
        chunk_len: 2,
        noise: 0.0,
        planned_labels: false,
        seeds: &[0, 0],
        step_frames: true,
        workers: &workers,
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
