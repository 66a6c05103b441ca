//! Why `evaluate` stopped: the stage's error, one variant per source (the
//! policy and its tables, a closed-loop run, a batch's world), each
//! classified as its source classifies it (bad input exits 2).
//!
//! ```text
//! ModelError (checkpoint, tables)  -> EvalError::Model       kind of the ModelError
//! ClosedLoopError (an episode)     -> EvalError::ClosedLoop  kind of the ClosedLoopError
//! WorldsError (a batch's world)    -> EvalError::World       kind of the WorldsError
//! ```

use embodyflow_core::{Classify, Error, ErrorKind};
use embodyflow_models::ModelError;
use embodyflow_rollout::closed_loop::ClosedLoopError;
use embodyflow_worlds::WorldsError;

/// Why `evaluate` stopped.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
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

impl From<Error> for EvalError {
    fn from(error: Error) -> Self {
        EvalError::Model(error.into())
    }
}

impl Classify for EvalError {
    fn kind(&self) -> ErrorKind {
        match self {
            EvalError::Model(error) => error.kind(),
            EvalError::ClosedLoop(error) => error.kind(),
            EvalError::World(error) => error.kind(),
        }
    }
}
