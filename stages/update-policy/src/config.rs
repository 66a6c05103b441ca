//! The stage's config: what to optimise (`objective`), the batch sizes, the
//! optimizer and its learning-rate schedule (`optim.*`), the policy loss
//! (`ppo.*`, [`crate::loss`]), LAPO's terms (`lapo.*`, [`crate::lapo`]),
//! supervised fine-tuning (`sft.*`) and where a VLA's observations are kept
//! (`observations`), read from the layered TOML config and `--set key=value`
//! (see `embodyflow_core::config`). Every table is `deny_unknown_fields`,
//! so a misspelt key is an error that names it; [`Config::validate`] checks
//! the values before any work, a schedule key the schedule does not read
//! included.
//!
//! ```text
//! objective = "ppo"          # ppo | sft | lapo
//! epochs = 1
//! mini_batch = 64            # sequences per mini-batch
//! micro_batch = 16           # sequences per forward/backward pass
//! [optim]
//! lr = 1e-4
//! schedule = "cosine"        # constant | linear_warmup | cosine
//! warmup_steps = 10
//! total_steps = 200
//! [ppo]
//! clip_low = 0.2
//! clip_high = 0.28
//! ```

use std::path::PathBuf;

use embodyflow_core::Error;
use embodyflow_core::config::{ConfigKeys, at_least, ensure, keys_of, non_negative, positive};
use embodyflow_core::schemas::TableName;
use embodyflow_core::stage::{OutputConfig, StageConfig};
use embodyflow_envs::context::ContextTemplates;
use embodyflow_models::optimizer::{AdamWConfig, LrSchedule};
use embodyflow_models::vla::WarmupConfig;
use embodyflow_worlds::BridgeKeys;
use serde::{Deserialize, Serialize};

use crate::lapo::LapoConfig;
use crate::loss::PpoConfig;

/// Where a VLA's observations are kept while it trains (`observations`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObservationsMode {
    /// Each example holds its bytes (the process's own memory).
    Memory,
    /// Written once into a memory-mapped Arrow IPC file
    /// ([`crate::store_observations`]): sealed shared memory, not the heap.
    #[default]
    Mmap,
}

/// `train.precision`: the dtype the forward and backward run in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// The parameters' own dtype (f32 for our networks).
    #[default]
    Fp32,
    /// bf16 forward and backward over bf16 copies of fp32 master weights,
    /// AdamW and its moments in fp32, log-probs from logits upcast to fp32
    /// ([`embodyflow_models::precision`]).
    Bf16,
}

/// `train.*`: how a training pass runs (memory and precision), not what it
/// computes. Each field's doc comment is its key's meaning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Recompute each transformer block in the backward instead of keeping its activations (less memory, one more forward per block).
    pub gradient_checkpointing: bool,
    /// fp32, or bf16: forward and backward in bf16 over fp32 master weights (AdamW in fp32; plan policies and VLAs).
    pub precision: Precision,
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

impl Objective {
    /// The tables its examples come from: what the stage opens for it and
    /// what `--print-config` reports as the config's `reads`.
    pub fn reads(self) -> &'static [TableName] {
        match self {
            Objective::Sft => &[TableName::Tasks],
            Objective::Ppo | Objective::Lapo => &[
                TableName::Trajectories,
                TableName::Steps,
                TableName::Advantages,
            ],
        }
    }
}

