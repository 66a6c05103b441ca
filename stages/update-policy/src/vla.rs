//! `update-policy` on a VLA checkpoint ([`Vla`], `config.json` `"kind":
//! "vla"`): how its examples are made, checked and scored; the
//! training loop is the crate's ([`crate::train`]).
//!
//! An example is one decision: the observation (the frame and proprio,
//! encoded with [`embodyflow_core::observation`] so demonstrations and
//! rollouts take the same decoding path), the instruction ids as the prompt
//! (the checkpoint's tokenizer through [`VlaPolicy`], as `collect-rollouts`
//! tokenizes them) and the action tokens as the response, flattened step
//! after step (token `t` is dimension `t % D` of action `t / D`).
//!
//! - SFT (behaviour cloning, [`sft_examples`]): for each kept task
//!   ([`crate::kept_tasks`]: by default the first row of each task, i.e.
//!   one initial state per task), its world's scripted expert
//!   ([`embodyflow_worlds::World::demonstrations`]: the tabletop world's
//!   grasping expert with noise `sft.expert_noise` seeded by
//!   `sampling_seed(--seed, task id)`, a bridge adapter's expert in a
//!   worker) cut into decisions of `K = chunk_len` actions observed at the
//!   checkpoint's shape; each decision's actions are tokens of the
//!   checkpoint's bins (OpenVLA's 256 over [-1, 1] by default). A decision
//!   keeps the tokens of the actions taken before the episode ended, so the
//!   last one of an episode may have fewer than `K × D` (the steps after the
//!   end are out of the loss, as `Vla::bc_loss`'s `valid_steps` leaves them
//!   out); in a world that observes text its prompt is the instruction and
//!   that decision's text, and for a checkpoint with a history
//!   (`vla.history = H`) it recalls the expert's last `H` decisions, their
//!   texts and actions, as the rollout driver's prompts do
//!   ([`embodyflow_rollout::closed_loop::history_prompt`]; `sft.windows =
//!   steps` with chunks of more than one action is then refused: the
//!   driver recalls decisions, not steps). Demonstrations that fail are
//!   dropped and counted. The loss is the token mean of `-log π(a_t | o)`
//!   over the step's tokens.
//! - SFT on a demonstrations table (`sft.demonstrations`,
//!   [`demonstrations`]): its steps rows as they are (LIBERO's imported
//!   demonstrations), checked against the checkpoint's tokenizer and chunk;
//!   refused for a checkpoint with a history, whose prompts the table's do
//!   not recall.
//! - PPO: the `steps` rows of `collect-rollouts` (`K × D` tokens, their
//!   behaviour log-probs, the `observation` bytes) joined with their
//!   advantages and temperature by [`crate::ppo_examples`]; log-probs
//!   recomputed as `log_softmax(logits / T)[a_t]` from the decoded
//!   observation ([`Vla::token_scores`]), every token in the loss.
//!
//! Every example is checked before training ([`Training::check_examples`]):
//! an observation missing, undecodable or of another shape than the
//! checkpoint's, an instruction longer than `max_instruction` or outside the
//! vocabulary, a decision of the wrong length, or a token outside
//! `0..n_bins` is bad input naming the example (trajectory and step, or
//! task and decision).
//!
//! ```text
//! update-policy --policy runs/vla --input runs/tasks --out runs/bc \
//!     --set objective=sft --set sft.demos_per_task=1 --set epochs=50
//! ```

use embodyflow_core::Error;
use embodyflow_core::schemas::TaskRow;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::net::ClosedLoop;
use embodyflow_models::policy::{Entropy, ResponseScores};
use embodyflow_models::vla::Vla;
use embodyflow_rollout::closed_loop::vla::VlaPolicy;
use embodyflow_rollout::closed_loop::{ChunkPolicy, PastDecision, action_text, history_prompt};
use embodyflow_rollout::sampling_seed;
use embodyflow_worlds::demonstrations::{DemoDecision, DemoRequest, Demonstration};
use embodyflow_worlds::{WorldTask, task_of, world_of_tasks};

