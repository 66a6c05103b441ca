//! A network that acts step by step, as the closed-loop stages run it
//! ([`ClosedLoopNet`]): its checkpoint becomes the driver's [`ChunkPolicy`]
//! at a temperature, and its action tokens decode with its own bins.
//! `collect-rollouts` and `evaluate` are generic over it, so a closed-loop
//! family adds its implementation beside its adapter (as [`super::vla`]
//! does for the VLA) and neither stage names it; `update-policy`'s
//! behaviour cloning and losses are still the VLA's own.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_rollout::closed_loop::ChunkPolicy;
//! use embodyflow_rollout::closed_loop::net::ClosedLoopNet;
//! fn describe<M: ClosedLoopNet>(dir: &std::path::Path) -> Result<String, embodyflow_models::ModelError> {
//!     let checkpoint = Checkpoint::<M>::load_kind(dir, tch::Device::Cpu)?;
//!     let greedy = M::policy(&checkpoint, 0.0, 0.0)?;
//!     Ok(format!("{}: K = {}, {} bins", M::NAME, greedy.chunk_len(), M::bins(&checkpoint)?.n_bins()))
//! }
//! ```

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, PolicyNet};
use embodyflow_models::net::ClosedLoop;

use super::ChunkPolicy;

/// A closed-loop network's checkpoint as the stages run it.
pub trait ClosedLoopNet: PolicyNet<Role = ClosedLoop> {
    /// The checkpoint as the driver's policy, sampling at `temperature`
    /// (`0`: greedy), its latents (where it thinks before acting) drawn
    /// with exploration noise of standard deviation `latent_noise`.
    fn policy(
        checkpoint: &Checkpoint<Self>,
        temperature: f64,
        latent_noise: f64,
    ) -> Result<impl ChunkPolicy<Error = ModelError>, ModelError>;

    /// The action bins its tokens decode with (its config's); an error
    /// when the config's bins are not a range.
    fn bins(checkpoint: &Checkpoint<Self>) -> Result<ActionBins, ModelError>;
}
