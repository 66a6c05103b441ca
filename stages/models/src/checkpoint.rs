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
//! [`Checkpoint`] is generic over the network, through the interface each
//! network implements in its own module ([`PolicyNet`], in [`crate::net`],
//! re-exported here); the plan policy ([`Gpt`]) is the default:
//! `Checkpoint::load` loads a plan policy, `Checkpoint::<Vla>::load_kind` a
//! VLA. Which network a directory holds and loading it go through the
//! registry of networks ([`crate::registry`]: [`policy_net`],
//! [`policy_kind`], [`Checkpoint::load_kind`]), which checks that the files
//! agree — every tensor the config implies is in the weights with its shape
//! and nothing else is, and the tokenizer's vocabulary is the model's — and
//! names the file at fault; loading one kind as the other names the kinds.
//!
//! Saving writes a hidden sibling directory, fsyncs every file in it, and
//! commits it into place with `embodyflow_core::commit` (alone with
//! [`Checkpoint::save`], or with a stage's other outputs via
//! [`Checkpoint::save_staged`]), so a killed writer never leaves a
//! checkpoint that looks complete and an old checkpoint is never absent
//! while it is replaced. The checkpoint id is the first 16 hex digits of
//! the BLAKE3 hash of `model.safetensors`: the same weights have the same id
//! wherever they were written.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! let policy = Checkpoint::load("runs/it0/policy".as_ref(), tch::Device::Cpu).unwrap();
//! println!("{} ({} parameters)", policy.manifest.id, policy.num_parameters());
//! policy.save("runs/it1/policy".as_ref(), "update-policy", false).unwrap();
//! ```
//!
//! [`GptConfig`]: crate::gpt::GptConfig
//! [`VlaConfig`]: crate::vla::VlaConfig
//! [`policy_net`]: crate::registry::policy_net
//! [`policy_kind`]: crate::registry::policy_kind

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use embodyflow_core::commit::{Commit, Digest};
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tokenizers::Tokenizer;

use crate::ModelError;
use crate::frame_encoder::FrameEncoder;
use crate::gpt::{Gpt, GptConfig};
use crate::optimizer::OptimizerState;
use crate::tokenizer::{self, SpecialIds};

/// The network interface a checkpoint is generic over ([`crate::net`]).
pub use crate::net::{
    ConfigTag, NetSpec, PolicyKind, PolicyNet, PromptFormat, TOKENIZER_FILE, Tokens, WEIGHTS_FILE,
    own_tokens, serde_config, tagged_config,
};

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

/// The manifest file of a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

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
        let (vars, model) = built(config, device);
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

impl Checkpoint<Gpt> {
    /// A freshly initialised plan policy (random weights, seeded by `tch::manual_seed`).
    pub fn init(
        config: &GptConfig,
        tokenizer: Tokenizer,
        device: tch::Device,
    ) -> Result<Checkpoint, ModelError> {
        Checkpoint::init_kind(config, tokenizer, device)
    }
}

/// A store on `device` holding a network `M` of `config`, its initial
/// weights drawn holding libtorch's generator ([`crate::generator`]).
pub(crate) fn built<M: PolicyNet>(config: &M::Config, device: tch::Device) -> (VarStore, M) {
    let _draws = crate::generator::hold();
    let vars = VarStore::new(device);
    let model = M::build(&vars.root(), config);
    (vars, model)
}

pub(crate) fn pretty<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("plain structs serialize") + "\n"
}

pub(crate) fn io(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Core(embodyflow_core::Error::io(PathBuf::from(path), source))
}
