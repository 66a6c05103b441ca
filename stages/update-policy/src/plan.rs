//! How the plan policies train ([`Training`] for the [`Plans`] role): our
//! [`Gpt`](embodyflow_models::gpt::Gpt), a Hugging Face decoder
//! ([`HfNet`](embodyflow_models::hf::HfNet), full fine-tuning, its prompts
//! from its chat template) and vision-language model
//! ([`VlPolicy`](embodyflow_models::vl::VlPolicy), each prompt with the
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
use embodyflow_models::images::decode_images;
use embodyflow_models::net::Plans;
use embodyflow_models::policy::{Entropy, PlanNet, ResponseScores, RgbImage, score_responses};

use crate::config::SftConfig;
use crate::examples::{Example, SftSet, check_vocabulary, sft_examples};
use crate::train::Training;

/// Every plan network trains alike (full fine-tuning): ours, a Hugging
/// Face decoder (its prompts from its chat template) and a
/// vision-language model (each prompt with the images its steps row
/// recorded, `steps.observation`), and any network a later family adds
/// under the [`Plans`] role.
impl<M: PlanNet> Training<M> for Plans {
    fn sft_examples(
        policy: &Checkpoint<M>,
        tasks: &[TaskRow],
        sft: &SftConfig,
        _seed: u64,
    ) -> Result<SftSet, ModelError> {
        plan_sft_set(policy, tasks, sft)
    }

    fn check_examples(policy: &Checkpoint<M>, examples: &[Example]) -> Result<(), Error> {
        check_plan_examples(policy, examples)
    }

    fn score(
        policy: &Checkpoint<M>,
        batch: &[&Example],
        temperature: f64,
        entropy: Entropy,
    ) -> Result<ResponseScores, ModelError> {
        score_plan_examples(policy, batch, temperature, entropy)
    }
}

/// [`Training::sft_examples`] of a plan policy.
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

/// [`Training::check_examples`] of a plan policy: ids in its vocabulary,
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

