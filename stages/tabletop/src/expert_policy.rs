//! The scripted expert ([`Expert`]) as a [`ChunkPolicy`] (the policy
//! interface of `embodyflow_world`, below the models): a reference policy
//! for the closed-loop driver and for evaluation, with the success and
//! grasp facts of a controller that knows the scene.
//!
//! It keeps its own copy of each episode's world, built from the same
//! tasks as the [`TabletopEpisodes`](crate::TabletopEpisodes) it plays in (`group` copies of
//! each task, episode `t * group + g` being copy `g` of task `t`), steps its
//! copy with the bin centres the real world receives (so the copies stay
//! identical) and checks that every observation it is given is its copy's:
//! a policy built for other tasks is refused (bad input), not followed.
//! Copy `g` draws its noise from seed `g`.
//!
//! One decision as the rollout driver
//! (`embodyflow_rollout::closed_loop::run_closed_loop`) asks for it:
//!
//! ```
//! use embodyflow_tabletop::{ExpertPolicy, Split, Strategy, Suite, TabletopEpisodes, generate};
//! use embodyflow_world::{ChunkPolicy, ClosedLoopWorld, DecisionBatch};
//! let tasks = vec![generate(Suite::Goal, Split::Val, 7, 0)];
//! let mut policy = ExpertPolicy::new(&tasks, 2, 32, 8, Strategy::Grasp, 0.0).unwrap();
//! let mut world = TabletopEpisodes::new(&tasks, 2, 32).unwrap();
//! world.observe();
//! let ids: [&[i32]; 2] = [&[], &[]];
//! let batch = DecisionBatch {
//!     shape: world.observation_shape(),
//!     frames: world.frames(),
//!     proprio: world.proprio(),
//!     instructions: &ids,
//!     episodes: &[0, 1],
//!     seeds: &[0, 1],
//!     decision: 0,
//! };
//! let decisions = policy.decide(&batch).unwrap();
//! assert_eq!(decisions[0].tokens.len(), 8 * policy.action_dim());
//! ```

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::Error;
use embodyflow_core::observation::ObservationShape;
use embodyflow_world::{ChunkDecision, ChunkPolicy, DecisionBatch};

use crate::{
    ACTION_DIM, Expert, ExpertConfig, Status, Strategy, TabletopError, TaskSpec, World, frame_len,
    observation_shape,
};

/// The scripted expert of every episode of a
/// [`TabletopEpisodes`](crate::TabletopEpisodes).
pub struct ExpertPolicy {
    worlds: Vec<World>,
    experts: Vec<Expert>,
    bins: ActionBins,
    size: usize,
    chunk_len: usize,
    frame: Vec<u8>,
}

impl ExpertPolicy {
    /// Experts (`strategy`, Gaussian action noise `noise`) for `group`
    /// copies of each task, observing `size × size` frames and acting in
    /// chunks of `chunk_len` actions. Fails as the tabletop world does: a
    /// task it cannot build, a push expert for a goal it cannot push, a bad
    /// noise.
    pub fn new(
        tasks: &[TaskSpec],
        group: usize,
        size: usize,
        chunk_len: usize,
        strategy: Strategy,
        noise: f32,
    ) -> Result<ExpertPolicy, TabletopError> {
        let (mut worlds, mut experts) = (Vec::new(), Vec::new());
        for task in tasks {
            for g in 0..group {
                let world = World::new(task)?;
                let config = ExpertConfig {
                    noise,
                    seed: g as u64,
                };
                experts.push(Expert::new(&world, strategy, config)?);
                worlds.push(world);
            }
        }
        Ok(ExpertPolicy {
            worlds,
            experts,
            bins: ActionBins::openvla(),
            size,
            chunk_len,
            frame: vec![0; frame_len(size)],
        })
    }
}

impl ChunkPolicy for ExpertPolicy {
    type Error = Error;

    fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    fn action_dim(&self) -> usize {
        ACTION_DIM
    }

    fn observation_shape(&self) -> ObservationShape {
        observation_shape(self.size)
    }

    /// The instruction's bytes: the expert reads the scene, not the words.
    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Error> {
        Ok(instruction.bytes().map(i32::from).collect())
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Error> {
        let mut out = Vec::with_capacity(batch.len());
        for (r, &episode) in batch.episodes.iter().enumerate() {
            let (Some(world), Some(expert)) =
                (self.worlds.get_mut(episode), self.experts.get_mut(episode))
            else {
                return Err(Error::BadInput(format!(
                    "the expert policy has {} episodes, asked for episode {episode}",
                    self.worlds.len()
                )));
            };
            world
                .render(self.size, &mut self.frame)
                .map_err(|e| Error::BadInput(e.to_string()))?;
            if batch.frame(r) != self.frame || batch.proprio_of(r) != world.proprio() {
                return Err(Error::BadInput(format!(
                    "episode {episode} (task `{}`), decision {}: the observation is not the expert's copy of its world (an expert built for other tasks)",
                    world.task_id(),
                    batch.decision
                )));
            }
            let mut tokens = Vec::with_capacity(self.chunk_len * ACTION_DIM);
            for _ in 0..self.chunk_len {
                let action = if world.status() == Status::Running {
                    expert.act(world)
                } else {
                    [0.0; ACTION_DIM]
                };
                let chunk = self
                    .bins
                    .encode(&action)
                    .map_err(|e| Error::BadInput(e.to_string()))?;
                if world.status() == Status::Running {
                    let centres = self
                        .bins
                        .decode(&chunk)
                        .map_err(|e| Error::BadInput(e.to_string()))?;
                    world
                        .step(&centres)
                        .map_err(|e| Error::BadInput(e.to_string()))?;
                }
                tokens.extend(chunk);
            }
            out.push(ChunkDecision {
                token_logprobs: vec![0.0; tokens.len()],
                thought: None,
                tokens,
            });
        }
        Ok(out)
    }
}
