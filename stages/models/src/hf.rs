//! A Hugging Face decoder ([`HfNet`]: Qwen2 / Qwen2.5, Qwen3, Llama) as a
//! plan policy: a model directory as transformers writes it is a
//! [`Checkpoint<HfNet>`] that every plan-policy stage (collect-rollouts,
//! teacher-logp, update-policy, evaluate) loads with `--policy` /
//! `--teacher`, and that update-policy saves back in the same layout.
//!
//! The directory: `config.json` (with `model_type`, no `kind`: that is how
//! [`crate::registry::policy_kind`] tells it from ours),
//! `model.safetensors` or a sharded `model.safetensors.index.json`,
//! `tokenizer.json`, and optionally `tokenizer_config.json` (chat template,
//! special tokens), `chat_template.jinja` and `generation_config.json`.
//! Our `manifest.json` is optional (a downloaded model has none: its id is
//! the hash of its weights). Saving writes `config.json` (the one read,
//! `dtype` set), one `model.safetensors` under transformers' names,
//! `manifest.json`, the optimizer state, and copies the tokenizer and
//! generation files unchanged, so `AutoModelForCausalLM.from_pretrained`
//! and `AutoTokenizer.from_pretrained` read the result.
//!
//! Prompts ([`crate::checkpoint::PromptFormat::Chat`]): a task's text is
//! one user message rendered by the model's chat template with the
//! generation prompt, as `tokenizer.apply_chat_template(messages,
//! add_generation_prompt=True, tokenize=True)` does it (the rendered text
//! tokenised without adding special tokens); a model without a template
//! (a base model) reads the text as `tokenizer(text)` encodes it. An answer
//! ends at any id of `generation_config.json`'s `eos_token_id` (else
//! `config.json`'s, else `tokenizer_config.json`'s `eos_token`); padding is
//! the first `pad_token_id` found in the same order, else the first stop
//! id. The tokenizer's vocabulary may be smaller than the embedding (Qwen
//! pads it to a multiple of 64) but never larger, and it must be the
//! model's: the stop and padding ids are tokens of it, and so are
//! `tokenizer_config.json`'s special tokens (`added_tokens_decoder` at their
//! ids) and the chat template's `<|…|>` markers; another model's tokenizer is
//! refused naming both sizes and what it lacks.
//!
//! Sampling runs the prompts left-padded with transformers' attention mask
//! and position ids (`cumsum(mask) - 1`) and a key/value cache; scoring
//! runs `prompt + response` right-padded in one pass. Both give each row
//! the logits it has alone, so the PPO ratio starts at 1.
//!
//! ```no_run
//! use embodyflow_hf::HfNet;
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::policy::{sample, Sampling};
//! let policy = Checkpoint::<HfNet>::load_kind("Qwen3-0.6B".as_ref(), tch::Device::Cpu).unwrap();
//! let prompt = policy.prompt_ids("Put the mug in the sink.").unwrap();
//! let greedy = Sampling { temperature: 0.0, top_p: 1.0, max_new_tokens: 64 };
//! let answer = &sample(&policy, &[prompt], &[0], &greedy)[0];
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use embodyflow_hf::HfNet;
use embodyflow_hf::chat::{ChatError, ChatTemplate};
use embodyflow_hf::image::RgbImage;
use embodyflow_hf::safetensors::{Expected, Weights};
use embodyflow_hf::{HfConfig, HfError, KvCache, ModelType};
use serde_json::{Map, Value};
use tch::nn::VarStore;
use tch::{Kind, Tensor};
use tokenizers::Tokenizer;

use crate::ModelError;
use crate::checkpoint::Checkpoint;
use crate::net::{
    ConfigTag, PolicyKind, PolicyNet, PromptFormat, TOKENIZER_FILE, Tokens, WEIGHTS_FILE, bad,
};
use crate::policy::{PlanNet, response_positions, scoring_rows};
use crate::prompt::{USER_MARK, markers, render_user};
use crate::tokenizer::SpecialIds;

