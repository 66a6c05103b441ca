//! The `tabletop` world: a closed-loop manipulation environment in the
//! spirit of LIBERO, embedded in pure Rust (no simulator, no assets), fast
//! enough that the policy, never the world, is the bottleneck of a
//! rollout.
//!
//! A gripper moves over a table seen from above; 2–6 objects (blocks, bowls,
//! plates, a cabinet with a drawer) have a colour, shape and size. Actions
//! are `[dx, dy, dz, grip]` in [-1, 1] at a fixed control rate; observations
//! are a rendered RGB frame, the proprio vector and the instruction.
//!
//! - [`scene`]: the vocabulary (kinds, colours, shapes, sizes, dimensions),
//!   goals and the task description [`TaskSpec`] a world is built from;
//! - [`world`]: the state, the kinematics rules (grasp, carry, push,
//!   release, the drawer), the success predicate, `max_steps`, the proprio
//!   layout;
//! - [`render`]: the top-down RGB camera into a caller-owned buffer;
//! - [`suite`]: the spatial / object / goal / long suites and the train /
//!   val / unseen splits, deterministic from (suite, split, seed, index);
//!   LIBERO's protocol: train / val / test initial states of the same
//!   tasks ([`initial_state`]);
//! - [`expert`]: the scripted expert (waypoints → actions, with noise) and
//!   the push strategy; [`expert_policy`]: it as a closed-loop policy
//!   (`embodyflow_world::ChunkPolicy`), for the driver and evaluation;
//! - [`batch`]: many episodes in lockstep (G copies per task, one action
//!   chunk per decision), observed into contiguous buffers;
//! - [`episodes`]: a batch behind the closed-loop world interface
//!   (`embodyflow_world::ClosedLoopWorld`), which the rollout driver steps;
//! - [`rows`]: tasks-table rows (the scene spec travels as JSON in the
//!   `observation` column).
//!
//! ```
//! use embodyflow_tabletop::*;
//! let task = generate(Suite::Spatial, Split::Train, 7, 42);
//! let mut world = World::new(&task).unwrap();
//! let mut frame = vec![0u8; frame_len(DEFAULT_FRAME_SIZE)];
//! world.render(DEFAULT_FRAME_SIZE, &mut frame).unwrap();
//! let proprio: [f32; PROPRIO_DIM] = world.proprio();
//! assert_eq!(proprio[..3], GRIPPER_START);
//! let mut expert = Expert::new(&world, Strategy::Grasp, ExpertConfig::default()).unwrap();
//! let episode = run_episode(&mut world, |w| expert.act(w)).unwrap();
//! assert!(episode.success && episode.steps <= task.max_steps);
//! ```

pub mod batch;
pub mod declaration;
pub mod episodes;
pub mod expert;
pub mod expert_policy;
pub mod render;
pub mod rows;
pub mod scene;
pub mod suite;
pub mod world;

pub use batch::{Batch, ChunkOutcome};
pub use episodes::{TabletopEpisodes, observation_shape};
pub use expert::{
    Decision, Demonstration, Episode, Expert, ExpertConfig, Labels, Strategy, demonstration,
    run_episode,
};
pub use expert_policy::ExpertPolicy;
pub use render::{DEFAULT_FRAME_SIZE, MAX_FRAME_SIZE, MIN_FRAME_SIZE, frame_len};
pub use rows::{ENV, task_from_row, task_row};
pub use scene::{Camera, Goal, TaskSpec};
pub use suite::{
    LAYOUT_SPLITS, REGION_HALF_WIDTH, STATE_SPLITS, Split, Suite, generate, initial_state,
    protocol_tasks, reseed,
};
pub use world::{
    ACTION_DIM, Body, GRIPPER_START, Grip, Gripper, PROPRIO_DIM, Status, StepOutcome, Support,
    World,
};

/// Errors of the tabletop world.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TabletopError {
    /// An action with another number of dimensions than [`ACTION_DIM`].
    #[error("an action has {found} dimensions, expected {expected} (dx, dy, dz, grip)")]
    ActionLength {
        /// [`ACTION_DIM`].
        expected: usize,
        /// The action's length.
        found: usize,
    },
    /// An action value outside [-1, 1] or not finite.
    #[error("action dimension {dim} ({name}) is {value}; expected a finite number in [-1, 1]")]
    ActionOutOfRange {
        /// The dimension.
        dim: usize,
        /// Its name.
        name: &'static str,
        /// The value.
        value: f32,
    },
    /// A step after the episode ended.
    #[error("task `{task}`: the episode ended after {steps} steps; reset before stepping again")]
    EpisodeOver {
        /// The task.
        task: String,
        /// Steps taken.
        steps: u32,
    },
    /// A task the world cannot be built from.
    #[error("task `{task}` cannot be built: {reason}")]
    BadTask {
        /// The task's id.
        task: String,
        /// What is wrong.
        reason: String,
    },
    /// A tasks-table row that does not describe a tabletop task.
    #[error("task `{task_id}`: {reason}")]
    BadRow {
        /// The row's task id.
        task_id: String,
        /// What is wrong.
        reason: String,
    },
    /// A frame size outside the supported range.
    #[error("frame size {size} outside {min}..={max} pixels")]
    FrameSize {
        /// The size asked for.
        size: usize,
        /// Smallest.
        min: usize,
        /// Largest.
        max: usize,
    },
    /// A frame buffer of the wrong length.
    #[error("a {size}x{size} RGB frame needs {expected} bytes, the buffer has {found}")]
    FrameBuffer {
        /// Frame size.
        size: usize,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
    /// A suite name that is not one of the four.
    #[error("unknown tabletop suite `{0}`; expected one of: spatial, object, goal, long")]
    UnknownSuite(String),
    /// A split name that is not one of the three.
    #[error(transparent)]
    UnknownSplit(#[from] embodyflow_core::schemas::UnknownSplit),
    /// The push strategy asked for a goal pushing cannot reach.
    #[error("task `{task}`: goal {goal} cannot be reached by pushing")]
    NotPushable {
        /// The task.
        task: String,
        /// The goal.
        goal: String,
    },
    /// A batch's action chunks of the wrong shape.
    #[error(
        "action chunks for {episodes} episodes of k = {k} actions need episodes * k * 4 floats (k >= 1), found {found}"
    )]
    ChunkShape {
        /// Episodes in the batch.
        episodes: usize,
        /// Actions per chunk.
        k: usize,
        /// Floats given.
        found: usize,
    },
    /// A value of a batch's action chunk outside [-1, 1] or not finite.
    #[error(
        "episode {episode}, action {action} of its chunk, dimension {dim}: {value} is not a finite number in [-1, 1]"
    )]
    ChunkValue {
        /// The episode.
        episode: usize,
        /// The action within the chunk.
        action: usize,
        /// The dimension.
        dim: usize,
        /// The value.
        value: f32,
    },
    /// Expert noise that is negative or not finite.
    #[error("expert noise {0} must be a finite number >= 0")]
    BadNoise(f32),
    /// A task index past the tasks a suite holds under the initial-states
    /// protocol, or a split it has no initial states of.
    #[error("the {suite} suite's initial-states protocol has {reason}")]
    NoSuchState {
        /// The suite.
        suite: String,
        /// What it holds.
        reason: String,
    },
}

#[cfg(test)]
mod tests;
