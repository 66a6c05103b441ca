//! Running a policy in its environments, the layer above both the models
//! (`embodyflow_models`, which know no world) and the environments
//! (`embodyflow_envs`): for a one-shot planner, encode each task's prompt,
//! sample the answers in batches of up to `batch_rows` sequences with the
//! key/value cache, decode and execute them. `collect-rollouts` (temperature
//! T, G samples per task) and `evaluate` (greedy) share it.
//! [`closed_loop`] runs closed-loop policies (action chunks as tokens) in
//! many episodes stepped in lockstep; [`check_mode`] checks that a tasks
//! table and a checkpoint take the same one of the two loops.
//!
//! ```no_run
//! # use embodyflow_envs::TaskEnv;
//! # use embodyflow_rollout::{run_episodes, Request};
//! # let (policy, env): (embodyflow_models::checkpoint::Checkpoint, TaskEnv) = todo!();
//! use embodyflow_models::policy::Sampling;
//! let greedy = Sampling { temperature: 0.0, top_p: 1.0, max_new_tokens: 256 };
//! let episodes = run_episodes(&policy, &[Request { env: &env, seed: 0 }], &greedy, 64, "evaluating").unwrap();
//! println!("success: {}", episodes[0].outcome.success);
//! ```

pub mod closed_loop;
mod error;

pub use error::PolicyRunError;

use std::path::Path;

use embodyflow_core::progress;
use embodyflow_core::schemas::TaskRow;
use embodyflow_envs::{Outcome, TaskEnv};

use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, PolicyKind};
use embodyflow_models::images::encode_images;
use embodyflow_models::policy::{PlanNet, Prompt, RgbImage, Sampling, sample};
use embodyflow_models::tokenizer::decode;

/// Sampling seed of one answer: BLAKE3 of the run's `--seed` and the
/// answer's id (a trajectory id), so an answer draws the same tokens whatever
/// batch it lands in.
pub fn sampling_seed(seed: u64, answer_id: &str) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.update(answer_id.as_bytes());
    let bytes = hasher.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// One answer to draw: the task and the sampling seed.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The task in its environment.
    pub env: &'a TaskEnv,
    /// Seed of this answer's sampling stream.
    pub seed: u64,
}

/// A drawn and executed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Prompt ids (ours end with `<|plan|>`; a Hugging Face model's are its
    /// chat template's, a vision-language model's with each image's
    /// placeholders expanded).
    pub prompt_ids: Vec<i32>,
    /// The images the prompt carried (the task's scene image, for a policy
    /// that reads images), as `steps.observation` bytes
    /// (`embodyflow_models::images`); `None` for a text prompt.
    pub observation: Option<Vec<u8>>,
    /// Response ids (ending with a stop id unless cut at the limit).
    pub response_ids: Vec<i32>,
    /// Log-prob of each response token under `logits / T`.
    pub logprobs: Vec<f32>,
    /// The decoded answer, special tokens left out.
    pub text: String,
    /// What executing it did.
    pub outcome: Outcome,
}

/// The prompt `policy` reads for the task of `env` given as `text` (its
/// [`TaskEnv::prompt`], or a context built around it): the text and, when
/// the task carries a scene image ([`TaskEnv::image`]), the image, which a
/// policy that reads text only goes without (the second value says whether
/// an image was left out). An image the model's processor cannot take, or
/// a text the model refuses (a vision-language model's video placeholder),
/// is bad input naming the task.
pub fn task_prompt<M: PlanNet>(
    policy: &Checkpoint<M>,
    env: &TaskEnv,
    text: &str,
) -> Result<(Prompt, bool), ModelError> {
    let task = env.task_id();
    let images: Vec<RgbImage> = env
        .image()
        .map(|image| RgbImage::new(image.height, image.width, image.rgb))
        .transpose()?
        .into_iter()
        .collect();
    let given = images.len();
    let prompt = policy
        .prompt(text, images)
        .map_err(|e| embodyflow_core::Error::BadInput(format!("task `{task}`: its prompt: {e}")))?;
    let left_out = prompt.images.len() < given;
    Ok((prompt, left_out))
}