/// The files of a Hugging Face model directory besides its config and
/// weights that a checkpoint trained from it carries unchanged.
pub const CARRIED_FILES: [&str; 8] = [
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
];

/// A JSON object file of the model directory, `None` when absent.
fn json_object(file: &Path) -> Result<Option<Map<String, Value>>, ModelError> {
    if !file.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(file).map_err(|e| bad(file, e.to_string()))?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(bad(file, "is not a JSON object")),
        Err(e) => Err(bad(file, e.to_string())),
    }
}

/// Token ids of `key` in `object`: one id or a list of ids.
fn ids_of(object: &Map<String, Value>, key: &str, file: &Path) -> Result<Vec<i32>, ModelError> {
    let id = |value: &Value| {
        value
            .as_i64()
            .and_then(|id| i32::try_from(id).ok())
            .filter(|&id| id >= 0)
            .ok_or_else(|| bad(file, format!("`{key}`: {value} is not a token id")))
    };
    match object.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(values)) => values.iter().map(id).collect(),
        Some(value) => Ok(vec![id(value)?]),
    }
}

/// The id of `tokenizer_config.json`'s `key` (a token's text, or an
/// object with its `content`).
fn token_of(
    object: &Map<String, Value>,
    key: &str,
    tokenizer: &Tokenizer,
    file: &Path,
) -> Result<Vec<i32>, ModelError> {
    let text = match object.get(key) {
        Some(Value::String(text)) => text.as_str(),
        Some(Value::Object(token)) => match token.get("content") {
            Some(Value::String(text)) => text.as_str(),
            _ => return Err(bad(file, format!("`{key}` has no `content` string"))),
        },
        _ => return Ok(Vec::new()),
    };
    let id = tokenizer.token_to_id(text).ok_or_else(|| {
        bad(
            file,
            format!("`{key}` {text:?} is not a token of tokenizer.json"),
        )
    })?;
    Ok(vec![id as i32])
}

/// The first non-empty id list among the sources, in order.
fn first_found(
    sources: impl IntoIterator<Item = Result<Vec<i32>, ModelError>>,
) -> Result<Vec<i32>, ModelError> {
    for ids in sources {
        let ids = ids?;
        if !ids.is_empty() {
            return Ok(ids);
        }
    }
    Ok(Vec::new())
}

/// The special tokens the model directory names that `tokenizer` lacks:
/// `tokenizer_config.json`'s `bos_token`, `eos_token`, `pad_token`,
/// `unk_token` and `additional_special_tokens` that are no token, its
/// `added_tokens_decoder` entries whose text is not that id, and the
/// `<|…|>` markers the chat template writes around a user message (Qwen's
/// `<|im_start|>`, Llama 3's `<|start_header_id|>`) that are no token — a
/// tokenizer without them would encode the markers as characters.
fn missing_specials(
    tokenizer: &Tokenizer,
    tokenizer_config: &Map<String, Value>,
    template: Option<&ChatTemplate>,
) -> Result<Vec<String>, ModelError> {
    let content = |value: &Value| match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(token) => token
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    let mut named: Vec<String> = ["bos_token", "eos_token", "pad_token", "unk_token"]
        .iter()
        .filter_map(|key| tokenizer_config.get(*key).and_then(content))
        .collect();
    if let Some(Value::Array(tokens)) = tokenizer_config.get("additional_special_tokens") {
        named.extend(tokens.iter().filter_map(content));
    }
    if let Some(template) = template {
        named.extend(markers(&render_user(template, USER_MARK, 0)?).map(str::to_string));
    }
    let mut missing: Vec<String> = named
        .into_iter()
        .filter(|token| tokenizer.token_to_id(token).is_none())
        .map(|token| format!("`{token}`"))
        .collect();
    if let Some(Value::Object(added)) = tokenizer_config.get("added_tokens_decoder") {
        for (id, token) in added {
            let Some(text) = content(token) else { continue };
            if tokenizer
                .token_to_id(&text)
                .map(|found| found.to_string())
                .as_deref()
                != Some(id)
            {
                missing.push(format!("`{text}` as id {id}"));
            }
        }
    }
    Ok(missing)
}

