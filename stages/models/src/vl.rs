//! A Hugging Face vision-language model (Qwen2.5-VL, Qwen3-VL:
//! [`embodyflow_hf::vl::VlNet`]) as a plan policy, [`VlPolicy`]: a model
//! directory as transformers writes it (`config.json` with `model_type`
//! `qwen2_5_vl` or `qwen3_vl`, the weights under either naming of the two
//! towers, `preprocessor_config.json`, the tokenizer files) is a
//! `Checkpoint<VlPolicy>` that the plan-policy stages load with `--policy`
//! / `--teacher`, and that saving writes back in the same layout with the
//! processor's files carried.
//!
//! Everything but the network is the Hugging Face decoder's
//! ([`crate::hf`]): the chat-template prompt, the stop and padding ids, the
//! tokenizer checks, the left-padded sampling under transformers' mask and
//! the right-padded scoring. A prompt with images
//! ([`Checkpoint::prompt`]) holds the template's image parts
//! with each placeholder expanded to the image's merged patch count; the
//! images reach the vision encoder through the processor
//! ([`VlPolicy::process`]) in sampling and in scoring alike, and
//! [`PlanNet::check_images`] checks a prompt read back from a table against
//! its images; a prompt holding the video placeholder is refused, and a
//! tokenizer without the image part's tokens at config.json's ids is
//! refused when the policy loads. A placeholder sampled into a response is
//! text to the scorer, as it was to decoding
//! ([`VlNet::forward_responses`]). The language model runs under M-RoPE, whose
//! positions on a prompt without an image are the plain ones on all three
//! axes; a decoding step continues each row at its prompt's offset (kept
//! in the cache).
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::policy::{sample, Sampling};
//! use embodyflow_models::vl::VlPolicy;
//! let policy = Checkpoint::<VlPolicy>::load_kind("Qwen2.5-VL-3B-Instruct".as_ref(), tch::Device::Cpu).unwrap();
//! let prompt = policy.prompt_ids("Put the mug in the sink.").unwrap();
//! let greedy = Sampling { temperature: 0.0, top_p: 1.0, max_new_tokens: 64 };
//! let answer = &sample(&policy, &[prompt], &[0], &greedy)[0];
//! ```

use std::path::Path;

use embodyflow_hf::image::{ImageProcessor, RgbImage};
use embodyflow_hf::safetensors::{Expected, Weights};
use embodyflow_hf::vl::{Images, Layout, VlCache, VlConfig, VlFamily, VlNet};
use embodyflow_hf::{HfError, HfNet};
use serde_json::Value;
use tch::Tensor;
use tch::nn::VarStore;
use tokenizers::Tokenizer;

use crate::ModelError;
use crate::checkpoint::{
    Checkpoint, ConfigTag, PolicyKind, PolicyNet, TOKENIZER_FILE, Tokens, WEIGHTS_FILE,
};
use crate::hf::{
    CARRIED_FILES, HfCache, chat_response_logits, chat_tokens, keep_chat_rows, start_chat,
    step_chat,
};
use crate::policy::PlanNet;

/// The image processor's file in a vision-language model directory.
pub const PROCESSOR_FILE: &str = "preprocessor_config.json";

/// Qwen's video placeholder token, which [`VlPolicy`] refuses in prompts.
const VIDEO_PLACEHOLDER: &str = "<|video_pad|>";

/// The tokens Qwen's chat templates write around an image part, each with
/// the config.json key that gives its id.
const VISION_TOKENS: [(&str, &str); 3] = [
    ("<|vision_start|>", "vision_start_token_id"),
    ("<|image_pad|>", "image_token_id"),
    ("<|vision_end|>", "vision_end_token_id"),
];

