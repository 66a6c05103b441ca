//! `init-policy`: a fresh policy checkpoint for an environment — a byte-level
//! BPE tokenizer trained on the prompts and expert answers of generated
//! training tasks (`tokenizer.*`), and randomly initialised weights of the
//! architecture in `model.*` (seeded by `--seed`). Its `vocab_size` is the
//! tokenizer's, so the two always agree. `tokenizer.from = CKPT` reuses a
//! checkpoint's tokenizer instead (a teacher for `teacher-logp` must share
//! the policy's).
//!
//! The default model (4 layers, width 96, 4 heads, context 640: about
//! 0.58 M parameters with the household tokenizer) is sized for the
//! household demo on a CPU.
//!
//! `kind = "vla"` writes a vision-language-action policy for the tabletop
//! world instead ([`embodyflow_models::vla::Vla`], `config.json` with
//! `"kind": "vla"`): its architecture is `vla.*` (defaults
//! `VlaConfig::small`: 32 × 32 images in 8 × 8 patches, chunks of 8
//! actions, 256 bins, width 128, 4 heads, 4 layers), the proprio length and
//! action size are the tabletop world's (`PROPRIO_DIM`, `ACTION_DIM`) and
//! the action bins span the world's `[-1, 1]`. Its tokenizer is trained on
//! the instructions of `tokenizer.corpus_tasks` generated tabletop train
//! tasks (all four suites in turn), and every one of them must fit in
//! `vla.max_instruction` tokens.
//!
//! With `--input TASKS` (a tasks table, e.g. `generate-tasks --set env=gym`),
//! the VLA is for those tasks' world instead: the frame size, proprio
//! length and action size are the world's (`embodyflow_worlds::policy_shape`:
//! the tabletop world's, or what the Gymnasium bridge's adapter reports,
//! so `vla.image_size` applies to the tabletop world only), a discrete
//! action space fixes the bins (`n + 1` over `[-1, 1]`, one per action),
//! and the tokenizer is trained on the tasks' instructions. In a world that
//! observes text it is also trained on the prompts of
//! `tokenizer.probe_episodes` probe episodes (random chunks of actions;
//! each decision's instruction, newline and observed text:
//! [`embodyflow_worlds::probe_prompts`]), so an observation's words become
//! tokens rather than one token per character, and `vla.max_instruction`,
//! which counts the tokens of a decision's whole prompt, must hold the
//! longest probe prompt (`bridge.*`: the workers that play them).
//!
//! `vla.history = H` makes every prompt of the VLA recall its episode's
//! last `H` decisions, each one's observed text and action, in
//! verl-agent's history prompt (`embodyflow_world::history_prompt`; a
//! world without text recalls the actions alone). It is stored in the
//! checkpoint's config, so collect-rollouts, evaluate and update-policy's
//! behaviour cloning build the same prompts. The probe episodes then run in
//! any world (the actions as the world's bins, else `vla.n_bins` over
//! `[-1, 1]`) and their prompts carry the recalled decisions: a
//! `vla.max_instruction` too small for the longest is refused naming both
//! keys, and `vla.history > 0` needs `tokenizer.probe_episodes >= 1`.
//!
//! `vla.trunk = "hf:DIR"` puts the VLA on the vision-language model in
//! DIR (Qwen2.5-VL or Qwen3-VL in transformers' layout, with
//! `preprocessor_config.json` and `tokenizer.json`) instead of our small
//! transformer ([`embodyflow_models::vla::trunk`]): its weights, tokenizer,
//! width and layers are the model's (`vla.n_embd`, `vla.n_head`,
//! `vla.n_layer`, `tokenizer.vocab_size` and `tokenizer.from` are not
//! read; the corpus instructions must fit in its tokens), the frames go through
//! its vision encoder, `vla.action_tokens = vocab` reads the action bins
//! as its last `vla.n_bins` vocabulary ids (OpenVLA) and
//! `vla.freeze_vision` keeps the vision encoder's weights fixed.
//!
//! ```text
//! init-policy --out runs/init --seed 0 --set model.n_layer=4 --set tokenizer.vocab_size=1024
//! init-policy --out runs/vla --seed 0 --set kind=vla --set vla.n_layer=4 --set tokenizer.vocab_size=512
//! init-policy --out runs/vla-qwen --seed 0 --set kind=vla --set vla.trunk=hf:Qwen2.5-VL-3B-Instruct --set vla.action_tokens=vocab --set vla.freeze_vision=true
//! init-policy --out runs/babyai-vla --input data/babyai-train --seed 0 --set kind=vla --set vla.patch_size=1 --set vla.chunk_len=1
//! ```