impl PolicyNet for HfNet {
    type Config = HfConfig;
    type Role = crate::net::Plans;
    const KIND: PolicyKind = PolicyKind::Hf;
    const NAME: &'static str = "hugging face";
    const TAG: ConfigTag = ConfigTag::ModelTypes(ModelType::NAMES);
    const CARRIED: &'static [&'static str] = &CARRIED_FILES;
    const DOWNLOADED: bool = true;

    fn parse_config(value: Value) -> Result<HfConfig, String> {
        HfConfig::parse(&value.to_string(), Path::new("config.json")).map_err(|e| match e {
            HfError::BadConfig { reason, .. } => reason,
            other => other.to_string(),
        })
    }

    fn config_json(&self) -> Value {
        HfNet::config_json(self)
    }

    fn check(_config: &HfConfig) -> Result<(), String> {
        // HfConfig::parse resolved and checked it.
        Ok(())
    }

    fn vocab_size(config: &HfConfig) -> i64 {
        config.vocab_size
    }

    fn build(path: &tch::nn::Path, config: &HfConfig) -> HfNet {
        HfNet::new(path, config.clone())
    }

    fn config(&self) -> &HfConfig {
        HfNet::config(self)
    }

    fn tensors(config: &HfConfig) -> Box<dyn Iterator<Item = Expected> + '_> {
        Box::new(config.tensors())
    }

    fn open_weights(dir: &Path, config: &mut HfConfig) -> Result<Weights, ModelError> {
        Ok(HfNet::open_weights(dir, config)?)
    }

    fn load_weights(&self, vars: &mut VarStore, weights: &Weights) -> Result<(), ModelError> {
        Ok(HfNet::load_weights(self, vars, weights)?)
    }

    fn write_weights(vars: &VarStore, staging: &Path) -> Result<(), ModelError> {
        Ok(HfNet::write_weights(vars, &staging.join(WEIGHTS_FILE))?)
    }

    fn tokens(dir: &Path, tokenizer: &Tokenizer, config: &HfConfig) -> Result<Tokens, ModelError> {
        chat_tokens(
            dir,
            tokenizer,
            config.vocab_size,
            &[&config.source],
            &CARRIED_FILES,
        )
    }
}

