//! What a closed-loop world declares to the stages: the [`World`] trait
//! (one `pub static` value per world, listed once in the registry, which
//! also holds its `Generator`), a task of
//! any world ([`WorldTask`]: its id, instruction, `max_steps` and the
//! world's own spec), a batch of episodes ([`WorldEpisodes`]: the world
//! interface [`ClosedLoopWorld`] and what the batch hands back to the
//! stage's next one), what a batch is built with ([`WorldOptions`]), the
//! shape of a policy for the world ([`PolicyShape`]) and why a batch could
//! not be built ([`WorldsError`]). The stages go through the registry
//! and never name a world.
//!
//! A world answers for the task rows whose `env` it claims
//! ([`World::claims`]): their task ([`World::task`]), another run of one
//! ([`World::reseed`]), a policy's shape ([`World::policy_shape`]), a
//! batch of episodes ([`World::episodes`]) and its scripted expert's
//! demonstrations ([`World::demonstrations`], for behaviour cloning); a
//! world that renders at the policy's size says at which
//! ([`World::frame_sizes`]) and one that generates its own tasks draws
//! them ([`World::train_tasks`]: a VLA made without a tasks table). What
//! must outlive a batch (the bridge's worker pool, its fault counts) it
//! keeps in the stage's [`Kept`] slot for it.
//!
//! A world's own settings travel through the stages unread
//! (`WorkerSettings`: the bridge's workers from a stage's `bridge.*`
//! keys), and what one reports beyond episodes (its workers' faults) comes
//! back in words ([`Kept::faults`]), so this crate knows no world.
//!
//! ```
//! use embodyflow_world::world::{World, WorldTask};
//! // A task's world answers for it: `task.world().env()`, `task.reseed(1)`.
//! fn env_of(task: &WorldTask) -> &'static str {
//!     task.world().env()
//! }
//! ```

use std::any::Any;
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;

use crate::ClosedLoopWorld;
use crate::demonstrations::{DemoRequest, Demonstration};
use crate::workers::WorkerSettings;
use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::ObservationShape;
use embodyflow_core::schemas::TaskRow;
use embodyflow_core::{Classify, Error, ErrorKind};

/// A closed-loop world, as the stages see it.
pub trait World: Sync {
    /// The `env` of its task rows in messages (`tabletop`,
    /// `gym:<adapter>`).
    fn env(&self) -> &'static str;
    /// Whether a task row's `env` names this world.
    fn claims(&self, env: &str) -> bool;
    /// The task of a row it claims; a row it cannot build is bad input
    /// naming the task.
    fn task(&'static self, row: &TaskRow) -> Result<WorldTask, Error>;
    /// Run `run` (≥ 1) of one of its tasks (evaluation averages over runs).
    fn reseed(&'static self, task: &WorldTask, run: u32) -> Result<WorldTask, Error>;
    /// The shape of a policy for the task's world (at frames of
    /// `image_size` pixels where the world renders at the policy's size;
    /// a world played by workers asks one, as `workers` says).
    fn policy_shape(
        &self,
        task: &WorldTask,
        image_size: usize,
        workers: &WorkerSettings,
    ) -> Result<PolicyShape, WorldsError>;
    /// `group` episodes of each of `tasks` (all of this world; episode
    /// `t * group + g` is copy `g` of task `t`), built with what the
    /// previous batch left in `kept`.
    fn episodes(
        &self,
        tasks: &[WorldTask],
        group: usize,
        options: &WorldOptions,
        kept: &mut Kept,
    ) -> Result<Box<dyn WorldEpisodes>, WorldsError>;
    /// The frame sizes it renders at the policy's size (the bounds of
    /// init-policy's `vla.image_size`); `None` for a world whose frames
    /// are its own.
    fn frame_sizes(&self) -> Option<RangeInclusive<usize>> {
        None
    }
    /// `count` generated train tasks drawn from `seed`, for a world that
    /// generates its own: a VLA made without a tasks table is made for
    /// them (their world's shape, their instructions as its tokenizer's
    /// corpus). `None` for a world whose tasks come from elsewhere.
    fn train_tasks(&'static self, count: usize, seed: u64) -> Option<Vec<WorldTask>> {
        let _ = (count, seed);
        None
    }
    /// Its scripted expert's demonstrations of `tasks` (all of this world),
    /// handed to `each` in task order as the request's policy would observe
    /// and act ([`crate::demonstrations`]); returns what they are, for the
    /// stage's summary (`grasp, noise 0.1`). A policy of another shape, or
    /// a task it cannot play, is bad input naming it; a world without an
    /// expert refuses.
    fn demonstrations(
        &self,
        tasks: &[WorldTask],
        request: &DemoRequest<'_>,
        each: &mut dyn FnMut(Demonstration) -> Result<(), Error>,
    ) -> Result<String, Error> {
        let _ = (request, each);
        Err(Error::BadInput(format!(
            "task `{}`: the world `{}` has no scripted expert to demonstrate it",
            tasks.first().map(WorldTask::task_id).unwrap_or_default(),
            self.env()
        )))
    }
}

/// A batch of a world's episodes.
pub trait WorldEpisodes: ClosedLoopWorld {
    /// Hands back what the stage's next batch of this world reuses, and
    /// what its summary reports (the bridge's workers and their faults).
    fn finish(self: Box<Self>, kept: &mut Kept) {
        let _ = kept;
    }
}

/// What a world keeps between a stage's batches.
#[derive(Default)]
pub struct Kept {
    /// The world's own state (the bridge's worker pool).
    pub state: Option<Box<dyn Any>>,
    /// Its workers' faults so far, in words for the stage's summary (the
    /// bridge's `worker faults: 0 crashed, 0 hung, 0 malformed; 0
    /// restarts`); `None` for a world without workers.
    pub faults: Option<String>,
}

/// A world's own task description, held by a [`WorldTask`].
pub trait Spec: Any + fmt::Debug + Send + Sync {
    /// Itself, to be downcast by its world.
    fn as_any(&self) -> &dyn Any;
    /// Whether `other` is the same spec.
    fn same(&self, other: &dyn Spec) -> bool;
}

impl<T: Any + fmt::Debug + PartialEq + Send + Sync> Spec for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn same(&self, other: &dyn Spec) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
}

/// A task of a closed-loop world.
#[derive(Clone)]
pub struct WorldTask {
    world: &'static dyn World,
    env: String,
    task_id: String,
    instruction: String,
    max_steps: u32,
    spec: Arc<dyn Spec>,
}

impl WorldTask {
    /// A task of `world` (its row's `env`, id, instruction and `max_steps`)
    /// described by the world's `spec`.
    pub fn new(
        world: &'static dyn World,
        env: &str,
        task_id: String,
        instruction: String,
        max_steps: u32,
        spec: impl Spec,
    ) -> WorldTask {
        WorldTask {
            world,
            env: env.to_string(),
            task_id,
            instruction,
            max_steps,
            spec: Arc::new(spec),
        }
    }