use std::path::Path;

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::Error;
use embodyflow_core::cli::StageArgs;
use embodyflow_core::commit::{Commit, Digest};
use embodyflow_core::config::{ConfigKeys, at_least, ensure, keys_of};
use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{TableName, TaskRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, CheckpointManifest, PolicyKind};
use embodyflow_models::gpt::GptConfig;
use embodyflow_models::tokenizer::{encode, load, train_bpe};
use embodyflow_models::vla::trunk::init_on_vlm;
use embodyflow_models::vla::{ActionTokens, LatentConfig, Vla, VlaConfig};
use embodyflow_worlds::{
    BridgeKeys, PolicyShape, Probe, WorldOptions, WorldTask, WorldsError, default_world,
    policy_shape, probe_prompts, task_of,
};
use serde::{Deserialize, Serialize};

/// Command line of `init-policy`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::INIT_POLICY.name,
    version,
    about = spec::INIT_POLICY.purpose,
    after_help = spec::INIT_POLICY.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
}

/// `model.*`: the architecture (the vocabulary comes from the tokenizer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Longest prompt + response, in tokens.
    pub n_ctx: i64,
    /// Model width.
    pub n_embd: i64,
    /// Attention heads.
    pub n_head: i64,
    /// Transformer blocks.
    pub n_layer: i64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            n_ctx: 640,
            n_embd: 96,
            n_head: 4,
            n_layer: 4,
        }
    }
}

/// `tokenizer.*`: the BPE training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct TokenizerConfig {
    /// Tokens in the vocabulary, special tokens included.
    pub vocab_size: usize,
    /// Generated training tasks whose texts train the tokenizer (household
    /// prompts and answers; tabletop instructions for kind = vla).
    pub corpus_tasks: usize,
    /// Reuse this tokenizer.json (or a checkpoint holding one) instead of
    /// training one, as a teacher that must share the policy's tokenizer
    /// does.
    pub from: Option<std::path::PathBuf>,
    /// --input tasks of a world that observes text: probe episodes (one per
    /// task, the first ones) whose prompts (instruction, newline, observed
    /// text) train the tokenizer and bound vla.max_instruction; 0:
    /// instructions only, the text counted as one token per character.
    pub probe_episodes: usize,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        TokenizerConfig {
            vocab_size: 1024,
            corpus_tasks: 2000,
            from: None,
            probe_episodes: 32,
        }
    }
}

