//! Log-prob arithmetic over action tokens, shared by the plain and the
//! thinking VLA: per-token log-probs at a temperature and masked means.
//!
//! ```text
//! log π(a_t | o) = log_softmax(logits[t] / T)[a_t]      (T = 0 reads as 1)
//! nll            = mean over the kept tokens of −log π(a_t | o) at T = 1
//! ```
//!
//! ```
//! use embodyflow_models::vla::logprobs_of;
//! use tch::{Device, Kind, Tensor};
//! // One row, two tokens, uniform over 4 bins: each token's log-prob is −ln 4.
//! let logits = Tensor::zeros([1, 2, 4], (Kind::Float, Device::Cpu));
//! let tokens = Tensor::from_slice(&[0i64, 3]).view([1, 2]);
//! let logp = logprobs_of(&logits, &tokens, 1.0);
//! assert!((logp.double_value(&[0, 1]) + 4f64.ln()).abs() < 1e-6);
//! ```

use tch::{Kind, Tensor};

/// Log-probs `[batch, K × D]` of `tokens` (int64 `[batch, K × D]`) under
/// `logits / temperature` (`logits` `[batch, K × D, n_bins]`;
/// `temperature = 0` reads as 1): the per-token terms of a decision's
/// log-prob, for token-level losses on logits already computed.
pub fn logprobs_of(logits: &Tensor, tokens: &Tensor, temperature: f64) -> Tensor {
    gather_tokens(&log_softmax_at(logits, temperature), tokens)
}

/// The mean cross-entropy of `targets` under `logits` (at `T = 1`) over
/// the tokens `mask` keeps (all when `None`).
pub(super) fn masked_nll(logits: &Tensor, targets: &Tensor, mask: Option<&Tensor>) -> Tensor {
    masked_mean(&-logprobs_of(logits, targets, 1.0), mask)
}

/// The mean of `values` over the entries `mask` keeps (all when `None`).
pub(super) fn masked_mean(values: &Tensor, mask: Option<&Tensor>) -> Tensor {
    match mask {
        None => values.mean(Kind::Float),
        Some(mask) => (values * mask).sum(Kind::Float) / mask.sum(Kind::Float),
    }
}

/// `log_probs[b, t, tokens[b, t]]`: `[batch, K × D]`.
pub(super) fn gather_tokens(log_probs: &Tensor, tokens: &Tensor) -> Tensor {
    log_probs
        .gather(2, &tokens.unsqueeze(2), false)
        .squeeze_dim(2)
}

/// `log_softmax(logits / T)` over the bins (`T = 0`: at 1, for greedy).
pub(super) fn log_softmax_at(logits: &Tensor, temperature: f64) -> Tensor {
    if temperature > 0.0 && temperature != 1.0 {
        (logits / temperature).log_softmax(-1, Kind::Float)
    } else {
        logits.log_softmax(-1, Kind::Float)
    }
}
