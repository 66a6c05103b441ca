//! Policy models in tch (libtorch). The stages that run a network
//! (collect-rollouts, teacher-logp, update-policy, evaluate) load them from
//! here, on the device `--device` names.
//!
//! - [`device`]: `--device cpu|cuda:N` to a `tch::Device`, with a clear error
//!   when CUDA is asked for and absent;
//! - [`gpt`]: a small decoder-only transformer (GPT-2 shape, pre-norm, learned
//!   positions, tied embeddings) whose `config.json` is a serde struct, with a
//!   key/value cache for decoding;
//! - [`tokenizer`]: a byte-level BPE trained on an environment's language,
//!   saved as `tokenizer.json`;
//! - [`net`]: what a network declares to the checkpoint ([`net::PolicyNet`]:
//!   its kind, how its `config.json` names it, its weights and tokenizer),
//!   implemented by each network in its own module;
//! - [`checkpoint`]: the checkpoint directory (config, safetensors weights,
//!   tokenizer, manifest) of any such network, saved atomically;
//! - [`registry`]: the networks a checkpoint can hold ([`registry::NETS`]),
//!   which one a directory holds, and loading it with consistency checks;
//! - [`generator`]: libtorch's process-wide generator, held while a
//!   network draws its initial weights;
//! - [`optimizer`]: AdamW whose moments are saved in the checkpoint, so a
//!   run of many `update-policy` calls optimises like one process;
//! - [`precision`]: bf16 training over fp32 master weights;
//! - [`policy`]: batched sampling with the cache (temperature, greedy,
//!   top-p) and the log-probs, entropies and masks the update needs;
//! - [`hf`]: a Hugging Face decoder (Qwen2, Qwen3, Llama) as a plan
//!   policy, in transformers' own directory layout;
//! - [`vl`]: a Hugging Face vision-language model (Qwen2.5-VL, Qwen3-VL)
//!   as a plan policy, in transformers' directory layout;
//! - [`prompt`]: a task's text as one user message of a chat template
//!   (with image parts for a vision-language model), and back;
//! - [`images`]: a prompt's images as a `steps.observation` and back;
//! - [`vla`]: a vision-language-action policy decoding a whole action chunk
//!   in one pass (image patches, proprio and instruction, 256-bin action
//!   tokens), stored in the same checkpoint format with `kind = "vla"`;
//! - `testing` (hidden from the docs): the one tiny policy that the tests of
//!   this crate and of the stages share.
//!
//! The models know no world: running a policy in an environment is
//! `embodyflow_rollout`'s, the crate above both.
//!
//! The examples in these docs are not run as doctests (`doctest = false`):
//! rustdoc links them in a temporary directory that the binaries' relative
//! rpath to `.venv/libtorch/lib` does not reach; the unit tests run the same code.

use std::path::PathBuf;

use embodyflow_core::{Classify, ErrorKind};

pub mod checkpoint;
/// Gradient checkpointing per block (`embodyflow_hf::checkpointing`), which
/// our small networks use too.
pub use embodyflow_hf::checkpointing;
pub mod device;
pub mod frame_encoder;
pub mod generator;
pub mod gpt;
pub mod hf;
pub mod images;
pub mod net;
pub mod optimizer;
pub mod policy;
pub mod precision;
pub mod prompt;
pub mod registry;
#[doc(hidden)]
pub mod testing;
pub mod tokenizer;
pub mod vl;
pub mod vla;

/// Errors of loading, saving and running a policy.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A checkpoint file that is missing, unreadable or disagrees with the others.
    #[error("checkpoint file {file}: {reason}")]
    BadCheckpoint {
        /// The file at fault.
        file: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A tokenizer that cannot be built, or text it cannot encode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// libtorch failed while running.
    #[error("torch: {0}")]
    Torch(String),
    /// A VLA batch the policy cannot run (named by row).
    #[error(transparent)]
    Vla(#[from] vla::error::VlaError),
    /// A Hugging Face model that cannot be loaded, run or saved.
    #[error(transparent)]
    Hf(#[from] embodyflow_hf::HfError),
    /// An error of the shared core.
    #[error(transparent)]
    Core(#[from] embodyflow_core::Error),
}

impl Classify for ModelError {
    fn kind(&self) -> ErrorKind {
        match self {
            ModelError::BadCheckpoint { .. } | ModelError::Tokenizer(_) => ErrorKind::BadInput,
            ModelError::Torch(_) => ErrorKind::Failure,
            ModelError::Vla(error) => error.kind(),
            ModelError::Hf(error) => error.kind(),
            ModelError::Core(error) => error.kind(),
        }
    }
}