/// `vla.*`: the VLA's architecture and prompt (`kind = "vla"`; the vocabulary comes
/// from the tokenizer, the proprio length and action size from the tabletop
/// world, the bins span `[-1, 1]`). Each field's doc comment is its key's
/// meaning (`--help`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct VlaKeys {
    /// Most prompt tokens: the instruction, and in a world that observes
    /// text a newline and the text; every corpus instruction and probe
    /// prompt must fit (kind = vla).
    pub max_instruction: i64,
    /// Side of the square RGB image in pixels (kind = vla).
    pub image_size: i64,
    /// Side of a square image patch, divides vla.image_size (kind = vla).
    pub patch_size: i64,
    /// Channels of a convolutional stem (two 3 x 3 convolutions) before
    /// the patches are cut, 0 = none: the patches are the pixels (kind =
    /// vla, small trunk).
    pub stem_channels: i64,
    /// Actions per decision, K (kind = vla).
    pub chunk_len: i64,
    /// Bins per action dimension over [-1, 1] (kind = vla).
    pub n_bins: i64,
    /// VLA width (kind = vla).
    pub n_embd: i64,
    /// VLA attention heads (kind = vla).
    pub n_head: i64,
    /// VLA transformer blocks (kind = vla).
    pub n_layer: i64,
    /// Latents of LaST-R1's chain of thought before the actions, 0 = none
    /// (kind = vla).
    pub latent_length: i64,
    /// Latents per `<latent_end>` stop candidate, divides vla.latent_length
    /// (kind = vla).
    pub latent_group: i64,
    /// Small (our transformer, vla.n_embd / n_head / n_layer) or hf:DIR, a
    /// Qwen2.5-VL / Qwen3-VL directory whose weights, tokenizer and width
    /// the VLA takes (kind = vla).
    pub trunk: String,
    /// With an hf: trunk, the action logits from a separate head (head) or
    /// the model's last vla.n_bins vocabulary ids (vocab, as OpenVLA)
    /// (kind = vla).
    pub action_tokens: ActionTokens,
    /// With an hf: trunk, keep the vision encoder's weights fixed (kind =
    /// vla).
    pub freeze_vision: bool,
    /// Earlier decisions of the episode each prompt recalls, H: their
    /// observed texts and actions (verl-agent's history prompt), 0 = none;
    /// the probe prompts carry them, so vla.max_instruction must hold the
    /// longest (kind = vla).
    pub history: i64,
}

impl Default for VlaKeys {
    fn default() -> Self {
        let small = VlaConfig::small(1);
        VlaKeys {
            max_instruction: small.max_instruction,
            image_size: small.image_size,
            patch_size: small.patch_size,
            stem_channels: small.stem_channels,
            chunk_len: small.chunk_len,
            n_bins: small.n_bins,
            n_embd: small.n_embd,
            n_head: small.n_head,
            n_layer: small.n_layer,
            latent_length: 0,
            latent_group: 2,
            trunk: "small".into(),
            action_tokens: ActionTokens::Head,
            freeze_vision: false,
            history: small.history,
        }
    }
}

impl VlaKeys {
    /// The VLA's config for a tokenizer of `vocab_size` tokens and a world
    /// of `shape` (its frames, proprio and actions; its bins where it fixes
    /// them, else `vla.n_bins` over `[-1, 1]`).
    fn config(&self, vocab_size: i64, shape: &PolicyShape) -> Result<VlaConfig, Error> {
        let observation = &shape.observation;
        if observation.height != observation.width
            || observation.channels == 0
            || observation.channels % 3 != 0
        {
            return Err(Error::BadInput(format!(
                "the world's frames are {}x{}x{}: a VLA takes square frames of RGB images (3 channels per camera)",
                observation.height, observation.width, observation.channels
            )));
        }
        let image_size = observation.height as i64;
        // An hf: trunk's patches are its processor's, over the resized frame.
        let own_patches = self.hf_dir().is_none() && image_size > 0;
        if self.patch_size < 1 || (own_patches && image_size % self.patch_size != 0) {
            return Err(Error::BadValue {
                key: "vla.patch_size".into(),
                reason: format!(
                    "must divide the world's frame size {image_size} (found {})",
                    self.patch_size
                ),
            });
        }
        let (n_bins, action_low, action_high) = match &shape.bins {
            Some(bins) => (bins.n_bins() as i64, bins.low(), bins.high()),
            None => (self.n_bins, -1.0, 1.0),
        };
        Ok(VlaConfig {
            vocab_size,
            max_instruction: self.max_instruction,
            image_size,
            patch_size: self.patch_size,
            channels: observation.channels as i64,
            stem_channels: self.stem_channels,
            proprio_dim: observation.proprio as i64,
            chunk_len: self.chunk_len,
            action_dim: shape.action_dim as i64,
            n_bins,
            action_low,
            action_high,
            history: self.history,
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_layer: self.n_layer,
            latent: (self.latent_length > 0).then(|| LatentConfig {
                length: self.latent_length,
                group: self.latent_group,
            }),
            trunk: None,
        })
    }