/// [`Training::score`] of a plan policy ([`score_responses`]).
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use embodyflow_models::checkpoint::PolicyNet;
    use embodyflow_models::images::encode_images;
    use embodyflow_models::optimizer::OptimizerState;
    use embodyflow_models::precision::MasterWeights;
    use embodyflow_models::testing::{stored_dtypes, tiny_image as image, write_tiny_vl_policy};
    use embodyflow_models::vl::VlPolicy;
    use tch::Kind;

    use super::*;
    use crate::config::{Config, OptimConfig, Precision, TrainConfig};
    use crate::examples::ObservationBytes;
    use crate::train::train;

    fn load(dir: &Path) -> Checkpoint<VlPolicy> {
        Checkpoint::<VlPolicy>::load_kind(dir, tch::Device::Cpu).unwrap()
    }

    /// Three prompts, each with its own scene image, and two answers to
    /// each, whose old log-probs are the bf16 policy's (each example scored
    /// alone) and whose advantages are of both signs.
    fn examples(policy: &mut Checkpoint<VlPolicy>) -> Vec<Example> {
        let master = MasterWeights::new(&mut policy.vars);
        let mut examples = Vec::new();
        for (g, text) in ["find a Mug 3", "put the apple", "pick up the Mug"]
            .iter()
            .enumerate()
        {
            let prompt = policy.prompt(text, vec![image(g as u32 + 1)]).unwrap();
            for sample in 0..2 {
                let n = 3 + g + 2 * sample;
                let mut response: Vec<i32> = (0..n as i32 - 1)
                    .map(|t| 20 + 7 * t + sample as i32)
                    .collect();
                response.push(policy.special.eos);
                let old = tch::no_grad(|| {
                    score_responses(
                        &*policy,
                        &[(prompt.ids.as_slice(), prompt.images.as_slice())],
                        &[&response],
                        1.0,
                        Entropy::Skip,
                    )
                    .logprobs
                });
                examples.push(Example {
                    source: format!("prompt {g} sample {sample}"),
                    prompt: prompt.ids.clone(),
                    response,
                    old_logprobs: Vec::<f32>::try_from(old.view([-1])).unwrap(),
                    advantages: (0..n)
                        .map(|t| sample as f32 - 0.5 + 0.1 * t as f32)
                        .collect(),
                    temperature: 1.0,
                    observation: encode_images(&prompt.images)
                        .unwrap()
                        .map(ObservationBytes::Held),
                    thought: None,
                    response_mask: None,
                });
            }
        }
        master.finish(&mut policy.vars);
        examples
    }

    /// PPO on `examples` from a fresh AdamW, without a KL reference.
    fn ppo(
        policy: &mut Checkpoint<VlPolicy>,
        examples: &[Example],
        config: &Config,
    ) -> crate::train::TrainReport {
        train(
            policy,
            None,
            examples,
            config,
            0,
            OptimizerState::fresh("ppo"),
        )
        .unwrap()
    }

    fn max_difference(a: &Checkpoint<VlPolicy>, b: &Checkpoint<VlPolicy>, prefix: &str) -> f64 {
        let b = b.vars.variables();
        a.vars
            .variables()
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, t)| (t - &b[name]).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    /// A response holding the policy's image and video placeholders (a
    /// random policy samples them) trains: the scorer reads them as text,
    /// as decoding did, so on old log-probs the policy recorded the first
    /// step starts at ratio 1 (the scorer took an image placeholder in a
    /// response for an image slot and the pass panicked).
    #[test]
    fn responses_holding_sampled_placeholders_train_from_ratio_one() {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_vl_policy(dir.path(), "qwen2_5_vl");
        let mut policy = load(dir.path());
        let mut examples = examples(&mut policy);
        let image = policy.model.image_token().unwrap();
        let video = policy.model.video_token().unwrap();
        for (example, token) in examples.iter_mut().zip([image, video, image, video]) {
            example.response.insert(1, token);
            example.advantages.insert(1, 0.5);
            let images = example_images(example).unwrap();
            let old = tch::no_grad(|| {
                score_responses(
                    &policy,
                    &[(example.prompt.as_slice(), images.as_slice())],
                    &[&example.response],
                    1.0,
                    Entropy::Skip,
                )
                .logprobs
            });
            example.old_logprobs = Vec::<f32>::try_from(old.view([-1])).unwrap();
        }
        examples.truncate(4);
        let config = Config {
            mini_batch: 4,
            micro_batch: 2,
            ..Default::default()
        };
        let report = ppo(&mut policy, &examples, &config);
        let kl = report.metrics[0].approx_kl.unwrap();
        assert!(kl.abs() < 1e-5, "approx_kl {kl}");
    }

    /// `train.precision = "bf16"` on a Qwen2.5-VL and a Qwen3-VL planner,
    /// each prompt with its scene image, the vision encoder trained and
    /// frozen: on old log-probs the bf16 policy recorded, the first step's
    /// ratio is exactly 1 (approx_kl and clipfrac 0); three steps stay
    /// within 2e-2 of the fp32 run's losses and weights, as on a text
    /// decoder; a frozen vision encoder's weights are the model's to the
    /// bit (a trained one moves); the weights are f32 again and saved as F32.
    #[test]
    fn bf16_trains_a_vision_language_planner_over_fp32_master_weights() {
        for family in ["qwen2_5_vl", "qwen3_vl"] {
            let dir = tempfile::tempdir().unwrap();
            write_tiny_vl_policy(dir.path(), family);
            let initial = load(dir.path());
            let examples = examples(&mut load(dir.path()));
            let visual = format!("{}.", initial.model.vision_encoder().unwrap());
            for freeze in [false, true] {
                let run = |precision| {
                    let mut policy = load(dir.path());
                    if freeze {
                        assert!(policy.freeze_vision().unwrap() > 0);
                    }
                    let config = Config {
                        epochs: 3,
                        mini_batch: examples.len(),
                        micro_batch: examples.len(),
                        optim: OptimConfig {
                            lr: 1e-3,
                            ..Default::default()
                        },
                        train: TrainConfig {
                            precision,
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let report = ppo(&mut policy, &examples, &config);
                    (policy, report)
                };
                let (bf16, bf16_report) = run(Precision::Bf16);
                let (fp32, fp32_report) = run(Precision::Fp32);
                let at = format!("{family}, freeze_vision {freeze}");
                let first = &bf16_report.metrics[0];
                assert_eq!(first.approx_kl, Some(0.0), "{at}: {first:?}");
                assert_eq!(first.clipfrac, Some(0.0), "{at}: {first:?}");
                for (name, var) in bf16.vars.variables() {
                    assert_eq!(var.kind(), Kind::Float, "{at}: {name}");
                }
                for (a, b) in bf16_report.metrics.iter().zip(&fp32_report.metrics) {
                    assert!((a.loss - b.loss).abs() < 2e-2, "{at}\n{a:?}\n{b:?}");
                }
                let moved = max_difference(&fp32, &initial, "");
                let apart = max_difference(&bf16, &fp32, "");
                assert!(
                    moved > 1e-3 && apart < 2e-2,
                    "{at}: moved {moved}, bf16 vs fp32 {apart}"
                );
                let vision_moved = max_difference(&bf16, &initial, &visual);
                assert_eq!(
                    vision_moved == 0.0,
                    freeze,
                    "{at}: vision moved {vision_moved}"
                );
                let out = tempfile::tempdir().unwrap();
                let saved = out.path().join("policy");
                bf16.save(&saved, "update-policy", false).unwrap();
                let dtypes = stored_dtypes(&saved.join("model.safetensors"));
                assert!(!dtypes.is_empty());
                for (name, dtype) in dtypes {
                    assert_eq!(dtype, "F32", "{at}: {name}");
                }
            }
        }
    }
}