use crate::config::{ExpertLabels, SftWindows};
use crate::loss::Denominators;
use crate::{Config, Example, OwnLoss, SftConfig, SftContext, SftSet, Training, kept_tasks};

pub mod decisions;
pub mod demonstrations;
pub mod thinking;

use decisions::{
    Dropped, all_dropped, decode_observations, demonstration_example, dropped_note,
    observation_rows, observation_shape, padded_chunks,
};

/// Behaviour-cloning examples (see the module doc): the scripted expert's
/// demonstration of each kept task, asked of the tasks' world
/// ([`embodyflow_worlds::World::demonstrations`]), one example per decision;
/// the notes count the demonstrations used and those dropped because they
/// failed (with the first infrastructure fault among them). When every one
/// failed there is nothing to train on: bad input saying how many and why.
pub fn sft_examples(
    policy: &Checkpoint<Vla>,
    tasks: &[TaskRow],
    sft: &SftConfig,
    seed: u64,
) -> Result<SftSet, ModelError> {
    if sft.context != SftContext::Prompt {
        return Err(Error::BadValue {
            key: "sft.context".into(),
            reason: "a VLA is trained on its own observation and instruction: only `prompt`".into(),
        }
        .into());
    }
    let history = policy.model.config().history as usize;
    if let Some(dir) = &sft.demonstrations {
        if history > 0 {
            return Err(Error::BadValue {
                key: "sft.demonstrations".into(),
                reason: format!(
                    "the demonstrations table {} holds each decision's prompt as imported; this checkpoint's prompts recall its last {history} decisions (init-policy's vla.history): clone its world's expert instead",
                    dir.display()
                ),
            }
            .into());
        }
        if sft.windows == SftWindows::Steps {
            return Err(Error::BadValue {
                key: "sft.windows".into(),
                reason: format!(
                    "`steps` windows a scripted expert's episode step by step; the demonstrations table {} holds its decisions as imported (`chunks`)",
                    dir.display()
                ),
            }
            .into());
        }
        return demonstrations::sft_examples(policy, tasks, dir, sft);
    }
    let tasks: Vec<WorldTask> = kept_tasks(tasks, sft)
        .into_iter()
        .map(task_of)
        .collect::<Result<_, _>>()?;
    let world = world_of_tasks(&tasks)?;
    let config = policy.model.config();
    let sampler = VlaPolicy::new(policy, 0.0)?;
    let bins = sampler.bins();
    // A thinking VLA's warm-up also needs every demonstration frame.
    let thinking = thinking::latent_of(policy).map(|l| l.length as usize);
    let by_step = sft.windows == SftWindows::Steps;
    if by_step && thinking.is_some() {
        return Err(Error::BadValue {
            key: "sft.windows".into(),
            reason: "a thinking VLA's warm-up targets follow its decisions: only `chunks`".into(),
        }
        .into());
    }
    if by_step && history > 0 && config.chunk_len > 1 {
        return Err(Error::BadValue {
            key: "sft.windows".into(),
            reason: format!(
                "`steps` windows start at every step; this checkpoint's prompts recall its last {history} decisions (init-policy's vla.history), one per chunk of {} actions: only `chunks`",
                config.chunk_len
            ),
        }
        .into());
    }
    let seeds: Vec<u64> = tasks
        .iter()
        .map(|t| sampling_seed(seed, &t.task_id()))
        .collect();
    let workers = sft.bridge.settings();
    let request = DemoRequest {
        observation: observation_shape(config),
        action_dim: config.action_dim as usize,
        bins: &bins,
        // Step windows: the expert's episode one step per decision, windowed below.
        chunk_len: if by_step {
            1
        } else {
            config.chunk_len as usize
        },
        noise: sft.expert_noise,
        planned_labels: sft.expert_labels == ExpertLabels::Planned,
        seeds: &seeds,
        step_frames: thinking.is_some(),
        workers: &workers,
    };
    let (k, action_dim) = (config.chunk_len as usize, config.action_dim as usize);
    let (mut futures, mut all_frames) = (Vec::new(), Vec::new());
    let (mut examples, mut dropped, mut used) = (Vec::new(), Vec::new(), 0usize);
    let mut add = |demo: Demonstration| -> Result<(), Error> {
        let prompt = sampler
            .instruction_ids(&demo.instruction)
            .map_err(|e| Error::BadInput(format!("task `{}`: {e}", demo.task_id)))?;
        if !demo.success {
            dropped.push(Dropped {
                what: format!("task `{}`", demo.task_id),
                fault: demo.failure,
            });
            return Ok(());
        }
        used += 1;
        let decisions = if by_step {
            step_windows(demo.decisions, k)
        } else {
            demo.decisions
        };
        // The decisions each prompt recalls, as the driver keeps them.
        let mut past: Vec<PastDecision> = Vec::new();
        for (i, decision) in decisions.into_iter().enumerate() {
            if let Some(length) = thinking {
                futures.push(thinking::FutureFrames {
                    example: examples.len(),
                    frames: thinking::future_frames(&demo.step_frames, i, k, length),
                });
            }
            let source = format!("task `{}` decision {i}", demo.task_id);
            // A world that observes text, a policy with a history: the
            // decision's own prompt, as the driver builds it.
            let text = decision.text.as_deref();
            let own = text.is_some() || (history > 0 && !past.is_empty());
            let observed = if own {
                let own = history_prompt(&demo.instruction, history, &past, text);
                Some(
                    sampler
                        .instruction_ids(&own)
                        .map_err(|e| Error::BadInput(format!("{source}: {e}")))?,
                )
            } else {
                None
            };
            if history > 0 {
                past.push(PastDecision {
                    text: decision.text.clone(),
                    action: action_text(&decision.tokens, action_dim, &bins),
                });
            }
            let prompt = observed.as_deref().unwrap_or(&prompt);
            examples.push(demonstration_example(
                source,
                prompt,
                &decision.tokens,
                decision.observation,
            ));
        }
        all_frames.extend(demo.step_frames);
        Ok(())
    };
    let about = world.demonstrations(&tasks, &request, &mut add)?;
    if used == 0 && !dropped.is_empty() {
        return Err(all_dropped(&dropped, &format!("of the expert ({about})")).into());
    }
    let mut notes = vec![(
        "demonstrations".to_string(),
        format!(
            "{used} successful expert demonstrations ({about}), {} decisions",
            examples.len()
        ),
    )];
    notes.push(dropped_note(&dropped));
    let mut frame_encoder = None;
    if thinking.is_some() {
        let frames: Vec<&[u8]> = all_frames.iter().map(Vec::as_slice).collect();
        let (note, fitted) =
            thinking::attach_warmup_targets(policy, &mut examples, &futures, &frames, seed)?;
        notes.push(("latent targets".to_string(), note));
        frame_encoder = fitted;
    }
    Ok(SftSet {
        examples,
        notes,
        frame_encoder,
    })
}