    /// The model directory of an `hf:` trunk.
    fn hf_dir(&self) -> Option<&Path> {
        self.trunk.strip_prefix("hf:").map(Path::new)
    }

    fn validate(&self) -> embodyflow_core::Result<()> {
        ensure(
            self.trunk == "small"
                || self
                    .hf_dir()
                    .is_some_and(|dir| dir.join("config.json").is_file()),
            "vla.trunk",
            "small or hf:DIR, DIR a Qwen2.5-VL / Qwen3-VL directory holding config.json",
            &self.trunk,
        )?;
        at_least("vla.max_instruction", self.max_instruction, 1)?;
        at_least("vla.history", self.history, 0)?;
        let world = default_world();
        if let Some(sizes) = world.frame_sizes() {
            let (min, max) = (*sizes.start(), *sizes.end());
            ensure(
                (min as i64..=max as i64).contains(&self.image_size),
                "vla.image_size",
                format!(
                    "a frame size the {} world renders, {min}..={max}",
                    world.env()
                ),
                self.image_size,
            )?;
        }
        ensure(
            self.patch_size >= 1 && self.image_size % self.patch_size == 0,
            "vla.patch_size",
            format!("a positive divisor of vla.image_size = {}", self.image_size),
            self.patch_size,
        )?;
        at_least("vla.stem_channels", self.stem_channels, 0)?;
        ensure(
            self.stem_channels == 0 || self.trunk == "small",
            "vla.stem_channels",
            "0 with an hf: trunk (its vision encoder sees the frames)",
            self.stem_channels,
        )?;
        at_least("vla.chunk_len", self.chunk_len, 1)?;
        at_least("vla.n_bins", self.n_bins, 2)?;
        at_least("vla.n_head", self.n_head, 1)?;
        at_least("vla.n_layer", self.n_layer, 1)?;
        at_least("vla.latent_length", self.latent_length, 0)?;
        ensure(
            self.latent_group >= 1 && self.latent_length % self.latent_group == 0,
            "vla.latent_group",
            format!(
                "a positive divisor of vla.latent_length = {}",
                self.latent_length
            ),
            self.latent_group,
        )?;
        ensure(
            self.n_embd >= 1 && self.n_embd % self.n_head == 0,
            "vla.n_embd",
            format!("a positive multiple of vla.n_head = {}", self.n_head),
            self.n_embd,
        )
    }
}

