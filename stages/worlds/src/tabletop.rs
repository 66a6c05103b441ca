//! The tabletop world (`env = tabletop`, [`embodyflow_tabletop`]) in
//! process: a row's scene spec ([`embodyflow_tabletop::task_from_row`]),
//! run `r` another layout ([`embodyflow_tabletop::reseed`]), episodes
//! rendered at the policy's frame size ([`TabletopEpisodes`]).
//!
//! ```
//! use embodyflow_tabletop::{Split, Suite, generate, task_row};
//! use embodyflow_worlds::WorldTask;
//! let spec = generate(Suite::Goal, Split::Train, 7, 0);
//! let task = WorldTask::from_row(&task_row(&spec)).unwrap();
//! assert_eq!((task.env(), task.max_steps()), ("tabletop", spec.max_steps));
//! assert_ne!(task.reseed(1).unwrap(), task); // another layout
//! ```

use embodyflow_core::Error;
use embodyflow_core::schemas::TaskRow;
use embodyflow_gym::BridgeConfig;
use embodyflow_tabletop::{self as tt, TabletopEpisodes, TaskSpec};

use crate::world::{Kept, World, WorldEpisodes, WorldTask, specs};
use crate::{PolicyShape, WorldOptions, WorldsError};

/// `env = tabletop`.
pub static TABLETOP: Tabletop = Tabletop;

/// The tabletop world.
pub struct Tabletop;

/// The shape of a policy for the tabletop world at frames of `image_size`
/// pixels: its proprio and action sizes, any bins over `[-1, 1]`.
pub fn shape(image_size: usize) -> PolicyShape {
    PolicyShape {
        observation: tt::observation_shape(image_size),
        action_dim: tt::ACTION_DIM,
        bins: None,
        observation_text: 0,
    }
}

fn bad(e: tt::TabletopError) -> Error {
    Error::BadInput(format!("tasks table: {e}"))
}

impl Tabletop {
    fn task_of(&'static self, spec: TaskSpec) -> WorldTask {
        WorldTask::new(
            self,
            tt::ENV,
            spec.task_id(),
            spec.instruction.clone(),
            spec.max_steps,
            spec,
        )
    }
}

impl World for Tabletop {
    fn env(&self) -> &'static str {
        tt::ENV
    }

    fn claims(&self, env: &str) -> bool {
        env == tt::ENV
    }

    fn task(&'static self, row: &TaskRow) -> Result<WorldTask, Error> {
        tt::task_from_row(row)
            .map(|spec| self.task_of(spec))
            .map_err(bad)
    }

    fn reseed(&'static self, task: &WorldTask, run: u32) -> Result<WorldTask, Error> {
        let spec = task.spec::<TaskSpec>().expect("a tabletop task");
        tt::reseed(spec, run)
            .map(|spec| self.task_of(spec))
            .map_err(bad)
    }

    fn policy_shape(
        &self,
        _: &WorldTask,
        image_size: usize,
        _: &BridgeConfig,
    ) -> Result<PolicyShape, WorldsError> {
        Ok(shape(image_size))
    }

    fn episodes(
        &self,
        tasks: &[WorldTask],
        group: usize,
        options: &WorldOptions,
        _: &mut Kept,
    ) -> Result<Box<dyn WorldEpisodes>, WorldsError> {
        TabletopEpisodes::new(&specs::<TaskSpec>(tasks), group, options.image_size)
            .map(|episodes| Box::new(episodes) as Box<dyn WorldEpisodes>)
            .map_err(|e| bad(e).into())
    }
}

impl WorldEpisodes for TabletopEpisodes {}
