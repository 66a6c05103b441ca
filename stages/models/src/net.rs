//! What a network declares to the checkpoint loader: the [`PolicyNet`]
//! interface — its [`PolicyKind`], its name, how its `config.json` says it
//! is that network ([`ConfigTag`]: our `kind` field, or transformers'
//! `model_type`s), the files it carries, how its weights are opened, filled
//! and written, and what its tokenizer gives ([`Tokens`]: the special ids
//! and the [`PromptFormat`]). Each network implements it in its own module
//! (`crate::gpt`, `crate::vla`, `crate::hf`, `crate::vl`); the checkpoint
//! ([`crate::checkpoint`]) is generic over it, and the registry
//! ([`crate::registry`]) lists one [`NetSpec`] per network. This module
//! names no network.
//!
//! The provided methods are our own layout: a `kind`-tagged `config.json`
//! ([`tagged_config`], [`serde_config`]), one `model.safetensors` named by
//! parameter path and compared on its safetensors header against every
//! tensor the config implies before any parameter is allocated
//! ([`PolicyNet::open_weights`]: a config of 2^40 tokens or 10^9 layers is
//! an error naming the tensor and the config keys, not an abort), and a
//! tokenizer with `<|pad|>`, `<|plan|>` and `<|eos|>` ([`own_tokens`]).
//!
//! ```no_run
//! use embodyflow_models::net::{NetSpec, PolicyKind};
//! use embodyflow_models::vla::Vla;
//! let vla = NetSpec::of::<Vla>();
//! assert_eq!((vla.kind, vla.name), (PolicyKind::Vla, "vla"));
//! assert!(!vla.kind.is_one_shot());
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use embodyflow_hf::chat::ChatTemplate;
use embodyflow_hf::safetensors::{Expected, Weights};
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tokenizers::Tokenizer;

use crate::ModelError;
use crate::tokenizer::SpecialIds;

/// Which network a checkpoint holds: `config.json`'s `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// A plan policy: a [`Gpt`](crate::gpt::Gpt) writing JSON plans (the
    /// default when `kind` is absent).
    Plan,
    /// A vision-language-action policy ([`crate::vla::Vla`]).
    Vla,
    /// A plan policy that is a Hugging Face model in transformers' layout
    /// (its `config.json` has no `kind` but a `model_type`): a decoder
    /// (Qwen2, Qwen3, Llama: [`embodyflow_hf::HfNet`]) or a vision-language
    /// model (Qwen2.5-VL, Qwen3-VL: [`crate::vl::VlPolicy`]);
    /// [`policy_net`](crate::registry::policy_net) tells which.
    Hf,
}

impl PolicyKind {
    /// Whether the policy answers a task in one go (a plan policy, ours or
    /// a Hugging Face decoder) rather than acting step by step (a VLA).
    pub fn is_one_shot(self) -> bool {
        matches!(self, PolicyKind::Plan | PolicyKind::Hf)
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PolicyKind::Plan => "plan",
            PolicyKind::Vla => "vla",
            PolicyKind::Hf => "hugging face",
        })
    }
}

/// How a network acts, as a type ([`PolicyNet::Role`]): a stage's work
/// that differs by role is written once per role, generic over every
/// network of it, so a new network of a role changes no stage.
/// [`Plans`] answers a task in one go; [`ClosedLoop`] acts step by step.
pub trait Role: 'static {
    /// Whether networks of this role answer a task in one go
    /// ([`PolicyKind::is_one_shot`] of each).
    const ONE_SHOT: bool;
}

/// The role of a network that writes a whole answer (a plan) in one go:
/// ours, a Hugging Face decoder or vision-language model; each implements
/// [`PlanNet`](crate::policy::PlanNet).
pub enum Plans {}

impl Role for Plans {
    const ONE_SHOT: bool = true;
}

/// The role of a network that acts step by step in a closed loop (a VLA).
pub enum ClosedLoop {}

impl Role for ClosedLoop {
    const ONE_SHOT: bool = false;
}

/// How a network's `config.json` says it holds that network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigTag {
    /// Ours: `kind` is `name`; with `default`, also a config with neither
    /// `kind` nor `model_type` (checkpoints written before `kind` existed).
    Kind {
        /// The `kind` value.
        name: &'static str,
        /// Whether a config without `kind` is this network.
        default: bool,
    },
    /// transformers': no `kind`, and `model_type` one of these.
    ModelTypes(&'static [&'static str]),
}

