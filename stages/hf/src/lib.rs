//! Hugging Face decoder checkpoints in tch (libtorch): a model directory as
//! transformers writes it — `config.json` and `model.safetensors` or a
//! sharded `model.safetensors.index.json` — for the Qwen2 / Qwen2.5, Qwen3
//! and Llama architectures, in f32 or bf16, loaded, run, trained and saved
//! back in the same layout, with transformers' numerics.
//!
//! - [`config`]: `config.json` resolved with transformers' defaults (both
//!   the `rope_parameters` and the older `rope_scaling` layout);
//! - [`safetensors`]: the weight files, every fault naming its file and
//!   tensor;
//! - [`chat`]: the chat template (`chat_template.jinja` or
//!   `tokenizer_config.json`) rendered with minijinja as transformers'
//!   `apply_chat_template` renders it;
//! - [`model`]: [`HfDecoder`], the decoder (RMSNorm, rotary embeddings with
//!   the config's scaling, grouped-query attention, Qwen's q/k/v biases and
//!   Qwen3's q/k norms, a SiLU-gated MLP) with a key/value cache, greedy
//!   decoding as transformers' `generate(do_sample=False)` does it, and
//!   [`HfDecoder::save`];
//! - [`vl`]: the vision-language models Qwen2.5-VL and Qwen3-VL
//!   ([`VlModel`]): their vision encoders, multimodal rotary positions and
//!   image placeholders around the same decoder;
//! - [`image`]: their image processor (`preprocessor_config.json`), the
//!   resize, normalisation and patch order of transformers';
//! - `testing` (hidden from the docs): running `scripts/hf_golden.py` and
//!   `scripts/hf_vl_golden.py`, which the tests and the benchmark share.
//!
//! The tests (`tests/golden.rs`) create tiny random models of each
//! architecture with transformers (`scripts/hf_golden.py`) and check the
//! logits, the greedy tokens and that a model trained and saved here loads in
//! transformers with the same logits.
//!
//! ```no_run
//! use embodyflow_hf::HfDecoder;
//! use tch::Tensor;
//! let model = HfDecoder::load("Qwen3-0.6B".as_ref(), tch::Device::Cpu).unwrap();
//! // Two prompts, the shorter left-padded.
//! let ids = Tensor::from_slice(&[0i64, 11, 12, 13, 14, 15]).view([2, 3]);
//! let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1]).view([2, 3]);
//! let logits = model.forward(&ids, &mask).unwrap(); // [2, 3, vocab]
//! let new_tokens = model.greedy(&ids, &mask, 16, Some(151645), 0).unwrap();
//! model.save("out/qwen3-tuned".as_ref()).unwrap();
//! ```
//!
//! The examples are not run as doctests (`doctest = false`): rustdoc links
//! them in a temporary directory that the relative rpath to
//! `.venv/libtorch/lib` does not reach.

#![deny(missing_docs)]

use std::path::PathBuf;

use embodyflow_core::{Classify, ErrorKind};

/// Chat templates: the `embodyflow-chat` crate (no libtorch; the `table`
/// tool uses it too), its errors converting into [`HfError`].
pub use embodyflow_chat as chat;
pub mod checkpointing;
pub mod config;
pub mod image;
pub mod model;
pub mod safetensors;
#[doc(hidden)]
pub mod testing;
pub mod vl;

pub use config::{HfConfig, ModelType, RopeScaling};
pub use model::{HfDecoder, HfNet, KvCache};
pub use vl::{Images, VlModel};

