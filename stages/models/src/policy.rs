//! Running a policy on token sequences: batched sampling with a key/value
//! cache, and the per-token log-probs the update recomputes.
//!
//! Both place every row's real tokens at positions `0..`, and no real
//! position ever attends to a pad, so the log-probs the sampler records and
//! the ones the update recomputes are the same numbers up to float rounding
//! (the PPO ratio starts at 1; `sampled_logprobs_match_the_recomputed_ones`
//! checks 1e-4, and the scorer is checked against each row run alone). The
//! layouts differ by what each does best:
//! - sampling left-pads the prompts to a common length `L` (responses start
//!   at column `L`, so the decoding cache grows one column per step for the
//!   whole batch) under an explicit mask: causal, never reaching a pad key,
//!   a pad query attending to itself only (a fully masked row would be NaN);
//! - scoring ([`score_responses`]) right-pads each `prompt + response`, so
//!   plain causal attention (no mask: the flash kernel skips the upper
//!   triangle) is already right; when prompts repeat, each distinct prompt
//!   runs once and its keys and values serve all its responses.
//!
//! Sampling: logits of the last position are divided by the temperature `T`,
//! `log p = log_softmax(logits / T)`, and each row draws its token from its
//! own ChaCha8 stream seeded by the rollout's seed (inverse CDF; with `top_p <
//! 1` from the smallest set of tokens whose probability reaches `top_p`,
//! renormalised). The recorded log-prob is `log p` of the drawn token under
//! the full `logits / T` distribution, as veRL's actor recomputes it. Greedy
//! decoding (`T = 0`, transformers' `generate(do_sample=False)`) takes the
//! arg max (the lowest id among equal maxima) and records
//! `log_softmax(logits)`, the log-prob at `T = 1`: a distribution at
//! `T → 0` puts all its mass on the arg max (log-prob 0 whatever the
//! model), so PPO's `old_logprobs` are the model's own, and
//! [`score_responses`] at `T = 0` scores at 1 to match. A row stops
//! after writing `<|eos|>` or `max_new_tokens`; finished rows leave the batch
//! (the cache keeps only the running rows) once a quarter of it is done.
//! Identical prompts in a batch (a group's G samples) are encoded once.
//!
//! A prompt is token ids and the images its placeholders stand for
//! ([`AsPrompt`]: ids alone, `Vec<i32>` or `&[i32]`, are a prompt without
//! images; [`Prompt`] holds both, [`Checkpoint::prompt`] makes one for a
//! task). Both the sampler and the scorer hand each row's images to the
//! network ([`PlanNet::start`], [`PlanNet::response_logits`]): a
//! vision-language model runs them through its vision encoder, so the
//! recorded and the recomputed log-probs are of the same image; prompts
//! are the same when their ids and their images are.
//!
//! ```no_run
//! use embodyflow_models::{checkpoint::Checkpoint, policy::{sample, score_responses, Entropy, Sampling}};
//! let policy = Checkpoint::load("ckpt".as_ref(), tch::Device::Cpu).unwrap();
//! let prompts = vec![vec![5, 9, 1], vec![7, 1]];
//! let out = sample(&policy, &prompts, &[11, 12], &Sampling { temperature: 1.6, top_p: 1.0, max_new_tokens: 64 });
//! assert_eq!(out[0].response_ids.len(), out[0].logprobs.len());
//! let responses: Vec<&[i32]> = out.iter().map(|s| s.response_ids.as_slice()).collect();
//! let prompts: Vec<&[i32]> = prompts.iter().map(Vec::as_slice).collect();
//! let scores = score_responses(&policy, &prompts, &responses, 1.6, Entropy::Skip);
//! assert_eq!(scores.logprobs.size()[0], 2);
//! ```

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

pub use embodyflow_hf::image::RgbImage;

use crate::ModelError;
use crate::checkpoint::{Checkpoint, PolicyNet, PromptFormat};
use crate::gpt::{Gpt, KvCache};

/// A network that writes answers token by token: our plan policy ([`Gpt`])
/// or a Hugging Face decoder (`crate::hf`). [`sample`] and
/// [`score_responses`] run any of them; rows' real tokens start at position
/// 0 whatever their padding.
pub trait PlanNet: PolicyNet {
    /// The key/value cache of incremental decoding.
    type Cache;
    /// The longest sequence (prompt + answer) it runs.
    fn max_len(&self) -> usize;
    /// Logits per position.
    fn vocab(&self) -> usize;
    /// Logits `[rows, vocab]` (f32) at the last column of left-padded
    /// prompts `ids` `[rows, width]` (`pads`: each row's pad count; `images`:
    /// each row's images, empty for a network that sees none), and the
    /// cache holding them, with room for `capacity` positions in all.
    fn start(
        &self,
        ids: &Tensor,
        pads: &Tensor,
        images: &[&[RgbImage]],
        capacity: i64,
    ) -> (Tensor, Self::Cache);
    /// Logits `[rows, vocab]` (f32) after one more token per row, `next`
    /// `[rows]`, at column `column` of the left-padded batch.
    fn step(&self, cache: &mut Self::Cache, next: &Tensor, pads: &Tensor, column: i64) -> Tensor;
    /// Keeps the cache's rows `rows` (1-D i64, in that order, may repeat).
    fn keep_rows(cache: &mut Self::Cache, rows: &Tensor);
    /// Logits `[batch, longest, vocab]` (f32, with gradients when they are
    /// on) at the positions that predict each response token (`images`:
    /// each prompt's).
    fn response_logits(
        policy: &Checkpoint<Self>,
        prompts: &[&[i32]],
        images: &[&[RgbImage]],
        responses: &[&[i32]],
        longest: i64,
    ) -> Tensor;
    /// The video placeholder of a network that reads images
    /// (`<|video_pad|>`, config.json `video_token_id`): no video reaches
    /// the model, so a prompt holding it is refused and a teacher skips a
    /// response holding it; `None` for a network without one.
    fn video_token(&self) -> Option<i32> {
        None
    }
    /// `ids` (one placeholder per image, as the chat template writes them)
    /// with each image's placeholder expanded to the tokens it takes; a
    /// network that sees no images is never given any
    /// ([`Checkpoint::prompt`] leaves them out).
    fn expand_images(&self, ids: Vec<i32>, images: &[RgbImage]) -> Result<Vec<i32>, ModelError> {
        debug_assert!(images.is_empty(), "a network that sees no images");
        Ok(ids)
    }
    /// Fails, saying why, unless `ids` hold exactly the placeholders
    /// [`PlanNet::expand_images`] writes for `images` (a prompt read back
    /// from a table); a network that sees no images takes none.
    fn check_images(&self, ids: &[i32], images: &[RgbImage]) -> Result<(), ModelError> {
        let _ = ids;
        match images.len() {
            0 => Ok(()),
            n => Err(embodyflow_core::Error::BadInput(format!(
                "{n} images for a {} policy, which reads text only",
                Self::NAME
            ))
            .into()),
        }
    }
}