/// [`PolicyNet::tokens`] of a Hugging Face model in `dir` whose embedding
/// has `vocab_size` rows: the stop and padding ids from
/// `generation_config.json`, else the first of `configs` (parts of
/// `config.json`) that names them, else `tokenizer_config.json`; the chat
/// template; the files of `carry` the directory has, read to be carried;
/// `tokenizer` checked to be the model's.
pub(crate) fn chat_tokens(
    dir: &Path,
    tokenizer: &Tokenizer,
    vocab_size: i64,
    configs: &[&Map<String, Value>],
    carry: &[&str],
) -> Result<Tokens, ModelError> {
    let tokenizer_file = dir.join(TOKENIZER_FILE);
    let vocab = tokenizer.get_vocab_size(true) as i64;
    if vocab > vocab_size {
        return Err(bad(
            &tokenizer_file,
            format!(
                "the tokenizer has {vocab} tokens but the embedding has {vocab_size} rows (config.json `vocab_size`): another model's tokenizer?",
            ),
        ));
    }
    let generation_file = dir.join("generation_config.json");
    let config_file = dir.join("config.json");
    let tokenizer_config_file = dir.join("tokenizer_config.json");
    let generation = json_object(&generation_file)?.unwrap_or_default();
    let tokenizer_config = json_object(&tokenizer_config_file)?.unwrap_or_default();
    let in_config = |key: &str| {
        configs
            .iter()
            .map(|config| ids_of(config, key, &config_file))
            .collect::<Vec<_>>()
    };
    let stop = first_found(
        std::iter::once(ids_of(&generation, "eos_token_id", &generation_file))
            .chain(in_config("eos_token_id"))
            .chain([token_of(
                &tokenizer_config,
                "eos_token",
                tokenizer,
                &tokenizer_config_file,
            )]),
    )?;
    let Some(&eos) = stop.first() else {
        return Err(bad(
            &generation_file,
            "no end-of-answer token: none of generation_config.json / config.json `eos_token_id` or tokenizer_config.json `eos_token` is set",
        ));
    };
    if let Some(&outside) = stop.iter().find(|&&id| i64::from(id) >= vocab_size) {
        return Err(bad(
            &generation_file,
            format!("end-of-answer id {outside} is outside the embedding of {vocab_size} rows"),
        ));
    }
    let pad = first_found(
        std::iter::once(ids_of(&generation, "pad_token_id", &generation_file))
            .chain(in_config("pad_token_id"))
            .chain([token_of(
                &tokenizer_config,
                "pad_token",
                tokenizer,
                &tokenizer_config_file,
            )]),
    )?
    .first()
    .copied()
    .unwrap_or(eos);
    let template = match ChatTemplate::from_dir(dir) {
        Ok(template) => Some(Arc::new(template)),
        Err(ChatError::NoChatTemplate { .. }) => None,
        Err(other) => return Err(HfError::from(other).into()),
    };
    let mut missing = missing_specials(tokenizer, &tokenizer_config, template.as_deref())?;
    for (what, id) in stop
        .iter()
        .map(|&id| ("end-of-answer", id))
        .chain([("padding", pad)])
    {
        if tokenizer.id_to_token(id as u32).is_none() {
            missing.push(format!("{what} id {id}"));
        }
    }
    if !missing.is_empty() {
        let mut seen = std::collections::BTreeSet::new();
        missing.retain(|what| seen.insert(what.clone()));
        return Err(bad(
            &tokenizer_file,
            format!(
                "does not match the model: it has {vocab} tokens (the embedding {vocab_size}, config.json `vocab_size`) and lacks {}: another model's tokenizer?",
                missing.join(", ")
            ),
        ));
    }
    let mut carried = BTreeMap::new();
    for &name in carry {
        let file = dir.join(name);
        if file.is_file() {
            let bytes = std::fs::read(&file).map_err(|e| bad(&file, e.to_string()))?;
            carried.insert(name.to_string(), bytes);
        }
    }
    Ok(Tokens {
        special: SpecialIds {
            pad,
            plan: eos,
            eos,
        },
        format: PromptFormat::Chat { template, stop },
        carried,
    })
}

/// The decoding state of a Hugging Face model: its own cache `C` (the
/// keys and values; a vision-language model's M-RoPE offsets too) and the
/// attention mask over it (0 at a row's left padding).
pub struct HfCache<C = KvCache> {
    state: C,
    mask: Tensor,
}

/// Logits of the model's dtype as f32; a fault is a bug of ours (ids and
/// masks are built here, the ids checked against the vocabulary first).
fn float_logits(logits: Result<Tensor, HfError>) -> Tensor {
    logits
        .unwrap_or_else(|e| panic!("a batch built by the sampler or scorer failed: {e}"))
        .to_kind(Kind::Float)
}

/// [`PlanNet::start`] of a Hugging Face model whose cached forward pass is
/// `forward(ids, mask, cache)`: the left-padded prompts under transformers'
/// attention mask.
pub(crate) fn start_chat<C: Default>(
    ids: &Tensor,
    pads: &Tensor,
    forward: impl FnOnce(&Tensor, &Tensor, &mut C) -> Result<Tensor, HfError>,
) -> (Tensor, HfCache<C>) {
    let (_, width) = ids.size2().expect("ids are [rows, width]");
    let columns = Tensor::arange(width, (Kind::Int64, ids.device()));
    let mask = columns
        .unsqueeze(0)
        .ge_tensor(&pads.unsqueeze(1))
        .to_kind(Kind::Int64);
    let mut state = C::default();
    // `forward` gives every position's logits or the last one's.
    let logits = float_logits(forward(ids, &mask, &mut state));
    (logits.select(1, -1), HfCache { state, mask })
}

