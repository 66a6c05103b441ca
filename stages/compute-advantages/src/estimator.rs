//! What an advantage estimator is to the stage: one [`Estimator`]
//! declaration per estimator (its name and what it computes, the config
//! sections it reads, its checks, the tables it reads, whether it compares
//! a trajectory with its group, how to build it), and the [`Estimate`]
//! interface the built one implements: stream the steps table, write one
//! advantages row per owned step, and report what it counted beyond the
//! rows ([`Report`], added to `diagnostics.json` and the summary).
//!
//! The registry ([`crate::registry::ESTIMATORS`]) lists the declarations,
//! and the stage iterates that list: the config's sections and their key
//! docs, the value checks, `estimator = NAME`, `--help`'s list and the build
//! all come from them. An outcome estimator (one advantage per trajectory
//! from its group's scores) is its kernel in `embodyflow_algos` and a
//! declaration of a few lines on the shape of [`crate::outcome`], which
//! streams, masks, shards and broadcasts for it, e.g.:
//!
//! ```text
//! pub(crate) static RLOO: Estimator = Estimator {
//!     name: "rloo",
//!     about: "RLOO: R_i less the mean of the other scores of its group",
//!     sections: &[],
//!     group_relative: true,
//!     reads: |_| Vec::new(),
//!     check: |_| Ok(()),
//!     build: |b| build(b, Kernel::scores(|s, g| Ok(rloo(s, g)))),
//! };
//! ```
//!
//! Any other estimator streams the steps itself in a module of its own
//! (`gae.rs`, `step.rs`, `gigpo.rs`) that implements [`Estimate`].

use std::path::Path;

use arrow::array::RecordBatch;
use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::TableName;
use embodyflow_core::stage::Summary;
use embodyflow_core::{Result, progress};
use serde::Serialize;

use crate::config::{Config, Section};
use crate::diagnostics::Diagnostics;
use crate::episodes::{Episodes, Groups};
use crate::holes::Holes;
use crate::output::AdvantagesOut;

/// Everything the stage knows about one estimator.
pub struct Estimator {
    /// `estimator = NAME`, and what every row's `estimator` column holds.
    pub name: &'static str,
    /// What it computes, in one line (`--help`'s list of estimators).
    pub about: &'static str,
    /// The config sections it reads (each gathered once into the config).
    pub sections: &'static [Section],
    /// Whether its advantages compare a trajectory with its group's (a
    /// group that faults leave with fewer than 2 trajectories has no signal
    /// then; GAE's critic needs no siblings).
    pub group_relative: bool,
    /// The tables it reads besides trajectories, rewards and steps under a
    /// resolved config (those its settings need): what its build opens and
    /// what `--print-config` reports as the config's `reads`, so the
    /// pipeline runner checks them before any stage runs. Each is a
    /// conditional read of the stage's spec (a test checks it).
    pub reads: fn(&Config) -> Vec<TableName>,
    /// Relations between keys that hold when it is the chosen estimator
    /// (each section's own ranges are checked whatever runs).
    pub check: fn(&Config) -> Result<()>,
    /// The estimator, with the inputs its settings need loaded.
    pub build: fn(&Build<'_>) -> Result<Box<dyn Estimate>>,
}

/// What an estimator is built from.
pub struct Build<'a> {
    /// The resolved config.
    pub config: &'a Config,
    /// The chosen estimator's declaration.
    pub estimator: &'static Estimator,
    /// `--policy CKPT` (its tokenizer aligns tokens with plan steps).
    pub policy: Option<&'a Path>,
    /// The rewards table (the step path reads its rule matches).
    pub rewards: &'a TableReader,
    /// Opens another input table and records it as lineage.
    pub input: &'a dyn Fn(TableName) -> Result<TableReader>,
}

/// What every estimator reads: the steps table and the episodes it belongs to.
pub struct StepsInput<'a> {
    /// The steps table.
    pub steps: &'a TableReader,
    /// Trajectories joined with their rewards.
    pub episodes: &'a Episodes,
    /// Kept and owned groups.
    pub groups: &'a Groups,
    /// Rows per record batch read from `steps`.
    pub batch_rows: usize,
    /// The steps' response masks with holes.
    pub holes: &'a Holes,
}

impl StepsInput<'_> {
    /// Streams the steps table's `trajectory_id`, `step_index` and
    /// `response_ids` in batches of `batch_rows` into `each`, behind a
    /// progress bar named `label`: one pass of an estimator.
    pub fn for_each_batch(
        &self,
        label: &str,
        mut each: impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let bar = progress::bar(self.steps.num_rows(), label);
        for batch in self.steps.batches(
            Some(&["trajectory_id", "step_index", "response_ids"]),
            self.batch_rows,
        )? {
            let batch = batch?;
            bar.inc(batch.num_rows() as u64);
            each(&batch)?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}

/// What an estimator counted beyond the rows it wrote, if anything.
pub(crate) type Reported = Option<Box<dyn Report>>;

/// An advantage estimator: streams the steps table (GAE and GiGPO twice) and
/// writes one advantages row per step of an owned group into `out`, which
/// counts them.
pub trait Estimate {
    /// Writes the advantages of `input`'s owned steps and returns what it
    /// counted besides ([`Report`]).
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported>;
}

/// An estimator's own counts: keys of `diagnostics.json` after the run's
/// (`step`, `step_groups`) and lines of the summary after the run's. A
/// [`Counts`] struct is one; tests read a report back as its type through
/// `dyn Any`.
pub trait Report: std::any::Any + std::fmt::Debug {
    /// `diagnostics.json` with these counts after `run`'s.
    fn to_json(&self, run: &Diagnostics) -> String;
    /// Adds the summary's lines.
    fn add_lines(&self, summary: &mut Summary);
}

/// Counts as a struct whose fields become keys of `diagnostics.json`
/// ([`Diagnostics::to_json_with`]), with their summary lines.
pub trait Counts: Serialize + std::fmt::Debug + 'static {
    /// Adds the summary's lines.
    fn lines(&self, summary: &mut Summary);
}

impl<T: Counts> Report for T {
    fn to_json(&self, run: &Diagnostics) -> String {
        run.to_json_with(self)
    }

    fn add_lines(&self, summary: &mut Summary) {
        self.lines(summary);
    }
}
