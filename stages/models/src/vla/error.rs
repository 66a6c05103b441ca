//! What a VLA call refuses: [`VlaError`], one variant per way a batch or
//! an argument can be wrong, named by row, and the checks every call runs
//! on its per-row arguments.
//!
//! Every variant is bad input ([`ErrorKind::BadInput`]): the caller gave a
//! batch the config does not describe (an image of another size, a proprio
//! of another length, a token outside `0..n_bins`, a temperature below 0).
//!
//! ```
//! use embodyflow_models::vla::VlaError;
//! let error = VlaError::RowCount { what: "seeds", found: 1, batch: 2 };
//! assert_eq!(error.to_string(), "seeds: 1 given for a batch of 2 rows");
//! ```

use embodyflow_core::{Classify, ErrorKind};

/// A batch the policy cannot run, named by row.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VlaError {
    /// No rows.
    #[error("an empty batch")]
    EmptyBatch,
    /// A per-row argument whose length is not the batch's.
    #[error("{what}: {found} given for a batch of {batch} rows")]
    RowCount {
        /// The argument.
        what: &'static str,
        /// Its length.
        found: usize,
        /// Rows in the batch.
        batch: usize,
    },
    /// An image whose shape is not the config's.
    #[error(
        "row {row}: image of {height}x{width} ({bytes} bytes), the policy takes {size}x{size}x{channels}"
    )]
    ImageShape {
        /// The row.
        row: usize,
        /// Its stated height.
        height: usize,
        /// Its stated width.
        width: usize,
        /// Its bytes.
        bytes: usize,
        /// The config's `image_size`.
        size: i64,
        /// The config's `channels`.
        channels: i64,
    },
    /// A proprio vector of the wrong length or with a NaN or infinity.
    #[error("row {row}: proprio {reason}")]
    Proprio {
        /// The row.
        row: usize,
        /// What was wrong.
        reason: String,
    },
    /// An instruction too long or with a token outside the vocabulary.
    #[error("row {row}: instruction {reason}")]
    Instruction {
        /// The row.
        row: usize,
        /// What was wrong.
        reason: String,
    },
    /// A decision with the wrong number of action tokens.
    #[error("row {row}: {found} action tokens, a decision has chunk_len x action_dim = {expected}")]
    ChunkShape {
        /// The row.
        row: usize,
        /// Tokens given.
        found: usize,
        /// Tokens a decision has.
        expected: i64,
    },
    /// An action token that is not a bin.
    #[error("row {row}: action token {token} at position {position} is outside 0..{n_bins}")]
    BadActionToken {
        /// The row.
        row: usize,
        /// Position in the flattened chunk.
        position: usize,
        /// The token.
        token: u32,
        /// Bins per dimension.
        n_bins: i64,
    },
    /// A count of valid chunk steps outside `1..=chunk_len`.
    #[error("row {row}: {found} valid chunk steps, expected 1..={chunk_len}")]
    ValidSteps {
        /// The row.
        row: usize,
        /// The count given.
        found: usize,
        /// Actions per decision.
        chunk_len: i64,
    },
    /// A temperature that is negative or not finite.
    #[error("temperature {0} must be finite and at least 0")]
    Temperature(f64),
    /// A call that needs latents on a policy without them, or the reverse.
    #[error("{0}")]
    Latents(String),
    /// A batch the vision-language trunk cannot run (its image processor
    /// or its network refused it).
    #[error("the trunk: {0}")]
    Trunk(String),
    /// A row's latent chain of the wrong size or with a NaN or infinity.
    #[error("row {row}: latents {reason}")]
    LatentShape {
        /// The row.
        row: usize,
        /// What was wrong.
        reason: String,
    },
    /// A stop (candidate index) beyond the candidates.
    #[error(
        "row {row}: stop {stop} is beyond the {candidates} <latent_end> candidates (0..{candidates})"
    )]
    Stop {
        /// The row.
        row: usize,
        /// The stop given.
        stop: usize,
        /// Candidates per decision.
        candidates: i64,
    },
}

impl Classify for VlaError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::BadInput
    }
}

/// The per-row argument `what` (seeds, tokens, stops…) has one entry per
/// row of the batch.
pub(super) fn check_rows(what: &'static str, found: usize, batch: usize) -> Result<(), VlaError> {
    if found != batch {
        return Err(VlaError::RowCount { what, found, batch });
    }
    Ok(())
}

/// A sampling temperature is finite and at least 0 (0: greedy).
pub(super) fn check_temperature(temperature: f64) -> Result<(), VlaError> {
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(VlaError::Temperature(temperature));
    }
    Ok(())
}
