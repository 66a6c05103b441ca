//! Policy checkpoints: a directory with `config.json` (the architecture:
//! a [`GptConfig`] for a plan policy, a [`VlaConfig`] for a VLA, told apart
//! by its `kind` field, `"plan"` when absent as in checkpoints written before
//! the VLA),
//! `model.safetensors` (the weights, named by parameter path),
//! `tokenizer.json` (Hugging Face format), `manifest.json` (id, parent and
//! the stage that wrote it) and, when an update wrote it, the optimizer state
//! (`optimizer.safetensors`, `optimizer.json`: see [`crate::optimizer`]),
//! and for a thinking VLA its frozen frame encoder
//! (`frame_encoder.safetensors`, [`crate::frame_encoder`]).
//!
//! Loading checks that the three agree — every tensor the config implies is in
//! the weights with its shape and nothing else is, and the tokenizer's
//! vocabulary is the model's — and names the file at fault. The weights are
//! compared on their safetensors header ([`PolicyNet::open_weights`]) before
//! any parameter is allocated, so a config of 2^40 tokens or 10^9 layers is
//! an error naming the tensor and the config keys, not an abort; every file
//! loading may open must be a regular file (a FIFO is refused, not waited
//! on). Saving writes a
//! hidden sibling directory, fsyncs every file in it, and commits it into
//! place with `embodyflow_core::commit` (alone with [`Checkpoint::save`], or
//! with a stage's other outputs via [`Checkpoint::save_staged`]), so a killed
//! writer never leaves a checkpoint that looks complete and an old checkpoint
//! is never absent while it is replaced. The network type is a parameter,
//! the plan policy ([`Gpt`]) by default: `Checkpoint::load` loads a plan
//! policy, `Checkpoint::<Vla>::load_kind` a VLA, and loading one kind as the
//! other names the kinds.
//!
//! This module knows no network: each declares itself through
//! [`PolicyNet`] — its [`PolicyKind`], its name, how its `config.json` says
//! it is that network ([`ConfigTag`]: our `kind` field, or transformers'
//! `model_type`s), the files it carries, how its weights are opened, filled
//! and written — and the crate's registry [`crate::NETS`] lists one
//! [`NetSpec`] per network; [`policy_net`] and [`policy_kind`] read which
//! one a directory holds, and a `kind` or `model_type` none declares is bad
//! input naming `config.json` and the key. The checkpoint id is the first 16
//! hex digits of the BLAKE3 hash of `model.safetensors`: the same weights have
//! the same id wherever they were written.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! let policy = Checkpoint::load("runs/it0/policy".as_ref(), tch::Device::Cpu).unwrap();
//! println!("{} ({} parameters)", policy.manifest.id, policy.num_parameters());
//! policy.save("runs/it1/policy".as_ref(), "update-policy", false).unwrap();
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use embodyflow_core::commit::{Commit, Digest};
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tokenizers::Tokenizer;

use crate::ModelError;
use crate::frame_encoder::FrameEncoder;
use crate::gpt::Gpt;
#[cfg(doc)]
use crate::gpt::GptConfig;
use crate::optimizer::OptimizerState;
use crate::tokenizer::{self, SpecialIds};
#[cfg(doc)]
use crate::vla::VlaConfig;
use embodyflow_hf::chat::ChatTemplate;
use embodyflow_hf::safetensors::{Expected, Weights};

/// The `manifest.json` of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointManifest {
    /// Content id: BLAKE3 of `model.safetensors`, 16 hex digits.
    pub id: String,
    /// Id of the checkpoint this one was trained from.
    pub parent: Option<String>,
    /// The stage that wrote it.
    pub written_by: String,
    /// Optimizer updates since initialisation, over the whole lineage.
    pub updates: u64,
}

/// Which network a checkpoint holds: `config.json`'s `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// A plan policy: a [`Gpt`] writing JSON plans (the default when
    /// `kind` is absent).
    Plan,
    /// A vision-language-action policy ([`crate::vla::Vla`]).
    Vla,
    /// A plan policy that is a Hugging Face model in transformers' layout
    /// (its `config.json` has no `kind` but a `model_type`): a decoder
    /// (Qwen2, Qwen3, Llama: [`embodyflow_hf::HfNet`]) or a vision-language
    /// model (Qwen2.5-VL, Qwen3-VL: [`crate::vl::VlPolicy`]); [`policy_net`]
    /// tells which.
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
/// data: the registry [`crate::NETS`] holds one per network.
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
/// The manifest file of a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

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