/// The tool's config. Each field's doc comment is its key's meaning
/// (`--help`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Plan (a plan policy, model.*) or vla (a VLA, vla.*: for the tabletop
    /// world, or for the world of the --input tasks).
    pub kind: Kind,
    /// Architecture of a plan policy.
    #[keys(section)]
    pub model: ModelConfig,
    /// Architecture of a VLA.
    #[keys(section)]
    pub vla: VlaKeys,
    /// Tokenizer.
    #[keys(section)]
    pub tokenizer: TokenizerConfig,
    /// The gym bridge's workers that probe an `--input` world (its shape,
    /// the probe episodes).
    #[keys(section)]
    pub bridge: BridgeKeys,
    /// Unused (no tables are written); present for the uniform `output.*` keys.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        keys_of::<Config>()
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> embodyflow_core::Result<()> {
        if self.kind == Kind::Vla {
            self.vla.validate()?;
            ensure(
                self.vla.history == 0 || self.tokenizer.probe_episodes > 0,
                "tokenizer.probe_episodes",
                format!(
                    "at least 1 with vla.history = {} (the probe episodes' prompts, which recall earlier decisions, bound vla.max_instruction)",
                    self.vla.history
                ),
                self.tokenizer.probe_episodes,
            )?;
        }
        self.bridge.validate("")?;
        let model = &self.model;
        at_least("model.n_ctx", model.n_ctx, 1)?;
        at_least("model.n_head", model.n_head, 1)?;
        at_least("model.n_layer", model.n_layer, 1)?;
        ensure(
            model.n_embd >= 1 && model.n_embd % model.n_head == 0,
            "model.n_embd",
            format!("a positive multiple of model.n_head = {}", model.n_head),
            model.n_embd,
        )?;
        if self.tokenizer.from.is_none() {
            ensure(
                self.tokenizer.vocab_size >= MIN_VOCAB,
                "tokenizer.vocab_size",
                format!(
                    "at least {MIN_VOCAB} (the 3 special tokens and the 256 byte symbols of a byte-level BPE)"
                ),
                self.tokenizer.vocab_size,
            )?;
            at_least("tokenizer.corpus_tasks", self.tokenizer.corpus_tasks, 1)?;
        }
        Ok(())
    }
}

/// `kind`: which network `init-policy` writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A plan policy (`model.*`).
    #[default]
    Plan,
    /// A VLA for the tabletop world (`vla.*`).
    Vla,
}

/// The smallest vocabulary a byte-level BPE has: 3 special tokens and 256 bytes.
const MIN_VOCAB: usize = 3 + 256;

