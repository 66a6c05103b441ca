//! The plan policies as [`Trainable`] networks: our [`Gpt`], a Hugging
//! Face decoder ([`HfNet`], full fine-tuning, its prompts from its chat
//! template) and vision-language model ([`VlPolicy`], each prompt with the
//! images its steps row recorded). Their SFT examples are the tasks' expert answers
//! ([`crate::sft_examples`]); an example is checked against the vocabulary
//! and the context (`prompt + response <= n_ctx`), and a micro-batch is
//! scored by [`score_responses`]: per-token log-probs of each response
//! under `logits / T`, each distinct prompt encoded once.
//!
//! ```text
//! prompt ids ... <|plan|> | response ids ... <eos>   ->   logprobs [B, T], mask [B, T]
//! ```

use embodyflow_core::Error;
use embodyflow_core::schemas::TaskRow;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::gpt::Gpt;
use embodyflow_models::hf::HfNet;
use embodyflow_models::images::decode_images;
use embodyflow_models::policy::{Entropy, PlanNet, ResponseScores, RgbImage, score_responses};
use embodyflow_models::vl::VlPolicy;

use crate::config::SftConfig;
use crate::examples::{Example, SftSet, check_vocabulary, sft_examples};
use crate::train::Trainable;

/// The plan policies train alike (full fine-tuning): our [`Gpt`], a
/// Hugging Face decoder (its prompts from its chat template) and a
/// vision-language model (each prompt with the images its steps row
/// recorded, `steps.observation`).
macro_rules! plan_trainable {
    ($($net:ty),*) => {$(
        impl Trainable for $net {
            fn sft_examples(
                policy: &Checkpoint<$net>,
                tasks: &[TaskRow],
                sft: &SftConfig,
                _seed: u64,
            ) -> Result<SftSet, ModelError> {
                plan_sft_set(policy, tasks, sft)
            }

            fn check_examples(
                policy: &Checkpoint<$net>,
                examples: &[Example],
            ) -> Result<(), Error> {
                check_plan_examples(policy, examples)
            }

            fn score(
                policy: &Checkpoint<$net>,
                batch: &[&Example],
                temperature: f64,
                entropy: Entropy,
            ) -> Result<ResponseScores, ModelError> {
                score_plan_examples(policy, batch, temperature, entropy)
            }
        }
    )*};
}

plan_trainable!(Gpt, HfNet, VlPolicy);

/// [`Trainable::sft_examples`] of a plan policy.
fn plan_sft_set<M: PlanNet>(
    policy: &Checkpoint<M>,
    tasks: &[TaskRow],
    sft: &SftConfig,
) -> Result<SftSet, ModelError> {
    if sft.demonstrations.is_some() {
        return Err(Error::BadValue {
            key: "sft.demonstrations".into(),
            reason: "a demonstrations table holds a VLA's decisions; a plan policy trains on the tasks' expert answers".into(),
        }
        .into());
    }
    Ok(SftSet {
        examples: sft_examples(policy, tasks, sft)?,
        notes: Vec::new(),
        frame_encoder: None,
    })
}

/// The images an example's prompt carries (none for a text prompt).
fn example_images(example: &Example) -> Result<Vec<RgbImage>, Error> {
    example.observation().map_or(Ok(Vec::new()), decode_images)
}

/// [`Trainable::check_examples`] of a plan policy: ids in its vocabulary,
/// each image placeholder run matching an image of the example
/// (`steps.observation`) the policy reads, prompt + response within its
/// context.
fn check_plan_examples<M: PlanNet>(
    policy: &Checkpoint<M>,
    examples: &[Example],
) -> Result<(), Error> {
    check_vocabulary(examples, M::vocab_size(policy.model.config()))?;
    for example in examples {
        let images = example_images(example)
            .map_err(|e| Error::BadInput(format!("{}: {e}", example.source)))?;
        policy
            .model
            .check_images(&example.prompt, &images)
            .map_err(|e| Error::BadInput(format!("{}: {e}", example.source)))?;
    }
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
) -> Result<ResponseScores, ModelError> {
    let images = batch
        .iter()
        .map(|e| example_images(e))
        .collect::<Result<Vec<_>, _>>()?;
    let prompts: Vec<(&[i32], &[RgbImage])> = batch
        .iter()
        .zip(&images)
        .map(|(e, images)| (e.prompt.as_slice(), images.as_slice()))
        .collect();
    let responses: Vec<&[i32]> = batch.iter().map(|e| e.response.as_slice()).collect();
    Ok(score_responses(
        policy,
        &prompts,
        &responses,
        temperature,
        entropy,
    ))
}