/// Samples and executes one answer per request, in request order. Tasks
/// that carry a scene image show it to a policy that reads images; a policy
/// that reads text only answers from the text, with one warning naming the
/// first such task.
pub fn run_episodes<M: PlanNet>(
    policy: &Checkpoint<M>,
    requests: &[Request<'_>],
    sampling: &Sampling,
    batch_rows: usize,
    label: &str,
) -> Result<Vec<Episode>, ModelError> {
    let batch_rows = batch_rows.max(1);
    let n_ctx = policy.model.max_len();
    let mut prompts = Vec::with_capacity(requests.len());
    let mut without_image: Vec<&str> = Vec::new();
    for request in requests {
        let (prompt, left_out) = task_prompt(policy, request.env, &request.env.prompt())?;
        if prompt.ids.len() >= n_ctx {
            return Err(embodyflow_core::Error::BadInput(format!(
                "task `{}`: its prompt of {} tokens leaves no room for an answer in the model's context n_ctx = {n_ctx}",
                request.env.task_id(),
                prompt.ids.len()
            ))
            .into());
        }
        if left_out {
            without_image.push(request.env.task_id());
        }
        prompts.push(prompt);
    }
    if let Some(first) = without_image.first() {
        tracing::warn!(
            "{} answers to tasks with a scene image (first: task `{first}`, observation key `image_size`) are drawn without it: the {} policy reads text only",
            without_image.len(),
            M::NAME
        );
    }
    let bar = progress::bar(requests.len() as u64, label);
    let mut episodes = Vec::with_capacity(requests.len());
    for (chunk_index, chunk) in prompts.chunks(batch_rows).enumerate() {
        let first = chunk_index * batch_rows;
        let seeds: Vec<u64> = requests[first..first + chunk.len()]
            .iter()
            .map(|r| r.seed)
            .collect();
        let samples = sample(policy, chunk, &seeds, sampling);
        for (offset, (prompt, sampled)) in chunk.iter().zip(samples).enumerate() {
            let text = decode(&policy.tokenizer, &sampled.response_ids)?;
            let outcome = requests[first + offset].env.execute(&text);
            episodes.push(Episode {
                prompt_ids: prompt.ids.clone(),
                observation: encode_images(&prompt.images)?,
                response_ids: sampled.response_ids,
                logprobs: sampled.logprobs,
                text,
                outcome,
            });
        }
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(episodes)
}

/// Checks that `tasks` suit the policy in `dir` (of kind `kind`, from
/// `embodyflow_models::registry::policy_net`): all tasks one-shot with a
/// policy that answers in one go ([`run_episodes`]), or all in a
/// closed-loop world ([`embodyflow_worlds::is_closed_loop`]) with a VLA
/// ([`closed_loop::run_closed_loop`]); anything else is bad input naming a
/// task and the policy. `collect-rollouts` and `evaluate` check with it
/// before they run the loop of the network's role.
pub fn check_mode(
    tasks: &[TaskRow],
    kind: PolicyKind,
    dir: &Path,
) -> Result<(), embodyflow_core::Error> {
    use embodyflow_core::Error;
    let closed = |t: &TaskRow| embodyflow_worlds::is_closed_loop(&t.env);
    let first_closed = tasks.iter().find(|t| closed(t));
    let first_open = tasks.iter().find(|t| !closed(t));
    match (first_closed, first_open, kind.is_one_shot()) {
        (Some(c), Some(o), _) => Err(Error::BadInput(format!(
            "the tasks table mixes environments: task `{}` is env `{}` (closed loop) and task `{}` env `{}` (one-shot); a run takes one kind",
            c.task_id, c.env, o.task_id, o.env
        ))),
        (Some(_), None, false) | (None, Some(_), true) => Ok(()),
        (Some(c), None, true) => Err(Error::BadInput(format!(
            "task `{}` is env `{}`, a closed-loop world, but the policy {} is a plan policy: closed-loop tasks need a VLA checkpoint (init-policy --set kind=vla)",
            c.task_id,
            c.env,
            dir.display()
        ))),
        (None, Some(o), false) => Err(Error::BadInput(format!(
            "task `{}` is env `{}`, a one-shot environment, but the policy {} is a VLA (closed loop): it needs a plan policy",
            o.task_id,
            o.env,
            dir.display()
        ))),
        (None, None, _) => Err(Error::BadInput("no tasks: the tasks table is empty".into())),
    }
}

#[cfg(test)]
mod modes {
    use super::*;
    use embodyflow_core::{Classify, ErrorKind};

    fn row(task_id: &str, env: &str) -> TaskRow {
        TaskRow {
            task_id: task_id.into(),
            suite: env.into(),
            env: env.into(),
            split: "train".into(),
            task_type: None,
            seed: 0,
            instruction: String::new(),
            observation: None,
            gt_actions: None,
        }
    }

    #[test]
    fn tasks_and_the_policy_kind_must_agree() {
        let dir = Path::new("runs/policy");
        let tabletop = [row("t0", "tabletop"), row("t1", "tabletop")];
        let household = [row("h0", "household")];
        let mixed = [row("t0", "tabletop"), row("h0", "household")];
        check_mode(&tabletop, PolicyKind::Vla, dir).unwrap();
        check_mode(&household, PolicyKind::Plan, dir).unwrap();
        for (tasks, kind, named) in [
            (&tabletop[..], PolicyKind::Plan, ["`t0`", "plan policy"]),
            (&household[..], PolicyKind::Vla, ["`h0`", "is a VLA"]),
            (&mixed[..], PolicyKind::Vla, ["`t0`", "`h0`"]),
            (&mixed[..], PolicyKind::Plan, ["`t0`", "`h0`"]),
            (&[], PolicyKind::Plan, ["empty", "tasks"]),
        ] {
            let error = check_mode(tasks, kind, dir).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::BadInput);
            for word in named {
                assert!(error.to_string().contains(word), "{word}: {error}");
            }
        }
    }
}