/// Runs the tool: writes the checkpoint to `--out`.
pub fn run(args: Args) -> Result<(), ModelError> {
    let stage = Stage::<Config>::start(&spec::INIT_POLICY, env!("CARGO_PKG_VERSION"), &args.stage)?;
    let config = &stage.config;
    let out = &args.stage.out;
    if out.exists() && !args.stage.overwrite {
        return Err(Error::OutputExists(out.clone()).into());
    }
    let input = stage.optional_input(TableName::Tasks)?;
    let world = match config.kind {
        Kind::Plan => None,
        Kind::Vla => Some(vla_world(config, input, args.stage.seed)?),
    };
    let corpus = match &world {
        Some((_, instructions, prompts)) => instructions.iter().chain(prompts).cloned().collect(),
        None => embodyflow_envs::corpus(config.tokenizer.corpus_tasks, args.stage.seed),
    };
    let trunk_dir = match config.kind {
        Kind::Vla => config.vla.hf_dir(),
        Kind::Plan => None,
    };
    let (tokenizer, origin) = match (trunk_dir, &config.tokenizer.from) {
        (Some(dir), _) => {
            let file = dir.join("tokenizer.json");
            (load(&file)?, format!("the trunk's, {}", file.display()))
        }
        (None, Some(path)) => {
            let file = if path.is_dir() {
                path.join("tokenizer.json")
            } else {
                path.clone()
            };
            (load(&file)?, format!("reused from {}", file.display()))
        }
        (None, None) => {
            let tokenizer = train_bpe(&corpus, config.tokenizer.vocab_size)?;
            (tokenizer, format!("trained on {} texts", corpus.len()))
        }
    };
    let vocab_size = tokenizer.get_vocab_size(true) as i64;
    tch::manual_seed(args.stage.seed as i64);
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    let mut prompt_lengths = None;
    let (architecture, parameters, staged) = match config.kind {
        Kind::Plan => {
            let model = &config.model;
            let gpt = GptConfig {
                vocab_size,
                n_ctx: model.n_ctx,
                n_embd: model.n_embd,
                n_head: model.n_head,
                n_layer: model.n_layer,
            };
            let policy = Checkpoint::init(&gpt, tokenizer, device)?;
            let staged = stage_checkpoint(&policy, out)?;
            (format!("{gpt:?}"), policy.num_parameters(), staged)
        }
        Kind::Vla => {
            let (shape, _, prompts) = world.as_ref().expect("a VLA's world");
            let vla = config.vla.config(vocab_size, shape)?;
            let keys = &config.vla;
            let policy = match trunk_dir {
                None => Checkpoint::<Vla>::init_kind(&vla, tokenizer, device)?,
                Some(dir) => {
                    init_on_vlm(dir, &vla, keys.action_tokens, keys.freeze_vision, device)?
                }
            };
            let lengths = check_prompts(&policy, &corpus, shape.observation_text, prompts)?;
            if let Some((mean, longest)) = lengths {
                let history = match vla.history {
                    0 => String::new(),
                    h => format!(" with vla.history = {h}"),
                };
                prompt_lengths = Some(format!(
                    "{} probe prompts{history}: {mean:.1} tokens on average, {longest} at most (vla.max_instruction = {})",
                    prompts.len(),
                    vla.max_instruction
                ));
            }
            let staged = stage_checkpoint(&policy, out)?;
            let architecture = match trunk_dir {
                None => format!("{:?}: {vla:?}", PolicyKind::Vla),
                Some(dir) => {
                    let built = policy.model.config();
                    format!(
                        "{:?} on the model in {} (width {}, {} layers; action tokens {:?}, freeze_vision {})",
                        PolicyKind::Vla,
                        dir.display(),
                        built.n_embd,
                        built.n_layer,
                        keys.action_tokens,
                        keys.freeze_vision
                    )
                }
            };
            (architecture, policy.num_parameters(), staged)
        }
    };
    let (parent, name, staged, manifest) = staged;
    let mut commit = Commit::new(&parent);
    commit.add(&staged, &name, Digest::DirAll, args.stage.overwrite)?;
    let mut summary = Summary::new("init-policy");
    summary
        .add("checkpoint", format!("{} ({})", manifest.id, out.display()))
        .add("parameters", parameters)
        .add("architecture", architecture)
        .add("tokenizer", origin);
    if let Some(lengths) = prompt_lengths {
        summary.add("prompts", lengths);
    }
    let text = stage.summary_text(&summary);
    let summary_path = parent.join(&staged).join("_summary.init-policy.md");
    std::fs::write(&summary_path, &text)
        .and_then(|_| std::fs::File::open(&summary_path)?.sync_all())
        .map_err(|e| Error::io(&summary_path, e))?;
    commit.apply()?;
    print!("{text}");
    Ok(())
}

/// Where a checkpoint is staged: the parent directory of `out`, its name,
/// the staged directory and its manifest.
type Staged = (std::path::PathBuf, String, String, CheckpointManifest);

/// Writes `policy` into a staging directory beside `out` (the checkpoint
/// and its summary inside it are committed as one directory).
fn stage_checkpoint<M: embodyflow_models::checkpoint::PolicyNet>(
    policy: &Checkpoint<M>,
    out: &Path,
) -> Result<Staged, ModelError> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Usage(format!("--out {}: not a directory name", out.display())))?;
    let (staged, manifest) = policy.save_staged(parent, name, "init-policy")?;
    Ok((parent.to_path_buf(), name.to_string(), staged, manifest))
}