/// [`PlanNet::step`] of a Hugging Face model ([`start_chat`]'s `forward`).
pub(crate) fn step_chat<C>(
    cache: &mut HfCache<C>,
    next: &Tensor,
    forward: impl FnOnce(&Tensor, &Tensor, &mut C) -> Result<Tensor, HfError>,
) -> Tensor {
    let rows = next.size()[0];
    let ones = Tensor::ones([rows, 1], (Kind::Int64, next.device()));
    cache.mask = Tensor::cat(&[&cache.mask, &ones], 1);
    let logits = float_logits(forward(&next.unsqueeze(1), &cache.mask, &mut cache.state));
    logits.select(1, 0)
}

/// [`PlanNet::keep_rows`] of a Hugging Face model whose own cache keeps
/// rows with `keep`.
pub(crate) fn keep_chat_rows<C>(cache: &mut HfCache<C>, rows: &Tensor, keep: impl FnOnce(&mut C)) {
    keep(&mut cache.state);
    cache.mask = cache.mask.index_select(0, rows);
}

/// [`PlanNet::response_logits`] of a Hugging Face model whose full forward
/// pass is `forward(ids, mask)`: `prompt + response` right-padded in one
/// pass under its attention mask.
pub(crate) fn chat_response_logits<M: PlanNet>(
    policy: &Checkpoint<M>,
    prompts: &[&[i32]],
    responses: &[&[i32]],
    longest: i64,
    forward: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor, HfError>,
) -> Tensor {
    let device = policy.vars.device();
    let (ids, lengths) = scoring_rows(prompts, responses, policy.special.pad, device);
    let width = lengths.iter().copied().max().unwrap_or(0);
    let batch = prompts.len() as i64;
    let mut mask = Vec::with_capacity(prompts.len() * width);
    for &length in &lengths {
        mask.extend(std::iter::repeat_n(1i64, length));
        mask.extend(std::iter::repeat_n(0i64, width - length));
    }
    let mask = Tensor::from_slice(&mask)
        .view([batch, width as i64])
        .to(device);
    response_positions(&float_logits(forward(&ids, &mask)), prompts, longest)
}

impl PlanNet for HfNet {
    type Cache = HfCache;

    fn max_len(&self) -> usize {
        self.config().max_position_embeddings as usize
    }

    fn vocab(&self) -> usize {
        self.config().vocab_size as usize
    }

    fn start(
        &self,
        ids: &Tensor,
        pads: &Tensor,
        _images: &[&[RgbImage]],
        _capacity: i64,
    ) -> (Tensor, HfCache) {
        start_chat(ids, pads, |ids, mask, cache| {
            self.forward_cached_last(ids, mask, cache)
        })
    }

    fn step(&self, cache: &mut HfCache, next: &Tensor, _pads: &Tensor, _column: i64) -> Tensor {
        step_chat(cache, next, |ids, mask, cache| {
            self.forward_cached_last(ids, mask, cache)
        })
    }

    fn keep_rows(cache: &mut HfCache, rows: &Tensor) {
        keep_chat_rows(cache, rows, |state| state.keep_rows(rows));
    }

