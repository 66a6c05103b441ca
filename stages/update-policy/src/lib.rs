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
//! The policy is a plan policy or a VLA (`config.json` `kind`,
//! [`policy_kind`]); the loop below is one for both, a [`Trainable`]
//! network supplying the checks and the per-token scores of its examples.
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
//! The learning rate follows `optim.schedule` ([`LrSchedule`]: constant,
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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use embodyflow_core::cli::{PolicyArg, StageArgs};
use embodyflow_core::commit::Digest;
use embodyflow_core::config::{at_least, ensure, positive};
use embodyflow_core::observation_store::{
    ObservationStore, ObservationStoreError, ObservationStoreWriter,
};
use embodyflow_core::schemas::{
    AdvantageRow, MetricRow, StepRow, TableName, TaskRow, TrajectoryRow,
};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, progress};
use embodyflow_envs::TaskEnv;
use embodyflow_envs::context::{ContextTemplates, reference_plan};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, PolicyKind, PolicyNet, policy_kind};
use embodyflow_models::frame_encoder::FrameEncoder;
use embodyflow_models::gpt::Gpt;
use embodyflow_models::hf::HfNet;
use embodyflow_models::optimizer::{AdamW, AdamWConfig, LrSchedule, OptimizerState};
use embodyflow_models::policy::{Entropy, PlanNet, ResponseScores, score_responses};
use embodyflow_models::tokenizer::encode;
use embodyflow_models::vla::{VALUE_HEAD, Vla, WarmupConfig};
use embodyflow_worlds::BridgeKeys;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

pub mod init;
pub mod lapo;
pub mod loss;
pub mod metrics_csv;
pub mod vla;

use lapo::LapoConfig;
use loss::{Denominators, PpoConfig, aggregate, kl_penalty, policy_loss};

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

/// Where a VLA's observations are kept while it trains (`observations`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObservationsMode {
    /// Each example holds its bytes (the process's own memory).
    Memory,
    /// Written once into a memory-mapped Arrow IPC file
    /// ([`store_observations`]): sealed shared memory, not the heap.
    #[default]
    Mmap,
}

/// What the update optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Cross-entropy on expert answers.
    Sft,
    /// The clipped policy-gradient surrogate on rollouts and advantages.
    Ppo,
    /// LaST-R1's LAPO on a thinking VLA's rollouts: action, `<latent_end>`
    /// and latent surrogates and the clipped value loss ([`lapo`]).
    Lapo,
}

/// `optim.*` settings (AdamW).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    /// Learning rate (the base rate the schedule scales).
    pub lr: f64,
    /// Learning-rate schedule over the optimizer's steps.
    pub schedule: ScheduleKind,
    /// Steps of the linear warm-up from 0 (`linear_warmup`, `cosine`).
    pub warmup_steps: u64,
    /// The step at which the cosine reaches its floor (`cosine`; counted
    /// over the whole run: the step count carries over resumed calls).
    pub total_steps: Option<u64>,
    /// The cosine's floor as a fraction of `lr` (`cosine`).
    pub min_lr_ratio: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Adam beta1.
    pub beta1: f64,
    /// Adam beta2.
    pub beta2: f64,
    /// Largest gradient norm (0 = no clipping).
    pub grad_clip: f64,
    /// Continue from the AdamW state saved in the input checkpoint when it
    /// was accumulated on the same objective (false: start fresh).
    pub resume: bool,
}

/// `optim.schedule`: the shape of the learning rate over the optimizer's steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// `optim.lr` at every step.
    #[default]
    Constant,
    /// A ramp from 0 over `optim.warmup_steps`, then `optim.lr`.
    LinearWarmup,
    /// The ramp, then a half-cosine down to `optim.min_lr_ratio · optim.lr` at `optim.total_steps`.
    Cosine,
}

impl ScheduleKind {
    /// The name config files use.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::LinearWarmup => "linear_warmup",
            ScheduleKind::Cosine => "cosine",
        }
    }
}

impl Objective {
    /// The name config files use.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Sft => "sft",
            Objective::Ppo => "ppo",
            Objective::Lapo => "lapo",
        }
    }
}

impl OptimConfig {
    /// The schedule these settings describe (checked by `Config::validate`).
    pub fn schedule(&self) -> LrSchedule {
        match self.schedule {
            ScheduleKind::Constant => LrSchedule::Constant,
            ScheduleKind::LinearWarmup => LrSchedule::LinearWarmup {
                warmup_steps: self.warmup_steps,
            },
            ScheduleKind::Cosine => LrSchedule::Cosine {
                warmup_steps: self.warmup_steps,
                total_steps: self.total_steps.unwrap_or(self.warmup_steps),
                min_lr_ratio: self.min_lr_ratio,
            },
        }
    }

    fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            weight_decay: self.weight_decay,
            eps: 1e-8,
        }
    }
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-4,
            schedule: ScheduleKind::Constant,
            warmup_steps: 0,
            total_steps: None,
            min_lr_ratio: 0.0,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            grad_clip: 1.0,
            resume: true,
        }
    }
}

/// `sft.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftConfig {
    /// Keep the first N rows of each task (`TaskRow::task_key`); 1 by
    /// default: one demonstration per task, from its first initial state
    /// (SimpleVLA-RL's one-trajectory SFT).
    pub demos_per_task: DemosPerTask,
    /// Then keep only the first N tasks of each task type (one per task
    /// type: the household study's held-out-combination SFT).
    pub demos_per_task_type: Option<usize>,
    /// The context each expert answer is trained after.
    pub context: SftContext,
    /// The teacher template (`context = reference | both`): the same
    /// templates `teacher-logp` reads, so a teacher is trained on the context
    /// it will score in.
    pub template: ContextTemplates,
    /// The scripted expert's action noise on a VLA's demonstrations (its
    /// `ExpertConfig::noise`: relative standard deviation on dx, dy, dz),
    /// seeded by `--seed` and the task id.
    pub expert_noise: f32,
    /// A thinking VLA's warm-up: the weights of the latent cosine, stop
    /// and action cross-entropies (LaST-R1: 1 : 0.1 : 1) and what fills the
    /// latent slots.
    pub warmup: WarmupConfig,
    /// The gym bridge's workers running the scripted experts of bridge
    /// tasks (`sft.bridge.*`).
    pub bridge: BridgeKeys,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            demos_per_task: DemosPerTask::First(1),
            demos_per_task_type: None,
            context: SftContext::default(),
            template: ContextTemplates::default(),
            expert_noise: 0.05,
            warmup: WarmupConfig::default(),
            bridge: BridgeKeys::default(),
        }
    }
}

/// How many rows of each task SFT keeps: the first N, or `all` (full SFT:
/// every initial state's demonstration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemosPerTask {
    /// Every row.
    All,
    /// The first N rows, in table order.
    First(usize),
}

