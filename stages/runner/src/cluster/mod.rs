//! What the backends share: the backend interface ([`Backend`], which
//! `local`, `slurm` and `ray` implement and `crate::registry` lists), and
//! for the cluster backends the machinery they hand the steps the cache
//! says must run to: jobs that run the local backend's very command lines
//! ([`crate::exec::stage_command`]) through `pipeline task` ([`task`]).
//!
//! - [`interface`]: the [`Backend`] trait, the refusal of a run directory
//!   whose earlier jobs still run ([`refuse_live_jobs`], for every backend)
//!   and `pipeline cancel` ([`cancel`]);
//! - [`wait`]: which instances are submitted, their preparation and the
//!   wait ([`run_plan`]) in which the backend's [`Queue`] ([`queue`]) says
//!   which jobs are still queued or running and submits what may start
//!   (Slurm everything at once, with `afterok` dependencies; Ray a step's
//!   jobs once the steps it reads have completed);
//! - [`journal`]: the journal of submitted jobs
//!   (`OUT/_runner/<backend>/jobs.jsonl`) and the task records;
//! - [`task`]: what a job runs on its node;
//! - [`figures`]: what the queue cost per step ([`queue_figures`]);
//! - [`nodes`]: the paths every node must see ([`check_shared`]) and the
//!   nodes that can hold a step ([`check_fits`]).
//!
//! ```text
//! OUT/_runner/slurm/jobs.jsonl       # or ray/: one line per submitted job
//! OUT/_runner/slurm/collect/spec.json
//! OUT/_runner/slurm/collect/task-0.json   # {"started_unix":…,"ended_unix":…,"code":0,"node":…}
//! ```

pub mod figures;
pub mod interface;
pub mod journal;
pub mod nodes;
pub mod queue;
pub mod task;
pub mod wait;

pub use figures::queue_figures;
pub use interface::{Backend, Run, cancel, refuse_live_jobs};
pub use journal::{JobEntry, TaskRecord, backend_dir};
pub(crate) use queue::{JobState, Lost, Queue, Submitted};
pub use task::task;
pub(crate) use wait::run_plan;
