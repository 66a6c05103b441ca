//! The stage's run: the policy checkpoint loaded as the network it holds
//! ([`embodyflow_models::with_policy_net`]: any network of the registry,
//! each trained by its role, [`Trainable`]), the
//! training examples made from the input tables, the optimizer state
//! resumed or started fresh, the training loop ([`crate::train`]), and the
//! outputs (the next checkpoint `policy/`, the `metrics` table and
//! `metrics.csv`) committed together with the summary.
//!
//! ```text
//! update-policy --policy runs/it0/policy --input runs/it0/rollouts --input runs/it0/adv \
//!     --out runs/it1 --set iteration=1
//! ```

use embodyflow_core::Error;
use embodyflow_core::commit::Digest;
use embodyflow_core::schemas::{
    AdvantageRow, MetricRow, StepRow, TableName, TaskRow, TrajectoryRow,
};
use embodyflow_core::spec;
use embodyflow_core::stage::{Stage, Summary};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, PolicyKind};
use embodyflow_models::optimizer::OptimizerState;

use crate::config::{Config, Objective, ObservationsMode, OptimConfig, ScheduleKind};
use crate::examples::{Example, ObservationBytes, ppo_examples, store_observations};
use crate::train::{TrainReport, Trainable, Training, train};
use crate::{Args, lapo, metrics_csv};

/// Runs the stage.
pub fn run(args: Args) -> Result<(), ModelError> {
    let stage =
        Stage::<Config>::start(&spec::UPDATE_POLICY, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_output_names(&[
        TableName::Metrics.as_str(),
        metrics_csv::METRICS_CSV,
        "policy",
    ])?;
    embodyflow_models::with_policy_net!(&args.policy.policy, |M| update::<M>(&stage, &args))?
}

/// The stage on a policy of network `M`: examples, training, outputs.
fn update<M: Trainable>(stage: &Stage<Config>, args: &Args) -> Result<(), ModelError> {
    let policy_out = args.stage.out.join("policy");
    let config = &stage.config;
    let (mut policy, reference) = load_policies::<M>(config, args)?;
    let frozen = freeze_vision(config, args, &policy)?;
    let (examples, notes) = training_examples(stage, args.stage.seed, &mut policy)?;
    check_example_set(&examples)?;
    let examples = match config.observations {
        ObservationsMode::Memory => examples,
        ObservationsMode::Mmap => store_observations(examples).map_err(Error::from)?,
    };
    let saved = OptimizerState::load(&args.policy.policy, &policy.vars)?;
    let (state, optimizer_note) = optimizer_state(config, saved);
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
    let child = write_outputs(stage, args, &policy, &report)?;
    let mut summary = Summary::new("update-policy");
    summary
        .add(
            "objective",
            format!("{:?}", config.objective).to_lowercase(),
        )
        .add(
            "policy",
            format!("{parent} -> {child} ({})", policy_out.display()),
        )
        .add("examples", examples.len());
    if let Some(frozen) = frozen {
        summary.add("vision encoder", format!("frozen, {frozen} parameters"));
    }
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
        );
    add_throughput(&mut summary, &report, M::KIND);
    add_objective_terms(&mut summary, config, &examples, &report);
    stage.commit(&summary)?;
    Ok(())
}

/// The policy to train and, with a KL penalty, its reference checkpoint,
/// on the run's device, after seeding libtorch with `--seed`.
fn load_policies<M: Trainable>(
    config: &Config,
    args: &Args,
) -> Result<(Checkpoint<M>, Option<Checkpoint<M>>), ModelError> {
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    tch::manual_seed(args.stage.seed as i64);
    let policy = Checkpoint::<M>::load_kind(&args.policy.policy, device)?;
    // Config::validate: ppo.kl_coef > 0 comes with a kl_reference.
    let reference = match (&config.kl_reference, config.ppo.kl_coef > 0.0) {
        (Some(path), true) => Some(Checkpoint::<M>::load_kind(path, device)?),
        _ => None,
    };
    Ok((policy, reference))
}

/// With `freeze_vision`, freezes the policy's vision encoder
/// ([`Checkpoint::freeze_vision`]) and returns how many parameter values
/// it holds; a policy without one is refused naming the key.
fn freeze_vision<M: Trainable>(
    config: &Config,
    args: &Args,
    policy: &Checkpoint<M>,
) -> Result<Option<i64>, Error> {
    if !config.freeze_vision {
        return Ok(None);
    }
    let frozen = policy.freeze_vision().ok_or_else(|| Error::BadValue {
        key: "freeze_vision".into(),
        reason: format!(
            "the policy {} (a {} network) has no vision encoder to freeze",
            args.policy.policy.display(),
            M::NAME
        ),
    })?;
    Ok(Some(frozen))
}

/// Summary lines (key, value) on how the examples were made.
type Notes = Vec<(String, String)>;