/// A demonstration played one step per decision, as windows of `k`
/// steps starting at every step: step `t`'s observation (and text) with the
/// tokens of steps `t .. min(t + k, T)`, so the last `k − 1` windows are
/// short and their missing steps out of the loss.
///
/// ```
/// # use embodyflow_update_policy::vla::step_windows;
/// # use embodyflow_worlds::demonstrations::DemoDecision;
/// let step = |i: u8| DemoDecision { observation: vec![i], text: None, tokens: vec![u32::from(i); 2] };
/// let windows = step_windows((0..3).map(step).collect(), 2);
/// let tokens: Vec<Vec<u32>> = windows.iter().map(|w| w.tokens.clone()).collect();
/// assert_eq!(tokens, [vec![0, 0, 1, 1], vec![1, 1, 2, 2], vec![2, 2]]);
/// assert_eq!(windows[1].observation, [1]);
/// ```
pub fn step_windows(steps: Vec<DemoDecision>, k: usize) -> Vec<DemoDecision> {
    let tokens: Vec<Vec<u32>> = (0..steps.len())
        .map(|t| {
            steps[t..(t + k).min(steps.len())]
                .iter()
                .flat_map(|s| s.tokens.iter().copied())
                .collect()
        })
        .collect();
    steps
        .into_iter()
        .zip(tokens)
        .map(|(step, tokens)| DemoDecision { tokens, ..step })
        .collect()
}

