//! The parameters a latent chain of thought adds to a [`Vla`](crate::vla::Vla)
//! (`latent_start`, `latent_end`, the `<latent_end>` stop head and the value
//! head) and the latent part of a sequence the network embeds
//! ([`LatentInput`]: the slots' inputs and what the actions see), laid out
//! and rescaled as below; the module doc of [`crate::vla::latent`] says how
//! the chain is generated, stopped and trained.
//!
//! ```text
//! [ <latent_start> z_1 … z_G <latent_end> … z_L <latent_end> ]   (L / G groups)
//!   slot i's input = z_i / ‖z_i‖ · √embd
//! ```
//!
//! ```
//! use embodyflow_models::vla::{LatentConfig, VALUE_HEAD};
//! // 8 latents in groups of 2: <latent_start>, 8 slots, 4 <latent_end>.
//! assert_eq!(LatentConfig::last_r1().positions(), 1 + 8 + 4);
//! assert_eq!(VALUE_HEAD, "value_head.");
//! ```

use tch::{Tensor, nn};

/// Name prefix of the value head's parameters (an optimiser group of its
/// own rate under LAPO).
pub const VALUE_HEAD: &str = "value_head.";

/// The parameters a latent chain adds.
#[derive(Debug)]
pub(crate) struct LatentParts {
    pub(crate) start: Tensor,
    pub(crate) end: Tensor,
    pub(crate) end_head: nn::Linear,
    pub(crate) value_head: nn::Linear,
}

impl LatentParts {
    pub(crate) fn new(path: &nn::Path, embd: i64) -> LatentParts {
        let embedding = nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        LatentParts {
            start: path.var("latent_start", &[embd], embedding),
            end: path.var("latent_end", &[embd], embedding),
            end_head: nn::linear(path / "end_head", embd, 1, Default::default()),
            value_head: nn::linear(
                path / VALUE_HEAD.trim_end_matches('.'),
                embd,
                1,
                Default::default(),
            ),
        }
    }
}

/// The latent part of a sequence to embed.
pub(crate) struct LatentInput {
    /// The slots' inputs `[batch, L, embd]`.
    pub(crate) latents: Tensor,
    /// Per row, the positions of the latent part the actions see.
    pub(crate) visible: Vec<i64>,
}