/// What a network declares to the loader (its [`PolicyNet`] constants), as
/// data: the registry [`crate::registry::NETS`] holds one per network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetSpec {
    /// What the stages run it as.
    pub kind: PolicyKind,
    /// Its name in messages (`plan`, `vla`, `hugging face`, …).
    pub name: &'static str,
    /// How `config.json` names it.
    pub tag: ConfigTag,
}

impl NetSpec {
    /// The declaration of network `M`.
    pub const fn of<M: PolicyNet>() -> NetSpec {
        NetSpec {
            kind: M::KIND,
            name: M::NAME,
            tag: M::TAG,
        }
    }

    /// Whether this is network `M`'s declaration.
    pub fn is<M: PolicyNet>(&self) -> bool {
        *self == NetSpec::of::<M>()
    }
}

/// A network a checkpoint can hold: its architecture is `config.json`.
/// The provided methods are our own layout (a `kind`-tagged config, one
/// `model.safetensors` named by parameter path, a tokenizer with
/// `<|pad|>`, `<|plan|>` and `<|eos|>`); a Hugging Face model overrides
/// them with transformers' (`crate::hf`, `crate::vl`).
pub trait PolicyNet: Sized {
    /// The architecture (`config.json` without `kind`).
    type Config;
    /// How it acts ([`Plans`] or [`ClosedLoop`]): what the stages' generic
    /// code is chosen by (a test checks it against [`PolicyNet::KIND`]).
    type Role: Role;
    /// What the stages run it as.
    const KIND: PolicyKind;
    /// Its name in messages ([`NetSpec::name`]).
    const NAME: &'static str;
    /// How its `config.json` names it ([`ConfigTag`]).
    const TAG: ConfigTag;
    /// Files besides the config, weights, tokenizer, manifest and optimizer
    /// state that loading may read (each checked to be a regular file
    /// first).
    const CARRIED: &'static [&'static str] = &[];
    /// Whether a directory without `manifest.json` is this network as
    /// downloaded (its id the hash of its weight files, no parent).
    const DOWNLOADED: bool = false;
    /// The architecture from `config.json` (`value`, without `kind`; our
    /// networks: [`serde_config`]).
    fn parse_config(value: serde_json::Value) -> Result<Self::Config, String>;
    /// `config.json` as written (our networks: [`tagged_config`]).
    fn config_json(&self) -> serde_json::Value;
    /// Every parameter the architecture has, by name and shape, with the
    /// config keys each follows from, lazily (a config of 10^9 layers is
    /// walked only as far as the weights go).
    fn tensors(config: &Self::Config) -> Box<dyn Iterator<Item = Expected> + '_>;
    /// The weights of checkpoint `dir`, checked against every tensor
    /// `config` implies on the file headers alone, before any parameter is
    /// allocated: a `vocab_size` of 2^40 or an `n_layer` of 10^9 is an error
    /// naming the tensor, the file and the keys. Ours: `model.safetensors`
    /// holding exactly the architecture's tensors, named by parameter path.
    /// A network whose parameter names depend on the files (a Hugging Face
    /// model's layout) settles them in `config`.
    fn open_weights(dir: &Path, config: &mut Self::Config) -> Result<Weights, ModelError> {
        let path = dir.join(WEIGHTS_FILE);
        let weights = Weights::open_file(&path)?;
        weights.check(Self::tensors(config))?;
        // The walk above matched every tensor to one in the file: the set
        // is no larger than the file's.
        let expected: BTreeSet<String> = Self::tensors(config).map(|e| e.name).collect();
        if let Some(extra) = weights.names().find(|name| !expected.contains(*name)) {
            return Err(bad(
                &path,
                format!(
                    "holds tensor `{extra}` that the architecture in config.json does not have"
                ),
            ));
        }
        Ok(weights)
    }
    /// Fills the parameters in `vars` (built by [`PolicyNet::build`]) from
    /// `weights` ([`PolicyNet::open_weights`]).
    fn load_weights(&self, vars: &mut VarStore, weights: &Weights) -> Result<(), ModelError> {
        Ok(weights.fill(vars, Self::tensors(self.config()))?)
    }
    /// Writes the parameters as `staging/model.safetensors`.
    fn write_weights(vars: &VarStore, staging: &Path) -> Result<(), ModelError> {
        let weights = staging.join(WEIGHTS_FILE);
        vars.save(&weights)
            .map_err(|e| ModelError::Torch(format!("writing {}: {e}", weights.display())))
    }
    /// The special ids and the prompt format of the tokenizer loaded from
    /// `dir`, after checking that its vocabulary is the network's. Ours:
    /// `<|pad|>`, `<|plan|>` and `<|eos|>` in a vocabulary of exactly
    /// `vocab_size` tokens, [`PromptFormat::Plan`]; the files to carry into
    /// every checkpoint trained from it (none).
    fn tokens(
        dir: &Path,
        tokenizer: &Tokenizer,
        config: &Self::Config,
    ) -> Result<Tokens, ModelError> {
        own_tokens(dir, tokenizer, Self::vocab_size(config))
    }
    /// Why `config` describes no network, if it does not.
    fn check(config: &Self::Config) -> Result<(), String>;
    /// The tokenizer vocabulary the network embeds.
    fn vocab_size(config: &Self::Config) -> i64;
    /// Creates the parameters under `path`.
    fn build(path: &tch::nn::Path, config: &Self::Config) -> Self;
    /// The architecture.
    fn config(&self) -> &Self::Config;
    /// The token that stands for an image in a prompt (a vision-language
    /// model's `image_token_id`); `None`: the network reads text only.
    fn image_token(&self) -> Option<i32> {
        None
    }
    /// The name prefix of the vision encoder's parameters (they are named
    /// `prefix.…`), which [`Checkpoint::freeze_vision`] freezes; `None`:
    /// the network has no vision encoder.
    ///
    /// [`Checkpoint::freeze_vision`]: crate::checkpoint::Checkpoint::freeze_vision
    fn vision_encoder(&self) -> Option<&'static str> {
        None
    }
}

