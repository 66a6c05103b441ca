//! The tabletop world behind the closed-loop world interface
//! ([`ClosedLoopWorld`], `embodyflow_world`): [`TabletopEpisodes`] is a
//! [`Batch`] (`G` copies of each task share its initial state) with the
//! frame size it renders at, so the rollout driver
//! (`embodyflow_rollout::closed_loop::run_closed_loop`) steps it like any
//! other world. Its anchor key (GiGPO's step groups) is BLAKE3 of the
//! world's exact state ([`World::state_bytes`](crate::World::state_bytes)),
//! 32 hex digits; it observes no text and starts every episode.
//!
//! ```
//! use embodyflow_tabletop::{ACTION_DIM, Split, Suite, TabletopEpisodes, generate};
//! use embodyflow_world::ClosedLoopWorld;
//! let tasks = vec![generate(Suite::Goal, Split::Train, 7, 0)];
//! let mut world = TabletopEpisodes::new(&tasks, 2, 32).unwrap(); // G = 2
//! world.observe();
//! assert_eq!(world.frames().len(), 2 * world.observation_shape().pixel_len());
//! assert_eq!(world.anchor_key(0), world.anchor_key(1)); // copies share the initial state
//! let reports = world.step_chunks(&vec![0.0; 2 * 3 * ACTION_DIM], 3).unwrap(); // K = 3
//! assert!(reports.iter().all(|r| r.env_steps == 3 && !r.done));
//! ```

use embodyflow_core::observation::ObservationShape;
use embodyflow_world::world::WorldEpisodes;
use embodyflow_world::{ChunkReport, ClosedLoopWorld, GraspPoint, WorldError};

use crate::TabletopError;
use crate::batch::Batch;
use crate::scene::TaskSpec;
use crate::world::{ACTION_DIM, PROPRIO_DIM, Status};

/// The observation of the tabletop world at `size × size` pixels: an RGB
/// frame and the proprio vector ([`PROPRIO_DIM`]).
pub fn observation_shape(size: usize) -> ObservationShape {
    ObservationShape {
        height: size,
        width: size,
        channels: 3,
        proprio: PROPRIO_DIM,
    }
}

/// The tabletop world's episodes ([`Batch`]: `G` copies of each task) with
/// the frame size they render at.
#[derive(Clone, Debug)]
pub struct TabletopEpisodes {
    batch: Batch,
    size: usize,
}

impl TabletopEpisodes {
    /// `group` copies of each task (episode `t * group + g` is copy `g` of
    /// task `t`), observed at `size × size` pixels.
    pub fn new(
        tasks: &[TaskSpec],
        group: usize,
        size: usize,
    ) -> Result<TabletopEpisodes, TabletopError> {
        Ok(TabletopEpisodes {
            batch: Batch::new(tasks, group, size)?,
            size,
        })
    }

    /// The episodes.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }
}

impl ClosedLoopWorld for TabletopEpisodes {
    fn len(&self) -> usize {
        self.batch.len()
    }

    fn observation_shape(&self) -> ObservationShape {
        observation_shape(self.size)
    }

    fn image_names(&self) -> &[String] {
        &[]
    }

    fn action_dim(&self) -> usize {
        ACTION_DIM
    }

    fn task_id(&self, i: usize) -> &str {
        self.batch.world(i).task_id()
    }

    fn instruction(&self, i: usize) -> &str {
        self.batch.world(i).instruction()
    }

    fn running(&self, i: usize) -> bool {
        self.batch.world(i).status() == Status::Running
    }

    fn observe(&mut self) {
        self.batch.observe()
    }

    fn frames(&self) -> &[u8] {
        self.batch.frames()
    }

    fn proprio(&self) -> &[f32] {
        self.batch.proprio()
    }

    fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError> {
        Ok(self
            .batch
            .step_chunks(actions, k)?
            .into_iter()
            .map(|o| ChunkReport {
                env_steps: o.env_steps,
                done: o.done,
                success: o.success,
                failure: None,
            })
            .collect())
    }

    fn target_ever_grasped(&self, i: usize) -> Option<bool> {
        Some(self.batch.world(i).target_ever_grasped())
    }

    fn grasp_point(&self, i: usize) -> Option<GraspPoint> {
        self.batch.grasp_point(i)
    }

    /// BLAKE3 of the world's exact state (`World::state_bytes`), 32 hex
    /// digits.
    fn anchor_key(&self, i: usize) -> Option<String> {
        let hash = blake3::hash(&self.batch.world(i).state_bytes());
        Some(hash.to_hex()[..32].to_string())
    }

    /// The tabletop world observes no text.
    fn observation_text(&self, _: usize) -> Option<&str> {
        None
    }

    fn start_failure(&self, _: usize) -> Option<&str> {
        None
    }
}

/// A batch the registry hands a stage; it keeps nothing between batches.
impl WorldEpisodes for TabletopEpisodes {}