/// Fails unless `tokenizer` (`dir`'s) holds each of [`VISION_TOKENS`] at
/// the id `config` gives it: a tokenizer without them (a text model's)
/// encodes the template's image part as characters, and one that places
/// them elsewhere hands the model placeholders it does not read as images.
fn check_vision_tokens(
    dir: &Path,
    tokenizer: &Tokenizer,
    config: &VlConfig,
) -> Result<(), ModelError> {
    let ids = [
        config.vision_start_token_id,
        config.image_token_id,
        config.vision_end_token_id,
    ];
    for (&(token, key), id) in VISION_TOKENS.iter().zip(ids) {
        let reason = match tokenizer.token_to_id(token) {
            Some(found) if i64::from(found) == id => continue,
            Some(found) => format!(
                "holds `{token}` as id {found}, but config.json `{key}` is {id}: another model's tokenizer?"
            ),
            None => format!(
                "lacks `{token}`, the token of config.json `{key}` ({id}) that the chat template \
                 writes for an image: another model's tokenizer?"
            ),
        };
        return Err(ModelError::BadCheckpoint {
            file: dir.join(TOKENIZER_FILE),
            reason,
        });
    }
    Ok(())
}

/// The files a checkpoint trained from a vision-language model carries
/// unchanged: the decoder's ([`CARRIED_FILES`]) and the image processor's.
pub const VL_CARRIED_FILES: [&str; 9] = {
    let mut files = [PROCESSOR_FILE; 9];
    let mut i = 0;
    while i < CARRIED_FILES.len() {
        files[i] = CARRIED_FILES[i];
        i += 1;
    }
    files
};

/// The architecture of a [`VlPolicy`]: the resolved config, the names its
/// weights have, and the image processor when the directory has one.
#[derive(Debug, Clone)]
pub struct VlSetup {
    /// `config.json`, resolved.
    pub config: VlConfig,
    /// Where the checkpoint keeps the two towers (settled on the weights).
    pub layout: Layout,
    /// `preprocessor_config.json`, checked against the vision config;
    /// `None` when the directory has none.
    pub processor: Option<ImageProcessor>,
}

/// A vision-language model as a plan policy.
#[derive(Debug)]
pub struct VlPolicy {
    net: VlNet,
    setup: VlSetup,
}

impl VlPolicy {
    /// The network.
    pub fn net(&self) -> &VlNet {
        &self.net
    }

    /// `images` as the processor gives them to the vision encoder; a
    /// directory without `preprocessor_config.json` reads no images, and an
    /// image the processor cannot resize is named by its index.
    pub fn process(&self, images: &[RgbImage]) -> Result<Images, ModelError> {
        let processor = self
            .setup
            .processor
            .as_ref()
            .ok_or_else(|| ModelError::BadCheckpoint {
                file: PROCESSOR_FILE.into(),
                reason: "the model directory has none, so the model reads no images".into(),
            })?;
        Ok(processor.process(images)?)
    }

    /// Fails on the video placeholder in a prompt's `ids`: the model
    /// reads images only (no video frames reach its vision encoder), and
    /// transformers would take `<|vision_start|><|video_pad|>` for a video
    /// it was not given.
    fn refuse_video(&self, ids: &[i32]) -> Result<(), ModelError> {
        let video = self.setup.config.video_token_id as i32;
        match ids.iter().position(|&id| id == video) {
            None => Ok(()),
            Some(at) => Err(embodyflow_core::Error::BadInput(format!(
                "the prompt holds the video placeholder `{VIDEO_PLACEHOLDER}` (token {video}, \
                 config.json `video_token_id`) at position {at}: videos are not supported, \
                 only images"
            ))
            .into()),
        }
    }

    /// The images of every row, in row order, processed; `None` without any.
    fn row_images(&self, images: &[&[RgbImage]]) -> Option<Images> {
        let all: Vec<RgbImage> = images.iter().flat_map(|row| row.iter().cloned()).collect();
        (!all.is_empty()).then(|| {
            self.process(&all)
                .unwrap_or_else(|e| panic!("images are checked when their prompt is made: {e}"))
        })
    }
}

