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
//! ```text
//! init-policy --out runs/init --seed 0 --set model.n_layer=4 --set tokenizer.vocab_size=1024
//! ```

use std::path::Path;

use embodyflow_core::Error;
use embodyflow_core::cli::StageArgs;
use embodyflow_core::commit::{Commit, Digest};
use embodyflow_core::config::{at_least, ensure};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::gpt::GptConfig;
use embodyflow_models::tokenizer::{load, train_bpe};
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Longest prompt + response.
    pub n_ctx: i64,
    /// Width.
    pub n_embd: i64,
    /// Attention heads.
    pub n_head: i64,
    /// Blocks.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenizerConfig {
    /// Tokens in the vocabulary, special tokens included.
    pub vocab_size: usize,
    /// Generated training tasks whose prompts and answers form the corpus.
    pub corpus_tasks: usize,
    /// Reuse this tokenizer instead of training one: a `tokenizer.json` or a
    /// checkpoint directory holding one (a teacher that must share the
    /// policy's tokenizer).
    pub from: Option<std::path::PathBuf>,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        TokenizerConfig {
            vocab_size: 1024,
            corpus_tasks: 2000,
            from: None,
        }
    }
}

/// The tool's config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Architecture.
    pub model: ModelConfig,
    /// Tokenizer.
    pub tokenizer: TokenizerConfig,
    /// Unused (no tables are written); present for the uniform `output.*` keys.
    pub output: OutputConfig,
}

impl StageConfig for Config {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        ("model.n_ctx", "longest prompt + response, in tokens"),
        ("model.n_embd", "model width"),
        ("model.n_head", "attention heads"),
        ("model.n_layer", "transformer blocks"),
        (
            "tokenizer.corpus_tasks",
            "generated training tasks whose prompts and answers train the tokenizer",
        ),
        (
            "tokenizer.from",
            "reuse this tokenizer.json (or a checkpoint holding one) instead of training one",
        ),
        (
            "tokenizer.vocab_size",
            "tokens in the vocabulary, special tokens included",
        ),
    ];

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> embodyflow_core::Result<()> {
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
    let (tokenizer, origin) = match &config.tokenizer.from {
        Some(path) => {
            let file = if path.is_dir() {
                path.join("tokenizer.json")
            } else {
                path.clone()
            };
            (load(&file)?, format!("reused from {}", file.display()))
        }
        None => {
            let corpus = embodyflow_envs::corpus(config.tokenizer.corpus_tasks, args.stage.seed);
            let tokenizer = train_bpe(&corpus, config.tokenizer.vocab_size)?;
            (tokenizer, format!("trained on {} texts", corpus.len()))
        }
    };
    let model = &config.model;
    let gpt = GptConfig {
        vocab_size: tokenizer.get_vocab_size(true) as i64,
        n_ctx: model.n_ctx,
        n_embd: model.n_embd,
        n_head: model.n_head,
        n_layer: model.n_layer,
    };
    tch::manual_seed(args.stage.seed as i64);
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    let policy = Checkpoint::init(&gpt, tokenizer, device)?;
    // The checkpoint and its summary inside it are committed as one directory.
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Usage(format!("--out {}: not a directory name", out.display())))?;
    let (staged, manifest) = policy.save_staged(parent, name, "init-policy")?;
    let mut commit = Commit::new(parent);
    commit.add(&staged, name, Digest::DirAll, args.stage.overwrite)?;
    let mut summary = Summary::new("init-policy");
    summary
        .add("checkpoint", format!("{} ({})", manifest.id, out.display()))
        .add("parameters", policy.num_parameters())
        .add("architecture", format!("{gpt:?}"))
        .add("tokenizer", origin);
    let text = stage.summary_text(&summary);
    let summary_path = parent.join(&staged).join("_summary.init-policy.md");
    std::fs::write(&summary_path, &text)
        .and_then(|_| std::fs::File::open(&summary_path)?.sync_all())
        .map_err(|e| Error::io(&summary_path, e))?;
    commit.apply()?;
    print!("{text}");
    Ok(())
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
}

/// Init-policy's and update-policy's `KEYS` table documents exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
        embodyflow_core::config::check_key_docs::<crate::Config>().unwrap();
    }
}
