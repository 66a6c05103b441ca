//! The local backend (the default, `--backend local`): the stage processes
//! run on this machine ([`crate::exec`]), a sharded step's processes on
//! disjoint shares of its CPUs. It submits to no queue and keeps no
//! journal; a run directory whose cluster jobs still run is refused, as by
//! every backend (they would write into the same steps).

use std::path::Path;

use crate::cluster::{Backend, JobEntry, Run, refuse_live_jobs};
use crate::error::Result;
use crate::exec::{self, RunOutcome};

/// The local backend, as the registry lists it.
pub struct Local;

/// The local backend.
pub static LOCAL: Local = Local;

impl Backend for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn title(&self) -> &'static str {
        "local"
    }

    fn about(&self) -> &'static str {
        "This machine"
    }

    fn queued(&self) -> bool {
        false
    }

    fn run_plan(&self, run: &Run, say: &mut dyn FnMut(&str)) -> Result<RunOutcome> {
        refuse_live_jobs(&run.plan.out, run.backends)?;
        exec::run_plan(run.plan, run.options, run.log, say)
    }

    fn live_jobs(&self, _out: &Path) -> Result<Vec<JobEntry>> {
        Ok(Vec::new())
    }

    fn cancel(&self, _out: &Path) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}
