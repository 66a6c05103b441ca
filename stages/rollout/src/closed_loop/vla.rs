//! The VLA checkpoint ([`embodyflow_models::vla::Vla`]) as a
//! [`ChunkPolicy`], and the VLA as the [`ClosedLoopNet`] the stages run:
//! instructions through the checkpoint's tokenizer, one batched
//! [`Vla::sample`] per decision at the run's temperature (`0`: greedy),
//! row `r` drawing from `batch.seeds[r]`; the bins it decodes with are the
//! checkpoint's ([`VlaPolicy::bins`]). A checkpoint with a latent
//! chain of thought (LaST-R1) thinks first ([`Vla::sample_with_latents`],
//! exploration noise [`VlaPolicy::with_latent_noise`]; greedy: the
//! confident early exit) and each decision carries its [`Thought`].
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::vla::Vla;
//! use embodyflow_rollout::closed_loop::vla::VlaPolicy;
//! use embodyflow_rollout::closed_loop::{ClosedLoopConfig, run_closed_loop};
//! use embodyflow_tabletop::TabletopEpisodes;
//! # let tasks: Vec<embodyflow_tabletop::TaskSpec> = todo!();
//! let checkpoint = Checkpoint::<Vla>::load_kind("runs/sft/policy".as_ref(), tch::Device::Cpu).unwrap();
//! let mut policy = VlaPolicy::new(&checkpoint, 1.6).unwrap();
//! let mut world = TabletopEpisodes::new(&tasks, 8, 32).unwrap();
//! let seeds: Vec<u64> = (0..world.batch().len() as u64).collect();
//! let config = ClosedLoopConfig { max_decisions: 64, label: "rollouts" };
//! let run = run_closed_loop(&mut world, &mut policy, &policy.bins(), &seeds, &config).unwrap();
//! ```

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::ObservationShape;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::tokenizer::encode;
use embodyflow_models::vla::{Observation, Vla};

use super::net::ClosedLoopNet;
use super::{ChunkDecision, ChunkPolicy, DecisionBatch, Thought};

/// A VLA checkpoint sampling at one temperature.
pub struct VlaPolicy<'a> {
    checkpoint: &'a Checkpoint<Vla>,
    temperature: f64,
    latent_noise: f64,
    bins: ActionBins,
}

impl<'a> VlaPolicy<'a> {
    /// The checkpoint sampling at `temperature` (`0`: greedy).
    pub fn new(checkpoint: &'a Checkpoint<Vla>, temperature: f64) -> Result<Self, ModelError> {
        Ok(VlaPolicy {
            checkpoint,
            temperature,
            latent_noise: 0.0,
            bins: Vla::bins(checkpoint)?,
        })
    }

    /// Latents drawn with exploration noise of standard deviation `std`
    /// around the policy's mean (a thinking checkpoint; 0, the default:
    /// the mean itself).
    pub fn with_latent_noise(mut self, std: f64) -> Self {
        self.latent_noise = std;
        self
    }

    /// The action bins of the checkpoint's config.
    pub fn bins(&self) -> ActionBins {
        self.bins.clone()
    }
}

impl ClosedLoopNet for Vla {
    fn policy(
        checkpoint: &Checkpoint<Vla>,
        temperature: f64,
        latent_noise: f64,
    ) -> Result<impl ChunkPolicy<Error = ModelError>, ModelError> {
        Ok(VlaPolicy::new(checkpoint, temperature)?.with_latent_noise(latent_noise))
    }

    fn bins(checkpoint: &Checkpoint<Vla>) -> Result<ActionBins, ModelError> {
        let config = checkpoint.model.config();
        ActionBins::new(
            config.n_bins as usize,
            config.action_low,
            config.action_high,
        )
        .map_err(|e| ModelError::Tokenizer(format!("the checkpoint's action bins: {e}")))
    }
}