    fn response_logits(
        policy: &Checkpoint<HfNet>,
        prompts: &[&[i32]],
        _images: &[&[RgbImage]],
        responses: &[&[i32]],
        longest: i64,
    ) -> Tensor {
        chat_response_logits(policy, prompts, responses, longest, |ids, mask| {
            policy.model.forward(ids, mask)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Entropy, Sampling, sample, score_responses};
    use crate::testing::{assert_sampled_are_scored, seed, tiny_tokenizer};
    use tokenizers::AddedToken;

    /// A chat template of one user turn: `<|im_start|>user\n…<|im_end|>\n`,
    /// then `<|im_start|>assistant\n` as the generation prompt.
    const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    /// A tiny random Qwen3 in transformers' layout in `dir`: the tiny
    /// policy's BPE plus the chat tokens, an embedding of `vocab` rows,
    /// and the given generation config (`None`: no file).
    fn write_model(dir: &Path, vocab: Option<i64>, generation: Option<Value>) {
        let mut tokenizer = tiny_tokenizer();
        tokenizer.add_special_tokens(&[
            AddedToken::from("<|im_start|>", true),
            AddedToken::from("<|im_end|>", true),
        ]);
        let size = tokenizer.get_vocab_size(true) as i64;
        let config = serde_json::json!({
            "model_type": "qwen3",
            "vocab_size": vocab.unwrap_or((size + 63) / 64 * 64),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 128,
            "tie_word_embeddings": true,
            "rms_norm_eps": 1e-6,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let parsed = HfNet::parse_config(config).unwrap();
        let _guard = seed(7);
        let vars = VarStore::new(tch::Device::Cpu);
        let _net = HfNet::new(&vars.root(), parsed);
        tch::no_grad(|| {
            for (_, mut variable) in vars.variables() {
                variable.copy_(&(Tensor::randn_like(&variable) * 0.5));
            }
        });
        HfNet::write_weights(&vars, &dir.join(WEIGHTS_FILE)).unwrap();
        tokenizer.save(dir.join(TOKENIZER_FILE), false).unwrap();
        let tokenizer_config =
            serde_json::json!({"chat_template": TEMPLATE, "eos_token": "<|im_end|>"});
        std::fs::write(
            dir.join("tokenizer_config.json"),
            tokenizer_config.to_string(),
        )
        .unwrap();
        if let Some(generation) = generation {
            std::fs::write(dir.join("generation_config.json"), generation.to_string()).unwrap();
        }
    }

    fn load(dir: &Path) -> Result<Checkpoint<HfNet>, ModelError> {
        Checkpoint::<HfNet>::load_kind(dir, tch::Device::Cpu)
    }

    /// The tiny model in `dir` and three prompts of different lengths (left
    /// padding), the first repeated.
    fn policy_and_prompts(dir: &Path) -> (Checkpoint<HfNet>, Vec<Vec<i32>>) {
        write_model(dir, None, None);
        let policy = load(dir).unwrap();
        let prompts = ["Task: find a Mug 1", "put the apple", "Task: find a Mug 1"]
            .iter()
            .map(|t| policy.prompt_ids(t).unwrap())
            .collect();
        (policy, prompts)
    }

    /// Over bf16 copies of its weights (`crate::precision`) a decoder
    /// scores in bf16 with log-probs from fp32 logits, near the fp32
    /// scores; back from the master weights it scores exactly as before.
    #[test]
    fn a_decoder_scores_over_bf16_copies_and_returns_to_its_fp32_weights() {
        let dir = tempfile::tempdir().unwrap();
        let (mut policy, prompts) = policy_and_prompts(dir.path());
        let responses: Vec<&[i32]> = prompts.iter().map(|p| &p[2..6]).collect();
        let score = |policy: &Checkpoint<HfNet>| {
            tch::no_grad(|| score_responses(policy, &prompts, &responses, 1.0, Entropy::Skip))
        };
        let fp32 = score(&policy).logprobs;
        let master = crate::precision::MasterWeights::new(&mut policy.vars);
        let bf16 = score(&policy).logprobs;
        assert_eq!(bf16.kind(), tch::Kind::Float);
        let apart = (&bf16 - &fp32).abs().max().double_value(&[]);
        assert!(
            apart > 0.0 && apart < 0.2,
            "bf16 vs fp32 log-probs: {apart}"
        );
        master.finish(&mut policy.vars);
        assert!(score(&policy).logprobs.equal(&fp32));
    }

    #[test]
    fn prompts_are_the_chat_template_and_read_back_to_the_text() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), None, None);
        let policy = load(dir.path()).unwrap();
        assert_eq!(
            crate::registry::policy_kind(dir.path()).unwrap(),
            PolicyKind::Hf
        );
        let im_end = policy.tokenizer.token_to_id("<|im_end|>").unwrap() as i32;
        // No generation_config.json: the stop id is tokenizer_config's eos_token.
        assert!(policy.stops(im_end) && !policy.stops(im_end - 1));
        let text = "Task: find a Mug 3";
        let ids = policy.prompt_ids(text).unwrap();
        let im_start = policy.tokenizer.token_to_id("<|im_start|>").unwrap() as i32;
        assert_eq!(ids[0], im_start);
        assert_eq!(policy.prompt_text(&ids).unwrap(), text);
        // Ids that are not one user turn of the template are refused.
        let plain = crate::tokenizer::encode(&policy.tokenizer, text).unwrap();
        let error = policy.prompt_text(&plain).unwrap_err();
        assert!(error.to_string().contains("chat template"), "{error}");
    }

    #[test]
    fn sampled_logprobs_are_the_scored_ones_and_answers_end_at_a_stop_id() {
        let dir = tempfile::tempdir().unwrap();
        let (policy, prompts) = policy_and_prompts(dir.path());
        let sampling = Sampling {
            temperature: 1.3,
            top_p: 1.0,
            max_new_tokens: 12,
        };
        let sampled = sample(&policy, &prompts, &[1, 2, 3], &sampling);
        assert_sampled_are_scored(&policy, &prompts, &sampled, 1.3);
        // Each row's sample is its own: the same seed alone draws the same
        // tokens (log-probs to float rounding: the batch pads the row).
        let alone = sample(&policy, &prompts[1..2], &[2], &sampling);
        assert_eq!(alone[0].response_ids, sampled[1].response_ids);
        for (a, b) in alone[0].logprobs.iter().zip(&sampled[1].logprobs) {
            assert!((a - b).abs() < 1e-5, "alone {a}, in the batch {b}");
        }
    }

    #[test]
    fn a_saved_policy_reloads_with_its_files_and_the_same_logits() {
        let dir = tempfile::tempdir().unwrap();
        write_model(
            dir.path(),
            None,
            Some(serde_json::json!({"eos_token_id": [5, 6]})),
        );
        let policy = load(dir.path()).unwrap();
        assert!(policy.stops(5) && policy.stops(6));
        // A downloaded model has no manifest: its id is its weights'.
        assert_eq!(policy.manifest.id.len(), 16);
        assert_eq!(policy.manifest.parent, None);
        let out = tempfile::tempdir().unwrap();
        let saved = out.path().join("policy");
        policy.save(&saved, "update-policy", false).unwrap();
        for file in [
            "tokenizer_config.json",
            "generation_config.json",
            "manifest.json",
        ] {
            assert!(saved.join(file).is_file(), "{file} carried");
        }
        assert_eq!(
            std::fs::read(saved.join("generation_config.json")).unwrap(),
            std::fs::read(dir.path().join("generation_config.json")).unwrap()
        );
        let again = load(&saved).unwrap();
        assert_eq!(
            again.manifest.parent.as_deref(),
            Some(policy.manifest.id.as_str())
        );
        let ids = [policy.prompt_ids("put the apple").unwrap()];
        let refs: Vec<&[i32]> = ids.iter().map(Vec::as_slice).collect();
        let response: [&[i32]; 1] = [&[20, 21, 22]];
        let a = score_responses(&policy, &refs, &response, 1.0, Entropy::Skip).logprobs;
        let b = score_responses(&again, &refs, &response, 1.0, Entropy::Skip).logprobs;
        assert_eq!(
            Vec::<f32>::try_from(a.view([-1])).unwrap(),
            Vec::<f32>::try_from(b.view([-1])).unwrap()
        );
    }

    #[test]
    fn bad_model_directories_name_the_file_and_what_is_wrong() {
        // A tokenizer larger than the embedding.
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), Some(64), None);
        let error = load(dir.path()).err().unwrap().to_string();
        assert!(
            error.contains("tokenizer.json") && error.contains("64 rows"),
            "{error}"
        );
        // No end-of-answer token anywhere.
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), None, None);
        std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
        let error = load(dir.path()).err().unwrap().to_string();
        assert!(error.contains("no end-of-answer token"), "{error}");
        // A stop id outside the embedding.
        let dir = tempfile::tempdir().unwrap();
        write_model(
            dir.path(),
            None,
            Some(serde_json::json!({"eos_token_id": 100000})),
        );
        let error = load(dir.path()).err().unwrap().to_string();
        assert!(
            error.contains("generation_config.json") && error.contains("100000"),
            "{error}"
        );
        // An architecture we do not implement.
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), None, None);
        let config_file = dir.path().join("config.json");
        let text = std::fs::read_to_string(&config_file).unwrap();
        std::fs::write(&config_file, text.replace("qwen3", "gpt2")).unwrap();
        let error = load(dir.path()).err().unwrap().to_string();
        assert!(
            error.contains("config.json") && error.contains("gpt2"),
            "{error}"
        );
        // Loading it as our plan policy names both kinds.
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), None, None);
        let error = Checkpoint::load(dir.path(), tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("hugging face") && error.contains("plan"),
            "{error}"
        );
    }

    /// A tokenizer that is not the model's (here the tiny BPE without the
    /// chat tokens, beside a generation config whose end-of-answer id it
    /// lacks) is refused, naming both sizes and what it lacks: accepted, the
    /// chat markers were encoded as characters and the stop id was no token.
    #[test]
    fn a_tokenizer_without_the_models_special_tokens_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), None, None);
        let im_end = load(dir.path())
            .unwrap()
            .tokenizer
            .token_to_id("<|im_end|>")
            .unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            serde_json::json!({"eos_token_id": im_end}).to_string(),
        )
        .unwrap();
        load(dir.path()).unwrap();
        let other = tiny_tokenizer();
        let size = other.get_vocab_size(true);
        other.save(dir.path().join(TOKENIZER_FILE), false).unwrap();
        let error = load(dir.path()).err().unwrap();
        assert_eq!(
            embodyflow_core::Classify::kind(&error),
            embodyflow_core::ErrorKind::BadInput
        );
        let error = error.to_string();
        for needle in [
            TOKENIZER_FILE.to_string(),
            format!("{size} tokens"),
            "vocab_size".to_string(),
            "`<|im_start|>`".to_string(),
            "`<|im_end|>`".to_string(),
            format!("end-of-answer id {im_end}"),
        ] {
            assert!(error.contains(&needle), "lacks {needle}: {error}");
        }
    }

    /// Greedy sampling (T = 0) of a Hugging Face decoder is its greedy
    /// search (`HfNet::greedy`, transformers' `generate(do_sample=False)`
    /// in the golden tests), each row as alone, with the log-probs at T = 1
    /// that the scorer gives at T = 0.
    #[test]
    fn greedy_sampling_is_the_decoders_greedy_search() {
        let dir = tempfile::tempdir().unwrap();
        let (policy, prompts) = policy_and_prompts(dir.path());
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 10,
        };
        let sampled = sample(&policy, &prompts, &[1, 2, 3], &greedy);
        assert_eq!(sampled, sample(&policy, &prompts, &[7, 7, 7], &greedy));
        for (prompt, s) in prompts.iter().zip(&sampled) {
            let ids: Vec<i64> = prompt.iter().map(|&id| i64::from(id)).collect();
            let ids = Tensor::from_slice(&ids).view([1, -1]);
            let mask = ids.ones_like();
            let eos = policy.special.eos;
            let tokens = policy
                .model
                .greedy(
                    &ids,
                    &mask,
                    10,
                    Some(i64::from(eos)),
                    i64::from(policy.special.pad),
                )
                .unwrap();
            let tokens: Vec<i32> = Vec::<i64>::try_from(tokens.view([-1]))
                .unwrap()
                .into_iter()
                .map(|t| t as i32)
                .collect();
            assert_eq!(s.response_ids, tokens);
        }
        assert_sampled_are_scored(&policy, &prompts, &sampled, 0.0);
    }
}
