//! A vision-language-action policy (VLA) that decodes a whole action chunk
//! in one forward pass, after OpenVLA-OFT's parallel decoding: the closed-loop
//! policy of SimpleVLA-RL.
//!
//! One decision reads an observation — an image `S × S × C` (bytes,
//! row-major: `C = channels`, 3 for RGB, 6 for two RGB cameras joined along
//! the channels, as LIBERO's agent-view and wrist views), a proprio vector of `proprio_dim` floats and the instruction's
//! token ids (the checkpoint's tokenizer) — and emits `K × D` action tokens
//! (`K = chunk_len` actions of `D = action_dim` dimensions, flattened step
//! after step: token `t` is dimension `t % D` of action `t / D`), each a bin
//! of `n_bins` over `[action_low, action_high]`:
//! `embodyflow_algos::action_tokens::ActionBins` (OpenVLA's 256 bins over
//! `[-1, 1]`) turns actions into tokens and back; the model knows only bins.
//!
//! The sequence, embedded and run through the [`Gpt`] trunk's blocks:
//!
//! ```text
//! [ patch_1 … patch_P | proprio | instr_1 … instr_L | act_1 … act_{K·D} ]
//!   P = (S / p)², patch_i = W_patch · pixels(p × p × C) / 127.5 − 1
//!   proprio = W_proprio · proprio (a constant 0 when proprio_dim = 0: a
//!   world without proprio, as a text-only env),  instr_j = wte[id_j],  act_t = q (learned)
//!   every input + wpe[position];  positions: prefix 0.., actions after
//!   the longest instruction (P + 1 + max_instruction + t), whatever L is
//! logits[b, t, :] = W_head · h_L[b, act_t]          ([B, K·D, n_bins])
//! ```
//!
//! Attention (one bool mask per forward pass): the prefix (patches, proprio,
//! instruction) is bidirectional among itself, as a ViT over patches is, and
//! never sees the action placeholders, so its states do not depend on them;
//! the placeholders see the whole prefix and each other (full attention: the
//! chunk is decoded jointly, not token after token). Instruction pads are
//! never attended to, so a row's logits do not depend on the batch it is in.
//!
//! A decision's distribution is the product of its token distributions at
//! temperature `T`: `log π(a | o) = Σ_t log_softmax(logits[t] / T)[a_t]`
//! (the chunk is one decision, its log-prob the sum over its
//! tokens). Sampling draws each token by inverse CDF from one ChaCha8 stream
//! per row seeded by the row's seed (as [`crate::policy`] does), tokens in
//! order; `T = 0` is greedy (arg max, log-probs at `T = 1`). Behaviour
//! cloning is the mean cross-entropy over the action tokens of the chunk
//! steps that lie within the episode.
//!
//! Over bf16 parameters (`train.precision = "bf16"`: bf16 copies of fp32
//! master weights, [`crate::precision`]) the network runs in bf16: the
//! pixels, proprio and latent slots are cast to the parameters' dtype where
//! they enter, and the heads' outputs (action logits, `<latent_end>` logits,
//! values) and the predicted latents are upcast to f32, so every log-prob,
//! value and loss is computed in f32.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::vla::{Observation, Vla};
//! let policy = Checkpoint::<Vla>::load_kind("runs/sft/policy".as_ref(), tch::Device::Cpu).unwrap();
//! let image = vec![0u8; 32 * 32 * 3];
//! let proprio = [0.5f32, 0.1, 0.25, 0.0, 0.0];
//! let instruction = [17, 42, 9];
//! let row = Observation { image: &image, height: 32, width: 32, proprio: &proprio, instruction: &instruction };
//! let decisions = policy.model.sample(&[row, row], &[7, 8], 1.6).unwrap();
//! assert_eq!(decisions[0].tokens.len(), 8 * 4);
//! let tokens: Vec<&[u32]> = decisions.iter().map(|d| d.tokens.as_slice()).collect();
//! let logp = policy.model.decision_logprobs(&[row, row], &tokens, 1.6).unwrap(); // [2]
//! ```
//!
//! The module's parts, each above the ones it uses: the row types
//! ([`Observation`], [`Decision`]), the errors ([`VlaError`]), the config
//! ([`VlaConfig`]) and the token log-probs ([`logprobs_of`]) at the bottom;
//! the trunk's network, the latent parts, then the network itself
//! ([`Vla`]); on top what builds on it: the latent chain of thought
//! ([`latent`]) and the loader of a Hugging Face trunk ([`trunk`]).

#[cfg(doc)]
use crate::gpt::Gpt;

mod batch;
mod config;
pub(crate) mod error;
pub mod latent;
mod model;
mod scores;
pub mod trunk;

pub use batch::{Decision, Observation};
pub use config::{ActionTokens, HfTrunkConfig, LatentConfig, VlaConfig};
pub use error::VlaError;
pub use latent::{LatentDecision, LatentScores, VALUE_HEAD, WarmupConfig, WarmupLoss};
pub use model::Vla;
pub use scores::logprobs_of;