impl ChunkPolicy for VlaPolicy<'_> {
    type Error = ModelError;

    fn chunk_len(&self) -> usize {
        self.checkpoint.model.config().chunk_len as usize
    }

    fn action_dim(&self) -> usize {
        self.checkpoint.model.config().action_dim as usize
    }

    fn observation_shape(&self) -> ObservationShape {
        let config = self.checkpoint.model.config();
        ObservationShape {
            height: config.image_size as usize,
            width: config.image_size as usize,
            channels: config.channels as usize,
            proprio: config.proprio_dim as usize,
        }
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, ModelError> {
        let ids = encode(&self.checkpoint.tokenizer, instruction)?;
        let most = self.checkpoint.model.config().max_instruction;
        if ids.len() as i64 > most {
            let history = match self.history() {
                0 => String::new(),
                h => format!(" (its prompts recall the last {h} decisions: history = {h})"),
            };
            return Err(ModelError::Tokenizer(format!(
                "instruction `{instruction}` is {} tokens, the checkpoint takes at most max_instruction = {most}{history}",
                ids.len()
            )));
        }
        Ok(ids)
    }

    fn history(&self) -> usize {
        self.checkpoint.model.config().history as usize
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, ModelError> {
        let rows: Vec<Observation<'_>> = (0..batch.len())
            .map(|r| Observation {
                image: batch.frame(r),
                height: batch.shape.height,
                width: batch.shape.width,
                proprio: batch.proprio_of(r),
                instruction: batch.instructions[r],
            })
            .collect();
        let model = &self.checkpoint.model;
        if model.config().latent.is_none() {
            let decisions = model.sample(&rows, batch.seeds, self.temperature)?;
            return Ok(decisions
                .into_iter()
                .map(|d| ChunkDecision {
                    tokens: d.tokens,
                    token_logprobs: d.token_logprobs,
                    thought: None,
                })
                .collect());
        }
        let decisions =
            model.sample_with_latents(&rows, batch.seeds, self.temperature, self.latent_noise)?;
        let latent_dim = model.config().n_embd as u32;
        Ok(decisions
            .into_iter()
            .map(|d| ChunkDecision {
                tokens: d.decision.tokens,
                token_logprobs: d.decision.token_logprobs,
                thought: Some(Thought {
                    latents: d.latents,
                    latent_dim,
                    latent_len: d.latent_len as u32,
                    stop_logprob: d.stop_logprob,
                    value: d.value,
                }),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;
    use embodyflow_core::observation::decode;
    use embodyflow_models::policy::Entropy;
    use embodyflow_models::testing::{seed, tiny_tokenizer};
    use embodyflow_models::vla::{LatentConfig, VlaConfig};
    use embodyflow_tabletop::{Split, Suite, TabletopEpisodes, generate};

    fn tiny() -> Checkpoint<Vla> {
        tiny_with(None)
    }

    fn tiny_with(latent: Option<LatentConfig>) -> Checkpoint<Vla> {
        let tokenizer = tiny_tokenizer();
        let config = VlaConfig {
            vocab_size: tokenizer.get_vocab_size(true) as i64,
            max_instruction: 160,
            image_size: 32,
            patch_size: 8,
            stem_channels: 0,
            channels: 3,
            proprio_dim: 5,
            chunk_len: 4,
            action_dim: 4,
            n_bins: 256,
            action_low: -1.0,
            action_high: 1.0,
            n_embd: 32,
            n_head: 4,
            n_layer: 2,
            history: 0,
            latent,
            trunk: None,
        };
        let _generator = seed(5);
        Checkpoint::<Vla>::init_kind(&config, tokenizer, tch::Device::Cpu).unwrap()
    }

    #[test]
    fn the_vla_runs_closed_loop_and_its_stored_decisions_score_the_same_again() {
        let checkpoint = tiny();
        let mut policy = VlaPolicy::new(&checkpoint, 1.6).unwrap();
        let tasks: Vec<_> = Suite::ALL
            .iter()
            .map(|&s| generate(s, Split::Train, 3, 0))
            .collect();
        let mut world = TabletopEpisodes::new(&tasks, 2, 32).unwrap();
        let seeds: Vec<u64> = (0..8).collect();
        let config = ClosedLoopConfig {
            max_decisions: 3,
            label: "vla (test)",
        };
        let bins = policy.bins();
        let run = run_closed_loop(&mut world, &mut policy, &bins, &seeds, &config).unwrap();
        assert_eq!((run.decisions, run.env_steps), (24, 24 * 4));
        let episodes = run.episodes;
        // The update's view: every stored row, decoded from its bytes alone,
        // scores its tokens with the log-probs recorded while sampling.
        let rows: Vec<_> = episodes
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.step_rows(&format!("t{i}")))
            .collect();
        assert_eq!(rows.len(), 8 * 3);
        let decoded: Vec<_> = rows
            .iter()
            .map(|r| decode(r.observation.as_deref().unwrap()).unwrap())
            .collect();
        let observations: Vec<Observation<'_>> = decoded
            .iter()
            .zip(&rows)
            .map(|(o, r)| Observation {
                image: o.pixels,
                height: o.shape.height,
                width: o.shape.width,
                proprio: &o.proprio,
                instruction: &r.prompt_ids,
            })
            .collect();
        let tokens: Vec<Vec<u32>> = rows
            .iter()
            .map(|r| r.response_ids.iter().map(|&t| t as u32).collect())
            .collect();
        let tokens: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
        let again = tch::no_grad(|| {
            checkpoint
                .model
                .token_logprobs(&observations, &tokens, 1.6)
                .unwrap()
        });
        let again = Vec::<f32>::try_from(again.view([-1])).unwrap();
        let stored: Vec<f32> = rows.iter().flat_map(|r| r.old_logprobs.clone()).collect();
        assert_eq!(again.len(), stored.len());
        let worst = again
            .iter()
            .zip(&stored)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "largest difference {worst}");
        // Copies of a task start alike and draw differently.
        assert_eq!(
            episodes[0].decisions[0].observation,
            episodes[1].decisions[0].observation
        );
        assert_ne!(
            episodes[0].decisions[0].tokens,
            episodes[1].decisions[0].tokens
        );
    }

    #[test]
    fn an_instruction_longer_than_the_checkpoint_takes_is_refused() {
        let checkpoint = tiny();
        let policy = VlaPolicy::new(&checkpoint, 0.0).unwrap();
        let long = "put the red block in the blue bowl ".repeat(20);
        let error = policy.instruction_ids(&long).unwrap_err().to_string();
        assert!(error.contains("max_instruction = 160"), "{error}");
        // In a run: named by episode and task, bad input, nothing stepped.
        let mut tasks = vec![generate(Suite::Goal, Split::Train, 3, 0); 2];
        tasks[1].instruction = long;
        let mut world = TabletopEpisodes::new(&tasks, 2, 32).unwrap();
        let config = ClosedLoopConfig {
            max_decisions: 3,
            label: "vla (test)",
        };
        let mut policy = policy;
        let bins = policy.bins();
        let error =
            run_closed_loop(&mut world, &mut policy, &bins, &[0, 1, 2, 3], &config).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::BadInput);
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "episode 2 (task `{}`), its instruction: ",
                tasks[1].task_id()
            )) && text.contains("max_instruction = 160"),
            "{text}"
        );
        assert!((0..4).all(|i| world.batch().world(i).steps() == 0));
    }

    #[test]
    fn a_thinking_vla_stores_its_latents_stop_and_value_and_they_score_the_same_again() {
        let checkpoint = tiny_with(Some(LatentConfig {
            length: 4,
            group: 2,
        }));
        let mut policy = VlaPolicy::new(&checkpoint, 1.6)
            .unwrap()
            .with_latent_noise(0.1);
        let tasks: Vec<_> = Suite::ALL
            .iter()
            .map(|&s| generate(s, Split::Train, 3, 0))
            .collect();
        let mut world = TabletopEpisodes::new(&tasks, 2, 32).unwrap();
        let seeds: Vec<u64> = (0..8).collect();
        let config = ClosedLoopConfig {
            max_decisions: 2,
            label: "thinking vla (test)",
        };
        let bins = policy.bins();
        let run = run_closed_loop(&mut world, &mut policy, &bins, &seeds, &config).unwrap();
        let rows: Vec<_> = run
            .episodes
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.step_rows(&format!("t{i}")))
            .collect();
        assert_eq!(rows.len(), 16);
        let decoded: Vec<_> = rows
            .iter()
            .map(|r| decode(r.observation.as_deref().unwrap()).unwrap())
            .collect();
        let observations: Vec<Observation<'_>> = decoded
            .iter()
            .zip(&rows)
            .map(|(o, r)| Observation {
                image: o.pixels,
                height: o.shape.height,
                width: o.shape.width,
                proprio: &o.proprio,
                instruction: &r.prompt_ids,
            })
            .collect();
        let mut lengths = std::collections::BTreeSet::new();
        for r in &rows {
            assert_eq!(r.latent_dim, Some(32));
            assert_eq!(r.latents.as_ref().map(Vec::len), Some(4 * 32));
            lengths.insert(r.chosen_latent_len.unwrap());
            assert!(r.old_latent_end_logprob.unwrap() <= 0.0);
            assert!(r.old_value.unwrap().is_finite());
        }
        assert!(lengths.iter().all(|l| [2, 4].contains(l)), "{lengths:?}");
        let latents: Vec<&[f32]> = rows.iter().map(|r| r.latents.as_deref().unwrap()).collect();
        let stops: Vec<usize> = rows
            .iter()
            .map(|r| r.chosen_latent_len.unwrap() as usize / 2 - 1)
            .collect();
        let tokens: Vec<Vec<u32>> = rows
            .iter()
            .map(|r| r.response_ids.iter().map(|&t| t as u32).collect())
            .collect();
        let tokens: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
        let again = tch::no_grad(|| {
            checkpoint
                .model
                .latent_scores(&observations, &latents, &stops, &tokens, 1.6, Entropy::Skip)
                .unwrap()
        });
        let close = |a: &tch::Tensor, b: Vec<f32>| {
            let a = Vec::<f32>::try_from(a.view([-1])).unwrap();
            assert_eq!(a.len(), b.len());
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "largest difference {worst}");
        };
        close(
            &again.token_logprobs,
            rows.iter().flat_map(|r| r.old_logprobs.clone()).collect(),
        );
        close(
            &again.stop_logprobs,
            rows.iter()
                .map(|r| r.old_latent_end_logprob.unwrap())
                .collect(),
        );
        close(
            &again.values,
            rows.iter().map(|r| r.old_value.unwrap()).collect(),
        );
    }
}