/// What a plan policy reads for one answer: the prompt's token ids and the
/// images its placeholders stand for, in order (none for a text prompt).
/// Token ids alone (`Vec<i32>`, `&[i32]`) are a prompt without images;
/// [`Prompt`] holds both.
pub trait AsPrompt {
    /// The token ids (a vision-language prompt's placeholders expanded).
    fn ids(&self) -> &[i32];
    /// The images, in the order of their placeholders.
    fn images(&self) -> &[RgbImage] {
        &[]
    }
}

impl AsPrompt for [i32] {
    fn ids(&self) -> &[i32] {
        self
    }
}

impl AsPrompt for Vec<i32> {
    fn ids(&self) -> &[i32] {
        self
    }
}

impl<T: AsPrompt + ?Sized> AsPrompt for &T {
    fn ids(&self) -> &[i32] {
        (**self).ids()
    }
    fn images(&self) -> &[RgbImage] {
        (**self).images()
    }
}

/// Borrowed ids and images.
impl AsPrompt for (&[i32], &[RgbImage]) {
    fn ids(&self) -> &[i32] {
        self.0
    }
    fn images(&self) -> &[RgbImage] {
        self.1
    }
}

/// A prompt with its images ([`Checkpoint::prompt`] makes one for a task).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompt {
    /// The token ids, each image's placeholder expanded to its tokens.
    pub ids: Vec<i32>,
    /// The images, in the order of their placeholders.
    pub images: Vec<RgbImage>,
}

impl AsPrompt for Prompt {
    fn ids(&self) -> &[i32] {
        &self.ids
    }
    fn images(&self) -> &[RgbImage] {
        &self.images
    }
}

impl<M: PlanNet> Checkpoint<M> {
    /// The prompt for a task's `text` and `images` (its scene image): the
    /// chat template's user turn with one image part per image, the
    /// placeholders expanded ([`PlanNet::expand_images`]). A policy that
    /// reads text only gets the text alone: the returned prompt then holds
    /// fewer images than given, which the caller reports.
    pub fn prompt(&self, text: &str, images: Vec<RgbImage>) -> Result<Prompt, ModelError> {
        if images.is_empty() || self.model.image_token().is_none() {
            return Ok(Prompt {
                ids: self.model.expand_images(self.prompt_ids(text)?, &[])?,
                images: Vec::new(),
            });
        }
        let PromptFormat::Chat {
            template: Some(template),
            ..
        } = &self.format
        else {
            return Err(ModelError::Tokenizer(
                "a prompt with images needs the model's chat template (tokenizer_config.json `chat_template` or chat_template.jinja)".into(),
            ));
        };
        let rendered = crate::prompt::render_user(template, text, images.len())?;
        let ids = crate::tokenizer::encode(&self.tokenizer, &rendered)?;
        Ok(Prompt {
            ids: self.model.expand_images(ids, &images)?,
            images,
        })
    }
}

impl PlanNet for Gpt {
    type Cache = KvCache;

    fn max_len(&self) -> usize {
        self.config().n_ctx as usize
    }

    fn vocab(&self) -> usize {
        self.config().vocab_size as usize
    }

    fn start(
        &self,
        ids: &Tensor,
        pads: &Tensor,
        _images: &[&[RgbImage]],
        capacity: i64,
    ) -> (Tensor, KvCache) {
        let (rows, width) = ids.size2().expect("ids are [rows, width]");
        let mut cache = self.empty_cache(rows, capacity);
        let hidden = self.hidden_masked(
            ids,
            &positions(pads, 0, width),
            &prefix_mask(pads, width),
            Some(&mut cache),
        );
        (self.logits(&hidden.select(1, width - 1)), cache)
    }

    fn step(&self, cache: &mut KvCache, next: &Tensor, pads: &Tensor, column: i64) -> Tensor {
        let keys = Tensor::arange(column + 1, (Kind::Int64, next.device()));
        let mask = keys
            .unsqueeze(0)
            .ge_tensor(&pads.unsqueeze(1))
            .view([-1, 1, 1, column + 1]);
        let hidden = self.hidden_masked(
            &next.unsqueeze(1),
            &positions(pads, column, 1),
            &mask,
            Some(cache),
        );
        self.logits(&hidden.select(1, 0))
    }

    fn keep_rows(cache: &mut KvCache, rows: &Tensor) {
        cache.keep_rows(rows);
    }

    fn response_logits(
        policy: &Checkpoint,
        prompts: &[&[i32]],
        _images: &[&[RgbImage]],
        responses: &[&[i32]],
        longest: i64,
    ) -> Tensor {
        let (unique, rows) = distinct(prompts.iter().copied());
        // The hidden state that predicts each response token: [batch, longest, embd].
        let hidden = if unique.len() == prompts.len() {
            causal_response_hidden(policy, prompts, responses, longest)
        } else {
            shared_prompt_response_hidden(policy, &unique, &rows, prompts, responses, longest)
        };
        policy.model.logits(&hidden)
    }
}

/// How to draw responses.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 means greedy.
    pub temperature: f64,
    /// Nucleus mass (1 = the whole distribution).
    pub top_p: f64,
    /// Most tokens per response (also bounded by the model's context).
    pub max_new_tokens: usize,
}

