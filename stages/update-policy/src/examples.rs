//! Training examples from the input tables: one [`Example`] per sequence
//! the loss reads (a prompt, a response, and for PPO the behaviour
//! log-probs, advantages and temperature).
//!
//! - SFT on a plan policy ([`sft_examples`]): the expert answer of each
//!   task [`kept_tasks`] keeps (`sft.demos_per_task`,
//!   `sft.demos_per_task_type`), after the policy's prompt, the teacher
//!   template with the ground-truth plan, or both (`sft.context`); a VLA's
//!   demonstrations are [`crate::vla`]'s.
//! - PPO and LAPO ([`ppo_examples`]): each `steps` row joined with its
//!   `advantages` row (a step without one was dropped by dynamic sampling)
//!   and its trajectory's temperature; a LAPO step also carries its latent
//!   chain, stop, old value and GAE return ([`ExampleThought`]).
//!
//! A VLA decision's observation bytes stay in the example or move into one
//! memory-mapped store the examples share ([`store_observations`],
//! `observations = "mmap"`). Token ids outside the policy's vocabulary are
//! refused, naming the row ([`check_vocabulary`]).
//!
//! ```text
//! steps (t0, 0) + advantages (t0, 0) + trajectories (t0: T = 1.0)
//!     -> Example { prompt, response, old_logprobs, advantages, temperature: 1.0, .. }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use embodyflow_core::Error;
use embodyflow_core::observation_store::{
    ObservationStore, ObservationStoreError, ObservationStoreWriter,
};
use embodyflow_core::schemas::{AdvantageRow, StepRow, TaskRow, TrajectoryRow};
use embodyflow_envs::context::reference_plan;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::frame_encoder::FrameEncoder;
use embodyflow_models::images::encode_images;
use embodyflow_models::policy::PlanNet;
use embodyflow_models::tokenizer::encode;
use embodyflow_rollout::{sampling_seed, task_prompt};

use crate::config::{DemosPerTask, SftConfig, SftContext};

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
    /// A VLA decision's observation bytes (`embodyflow_core::observation`),
    /// or the images of a plan prompt (`embodyflow_models::images`; `None`
    /// for a text prompt): read through [`Example::observation`] alone.
    pub observation: Option<ObservationBytes>,
    /// A thinking VLA's latent chain at this decision: the rollout's (LAPO,
    /// PPO) or the warm-up's targets (SFT); `None` otherwise.
    pub thought: Option<ExampleThought>,
    /// Which response tokens are the policy's (`steps.response_mask`):
    /// false marks a token a tool or the environment inserted, left out of
    /// the loss, the entropy, the KL penalty and the token counts (its old
    /// log-prob and advantage are never used). `None`: every token.
    pub response_mask: Option<Vec<bool>>,
}

/// The latent chain of a thinking VLA's example ([`crate::vla::thinking`]).
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
    /// every epoch ([`redraw_warmup_lengths`]); empty for
    /// LAPO (the rollout chose its stop).
    pub warmup_lengths: Vec<usize>,
    /// The rollout's log-prob of that stop (LAPO, PPO; 0 for SFT).
    pub old_stop_logprob: f32,
    /// The rollout's value estimate (LAPO; 0 for SFT and PPO).
    pub old_value: f32,
    /// The value target: GAE's return, advantage + value before whitening
    /// (LAPO; 0 for SFT and PPO).
    pub target_return: f32,
}

/// A warm-up example's chain length: one of `lengths`, uniformly, from
/// the epoch's seed and the example's source.
pub(crate) fn warmup_length(lengths: &[usize], epoch_seed: u64, source: &str) -> usize {
    lengths[sampling_seed(epoch_seed, source) as usize % lengths.len()]
}

/// The examples of one warm-up epoch, each chain length drawn anew from
/// its candidates with the epoch's seed (LaST-R1's warm-up draws a length
/// per sample each time it is used); `None` when no example has warm-up
/// candidates (LAPO, a plain VLA), so the examples are used as they are.
/// Epoch 0's seed is the run's, so its draws are
/// [`attach_warmup_targets`](crate::vla::thinking::attach_warmup_targets)'s.
pub fn redraw_warmup_lengths(examples: &[Example], epoch_seed: u64) -> Option<Vec<Example>> {
    let drawn = |e: &Example| {
        e.thought
            .as_ref()
            .is_some_and(|t| !t.warmup_lengths.is_empty())
    };
    if !examples.iter().any(drawn) {
        return None;
    }
    let mut examples = examples.to_vec();
    for example in &mut examples {
        let source = example.source.clone();
        if let Some(thought) = example
            .thought
            .as_mut()
            .filter(|t| !t.warmup_lengths.is_empty())
        {
            thought.latent_len = warmup_length(&thought.warmup_lengths, epoch_seed, &source);
        }
    }
    Some(examples)
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
    pub(crate) fn hole_free<'a>(&self, values: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
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
    /// accessor of the observation (read by [`crate::vla::decisions::decode_observations`]).
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
        let env = embodyflow_worlds::one_shot(row, 0)?;
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
            // A policy that reads text only trains on the text alone.
            let (prompt, _) = task_prompt(policy, &env, &context)?;
            examples.push(Example {
                source: format!("task `{}`", row.task_id),
                observation: encode_images(&prompt.images)?.map(ObservationBytes::Held),
                prompt: prompt.ids,
                response: response.clone(),
                old_logprobs: Vec::new(),
                advantages: Vec::new(),
                temperature: 1.0,
                thought: None,
                response_mask: None,
            });
        }
    }
    Ok(examples)
}

/// PPO examples: steps joined with their advantages and their trajectory's
/// temperature. With `lapo` each also carries the step's latent chain,
/// stop, old value and its GAE return ([`ExampleThought`]), a null one
/// being bad input naming the table and field; without it (PPO) a step a
/// thinking VLA took (its `latents` set) carries its latent chain and stop,
/// which the action tokens are scored behind (no value, no return). The
/// steps of a trajectory ended by infrastructure
/// (`trajectories.infra_fault`) are no outcome of the policy: skipped, with
/// any advantages row they have.
pub fn ppo_examples(
    trajectories: &[TrajectoryRow],
    steps: Vec<StepRow>,
    advantages: Vec<AdvantageRow>,
    lapo: bool,
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
        let thought = if lapo || step.latents.is_some() {
            Some(example_thought(&step, &advantage, lapo)?)
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

/// A rollout example's [`ExampleThought`] from its `steps` row (the
/// latents, their width, the chosen length, the stop's log-prob and, for
/// LAPO, the old value) and, for LAPO, its `advantages` row (the return of
/// its first token: a decision's return is broadcast to its tokens; PPO
/// reads neither, both 0); a null or unusable field is bad input naming
/// the table, field and step.
fn example_thought(
    step: &StepRow,
    advantage: &AdvantageRow,
    lapo: bool,
) -> Result<ExampleThought, Error> {
    let at = format!(
        "trajectory `{}` step {}",
        step.trajectory_id, step.step_index
    );
    let objective = if lapo { "lapo" } else { "ppo" };
    let null = |table: &str, field: &str, hint: &str| {
        Error::BadInput(format!(
            "table `{table}` field `{field}` is null at {at}: objective = {objective} {hint}"
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
    let (old_value, target_return) = if lapo {
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
        (old_value, target_return)
    } else {
        (0.0, 0.0)
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

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
}
