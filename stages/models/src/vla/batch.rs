//! One row of a VLA batch: the [`Observation`] the policy reads at a
//! decision and the [`Decision`] it emits (`K × D` action tokens, their
//! log-probs and their sum, the decision's log-prob `log π(a | o) = Σ_t
//! log π(a_t | o)`).
//!
//! ```
//! use embodyflow_models::vla::Observation;
//! let image = vec![0u8; 32 * 32 * 3];
//! let row = Observation { image: &image, height: 32, width: 32, proprio: &[0.5; 5], instruction: &[17, 42] };
//! assert_eq!(row.image.len(), row.height * row.width * 3);
//! ```

/// One row of a batch: what the policy sees at a decision.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// RGB bytes, `height × width × 3`, row-major.
    pub image: &'a [u8],
    /// Image height in pixels.
    pub height: usize,
    /// Image width in pixels.
    pub width: usize,
    /// The proprio vector.
    pub proprio: &'a [f32],
    /// The instruction's token ids.
    pub instruction: &'a [i32],
}

/// One sampled decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The `K × D` action tokens (bins), step after step.
    pub tokens: Vec<u32>,
    /// Log-prob of each token under `logits / T` (`T = 1` when greedy).
    pub token_logprobs: Vec<f32>,
    /// The decision's log-prob: the sum of its tokens'.
    pub logprob: f32,
}