/// One sampled response.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The response's token ids (ending with `<|eos|>` unless cut at the limit).
    pub response_ids: Vec<i32>,
    /// Log-prob of each response token under `logits / T`.
    pub logprobs: Vec<f32>,
}

/// Left-pads `prompts` into `[batch, width]` ids; returns them with each
/// row's pad count.
fn left_padded(prompts: &[&[i32]], width: usize, pad: i32) -> (Vec<i64>, Vec<i64>) {
    let mut ids = Vec::with_capacity(prompts.len() * width);
    let mut pads = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let pad_count = width - prompt.len();
        pads.push(pad_count as i64);
        ids.extend(std::iter::repeat_n(pad as i64, pad_count));
        ids.extend(prompt.iter().map(|&id| id as i64));
    }
    (ids, pads)
}

/// Positions `[batch, time]` of columns `start..start + time`: column minus
/// the row's pad count, never below 0.
fn positions(pads: &Tensor, start: i64, time: i64) -> Tensor {
    let columns = Tensor::arange_start(start, start + time, (Kind::Int64, pads.device()));
    (columns.unsqueeze(0) - pads.unsqueeze(1)).clamp_min(0)
}

/// Attention mask `[batch, 1, time, time]` of a full left-padded forward pass.
fn prefix_mask(pads: &Tensor, time: i64) -> Tensor {
    let device = pads.device();
    let columns = Tensor::arange(time, (Kind::Int64, device));
    let causal = columns.unsqueeze(1).ge_tensor(&columns.unsqueeze(0)); // [q, k]: k <= q
    let key_valid = columns.unsqueeze(0).ge_tensor(&pads.unsqueeze(1)); // [b, k]
    let diagonal = Tensor::eye(time, (Kind::Bool, device));
    (causal.unsqueeze(0).logical_and(&key_valid.unsqueeze(1)))
        .logical_or(&diagonal.unsqueeze(0))
        .unsqueeze(1)
}

/// Draws responses for `prompts` (ours end with `<|plan|>`; a prompt may
/// carry images, [`AsPrompt`]), one stream per row seeded by `seeds[row]`.
pub fn sample<M: PlanNet, P: AsPrompt>(
    policy: &Checkpoint<M>,
    prompts: &[P],
    seeds: &[u64],
    sampling: &Sampling,
) -> Vec<Sampled> {
    assert_eq!(prompts.len(), seeds.len(), "one seed per prompt");
    if prompts.is_empty() {
        return Vec::new();
    }
    tch::no_grad(|| sample_batch(policy, prompts, seeds, sampling))
}

fn sample_batch<M: PlanNet, P: AsPrompt>(
    policy: &Checkpoint<M>,
    prompts: &[P],
    seeds: &[u64],
    sampling: &Sampling,
) -> Vec<Sampled> {
    let model = &policy.model;
    let device = policy.vars.device();
    let width = prompts.iter().map(|p| p.ids().len()).max().unwrap_or(0);
    let n_ctx = model.max_len();
    assert!(
        width < n_ctx,
        "prompt of {width} tokens leaves no room in n_ctx {n_ctx}"
    );
    let max_new = sampling.max_new_tokens.min(n_ctx - width);
    // Identical prompts (the G samples of a group) are encoded once and
    // their cache rows copied.
    let (unique, rows) = distinct(prompts.iter().map(|p| (p.ids(), p.images())));
    let (unique_ids, unique_images): (Vec<&[i32]>, Vec<&[RgbImage]>) = unique.into_iter().unzip();
    let (ids, pads) = left_padded(&unique_ids, width, policy.special.pad);
    let width = width as i64;
    let ids = Tensor::from_slice(&ids)
        .view([unique_ids.len() as i64, width])
        .to(device);
    let pads = Tensor::from_slice(&pads).to(device);
    let (last, mut cache) = model.start(&ids, &pads, &unique_images, width + max_new as i64);
    let rows = Tensor::from_slice(&rows).to(device);
    let mut last = last.index_select(0, &rows);
    let mut pads = pads.index_select(0, &rows);
    M::keep_rows(&mut cache, &rows);
    let mut outputs: Vec<Sampled> = prompts
        .iter()
        .map(|_| Sampled {
            response_ids: Vec::new(),
            logprobs: Vec::new(),
        })
        .collect();
    let mut rngs: Vec<ChaCha8Rng> = seeds
        .iter()
        .map(|&s| ChaCha8Rng::seed_from_u64(s))
        .collect();
    // Batch row -> output index, for the rows still running.
    let mut running: Vec<usize> = (0..prompts.len()).collect();
    let mut done = vec![false; prompts.len()];
    let vocab = model.vocab();
    for step in 0..max_new {
        let logp = if sampling.temperature > 0.0 {
            (&last / sampling.temperature).log_softmax(-1, Kind::Float)
        } else {
            last.log_softmax(-1, Kind::Float)
        };
        let logp: Vec<f32> =
            Vec::<f32>::try_from(logp.to(Device::Cpu).view([-1])).expect("f32 log-probs");
        // Greedy: the arg max of the logits themselves (the first on a tie,
        // as torch's `argmax` in transformers' greedy search), not of the
        // rounded log-probs.
        let greedy: Vec<i64> = if sampling.temperature > 0.0 {
            Vec::new()
        } else {
            Vec::<i64>::try_from(last.argmax(-1, false).to(Device::Cpu)).expect("i64 ids")
        };
        let mut next = Vec::with_capacity(running.len());
        for (row, &out) in running.iter().enumerate() {
            if done[out] {
                next.push(policy.special.pad as i64);
                continue;
            }
            let row_logp = &logp[row * vocab..(row + 1) * vocab];
            let token = if sampling.temperature > 0.0 {
                draw(row_logp, sampling.top_p, &mut rngs[out])
            } else {
                greedy[row] as usize
            };
            outputs[out].response_ids.push(token as i32);
            outputs[out].logprobs.push(row_logp[token]);
            next.push(token as i64);
            done[out] = policy.stops(token as i32);
        }
        let still: Vec<usize> = (0..running.len())
            .filter(|&row| !done[running[row]])
            .collect();
        if still.is_empty() || step + 1 == max_new {
            break;
        }
        let mut next = Tensor::from_slice(&next).to(device);
        if still.len() * 4 <= running.len() * 3 {
            let keep =
                Tensor::from_slice(&still.iter().map(|&r| r as i64).collect::<Vec<_>>()).to(device);
            M::keep_rows(&mut cache, &keep);
            pads = pads.index_select(0, &keep);
            next = next.index_select(0, &keep);
            running = still.iter().map(|&row| running[row]).collect();
        }
        last = model.step(&mut cache, &next, &pads, width + step as i64);
    }
    outputs
}