impl Serialize for DemosPerTask {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match *self {
            DemosPerTask::All => s.serialize_str("all"),
            DemosPerTask::First(n) => s.serialize_u64(n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for DemosPerTask {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(usize),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => Ok(DemosPerTask::First(n)),
            Raw::Word(w) if w == "all" => Ok(DemosPerTask::All),
            Raw::Word(w) => w.parse().map(DemosPerTask::First).map_err(|_| {
                serde::de::Error::custom(format!(
                    "`{w}`: expected a number of demonstrations per task or `all`"
                ))
            }),
        }
    }
}

/// What an SFT example's answer follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftContext {
    /// The policy's prompt (a policy).
    #[default]
    Prompt,
    /// The teacher template with the ground-truth plan (a reference-reading teacher).
    Reference,
    /// Both, one example each (a generalist teacher: it answers with and without a reference).
    Both,
}

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// What to optimise.
    pub objective: Objective,
    /// Iteration recorded in the metrics rows.
    pub iteration: i32,
    /// Passes over the examples.
    pub epochs: usize,
    /// Sequences per mini-batch.
    pub mini_batch: usize,
    /// Sequences per forward/backward pass (gradients accumulate up to `mini_batch`).
    pub micro_batch: usize,
    /// Mini-batches per optimizer step (their gradients accumulate, the loss
    /// normalised over all of them: one step on their union).
    pub grad_accumulation: usize,
    /// Optimizer.
    pub optim: OptimConfig,
    /// Policy loss.
    pub ppo: PpoConfig,
    /// LAPO's weights, latent sigma and value clip (`objective = lapo`).
    pub lapo: LapoConfig,
    /// Reference checkpoint of the KL penalty (needed when `ppo.kl_coef > 0`).
    pub kl_reference: Option<PathBuf>,
    /// Supervised fine-tuning.
    pub sft: SftConfig,
    /// Where a VLA's observations are kept while training.
    pub observations: ObservationsMode,
    /// Output layout of the metrics table.
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            objective: Objective::Ppo,
            iteration: 0,
            epochs: 1,
            mini_batch: 64,
            micro_batch: 16,
            grad_accumulation: 1,
            optim: OptimConfig::default(),
            ppo: PpoConfig::default(),
            lapo: LapoConfig::default(),
            kl_reference: None,
            sft: SftConfig::default(),
            observations: ObservationsMode::default(),
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        ("epochs", "passes over the examples (veRL ppo_epochs)"),
        (
            "grad_accumulation",
            "mini-batches per optimizer step (loss normalised over all of them)",
        ),
        ("iteration", "iteration recorded in the metrics rows"),
        (
            "kl_reference",
            "reference checkpoint of the KL penalty (needed when ppo.kl_coef > 0)",
        ),
        (
            "micro_batch",
            "sequences per forward/backward pass (veRL ppo_micro_batch_size_per_gpu)",
        ),
        (
            "mini_batch",
            "sequences per mini-batch (veRL ppo_mini_batch_size)",
        ),
        (
            "lapo.critic_optim",
            "LAPO: the value head's optimiser: own (its own rate, lapo.value_lr_scale x optim.lr, LaST-R1) or shared (one rate)",
        ),
        (
            "lapo.latent_sigma",
            "LAPO: sigma of the latent ratio exp(-0.5 sum ||z_old - z||^2 / sigma^2) (LaST-R1: 10)",
        ),
        (
            "lapo.value_clip",
            "LAPO: the value is clipped to old value +- this (LaST-R1: 0.2)",
        ),
        (
            "lapo.value_coef",
            "LAPO: weight of the value loss in the total (LaST-R1: 1)",
        ),
        (
            "lapo.value_lr_scale",
            "LAPO: the value head's rate as a multiple of optim.lr with critic_optim = own (LaST-R1: 10)",
        ),
        (
            "lapo.w_action",
            "LAPO: weight of the action/stop mean (action_loss_weight, 1)",
        ),
        (
            "lapo.w_end",
            "LAPO: weight of the stop against the n_action action tokens (latent_end_loss_weight, 1)",
        ),
        (
            "lapo.w_latent",
            "LAPO: weight of the latent surrogate (latent_loss_weight, 0.1)",
        ),
        (
            "objective",
            "what to optimise: ppo, sft (a thinking VLA: its warm-up) or lapo (a thinking VLA's rollouts)",
        ),
        (
            "observations",
            "VLA: where observations are kept while training: mmap (a memory-mapped Arrow IPC file in sealed shared memory) or memory",
        ),
        ("optim.beta1", "AdamW beta1"),
        ("optim.beta2", "AdamW beta2"),
        ("optim.grad_clip", "largest gradient norm (0: no clipping)"),
        (
            "optim.lr",
            "learning rate (the base rate the schedule scales)",
        ),
        (
            "optim.min_lr_ratio",
            "cosine: the floor as a fraction of optim.lr",
        ),
        (
            "optim.resume",
            "continue from the AdamW state saved in the input checkpoint (same objective)",
        ),
        (
            "optim.schedule",
            "learning-rate schedule: constant, linear_warmup or cosine",
        ),
        (
            "optim.total_steps",
            "cosine: the step at which the rate reaches its floor (over the whole run)",
        ),
        (
            "optim.warmup_steps",
            "linear_warmup, cosine: steps of the linear warm-up from 0",
        ),
        ("optim.weight_decay", "decoupled weight decay"),
        ("ppo.clip_high", "upper clip range eps_high (clip-higher)"),
        ("ppo.clip_low", "lower clip range eps_low"),
        (
            "ppo.dual_clip",
            "dual-clip constant c for negative advantages (> 1)",
        ),
        (
            "ppo.entropy_coef",
            "entropy bonus coefficient (the loss subtracts coef * entropy)",
        ),
        ("ppo.kl_coef", "KL penalty coefficient beta (0: off)"),
        ("ppo.kl_estimator", "KL estimator: k1, k2 or k3"),
        (
            "ppo.loss_agg",
            "loss aggregation: token-mean, seq-mean-token-sum or seq-mean-token-mean",
        ),
        (
            "sft.context",
            "context each expert answer is trained after: prompt, reference or both",
        ),
        (
            "sft.demos_per_task",
            "keep the first N rows of each task (rows sharing the task id before `@`: one task's initial states), or all; 1: one demonstration per task",
        ),
        (
            "sft.demos_per_task_type",
            "then keep only the first N tasks of each task type (unset: all)",
        ),
        (
            "sft.bridge.python",
            "bridge tasks: the gym bridge workers' Python, e.g. a venv with your adapter packages (unset: $EMBODYFLOW_GYM_PYTHON, else .venv)",
        ),
        (
            "sft.bridge.timeout_s",
            "bridge tasks: seconds a gym bridge worker may take per request before it counts as hung, > 0",
        ),
        (
            "sft.bridge.workers",
            "bridge tasks: gym bridge workers running the scripted experts (0: one per CPU)",
        ),
        (
            "sft.expert_noise",
            "VLA: the tabletop expert's relative action noise in [0, 1] on demonstrations (seeded by --seed and task)",
        ),
        (
            "sft.warmup.action",
            "thinking VLA warm-up: weight of the action cross-entropy (1)",
        ),
        (
            "sft.warmup.end",
            "thinking VLA warm-up: weight of the <latent_end> cross-entropy (0.1)",
        ),
        (
            "sft.warmup.latent",
            "thinking VLA warm-up: weight of the latent cosine loss (1)",
        ),
        (
            "sft.warmup.self_forcing",
            "thinking VLA warm-up: the latent slots hold the policy's own one-step predictions (true) or the targets (false: LaST-R1's teacher forcing)",
        ),
        (
            "sft.template.name",
            "teacher template name (context = reference | both)",
        ),
        ("sft.template.student", "student context template"),
        (
            "sft.template.teacher",
            "teacher context template, with {reference_plan}",
        ),
    ];

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> embodyflow_core::Result<()> {
        at_least("iteration", self.iteration, 0)?;
        at_least("epochs", self.epochs, 1)?;
        at_least("mini_batch", self.mini_batch, 1)?;
        at_least("micro_batch", self.micro_batch, 1)?;
        at_least("grad_accumulation", self.grad_accumulation, 1)?;
        let optim = &self.optim;
        positive("optim.lr", optim.lr)?;
        validate_schedule(optim)?;
        non_negative("optim.weight_decay", optim.weight_decay)?;
        for (key, beta) in [("optim.beta1", optim.beta1), ("optim.beta2", optim.beta2)] {
            ensure((0.0..1.0).contains(&beta), key, "a number in [0, 1)", beta)?;
        }
        non_negative("optim.grad_clip", optim.grad_clip)?;
        let ppo = &self.ppo;
        ensure(
            (0.0..1.0).contains(&ppo.clip_low),
            "ppo.clip_low",
            "a number in [0, 1)",
            ppo.clip_low,
        )?;
        non_negative("ppo.clip_high", ppo.clip_high)?;
        ensure(
            ppo.dual_clip.is_finite() && ppo.dual_clip > 1.0,
            "ppo.dual_clip",
            "a finite number above 1",
            ppo.dual_clip,
        )?;
        non_negative("ppo.entropy_coef", ppo.entropy_coef)?;
        non_negative("ppo.kl_coef", ppo.kl_coef)?;
        ensure(
            ppo.kl_coef == 0.0 || self.kl_reference.is_some(),
            "kl_reference",
            format!(
                "a reference checkpoint directory with ppo.kl_coef = {}",
                ppo.kl_coef
            ),
            "none",
        )?;
        if let DemosPerTask::First(n) = self.sft.demos_per_task {
            at_least("sft.demos_per_task", n, 1)?;
        }
        if let Some(n) = self.sft.demos_per_task_type {
            at_least("sft.demos_per_task_type", n, 1)?;
        }
        ensure(
            (0.0..=1.0).contains(&self.sft.expert_noise),
            "sft.expert_noise",
            "a number in [0, 1]",
            self.sft.expert_noise,
        )?;
        self.sft.bridge.validate("sft.")?;
        if self.sft.context != SftContext::Prompt {
            self.sft.template.check().map_err(|e| Error::BadValue {
                key: "sft.template".into(),
                reason: e.to_string(),
            })?;
        }
        let warmup = &self.sft.warmup;
        for (key, weight) in [
            ("sft.warmup.latent", warmup.latent),
            ("sft.warmup.end", warmup.end),
            ("sft.warmup.action", warmup.action),
        ] {
            non_negative(key, weight)?;
        }
        if self.objective == Objective::Lapo {
            for (key, value) in [
                ("ppo.kl_coef", self.ppo.kl_coef),
                ("ppo.entropy_coef", self.ppo.entropy_coef),
            ] {
                ensure(
                    value == 0.0,
                    key,
                    "0 with objective = lapo (its loss has no KL penalty or entropy bonus, as LaST-R1's runs)",
                    value,
                )?;
            }
        }
        self.lapo.check()
    }
}

/// The schedule keys agree with `optim.schedule`: a key the schedule does not
/// read is refused rather than ignored.
fn validate_schedule(optim: &OptimConfig) -> embodyflow_core::Result<()> {
    let name = optim.schedule.name();
    match optim.schedule {
        ScheduleKind::Constant => ensure(
            optim.warmup_steps == 0,
            "optim.warmup_steps",
            "0 with optim.schedule = constant (linear_warmup or cosine warm up)",
            optim.warmup_steps,
        )?,
        ScheduleKind::LinearWarmup => at_least("optim.warmup_steps", optim.warmup_steps, 1)?,
        ScheduleKind::Cosine => {}
    }
    if optim.schedule == ScheduleKind::Cosine {
        let total = optim.total_steps.ok_or_else(|| Error::BadValue {
            key: "optim.total_steps".into(),
            reason: "optim.schedule = cosine needs the run's total optimizer steps".into(),
        })?;
        ensure(
            total > optim.warmup_steps,
            "optim.total_steps",
            format!("more than optim.warmup_steps = {}", optim.warmup_steps),
            total,
        )?;
        ensure(
            (0.0..=1.0).contains(&optim.min_lr_ratio),
            "optim.min_lr_ratio",
            "a number in [0, 1]",
            optim.min_lr_ratio,
        )?;
    } else {
        if let Some(total) = optim.total_steps {
            return Err(Error::BadValue {
                key: "optim.total_steps".into(),
                reason: format!(
                    "only optim.schedule = cosine reads it; found {total} with optim.schedule = {name}"
                ),
            });
        }
        ensure(
            optim.min_lr_ratio == 0.0,
            "optim.min_lr_ratio",
            format!("0 with optim.schedule = {name} (only cosine reads it)"),
            optim.min_lr_ratio,
        )?;
    }
    Ok(())
}

/// A finite number of at least 0 (a coefficient or clip that 0 turns off).
fn non_negative(key: &str, value: f64) -> embodyflow_core::Result<()> {
    ensure(
        value.is_finite() && value >= 0.0,
        key,
        "a finite number of at least 0",
        value,
    )
}

/// One training sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// What the example is (a task id, or a trajectory id and step), for messages.
    pub source: String,
    /// Prompt ids (ending with `<|plan|>`).
    pub prompt: Vec<i32>,
    /// Response ids.
    pub response: Vec<i32>,
    /// Behaviour log-probs (PPO only).
    pub old_logprobs: Vec<f32>,
    /// Per-token advantages (PPO only).
    pub advantages: Vec<f32>,
    /// Sampling temperature of the response (1 for SFT).
    pub temperature: f32,
    /// A VLA decision's observation bytes (`embodyflow_core::observation`;
    /// `None` for plans): read through [`Example::observation`] alone.
    pub observation: Option<ObservationBytes>,
    /// A thinking VLA's latent chain at this decision: the rollout's (LAPO)
    /// or the warm-up's targets (SFT); `None` otherwise.
    pub thought: Option<ExampleThought>,
    /// Which response tokens are the policy's (`steps.response_mask`):
    /// false marks a token a tool or the environment inserted, left out of
    /// the loss, the entropy, the KL penalty and the token counts (its old
    /// log-prob and advantage are never used). `None`: every token.
    pub response_mask: Option<Vec<bool>>,
}

/// The latent chain of a thinking VLA's example ([`vla::thinking`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleThought {
    /// Every latent slot, flattened (`latent_length × n_embd`): the
    /// rollout's latents (LAPO) or the warm-up's target features (SFT).
    pub latents: Vec<f32>,
    /// Width of one latent, as the table says (checked against the
    /// checkpoint's `n_embd`).
    pub latent_dim: usize,
    /// Latents before the chosen `<latent_end>` (one of the checkpoint's
    /// candidate lengths).
    pub latent_len: usize,
    /// The warm-up's candidate lengths, `latent_len` drawn anew from them
    /// every epoch ([`vla::thinking::redraw_warmup_lengths`]); empty for
    /// LAPO (the rollout chose its stop).
    pub warmup_lengths: Vec<usize>,
    /// The rollout's log-prob of that stop (LAPO; 0 for SFT).
    pub old_stop_logprob: f32,
    /// The rollout's value estimate (LAPO; 0 for SFT).
    pub old_value: f32,
    /// The value target: GAE's return, advantage + value before whitening
    /// (LAPO; 0 for SFT).
    pub target_return: f32,
}

impl Example {
    /// Response tokens in the loss: the policy's (mask true), all without a mask.
    pub fn loss_tokens(&self) -> usize {
        self.response_mask
            .as_ref()
            .map_or(self.response.len(), |m| m.iter().filter(|&&v| v).count())
    }

    /// `values` (one per response token) with 0 at the holes of the
    /// response mask, so that nothing at a hole reaches the loss.
    fn hole_free<'a>(&self, values: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        match &self.response_mask {
            Some(mask) => values
                .iter()
                .zip(mask)
                .map(|(&v, &m)| if m { v } else { 0.0 })
                .collect::<Vec<f32>>()
                .into(),
            None => values.into(),
        }
    }

    /// The encoded observation a VLA decision was taken at, if any: the one
    /// accessor of the observation (read by [`vla::decode_observations`]).
    pub fn observation(&self) -> Option<&[u8]> {
        self.observation.as_ref().map(ObservationBytes::bytes)
    }
}

/// Where an example's observation bytes are.
#[derive(Debug, Clone)]
pub enum ObservationBytes {
    /// In the example.
    Held(Vec<u8>),
    /// Row `index` of a store the examples share ([`store_observations`]).
    Stored {
        /// The store.
        store: Arc<ObservationStore>,
        /// The row.
        index: usize,
    },
}

impl ObservationBytes {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ObservationBytes::Held(bytes) => bytes,
            ObservationBytes::Stored { store, index } => store.get(*index),
        }
    }
}

impl From<Vec<u8>> for ObservationBytes {
    fn from(bytes: Vec<u8>) -> Self {
        ObservationBytes::Held(bytes)
    }
}