/// Errors of loading, running and saving a Hugging Face decoder.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// A file that cannot be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file that cannot be written.
    #[error("writing {file}: {source}")]
    Write {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `config.json` that is not valid JSON, lacks a key or has a value
    /// we cannot run.
    #[error("{file}: {reason}")]
    BadConfig {
        /// The config file.
        file: PathBuf,
        /// What was wrong, naming the key.
        reason: String,
    },
    /// A `model_type` other than the ones we implement.
    #[error("{file}: `model_type` {found:?} is not supported (supported: {supported})")]
    UnsupportedArchitecture {
        /// The config file.
        file: PathBuf,
        /// The `model_type` found.
        found: String,
        /// What the loader takes ([`ModelType::SUPPORTED`] or
        /// [`vl::VlFamily::SUPPORTED`]).
        supported: &'static str,
    },
    /// A rotary scaling type other than default, linear and llama3.
    #[error("{file}: `{key}` type {found:?} is not supported (supported: default, linear, llama3)")]
    UnsupportedRope {
        /// The config file.
        file: PathBuf,
        /// `rope_parameters` or `rope_scaling`.
        key: String,
        /// The type found.
        found: String,
    },
    /// A directory with neither `model.safetensors` nor an index.
    #[error("{dir}: no model.safetensors or model.safetensors.index.json")]
    NoWeights {
        /// The model directory.
        dir: PathBuf,
    },
    /// A safetensors file or index that cannot be parsed.
    #[error("{file}: {reason}")]
    BadWeights {
        /// The file.
        file: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A shard named in the index but absent.
    #[error("{index}: shard {shard} is listed in `weight_map` but does not exist")]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The shard file name.
        shard: String,
    },
    /// A parameter the config implies that the weights lack.
    #[error("{file}: tensor `{name}` is missing (implied by config.json's {keys})")]
    MissingTensor {
        /// The parameter name, as transformers writes it.
        name: String,
        /// The weights file (or index) searched.
        file: PathBuf,
        /// The config keys that imply it.
        keys: &'static str,
    },
    /// A parameter of another shape than the config implies.
    #[error(
        "{file}: tensor `{name}` has shape {found:?}, the config implies {expected:?} (config.json's {keys})"
    )]
    WrongShape {
        /// The parameter name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// The shape the config implies.
        expected: Vec<i64>,
        /// The stored shape.
        found: Vec<i64>,
        /// The config keys the shape follows from.
        keys: &'static str,
    },
    /// A weights path that is not a regular file (a FIFO would block the
    /// reader, a directory cannot be read).
    #[error("{file}: is {what}, not a regular file")]
    NotAFile {
        /// The path.
        file: PathBuf,
        /// What it is instead: `a FIFO`, `a directory`, …
        what: &'static str,
    },
    /// A parameter stored in a dtype we do not load.
    #[error("{file}: tensor `{name}` has dtype {dtype}, supported: F32, BF16")]
    UnsupportedDtype {
        /// The parameter name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// The stored dtype.
        dtype: String,
    },
    /// A model directory without a chat template.
    #[error("{dir}: no chat_template.jinja and no `chat_template` in tokenizer_config.json")]
    NoChatTemplate {
        /// The model directory.
        dir: PathBuf,
    },
    /// A chat template that does not compile or fails to render (its own
    /// `raise_exception` included).
    #[error("{file}: chat template: {reason}")]
    BadChatTemplate {
        /// The file holding the template.
        file: PathBuf,
        /// The engine's message.
        reason: String,
    },
    /// Token ids and mask the model cannot run, or images that do not
    /// match the prompt's placeholders.
    #[error("bad batch: {0}")]
    BadBatch(String),
    /// An image the processor configured by `file` cannot take.
    #[error("{file}: {reason}")]
    BadImage {
        /// The processor's `preprocessor_config.json`.
        file: PathBuf,
        /// What was wrong, naming the key.
        reason: String,
    },
    /// libtorch failed while running.
    #[error("torch: {0}")]
    Torch(String),
}

impl From<chat::ChatError> for HfError {
    fn from(e: chat::ChatError) -> HfError {
        use chat::ChatError;
        match e {
            ChatError::Read { file, source } => HfError::Read { file, source },
            ChatError::BadConfig { file, reason } => HfError::BadConfig { file, reason },
            ChatError::NoChatTemplate { dir } => HfError::NoChatTemplate { dir },
            ChatError::BadChatTemplate { file, reason }
            | ChatError::BadMessages { file, reason } => HfError::BadChatTemplate { file, reason },
        }
    }
}

impl Classify for HfError {
    fn kind(&self) -> ErrorKind {
        match self {
            HfError::Write { .. } | HfError::Torch(_) => ErrorKind::Failure,
            HfError::Read { .. }
            | HfError::BadConfig { .. }
            | HfError::UnsupportedArchitecture { .. }
            | HfError::UnsupportedRope { .. }
            | HfError::NoWeights { .. }
            | HfError::BadWeights { .. }
            | HfError::MissingShard { .. }
            | HfError::MissingTensor { .. }
            | HfError::WrongShape { .. }
            | HfError::NotAFile { .. }
            | HfError::UnsupportedDtype { .. }
            | HfError::NoChatTemplate { .. }
            | HfError::BadChatTemplate { .. }
            | HfError::BadBatch(_)
            | HfError::BadImage { .. } => ErrorKind::BadInput,
        }
    }
}