/// [`PolicyNet::tokens`] of our networks: `<|pad|>`, `<|plan|>` and
/// `<|eos|>` in a vocabulary of exactly `vocab_size` tokens,
/// [`PromptFormat::Plan`], nothing carried.
pub fn own_tokens(
    dir: &Path,
    tokenizer: &Tokenizer,
    vocab_size: i64,
) -> Result<Tokens, ModelError> {
    let tokenizer_path = dir.join(TOKENIZER_FILE);
    let vocab = tokenizer.get_vocab_size(true) as i64;
    if vocab != vocab_size {
        return Err(bad(
            &tokenizer_path,
            format!(
                "the tokenizer has {vocab} tokens but config.json says vocab_size {vocab_size}"
            ),
        ));
    }
    let special = SpecialIds::of(tokenizer)
        .ok_or_else(|| bad(&tokenizer_path, "lacks <|pad|>, <|plan|> or <|eos|>"))?;
    Ok(Tokens {
        special,
        format: PromptFormat::Plan,
        carried: BTreeMap::new(),
    })
}

/// `config.json` as written: the kind, then the architecture's fields.
#[derive(Serialize)]
struct Tagged<'a, C> {
    kind: PolicyKind,
    #[serde(flatten)]
    config: &'a C,
}

/// [`PolicyNet::parse_config`] of our networks: the config's serde fields.
pub fn serde_config<C: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<C, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// [`PolicyNet::config_json`] of our networks: `kind`, then the config's
/// serde fields.
pub fn tagged_config<C: Serialize>(kind: PolicyKind, config: &C) -> serde_json::Value {
    serde_json::to_value(Tagged { kind, config }).expect("plain structs serialize")
}

/// The weights file of a checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The tokenizer file of a checkpoint directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// How a plan policy's prompt is made from a task's text, and where its
/// answer ends.
#[derive(Debug, Clone)]
pub enum PromptFormat {
    /// Ours: the text's tokens, then `<|plan|>`; answers end with `<|eos|>`.
    Plan,
    /// A Hugging Face model's: the chat template's rendering of one user
    /// message with the generation prompt (transformers'
    /// `apply_chat_template(add_generation_prompt=True)`), tokenised without
    /// adding special tokens; or, for a model without a template, the text
    /// as `tokenizer(text)` encodes it. Answers end with any of `stop`
    /// (`generation_config.json`'s `eos_token_id`, one id or a list).
    Chat {
        /// The template (`None`: a base model's plain text).
        template: Option<Arc<ChatTemplate>>,
        /// The ids that end an answer; the first is [`SpecialIds::eos`].
        stop: Vec<i32>,
    },
}

/// What [`PolicyNet::tokens`] reads from a checkpoint's tokenizer files.
pub struct Tokens {
    /// The special ids.
    pub special: SpecialIds,
    /// The prompt format.
    pub format: PromptFormat,
    /// Files (name, bytes) that every checkpoint saved from this one carries
    /// unchanged (a Hugging Face model's tokenizer and generation files).
    pub carried: BTreeMap<String, Vec<u8>>,
}

/// A checkpoint file at fault.
pub(crate) fn bad(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::BadCheckpoint {
        file: path.to_path_buf(),
        reason: reason.into(),
    }
}