/// The objective's training examples with the summary's lines on them:
/// SFT's from the `tasks` table (a frame encoder fitted for them goes into
/// `policy`), PPO's and LAPO's from the rollouts ([`rollout_examples`]).
fn training_examples<M: Trainable>(
    stage: &Stage<Config>,
    seed: u64,
    policy: &mut Checkpoint<M>,
) -> Result<(Vec<Example>, Notes), ModelError> {
    let config = &stage.config;
    match config.objective {
        Objective::Sft => {
            let tasks: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
            let set = M::Role::sft_examples(policy, &tasks, &config.sft, seed)?;
            if let Some(encoder) = set.frame_encoder {
                policy.frame_encoder = Some(encoder);
            }
            Ok((set.examples, set.notes))
        }
        Objective::Ppo | Objective::Lapo => rollout_examples(stage),
    }
}

/// PPO's and LAPO's examples: the `steps` joined with their `advantages`
/// and `trajectories` ([`ppo_examples`]), with the summary's line on the
/// trajectories an infrastructure fault ended (skipped).
fn rollout_examples(stage: &Stage<Config>) -> Result<(Vec<Example>, Notes), ModelError> {
    let config = &stage.config;
    let trajectories: Vec<TrajectoryRow> = stage.input(TableName::Trajectories)?.read_rows()?;
    let steps: Vec<StepRow> = stage.input(TableName::Steps)?.read_rows()?;
    let advantages: Vec<AdvantageRow> = stage.input(TableName::Advantages)?.read_rows()?;
    let faulted: Vec<&TrajectoryRow> = trajectories.iter().filter(|t| t.faulted()).collect();
    let notes = vec![(
        "skipped: ended by an infrastructure fault".to_string(),
        format!(
            "{} trajectories ({} steps)",
            faulted.len(),
            faulted.iter().map(|t| i64::from(t.num_steps)).sum::<i64>()
        ),
    )];
    let examples = ppo_examples(
        &trajectories,
        steps,
        advantages,
        config.objective == Objective::Lapo,
    )?;
    Ok((examples, notes))
}

/// Fails on no examples, and on examples sampled at different temperatures.
fn check_example_set(examples: &[Example]) -> Result<(), Error> {
    if examples.is_empty() {
        return Err(Error::BadInput("no training examples in the inputs".into()));
    }
    // Log-probs are recomputed at the rollouts' temperature, one per micro-batch.
    if let Some(other) = examples
        .iter()
        .find(|e| e.temperature != examples[0].temperature)
    {
        return Err(Error::BadInput(format!(
            "{} was sampled at temperature {}, {} at {}: update on rollouts of one temperature",
            examples[0].source, examples[0].temperature, other.source, other.temperature
        )));
    }
    Ok(())
}

/// The AdamW state the run starts from, with the summary's line on it: the
/// input checkpoint's `saved` state when `optim.resume` is on and it was
/// accumulated on this objective, else a fresh one.
fn optimizer_state(config: &Config, saved: Option<OptimizerState>) -> (OptimizerState, String) {
    let objective = config.objective.name();
    match saved {
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
    }
}

/// Stages the outputs (the `metrics` table, `metrics.csv` and the next
/// checkpoint `policy/`) for the commit; returns the checkpoint's id.
fn write_outputs<M: Trainable>(
    stage: &Stage<Config>,
    args: &Args,
    policy: &Checkpoint<M>,
    report: &TrainReport,
) -> Result<String, ModelError> {
    let mut writer = stage.writer(TableName::Metrics)?;
    writer.write_rows(&report.metrics)?;
    stage.finish(writer)?;
    metrics_csv::stage_metrics_csv(stage, &report.metrics)?;
    let (staged, manifest) = policy.save_staged(&args.stage.out, "policy", "update-policy")?;
    stage.stage_output(&staged, "policy", Digest::DirAll)?;
    Ok(manifest.id)
}

/// The summary's lines on the optimisation: the loss at the first and last
/// step and the throughput (a VLA's decisions too).
fn add_throughput(summary: &mut Summary, report: &TrainReport, kind: PolicyKind) {
    let first = report.metrics.first().map_or(f32::NAN, |m| m.loss);
    let last = report.metrics.last().map_or(f32::NAN, |m| m.loss);
    summary
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
    if !kind.is_one_shot() {
        summary.add(
            "decision throughput",
            format!(
                "{:.1} decisions/s ({} decisions, forward and backward)",
                report.sequences as f64 / report.seconds.max(1e-9),
                report.sequences
            ),
        );
    }
}

/// The summary's lines on the objective's terms: a thinking VLA's chosen
/// latent lengths and warm-up terms, LAPO's value explained variance, and
/// the policy-gradient means (clipfrac, approx_kl, entropy; LAPO's terms).
fn add_objective_terms(
    summary: &mut Summary,
    config: &Config,
    examples: &[Example],
    report: &TrainReport,
) {
    if let Some(note) = latent_lengths_note(examples) {
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

/// The summary's line on the schedule: its name, the optimizer steps this
/// call took (counted over the run) and the rates of its first and last step.
pub(crate) fn schedule_note(optim: &OptimConfig, first_step: u64, metrics: &[MetricRow]) -> String {
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
