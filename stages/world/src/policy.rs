//! The policy side of the closed-loop interface: what a policy sees at one
//! decision ([`DecisionBatch`]: one row per live episode) and what it
//! answers ([`ChunkDecision`]: `K × D` action tokens with their log-probs,
//! and a thinking policy's [`Thought`]). Plain data, below the models: the
//! VLA is adapted to [`ChunkPolicy`] in the rollout crate, and a world may
//! offer a scripted policy of its own (the tabletop world's expert) without
//! linking libtorch. The rollout driver
//! (`embodyflow_rollout::closed_loop::run_closed_loop`) runs any
//! [`ChunkPolicy`] in any `ClosedLoopWorld`.
//!
//! ```
//! use embodyflow_core::observation::ObservationShape;
//! use embodyflow_world::{ChunkDecision, DecisionBatch};
//! let shape = ObservationShape { height: 1, width: 1, channels: 1, proprio: 1 };
//! let ids: [&[i32]; 2] = [&[1], &[2]];
//! let batch = DecisionBatch {
//!     shape,
//!     frames: &[10, 20],
//!     proprio: &[0.5, 1.5],
//!     instructions: &ids,
//!     episodes: &[0, 3],
//!     seeds: &[7, 8],
//!     decision: 0,
//! };
//! assert_eq!((batch.len(), batch.frame(1), batch.proprio_of(1)), (2, &[20u8][..], &[1.5f32][..]));
//! let decision = ChunkDecision { tokens: vec![255], token_logprobs: vec![0.0], thought: None };
//! assert_eq!(decision.tokens.len(), decision.token_logprobs.len());
//! ```

use embodyflow_core::Classify;
use embodyflow_core::observation::ObservationShape;

/// What a policy sees at one decision: one row per live episode.
#[derive(Clone, Copy, Debug)]
pub struct DecisionBatch<'a> {
    /// The shape of each row's observation.
    pub shape: ObservationShape,
    /// The frames, row after row (`shape.pixel_len()` bytes each).
    pub frames: &'a [u8],
    /// The proprio vectors, row after row.
    pub proprio: &'a [f32],
    /// Each row's instruction token ids.
    pub instructions: &'a [&'a [i32]],
    /// Each row's episode (its index in the world).
    pub episodes: &'a [usize],
    /// Each row's sampling seed for this decision.
    pub seeds: &'a [u64],
    /// The decision's index in the episodes (the same for every row).
    pub decision: usize,
}

impl DecisionBatch<'_> {
    /// Rows.
    pub fn len(&self) -> usize {
        self.episodes.len()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.episodes.is_empty()
    }

    /// Row `r`'s frame.
    pub fn frame(&self, r: usize) -> &[u8] {
        let len = self.shape.pixel_len();
        &self.frames[r * len..(r + 1) * len]
    }

    /// Row `r`'s proprio vector.
    pub fn proprio_of(&self, r: usize) -> &[f32] {
        let len = self.shape.proprio;
        &self.proprio[r * len..(r + 1) * len]
    }
}

/// One decision of a policy: `K × D` action tokens (bins), step after step
/// (token `t` is dimension `t % D` of action `t / D`), and the log-prob of
/// each.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkDecision {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Their log-probs (nats, under the sampling temperature).
    pub token_logprobs: Vec<f32>,
    /// What a thinking policy (LaST-R1) decided before acting; `None` for
    /// a policy without latents.
    pub thought: Option<Thought>,
}

/// A thinking policy's latent chain of thought, stop and value at one
/// decision (the `steps` columns `latents`, `latent_dim`,
/// `chosen_latent_len`, `old_latent_end_logprob`, `old_value`).
#[derive(Clone, Debug, PartialEq)]
pub struct Thought {
    /// Every latent it generated, flattened slot after slot (the chosen
    /// chain first; the rest enter the stop's softmax).
    pub latents: Vec<f32>,
    /// Width of one latent.
    pub latent_dim: u32,
    /// Latents before the chosen `<latent_end>`.
    pub latent_len: u32,
    /// Log-prob of the chosen stop (nats).
    pub stop_logprob: f32,
    /// The value head's estimate at the chosen `<latent_end>`.
    pub value: f32,
}

/// A policy that maps observations to action-token chunks.
pub trait ChunkPolicy {
    /// Its errors (bad input: e.g. an observation the checkpoint does not
    /// take; failure: the model failed).
    type Error: Classify + Send + Sync + 'static;
    /// Actions per decision, `K`.
    fn chunk_len(&self) -> usize;
    /// Dimensions of one action, `D`.
    fn action_dim(&self) -> usize;
    /// The observation shape the policy takes.
    fn observation_shape(&self) -> ObservationShape;
    /// The token ids of an instruction (the decision's `prompt_ids`).
    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Self::Error>;
    /// The earlier decisions of its episode each decision's prompt recalls
    /// (`crate::history_prompt`: their observed texts and actions); 0, the
    /// default: the prompt holds the instruction and the current text
    /// alone.
    fn history(&self) -> usize {
        0
    }
    /// One decision per row of `batch`, in row order.
    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Self::Error>;
}