/// The VLA's training: decisions of demonstrations and rollouts, its
/// thinking losses when it thinks.
impl Training<Vla> for ClosedLoop {
    fn sft_examples(
        policy: &Checkpoint<Vla>,
        tasks: &[TaskRow],
        sft: &SftConfig,
        seed: u64,
    ) -> Result<SftSet, ModelError> {
        sft_examples(policy, tasks, sft, seed)
    }

    fn check_examples(policy: &Checkpoint<Vla>, examples: &[Example]) -> Result<(), Error> {
        let config = policy.model.config();
        let (per, d) = (
            config.n_action_tokens() as usize,
            config.action_dim as usize,
        );
        let shape = observation_shape(config);
        thinking::check_thoughts(policy, examples)?;
        for example in examples {
            let source = &example.source;
            decode_observations(&[example], &shape)?;
            let n = example.prompt.len();
            if n as i64 > config.max_instruction {
                return Err(Error::BadInput(format!(
                    "{source}: an instruction of {n} tokens, the checkpoint takes at most max_instruction = {}",
                    config.max_instruction
                )));
            }
            if let Some(&id) = example
                .prompt
                .iter()
                .find(|&&id| id < 0 || i64::from(id) >= config.vocab_size)
            {
                return Err(Error::BadInput(format!(
                    "{source}: instruction token id {id} is outside the checkpoint's vocabulary of {} tokens",
                    config.vocab_size
                )));
            }
            let len = example.response.len();
            // Rollouts hold whole chunks; a demonstration's last decision may stop early.
            let whole = !example.old_logprobs.is_empty();
            if (whole && len != per) || len == 0 || len > per || len % d != 0 {
                return Err(Error::BadInput(format!(
                    "{source}: {len} action tokens; a decision has chunk_len x action_dim = {per}{}",
                    if whole {
                        ""
                    } else {
                        " (a demonstration's last one: a multiple of action_dim)"
                    }
                )));
            }
            if let Some((position, token)) = example
                .response
                .iter()
                .enumerate()
                .find(|&(_, &t)| t < 0 || i64::from(t) >= config.n_bins)
            {
                return Err(Error::BadInput(format!(
                    "{source}: action token {token} at position {position} is outside 0..{}",
                    config.n_bins
                )));
            }
        }
        Ok(())
    }

    fn score(
        policy: &Checkpoint<Vla>,
        batch: &[&Example],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<ResponseScores, ModelError> {
        let config = policy.model.config();
        let shape = observation_shape(config);
        let (pixels, proprio) = decode_observations(batch, &shape)?;
        let rows = observation_rows(batch, &pixels, &proprio, &shape);
        // The tokens past a short decision's end are masked out.
        let per = config.n_action_tokens() as usize;
        let tokens = padded_chunks(batch, per);
        let mask: Vec<f32> = batch
            .iter()
            .flat_map(|e| (0..per).map(move |t| f32::from(u8::from(t < e.response.len()))))
            .collect();
        let chunks: Vec<&[u32]> = tokens.chunks(per).collect();
        let (logprobs, entropy) =
            policy
                .model
                .token_scores(&rows, &chunks, temperature, entropy)?;
        let mask = tch::Tensor::from_slice(&mask)
            .view([batch.len() as i64, per as i64])
            .to(policy.vars.device());
        Ok(ResponseScores {
            logprobs,
            entropy,
            mask,
        })
    }

    fn own_loss(
        policy: &Checkpoint<Vla>,
        batch: &[&Example],
        config: &Config,
        denominators: Denominators,
    ) -> Result<Option<OwnLoss>, ModelError> {
        thinking::own_loss(policy, batch, config, denominators)
    }
}

#[cfg(test)]
mod tests;
