//! The `update-policy` stage: one round of optimisation of a policy
//! checkpoint, written as the next checkpoint (`<out>/policy/`) and the
//! metrics table (`<out>/metrics/`, one row per optimizer step; also as
//! `<out>/metrics.csv`, see [`metrics_csv`]).
//!
//! - `objective = "sft"`: cross-entropy on the expert answers of the tasks in
//!   the input `tasks` table (`sft.demos_per_task = N | all`, default 1,
//!   keeps the first N rows of each task — rows of one task drawn at several
//!   initial states share `TaskRow::task_key`, so the default is
//!   one-demonstration SFT and a table of one row per task trains on every
//!   row; `sft.demos_per_task_type = N` then keeps the first N of each task
//!   type); `sft.context =
//!   reference` trains on the teacher context of `teacher-logp` (the prompt
//!   with the ground-truth plan, `sft.template`), `both` on both contexts (a
//!   generalist teacher for forward_proxy);
//! - `objective = "ppo"` (default): the clipped surrogate of [`loss`] (clip-higher
//!   0.2 / 0.28, dual-clip 3, token-mean) on the input `steps` (prompt and
//!   response ids, old log-probs) and `advantages` (per-token advantages),
//!   log-probs recomputed from `logits / T` with each rollout's temperature
//!   from `trajectories`; optional entropy bonus and KL penalty to a
//!   reference checkpoint (`kl_reference`, with `ppo.kl_coef > 0`).
//!
//! The policy is any network of the registry (a plan policy, a Hugging Face
//! model or a VLA, [`embodyflow_models::with_policy_net`]); the loop below
//! is one for all, each network's role ([`Training`]: one for every plan
//! network, one for the VLA) supplying the checks and the per-token scores
//! of its examples.
//! On a VLA ([`vla`]) an example is one decision: the observation
//! (frame and proprio, the `steps.observation` bytes), the instruction ids
//! as the prompt and the `K × D` action tokens as the response.
//! `objective = "sft"` is behaviour cloning on the scripted expert's
//! demonstrations of the tabletop tasks in `tasks` (`sft.expert_noise`;
//! failed demonstrations are dropped and counted); `objective = "ppo"`
//! recomputes the tokens' log-probs from the stored observations. Every
//! epoch reads every observation again: with `observations = "mmap"` (the
//! default) they are written once into a memory-mapped Arrow IPC file
//! ([`store_observations`], `embodyflow_core::observation_store`: a sealed
//! memory file no other process can truncate or rewrite, gone with the
//! process) and read from the mapping, zero-copy; `"memory"` keeps them in
//! the examples. Both train the same checkpoint.
//!
//! Each epoch shuffles the examples (seeded by `--seed` and the epoch) into
//! mini-batches of `mini_batch` sequences; `grad_accumulation = k`
//! consecutive mini-batches make one AdamW step (the last step of an epoch
//! takes what is left), their gradients accumulated over micro-batches of
//! `micro_batch` sequences, with the gradient norm clipped to
//! `optim.grad_clip`. Every micro-batch's loss is aggregated with the
//! denominators of the whole step (its response tokens for `token-mean`,
//! its sequences for the `seq-mean-*` modes: [`loss::Denominators`]), so
//! the summed gradient is that of the step's k mini-batches in one piece.
//! That lets a step order its examples freely before cutting them into
//! micro-batches ([`micro_batches`]): by prompt, so a group's samples share
//! one encoding of their prompt (`score_responses` runs each distinct prompt
//! of a micro-batch once), and by length, so little is padding; the step is
//! the same up to float rounding. The entropy is computed without gradients
//! (the `entropy` metric) unless `ppo.entropy_coef > 0` puts it in the loss.
//! The learning rate follows `optim.schedule` ([`LrSchedule`](embodyflow_models::optimizer::LrSchedule): constant,
//! linear warm-up or warm-up and cosine) at the position of the optimizer's
//! step count; the AdamW state, step count included, is saved with the next
//! checkpoint and resumed by the next call on the same objective
//! (`optim.resume`), so an RL loop of many calls optimises, and follows its
//! schedule, like one trainer. The `lr` column of `metrics` is the rate each
//! step used.
//!
//! ```text
//! update-policy --policy runs/it0/policy --input runs/it0/rollouts --input runs/it0/adv \
//!     --out runs/it1 --set iteration=1
//! update-policy --policy runs/init --input data/train --out runs/sft \
//!     --set objective=sft --set sft.demos_per_task_type=1 --set epochs=300
//! ```
//!
//! The crate is split by idea: the config (`config.rs`), the examples made
//! from the input tables (`examples.rs`), the training loop and the
//! interface a role's networks train through (`train.rs`: [`Training`]),
//! the plan networks' side of it (`plan.rs`) and the VLA's ([`vla`]), and the
//! stage's run, from loading the checkpoint to committing the outputs
//! (`run.rs`). The losses are [`loss`] and [`lapo`]; `init-policy` is
//! [`init`].

mod config;
mod examples;
pub mod init;
pub mod lapo;
pub mod loss;
pub mod metrics_csv;
mod plan;
mod run;
mod train;
pub mod vla;

use embodyflow_core::cli::{PolicyArg, StageArgs};
use embodyflow_core::spec;

pub use config::{
    Config, DemosPerTask, Objective, ObservationsMode, OptimConfig, ScheduleKind, SftConfig,
    SftContext,
};
pub use examples::{
    Example, ExampleThought, ObservationBytes, SftSet, check_vocabulary, kept_tasks, ppo_examples,
    redraw_warmup_lengths, sft_examples, store_observations,
};
pub use run::run;
pub use train::{
    LatentTerms, OwnLoss, StepSums, TrainReport, Trainable, Training, accumulate, micro_batches,
    train,
};

/// Command line of `update-policy`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::UPDATE_POLICY.name,
    version,
    about = spec::UPDATE_POLICY.purpose,
    after_help = spec::UPDATE_POLICY.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
    #[command(flatten)]
    policy: PolicyArg,
}