    /// Its world.
    pub fn world(&self) -> &'static dyn World {
        self.world
    }

    /// Its row's `env`.
    pub fn env(&self) -> &str {
        &self.env
    }

    /// The task's id.
    pub fn task_id(&self) -> String {
        self.task_id.clone()
    }

    /// Its instruction in words.
    pub fn instruction(&self) -> &str {
        &self.instruction
    }

    /// Environment steps after which an episode ends as a failure.
    pub fn max_steps(&self) -> u32 {
        self.max_steps
    }

    /// The world's spec of the task, when it is a `T`.
    pub fn spec<T: 'static>(&self) -> Option<&T> {
        self.spec.as_any().downcast_ref::<T>()
    }

    /// The same task in run `r` (evaluation averages over runs): run 0 is
    /// the task itself, another its world's [`World::reseed`].
    pub fn reseed(&self, run: u32) -> Result<WorldTask, Error> {
        if run == 0 {
            return Ok(self.clone());
        }
        self.world.reseed(self, run)
    }

    /// Whether two tasks are of the same world.
    pub fn same_world(&self, other: &WorldTask) -> bool {
        std::ptr::addr_eq(self.world, other.world)
    }
}

impl PartialEq for WorldTask {
    fn eq(&self, other: &WorldTask) -> bool {
        self.same_world(other)
            && self.env == other.env
            && self.task_id == other.task_id
            && self.instruction == other.instruction
            && self.max_steps == other.max_steps
            && self.spec.same(other.spec.as_ref())
    }
}

impl fmt::Debug for WorldTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorldTask")
            .field("env", &self.env)
            .field("task_id", &self.task_id)
            .field("spec", &self.spec)
            .finish()
    }
}

/// The specs of `tasks` as their world's type `T` (a world's
/// [`World::episodes`] is only given its own tasks).
pub fn specs<T: Clone + 'static>(tasks: &[WorldTask]) -> Vec<T> {
    tasks
        .iter()
        .map(|t| {
            t.spec::<T>()
                .unwrap_or_else(|| panic!("task `{}` is not of this world", t.task_id))
                .clone()
        })
        .collect()
}

/// What a policy for a world observes and does: the shape of its
/// observations, the dimensions of one action and, where the world fixes
/// them, its action bins.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyShape {
    /// The observations (frame and proprio).
    pub observation: ObservationShape,
    /// Dimensions of one action.
    pub action_dim: usize,
    /// The bins the world's actions need (a discrete action space: one bin
    /// per action and one more, `ActionSpace::bins`); `None` when any bins
    /// over `[-1, 1]` do (the tabletop world).
    pub bins: Option<ActionBins>,
    /// The longest text an observation carries, in characters (a
    /// Gymnasium `Text` observation, which each decision's prompt holds
    /// after the instruction); 0 when the world observes no text.
    pub observation_text: usize,
}

/// How a batch's episodes observe and act.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    /// Frame size of the tabletop world's renders (the policy's).
    pub image_size: usize,
    /// The policy's action bins.
    pub bins: ActionBins,
    /// How a world played by workers runs them (the bridge's, from a
    /// stage's `bridge.*` keys).
    pub workers: WorkerSettings,
}

/// Why a batch's episodes could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WorldsError {
    /// A task row its world cannot build, or tasks of two worlds.
    #[error(transparent)]
    Core(#[from] Error),
    /// A world could not start or reset its environments (the gym
    /// bridge: a missing package, an unknown env id, a Python that cannot
    /// start, ...): its error, named by the world and classified as it
    /// classifies it ([`WorldsError::world`]).
    #[error("{world}: {error}")]
    World {
        /// What failed, in messages (`the gym bridge`).
        world: &'static str,
        /// The error's kind ([`Classify::kind`] of the error).
        kind: ErrorKind,
        /// The world's error.
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl WorldsError {
    /// A world's own `error`, in messages `world: error`.
    pub fn world<E>(world: &'static str, error: E) -> WorldsError
    where
        E: std::error::Error + Classify + Send + Sync + 'static,
    {
        WorldsError::World {
            world,
            kind: error.kind(),
            error: Box::new(error),
        }
    }
}

impl Classify for WorldsError {
    fn kind(&self) -> ErrorKind {
        match self {
            WorldsError::Core(e) => e.kind(),
            WorldsError::World { kind, .. } => *kind,
        }
    }
}