impl PolicyNet for VlPolicy {
    type Config = VlSetup;
    type Role = crate::net::Plans;
    const KIND: PolicyKind = PolicyKind::Hf;
    const NAME: &'static str = "hugging face vision-language";
    const TAG: ConfigTag = ConfigTag::ModelTypes(VlFamily::NAMES);
    const CARRIED: &'static [&'static str] = &VL_CARRIED_FILES;
    const DOWNLOADED: bool = true;

    fn parse_config(value: Value) -> Result<VlSetup, String> {
        let config =
            VlConfig::parse(&value.to_string(), Path::new("config.json")).map_err(|e| match e {
                HfError::BadConfig { reason, .. } => reason,
                other => other.to_string(),
            })?;
        Ok(VlSetup {
            config,
            layout: Layout::CURRENT,
            processor: None,
        })
    }

    fn config_json(&self) -> Value {
        self.net.config_json()
    }

    fn check(_config: &VlSetup) -> Result<(), String> {
        // VlConfig::parse resolved and checked it.
        Ok(())
    }

    fn vocab_size(setup: &VlSetup) -> i64 {
        setup.config.text.vocab_size
    }

    fn build(path: &tch::nn::Path, setup: &VlSetup) -> VlPolicy {
        VlPolicy {
            net: VlNet::new(path, setup.config.clone(), setup.layout.clone()),
            setup: setup.clone(),
        }
    }

    fn config(&self) -> &VlSetup {
        &self.setup
    }

    fn tensors(setup: &VlSetup) -> Box<dyn Iterator<Item = Expected> + '_> {
        Box::new(setup.config.tensors(&setup.layout))
    }

    fn open_weights(dir: &Path, setup: &mut VlSetup) -> Result<Weights, ModelError> {
        let (weights, layout) = VlNet::open_weights(dir, &setup.config)?;
        setup.layout = layout;
        if dir.join(PROCESSOR_FILE).is_file() {
            setup.processor = Some(ImageProcessor::for_model(dir, &setup.config)?);
        }
        Ok(weights)
    }

    fn load_weights(&self, vars: &mut VarStore, weights: &Weights) -> Result<(), ModelError> {
        Ok(self.net.load_weights(vars, weights)?)
    }

    fn write_weights(vars: &VarStore, staging: &Path) -> Result<(), ModelError> {
        Ok(HfNet::write_weights(vars, &staging.join(WEIGHTS_FILE))?)
    }

    fn image_token(&self) -> Option<i32> {
        Some(self.setup.config.image_token_id as i32)
    }

    fn vision_encoder(&self) -> Option<&'static str> {
        Some(self.setup.layout.visual)
    }

    fn tokens(dir: &Path, tokenizer: &Tokenizer, setup: &VlSetup) -> Result<Tokens, ModelError> {
        check_vision_tokens(dir, tokenizer, &setup.config)?;
        let source = &setup.config.source;
        let mut configs = vec![source];
        if let Some(Value::Object(text)) = source.get("text_config") {
            configs.push(text);
        }
        chat_tokens(
            dir,
            tokenizer,
            setup.config.text.vocab_size,
            &configs,
            &VL_CARRIED_FILES,
        )
    }
}

impl PlanNet for VlPolicy {
    type Cache = HfCache<VlCache>;

    fn max_len(&self) -> usize {
        self.setup.config.text.max_position_embeddings as usize
    }

    fn vocab(&self) -> usize {
        self.setup.config.text.vocab_size as usize
    }

    fn start(
        &self,
        ids: &Tensor,
        pads: &Tensor,
        images: &[&[RgbImage]],
        _capacity: i64,
    ) -> (Tensor, Self::Cache) {
        let images = self.row_images(images);
        start_chat(ids, pads, |ids, mask, cache| {
            self.net.forward_cached(ids, mask, images.as_ref(), cache)
        })
    }