/// The world a VLA is made for: its shape, the instructions its tokenizer
/// learns and, in a world that observes text or for a VLA with a history
/// (`vla.history`), the prompts of probe episodes ([`probe_prompts`]). The world of the input tasks when given (their
/// instructions), else the default world's `tokenizer.corpus_tasks`
/// generated train tasks ([`default_world`], [`World::train_tasks`]).
///
/// [`World::train_tasks`]: embodyflow_worlds::World::train_tasks
fn vla_world(
    config: &Config,
    input: Option<TableReader>,
    seed: u64,
) -> Result<(PolicyShape, Vec<String>, Vec<String>), ModelError> {
    let (tasks, instructions) = match input {
        Some(reader) => {
            let rows: Vec<TaskRow> = reader.read_rows()?;
            if rows.is_empty() {
                return Err(Error::BadInput("the tasks table is empty".into()).into());
            }
            let tasks: Vec<WorldTask> = rows.iter().map(task_of).collect::<Result<_, _>>()?;
            (tasks, rows.into_iter().map(|r| r.instruction).collect())
        }
        None => {
            let world = default_world();
            let tasks = world
                .train_tasks(config.tokenizer.corpus_tasks, seed)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "the {} world generates no tasks: give the VLA's tasks with --input",
                        world.env()
                    ))
                })?;
            let instructions = tasks.iter().map(|t| t.instruction().to_string()).collect();
            (tasks, instructions)
        }
    };
    let workers = config.bridge.settings();
    let image_size = config.vla.image_size as usize;
    let bad = |e: WorldsError| Error::BadInput(e.to_string());
    let shape = policy_shape(&tasks[0], image_size, &workers).map_err(bad)?;
    let keys = &config.vla;
    // Probe where prompts hold more than the instruction: a world that
    // observes text and acts discretely, or any world with a history (its
    // actions as the VLA's bins: the world's, else vla.n_bins over [-1, 1]).
    let bins = match (&shape.bins, shape.observation_text, keys.history) {
        (Some(bins), text, history) if text > 0 || history > 0 => Some(bins.clone()),
        (None, _, history) if history > 0 => Some(
            ActionBins::new(keys.n_bins as usize, -1.0, 1.0).map_err(|e| Error::BadValue {
                key: "vla.n_bins".into(),
                reason: e.to_string(),
            })?,
        ),
        _ => None,
    };
    let prompts = match bins {
        None => Vec::new(),
        Some(bins) => {
            let options = WorldOptions {
                image_size,
                bins,
                workers,
            };
            let probe = Probe {
                episodes: config.tokenizer.probe_episodes,
                chunk_len: keys.chunk_len as usize,
                history: keys.history as usize,
            };
            probe_prompts(&tasks, &options, &probe, seed).map_err(bad)?
        }
    };
    Ok((shape, instructions, prompts))
}

