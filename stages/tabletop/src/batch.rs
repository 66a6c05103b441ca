//! Many episodes stepped in lockstep, the shape a closed-loop rollout
//! stage drives: `G` copies of each task (a GRPO group shares its initial
//! state), observed into one contiguous buffer (`B × S × S × 3` frame bytes
//! and `B × PROPRIO_DIM` floats, B = tasks × G), then advanced by one action
//! chunk each (`B × K × ACTION_DIM` floats, K ≥ 1): an episode runs its
//! chunk's actions until it ends, and an ended episode is left alone (its
//! chunk is ignored). Each episode also keeps its grasp point: where its
//! first goal's target stood at reset ([`World::grasp_target`]) and where
//! the gripper was when the fingers first closed.
//!
//! ```
//! use embodyflow_tabletop::{ACTION_DIM, Batch, Split, Suite, generate};
//! let tasks = vec![generate(Suite::Goal, Split::Train, 7, 0), generate(Suite::Long, Split::Val, 7, 1)];
//! let mut batch = Batch::new(&tasks, 4, 32).unwrap();
//! assert_eq!(batch.len(), 8);
//! batch.observe();
//! assert_eq!(batch.frames().len(), 8 * 32 * 32 * 3);
//! let chunk = vec![0.0f32; 8 * 3 * ACTION_DIM]; // K = 3
//! let outcomes = batch.step_chunks(&chunk, 3).unwrap();
//! assert!(outcomes.iter().all(|o| o.env_steps == 3 && !o.done));
//! ```

use crate::TabletopError;
use crate::render::{MAX_FRAME_SIZE, MIN_FRAME_SIZE, frame_len};
use crate::scene::TaskSpec;
use crate::world::{ACTION_DIM, Grip, PROPRIO_DIM, Status, World};
use embodyflow_world::GraspPoint;

/// What one chunk did to one episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkOutcome {
    /// Actions of the chunk executed (0 for an episode that had ended).
    pub env_steps: u32,
    /// Whether the episode has ended.
    pub done: bool,
    /// Whether it ended in success.
    pub success: bool,
}

/// Episodes stepped together.
#[derive(Clone, Debug)]
pub struct Batch {
    worlds: Vec<World>,
    size: usize,
    frames: Vec<u8>,
    proprio: Vec<f32>,
    grasps: Vec<Option<GraspPoint>>,
}

impl Batch {
    /// `group` copies of each task (episode `t * group + g` is copy `g` of
    /// task `t`), observed at `size × size` pixels.
    pub fn new(tasks: &[TaskSpec], group: usize, size: usize) -> Result<Batch, TabletopError> {
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&size) {
            return Err(TabletopError::FrameSize {
                size,
                min: MIN_FRAME_SIZE,
                max: MAX_FRAME_SIZE,
            });
        }
        let mut worlds = Vec::with_capacity(tasks.len() * group);
        for task in tasks {
            let world = World::new(task)?;
            worlds.extend(std::iter::repeat_n(world, group));
        }
        let n = worlds.len();
        let grasps = worlds
            .iter()
            .map(|w| {
                w.grasp_target().map(|target| GraspPoint {
                    target,
                    closed_at: None,
                })
            })
            .collect();
        Ok(Batch {
            grasps,
            worlds,
            size,
            frames: vec![0; n * frame_len(size)],
            proprio: vec![0.0; n * PROPRIO_DIM],
        })
    }

    /// Number of episodes.
    pub fn len(&self) -> usize {
        self.worlds.len()
    }

    /// Whether the batch holds no episode.
    pub fn is_empty(&self) -> bool {
        self.worlds.is_empty()
    }

    /// Episode `i`'s world.
    pub fn world(&self, i: usize) -> &World {
        &self.worlds[i]
    }

    /// Episode `i`'s grasp point: its first goal's target at reset and
    /// where the fingers first closed (`None`: a task without a goal).
    pub fn grasp_point(&self, i: usize) -> Option<GraspPoint> {
        self.grasps[i]
    }

    /// Whether every episode has ended.
    pub fn all_done(&self) -> bool {
        self.worlds.iter().all(|w| w.status() != Status::Running)
    }

    /// Renders every episode's frame and proprio into the batch's buffers
    /// (no allocation).
    pub fn observe(&mut self) {
        let len = frame_len(self.size);
        for (i, w) in self.worlds.iter().enumerate() {
            w.render(self.size, &mut self.frames[i * len..(i + 1) * len])
                .expect("the batch's frame size and buffer were checked at construction");
            self.proprio[i * PROPRIO_DIM..(i + 1) * PROPRIO_DIM].copy_from_slice(&w.proprio());
        }
    }

    /// The frames, episode after episode (`size × size × 3` bytes each).
    pub fn frames(&self) -> &[u8] {
        &self.frames
    }

    /// The proprio vectors, episode after episode.
    pub fn proprio(&self) -> &[f32] {
        &self.proprio
    }

    /// Runs each running episode through its chunk of `k` actions
    /// (`actions` holds `len() × k × ACTION_DIM` floats), stopping where it
    /// ends. The actions are all checked before any episode moves: a wrong
    /// length or a bad value is an error naming the episode, action and
    /// dimension, and nothing is stepped.
    pub fn step_chunks(
        &mut self,
        actions: &[f32],
        k: usize,
    ) -> Result<Vec<ChunkOutcome>, TabletopError> {
        let per = k * ACTION_DIM;
        if k == 0 || actions.len() != self.worlds.len() * per {
            return Err(TabletopError::ChunkShape {
                episodes: self.worlds.len(),
                k,
                found: actions.len(),
            });
        }
        for (at, &value) in actions.iter().enumerate() {
            if !(-1.0..=1.0).contains(&value) {
                return Err(TabletopError::ChunkValue {
                    episode: at / per,
                    action: at % per / ACTION_DIM,
                    dim: at % ACTION_DIM,
                    value,
                });
            }
        }
        let mut outcomes = Vec::with_capacity(self.worlds.len());
        let episodes = self.worlds.iter_mut().zip(&mut self.grasps);
        for ((w, grasp), chunk) in episodes.zip(actions.chunks_exact(per)) {
            let mut env_steps = 0;
            for action in chunk.chunks_exact(ACTION_DIM) {
                if w.status() != Status::Running {
                    break;
                }
                if let Some(point) = grasp
                    && point.closed_at.is_none()
                    && action[3] > 0.0
                    && w.gripper().grip == Grip::Open
                {
                    let at = w.gripper().pos;
                    point.closed_at = Some([at[0], at[1]]);
                }
                w.step(action)?;
                env_steps += 1;
            }
            outcomes.push(ChunkOutcome {
                env_steps,
                done: w.status() != Status::Running,
                success: w.status() == Status::Success,
            });
        }
        Ok(outcomes)
    }
}