/// The kind of policy checkpoint `dir` holds ([`policy_net`]'s).
pub fn policy_kind(dir: &Path) -> Result<PolicyKind, ModelError> {
    Ok(policy_net(dir)?.kind)
}

/// The network checkpoint `dir` holds, among those of [`crate::NETS`]:
/// the one whose [`ConfigTag`] `config.json` matches.
pub fn policy_net(dir: &Path) -> Result<&'static NetSpec, ModelError> {
    let path = dir.join("config.json");
    embodyflow_hf::safetensors::regular_file(&path)?;
    let (net, _) = read_config(&path)?;
    Ok(net)
}

/// The network of `object` (a `config.json` without its `kind`, `kind`
/// given apart) among the declared ones.
fn declared(
    kind: Option<&serde_json::Value>,
    object: &serde_json::Map<String, serde_json::Value>,
    path: &Path,
) -> Result<&'static NetSpec, ModelError> {
    let names = |ours: bool| -> String {
        crate::NETS
            .iter()
            .filter_map(|net| match net.tag {
                ConfigTag::Kind { name, .. } if ours => Some(format!("\"{name}\"")),
                ConfigTag::ModelTypes(types) if !ours => {
                    Some(format!("{}: {}", net.name, types.join(", ")))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(if ours { " or " } else { "; " })
    };
    let found = match (kind, object.get("model_type")) {
        (Some(kind), _) => {
            let name = kind.as_str().unwrap_or_default();
            crate::NETS
                .iter()
                .find(|net| matches!(net.tag, ConfigTag::Kind { name: n, .. } if n == name))
                .ok_or_else(|| {
                    bad(
                        path,
                        format!(
                            "kind: {kind} is no network we know (expected {})",
                            names(true)
                        ),
                    )
                })?
        }
        (None, Some(model_type)) => {
            let name = model_type.as_str().unwrap_or_default();
            crate::NETS
                .iter()
                .find(
                    |net| matches!(net.tag, ConfigTag::ModelTypes(types) if types.contains(&name)),
                )
                .ok_or_else(|| {
                    bad(
                        path,
                        format!(
                            "`model_type` {model_type} is no architecture we run (we run {})",
                            names(false)
                        ),
                    )
                })?
        }
        (None, None) => crate::NETS
            .iter()
            .find(|net| matches!(net.tag, ConfigTag::Kind { default: true, .. }))
            .expect("the registry declares a default network"),
    };
    Ok(found)
}

/// `config.json` split into the network it declares and the rest.
fn read_config(path: &Path) -> Result<(&'static NetSpec, serde_json::Value), ModelError> {
    // A stage's output directory (`--policy runs/sft`) holds the checkpoint
    // in `policy/`.
    if !path.exists()
        && let Some(dir) = path.parent()
        && dir.join("policy").join("config.json").is_file()
    {
        return Err(bad(
            dir,
            format!(
                "is no checkpoint, but this directory holds `policy/`: pass {}",
                dir.join("policy").display()
            ),
        ));
    }
    let mut value: serde_json::Value = read_json(path)?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| bad(path, "is not a JSON object"))?;
    let kind = object.remove("kind");
    let net = declared(kind.as_ref(), object, path)?;
    Ok((net, value))
}

/// A loaded policy: weights, architecture and tokenizer. `M` is the network:
/// a plan policy ([`Gpt`], the default) or a VLA ([`crate::vla::Vla`]).
pub struct Checkpoint<M: PolicyNet = Gpt> {
    /// The parameters.
    pub vars: VarStore,
    /// The network.
    pub model: M,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Its special token ids (for a Hugging Face model, which has no
    /// `<|plan|>`, `plan` is its first stop id, as `eos`: prompts come from
    /// [`Checkpoint::prompt_ids`]).
    pub special: SpecialIds,
    /// How prompts are made and answers end.
    pub format: PromptFormat,
    /// Files every checkpoint saved from this one carries unchanged.
    pub carried: BTreeMap<String, Vec<u8>>,
    /// The manifest it was loaded with (or will be saved with).
    pub manifest: CheckpointManifest,
    /// Optimizer state saved with the weights (`None` on load: the
    /// optimizer reads it with [`OptimizerState::load`]).
    pub optimizer: Option<OptimizerState>,
    /// A thinking VLA's frozen frame encoder (`frame_encoder.safetensors`):
    /// fitted once by its first warm-up, then loaded and saved with every
    /// checkpoint trained from it, so later warm-ups keep its targets.
    pub frame_encoder: Option<Arc<FrameEncoder>>,
}

/// The frozen frame encoder's file in a checkpoint directory.
pub const FRAME_ENCODER_FILE: &str = "frame_encoder.safetensors";

fn bad(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::BadCheckpoint {
        file: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(path, e.to_string()))
}

impl<M: PolicyNet> Checkpoint<M> {
    /// A freshly initialised policy of network `M` (random weights, seeded
    /// by `tch::manual_seed`).
    pub fn init_kind(
        config: &M::Config,
        tokenizer: Tokenizer,
        device: tch::Device,
    ) -> Result<Checkpoint<M>, ModelError> {
        let special = SpecialIds::of(&tokenizer).ok_or_else(|| {
            ModelError::Tokenizer("the tokenizer lacks <|pad|>, <|plan|> or <|eos|>".into())
        })?;
        let vocab = tokenizer.get_vocab_size(true) as i64;
        if vocab != M::vocab_size(config) {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer has {vocab} tokens, the model config {}",
                M::vocab_size(config)
            )));
        }
        M::check(config).map_err(ModelError::Tokenizer)?;
        let vars = VarStore::new(device);
        let model = M::build(&vars.root(), config);
        Ok(Checkpoint::fresh(vars, model, tokenizer, special))
    }

    /// A checkpoint of `model` (its parameters in `vars`) not saved yet:
    /// no id, parent or updates, our prompt format, nothing carried, no
    /// optimizer state or frame encoder.
    pub fn fresh(
        vars: VarStore,
        model: M,
        tokenizer: Tokenizer,
        special: SpecialIds,
    ) -> Checkpoint<M> {
        Checkpoint {
            vars,
            model,
            tokenizer,
            special,
            format: PromptFormat::Plan,
            carried: BTreeMap::new(),
            manifest: CheckpointManifest {
                id: String::new(),
                parent: None,
                written_by: String::new(),
                updates: 0,
            },
            optimizer: None,
            frame_encoder: None,
        }
    }

    /// Loads the checkpoint of network `M` in `dir` onto `device`, checking
    /// that its files agree and that it holds that kind.
    pub fn load_kind(dir: &Path, device: tch::Device) -> Result<Checkpoint<M>, ModelError> {
        // A run killed while committing this checkpoint is completed first.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            embodyflow_core::commit::settle(parent)?;
        }
        if !dir.is_dir() {
            return Err(bad(dir, "no such checkpoint directory"));
        }
        check_file_types(dir, M::CARRIED)?;
        let config_path = dir.join("config.json");
        let (net, value) = read_config(&config_path)?;
        if !net.is::<M>() {
            return Err(bad(
                &config_path,
                format!("holds a {} policy, expected a {} policy", net.name, M::NAME),
            ));
        }
        let mut config = M::parse_config(value).map_err(|reason| bad(&config_path, reason))?;
        M::check(&config).map_err(|reason| bad(&config_path, reason))?;
        let manifest_path = dir.join(MANIFEST_FILE);
        // A Hugging Face model as downloaded has no manifest: its id is its
        // weights', and it has no parent.
        let manifest: CheckpointManifest = if M::DOWNLOADED && !manifest_path.exists() {
            CheckpointManifest {
                id: weights_id(dir)?,
                parent: None,
                written_by: "huggingface".into(),
                updates: 0,
            }
        } else {
            read_json(&manifest_path)?
        };
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        let tokenizer = tokenizer::load(&tokenizer_path)?;
        let Tokens {
            special,
            format,
            carried,
        } = M::tokens(dir, &tokenizer, &config)?;
        // The config against the weights' headers, before anything the
        // config sizes is allocated.
        let weights = M::open_weights(dir, &mut config)?;
        let mut vars = VarStore::new(device);
        let model = M::build(&vars.root(), &config);
        model.load_weights(&mut vars, &weights)?;
        let encoder_path = dir.join(FRAME_ENCODER_FILE);
        let frame_encoder = if encoder_path.is_file() {
            let encoder =
                FrameEncoder::load(&encoder_path).map_err(|e| bad(&encoder_path, e.to_string()))?;
            Some(Arc::new(encoder))
        } else {
            None
        };
        Ok(Checkpoint {
            vars,
            model,
            tokenizer,
            special,
            format,
            carried,
            manifest,
            optimizer: None,
            frame_encoder,
        })
    }

    /// The prompt a plan policy sees for a task's `text` ([`PromptFormat`]).
    pub fn prompt_ids(&self, text: &str) -> Result<Vec<i32>, ModelError> {
        match &self.format {
            PromptFormat::Plan => {
                let mut ids = tokenizer::encode(&self.tokenizer, text)?;
                ids.push(self.special.plan);
                Ok(ids)
            }
            PromptFormat::Chat {
                template: Some(template),
                ..
            } => tokenizer::encode(
                &self.tokenizer,
                &crate::prompt::render_user(template, text, 0)?,
            ),
            PromptFormat::Chat { template: None, .. } => {
                let encoding = self
                    .tokenizer
                    .encode(text, true)
                    .map_err(|e| ModelError::Tokenizer(format!("encoding failed: {e}")))?;
                Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
            }
        }
    }

    /// The task text of a prompt [`Checkpoint::prompt_ids`] (or, with
    /// images, `Checkpoint::prompt`) made (its inverse: each run of image
    /// placeholders read as one image part); a prompt of another format is
    /// bad input.
    pub fn prompt_text(&self, ids: &[i32]) -> Result<String, ModelError> {
        match &self.format {
            PromptFormat::Plan => {
                let text = ids.strip_suffix(&[self.special.plan]).unwrap_or(ids);
                tokenizer::decode(&self.tokenizer, text)
            }
            PromptFormat::Chat { template, .. } => {
                let image = self.model.image_token();
                let mut raw: Vec<u32> = Vec::with_capacity(ids.len());
                let mut images = 0;
                for (at, &id) in ids.iter().enumerate() {
                    let placeholder = Some(id) == image;
                    if placeholder && at > 0 && ids[at - 1] == id {
                        continue;
                    }
                    images += usize::from(placeholder);
                    raw.push(id as u32);
                }
                let decoded = self
                    .tokenizer
                    .decode(&raw, template.is_none())
                    .map_err(|e| ModelError::Tokenizer(format!("decoding failed: {e}")))?;
                match template {
                    None => Ok(decoded),
                    Some(template) => crate::prompt::user_text(template, &decoded, images)?
                        .map(str::to_string)
                        .ok_or_else(|| {
                            ModelError::Tokenizer(format!(
                                "the prompt {decoded:?} is not one user message in the model's chat template"
                            ))
                        }),
                }
            }
        }
    }

    /// Whether `token` ends an answer (`<|eos|>`, or any of a Hugging Face
    /// model's end-of-turn ids).
    pub fn stops(&self, token: i32) -> bool {
        match &self.format {
            PromptFormat::Plan => token == self.special.eos,
            PromptFormat::Chat { stop, .. } => stop.contains(&token),
        }
    }

    /// Keeps the vision encoder's weights fixed, as the seeds train a
    /// vision-language model: its parameters ([`PolicyNet::vision_encoder`])
    /// stop requiring gradients, so no optimizer step changes them
    /// ([`crate::optimizer::AdamW::step`] skips them). Returns how many
    /// parameter values were frozen, `None` when the network has no vision
    /// encoder.
    pub fn freeze_vision(&self) -> Option<i64> {
        let prefix = format!("{}.", self.model.vision_encoder()?);
        let frozen = self
            .vars
            .variables()
            .into_iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, tensor)| {
                let _ = tensor.set_requires_grad(false);
                tensor.numel() as i64
            })
            .sum();
        Some(frozen)
    }

    /// Number of trainable parameters.
    pub fn num_parameters(&self) -> i64 {
        self.vars
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum()
    }

    /// Writes the checkpoint to `dir` atomically; its id becomes the hash of
    /// the weights and its parent the id it was loaded with.
    pub fn save(
        &self,
        dir: &Path,
        written_by: &str,
        overwrite: bool,
    ) -> Result<CheckpointManifest, ModelError> {
        if dir.exists() && !overwrite {
            return Err(ModelError::Core(embodyflow_core::Error::OutputExists(
                dir.to_path_buf(),
            )));
        }
        let out = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("policy");
        let (staged, manifest) = self.save_staged(out, name, written_by)?;
        let mut commit = Commit::new(out);
        commit.add(&staged, name, Digest::DirAll, overwrite)?;
        commit.apply()?;
        Ok(manifest)
    }

    /// Writes the checkpoint, every file fsynced, into a hidden staging
    /// directory of `out` for checkpoint `name`, and returns the staging
    /// directory's name (to commit as `name`, e.g. with a stage's
    /// `stage_output(.., Digest::DirAll)`) with the manifest.
    pub fn save_staged(
        &self,
        out: &Path,
        name: &str,
        written_by: &str,
    ) -> Result<(String, CheckpointManifest), ModelError> {
        std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
        embodyflow_core::commit::clean_stale(out)?;
        let staged = embodyflow_core::commit::staging_name(name);
        let staging = out.join(&staged);
        std::fs::create_dir_all(&staging).map_err(|e| io(&staging, e))?;
        let written = self.write_files(&staging, written_by);
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        Ok((staged, written?))
    }

    fn write_files(
        &self,
        staging: &Path,
        written_by: &str,
    ) -> Result<CheckpointManifest, ModelError> {
        M::write_weights(&self.vars, staging)?;
        let weights = staging.join(WEIGHTS_FILE);
        let bytes = std::fs::read(&weights).map_err(|e| io(&weights, e))?;
        let manifest = CheckpointManifest {
            id: blake3::hash(&bytes).to_hex()[..16].to_string(),
            parent: Some(self.manifest.id.clone()).filter(|id| !id.is_empty()),
            written_by: written_by.to_string(),
            updates: self.manifest.updates,
        };
        let write = |file: &str, text: String| {
            let path = staging.join(file);
            std::fs::write(&path, text).map_err(|e| io(&path, e))
        };
        write("config.json", pretty(&self.model.config_json()))?;
        write(MANIFEST_FILE, pretty(&manifest))?;
        for (name, bytes) in &self.carried {
            let path = staging.join(name);
            std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
        }
        if !self.carried.contains_key(TOKENIZER_FILE) {
            let tokenizer_path = staging.join(TOKENIZER_FILE);
            self.tokenizer.save(&tokenizer_path, false).map_err(|e| {
                ModelError::Tokenizer(format!("writing {}: {e}", tokenizer_path.display()))
            })?;
        }
        if let Some(state) = &self.optimizer {
            state.save(staging)?;
        }
        if let Some(encoder) = &self.frame_encoder {
            let path = staging.join(FRAME_ENCODER_FILE);
            encoder
                .save(&path)
                .map_err(|e| ModelError::Torch(format!("writing {}: {e}", path.display())))?;
        }
        embodyflow_core::commit::sync_tree(staging)?;
        Ok(manifest)
    }
}