/// Every prompt fits in `vla.max_instruction` tokens, which count a
/// decision's whole prompt: every probe prompt (the instruction, an observed
/// text and, with `vla.history`, the decisions it recalls, tokenised by the
/// tokenizer trained on them) and
/// every corpus instruction; in a world that observes text of up to `text`
/// characters but without probe prompts, each instruction with room for a
/// newline and one token per character (a byte-level BPE never needs more
/// for ASCII text). A longer one is refused naming the key, the prompt and
/// its length; a longer prompt at a decision stops its stage naming the
/// key. Returns the probe prompts' mean and longest lengths (`None`
/// without probe prompts).
fn check_prompts(
    policy: &Checkpoint<Vla>,
    corpus: &[String],
    text: usize,
    prompts: &[String],
) -> Result<Option<(f64, i64)>, ModelError> {
    let vla = policy.model.config();
    let observed = if text > 0 { ", observed text" } else { "" };
    let parts = match vla.history {
        0 => "instruction, newline, observed text".to_string(),
        h => format!(
            "instruction, the decisions it recalls (vla.history = {h}: lower it, or raise vla.max_instruction){observed}"
        ),
    };
    let fits = |tokens: i64, why: String| {
        ensure(
            tokens <= vla.max_instruction,
            "vla.max_instruction",
            why,
            vla.max_instruction,
        )
    };
    let mut lengths = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let tokens = encode(&policy.tokenizer, prompt)?.len() as i64;
        fits(
            tokens,
            format!("at least {tokens} (the probe prompt `{prompt}`: {parts})"),
        )?;
        lengths.push(tokens);
    }
    // Probe prompts hold the observed texts; else room for the longest.
    let room = match (text, prompts.is_empty()) {
        (0, _) | (_, false) => 0,
        _ => 1 + text as i64,
    };
    for instruction in corpus {
        let tokens = encode(&policy.tokenizer, instruction)?.len() as i64;
        let why = if room > 0 {
            format!(
                "at least {} (the instruction `{instruction}`: {tokens} tokens, then a newline and an observed text of up to {text} characters)",
                tokens + room
            )
        } else {
            format!("at least {tokens} (the instruction `{instruction}`)")
        };
        fits(tokens + room, why)?;
    }
    if lengths.is_empty() {
        return Ok(None);
    }
    let mean = lengths.iter().sum::<i64>() as f64 / lengths.len() as f64;
    Ok(Some((mean, lengths.into_iter().max().unwrap_or(0))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        assert_eq!(
            refused_key::<Config>(&[
                "model.n_embd=32",
                "model.n_head=2",
                "tokenizer.vocab_size=259"
            ]),
            None
        );
        // A reused tokenizer brings its own vocabulary.
        assert_eq!(
            refused_key::<Config>(&["tokenizer.from=runs/init", "tokenizer.vocab_size=0"]),
            None
        );
        for (set, key) in [
            ("model.n_ctx=0", "model.n_ctx"),
            ("model.n_head=0", "model.n_head"),
            ("model.n_layer=0", "model.n_layer"),
            ("model.n_embd=90", "model.n_embd"),
            ("model.n_embd=-96", "model.n_embd"),
            ("tokenizer.vocab_size=258", "tokenizer.vocab_size"),
            ("tokenizer.corpus_tasks=0", "tokenizer.corpus_tasks"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
    }

    #[test]
    fn vla_keys_are_checked_when_loaded_for_a_vla() {
        assert_eq!(
            refused_key::<Config>(&["kind=vla"]),
            None,
            "the defaults pass"
        );
        assert_eq!(
            refused_key::<Config>(&[
                "kind=vla",
                "vla.image_size=48",
                "vla.patch_size=12",
                "vla.n_embd=32",
                "vla.n_head=2",
                "vla.chunk_len=1",
                "vla.n_bins=2"
            ]),
            None
        );
        // A plan policy ignores the VLA's keys.
        assert_eq!(refused_key::<Config>(&["vla.patch_size=5"]), None);
        assert_eq!(
            refused_key::<Config>(&["kind=diffusion"]).as_deref(),
            Some("kind")
        );
        for (set, key) in [
            ("vla.max_instruction=0", "vla.max_instruction"),
            ("vla.image_size=4", "vla.image_size"),
            ("vla.image_size=1024", "vla.image_size"),
            ("vla.patch_size=5", "vla.patch_size"),
            ("vla.patch_size=0", "vla.patch_size"),
            ("vla.chunk_len=0", "vla.chunk_len"),
            ("vla.n_bins=1", "vla.n_bins"),
            ("vla.n_head=0", "vla.n_head"),
            ("vla.n_layer=0", "vla.n_layer"),
            ("vla.n_embd=90", "vla.n_embd"),
            ("vla.history=-1", "vla.history"),
        ] {
            assert_eq!(
                refused_key::<Config>(&["kind=vla", set]).as_deref(),
                Some(key),
                "{set}"
            );
        }
        // A history's prompts are bounded by probe episodes' prompts.
        assert_eq!(refused_key::<Config>(&["kind=vla", "vla.history=2"]), None);
        assert_eq!(
            refused_key::<Config>(&["kind=vla", "vla.history=2", "tokenizer.probe_episodes=0"])
                .as_deref(),
            Some("tokenizer.probe_episodes")
        );
        assert_eq!(
            refused_key::<Config>(&["kind=vla", "tokenizer.probe_episodes=0"]),
            None
        );
    }
}

/// Init-policy's and update-policy's fields' doc comments document exactly their configs' keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
        embodyflow_core::config::check_key_docs::<crate::Config>().unwrap();
    }
}
