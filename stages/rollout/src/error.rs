//! Why a stage that runs a policy in the worlds stopped (collect-rollouts,
//! evaluate): one variant per source (the policy and its tables, a
//! closed-loop run, a batch's world), each classified as its source
//! classifies it (bad input exits 2).
//!
//! ```text
//! ModelError (checkpoint, tables)  -> PolicyRunError::Model       kind of the ModelError
//! ClosedLoopError (an episode)     -> PolicyRunError::ClosedLoop  kind of the ClosedLoopError
//! WorldsError (a batch's world)    -> PolicyRunError::World       kind of the WorldsError
//! ```

use embodyflow_core::{Classify, Error, ErrorKind};
use embodyflow_models::ModelError;
use embodyflow_worlds::WorldsError;

use crate::closed_loop::ClosedLoopError;

/// Why a stage that runs a policy in the worlds stopped.
#[derive(Debug, thiserror::Error)]
pub enum PolicyRunError {
    /// Loading or running the policy, reading or writing tables.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A closed-loop run (names the episode, task and decision).
    #[error(transparent)]
    ClosedLoop(#[from] ClosedLoopError),
    /// A batch's world could not be built (a task row, the gym bridge).
    #[error(transparent)]
    World(#[from] WorldsError),
}

impl From<Error> for PolicyRunError {
    fn from(error: Error) -> Self {
        PolicyRunError::Model(error.into())
    }
}

impl Classify for PolicyRunError {
    fn kind(&self) -> ErrorKind {
        match self {
            PolicyRunError::Model(error) => error.kind(),
            PolicyRunError::ClosedLoop(error) => error.kind(),
            PolicyRunError::World(error) => error.kind(),
        }
    }
}