/// Equal when the bytes are, wherever they are.
impl PartialEq for ObservationBytes {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

/// The summary's line on the examples' chosen latent lengths (a thinking
/// VLA's), e.g. `2: 40.0 %, 4: 60.0 % (n = 10)`; `None` without latents.
fn latent_lengths_note(examples: &[Example]) -> Option<String> {
    let mut counts = std::collections::BTreeMap::<usize, usize>::new();
    for thought in examples.iter().filter_map(|e| e.thought.as_ref()) {
        *counts.entry(thought.latent_len).or_default() += 1;
    }
    let n: usize = counts.values().sum();
    (n > 0).then(|| {
        let shares: Vec<String> = counts
            .iter()
            .map(|(len, count)| format!("{len}: {:.1} %", 100.0 * *count as f64 / n as f64))
            .collect();
        format!("{} (n = {n})", shares.join(", "))
    })
}

/// The summary's line on where the examples' observations were: `None`
/// without any (plans).
fn observations_note(examples: &[Example]) -> Option<String> {
    let first = examples.iter().find_map(|e| e.observation.as_ref())?;
    let count = examples.iter().filter(|e| e.observation.is_some()).count();
    Some(match first {
        ObservationBytes::Held(_) => format!("{count} held in memory (observations = memory)"),
        ObservationBytes::Stored { store, .. } => format!(
            "{count} served from a memory-mapped Arrow IPC file of {:.1} MiB (observations = mmap)",
            store.file_bytes() as f64 / f64::from(1 << 20)
        ),
    })
}

/// `observations = "mmap"`: moves the examples' held observation bytes, in
/// example order, into one [`ObservationStore`] (a sealed memory file, freed
/// when the last example referring to it is dropped), each freed as it is
/// written, and points the examples at their rows. Epochs then read the observations
/// from the mapped file, zero-copy, instead of the heap: the observation
/// store bench (`cargo bench --workspace --bench observation_store`)
/// measures an epoch over the store as fast as over held bytes and ~7x
/// faster than decoding the Parquet steps table, with the observations out
/// of the process's anonymous memory. Examples without an observation
/// (plans) are left as they are, and no file is written for them.
pub fn store_observations(
    mut examples: Vec<Example>,
) -> Result<Vec<Example>, ObservationStoreError> {
    if !examples
        .iter()
        .any(|e| matches!(e.observation, Some(ObservationBytes::Held(_))))
    {
        return Ok(examples);
    }
    let mut writer = ObservationStoreWriter::create()?;
    let mut rows = Vec::new();
    for (i, example) in examples.iter_mut().enumerate() {
        match example.observation.take() {
            Some(ObservationBytes::Held(bytes)) => {
                rows.push((i, writer.len()));
                writer.push(&bytes)?;
            }
            other => example.observation = other,
        }
    }
    let store = Arc::new(writer.finish()?);
    for (i, index) in rows {
        examples[i].observation = Some(ObservationBytes::Stored {
            store: Arc::clone(&store),
            index,
        });
    }
    Ok(examples)
}

/// The rows SFT trains on, in table order: the first
/// `sft.demos_per_task` rows of each task ([`TaskRow::task_key`]), then of
/// those the first `sft.demos_per_task_type` tasks of each task type.
///
/// ```
/// use embodyflow_core::schemas::TaskRow;
/// use embodyflow_update_policy::{DemosPerTask, SftConfig, kept_tasks};
/// let row = |id: &str, kind: &str| TaskRow {
///     task_id: id.into(), suite: "s".into(), env: "tabletop".into(), split: "train".into(),
///     task_type: Some(kind.into()), seed: 0, instruction: "i".into(), observation: None, gt_actions: None,
/// };
/// let rows = [row("a@train/0", "x"), row("a@train/1", "x"), row("b@train/0", "x"), row("c", "y")];
/// let ids = |sft: &SftConfig| kept_tasks(&rows, sft).iter().map(|r| r.task_id.clone()).collect::<Vec<_>>();
/// assert_eq!(ids(&SftConfig::default()), ["a@train/0", "b@train/0", "c"]);
/// let all = SftConfig { demos_per_task: DemosPerTask::All, ..SftConfig::default() };
/// assert_eq!(ids(&all).len(), 4);
/// let per_type = SftConfig { demos_per_task_type: Some(1), ..SftConfig::default() };
/// assert_eq!(ids(&per_type), ["a@train/0", "c"]);
/// ```
pub fn kept_tasks<'a>(tasks: &'a [TaskRow], sft: &SftConfig) -> Vec<&'a TaskRow> {
    let mut per_task: HashMap<&str, usize> = HashMap::new();
    let mut per_type: HashMap<Option<&str>, usize> = HashMap::new();
    tasks
        .iter()
        .filter(|row| {
            let count = per_task.entry(row.task_key()).or_default();
            *count += 1;
            match sft.demos_per_task {
                DemosPerTask::All => true,
                DemosPerTask::First(limit) => *count <= limit,
            }
        })
        .filter(|row| {
            let count = per_type.entry(row.task_type.as_deref()).or_default();
            *count += 1;
            sft.demos_per_task_type.is_none_or(|limit| *count <= limit)
        })
        .collect()
}

/// SFT examples with lines for the summary.
#[derive(Debug, Clone, Default)]
pub struct SftSet {
    /// The examples.
    pub examples: Vec<Example>,
    /// Summary lines (key, value) on how they were made.
    pub notes: Vec<(String, String)>,
    /// A thinking VLA's frozen frame encoder fitted for these examples (the
    /// output checkpoint keeps it); `None` when the input already held one.
    pub frame_encoder: Option<Arc<FrameEncoder>>,
}

/// A network `update-policy` trains: how its examples are made, checked
/// and scored. [`train`] and [`accumulate`] (shuffle, steps, gradient
/// accumulation, AdamW, schedule, metrics, optimizer state) are one for
/// every kind: the plan policy ([`Gpt`], [`score_responses`]) and the VLA
/// ([`Vla`], [`vla`]).
pub trait Trainable: PolicyNet {
    /// The SFT examples of `tasks` (`seed`: the run's `--seed`).
    fn sft_examples(
        policy: &Checkpoint<Self>,
        tasks: &[TaskRow],
        sft: &SftConfig,
        seed: u64,
    ) -> Result<SftSet, ModelError>;

    /// Fails on an example the policy cannot score, naming it.
    fn check_examples(policy: &Checkpoint<Self>, examples: &[Example]) -> Result<(), Error>;

    /// Per-token log-probs `[B, T]` of a micro-batch's responses under
    /// `logits / temperature`, the mask `[B, T]` (1 on the tokens of the
    /// loss) and the entropies `entropy` asks for, with gradients when
    /// gradients are on. The examples passed [`Trainable::check_examples`].
    fn score(
        policy: &Checkpoint<Self>,
        batch: &[&Example],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<ResponseScores, ModelError>;

    /// A micro-batch's loss when the network computes it itself (a
    /// thinking VLA: its warm-up under `sft`, LAPO under `lapo`), already
    /// scaled to its share of the step (`denominators`); `None`: the
    /// token-level path of [`accumulate`] (the default).
    fn own_loss(
        _policy: &Checkpoint<Self>,
        _batch: &[&Example],
        _config: &Config,
        _denominators: Denominators,
    ) -> Result<Option<OwnLoss>, ModelError> {
        Ok(None)
    }
}

/// A micro-batch's loss and its terms, each its share of the optimizer step
/// ([`Trainable::own_loss`]).
pub struct OwnLoss {
    /// The loss to minimise (with gradients).
    pub loss: Tensor,
    /// The action term (LAPO's action surrogate; the warm-up's action
    /// cross-entropy).
    pub pg_loss: f64,
    /// Mean entropy of the action tokens (a metric).
    pub entropy: f64,
    /// The latent term (LAPO's latent surrogate; the warm-up's cosine loss).
    pub latent: f64,
    /// The `<latent_end>` term.
    pub end: f64,
    /// LAPO's clipped value loss (`None` in the warm-up).
    pub value: Option<f64>,
    /// Fraction of the step's decisions whose action ratio was clipped.
    pub clipfrac: f64,
    /// Fraction held by the dual clip.
    pub clipfrac_lower: f64,
    /// Mean `old − new` action log-prob per decision.
    pub approx_kl: f64,
    /// Action tokens in the loss.
    pub tokens: u64,
}

impl Trainable for Gpt {
    fn sft_examples(
        policy: &Checkpoint,
        tasks: &[TaskRow],
        sft: &SftConfig,
        _seed: u64,
    ) -> Result<SftSet, ModelError> {
        plan_sft_set(policy, tasks, sft)
    }

    fn check_examples(policy: &Checkpoint, examples: &[Example]) -> Result<(), Error> {
        check_plan_examples(policy, examples)
    }

    fn score(
        policy: &Checkpoint,
        batch: &[&Example],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<ResponseScores, ModelError> {
        Ok(score_plan_examples(policy, batch, temperature, entropy))
    }
}

/// A Hugging Face decoder trains as our plan policy does (full
/// fine-tuning), its prompts from its chat template.
impl Trainable for HfNet {
    fn sft_examples(
        policy: &Checkpoint<HfNet>,
        tasks: &[TaskRow],
        sft: &SftConfig,
        _seed: u64,
    ) -> Result<SftSet, ModelError> {
        plan_sft_set(policy, tasks, sft)
    }

    fn check_examples(policy: &Checkpoint<HfNet>, examples: &[Example]) -> Result<(), Error> {
        check_plan_examples(policy, examples)
    }