fn pretty<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("plain structs serialize") + "\n"
}

fn io(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Core(embodyflow_core::Error::io(PathBuf::from(path), source))
}

/// The files a checkpoint's loader opens must be regular files where
/// present (symbolic links followed): a FIFO in their place would block the
/// stage until a writer came, a directory fail it late. Each is checked by
/// its type before anything is opened, and named.
fn check_file_types(dir: &Path, carried: &[&str]) -> Result<(), ModelError> {
    let names = [
        "config.json",
        MANIFEST_FILE,
        WEIGHTS_FILE,
        TOKENIZER_FILE,
        embodyflow_hf::safetensors::INDEX,
        FRAME_ENCODER_FILE,
        crate::optimizer::WEIGHTS_FILE,
        crate::optimizer::META_FILE,
    ]
    .into_iter()
    .chain(carried.iter().copied());
    for name in names {
        embodyflow_hf::safetensors::regular_file(&dir.join(name))?;
    }
    Ok(())
}

/// The id of a checkpoint without a manifest: the first 16 hex digits of
/// the BLAKE3 hash of its weight files (`model*.safetensors`, by name).
fn weights_id(dir: &Path) -> Result<String, ModelError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad(dir, "no model*.safetensors weights"));
    }
    let mut hasher = blake3::Hasher::new();
    for file in &files {
        // A shard's name may be any `model*.safetensors`: its type is
        // checked here, before it is opened.
        embodyflow_hf::safetensors::regular_file(file)?;
        let mut reader = std::fs::File::open(file).map_err(|e| io(file, e))?;
        std::io::copy(&mut reader, &mut hasher).map_err(|e| io(file, e))?;
    }
    Ok(hasher.finalize().to_hex()[..16].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::GptConfig;
    use crate::testing::{tiny_config, tiny_tokenizer as tokenizer};

    /// The shared tiny shape (2 layers, width 32) with a context of 16 tokens.
    fn config(vocab_size: i64) -> GptConfig {
        tiny_config(vocab_size, 16)
    }

    #[test]
    fn save_load_round_trips_and_ids_follow_the_weights() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        let path = dir.path().join("ckpt");
        let manifest = policy.save(&path, "test", false).unwrap();
        assert_eq!(manifest.id.len(), 16);
        assert!(
            policy.save(&path, "test", false).is_err(),
            "refuses to overwrite"
        );
        let loaded = Checkpoint::load(&path, tch::Device::Cpu).unwrap();
        assert_eq!(loaded.manifest, manifest);
        let again = loaded
            .save(&dir.path().join("copy"), "test", false)
            .unwrap();
        assert_eq!(again.id, manifest.id, "same weights, same id");
        assert_eq!(again.parent.as_deref(), Some(manifest.id.as_str()));
        let ids = tch::Tensor::from_slice(&[3i64, 4, 5]).view([1, 3]);
        let diff = (policy.model.forward(&ids) - loaded.model.forward(&ids))
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(diff, 0.0);
    }

    #[test]
    fn a_stage_output_directory_points_to_its_policy() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        policy
            .save(&dir.path().join("policy"), "test", false)
            .unwrap();
        let expected = format!(
            "this directory holds `policy/`: pass {}",
            dir.path().join("policy").display()
        );
        let err = Checkpoint::load(dir.path(), tch::Device::Cpu)
            .err()
            .expect("not a checkpoint");
        assert!(err.to_string().contains(&expected), "{err}");
        let err = policy_kind(dir.path()).unwrap_err();
        assert!(err.to_string().contains(&expected), "{err}");
    }

    #[test]
    fn a_config_without_kind_is_a_plan_policy_and_kinds_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        let path = dir.path().join("ckpt");
        policy.save(&path, "test", false).unwrap();
        let written = std::fs::read_to_string(path.join("config.json")).unwrap();
        assert!(written.contains("\"kind\": \"plan\""), "{written}");
        assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Plan);
        // A checkpoint written before the VLA: the bare GptConfig.
        std::fs::write(path.join("config.json"), pretty(&config(vocab))).unwrap();
        assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Plan);
        let loaded = Checkpoint::load(&path, tch::Device::Cpu).unwrap();
        assert_eq!(loaded.model.config(), &config(vocab));
        // Another kind, or none we know, is named.
        let vla = written.replace("\"kind\": \"plan\"", "\"kind\": \"vla\"");
        std::fs::write(path.join("config.json"), vla).unwrap();
        assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Vla);
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("config.json") && error.contains("holds a vla policy, expected a plan"),
            "{error}"
        );
        let odd = written.replace("\"kind\": \"plan\"", "\"kind\": \"diffusion\"");
        std::fs::write(path.join("config.json"), odd).unwrap();
        let error = policy_kind(&path).err().unwrap().to_string();
        assert!(
            error.contains("config.json") && error.contains("diffusion"),
            "{error}"
        );
    }

    /// A fresh tiny policy saved as `dir/ckpt`: its path and vocabulary.
    fn saved(dir: &Path) -> (PathBuf, i64) {
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        let path = dir.join("ckpt");
        policy.save(&path, "test", false).unwrap();
        (path, vocab)
    }

    /// The message of loading `path`, which must fail as bad input.
    fn bad_input(path: &Path) -> String {
        let error = Checkpoint::load(path, tch::Device::Cpu).err().unwrap();
        assert_eq!(
            embodyflow_core::Classify::kind(&error),
            embodyflow_core::ErrorKind::BadInput,
            "{error}"
        );
        error.to_string()
    }

    #[test]
    fn mismatched_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (path, vocab) = saved(dir.path());

        // A config whose width disagrees with the weights.
        let mut wider = config(vocab);
        wider.n_embd *= 2;
        std::fs::write(path.join("config.json"), pretty(&wider)).unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("model.safetensors") && error.contains("shape"),
            "{error}"
        );

        // A config whose vocabulary disagrees with the tokenizer.
        std::fs::write(path.join("config.json"), pretty(&config(vocab + 5))).unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("tokenizer.json") && error.contains("vocab_size"),
            "{error}"
        );

        // An extra layer in the config: the weights lack its tensors.
        let mut deeper = config(vocab);
        deeper.n_layer += 1;
        std::fs::write(path.join("config.json"), pretty(&deeper)).unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("tensor `h.2.ln_1.weight` is missing") && error.contains("n_layer"),
            "{error}"
        );

        std::fs::write(path.join("config.json"), "{\"vocab_size\": 3}").unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("config.json"), "{error}");
    }

    /// Sizes no weights hold in a saved policy's config.json are refused on
    /// the weights' header, naming the tensor, the file and the keys,
    /// before any parameter is allocated (allocating them aborted the
    /// process); a vocabulary of 2^40 is the tokenizer's mismatch.
    #[test]
    fn absurd_sizes_in_config_json_are_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let (path, vocab) = saved(dir.path());
        let cases: [(&str, i64, &str); 5] = [
            ("n_layer", 1_000_000_000, "`h.2.ln_1.weight` is missing"),
            ("n_embd", 1 << 31, "`wte.weight` has shape"),
            ("n_ctx", 1 << 40, "`wpe.weight` has shape"),
            ("vocab_size", 1 << 40, "tokenizer.json"),
            ("n_embd", 1 << 62, "4 n_embd overflows"),
        ];
        for (key, value, needle) in cases {
            let mut written = serde_json::to_value(config(vocab)).unwrap();
            written[key] = serde_json::Value::from(value);
            std::fs::write(path.join("config.json"), written.to_string()).unwrap();
            let error = bad_input(&path);
            assert!(
                error.contains(needle) && error.contains(key),
                "{key}: {error}"
            );
        }
    }

    /// A FIFO or a directory in place of a checkpoint file is refused by its
    /// type before anything opens it (opening the FIFO blocked the stage
    /// until a writer came; the directory failed late, as an I/O error).
    #[test]
    fn a_fifo_or_a_directory_in_place_of_a_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = saved(dir.path());
        for name in [WEIGHTS_FILE, "config.json", TOKENIZER_FILE] {
            let file = path.join(name);
            let kept = std::fs::read(&file).unwrap();
            std::fs::remove_file(&file).unwrap();
            let made = std::process::Command::new("mkfifo")
                .arg(&file)
                .status()
                .unwrap();
            assert!(made.success());
            let error = bad_input(&path);
            assert!(
                error.contains(name) && error.contains("is a FIFO"),
                "{error}"
            );
            std::fs::remove_file(&file).unwrap();
            std::fs::create_dir(&file).unwrap();
            let error = bad_input(&path);
            assert!(
                error.contains(name) && error.contains("is a directory"),
                "{error}"
            );
            std::fs::remove_dir(&file).unwrap();
            std::fs::write(&file, kept).unwrap();
        }
        Checkpoint::load(&path, tch::Device::Cpu).unwrap();
    }
}