    fn step(&self, cache: &mut Self::Cache, next: &Tensor, _pads: &Tensor, _column: i64) -> Tensor {
        step_chat(cache, next, |ids, mask, cache| {
            self.net.forward_cached(ids, mask, None, cache)
        })
    }

    fn keep_rows(cache: &mut Self::Cache, rows: &Tensor) {
        keep_chat_rows(cache, rows, |state| state.keep_rows(rows));
    }

    fn response_logits(
        policy: &Checkpoint<VlPolicy>,
        prompts: &[&[i32]],
        images: &[&[RgbImage]],
        responses: &[&[i32]],
        longest: i64,
    ) -> Tensor {
        let images = policy.model.row_images(images);
        // A placeholder the sampler drew into a response was read as text.
        let prompt_lens: Vec<i64> = prompts.iter().map(|p| p.len() as i64).collect();
        chat_response_logits(policy, prompts, responses, longest, |ids, mask| {
            policy
                .model
                .net
                .forward_responses(ids, mask, images.as_ref(), &prompt_lens)
        })
    }

    fn video_token(&self) -> Option<i32> {
        Some(self.setup.config.video_token_id as i32)
    }

    fn expand_images(&self, ids: Vec<i32>, images: &[RgbImage]) -> Result<Vec<i32>, ModelError> {
        self.refuse_video(&ids)?;
        let grids = match images {
            [] => Vec::new(),
            _ => self.process(images)?.grid_thw,
        };
        let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
        let expanded = self.net.expand_image_tokens(&ids, &grids)?;
        Ok(expanded.into_iter().map(|id| id as i32).collect())
    }