    fn score(
        policy: &Checkpoint<HfNet>,
        batch: &[&Example],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<ResponseScores, ModelError> {
        Ok(score_plan_examples(policy, batch, temperature, entropy))
    }
}

/// [`Trainable::sft_examples`] of a plan policy.
fn plan_sft_set<M: PlanNet>(
    policy: &Checkpoint<M>,
    tasks: &[TaskRow],
    sft: &SftConfig,
) -> Result<SftSet, ModelError> {
    Ok(SftSet {
        examples: sft_examples(policy, tasks, sft)?,
        notes: Vec::new(),
        frame_encoder: None,
    })
}

/// [`Trainable::check_examples`] of a plan policy: ids in its vocabulary,
/// prompt + response within its context.
fn check_plan_examples<M: PlanNet>(
    policy: &Checkpoint<M>,
    examples: &[Example],
) -> Result<(), Error> {
    check_vocabulary(examples, M::vocab_size(policy.model.config()))?;
    let n_ctx = policy.model.max_len();
    if let Some(long) = examples
        .iter()
        .find(|e| e.prompt.len() + e.response.len() > n_ctx)
    {
        return Err(Error::BadInput(format!(
            "{}: prompt of {} + response of {} tokens exceeds the model's context n_ctx = {n_ctx}",
            long.source,
            long.prompt.len(),
            long.response.len()
        )));
    }
    Ok(())
}

/// [`Trainable::score`] of a plan policy ([`score_responses`]).
fn score_plan_examples<M: PlanNet>(
    policy: &Checkpoint<M>,
    batch: &[&Example],
    temperature: f64,
    entropy: Entropy,
) -> ResponseScores {
    let prompts: Vec<&[i32]> = batch.iter().map(|e| e.prompt.as_slice()).collect();
    let responses: Vec<&[i32]> = batch.iter().map(|e| e.response.as_slice()).collect();
    score_responses(policy, &prompts, &responses, temperature, entropy)
}

/// SFT examples: the expert answers of `tasks` (the first `per_type` of each task type when set).
pub fn sft_examples<M: PlanNet>(
    policy: &Checkpoint<M>,
    tasks: &[TaskRow],
    sft: &SftConfig,
) -> Result<Vec<Example>, ModelError> {
    if sft.context != SftContext::Prompt {
        sft.template.check()?;
    }
    let mut examples = Vec::new();
    for row in kept_tasks(tasks, sft) {
        let env = TaskEnv::from_row(row, 0)?;
        let answer = env.expert_answer().ok_or_else(|| {
            Error::BadInput(format!(
                "task `{}`: its environment has no expert for SFT",
                row.task_id
            ))
        })?;
        let mut response = encode(&policy.tokenizer, &answer)?;
        response.push(policy.special.eos);
        let prompt = env.prompt();
        let mut contexts = Vec::with_capacity(2);
        if sft.context != SftContext::Reference {
            contexts.push(prompt.clone());
        }
        if sft.context != SftContext::Prompt {
            let actions = row.gt_actions.as_deref().ok_or_else(|| {
                Error::BadInput(format!(
                    "task `{}` has no ground-truth plan (gt_actions) for sft.context = reference",
                    row.task_id
                ))
            })?;
            contexts.push(sft.template.render_teacher(
                &prompt,
                &row.instruction,
                &reference_plan(actions),
            )?);
        }
        for context in contexts {
            let prompt = policy.prompt_ids(&context)?;
            examples.push(Example {
                source: format!("task `{}`", row.task_id),
                prompt,
                response: response.clone(),
                old_logprobs: Vec::new(),
                advantages: Vec::new(),
                temperature: 1.0,
                observation: None,
                thought: None,
                response_mask: None,
            });
        }
    }
    Ok(examples)
}

/// PPO examples: steps joined with their advantages and their trajectory's
/// temperature; with `thoughts` (LAPO) each also carries the step's latent
/// chain, stop, old value and its GAE return ([`ExampleThought`]), a null
/// one being bad input naming the table and field. The steps of a
/// trajectory ended by infrastructure (`trajectories.infra_fault`) are no
/// outcome of the policy: skipped, with any advantages row they have.
pub fn ppo_examples(
    trajectories: &[TrajectoryRow],
    steps: Vec<StepRow>,
    advantages: Vec<AdvantageRow>,
    thoughts: bool,
) -> Result<Vec<Example>, Error> {
    if let Some(t) = trajectories.iter().find(|t| {
        t.policy
            .starts_with(embodyflow_core::IMPORTED_POLICY_PREFIX)
    }) {
        return Err(Error::BadInput(format!(
            "trajectory `{}` was imported (policy `{}`): a dump holds no behaviour log-probs, so \
             PPO cannot weigh it; rescore and recompute advantages on imported rollouts, update on \
             rollouts collected here",
            t.trajectory_id, t.policy
        )));
    }
    let temperature: HashMap<&str, f32> = trajectories
        .iter()
        .map(|t| (t.trajectory_id.as_str(), t.temperature))
        .collect();
    let faulted: std::collections::HashSet<&str> = trajectories
        .iter()
        .filter(|t| t.faulted())
        .map(|t| t.trajectory_id.as_str())
        .collect();
    let mut by_key: HashMap<(String, i32), AdvantageRow> = advantages
        .into_iter()
        .map(|row| ((row.trajectory_id.clone(), row.step_index), row))
        .collect();
    let mut examples = Vec::with_capacity(steps.len());
    for step in steps {
        let key = (step.trajectory_id.clone(), step.step_index);
        // Steps without advantages were dropped by dynamic sampling.
        let Some(advantage) = by_key.remove(&key) else {
            continue;
        };
        if faulted.contains(step.trajectory_id.as_str()) {
            continue;
        }
        let Some(&temperature) = temperature.get(step.trajectory_id.as_str()) else {
            return Err(Error::BadInput(format!(
                "step {} of trajectory `{}` has no row in the trajectories table",
                step.step_index, step.trajectory_id
            )));
        };
        let n = step.response_ids.len();
        if step.old_logprobs.len() != n || advantage.advantages.len() != n {
            return Err(Error::BadInput(format!(
                "trajectory `{}` step {}: {n} response ids, {} old log-probs, {} advantages; they must agree",
                step.trajectory_id,
                step.step_index,
                step.old_logprobs.len(),
                advantage.advantages.len()
            )));
        }
        if advantage.advantages.iter().any(|a| !a.is_finite()) {
            return Err(Error::BadInput(format!(
                "trajectory `{}` step {}: advantages hold NaN or infinity",
                step.trajectory_id, step.step_index
            )));
        }
        if let Some(mask) = &step.response_mask
            && mask.len() != n
        {
            return Err(Error::BadInput(format!(
                "trajectory `{}` step {}: response_mask has {} entries, expected {n} (one per response id)",
                step.trajectory_id,
                step.step_index,
                mask.len()
            )));
        }
        let thought = if thoughts {
            Some(example_thought(&step, &advantage)?)
        } else {
            None
        };
        examples.push(Example {
            source: format!(
                "trajectory `{}` step {}",
                step.trajectory_id, step.step_index
            ),
            prompt: step.prompt_ids,
            response: step.response_ids,
            old_logprobs: step.old_logprobs,
            advantages: advantage.advantages,
            temperature,
            observation: step.observation.map(ObservationBytes::Held),
            thought,
            response_mask: step.response_mask.filter(|mask| mask.contains(&false)),
        });
    }
    if let Some(((trajectory, step), _)) = by_key.into_iter().next() {
        return Err(Error::BadInput(format!(
            "advantages of trajectory `{trajectory}` step {step} have no row in the steps table"
        )));
    }
    Ok(examples)
}

/// A LAPO example's [`ExampleThought`] from its `steps` row (the latents,
/// their width, the chosen length, the stop's log-prob, the old value) and
/// its `advantages` row (the return of its first token: a decision's
/// return is broadcast to its tokens); a null or unusable field is bad
/// input naming the table, field and step.
fn example_thought(step: &StepRow, advantage: &AdvantageRow) -> Result<ExampleThought, Error> {
    let at = format!(
        "trajectory `{}` step {}",
        step.trajectory_id, step.step_index
    );
    let null = |table: &str, field: &str, hint: &str| {
        Error::BadInput(format!(
            "table `{table}` field `{field}` is null at {at}: objective = lapo {hint}"
        ))
    };
    let rollouts = "needs a thinking VLA's rollouts (init-policy --set vla.latent_length=8)";
    let latents = step
        .latents
        .clone()
        .ok_or_else(|| null("steps", "latents", rollouts))?;
    let latent_dim = step
        .latent_dim
        .ok_or_else(|| null("steps", "latent_dim", rollouts))?;
    if latent_dim < 1 || latents.is_empty() || latents.len() % latent_dim as usize != 0 {
        return Err(Error::BadInput(format!(
            "table `steps` field `latents` at {at}: {} values are not whole latents of latent_dim {latent_dim}",
            latents.len()
        )));
    }
    if let Some(i) = latents.iter().position(|v| !v.is_finite()) {
        return Err(Error::BadInput(format!(
            "table `steps` field `latents` at {at}: value {} at index {i} is not finite",
            latents[i]
        )));
    }
    let latent_len = step
        .chosen_latent_len
        .ok_or_else(|| null("steps", "chosen_latent_len", rollouts))?;
    let old_stop_logprob = step
        .old_latent_end_logprob
        .ok_or_else(|| null("steps", "old_latent_end_logprob", rollouts))?;
    let old_value = step
        .old_value
        .ok_or_else(|| null("steps", "old_value", rollouts))?;
    let target_return = advantage
        .returns
        .as_ref()
        .and_then(|r| r.first().copied())
        .ok_or_else(|| {
            null(
                "advantages",
                "returns",
                "needs GAE's returns (compute-advantages --set estimator=gae --set gae.level=decision)",
            )
        })?;
    for (table, field, value) in [
        ("steps", "old_latent_end_logprob", old_stop_logprob),
        ("steps", "old_value", old_value),
        ("advantages", "returns", target_return),
    ] {
        if !value.is_finite() {
            return Err(Error::BadInput(format!(
                "table `{table}` field `{field}` at {at}: {value} is not finite"
            )));
        }
    }
    if latent_len < 1 {
        return Err(Error::BadInput(format!(
            "table `steps` field `chosen_latent_len` at {at}: {latent_len} is not a latent length"
        )));
    }
    Ok(ExampleThought {
        latents,
        latent_dim: latent_dim as usize,
        latent_len: latent_len as usize,
        warmup_lengths: Vec::new(),
        old_stop_logprob,
        old_value,
        target_return,
    })
}

/// `rows` right-padded with 0 to `width` columns.
fn pad_rows(rows: &[&[f32]], width: usize, device: tch::Device) -> tch::Tensor {
    let mut flat = Vec::with_capacity(rows.len() * width);
    for row in rows {
        flat.extend_from_slice(row);
        flat.extend(std::iter::repeat_n(0.0, width - row.len()));
    }
    tch::Tensor::from_slice(&flat)
        .view([rows.len() as i64, width as i64])
        .to(device)
}

/// What a training run did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// One row per optimizer step.
    pub metrics: Vec<MetricRow>,
    /// Response tokens processed (forward and backward), over all epochs.
    pub tokens: u64,
    /// Examples processed (sequences; a VLA's decisions), over all epochs.
    pub sequences: u64,
    /// Wall time of the optimisation.
    pub seconds: f64,
}

/// Optimises `policy` on `examples`, continuing from the optimizer `state`
/// (pure apart from the policy's weights; the final state is left in
/// `policy.optimizer` for the checkpoint). The examples are checked first
/// ([`Trainable::check_examples`]).
pub fn train<M: Trainable>(
    policy: &mut Checkpoint<M>,
    reference: Option<&Checkpoint<M>>,
    examples: &[Example],
    config: &Config,
    seed: u64,
    state: OptimizerState,
) -> Result<TrainReport, ModelError> {
    if config.mini_batch == 0 || config.micro_batch == 0 || config.grad_accumulation == 0 {
        return Err(Error::Usage(
            "mini_batch, micro_batch and grad_accumulation must be at least 1".into(),
        )
        .into());
    }
    M::check_examples(policy, examples)?;
    let optim = &config.optim;
    let mut optimizer = AdamW::new(optim.adamw(), state).with_schedule(optim.schedule());
    if config.objective == Objective::Lapo {
        optimizer = optimizer.with_lr_scale(VALUE_HEAD, config.lapo.value_lr_factor());
    }
    let started = Instant::now();
    let mut metrics = Vec::new();
    let mut tokens = 0u64;
    let mut sequences = 0u64;
    let per_step = config.mini_batch.saturating_mul(config.grad_accumulation);
    let steps_per_epoch = examples.len().div_ceil(per_step);
    let bar = progress::bar((steps_per_epoch * config.epochs) as u64, "updating");
    let all_examples = examples;
    for epoch in 0..config.epochs {
        let epoch_seed = seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let redrawn = vla::thinking::redraw_warmup_lengths(all_examples, epoch_seed);
        let examples = redrawn.as_deref().unwrap_or(all_examples);
        let mut order: Vec<usize> = (0..examples.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(epoch_seed));
        // One optimizer step per `grad_accumulation` mini-batches.
        for step in order.chunks(per_step) {
            let denominators = Denominators {
                tokens: step
                    .iter()
                    .map(|&i| examples[i].loss_tokens())
                    .sum::<usize>()
                    .max(1) as f64,
                sequences: step.len() as f64,
            };
            optimizer.zero_grad(&policy.vars);
            let micros = micro_batches(examples, step, config.micro_batch);
            let sums = accumulate(policy, reference, examples, &micros, denominators, config)?;
            tokens += sums.tokens;
            sequences += step.len() as u64;
            let grad_norm = optimizer.clip_grad_norm(&policy.vars, optim.grad_clip);
            let lr = optimizer.step(&policy.vars);
            policy.manifest.updates += 1;
            metrics.push(MetricRow {
                iteration: config.iteration,
                update: metrics.len() as i32,
                loss: sums.loss as f32,
                pg_loss: sums.pg_loss as f32,
                // PPO-only figures are null on SFT rows.
                clipfrac: (config.objective != Objective::Sft)
                    .then_some((sums.clipped / denominators.tokens) as f32),
                clipfrac_lower: (config.objective != Objective::Sft)
                    .then_some((sums.clipped_lower / denominators.tokens) as f32),
                approx_kl: (config.objective != Objective::Sft)
                    .then_some((sums.approx_kl / denominators.tokens) as f32),
                entropy: sums.entropy as f32,
                kl_loss: (config.ppo.kl_coef > 0.0).then_some(sums.kl_loss as f32),
                latent_loss: sums.latent_terms.map(|t| t.latent as f32),
                end_loss: sums.latent_terms.map(|t| t.end as f32),
                value_loss: sums.latent_terms.and_then(|t| t.value.map(|v| v as f32)),
                grad_norm: grad_norm as f32,
                lr: lr as f32,
            });
            if !sums.loss.is_finite() {
                return Err(ModelError::Torch(format!(
                    "the loss became {} at update {} of epoch {epoch}; lower optim.lr",
                    sums.loss,
                    metrics.len() - 1
                )));
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    policy.optimizer = Some(optimizer.state);
    Ok(TrainReport {
        metrics,
        tokens,
        sequences,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The micro-batches of one optimizer step (`step`: indices into
/// `examples`): its examples ordered by prompt (length, then ids, so a
/// group's samples sit side by side and the scorer encodes their shared
/// prompt once) and by response length (less padding), then cut into
/// `micro_batch` rows. Every micro-batch's loss is normalised by the whole
/// step's [`Denominators`] and the gradients add up, so this order changes
/// the step only by float rounding; it is a function of the step's examples
/// (ties keep the shuffled order), so the same seed gives the same run.
pub fn micro_batches(examples: &[Example], step: &[usize], micro_batch: usize) -> Vec<Vec<usize>> {
    let mut rows = step.to_vec();
    rows.sort_by(|&a, &b| {
        let (x, y) = (&examples[a], &examples[b]);
        x.prompt
            .len()
            .cmp(&y.prompt.len())
            .then_with(|| x.prompt.cmp(&y.prompt))
            .then(x.response.len().cmp(&y.response.len()))
    });
    rows.chunks(micro_batch.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// What one optimizer step's micro-batches add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepSums {
    /// The loss (policy loss, entropy bonus and KL penalty).
    pub loss: f64,
    /// The policy-gradient loss (PPO).
    pub pg_loss: f64,
    /// The aggregated entropy (a metric unless `ppo.entropy_coef > 0`).
    pub entropy: f64,
    /// The aggregated KL penalty (with `ppo.kl_coef > 0`).
    pub kl_loss: f64,
    /// Tokens with `l2 > l1` (PPO).
    pub clipped: f64,
    /// Tokens under the dual clip (PPO).
    pub clipped_lower: f64,
    /// Sum of `old_logp - logp` (PPO).
    pub approx_kl: f64,
    /// Response tokens.
    pub tokens: u64,
    /// A thinking VLA's latent, stop and value terms ([`OwnLoss`]).
    pub latent_terms: Option<LatentTerms>,
}

/// A thinking VLA's step terms, summed over its micro-batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatentTerms {
    /// The latent term.
    pub latent: f64,
    /// The `<latent_end>` term.
    pub end: f64,
    /// The value loss (LAPO).
    pub value: Option<f64>,
}

/// Runs forward and backward over `micros` (rows of `examples`), every loss
/// aggregated with the step's `denominators`, accumulating the gradients in
/// the policy's variables. The entropy is computed without gradients (a
/// metric) unless the PPO loss has an entropy bonus.
pub fn accumulate<M: Trainable>(
    policy: &Checkpoint<M>,
    reference: Option<&Checkpoint<M>>,
    examples: &[Example],
    micros: &[Vec<usize>],
    denominators: Denominators,
    config: &Config,
) -> Result<StepSums, ModelError> {
    let device = policy.vars.device();
    let bonus = config.objective == Objective::Ppo && config.ppo.entropy_coef > 0.0;
    let entropy_mode = if bonus {
        Entropy::Loss
    } else {
        Entropy::Metric
    };
    let mut sums = StepSums::default();
    for micro in micros {
        let batch: Vec<&Example> = micro.iter().map(|&i| &examples[i]).collect();
        if let Some(own) = M::own_loss(policy, &batch, config, denominators)? {
            if let Some(e) = batch.iter().find(|e| e.response_mask.is_some()) {
                return Err(Error::BadInput(format!(
                    "{}: its response_mask has holes, which this policy's own loss (a VLA's decisions) does not take",
                    e.source
                ))
                .into());
            }
            own.loss.backward();
            sums.loss += own.loss.double_value(&[]);
            sums.pg_loss += own.pg_loss;
            sums.entropy += own.entropy;
            // Decision fractions, kept as counts over the step's tokens
            // (the metrics divide by them).
            sums.clipped += own.clipfrac * denominators.tokens;
            sums.clipped_lower += own.clipfrac_lower * denominators.tokens;
            sums.approx_kl += own.approx_kl * denominators.tokens;
            sums.tokens += own.tokens;
            let terms = sums.latent_terms.get_or_insert_with(LatentTerms::default);
            terms.latent += own.latent;
            terms.end += own.end;
            if let Some(value) = own.value {
                *terms.value.get_or_insert(0.0) += value;
            }
            continue;
        }
        let temperature = batch[0].temperature as f64;
        let mut scores = M::score(policy, &batch, temperature, entropy_mode)?;
        let width = scores.logprobs.size()[1] as usize;
        if batch.iter().any(|e| e.response_mask.is_some()) {
            // Holes of the response masks leave every term below.
            let rows: Vec<Vec<f32>> = batch
                .iter()
                .map(|e| match &e.response_mask {
                    Some(mask) => mask.iter().map(|&m| f32::from(u8::from(m))).collect(),
                    None => vec![1.0; e.response.len()],
                })
                .collect();
            let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            scores.mask = &scores.mask * pad_rows(&rows, width, device).to_kind(scores.mask.kind());
        }
        let entropy = aggregate(
            scores.entropy.as_ref().expect("entropy is asked for"),
            &scores.mask,
            config.ppo.loss_agg,
            denominators,
        );
        let mut loss = match config.objective {
            Objective::Lapo => {
                return Err(Error::Usage(
                    "objective = lapo trains a VLA with a latent chain of thought \
                     (init-policy --set kind=vla --set vla.latent_length=8)"
                        .into(),
                )
                .into());
            }
            Objective::Sft => aggregate(
                &(-&scores.logprobs),
                &scores.mask,
                config.ppo.loss_agg,
                denominators,
            ),
            Objective::Ppo => {
                let old: Vec<_> = batch.iter().map(|e| e.hole_free(&e.old_logprobs)).collect();
                let adv: Vec<_> = batch.iter().map(|e| e.hole_free(&e.advantages)).collect();
                let old: Vec<&[f32]> = old.iter().map(|v| v.as_ref()).collect();
                let adv: Vec<&[f32]> = adv.iter().map(|v| v.as_ref()).collect();
                let out = policy_loss(
                    &scores.logprobs,
                    &pad_rows(&old, width, device),
                    &pad_rows(&adv, width, device),
                    &scores.mask,
                    &config.ppo,
                    denominators,
                );
                sums.clipped += out.clipped_tokens;
                sums.clipped_lower += out.clipped_lower_tokens;
                sums.approx_kl += out.kl_sum;
                sums.pg_loss += out.loss.double_value(&[]);
                if bonus {
                    out.loss - &entropy * config.ppo.entropy_coef
                } else {
                    out.loss
                }
            }
        };
        if let (Some(reference), true) = (reference, config.ppo.kl_coef > 0.0) {
            let ref_logp = tch::no_grad(|| {
                M::score(reference, &batch, temperature, Entropy::Skip).map(|s| s.logprobs)
            })?;
            let kl = aggregate(
                &kl_penalty(&scores.logprobs, &ref_logp, config.ppo.kl_estimator),
                &scores.mask,
                config.ppo.loss_agg,
                denominators,
            );
            sums.kl_loss += kl.double_value(&[]);
            loss += kl * config.ppo.kl_coef;
        }
        loss.backward();
        sums.loss += loss.double_value(&[]);
        sums.entropy += entropy.double_value(&[]);
        sums.tokens += scores.mask.sum(Kind::Double).double_value(&[]) as u64;
    }
    Ok(sums)
}

/// The summary's line on the schedule: its name, the optimizer steps this
/// call took (counted over the run) and the rates of its first and last step.
fn schedule_note(optim: &OptimConfig, first_step: u64, metrics: &[MetricRow]) -> String {
    let end = first_step + metrics.len() as u64;
    let first = metrics.first().map_or(f32::NAN, |m| m.lr);
    let last = metrics.last().map_or(f32::NAN, |m| m.lr);
    let mut note = format!(
        "{}, steps {} to {end} of the run, lr {first:.3e} -> {last:.3e}",
        optim.schedule.name(),
        first_step + 1
    );
    if let (ScheduleKind::Cosine, Some(total)) = (optim.schedule, optim.total_steps)
        && end > total
    {
        note.push_str(&format!(
            " (past optim.total_steps = {total}: held at the floor)"
        ));
    }
    note
}

/// Fails on a token id outside the policy's vocabulary (an embedding lookup
/// would abort the process), naming the table, column, row and vocabulary.
pub fn check_vocabulary(examples: &[Example], vocab_size: i64) -> Result<(), Error> {
    for example in examples {
        for (column, ids) in [
            ("prompt_ids", &example.prompt),
            ("response_ids", &example.response),
        ] {
            if let Some(&id) = ids
                .iter()
                .find(|&&id| id < 0 || i64::from(id) >= vocab_size)
            {
                return Err(Error::BadInput(format!(
                    "table `steps` column `{column}`, {}: token id {id} is outside the policy's vocabulary of {vocab_size} tokens (rollouts of another tokenizer?)",
                    example.source
                )));
            }
        }
    }
    Ok(())
}

/// Runs the stage.
pub fn run(args: Args) -> Result<(), ModelError> {
    let stage =
        Stage::<Config>::start(&spec::UPDATE_POLICY, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_output_names(&[
        TableName::Metrics.as_str(),
        metrics_csv::METRICS_CSV,
        "policy",
    ])?;
    match policy_kind(&args.policy.policy)? {
        PolicyKind::Plan => update::<Gpt>(&stage, &args),
        PolicyKind::Vla => update::<Vla>(&stage, &args),
        PolicyKind::Hf => update::<HfNet>(&stage, &args),
    }
}

/// The stage on a policy of network `M`: examples, training, outputs.
fn update<M: Trainable>(stage: &Stage<Config>, args: &Args) -> Result<(), ModelError> {
    let policy_out = args.stage.out.join("policy");
    let config = &stage.config;
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    tch::manual_seed(args.stage.seed as i64);
    let mut policy = Checkpoint::<M>::load_kind(&args.policy.policy, device)?;
    // Config::validate: ppo.kl_coef > 0 comes with a kl_reference.
    let reference = match (&config.kl_reference, config.ppo.kl_coef > 0.0) {
        (Some(path), true) => Some(Checkpoint::<M>::load_kind(path, device)?),
        _ => None,
    };
    let mut notes = Vec::new();
    let examples = match config.objective {
        Objective::Sft => {
            let tasks: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
            let set = M::sft_examples(&policy, &tasks, &config.sft, args.stage.seed)?;
            notes = set.notes;
            if let Some(encoder) = set.frame_encoder {
                policy.frame_encoder = Some(encoder);
            }
            set.examples
        }
        Objective::Ppo | Objective::Lapo => {
            let trajectories: Vec<TrajectoryRow> =
                stage.input(TableName::Trajectories)?.read_rows()?;
            let steps: Vec<StepRow> = stage.input(TableName::Steps)?.read_rows()?;
            let advantages: Vec<AdvantageRow> = stage.input(TableName::Advantages)?.read_rows()?;
            let faulted: Vec<&TrajectoryRow> =
                trajectories.iter().filter(|t| t.faulted()).collect();
            notes.push((
                "skipped: ended by an infrastructure fault".to_string(),
                format!(
                    "{} trajectories ({} steps)",
                    faulted.len(),
                    faulted.iter().map(|t| i64::from(t.num_steps)).sum::<i64>()
                ),
            ));
            ppo_examples(
                &trajectories,
                steps,
                advantages,
                config.objective == Objective::Lapo,
            )?
        }
    };
    if examples.is_empty() {
        return Err(Error::BadInput("no training examples in the inputs".into()).into());
    }
    // Log-probs are recomputed at the rollouts' temperature, one per micro-batch.
    if let Some(other) = examples
        .iter()
        .find(|e| e.temperature != examples[0].temperature)
    {
        return Err(Error::BadInput(format!(
            "{} was sampled at temperature {}, {} at {}: update on rollouts of one temperature",
            examples[0].source, examples[0].temperature, other.source, other.temperature
        ))
        .into());
    }
    let examples = match config.observations {
        ObservationsMode::Memory => examples,
        ObservationsMode::Mmap => store_observations(examples).map_err(Error::from)?,
    };
    let objective = config.objective.name();
    let saved = OptimizerState::load(&args.policy.policy, &policy.vars)?;
    let (state, optimizer_note) = match saved {
        _ if !config.optim.resume => (
            OptimizerState::fresh(objective),
            "fresh AdamW (optim.resume = false)".to_string(),
        ),
        Some(state) if state.meta.objective == objective => {
            let note = format!("AdamW resumed at step {}", state.meta.steps);
            (state, note)
        }
        Some(state) => (
            OptimizerState::fresh(objective),
            format!(
                "fresh AdamW (the input's state was accumulated on another objective, {})",
                state.meta.objective
            ),
        ),
        None => (
            OptimizerState::fresh(objective),
            "fresh AdamW (the input checkpoint has no optimizer state)".to_string(),
        ),
    };
    let parent = policy.manifest.id.clone();
    let first_step = state.meta.steps;
    let report = train(
        &mut policy,
        reference.as_ref(),
        &examples,
        config,
        args.stage.seed,
        state,
    )?;
    let mut writer = stage.writer(TableName::Metrics)?;
    writer.write_rows(&report.metrics)?;
    stage.finish(writer)?;
    metrics_csv::stage_metrics_csv(stage, &report.metrics)?;
    let (staged, manifest) = policy.save_staged(&args.stage.out, "policy", "update-policy")?;
    stage.stage_output(&staged, "policy", Digest::DirAll)?;
    let first = report.metrics.first().map_or(f32::NAN, |m| m.loss);
    let last = report.metrics.last().map_or(f32::NAN, |m| m.loss);
    let mut summary = Summary::new("update-policy");
    summary
        .add(
            "objective",
            format!("{:?}", config.objective).to_lowercase(),
        )
        .add(
            "policy",
            format!("{parent} -> {} ({})", manifest.id, policy_out.display()),
        )
        .add("examples", examples.len());
    if let Some(note) = observations_note(&examples) {
        summary.add("observations", note);
    }
    for (key, value) in notes {
        summary.add(key, value);
    }
    summary
        .add("optimizer steps", report.metrics.len())
        .add("optimizer", optimizer_note)
        .add(
            "lr schedule",
            schedule_note(&config.optim, first_step, &report.metrics),
        )
        .add("loss first -> last", format!("{first:.4} -> {last:.4}"))
        .add(
            "training throughput",
            format!(
                "{:.0} response tokens/s ({} tokens in {:.1} s)",
                report.tokens as f64 / report.seconds.max(1e-9),
                report.tokens,
                report.seconds
            ),
        );
    if M::KIND == PolicyKind::Vla {
        summary.add(
            "decision throughput",
            format!(
                "{:.1} decisions/s ({} decisions, forward and backward)",
                report.sequences as f64 / report.seconds.max(1e-9),
                report.sequences
            ),
        );
    }
    if let Some(note) = latent_lengths_note(&examples) {
        summary.add("chosen latent lengths", note);
    }
    if let (Objective::Sft, Some(first), Some(last)) = (
        config.objective,
        report.metrics.first().filter(|m| m.latent_loss.is_some()),
        report.metrics.last(),
    ) {
        let terms = |m: &MetricRow| {
            format!(
                "latent {:.4}, end {:.4}, action {:.4}",
                m.latent_loss.unwrap_or(f32::NAN),
                m.end_loss.unwrap_or(f32::NAN),
                m.pg_loss
            )
        };
        summary.add(
            "warm-up terms first -> last",
            format!("{} -> {}", terms(first), terms(last)),
        );
    }
    if config.objective == Objective::Lapo {
        let (values, returns): (Vec<f32>, Vec<f32>) = examples
            .iter()
            .filter_map(|e| e.thought.as_ref())
            .map(|t| (t.old_value, t.target_return))
            .unzip();
        summary.add(
            "value explained variance (rollout values vs returns)",
            lapo::explained_variance(&values, &returns).map_or_else(
                || "undefined (returns without variance)".to_string(),
                |ev| format!("{ev:.4}"),
            ),
        );
    }
    if config.objective != Objective::Sft {
        let mean = |f: fn(&MetricRow) -> f32| {
            report.metrics.iter().map(|m| f(m) as f64).sum::<f64>() / report.metrics.len() as f64
        };
        summary
            .add(
                "mean clipfrac",
                format!("{:.4}", mean(|m| m.clipfrac.unwrap_or(f32::NAN))),
            )
            .add(
                "mean approx_kl",
                format!("{:.5}", mean(|m| m.approx_kl.unwrap_or(f32::NAN))),
            )
            .add("mean entropy", format!("{:.4}", mean(|m| m.entropy)));
        if config.objective == Objective::Lapo {
            summary.add(
                "mean LAPO terms",
                format!(
                    "action {:.4}, latent {:.4}, end {:.4}, value {:.4}",
                    mean(|m| m.pg_loss),
                    mean(|m| m.latent_loss.unwrap_or(f32::NAN)),
                    mean(|m| m.end_loss.unwrap_or(f32::NAN)),
                    mean(|m| m.value_loss.unwrap_or(f32::NAN))
                ),
            );
        }
    }
    stage.commit(&summary)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn token_ids_outside_the_vocabulary_are_named() {
        let example = |response: Vec<i32>| Example {
            source: "trajectory `t0` step 0".into(),
            prompt: vec![1, 2],
            response,
            old_logprobs: vec![],
            advantages: vec![],
            temperature: 1.0,
            observation: None,
            thought: None,
            response_mask: None,
        };
        assert!(check_vocabulary(&[example(vec![0, 299])], 300).is_ok());
        for bad in [300, -1, i32::MAX] {
            let err = check_vocabulary(&[example(vec![5, bad])], 300)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("`response_ids`")
                    && err.contains("trajectory `t0` step 0")
                    && err.contains(&format!("token id {bad}"))
                    && err.contains("vocabulary of 300"),
                "{err}"
            );
        }
    }

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        assert_eq!(
            refused_key::<Config>(&[
                "objective=sft",
                "optim.grad_clip=0",
                "ppo.kl_coef=0.1",
                "kl_reference=runs/init",
                "sft.context=both",
                "sft.demos_per_task_type=1",
                "sft.expert_noise=0",
                "observations=memory",
            ]),
            None
        );
        assert_eq!(
            refused_key::<Config>(&[
                "grad_accumulation=4",
                "optim.schedule=linear_warmup",
                "optim.warmup_steps=5",
            ]),
            None
        );
        assert_eq!(
            refused_key::<Config>(&[
                "optim.schedule=cosine",
                "optim.warmup_steps=10",
                "optim.total_steps=200",
                "optim.min_lr_ratio=0.1",
            ]),
            None
        );
        for (sets, key) in [
            (&["objective=dpo"][..], "objective"),
            (&["observations=disk"], "observations"),
            (&["ppo.loss_agg=mean"], "ppo.loss_agg"),
            (&["ppo.kl_estimator=k4"], "ppo.kl_estimator"),
            (&["sft.context=none"], "sft.context"),
            (&["sft.warmup.end=-0.1"], "sft.warmup.end"),
            (&["lapo.latent_sigma=0"], "lapo.latent_sigma"),
            (&["lapo.w_latent=-1"], "lapo.w_latent"),
            (
                &["objective=lapo", "ppo.kl_coef=0.1", "kl_reference=runs/x"],
                "ppo.kl_coef",
            ),
            (
                &["objective=lapo", "ppo.entropy_coef=0.01"],
                "ppo.entropy_coef",
            ),
            (&["iteration=-1"], "iteration"),
            (&["epochs=0"], "epochs"),
            (&["mini_batch=0"], "mini_batch"),
            (&["micro_batch=0"], "micro_batch"),
            (&["grad_accumulation=0"], "grad_accumulation"),
            (&["optim.schedule=linear"], "optim.schedule"),
            (&["optim.warmup_steps=10"], "optim.warmup_steps"),
            (&["optim.total_steps=100"], "optim.total_steps"),
            (&["optim.min_lr_ratio=0.1"], "optim.min_lr_ratio"),
            (&["optim.schedule=linear_warmup"], "optim.warmup_steps"),
            (
                &[
                    "optim.schedule=linear_warmup",
                    "optim.warmup_steps=5",
                    "optim.total_steps=100",
                ],
                "optim.total_steps",
            ),
            (&["optim.schedule=cosine"], "optim.total_steps"),
            (
                &[
                    "optim.schedule=cosine",
                    "optim.warmup_steps=10",
                    "optim.total_steps=10",
                ],
                "optim.total_steps",
            ),
            (
                &[
                    "optim.schedule=cosine",
                    "optim.total_steps=100",
                    "optim.min_lr_ratio=1.5",
                ],
                "optim.min_lr_ratio",
            ),
            (&["optim.lr=0"], "optim.lr"),
            (&["optim.weight_decay=-0.1"], "optim.weight_decay"),
            (&["optim.beta1=1"], "optim.beta1"),
            (&["optim.beta2=-0.5"], "optim.beta2"),
            (&["optim.grad_clip=-1"], "optim.grad_clip"),
            (&["ppo.clip_low=1"], "ppo.clip_low"),
            (&["ppo.clip_high=-0.28"], "ppo.clip_high"),
            (&["ppo.dual_clip=1"], "ppo.dual_clip"),
            (&["ppo.entropy_coef=-0.01"], "ppo.entropy_coef"),
            (&["ppo.kl_coef=-0.1"], "ppo.kl_coef"),
            (&["ppo.kl_coef=0.1"], "kl_reference"),
            (&["sft.demos_per_task_type=0"], "sft.demos_per_task_type"),
            (&["sft.demos_per_task=0"], "sft.demos_per_task"),
            (&["sft.demos_per_task=most"], "sft.demos_per_task"),
            (&["sft.expert_noise=1.5"], "sft.expert_noise"),
            (&["sft.expert_noise=-0.1"], "sft.expert_noise"),
            (&["sft.expert_noise=nan"], "sft.expert_noise"),
            (
                &["sft.context=reference", "sft.template.teacher={prompt}"],
                "sft.template",
            ),
        ] {
            assert_eq!(
                refused_key::<Config>(sets).as_deref(),
                Some(key),
                "{sets:?}"
            );
        }
    }

    #[test]
    fn one_demo_per_task_keeps_every_tasks_first_initial_state() {
        use embodyflow_tabletop::{Split, Suite, generate, initial_state, task_row};
        use std::collections::BTreeSet;
        // LIBERO's protocol: the goal suite's seven tasks at three train
        // initial states each, state-major.
        let rows: Vec<TaskRow> = (0..3)
            .flat_map(|state| {
                (0..7).map(move |i| {
                    task_row(&initial_state(Suite::Goal, 1, i, Split::Train, state).unwrap())
                })
            })
            .collect();
        let sft = |demos_per_task, demos_per_task_type| SftConfig {
            demos_per_task,
            demos_per_task_type,
            ..SftConfig::default()
        };
        let kept = kept_tasks(&rows, &SftConfig::default());
        assert_eq!(kept.len(), 7);
        assert!(
            kept.iter().all(|row| row.task_id.ends_with("@train/0000")),
            "{kept:?}"
        );
        let words: BTreeSet<&str> = kept.iter().map(|row| row.instruction.as_str()).collect();
        assert_eq!(words.len(), 7, "every task demonstrated once: {words:?}");
        assert_eq!(
            kept_tasks(&rows, &sft(DemosPerTask::First(2), None)).len(),
            14
        );
        assert_eq!(kept_tasks(&rows, &sft(DemosPerTask::All, None)).len(), 21);
        // One per task type leaves tasks out (the goal suite's seven tasks are five types).
        assert_eq!(
            kept_tasks(&rows, &sft(DemosPerTask::First(1), Some(1))).len(),
            5
        );
        // A table of one row per task (the layouts protocol) keeps every row by default.
        let layouts: Vec<TaskRow> = (0..9)
            .map(|i| task_row(&generate(Suite::Spatial, Split::Train, 1, i)))
            .collect();
        assert_eq!(kept_tasks(&layouts, &SftConfig::default()).len(), 9);
        // The key reads `all` and counts; the default is one.
        let read = |json: &str| {
            serde_json::from_str::<SftConfig>(json)
                .unwrap()
                .demos_per_task
        };
        assert_eq!(read(r#"{"demos_per_task": "all"}"#), DemosPerTask::All);
        assert_eq!(read(r#"{"demos_per_task": 3}"#), DemosPerTask::First(3));
        assert_eq!(read(r#"{"demos_per_task": "3"}"#), DemosPerTask::First(3));
        assert_eq!(Config::default().sft.demos_per_task, DemosPerTask::First(1));
    }

    /// The shared tiny policy with a context of 32 tokens.
    fn tiny_policy() -> Checkpoint {
        embodyflow_models::testing::tiny_policy(32)
    }

    fn response_logprob(policy: &Checkpoint, example: &Example) -> f64 {
        tch::no_grad(|| {
            score_responses(
                policy,
                &[&example.prompt],
                &[&example.response],
                1.0,
                Entropy::Skip,
            )
            .logprobs
            .sum(Kind::Double)
            .double_value(&[])
        })
    }

    /// PPO moves a response's probability in the direction of its advantage.
    #[test]
    fn the_update_follows_the_sign_of_the_advantage() {
        for sign in [1.0f32, -1.0] {
            let mut policy = tiny_policy();
            let prompt = vec![5, 6, 7, policy.special.plan];
            let response = vec![9, 12, 15, policy.special.eos];
            let old = tch::no_grad(|| {
                score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip).logprobs
            });
            let example = Example {
                source: "test".into(),
                old_logprobs: Vec::<f32>::try_from(old.view([-1])).unwrap(),
                advantages: vec![sign; response.len()],
                prompt,
                response,
                temperature: 1.0,
                observation: None,
                thought: None,
                response_mask: None,
            };
            let before = response_logprob(&policy, &example);
            let config = Config {
                epochs: 4,
                mini_batch: 1,
                micro_batch: 1,
                optim: OptimConfig {
                    lr: 1e-2,
                    ..Default::default()
                },
                ..Default::default()
            };
            let report = train(
                &mut policy,
                None,
                std::slice::from_ref(&example),
                &config,
                0,
                OptimizerState::fresh("ppo"),
            )
            .unwrap();
            assert_eq!(report.metrics.len(), 4);
            assert!(
                report.metrics[0]
                    .approx_kl
                    .is_some_and(|kl| kl.abs() < 1e-6),
                "starts at the behaviour policy"
            );
            let after = response_logprob(&policy, &example);
            assert!(
                (after - before) * sign as f64 > 0.0,
                "advantage {sign}: log-prob {before} -> {after}"
            );
        }
    }

    /// Tokens at the holes of a response mask (first, middle and last):
    /// changing their old log-probs (to NaN) and advantages changes neither
    /// the loss nor the gradient under every aggregation, with the entropy
    /// bonus and the KL penalty on, and they are not counted; without the
    /// mask the same example gives another loss.
    #[test]
    fn hole_tokens_change_neither_the_loss_nor_the_gradient() {
        let policy = tiny_policy();
        let reference = tiny_policy();
        let prompt = vec![5, 6, 7, policy.special.plan];
        let response = vec![9, 12, 15, 18, policy.special.eos];
        let old: Vec<f32> = Vec::<f32>::try_from(
            tch::no_grad(|| {
                score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip).logprobs
            })
            .view([-1]),
        )
        .unwrap();
        let mask = vec![false, true, false, true, false];
        let example = |hole_old: f32, hole_adv: f32, masked: bool| Example {
            source: "test".into(),
            old_logprobs: old
                .iter()
                .zip(&mask)
                .map(|(&o, &m)| if m { o - 0.1 } else { hole_old })
                .collect(),
            advantages: mask
                .iter()
                .enumerate()
                .map(|(t, &m)| if m { t as f32 - 1.5 } else { hole_adv })
                .collect(),
            prompt: prompt.clone(),
            response: response.clone(),
            temperature: 1.0,
            observation: None,
            thought: None,
            response_mask: masked.then(|| mask.clone()),
        };
        for loss_agg in [
            loss::LossAgg::TokenMean,
            loss::LossAgg::SeqMeanTokenSum,
            loss::LossAgg::SeqMeanTokenMean,
        ] {
            let config = Config {
                ppo: PpoConfig {
                    loss_agg,
                    entropy_coef: 0.01,
                    kl_coef: 0.5,
                    ..Default::default()
                },
                ..Default::default()
            };
            let run = |example: Example| {
                for mut var in policy.vars.trainable_variables() {
                    var.zero_grad();
                }
                let denominators = Denominators {
                    tokens: example.loss_tokens() as f64,
                    sequences: 1.0,
                };
                let examples = [example];
                let sums = accumulate(
                    &policy,
                    Some(&reference),
                    &examples,
                    &[vec![0]],
                    denominators,
                    &config,
                )
                .unwrap();
                let grads: Vec<tch::Tensor> = policy
                    .vars
                    .trainable_variables()
                    .iter()
                    .map(|v| v.grad().copy())
                    .collect();
                (sums.loss, sums.tokens, grads)
            };
            let (loss, tokens, grads) = run(example(-0.5, 0.0, true));
            let (changed, _, changed_grads) = run(example(f32::NAN, 100.0, true));
            assert!(loss.is_finite(), "{loss_agg:?}: {loss}");
            assert_eq!(loss, changed, "{loss_agg:?}");
            assert_eq!(tokens, 2, "{loss_agg:?}");
            assert!(
                grads.iter().zip(&changed_grads).all(|(a, b)| a.equal(b)),
                "{loss_agg:?}: the gradient moved"
            );
            assert!(
                grads
                    .iter()
                    .any(|g| g.abs().sum(Kind::Double).double_value(&[]) > 0.0)
            );
            let (unmasked, ..) = run(example(-0.5, 0.0, false));
            assert_ne!(loss, unmasked, "{loss_agg:?}: the mask changed nothing");
        }
    }

    /// The KL penalty to a reference that starts equal to the policy: 0 at
    /// the first step, positive once the policy has moved, and in the loss.
    #[test]
    fn the_kl_penalty_grows_as_the_policy_leaves_the_reference() {
        let mut policy = tiny_policy();
        let reference = tiny_policy();
        let prompt = vec![5, 6, 7, policy.special.plan];
        let response = vec![9, 12, 15, policy.special.eos];
        let old = tch::no_grad(|| {
            score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip).logprobs
        });
        let example = Example {
            source: "test".into(),
            old_logprobs: Vec::<f32>::try_from(old.view([-1])).unwrap(),
            advantages: vec![1.0; response.len()],
            prompt,
            response,
            temperature: 1.0,
            observation: None,
            thought: None,
            response_mask: None,
        };
        assert_kl_penalty_grows(&mut policy, &reference, example);
    }

    /// Three PPO steps (lr 1e-2) on `example` with a KL penalty (coefficient
    /// 0.5) to `reference`, which starts equal to `policy`: the penalty is 0
    /// at the first step, positive at the third, and part of the loss.
    /// Shared by the plan policy's test and the VLA's (`vla::tests`).
    pub(crate) fn assert_kl_penalty_grows<M: Trainable>(
        policy: &mut Checkpoint<M>,
        reference: &Checkpoint<M>,
        example: Example,
    ) {
        let config = Config {
            epochs: 3,
            mini_batch: 1,
            micro_batch: 1,
            optim: OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            ppo: PpoConfig {
                kl_coef: 0.5,
                ..Default::default()
            },
            kl_reference: Some(PathBuf::from("unused: the reference is passed in")),
            ..Default::default()
        };
        let report = train(
            policy,
            Some(reference),
            &[example],
            &config,
            0,
            OptimizerState::fresh("ppo"),
        )
        .unwrap();
        let kl: Vec<f32> = report.metrics.iter().map(|m| m.kl_loss.unwrap()).collect();
        assert!(kl[0].abs() < 1e-6 && kl[2] > 1e-6, "{kl:?}");
        let last = &report.metrics[2];
        assert!(
            (last.loss - (last.pg_loss + 0.5 * last.kl_loss.unwrap())).abs() < 1e-5,
            "{last:?}"
        );
    }

    /// SFT raises the log-probability of the expert answer.
    #[test]
    fn sft_learns_the_answer() {
        let mut policy = tiny_policy();
        let example = Example {
            source: "test".into(),
            prompt: vec![5, 6, policy.special.plan],
            response: vec![20, 21, 22, policy.special.eos],
            old_logprobs: Vec::new(),
            advantages: Vec::new(),
            temperature: 1.0,
            observation: None,
            thought: None,
            response_mask: None,
        };
        let before = response_logprob(&policy, &example);
        let config = Config {
            objective: Objective::Sft,
            epochs: 20,
            mini_batch: 1,
            micro_batch: 1,
            optim: OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            ..Default::default()
        };
        train(
            &mut policy,
            None,
            std::slice::from_ref(&example),
            &config,
            0,
            OptimizerState::fresh("sft"),
        )
        .unwrap();
        let after = response_logprob(&policy, &example);
        assert!(after > before + 1.0 && after > -1.0, "{before} -> {after}");
    }

    /// `sft.context = both`: each task twice, once after the policy's prompt
    /// and once after the teacher template with its reference plan.
    #[test]
    fn sft_contexts_follow_the_teacher_template() {
        use embodyflow_household::{Split, generate_tasks, task_row};
        let policy = tiny_policy();
        let rows: Vec<TaskRow> = generate_tasks(Split::Train, 5, 3)
            .iter()
            .map(task_row)
            .collect();
        let sft = |context| SftConfig {
            context,
            ..SftConfig::default()
        };
        let plain = sft_examples(&policy, &rows, &sft(SftContext::Prompt)).unwrap();
        let both = sft_examples(&policy, &rows, &sft(SftContext::Both)).unwrap();
        assert_eq!((plain.len(), both.len()), (3, 6));
        let text =
            |ids: &[i32]| embodyflow_models::tokenizer::decode(&policy.tokenizer, ids).unwrap();
        assert_eq!(both[0].prompt, plain[0].prompt);
        assert_eq!(both[1].response, plain[0].response);
        let teacher = text(&both[1].prompt);
        let first = &rows[0].gt_actions.as_ref().unwrap()[0];
        assert!(
            teacher.contains(&format!(
                "=== Reference Plan Begin ===\n{}: {}\n",
                first.action_id, first.action_name
            )),
            "{teacher}"
        );
        let broken = SftConfig {
            template: ContextTemplates {
                teacher: "{prompt}".into(),
                ..ContextTemplates::default()
            },
            ..sft(SftContext::Reference)
        };
        let error = sft_examples(&policy, &rows, &broken)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("reference_plan"), "{error}");
    }

    /// SFT examples whose answers have `lengths` tokens (different lengths,
    /// so a step's token count is not a multiple of its sequences).
    fn sft_set(policy: &Checkpoint, lengths: &[usize]) -> Vec<Example> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut response: Vec<i32> =
                    (0..n as i32 - 1).map(|t| 20 + 3 * t + i as i32).collect();
                response.push(policy.special.eos);
                Example {
                    source: format!("example {i}"),
                    prompt: vec![5 + i as i32, 6, policy.special.plan],
                    response,
                    old_logprobs: Vec::new(),
                    advantages: Vec::new(),
                    temperature: 1.0,
                    observation: None,
                    thought: None,
                    response_mask: None,
                }
            })
            .collect()
    }

    fn max_weight_difference(a: &Checkpoint, b: &Checkpoint) -> f64 {
        let b_vars = b.vars.variables();
        a.vars
            .variables()
            .iter()
            .map(|(name, t)| (t - &b_vars[name]).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    fn lrs(report: &TrainReport) -> Vec<f32> {
        report.metrics.iter().map(|m| m.lr).collect()
    }

    /// `grad_accumulation = 2` over mini-batches of 2 is one step on their
    /// union of 4: same losses, rates and weights, under both kinds of
    /// normalisation. Both runs use micro-batches of 2, because Adam turns
    /// float noise in gradients that are 0 in exact arithmetic (a key bias)
    /// into steps of about `lr`; that a step's micro-batches sum to its loss
    /// in one piece is `loss::tests::micro_batches_sum_to_the_whole`.
    #[test]
    fn accumulated_mini_batches_step_like_their_union() {
        for loss_agg in [loss::LossAgg::TokenMean, loss::LossAgg::SeqMeanTokenMean] {
            let config = |mini_batch, micro_batch, grad_accumulation| Config {
                objective: Objective::Sft,
                epochs: 2,
                mini_batch,
                micro_batch,
                grad_accumulation,
                optim: OptimConfig {
                    lr: 1e-2,
                    schedule: ScheduleKind::LinearWarmup,
                    warmup_steps: 2,
                    ..Default::default()
                },
                ppo: PpoConfig {
                    loss_agg,
                    ..Default::default()
                },
                ..Default::default()
            };
            let initial = tiny_policy();
            let examples = sft_set(&initial, &[2, 7, 3, 5, 4, 6]);
            let mut accumulated = tiny_policy();
            let a = train(
                &mut accumulated,
                None,
                &examples,
                &config(2, 2, 2),
                11,
                OptimizerState::fresh("sft"),
            )
            .unwrap();
            let mut union = tiny_policy();
            let b = train(
                &mut union,
                None,
                &examples,
                &config(4, 2, 1),
                11,
                OptimizerState::fresh("sft"),
            )
            .unwrap();
            // 6 examples in steps of 4: a full step and the epoch's rest, twice.
            assert_eq!((a.metrics.len(), b.metrics.len()), (4, 4));
            assert_eq!(lrs(&a), [0.0, 5e-3, 1e-2, 1e-2]);
            assert_eq!(lrs(&a), lrs(&b));
            for (x, y) in a.metrics.iter().zip(&b.metrics) {
                assert!(
                    (x.loss - y.loss).abs() < 1e-5,
                    "{loss_agg:?}: {} vs {}",
                    x.loss,
                    y.loss
                );
            }
            let moved = max_weight_difference(&accumulated, &initial);
            let difference = max_weight_difference(&accumulated, &union);
            assert!(moved > 1e-3, "the steps move the weights ({moved})");
            assert!(
                difference < 1e-6,
                "{loss_agg:?}: accumulated vs union weights differ by {difference}"
            );
            // The same mini-batches as separate steps are another run.
            let mut separate = tiny_policy();
            train(
                &mut separate,
                None,
                &examples,
                &config(2, 2, 1),
                11,
                OptimizerState::fresh("sft"),
            )
            .unwrap();
            assert!(max_weight_difference(&separate, &union) > 1e-3);
        }
    }

    /// PPO examples in 3 groups of 3 samples sharing a prompt (prompts of
    /// two lengths, responses of many), old log-probs near the policy's.
    fn ppo_groups(policy: &Checkpoint) -> Vec<Example> {
        let plan = policy.special.plan;
        let prompts = [
            vec![5, 6, 7, plan],
            vec![8, 9, plan],
            vec![10, 11, 12, plan],
        ];
        let mut examples = Vec::new();
        for (g, prompt) in prompts.iter().enumerate() {
            for sample in 0..3usize {
                let n = 2 + (g * 3 + sample * 5) % 7;
                let mut response: Vec<i32> = (0..n as i32 - 1)
                    .map(|t| 20 + 5 * t + sample as i32)
                    .collect();
                response.push(policy.special.eos);
                let old = tch::no_grad(|| {
                    score_responses(policy, &[prompt], &[&response], 1.0, Entropy::Skip).logprobs
                });
                let old: Vec<f32> = Vec::<f32>::try_from(old.view([-1]))
                    .unwrap()
                    .iter()
                    .enumerate()
                    .map(|(t, lp)| lp + 0.05 * ((t + sample) % 3) as f32 - 0.05)
                    .collect();
                examples.push(Example {
                    source: format!("group {g} sample {sample}"),
                    prompt: prompt.clone(),
                    response,
                    old_logprobs: old,
                    advantages: (0..n)
                        .map(|t| sample as f32 - 1.0 + 0.1 * t as f32)
                        .collect(),
                    temperature: 1.0,
                    observation: None,
                    thought: None,
                    response_mask: None,
                });
            }
        }
        examples
    }

    fn gradients(policy: &Checkpoint) -> Vec<(String, tch::Tensor)> {
        let mut grads: Vec<(String, tch::Tensor)> = policy
            .vars
            .variables()
            .into_iter()
            .map(|(name, var)| (name, var.grad().copy()))
            .collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        grads
    }

    /// Micro-batches ordered by prompt and length (each group's prompt
    /// encoded once) give the step the loss, metrics and gradient of the
    /// shuffled order cut as it comes, up to float rounding, under every
    /// aggregation, with and without an entropy bonus; and the same seed
    /// trains to the same weights.
    #[test]
    fn length_and_prompt_ordered_micro_batches_step_like_plain_ones() {
        let policy = tiny_policy();
        let examples = ppo_groups(&policy);
        let mut step: Vec<usize> = (0..examples.len()).collect();
        step.shuffle(&mut ChaCha8Rng::seed_from_u64(5));
        let ordered = micro_batches(&examples, &step, 4);
        assert_eq!(ordered.concat().len(), step.len());
        let first: Vec<&[i32]> = ordered[0]
            .iter()
            .map(|&i| examples[i].prompt.as_slice())
            .collect();
        assert!(
            first.windows(2).filter(|w| w[0] == w[1]).count() >= 2,
            "a group sits together"
        );
        let plain: Vec<Vec<usize>> = step.chunks(4).map(<[usize]>::to_vec).collect();
        assert_ne!(ordered, plain);
        let denominators = Denominators {
            tokens: examples.iter().map(|e| e.response.len()).sum::<usize>() as f64,
            sequences: examples.len() as f64,
        };
        for (loss_agg, entropy_coef) in [
            (loss::LossAgg::TokenMean, 0.0),
            (loss::LossAgg::TokenMean, 0.3),
            (loss::LossAgg::SeqMeanTokenSum, 0.0),
            (loss::LossAgg::SeqMeanTokenMean, 0.0),
        ] {
            let config = Config {
                ppo: PpoConfig {
                    loss_agg,
                    entropy_coef,
                    ..Default::default()
                },
                ..Default::default()
            };
            let run = |micros: &[Vec<usize>]| {
                for (_, var) in policy.vars.variables() {
                    let mut grad = var.grad();
                    if grad.defined() {
                        let _ = grad.zero_();
                    }
                }
                let sums =
                    accumulate(&policy, None, &examples, micros, denominators, &config).unwrap();
                (sums, gradients(&policy))
            };
            let (a, grads_a) = run(&ordered);
            let (b, grads_b) = run(&plain);
            let context = format!("{loss_agg:?}, entropy_coef {entropy_coef}");
            assert_eq!(a.tokens, b.tokens);
            assert_eq!(
                (a.clipped, a.clipped_lower),
                (b.clipped, b.clipped_lower),
                "{context}"
            );
            for (x, y) in [
                (a.loss, b.loss),
                (a.pg_loss, b.pg_loss),
                (a.entropy, b.entropy),
                (a.approx_kl, b.approx_kl),
            ] {
                assert!(
                    (x - y).abs() < 1e-5 * y.abs().max(1.0),
                    "{context}: {a:?} vs {b:?}"
                );
            }
            // The entropy is the metric either way, and in the loss only with a bonus.
            assert!(a.entropy > 0.0);
            let bonus = a.pg_loss - entropy_coef * a.entropy;
            assert!((a.loss - bonus).abs() < 1e-5, "{context}: {a:?}");
            for ((name, x), (_, y)) in grads_a.iter().zip(&grads_b) {
                let scale = y.abs().max().double_value(&[]).max(1e-3);
                let diff = (x - y).abs().max().double_value(&[]);
                assert!(
                    diff < 1e-4 * scale,
                    "{context}: {name} differs by {diff} ({scale})"
                );
            }
        }
        let config = Config {
            epochs: 2,
            mini_batch: 6,
            micro_batch: 4,
            optim: OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            ..Default::default()
        };
        let trained = || {
            let mut policy = tiny_policy();
            train(
                &mut policy,
                None,
                &examples,
                &config,
                7,
                OptimizerState::fresh("ppo"),
            )
            .unwrap();
            policy
        };
        let (x, y) = (trained(), trained());
        assert!(max_weight_difference(&x, &tiny_policy()) > 1e-4);
        assert_eq!(
            max_weight_difference(&x, &y),
            0.0,
            "same seed, same weights"
        );
    }

    /// Two calls through a checkpoint on disk (3 steps, then 5) follow the
    /// schedule of one call of 8 steps: same rates, same weights.
    #[test]
    fn a_resumed_run_continues_the_schedule() {
        let config = |epochs| Config {
            objective: Objective::Sft,
            epochs,
            mini_batch: 1,
            micro_batch: 1,
            optim: OptimConfig {
                lr: 1e-2,
                schedule: ScheduleKind::Cosine,
                warmup_steps: 2,
                total_steps: Some(6),
                min_lr_ratio: 0.1,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut straight = tiny_policy();
        let examples = sft_set(&straight, &[5]);
        let whole = train(
            &mut straight,
            None,
            &examples,
            &config(8),
            0,
            OptimizerState::fresh("sft"),
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "embodyflow-update-policy-resume-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut first = tiny_policy();
        let a = train(
            &mut first,
            None,
            &examples,
            &config(3),
            0,
            OptimizerState::fresh("sft"),
        )
        .unwrap();
        first
            .save(&dir.join("policy"), "update-policy", false)
            .unwrap();
        let mut second = Checkpoint::load(&dir.join("policy"), tch::Device::Cpu).unwrap();
        let state = OptimizerState::load(&dir.join("policy"), &second.vars)
            .unwrap()
            .unwrap();
        assert_eq!(state.meta.steps, 3);
        let b = train(&mut second, None, &examples, &config(5), 0, state).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!([lrs(&a), lrs(&b)].concat(), lrs(&whole));
        // transformers' / veRL's lambda at steps 0..8 (the floor from step 6 on).
        let expected: Vec<f32> = (0..8u32)
            .map(|s| {
                let factor = if s < 2 {
                    f64::from(s) / 2.0
                } else {
                    let progress = (f64::from(s - 2) / 4.0).min(1.0);
                    0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
                };
                (1e-2 * factor) as f32
            })
            .collect();
        assert_eq!(lrs(&whole), expected);
        assert_eq!(max_weight_difference(&straight, &second), 0.0);
        let note = schedule_note(&config(5).optim, 3, &b.metrics);
        assert!(
            note.starts_with("cosine, steps 4 to 8 of the run")
                && note.ends_with("(past optim.total_steps = 6: held at the floor)"),
            "{note}"
        );
    }
}