/// Inverse-CDF draw from `logp`, restricted to the top-`top_p` nucleus.
pub(crate) fn draw(logp: &[f32], top_p: f64, rng: &mut ChaCha8Rng) -> usize {
    let u: f64 = rng.random();
    if top_p >= 1.0 {
        let mut cumulative = 0.0f64;
        for (token, &lp) in logp.iter().enumerate() {
            cumulative += (lp as f64).exp();
            if u < cumulative {
                return token;
            }
        }
        return arg_max(logp);
    }
    let mut order: Vec<usize> = (0..logp.len()).collect();
    order.sort_unstable_by(|&a, &b| logp[b].total_cmp(&logp[a]).then(a.cmp(&b)));
    let mut nucleus = 0.0f64;
    let mut size = 0;
    for &token in &order {
        nucleus += (logp[token] as f64).exp();
        size += 1;
        if nucleus >= top_p {
            break;
        }
    }
    let target = u * nucleus;
    let mut cumulative = 0.0f64;
    for &token in &order[..size] {
        cumulative += (logp[token] as f64).exp();
        if target < cumulative {
            return token;
        }
    }
    order[0]
}

pub(crate) fn arg_max(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Which entropies [`score_responses`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entropy {
    /// None: nothing reads them (teacher-logp).
    Skip,
    /// Without gradients, for a metric only (update-policy with `ppo.entropy_coef = 0`).
    Metric,
    /// With gradients, for an entropy bonus in the loss.
    Loss,
}

impl Entropy {
    /// The entropy `-Σ p log p` over the last dimension of `log_probs`
    /// (normalised log-probabilities, e.g. `[batch, tokens, vocab]`) as
    /// asked: none, without gradients, or with them.
    pub fn of(self, log_probs: &Tensor) -> Option<Tensor> {
        let entropy = || -(log_probs.exp() * log_probs).sum_dim_intlist(-1, false, Kind::Float);
        match self {
            Entropy::Skip => None,
            Entropy::Metric => Some(tch::no_grad(entropy)),
            Entropy::Loss => Some(entropy()),
        }
    }
}

/// Per-token results of a forward pass over prompt + response pairs, each
/// `[batch, longest response]`.
pub struct ResponseScores {
    /// Log-prob of each response token under `logits / T`.
    pub logprobs: Tensor,
    /// Entropy of the `logits / T` distribution at each response token
    /// (`None` with [`Entropy::Skip`]).
    pub entropy: Option<Tensor>,
    /// 1 on real response tokens, 0 on padding (float).
    pub mask: Tensor,
}

/// Each distinct prompt once, in order of first appearance, and the index
/// of each row's prompt among them.
fn distinct<K: Copy + Eq + std::hash::Hash>(
    prompts: impl Iterator<Item = K>,
) -> (Vec<K>, Vec<i64>) {
    let mut unique: Vec<K> = Vec::new();
    let mut index_of: HashMap<K, i64> = HashMap::new();
    let rows = prompts
        .map(|prompt| {
            *index_of.entry(prompt).or_insert_with(|| {
                unique.push(prompt);
                unique.len() as i64 - 1
            })
        })
        .collect();
    (unique, rows)
}

/// `rows` right-padded with `pad` into `[rows, width]` ids.
pub(crate) fn right_padded<'a>(
    rows: impl Iterator<Item = Vec<&'a [i32]>>,
    width: usize,
    pad: i32,
) -> Vec<i64> {
    let mut ids = Vec::new();
    for parts in rows {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        for part in parts {
            ids.extend(part.iter().map(|&id| id as i64));
        }
        ids.extend(std::iter::repeat_n(pad as i64, width - len));
    }
    ids
}

/// Log-probs (and, as asked, entropies) of `responses` after `prompts` under
/// the policy at temperature `temperature` (1 for supervised training; 0,
/// greedy decoding's, reads as 1), with
/// gradients when gradients are on. Each prompt (at least one token) +
/// response must fit in `n_ctx`.
///
/// The layout: every row's real tokens start at position 0, as in the
/// sampler, so the log-probs are the sampler's (see the module doc). When
/// every prompt is distinct, each row is `prompt + response` right-padded
/// and runs under plain causal attention (no mask). When prompts repeat (a
/// group's G samples), each distinct prompt runs once ([`Gpt::prefix`],
/// right-padded), and the responses continue it ([`Gpt::hidden_after`]),
/// attending to its real keys and causally among themselves, in classes of
/// similar length (a short response is not padded to the batch's longest);
/// the gradient reaching a shared prompt is the sum over its rows.
///
/// [`Gpt::prefix`]: crate::gpt::Gpt::prefix
/// [`Gpt::hidden_after`]: crate::gpt::Gpt::hidden_after
pub fn score_responses<M: PlanNet, P: AsPrompt>(
    policy: &Checkpoint<M>,
    prompts: &[P],
    responses: &[&[i32]],
    temperature: f64,
    entropy: Entropy,
) -> ResponseScores {
    assert_eq!(prompts.len(), responses.len());
    let images: Vec<&[RgbImage]> = prompts.iter().map(AsPrompt::images).collect();
    let prompts: Vec<&[i32]> = prompts.iter().map(AsPrompt::ids).collect();
    let device = policy.vars.device();
    let n_ctx = policy.model.max_len();
    let pad = policy.special.pad;
    for (prompt, response) in prompts.iter().zip(responses) {
        assert!(!prompt.is_empty(), "a prompt has at least one token");
        assert!(
            prompt.len() + response.len() <= n_ctx,
            "prompt of {} + response of {} tokens exceeds n_ctx {n_ctx}",
            prompt.len(),
            response.len()
        );
    }
    let batch = prompts.len() as i64;
    let longest = responses.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut mask = Vec::with_capacity(prompts.len() * longest);
    for response in responses {
        mask.extend(std::iter::repeat_n(1.0f32, response.len()));
        mask.extend(std::iter::repeat_n(0.0f32, longest - response.len()));
    }
    let targets = right_padded(responses.iter().map(|r| vec![*r]), longest, pad);
    let longest = longest as i64;
    let mask = Tensor::from_slice(&mask).view([batch, longest]).to(device);
    if longest == 0 {
        let empty = Tensor::zeros([batch, 0], (Kind::Float, device));
        return ResponseScores {
            logprobs: empty.shallow_clone(),
            entropy: (entropy != Entropy::Skip).then(|| empty.shallow_clone()),
            mask,
        };
    }
    let logits = M::response_logits(policy, &prompts, &images, responses, longest);
    // T = 0 is greedy decoding, whose recorded log-probs are at T = 1.
    let scale = if temperature > 0.0 { temperature } else { 1.0 };
    let log_probs = (logits / scale).log_softmax(-1, Kind::Float);
    let targets = Tensor::from_slice(&targets)
        .view([batch, longest])
        .to(device);
    let logprobs = log_probs
        .gather(2, &targets.unsqueeze(2), false)
        .squeeze_dim(2);
    ResponseScores {
        logprobs,
        entropy: entropy.of(&log_probs),
        mask,
    }
}

/// Every row `prompt + response` (the last response token is only a
/// target) right-padded, under plain causal attention; the hidden states at
/// columns `prompt - 1 ..` predict the response.
fn causal_response_hidden(
    policy: &Checkpoint,
    prompts: &[&[i32]],
    responses: &[&[i32]],
    longest: i64,
) -> Tensor {
    let (ids, _) = scoring_rows(prompts, responses, policy.special.pad, policy.vars.device());
    response_positions(&policy.model.hidden_causal(&ids), prompts, longest)
}

/// Every row `prompt + response` without the response's last token (only a
/// target), right-padded with `pad` into `[batch, width]` ids on `device`,
/// and each row's length.
pub(crate) fn scoring_rows(
    prompts: &[&[i32]],
    responses: &[&[i32]],
    pad: i32,
    device: tch::Device,
) -> (Tensor, Vec<usize>) {
    let rows = || {
        prompts
            .iter()
            .zip(responses)
            .map(|(prompt, response)| vec![*prompt, &response[..response.len().saturating_sub(1)]])
    };
    let lengths: Vec<usize> = rows()
        .map(|parts| parts.iter().map(|p| p.len()).sum())
        .collect();
    let width = lengths.iter().copied().max().unwrap_or(0);
    let ids = Tensor::from_slice(&right_padded(rows(), width, pad))
        .view([prompts.len() as i64, width as i64])
        .to(device);
    (ids, lengths)
}

/// Row `b` of `values` (`[batch, width, depth]`, a forward pass over
/// right-padded `prompt + response` rows) at columns `prompt_b - 1 ..
/// prompt_b - 1 + longest`, clamped to the last column: the positions
/// whose outputs predict each response token.
pub(crate) fn response_positions(values: &Tensor, prompts: &[&[i32]], longest: i64) -> Tensor {
    let size = values.size();
    let (batch, width, depth) = (size[0], size[1], size[2]);
    let mut columns = Vec::with_capacity(prompts.len() * longest as usize);
    for prompt in prompts {
        let first = prompt.len() as i64 - 1;
        columns.extend((0..longest).map(|k| (first + k).min(width - 1)));
    }
    let columns = Tensor::from_slice(&columns)
        .view([batch, longest, 1])
        .to(values.device());
    values.gather(1, &columns.expand([batch, longest, depth], false), false)
}

/// The distinct prompts `unique` run once, right-padded; row `b` continues
/// prompt `rows[b]` with its response (but the last token) at positions
/// `prompt + k`, attending to that prompt's real keys and causally to its
/// own, in classes of similar response length. The first response token is
/// predicted by the prompt's last hidden state, the others by the
/// continuation's.
fn shared_prompt_response_hidden(
    policy: &Checkpoint,
    unique: &[&[i32]],
    rows: &[i64],
    prompts: &[&[i32]],
    responses: &[&[i32]],
    longest: i64,
) -> Tensor {
    let model = &policy.model;
    let device = policy.vars.device();
    let pad = policy.special.pad;
    let width = unique.iter().map(|p| p.len()).max().unwrap_or(0) as i64;
    let prompt_ids = Tensor::from_slice(&right_padded(
        unique.iter().map(|p| vec![*p]),
        width as usize,
        pad,
    ))
    .view([unique.len() as i64, width])
    .to(device);
    let (prompt_hidden, prefix) = model.prefix(&prompt_ids);
    let embd = prompt_hidden.size()[2];
    let last: Vec<i64> = rows
        .iter()
        .zip(prompts)
        .map(|(&row, prompt)| row * width + prompt.len() as i64 - 1)
        .collect();
    let first = prompt_hidden
        .view([-1, embd])
        .index_select(0, &Tensor::from_slice(&last).to(device))
        .unsqueeze(1);
    let new = longest - 1;
    if new == 0 {
        return first;
    }
    // The continuations run in length classes (widths within 2/3 of their
    // class's longest), all on the one prefix: padding a short response to
    // the longest of the batch would cost more than the extra passes.
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by_key(|&row| std::cmp::Reverse(responses[row].len()));
    let mut classes: Vec<Vec<usize>> = Vec::new();
    for row in order {
        let width = responses[row].len().saturating_sub(1);
        match classes.last_mut() {
            Some(class) if 3 * width >= 2 * responses[class[0]].len().saturating_sub(1) => {
                class.push(row)
            }
            _ => classes.push(vec![row]),
        }
    }
    let mut parts = Vec::with_capacity(classes.len());
    for class in &classes {
        let part = continue_prefix(policy, &prefix, width, rows, prompts, responses, class);
        parts.push(part.constant_pad_nd([0, 0, 0, new - part.size()[1]]));
    }
    // Back from class order to the batch's.
    let mut inverse = vec![0i64; prompts.len()];
    for (at, &row) in classes.iter().flatten().enumerate() {
        inverse[row] = at as i64;
    }
    let hidden = Tensor::cat(&parts, 0).index_select(0, &Tensor::from_slice(&inverse).to(device));
    Tensor::cat(&[first, hidden], 1)
}

/// Hidden states `[class rows, widest - 1, embd]` of the responses of the
/// batch rows `class` (but their last tokens), continuing `prefix` (prompts
/// right-padded to `width`; row `b` continues prefix row `rows[b]`) at
/// positions `prompt + k`, attending to their prompt's real keys and
/// causally to their own.
fn continue_prefix(
    policy: &Checkpoint,
    prefix: &crate::gpt::Prefix,
    width: i64,
    rows: &[i64],
    prompts: &[&[i32]],
    responses: &[&[i32]],
    class: &[usize],
) -> Tensor {
    let model = &policy.model;
    let device = policy.vars.device();
    let batch = class.len() as i64;
    let new = class
        .iter()
        .map(|&row| responses[row].len().saturating_sub(1))
        .max()
        .unwrap_or(0)
        .max(1) as i64;
    let continuation = right_padded(
        class.iter().map(|&row| {
            let r = responses[row];
            vec![&r[..r.len().saturating_sub(1)]]
        }),
        new as usize,
        policy.special.pad,
    );
    let ids = Tensor::from_slice(&continuation)
        .view([batch, new])
        .to(device);
    let n_ctx = model.config().n_ctx;
    let lengths: Vec<i64> = class.iter().map(|&row| prompts[row].len() as i64).collect();
    let lengths = Tensor::from_slice(&lengths).to(device);
    let steps = Tensor::arange(new, (Kind::Int64, device));
    let positions = (lengths.unsqueeze(1) + steps.unsqueeze(0)).clamp_max(n_ctx - 1);
    let prompt_keys = Tensor::arange(width, (Kind::Int64, device))
        .unsqueeze(0)
        .lt_tensor(&lengths.unsqueeze(1)) // [batch, width]: a real prompt key
        .unsqueeze(1)
        .expand([batch, new, width], false);
    let causal = steps
        .unsqueeze(0)
        .le_tensor(&steps.unsqueeze(1)) // [query, key]: key <= query
        .unsqueeze(0)
        .expand([batch, new, new], false);
    let mask = Tensor::cat(&[prompt_keys, causal], 2).unsqueeze(1);
    let prefix_rows: Vec<i64> = class.iter().map(|&row| rows[row]).collect();
    let prefix_rows = Tensor::from_slice(&prefix_rows).to(device);
    model.hidden_after(prefix, &prefix_rows, &ids, &positions, &mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared tiny policy with a context of 48 tokens.
    fn tiny_policy() -> Checkpoint {
        crate::testing::tiny_policy(48)
    }

    fn prompts() -> Vec<Vec<i32>> {
        // The last row repeats the first, as a group's samples do.
        vec![
            vec![5, 9, 12, 30, 1],
            vec![7, 1],
            vec![40, 41, 42, 1],
            vec![5, 9, 12, 30, 1],
        ]
    }

    #[test]
    fn sampled_logprobs_match_the_recomputed_ones() {
        let policy = tiny_policy();
        let sampling = Sampling {
            temperature: 1.6,
            top_p: 1.0,
            max_new_tokens: 20,
        };
        let samples = sample(&policy, &prompts(), &[1, 2, 3, 4], &sampling);
        let responses: Vec<&[i32]> = samples.iter().map(|s| s.response_ids.as_slice()).collect();
        let prompts = prompts();
        let prompt_refs: Vec<&[i32]> = prompts.iter().map(Vec::as_slice).collect();
        let scores =
            tch::no_grad(|| score_responses(&policy, &prompt_refs, &responses, 1.6, Entropy::Skip));
        for (row, sampled) in samples.iter().enumerate() {
            assert!(!sampled.response_ids.is_empty());
            let recomputed: Vec<f32> = Vec::<f32>::try_from(
                scores
                    .logprobs
                    .get(row as i64)
                    .narrow(0, 0, sampled.logprobs.len() as i64),
            )
            .unwrap();
            for (a, b) in sampled.logprobs.iter().zip(&recomputed) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "row {row}: sampled {a} vs recomputed {b}"
                );
            }
            let mask_sum = scores
                .mask
                .get(row as i64)
                .sum(Kind::Float)
                .double_value(&[]);
            assert_eq!(mask_sum as usize, sampled.response_ids.len());
        }
    }

    #[test]
    fn a_batch_wider_than_n_ctx_is_scored() {
        let policy = tiny_policy();
        // 30 + 6 and 6 + 30 tokens fit n_ctx = 48 alone; a common prompt
        // column would be 30 + 30 wide (the short prompt repeats: its
        // continuations attend to 30 prompt columns and 29 of their own).
        let long: Vec<i32> = (0..30).map(|i| 5 + i % 50).collect();
        let short: Vec<i32> = vec![7, 1, 9, 12, 30, 1];
        let prompts: [&[i32]; 3] = [&long, &short, &short];
        let responses: [&[i32]; 3] = [&short, &long, &short[..2]];
        let together =
            tch::no_grad(|| score_responses(&policy, &prompts, &responses, 1.0, Entropy::Skip));
        assert_eq!(together.logprobs.size(), vec![3, 30]);
        for row in 0..3 {
            let alone = tch::no_grad(|| {
                score_responses(
                    &policy,
                    &prompts[row..=row],
                    &responses[row..=row],
                    1.0,
                    Entropy::Skip,
                )
            });
            let n = responses[row].len() as i64;
            let a = Vec::<f32>::try_from(alone.logprobs.get(0)).unwrap();
            let b =
                Vec::<f32>::try_from(together.logprobs.get(row as i64).narrow(0, 0, n)).unwrap();
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-4, "row {row}: {x} vs {y}");
            }
            let mask = together
                .mask
                .get(row as i64)
                .sum(Kind::Float)
                .double_value(&[]);
            assert_eq!(mask as i64, n);
        }
    }

    /// The scoring layout before the causal path, kept as the reference the
    /// new one must reproduce: prompts left-padded to the longest, responses
    /// after them, one forward pass under the explicit `prefix_mask`.
    fn left_padded_masked(
        policy: &Checkpoint,
        prompts: &[&[i32]],
        responses: &[&[i32]],
        temperature: f64,
    ) -> Tensor {
        let width = prompts.iter().map(|p| p.len()).max().unwrap();
        let longest = responses.iter().map(|r| r.len()).max().unwrap();
        let (ids, pads) = left_padded(prompts, width, policy.special.pad);
        let total = width + longest;
        let mut sequences = Vec::new();
        for (row, response) in responses.iter().enumerate() {
            sequences.extend_from_slice(&ids[row * width..(row + 1) * width]);
            sequences.extend(response.iter().map(|&id| id as i64));
            sequences.extend(std::iter::repeat_n(
                policy.special.pad as i64,
                longest - response.len(),
            ));
        }
        let (width, longest, total) = (width as i64, longest as i64, total as i64);
        let sequences = Tensor::from_slice(&sequences).view([prompts.len() as i64, total]);
        let pads = Tensor::from_slice(&pads);
        let hidden = policy.model.hidden_masked(
            &sequences.narrow(1, 0, total - 1),
            &positions(&pads, 0, total - 1),
            &prefix_mask(&pads, total - 1),
            None,
        );
        (policy.model.logits(&hidden.narrow(1, width - 1, longest)) / temperature)
            .log_softmax(-1, Kind::Float)
            .gather(2, &sequences.narrow(1, width, longest).unsqueeze(2), false)
            .squeeze_dim(2)
    }

    /// The ground truth: the row alone, unpadded, through `Gpt::forward`.
    fn alone(policy: &Checkpoint, prompt: &[i32], response: &[i32], temperature: f64) -> Vec<f32> {
        let sequence: Vec<i64> = prompt.iter().chain(response).map(|&id| id as i64).collect();
        let n = sequence.len() as i64;
        let ids = Tensor::from_slice(&sequence).view([1, n]);
        let logits = policy.model.forward(&ids.narrow(1, 0, n - 1));
        let p = prompt.len() as i64;
        let r = response.len() as i64;
        let logp = (logits.narrow(1, p - 1, r) / temperature)
            .log_softmax(-1, Kind::Float)
            .gather(2, &ids.narrow(1, p, r).unsqueeze(2), false);
        Vec::<f32>::try_from(logp.view([-1])).unwrap()
    }

    /// Prompts and responses of several lengths; `repeat` makes rows 3 and 4
    /// repeat the prompts of rows 0 and 1 (the shared-prompt path).
    fn pairs(repeat: bool) -> (Vec<Vec<i32>>, Vec<Vec<i32>>) {
        let mut prompts = vec![
            vec![5, 9, 12, 30, 1],
            vec![7, 1],
            vec![40, 41, 42, 43, 44, 45, 46, 1],
            vec![8, 20, 1],
            vec![50, 1],
        ];
        if repeat {
            prompts[3] = prompts[0].clone();
            prompts[4] = prompts[1].clone();
        }
        let responses = vec![
            vec![60, 61, 62],
            vec![63, 64, 65, 66, 67, 68, 69, 70, 71],
            vec![72],
            vec![73, 74, 75, 76, 77, 78],
            vec![79, 80],
        ];
        (prompts, responses)
    }

    fn slices(rows: &[Vec<i32>]) -> Vec<&[i32]> {
        rows.iter().map(Vec::as_slice).collect()
    }

    #[test]
    fn scores_equal_each_row_alone_and_the_left_padded_masked_path() {
        let policy = tiny_policy();
        for repeat in [false, true] {
            let (prompts, responses) = pairs(repeat);
            let (p, r) = (slices(&prompts), slices(&responses));
            let (scores, reference) = tch::no_grad(|| {
                (
                    score_responses(&policy, &p, &r, 1.3, Entropy::Skip),
                    left_padded_masked(&policy, &p, &r, 1.3),
                )
            });
            for row in 0..p.len() {
                let n = r[row].len() as i64;
                let ours =
                    Vec::<f32>::try_from(scores.logprobs.get(row as i64).narrow(0, 0, n)).unwrap();
                let masked =
                    Vec::<f32>::try_from(reference.get(row as i64).narrow(0, 0, n)).unwrap();
                let truth = tch::no_grad(|| alone(&policy, p[row], r[row], 1.3));
                for ((a, b), c) in ours.iter().zip(&masked).zip(&truth) {
                    assert!(
                        (a - c).abs() < 1e-5 && (b - c).abs() < 1e-5,
                        "repeat {repeat} row {row}: scored {a}, left-padded {b}, alone {c}"
                    );
                }
                let mask = Vec::<f32>::try_from(scores.mask.get(row as i64)).unwrap();
                assert_eq!(mask.iter().sum::<f32>() as i64, n);
            }
        }
    }

    fn gradients(policy: &Checkpoint) -> Vec<(String, Tensor)> {
        let mut grads: Vec<(String, Tensor)> = policy
            .vars
            .variables()
            .into_iter()
            .map(|(name, var)| (name, var.grad().copy()))
            .collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        grads
    }

    fn zero_gradients(policy: &Checkpoint) {
        for (_, var) in policy.vars.variables() {
            let mut grad = var.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        }
    }

    /// A shared prompt's gradient is the sum of its rows' gradients: the
    /// batch with repeated prompts backpropagates what each row alone does.
    #[test]
    fn shared_prompt_gradients_equal_the_rows_alone() {
        let policy = tiny_policy();
        let (prompts, responses) = pairs(true);
        let (p, r) = (slices(&prompts), slices(&responses));
        // Token weights make every position's gradient count differently.
        let weight = |row: usize, n: usize| -> Vec<f32> {
            (0..n).map(|t| 0.5 + 0.1 * (row * 7 + t) as f32).collect()
        };
        let longest = r.iter().map(|x| x.len()).max().unwrap();
        let weights: Vec<f32> = (0..p.len()).flat_map(|row| weight(row, longest)).collect();
        let weights = Tensor::from_slice(&weights).view([p.len() as i64, longest as i64]);
        zero_gradients(&policy);
        let scores = score_responses(&policy, &p, &r, 1.0, Entropy::Skip);
        (scores.logprobs * &scores.mask * &weights)
            .sum(Kind::Float)
            .backward();
        let together = gradients(&policy);
        zero_gradients(&policy);
        for row in 0..p.len() {
            let alone = score_responses(&policy, &p[row..=row], &r[row..=row], 1.0, Entropy::Skip);
            let w = Tensor::from_slice(&weight(row, r[row].len())).view([1, -1]);
            (alone.logprobs * w).sum(Kind::Float).backward();
        }
        let summed = gradients(&policy);
        for ((name, a), (_, b)) in together.iter().zip(&summed) {
            let scale = b.abs().max().double_value(&[]).max(1e-3);
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(
                diff < 1e-4 * scale,
                "{name}: gradients differ by {diff} (scale {scale})"
            );
        }
    }

    #[test]
    fn entropy_is_computed_only_as_asked() {
        let policy = tiny_policy();
        let (prompts, responses) = pairs(false);
        let (p, r) = (slices(&prompts), slices(&responses));
        let skip = score_responses(&policy, &p, &r, 1.0, Entropy::Skip);
        let metric = score_responses(&policy, &p, &r, 1.0, Entropy::Metric);
        let loss = score_responses(&policy, &p, &r, 1.0, Entropy::Loss);
        assert!(skip.entropy.is_none());
        let (metric, loss_entropy) = (metric.entropy.unwrap(), loss.entropy.unwrap());
        assert!(!metric.requires_grad() && loss_entropy.requires_grad());
        assert!(skip.logprobs.requires_grad());
        assert_eq!((metric - &loss_entropy).abs().max().double_value(&[]), 0.0);
        // The entropy of a distribution over the vocabulary: in (0, ln V].
        let vocab = policy.model.config().vocab_size as f64;
        let values = Vec::<f32>::try_from(loss_entropy.flatten(0, -1)).unwrap();
        assert!(
            values
                .iter()
                .all(|&h| h > 0.0 && f64::from(h) <= vocab.ln() + 1e-4)
        );
        assert!(skip.logprobs.equal(&loss.logprobs));
    }

    #[test]
    fn the_same_seed_gives_the_same_sample_whatever_the_batch() {
        let policy = tiny_policy();
        let sampling = Sampling {
            temperature: 1.0,
            top_p: 0.9,
            max_new_tokens: 12,
        };
        let together = sample(&policy, &prompts(), &[4, 5, 6, 7], &sampling);
        let alone = sample(&policy, &prompts()[1..2], &[5], &sampling);
        assert_eq!(together[1].response_ids, alone[0].response_ids);
        let repeated = sample(&policy, &prompts()[..1], &[7], &sampling);
        assert_eq!(together[3].response_ids, repeated[0].response_ids);
    }

    #[test]
    fn greedy_stops_at_the_limit_or_at_eos() {
        let policy = tiny_policy();
        let sampling = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 7,
        };
        for sampled in sample(&policy, &prompts(), &[0, 0, 0, 0], &sampling) {
            let eos_at = sampled
                .response_ids
                .iter()
                .position(|&t| t == policy.special.eos);
            match eos_at {
                Some(i) => assert_eq!(i + 1, sampled.response_ids.len()),
                None => assert_eq!(sampled.response_ids.len(), 7),
            }
        }
    }

    /// Greedy decoding (T = 0) takes the arg max of the logits at each step
    /// (checked against the model run on `prompt + response so far` alone),
    /// records the log-prob at T = 1, which the scorer at T = 0 reproduces,
    /// and draws nothing: any seeds give the same answers.
    #[test]
    fn greedy_is_the_arg_max_at_each_step_with_log_probs_at_1_and_seed_free() {
        let policy = tiny_policy();
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 9,
        };
        let sampled = sample(&policy, &prompts(), &[1, 2, 3, 4], &greedy);
        let again = sample(&policy, &prompts(), &[90, 91, 92, 93], &greedy);
        assert_eq!(sampled, again, "greedy draws nothing from the seeds");
        for (row, (prompt, s)) in prompts().iter().zip(&sampled).enumerate() {
            for (t, (&token, &logp)) in s.response_ids.iter().zip(&s.logprobs).enumerate() {
                let ids: Vec<i64> = prompt
                    .iter()
                    .chain(&s.response_ids[..t])
                    .map(|&id| i64::from(id))
                    .collect();
                let n = ids.len() as i64;
                let logits =
                    tch::no_grad(|| policy.model.forward(&Tensor::from_slice(&ids).view([1, n])))
                        .get(0)
                        .get(n - 1);
                assert_eq!(
                    logits.argmax(-1, false).int64_value(&[]),
                    i64::from(token),
                    "row {row} step {t}"
                );
                let at_one = logits
                    .log_softmax(-1, Kind::Float)
                    .double_value(&[i64::from(token)]);
                assert!(
                    (f64::from(logp) - at_one).abs() < 1e-4,
                    "row {row} step {t}: {logp} vs {at_one}"
                );
            }
        }
        let prompts = prompts();
        let prompt_refs: Vec<&[i32]> = prompts.iter().map(Vec::as_slice).collect();
        let responses: Vec<&[i32]> = sampled.iter().map(|s| s.response_ids.as_slice()).collect();
        let scores =
            tch::no_grad(|| score_responses(&policy, &prompt_refs, &responses, 0.0, Entropy::Skip));
        for (row, s) in sampled.iter().enumerate() {
            let scored = Vec::<f32>::try_from(scores.logprobs.get(row as i64).narrow(
                0,
                0,
                s.logprobs.len() as i64,
            ))
            .unwrap();
            for (a, b) in s.logprobs.iter().zip(&scored) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "row {row}: sampled {a}, scored at T = 0 {b}"
                );
            }
        }
    }
}