    fn check_images(&self, ids: &[i32], images: &[RgbImage]) -> Result<(), ModelError> {
        self.refuse_video(ids)?;
        let image = self.setup.config.image_token_id as i32;
        let runs: Vec<usize> = ids
            .chunk_by(|a, b| a == b)
            .filter(|run| run[0] == image)
            .map(<[i32]>::len)
            .collect();
        let bad = |reason: String| ModelError::from(embodyflow_core::Error::BadInput(reason));
        if runs.len() != images.len() {
            return Err(bad(format!(
                "{} image placeholder run(s) in the prompt (token {image}), {} image(s) given",
                runs.len(),
                images.len()
            )));
        }
        if images.is_empty() {
            return Ok(());
        }
        let merge = self.setup.config.vision.spatial_merge_size;
        let grids = self.process(images)?.grid_thw;
        for (index, (&run, &grid)) in runs.iter().zip(&grids).enumerate() {
            let need = Images::tokens(grid, merge) as usize;
            if run != need {
                return Err(bad(format!(
                    "image {index} ({} x {} pixels, grid {grid:?}) takes {need} placeholders, the prompt holds a run of {run}",
                    images[index].height(),
                    images[index].width()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Entropy, Prompt, Sampling, sample, score_responses};
    use crate::registry::{policy_kind, policy_net};
    use crate::testing::{
        assert_sampled_are_scored, load_refused, tiny_image as image,
        write_tiny_vl_policy as write_model,
    };
    use embodyflow_hf::VlModel;

    fn load(dir: &Path) -> Result<Checkpoint<VlPolicy>, ModelError> {
        Checkpoint::<VlPolicy>::load_kind(dir, tch::Device::Cpu)
    }

    /// A Qwen-VL directory is a Hugging Face plan policy of its own
    /// network: its prompts are the chat template's, its samples are what
    /// the scorer gives, and greedy sampling is the model's greedy search
    /// (`VlModel::greedy`, transformers' `generate` in the golden tests).
    #[test]
    fn a_vision_language_directory_samples_and_scores_as_a_plan_policy() {
        for family in VlFamily::NAMES {
            let dir = tempfile::tempdir().unwrap();
            write_model(dir.path(), family);
            assert_eq!(policy_kind(dir.path()).unwrap(), PolicyKind::Hf);
            assert!(policy_net(dir.path()).unwrap().is::<VlPolicy>());
            let policy = load(dir.path()).unwrap();
            assert!(policy.model.config().processor.is_some());
            let text = "Task: find a Mug 3";
            let prompt = policy.prompt_ids(text).unwrap();
            assert_eq!(policy.prompt_text(&prompt).unwrap(), text);
            let prompts = vec![prompt, policy.prompt_ids("put the apple").unwrap()];
            let sampling = Sampling {
                temperature: 1.3,
                top_p: 1.0,
                max_new_tokens: 8,
            };
            let sampled = sample(&policy, &prompts, &[1, 2], &sampling);
            assert_sampled_are_scored(&policy, &prompts, &sampled, 1.3);
            let greedy = Sampling {
                temperature: 0.0,
                ..sampling
            };
            let sampled = sample(&policy, &prompts, &[1, 2], &greedy);
            let reference = VlModel::load(dir.path(), tch::Device::Cpu).unwrap();
            for (prompt, s) in prompts.iter().zip(&sampled) {
                let ids: Vec<i64> = prompt.iter().map(|&id| i64::from(id)).collect();
                let ids = Tensor::from_slice(&ids).view([1, -1]);
                let eos = i64::from(policy.special.eos);
                let pad = i64::from(policy.special.pad);
                let tokens = reference
                    .greedy(&ids, &ids.ones_like(), None, 8, Some(eos), pad)
                    .unwrap();
                let tokens: Vec<i32> = Vec::<i64>::try_from(tokens.view([-1]))
                    .unwrap()
                    .into_iter()
                    .map(|t| t as i32)
                    .take(s.response_ids.len())
                    .collect();
                assert_eq!(s.response_ids, tokens, "{family}");
            }
        }
    }

    /// Saving writes transformers' layout with the processor carried, and
    /// the reloaded policy scores the same.
    #[test]
    fn a_saved_vision_language_policy_reloads_with_the_same_logits() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), "qwen2_5_vl");
        let policy = load(dir.path()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let saved = out.path().join("policy");
        policy.save(&saved, "update-policy", false).unwrap();
        assert_eq!(
            std::fs::read(saved.join(PROCESSOR_FILE)).unwrap(),
            std::fs::read(dir.path().join(PROCESSOR_FILE)).unwrap()
        );
        let again = load(&saved).unwrap();
        let prompt = [policy.prompt_ids("put the apple").unwrap()];
        let prompts: Vec<&[i32]> = prompt.iter().map(Vec::as_slice).collect();
        let response: [&[i32]; 1] = [&[20, 21, 22]];
        let a = score_responses(&policy, &prompts, &response, 1.0, Entropy::Skip).logprobs;
        let b = score_responses(&again, &prompts, &response, 1.0, Entropy::Skip).logprobs;
        assert_eq!(
            Vec::<f32>::try_from(a.view([-1])).unwrap(),
            Vec::<f32>::try_from(b.view([-1])).unwrap()
        );
    }

    /// A prompt carries its image into the model: the same text with
    /// another image scores the same answer differently, and what the
    /// sampler records under an image is what the scorer gives under it
    /// (rows with and without images, one repeated), in both families.
    #[test]
    fn the_image_reaches_the_scores_and_sampling_scores_what_it_saw() {
        for family in VlFamily::NAMES {
            let dir = tempfile::tempdir().unwrap();
            write_model(dir.path(), family);
            let policy = load(dir.path()).unwrap();
            let text = "Task: find a Mug 3";
            let with = |seed| policy.prompt(text, vec![image(seed)]).unwrap();
            let (a, b) = (with(1), with(2));
            // 32 × 32 pixels: an 8 × 8 patch grid, 16 merged tokens for
            // the one placeholder the template writes.
            let plain = policy.prompt_ids(text).unwrap();
            assert_eq!(a.ids.len(), plain.len() + 3 + 15, "{family}");
            assert_eq!(a.ids, b.ids, "{family}: same size, same placeholders");
            assert_eq!(policy.prompt_text(&a.ids).unwrap(), text);
            policy.model.check_images(&a.ids, &a.images).unwrap();
            let response: [&[i32]; 1] = [&[20, 21, 22, 23]];
            let score = |prompt: &Prompt| {
                let scores = score_responses(&policy, &[prompt], &response, 1.0, Entropy::Skip);
                Vec::<f32>::try_from(scores.logprobs.view([-1])).unwrap()
            };
            let (sa, sb) = (score(&a), score(&b));
            let moved = sa
                .iter()
                .zip(&sb)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(
                moved > 1e-3,
                "{family}: another image moved no log-prob ({sa:?})"
            );
            assert_eq!(sa, score(&a), "{family}: deterministic");
            let prompts = vec![
                a.clone(),
                b,
                Prompt {
                    ids: plain,
                    images: Vec::new(),
                },
                a,
            ];
            let sampling = Sampling {
                temperature: 1.3,
                top_p: 1.0,
                max_new_tokens: 6,
            };
            let sampled = sample(&policy, &prompts, &[1, 2, 3, 4], &sampling);
            assert_sampled_are_scored(&policy, &prompts, &sampled, 1.3);
        }
    }

    /// A policy that reads text only is given the text alone; a vision
    /// model's prompt whose placeholders do not match its images, or an
    /// image the processor cannot resize, is bad input saying which.
    #[test]
    fn placeholders_that_miss_their_images_and_unresizable_images_are_refused() {
        let text_only = crate::testing::tiny_policy(48);
        let prompt = text_only.prompt("find a Mug", vec![image(1)]).unwrap();
        assert!(prompt.images.is_empty());
        assert_eq!(prompt.ids, text_only.prompt_ids("find a Mug").unwrap());
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), "qwen2_5_vl");
        let policy = load(dir.path()).unwrap();
        let prompt = policy.prompt("find a Mug", vec![image(1)]).unwrap();
        let bad_input = |result: Result<(), ModelError>| {
            let error = result.unwrap_err();
            assert_eq!(
                embodyflow_core::Classify::kind(&error),
                embodyflow_core::ErrorKind::BadInput,
                "{error}"
            );
            error.to_string()
        };
        let error = bad_input(policy.model.check_images(&prompt.ids, &[]));
        assert!(
            error.contains("1 image placeholder run(s)") && error.contains("0 image(s) given"),
            "{error}"
        );
        let error = bad_input(
            policy
                .model
                .check_images(&prompt.ids, &[image(1), image(2)]),
        );
        assert!(error.contains("2 image(s) given"), "{error}");
        let image_token = policy.model.image_token().unwrap();
        let at = prompt.ids.iter().position(|&t| t == image_token).unwrap();
        let mut short = prompt.ids.clone();
        short.remove(at);
        let error = bad_input(policy.model.check_images(&short, &prompt.images));
        assert!(
            error.contains("takes 16 placeholders") && error.contains("a run of 15"),
            "{error}"
        );
        // A processor whose pixel budget no resize of a 32 × 32 image meets.
        let processor = serde_json::json!({"patch_size": 4, "merge_size": 2,
            "temporal_patch_size": 2, "min_pixels": 16, "max_pixels": 32});
        std::fs::write(dir.path().join(PROCESSOR_FILE), processor.to_string()).unwrap();
        let policy = load(dir.path()).unwrap();
        let error = policy.prompt("find a Mug", vec![image(1)]).unwrap_err();
        assert_eq!(
            embodyflow_core::Classify::kind(&error),
            embodyflow_core::ErrorKind::BadInput
        );
        let error = error.to_string();
        for needle in [PROCESSOR_FILE, "`max_pixels`", "image 0", "32 x 32"] {
            assert!(error.contains(needle), "lacks {needle}: {error}");
        }
    }

    /// The video placeholder in a prompt is refused, naming the token:
    /// in a task's text (with and without a scene image) and in prompt ids
    /// read back from a table; an image placeholder in the text of a
    /// prompt given no image is refused as well.
    #[test]
    fn a_prompt_holding_the_video_placeholder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), "qwen3_vl");
        let policy = load(dir.path()).unwrap();
        let video = policy.model.video_token().unwrap();
        let bad_input = |error: ModelError| {
            assert_eq!(
                embodyflow_core::Classify::kind(&error),
                embodyflow_core::ErrorKind::BadInput,
                "{error}"
            );
            error.to_string()
        };
        let text = "find a Mug <|video_pad|>";
        for images in [vec![], vec![image(1)]] {
            let error = bad_input(policy.prompt(text, images).unwrap_err());
            for needle in [
                "`<|video_pad|>`",
                &format!("token {video}"),
                "`video_token_id`",
            ] {
                assert!(error.contains(needle), "lacks {needle}: {error}");
            }
        }
        let mut prompt = policy.prompt("find a Mug", vec![image(1)]).unwrap();
        policy
            .model
            .check_images(&prompt.ids, &prompt.images)
            .unwrap();
        prompt.ids.insert(3, video);
        let error = bad_input(
            policy
                .model
                .check_images(&prompt.ids, &prompt.images)
                .unwrap_err(),
        );
        assert!(error.contains("`<|video_pad|>`"), "{error}");
        let error = bad_input(policy.prompt("find <|image_pad|>", vec![]).unwrap_err());
        assert!(error.contains("1 image placeholders"), "{error}");
    }

    /// An image or video placeholder sampled into a response is a text
    /// token to the scorer, as it was to decoding: the scored log-probs of
    /// a response holding both equal those of feeding it token by token
    /// through the cache after the prompt and its image.
    #[test]
    fn placeholders_sampled_into_a_response_score_as_decoding_read_them() {
        for family in VlFamily::NAMES {
            let dir = tempfile::tempdir().unwrap();
            write_model(dir.path(), family);
            let policy = load(dir.path()).unwrap();
            let prompt = policy.prompt("find a Mug", vec![image(1)]).unwrap();
            let image_token = policy.model.image_token().unwrap();
            let video_token = policy.model.video_token().unwrap();
            let response = [20, image_token, 21, video_token, image_token, 22];
            let scored = score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip);
            let scored = Vec::<f32>::try_from(scored.logprobs.view([-1])).unwrap();
            let net = policy.model.net();
            let images = policy.model.process(&prompt.images).unwrap();
            let ids: Vec<i64> = prompt.ids.iter().map(|&t| i64::from(t)).collect();
            let ids = Tensor::from_slice(&ids).view([1, -1]);
            let mut cache = VlCache::default();
            let mut length = ids.size()[1];
            let mut logits = net
                .forward_cached(&ids, &ids.ones_like(), Some(&images), &mut cache)
                .unwrap();
            let mut decoded = Vec::new();
            for &token in &response {
                let last = logits.select(1, -1).log_softmax(-1, tch::Kind::Float);
                decoded.push(last.double_value(&[0, i64::from(token)]));
                length += 1;
                let next = Tensor::from_slice(&[i64::from(token)]).view([1, 1]);
                let mask = Tensor::ones([1, length], (tch::Kind::Int64, tch::Device::Cpu));
                logits = net.forward_cached(&next, &mask, None, &mut cache).unwrap();
            }
            for (a, b) in scored.iter().zip(&decoded) {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-4,
                    "{family}: scored {scored:?}, decoded {decoded:?}"
                );
            }
        }
    }

    /// What a directory holds is named: a vision-language model loaded as a
    /// text decoder, an unknown `model_type`, a vision config we cannot
    /// run, a processor of another model.
    #[test]
    fn bad_vision_language_directories_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), "qwen2_5_vl");
        let error = load_refused::<HfNet>(dir.path());
        assert!(
            error.contains("config.json")
                && error.contains(
                    "holds a hugging face vision-language policy, expected a hugging face policy"
                ),
            "{error}"
        );
        let config_file = dir.path().join("config.json");
        let written = std::fs::read_to_string(&config_file).unwrap();
        let edit = |from: &str, to: &str| {
            assert!(written.contains(from), "{from}");
            std::fs::write(&config_file, written.replace(from, to)).unwrap();
        };
        edit("\"qwen2_5_vl\"", "\"qwen9_vl\"");
        let error = policy_kind(dir.path()).unwrap_err().to_string();
        for needle in [
            "config.json",
            "`model_type`",
            "qwen9_vl",
            "qwen2_5_vl, qwen3_vl",
            "qwen2, qwen3, llama",
        ] {
            assert!(error.contains(needle), "lacks {needle}: {error}");
        }
        assert!(load_refused::<VlPolicy>(dir.path()).contains("qwen9_vl"));
        edit("\"depth\":2", "\"depth\":2,\"hidden_act\":\"relu\"");
        let error = load_refused::<VlPolicy>(dir.path());
        assert!(
            error.contains("config.json") && error.contains("vision_config.hidden_act"),
            "{error}"
        );
        std::fs::write(&config_file, &written).unwrap();
        load(dir.path()).unwrap();
        let processor = dir.path().join(PROCESSOR_FILE);
        let written_processor = std::fs::read_to_string(&processor).unwrap();
        for (key, value, model_key) in [
            ("patch_size", 8, "vision_config.patch_size"),
            ("merge_size", 4, "vision_config.spatial_merge_size"),
            (
                "temporal_patch_size",
                1,
                "vision_config.temporal_patch_size",
            ),
        ] {
            let mut edited: Value = serde_json::from_str(&written_processor).unwrap();
            edited[key] = value.into();
            std::fs::write(&processor, edited.to_string()).unwrap();
            let error = load_refused::<VlPolicy>(dir.path());
            for needle in [PROCESSOR_FILE, &format!("`{key}` is {value}"), model_key] {
                assert!(error.contains(needle), "{key}: lacks {needle}: {error}");
            }
        }
    }

    /// A tokenizer without the image part's tokens, or with one at another
    /// id than config.json gives it, is refused naming tokenizer.json, the
    /// token and the config key.
    #[test]
    fn a_tokenizer_without_the_image_tokens_is_refused_naming_token_and_key() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), "qwen2_5_vl");
        let tokenizer_file = dir.path().join(crate::checkpoint::TOKENIZER_FILE);
        let tokenizer = std::fs::read_to_string(&tokenizer_file).unwrap();
        for (token, key) in VISION_TOKENS {
            let renamed = token.replace('|', "!");
            std::fs::write(&tokenizer_file, tokenizer.replace(token, &renamed)).unwrap();
            let error = load_refused::<VlPolicy>(dir.path());
            for needle in ["tokenizer.json", &format!("lacks `{token}`"), key] {
                assert!(error.contains(needle), "{token}: lacks {needle}: {error}");
            }
        }
        std::fs::write(&tokenizer_file, &tokenizer).unwrap();
        let config_file = dir.path().join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
        let (image, video) = (
            config["image_token_id"].as_i64().unwrap(),
            config["video_token_id"].as_i64().unwrap(),
        );
        config["image_token_id"] = video.into();
        std::fs::write(&config_file, config.to_string()).unwrap();
        let error = load_refused::<VlPolicy>(dir.path());
        let needle = format!(
            "holds `<|image_pad|>` as id {image}, but config.json `image_token_id` is {video}"
        );
        assert!(
            error.contains("tokenizer.json") && error.contains(&needle),
            "{error}"
        );
    }
}