/// `optim.*` settings (AdamW). Each field's doc comment is its key's
/// meaning. The optimizer's step count is saved with its state and carries
/// over resumed calls, so `total_steps` counts the whole run; a state
/// accumulated on another objective is not resumed (a fresh one is).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    /// Learning rate (the base rate the schedule scales).
    pub lr: f64,
    /// Learning-rate schedule: constant, linear_warmup or cosine.
    pub schedule: ScheduleKind,
    /// linear_warmup, cosine: steps of the linear warm-up from 0.
    pub warmup_steps: u64,
    /// Cosine: the step at which the rate reaches its floor (over the whole
    /// run).
    pub total_steps: Option<u64>,
    /// Cosine: the floor as a fraction of optim.lr.
    pub min_lr_ratio: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW beta1.
    pub beta1: f64,
    /// AdamW beta2.
    pub beta2: f64,
    /// Largest gradient norm (0: no clipping).
    pub grad_clip: f64,
    /// Continue from the AdamW state saved in the input checkpoint (same
    /// objective).
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

    pub(crate) fn adamw(&self) -> AdamWConfig {
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

/// `sft.*` settings. Each field's doc comment is its key's meaning; the
/// `template`, `warmup` and `bridge` sections' keys are their types' fields
/// ([`ContextTemplates`], [`WarmupConfig`], [`BridgeKeys`]).
/// `demos_per_task` counts rows by [`TaskRow::task_key`], 1 by default:
/// SimpleVLA-RL's one-trajectory SFT, from each task's first initial state;
/// `demos_per_task_type = 1` is the household study's held-out-combination
/// SFT; `expert_noise` is the scripted expert's `ExpertConfig::noise`
/// (relative standard deviation on dx, dy, dz), seeded by `--seed` and the
/// task id.
///
/// [`TaskRow::task_key`]: embodyflow_core::schemas::TaskRow::task_key
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct SftConfig {
    /// Keep the first N rows of each task (rows sharing the task id before `@`:
    /// one task's initial states), or all; 1: one demonstration per task.
    pub demos_per_task: DemosPerTask,
    /// Then keep only the first N tasks of each task type (unset: all).
    pub demos_per_task_type: Option<usize>,
    /// Context each expert answer is trained after: prompt, reference or both.
    pub context: SftContext,
    /// The teacher template (`context = reference | both`): the same
    /// templates `teacher-logp` reads, so a teacher is trained on the context
    /// it will score in.
    #[keys(section)]
    pub template: ContextTemplates,
    /// VLA: the tabletop expert's relative action noise in [0, 1] on
    /// demonstrations (seeded by --seed and task).
    pub expert_noise: f32,
    /// VLA: what each demonstrated action is labelled with: `executed` (the
    /// action taken, noise included) or `planned` (the expert's action
    /// before its noise, DART: the noise moves the episode off the plan and
    /// the labels steer back).
    pub expert_labels: ExpertLabels,
    /// VLA: where a demonstration's examples start: `chunks` (every K-th
    /// step, the decisions the policy takes) or `steps` (every step with its
    /// next K actions, as OpenVLA-OFT's loader).
    pub windows: SftWindows,
    /// A thinking VLA's warm-up: the weights of the latent cosine, stop
    /// and action cross-entropies (LaST-R1: 1 : 0.1 : 1) and what fills the
    /// latent slots.
    #[keys(section)]
    pub warmup: WarmupConfig,
    /// The gym bridge's workers running the scripted experts of bridge
    /// tasks (`sft.bridge.*`).
    #[keys(section)]
    pub bridge: BridgeKeys,
    /// VLA: a table directory of demonstrations (tasks, trajectories, steps:
    /// table import --format libero-hdf5) to train on instead of a scripted
    /// expert's (unset: the expert's).
    pub demonstrations: Option<PathBuf>,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            demos_per_task: DemosPerTask::First(1),
            demos_per_task_type: None,
            context: SftContext::default(),
            template: ContextTemplates::default(),
            expert_noise: 0.05,
            expert_labels: ExpertLabels::default(),
            windows: SftWindows::default(),
            warmup: WarmupConfig::default(),
            bridge: BridgeKeys::default(),
            demonstrations: None,
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

/// What a VLA demonstration's actions are labelled with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertLabels {
    /// The actions the world received, noise included.
    #[default]
    Executed,
    /// The actions the expert planned before its noise (DART, Laskey et
    /// al. 2017).
    Planned,
}

/// Where a VLA demonstration's examples start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftWindows {
    /// At every K-th step: the decisions the policy itself takes, one
    /// example per chunk.
    #[default]
    Chunks,
    /// At every step: its frame with the next K actions (fewer at the end,
    /// masked), K times the examples; OpenVLA-OFT's loader makes one action
    /// chunk per timestep the same way.
    Steps,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// What to optimise: ppo, sft (a thinking VLA: its warm-up) or lapo (a
    /// thinking VLA's rollouts).
    pub objective: Objective,
    /// Iteration recorded in the metrics rows.
    pub iteration: i32,
    /// Passes over the examples (veRL ppo_epochs).
    pub epochs: usize,
    /// Sequences per mini-batch (veRL ppo_mini_batch_size).
    pub mini_batch: usize,
    /// Sequences per forward/backward pass (veRL ppo_micro_batch_size_per_gpu).
    pub micro_batch: usize,
    /// Mini-batches per optimizer step (loss normalised over all of them).
    pub grad_accumulation: usize,
    /// Keep the vision encoder's weights fixed, as the seeds train: a vision-language policy's, or a VLA's vision-language trunk's (frozen anyway when init-policy's vla.freeze_vision was set); refused for a policy without one.
    pub freeze_vision: bool,
    /// Optimizer.
    #[keys(section)]
    pub optim: OptimConfig,
    /// Policy loss.
    #[keys(section)]
    pub ppo: PpoConfig,
    /// LAPO's weights, latent sigma and value clip (`objective = lapo`).
    #[keys(section)]
    pub lapo: LapoConfig,
    /// Reference checkpoint of the KL penalty (needed when ppo.kl_coef > 0).
    pub kl_reference: Option<PathBuf>,
    /// Supervised fine-tuning.
    #[keys(section)]
    pub sft: SftConfig,
    /// VLA: where observations are kept while training: mmap (a memory-mapped
    /// Arrow IPC file in sealed shared memory) or memory.
    pub observations: ObservationsMode,
    /// Memory and precision of the passes.
    #[keys(section)]
    pub train: TrainConfig,
    /// Output layout of the metrics table.
    #[keys(skip)]
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
            freeze_vision: false,
            optim: OptimConfig::default(),
            ppo: PpoConfig::default(),
            lapo: LapoConfig::default(),
            kl_reference: None,
            sft: SftConfig::default(),
            observations: ObservationsMode::default(),
            train: TrainConfig::default(),
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        keys_of::<Config>()
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn reads(&self) -> Vec<TableName> {
        self.objective.reads().to_vec()
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

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

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
                "train.gradient_checkpointing=true",
                "train.precision=bf16",
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
            (&["train.precision=fp16"], "train.precision"),
            (
                &["train.gradient_checkpointing=yes"],
                "train.gradient_checkpointing",
            ),
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
}
