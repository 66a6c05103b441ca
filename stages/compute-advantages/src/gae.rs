//! `estimator = "gae"`: generalised advantage estimation with the critic's
//! values from the steps table, streamed in two passes; and REINFORCE++,
//! the same without a critic.
//!
//! `gae.level = "token"` takes one value per response token
//! (`steps.old_values`), the trajectory's steps concatenated, the outcome on
//! the last token: veRL's `compute_gae_advantage_return`. `"decision"` takes
//! one value per step (`steps.old_value`), the outcome on the last step
//! (LaST-R1); a step's advantage is broadcast to its response tokens. Per
//! position t of a trajectory (`embodyflow_algos::gae`):
//!
//! ```text
//! delta_t = r_t + gamma V_{t+1} - V_t        (V after the last position = 0)
//! A_t     = delta_t + gamma lambda A_{t+1}
//! returns = A + V                            (before whitening)
//! A      <- (A - mean) * rsqrt(var + 1e-8)   over every position of the kept groups
//! ```
//!
//! (veRL's `masked_whiten`: mean = sum / (n + 1e-8), unbiased variance; fewer
//! than two positions is bad input). E.g. decision level, gamma = 0.99,
//! lambda = 0.95, score 1, V = [0.1, 0.2]: A_1 = 1 - 0.2 = 0.8, A_0 = 0.99 *
//! 0.2 - 0.1 + 0.99 * 0.95 * 0.8 = 0.8504, before whitening.
//!
//! **Token rewards and holes.** With `rewards.token_rewards`, token level
//! takes r_t from them (veRL's token_level_rewards) and decision level takes
//! each step's sum of its tokens' rewards as the step's reward (the score
//! on the last step is that notion's special case). Hole tokens of
//! `steps.response_mask` are skipped at token level as veRL skips them
//! (`gae_tokens_masked_into`: their rewards and values unused, V_{t+1} and
//! A_{t+1} carried from the next valid token), get advantage and return 0,
//! and are left out of the whitening statistics; a step's `episode_adv` is
//! the mean over its valid tokens. At decision level a step stays one
//! position whatever its holes (its reward sums all its tokens' rewards);
//! its hole tokens are written 0.
//!
//! **REINFORCE++** (`estimator = "reinforce_plus_plus"`, veRL's
//! `compute_reinforce_plus_plus_outcome_advantage`, Hu 2025,
//! arXiv:2501.03262) is the token level without a critic: V = 0 and
//! lambda = 1, so `A_t = r_t + gamma A_{t+1}` over the valid tokens, the
//! discounted return of the token rewards (`reinforce_plus_plus.gamma`,
//! veRL's default 1; the score alone sits on the last token), written as
//! `returns` and whitened as GAE's advantages; it reads no values. E.g.
//! gamma = 0.9, a trajectory of three tokens scored 1: returns [0.81, 0.9,
//! 1] before whitening.
//!
//! **Streaming.** Whitening needs the statistics of the whole input before
//! the first row can be written. Pass 1 streams the steps table, computes
//! each kept trajectory's advantages and merges the whitening statistics
//! (count, mean, squared deviations in f64, [`WhitenStats`]); it keeps the
//! raw advantages and returns while they fit in `gae.hold_mib`, and those are
//! then whitened and written without reading the table again. A larger
//! input drops what it kept and is read a second time: pass 2 recomputes the
//! advantages, whitens and writes them as it goes, so memory is bounded by
//! `gae.hold_mib` and the record batch, not the dataset. Both ways write the
//! same rows, bit for bit. A trajectory's steps are gathered until it has
//! `num_steps` of them, so with each trajectory's steps adjacent (as
//! rollouts are written) only those cut by a batch boundary are open, and
//! steps spread over the table are held until their trajectory is complete
//! (correct, but then memory grows with the spread). Rows come out in the
//! order trajectories complete, each trajectory's steps by index. A
//! trajectory's steps must be exactly `0..num_steps`; missing, duplicated or
//! extra steps and missing values are bad input.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, Float32Array, Int32Array, ListArray, RecordBatch, StringArray};
use arrow::buffer::OffsetBuffer;
use embodyflow_algos::gae::{
    GaeParams, WhitenStats, Whitening, gae_tokens_into, gae_tokens_masked_into, zero_holes,
};
use embodyflow_core::config::{ConfigKeys, in_range};
use embodyflow_core::dataset::column;
use embodyflow_core::{Error, Result, progress};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Section};
use crate::episodes::Episode;
use crate::estimator::{Estimate, Estimator, Reported, StepsInput};
use crate::holes::Holes;
use crate::output::{AdvantagesOut, advantages_batch};
use embodyflow_core::section::SectionConfig;

/// `estimator = "gae"`.
pub(crate) static GAE: Estimator = Estimator {
    name: "gae",
    about: "GAE over the critic's values (gae.level), whitened over the batch",
    sections: &[SECTION],
    group_relative: false,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |build| {
        Ok(Box::new(Gae {
            config: build.config.section("gae"),
        }))
    },
};

/// `estimator = "reinforce_plus_plus"`.
pub(crate) static REINFORCE_PLUS_PLUS: Estimator = Estimator {
    name: "reinforce_plus_plus",
    about: "REINFORCE++: each token's discounted return, whitened over the batch",
    sections: &[
        SECTION,
        Section::of::<ReinforceConfig>("reinforce_plus_plus"),
    ],
    group_relative: false,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |build| {
        let config: ReinforceConfig = build.config.section("reinforce_plus_plus");
        Ok(Box::new(ReinforcePlusPlus {
            gamma: config.gamma,
            hold_mib: build.config.section::<GaeConfig>("gae").hold_mib,
        }))
    },
};

/// The `gae` section.
const SECTION: Section = Section::of::<GaeConfig>("gae");

/// `reinforce_plus_plus.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ReinforceConfig {
    /// reinforce_plus_plus: discount of the token returns (veRL's
    /// algorithm.gamma).
    pub gamma: f32,
}

impl Default for ReinforceConfig {
    fn default() -> Self {
        ReinforceConfig { gamma: 1.0 }
    }
}

impl SectionConfig<Config> for ReinforceConfig {
    /// `reinforce_plus_plus.gamma` in [0, 1].
    fn check(&self, _: &Config) -> Result<()> {
        in_range("reinforce_plus_plus.gamma", f64::from(self.gamma), 0.0, 1.0)
    }
}

/// Where GAE's values live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GaeLevel {
    /// One value per response token (`steps.old_values`).
    Token,
    /// One value per decision step (`steps.old_value`).
    Decision,
}

/// `gae.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GaeConfig {
    /// GAE discount gamma.
    pub gamma: f32,
    /// GAE lambda.
    pub lam: f32,
    /// Critic values per token or per decision step: token or decision.
    pub level: GaeLevel,
    /// MiB of raw advantages and returns kept from the first pass (gae,
    /// reinforce_plus_plus); a larger input is read twice.
    pub hold_mib: usize,
}

impl Default for GaeConfig {
    fn default() -> Self {
        GaeConfig {
            gamma: 0.99,
            lam: 0.95,
            level: GaeLevel::Token,
            hold_mib: 48,
        }
    }
}

impl SectionConfig<Config> for GaeConfig {
    /// `gae.gamma` and `gae.lam` in [0, 1].
    fn check(&self, _: &Config) -> Result<()> {
        in_range("gae.gamma", f64::from(self.gamma), 0.0, 1.0)?;
        in_range("gae.lam", f64::from(self.lam), 0.0, 1.0)
    }
}

/// GAE with its settings.
pub(crate) struct Gae {
    /// Discount, lambda and level.
    pub config: GaeConfig,
}

impl Estimate for Gae {
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        let gae = &self.config;
        GaeRun {
            params: GaeParams {
                gamma: gae.gamma,
                lam: gae.lam,
            },
            level: gae.level,
            critic: true,
            hold_mib: gae.hold_mib,
            name: GAE.name,
        }
        .write(input, out)
    }
}

/// REINFORCE++ with its discount: GAE without a critic.
pub(crate) struct ReinforcePlusPlus {
    /// `reinforce_plus_plus.gamma`.
    pub gamma: f32,
    /// `gae.hold_mib`.
    pub hold_mib: usize,
}

impl Estimate for ReinforcePlusPlus {
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        GaeRun {
            params: GaeParams {
                gamma: self.gamma,
                lam: 1.0,
            },
            level: GaeLevel::Token,
            critic: false,
            hold_mib: self.hold_mib,
            name: REINFORCE_PLUS_PLUS.name,
        }
        .write(input, out)
    }
}

/// One run of GAE: its discount and lambda, its positions, its values.
struct GaeRun {
    params: GaeParams,
    /// Positions per token or per decision step.
    level: GaeLevel,
    /// Values from the critic (`old_values` or `old_value`), else V = 0.
    critic: bool,
    /// Raw advantages and returns held from pass 1, in MiB.
    hold_mib: usize,
    /// Every row's `estimator`.
    name: &'static str,
}

impl GaeRun {
    /// Pass 1 computes every kept trajectory's raw advantages, gathers the
    /// whitening statistics ([`WhitenStats`], merged per trajectory) and
    /// keeps the raw advantages and returns while they fit in `gae.hold_mib`;
    /// the kept ones, or else those of pass 2 (which recomputes them), are
    /// whitened with the pass-1 statistics and the owned steps' rows written.
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        let stream = GaeStream { input, run: self };
        let params = self.params;
        // Pass 1: statistics; response_ids give the token counts (checked
        // against old_values at token level, broadcast to at decision level).
        let mut stats = WhitenStats::default();
        let budget = self.hold_mib.saturating_mul(1 << 20);
        let mut held = Some(Computed::default());
        let mut scratch = Computed::default();
        stream.run(true, "gae statistics", |rows| {
            let target = match &mut held {
                Some(all) => all,
                None => {
                    scratch.clear();
                    &mut scratch
                }
            };
            let first = target.offsets.len() - 1;
            target.append(rows, params);
            for row in target.offsets[first..].windows(2) {
                let range = row[0]..row[1];
                if target.masked {
                    stats.add_masked(&target.advantages[range.clone()], &target.mask[range]);
                } else {
                    stats.add(&target.advantages[range]);
                }
            }
            if held.as_ref().is_some_and(|all| all.bytes() > budget) {
                held = None;
            }
            Ok(())
        })?;
        drop(scratch);
        let whitening = stats.whitening().map_err(|err| {
            let name = self.name;
            Error::BadInput(format!("{name}: {err} (the batch is too small)"))
        })?;

        let mut writer = GaeWriter {
            input,
            level: self.level,
            name: self.name,
            whitening,
            pending: GaeOutput::default(),
            out,
        };
        match held {
            Some(all) => writer.push(all)?,
            // Pass 2 (token level: old_values' lengths are the token counts).
            None => stream.run(self.level == GaeLevel::Decision, "gae advantages", |rows| {
                let mut computed = Computed::default();
                computed.append(rows, params);
                writer.push(computed)
            })?,
        }
        writer.finish()?;
        Ok(None)
    }
}

/// Whitens computed advantages and writes the owned steps' rows.
struct GaeWriter<'a, 'o> {
    input: &'a StepsInput<'a>,
    level: GaeLevel,
    /// Every row's `estimator`.
    name: &'static str,
    whitening: Whitening,
    /// Rows gathered for the next batch.
    pending: GaeOutput<'a>,
    out: &'o mut AdvantagesOut,
}

impl GaeWriter<'_, '_> {
    /// Whitens `computed` and writes its owned steps. At token level, when
    /// every trajectory in it is owned, its buffers become one batch's
    /// columns as they are (no copy; the table writer cuts it into row groups
    /// without copying either); otherwise its steps' rows are gathered into
    /// batches of `batch_rows`.
    fn push(&mut self, mut computed: Computed) -> Result<()> {
        self.whitening.apply(&mut computed.advantages);
        if computed.masked {
            zero_holes(&mut computed.advantages, &computed.mask);
        }
        let (episodes, groups) = (self.input.episodes, self.input.groups);
        let all_owned = computed
            .episodes
            .iter()
            .all(|&e| groups.owns(&episodes.list[e]));
        if self.level == GaeLevel::Token && all_owned {
            self.flush()?;
            let batch = token_batch(self.input, computed, self.name);
            return self.out.write_batch(&batch);
        }
        let c = &computed;
        for (row, &e) in c.episodes.iter().enumerate() {
            let episode = &episodes.list[e];
            if !groups.owns(episode) {
                continue;
            }
            let mut position = c.offsets[row];
            for &(step_index, tokens) in &c.steps[c.step_offsets[row]..c.step_offsets[row + 1]] {
                position = self.pending.push_step(
                    episode,
                    step_index,
                    tokens,
                    self.level,
                    position,
                    (&c.advantages, &c.returns, &c.mask),
                );
                if self.pending.step_index.len() >= self.input.batch_rows {
                    self.flush()?;
                }
            }
        }
        Ok(())
    }

    /// Writes the gathered rows.
    fn flush(&mut self) -> Result<()> {
        if self.pending.step_index.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending).into_batch(self.name);
        self.out.write_batch(&batch)
    }

    fn finish(mut self) -> Result<()> {
        self.flush()
    }
}

/// The rows of token-level `computed`, every trajectory owned: one per step,
/// its tokens' whitened advantages and returns taken from `computed`'s
/// buffers without a copy.
fn token_batch(input: &StepsInput<'_>, computed: Computed, estimator: &str) -> RecordBatch {
    let Computed {
        episodes,
        steps,
        step_offsets,
        advantages,
        returns,
        mask,
        ..
    } = computed;
    let mut ids = Vec::with_capacity(steps.len());
    let mut step_index = Vec::with_capacity(steps.len());
    let mut episode_adv = Vec::with_capacity(steps.len());
    let mut lengths = Vec::with_capacity(steps.len());
    let mut position = 0;
    for (row, &e) in episodes.iter().enumerate() {
        let id = input.episodes.list[e].trajectory_id.as_str();
        for &(index, tokens) in &steps[step_offsets[row]..step_offsets[row + 1]] {
            ids.push(id);
            step_index.push(index);
            let range = position..position + tokens;
            episode_adv.push(mean_valid(&advantages[range.clone()], &mask[range]));
            lengths.push(tokens);
            position += tokens;
        }
    }
    advantages_batch(
        Arc::new(StringArray::from(ids)),
        Arc::new(Int32Array::from(step_index)),
        OffsetBuffer::from_lengths(lengths),
        advantages,
        Some(returns),
        episode_adv,
        estimator,
    )
}

/// The mean of a step's advantages (0 without tokens).
fn mean(advantages: &[f32]) -> f32 {
    if advantages.is_empty() {
        0.0
    } else {
        advantages.iter().sum::<f32>() / advantages.len() as f32
    }
}

/// The mean of a step's advantages over its valid (`mask` true) tokens (0
/// without any); [`mean`] when it has no hole.
fn mean_valid(advantages: &[f32], mask: &[bool]) -> f32 {
    if mask.iter().all(|&m| m) {
        return mean(advantages);
    }
    let valid = mask.iter().filter(|&&m| m).count();
    if valid == 0 {
        return 0.0;
    }
    let sum: f32 = advantages
        .iter()
        .zip(mask)
        .filter(|&(_, &m)| m)
        .map(|(a, _)| a)
        .sum();
    sum / valid as f32
}

/// One pass of GAE over the steps table.
struct GaeStream<'a> {
    input: &'a StepsInput<'a>,
    run: &'a GaeRun,
}

/// A step of a trajectory whose steps are still arriving.
struct PendingStep {
    step_index: i32,
    tokens: usize,
    /// Where its values sit in the trajectory's buffer.
    values: std::ops::Range<usize>,
}

/// A kept trajectory whose steps are still arriving.
#[derive(Default)]
struct OpenTrajectory {
    steps: Vec<PendingStep>,
    values: Vec<f32>,
}

/// The trajectories completed within one record batch of steps, flattened
/// for [`gae_tokens_into`]: one row of positions (tokens or decisions) per
/// trajectory, its outcome on the last position. Its buffers are reused
/// from batch to batch.
#[derive(Default)]
struct GaeRows {
    /// Episode of each row.
    episodes: Vec<usize>,
    /// `(step_index, response tokens)` of every row's steps, in step order;
    /// row r's are `steps[step_offsets[r]..step_offsets[r + 1]]`.
    steps: Vec<(i32, usize)>,
    step_offsets: Vec<usize>,
    values: Vec<f32>,
    rewards: Vec<f32>,
    /// Per position: valid (true) or a hole (token level; every decision
    /// is valid).
    mask: Vec<bool>,
    /// Whether any position is a hole.
    masked: bool,
    /// Row r's positions are `offsets[r]..offsets[r + 1]`.
    offsets: Vec<usize>,
}

/// Trajectories (those of a record batch, or every one pass 1 kept) with
/// their raw (unwhitened) advantages and returns, one per position, laid
/// out as in [`GaeRows`] without the values and rewards.
struct Computed {
    episodes: Vec<usize>,
    steps: Vec<(i32, usize)>,
    step_offsets: Vec<usize>,
    offsets: Vec<usize>,
    advantages: Vec<f32>,
    returns: Vec<f32>,
    /// Per position: valid or a hole, as in [`GaeRows`].
    mask: Vec<bool>,
    /// Whether any position is a hole.
    masked: bool,
}

impl Default for Computed {
    fn default() -> Self {
        Computed {
            episodes: Vec::new(),
            steps: Vec::new(),
            step_offsets: vec![0],
            offsets: vec![0],
            advantages: Vec::new(),
            returns: Vec::new(),
            mask: Vec::new(),
            masked: false,
        }
    }
}

impl Computed {
    /// Appends `rows` with their advantages and returns.
    fn append(&mut self, rows: &GaeRows, params: GaeParams) {
        let (steps, positions) = (self.steps.len(), self.advantages.len());
        self.episodes.extend_from_slice(&rows.episodes);
        self.steps.extend_from_slice(&rows.steps);
        self.step_offsets
            .extend(rows.step_offsets[1..].iter().map(|o| o + steps));
        self.offsets
            .extend(rows.offsets[1..].iter().map(|o| o + positions));
        self.mask.extend_from_slice(&rows.mask);
        self.masked |= rows.masked;
        if rows.masked {
            gae_tokens_masked_into(
                &rows.rewards,
                &rows.values,
                &rows.mask,
                &rows.offsets,
                params,
                &mut self.advantages,
                &mut self.returns,
            );
        } else {
            gae_tokens_into(
                &rows.rewards,
                &rows.values,
                &rows.offsets,
                params,
                &mut self.advantages,
                &mut self.returns,
            );
        }
    }

    /// Empties it, keeping its buffers.
    fn clear(&mut self) {
        self.episodes.clear();
        self.steps.clear();
        self.step_offsets.truncate(1);
        self.offsets.truncate(1);
        self.advantages.clear();
        self.returns.clear();
        self.mask.clear();
        self.masked = false;
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        let floats = self.advantages.capacity() + self.returns.capacity();
        let flags = self.mask.capacity();
        let words = self.episodes.capacity()
            + self.step_offsets.capacity()
            + self.offsets.capacity()
            + 2 * self.steps.capacity();
        4 * floats + flags + std::mem::size_of::<usize>() * words
    }
}

impl GaeRows {
    /// Empties it, keeping its buffers.
    fn clear(&mut self) {
        self.episodes.clear();
        self.steps.clear();
        self.step_offsets.clear();
        self.step_offsets.push(0);
        self.values.clear();
        self.rewards.clear();
        self.mask.clear();
        self.masked = false;
        self.offsets.clear();
        self.offsets.push(0);
    }

    /// Appends a trajectory whose step count reached `num_steps`, checking
    /// that its steps are exactly 0..num_steps; `values` holds the steps'
    /// value ranges. Its rewards: the token rewards (token level) or their
    /// per-step sums (decision level) when it has them, else the score on
    /// its last position; its mask from `holes` (token level).
    fn push(
        &mut self,
        e: usize,
        episode: &Episode,
        steps: &mut [PendingStep],
        values: &[f32],
        (level, holes): (GaeLevel, &Holes),
    ) -> Result<()> {
        steps.sort_by_key(|s| s.step_index);
        if !steps.iter().map(|s| s.step_index).eq(0..episode.num_steps) {
            return Err(step_indices_error(episode, steps));
        }
        let start = self.values.len();
        for step in steps.iter() {
            self.values.extend_from_slice(&values[step.values.clone()]);
            self.steps.push((step.step_index, step.tokens));
            let mask = match level {
                GaeLevel::Token => {
                    holes.of_step(&episode.trajectory_id, step.step_index, step.tokens)?
                }
                GaeLevel::Decision => None,
            };
            match mask {
                Some(mask) => {
                    self.mask.extend_from_slice(mask);
                    self.masked = true;
                }
                None => self.mask.resize(self.values.len(), true),
            }
        }
        match (level, &episode.token_rewards) {
            (GaeLevel::Token, Some(rewards)) => {
                episode.check_token_rewards(self.values.len() - start)?;
                self.rewards.extend_from_slice(rewards);
            }
            (GaeLevel::Decision, Some(_)) => {
                let tokens: Vec<usize> = steps.iter().map(|s| s.tokens).collect();
                self.rewards.extend(episode.step_rewards(&tokens)?);
            }
            (_, None) => {
                self.rewards.resize(self.values.len(), 0.0);
                // A trajectory without positions (token level, every response
                // empty) has nowhere to carry its outcome: it adds nothing to GAE.
                if self.values.len() > start {
                    *self.rewards.last_mut().expect("a position") = episode.score;
                }
            }
        }
        self.episodes.push(e);
        self.step_offsets.push(self.steps.len());
        self.offsets.push(self.values.len());
        Ok(())
    }
}

fn step_indices_error(episode: &Episode, steps: &[PendingStep]) -> Error {
    let found: Vec<i32> = steps.iter().map(|s| s.step_index).collect();
    Error::BadInput(format!(
        "trajectory `{}`: steps table has step indices {found:?}, expected 0..{} (num_steps)",
        episode.trajectory_id, episode.num_steps
    ))
}

impl GaeStream<'_> {
    /// Streams the steps once. Each kept trajectory's steps are gathered until
    /// it has `num_steps` of them (a trajectory's steps are normally adjacent,
    /// so at most the trajectories cut by a batch boundary are open; steps
    /// spread over the table are held until their trajectory is complete);
    /// `on_rows` gets the trajectories completed in each record batch
    /// together, with their values and rewards. `read_tokens`: read
    /// `response_ids` (token counts, checked against `old_values`); without
    /// it a step's token count is its number of values (0 at decision level).
    /// Without a critic the token counts are always read, and every value
    /// is 0.
    fn run(
        &self,
        read_tokens: bool,
        label: &str,
        mut on_rows: impl FnMut(&GaeRows) -> Result<()>,
    ) -> Result<()> {
        let (episodes, groups) = (self.input.episodes, self.input.groups);
        let (holes, level, critic) = (self.input.holes, self.run.level, self.run.critic);
        let value_column = match level {
            GaeLevel::Token => "old_values",
            GaeLevel::Decision => "old_value",
        };
        let mut columns = vec!["trajectory_id", "step_index"];
        if critic {
            columns.push(value_column);
        }
        let read_tokens = read_tokens || !critic;
        if read_tokens {
            columns.push("response_ids");
        }
        let mut zeros: Vec<f32> = Vec::new();
        let mut open: HashMap<usize, OpenTrajectory> = HashMap::new();
        let mut complete = vec![false; episodes.list.len()];
        let mut rows = GaeRows::default();
        let steps = self.input.steps;
        let bar = progress::bar(steps.num_rows(), label);
        for batch in steps.batches(Some(&columns), self.input.batch_rows)? {
            let batch = batch?;
            bar.inc(batch.num_rows() as u64);
            let ids = column::<StringArray>(&batch, "trajectory_id");
            let index = column::<Int32Array>(&batch, "step_index");
            let responses = read_tokens.then(|| column::<ListArray>(&batch, "response_ids"));
            rows.clear();
            for i in 0..batch.num_rows() {
                let id = ids.value(i);
                let e = episodes.of_step(id)?;
                let episode = &episodes.list[e];
                if !groups.keeps(episode) {
                    continue;
                }
                if complete[e] {
                    return Err(Error::BadInput(format!(
                        "trajectory `{id}`: steps table has more steps than num_steps = {} (step {} comes after a complete set)",
                        episode.num_steps,
                        index.value(i)
                    )));
                }
                let missing = || {
                    let (level, hint) = match level {
                        GaeLevel::Token => ("token", "was the policy run with a value head?"),
                        GaeLevel::Decision => (
                            "decision",
                            "a VLA writes it when it thinks in latents: init-policy --set vla.latent_length=8",
                        ),
                    };
                    Error::BadInput(format!(
                        "steps table, trajectory `{id}` step {}: `{value_column}` is null; gae.level = {level} needs it ({hint})",
                        index.value(i),
                    ))
                };
                let decision: [f32; 1];
                let (step_values, tokens): (&[f32], usize) = match (critic, level) {
                    (false, _) => {
                        let tokens = responses.map_or(0, |r| r.value_length(i) as usize);
                        if zeros.len() < tokens {
                            zeros.resize(tokens, 0.0);
                        }
                        (&zeros[..tokens], tokens)
                    }
                    (true, GaeLevel::Token) => {
                        let list = column::<ListArray>(&batch, "old_values");
                        if list.is_null(i) {
                            return Err(missing());
                        }
                        let range =
                            list.value_offsets()[i] as usize..list.value_offsets()[i + 1] as usize;
                        let values = &list
                            .values()
                            .as_any()
                            .downcast_ref::<Float32Array>()
                            .expect("list<f32>")
                            .values()[range];
                        if let Some(responses) = responses {
                            let tokens = responses.value_length(i) as usize;
                            if values.len() != tokens {
                                return Err(Error::BadInput(format!(
                                    "trajectory `{id}` step {}: old_values has {} entries, expected {tokens} (one per response token)",
                                    index.value(i),
                                    values.len()
                                )));
                            }
                        }
                        (values, values.len())
                    }
                    (true, GaeLevel::Decision) => {
                        let value = column::<Float32Array>(&batch, "old_value");
                        if value.is_null(i) {
                            return Err(missing());
                        }
                        decision = [value.value(i)];
                        (
                            &decision,
                            responses.map_or(0, |r| r.value_length(i) as usize),
                        )
                    }
                };
                let step = PendingStep {
                    step_index: index.value(i),
                    tokens,
                    values: 0..step_values.len(),
                };
                if i64::from(episode.num_steps) <= 1 && !open.contains_key(&e) {
                    // Complete on arrival (a one-step trajectory): no staging.
                    complete[e] = true;
                    rows.push(e, episode, &mut [step], step_values, (level, holes))?;
                    continue;
                }
                let trajectory = open.entry(e).or_default();
                let start = trajectory.values.len();
                trajectory.values.extend_from_slice(step_values);
                trajectory.steps.push(PendingStep {
                    values: start..trajectory.values.len(),
                    ..step
                });
                if trajectory.steps.len() as i64 >= i64::from(episode.num_steps) {
                    let mut trajectory = open.remove(&e).expect("opened above");
                    complete[e] = true;
                    rows.push(
                        e,
                        episode,
                        &mut trajectory.steps,
                        &trajectory.values,
                        (level, holes),
                    )?;
                }
            }
            if !rows.episodes.is_empty() {
                on_rows(&rows)?;
            }
        }
        bar.finish_and_clear();
        // Kept trajectories whose steps never all arrived.
        for (e, episode) in episodes.list.iter().enumerate() {
            if groups.keeps(episode) && !complete[e] && episode.num_steps > 0 {
                let steps = open.remove(&e).map(|mut t| {
                    t.steps.sort_by_key(|s| s.step_index);
                    t.steps
                });
                return Err(step_indices_error(episode, &steps.unwrap_or_default()));
            }
        }
        Ok(())
    }
}

/// GAE output rows gathered column by column until a batch is full.
#[derive(Default)]
struct GaeOutput<'a> {
    ids: Vec<&'a str>,
    step_index: Vec<i32>,
    /// List offsets after each row (the leading 0 is implied).
    offsets: Vec<i32>,
    advantages: Vec<f32>,
    returns: Vec<f32>,
    episode_adv: Vec<f32>,
}

impl<'a> GaeOutput<'a> {
    /// Appends the row of one step of `episode` with `tokens` response
    /// tokens, its positions starting at `position` of the whitened
    /// advantages and the returns; returns where the next step's positions
    /// start. The row's `episode_adv` is the mean of its tokens' advantages
    /// (0 without tokens).
    fn push_step(
        &mut self,
        episode: &'a Episode,
        step_index: i32,
        tokens: usize,
        level: GaeLevel,
        position: usize,
        (advantages, returns, mask): (&[f32], &[f32], &[bool]),
    ) -> usize {
        let start = self.advantages.len();
        let (next, episode_adv) = match level {
            GaeLevel::Token => {
                let range = position..position + tokens;
                self.advantages
                    .extend_from_slice(&advantages[range.clone()]);
                self.returns.extend_from_slice(&returns[range.clone()]);
                let episode_adv = mean_valid(&self.advantages[start..], &mask[range]);
                (position + tokens, episode_adv)
            }
            GaeLevel::Decision => {
                self.advantages.resize(start + tokens, advantages[position]);
                self.returns.resize(start + tokens, returns[position]);
                (position + 1, mean(&self.advantages[start..]))
            }
        };
        self.ids.push(episode.trajectory_id.as_str());
        self.step_index.push(step_index);
        self.offsets.push(self.advantages.len() as i32);
        self.episode_adv.push(episode_adv);
        next
    }

    fn into_batch(self, estimator: &str) -> RecordBatch {
        let offsets = OffsetBuffer::new(
            std::iter::once(0)
                .chain(self.offsets)
                .collect::<Vec<i32>>()
                .into(),
        );
        advantages_batch(
            Arc::new(StringArray::from(self.ids)),
            Arc::new(Int32Array::from(self.step_index)),
            offsets,
            self.advantages,
            Some(self.returns),
            self.episode_adv,
            estimator,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use embodyflow_algos::gae::{gae_tokens, whiten};
    use embodyflow_core::schemas::{AdvantageRow, StepRow};

    use super::*;
    use crate::episodes::Groups;
    use crate::testdata::{Fixture, exact, step, with_and_without_fault};

    const TRAJECTORIES: [(&str, &str, f32, i32); 5] = [
        ("a", "g0", 1.0, 3),
        ("b", "g0", 0.0, 1),
        ("c", "g1", 0.5, 2),
        ("d", "g1", 0.5, 2),
        ("e", "g2", 2.0, 1),
    ];

    /// Every trajectory's steps, spread over the table and out of index
    /// order, so that batches cut trajectories and hold them open.
    fn spread_steps() -> Vec<StepRow> {
        vec![
            step("a", 2, 2),
            step("c", 1, 3),
            step("b", 0, 4),
            step("a", 0, 3),
            step("d", 0, 0),
            step("e", 0, 2),
            step("c", 0, 1),
            step("d", 1, 2),
            step("a", 1, 1),
        ]
    }

    #[test]
    fn golden_a_group_with_a_faulted_member_equals_the_group_without_it() {
        // `f` (group g0, two steps spread among the others) ended by a fault.
        let mut trajectories = TRAJECTORIES.to_vec();
        trajectories.insert(1, ("f", "g0", 0.0, 2));
        let mut steps = spread_steps();
        steps.insert(2, step("f", 1, 3));
        steps.insert(6, step("f", 0, 2));
        for level in [GaeLevel::Token, GaeLevel::Decision] {
            for estimator in [gae(level), two_pass(level)] {
                let (with, without) =
                    with_and_without_fault(&trajectories, &steps, "f", &estimator, false);
                assert_eq!(with.len(), 9, "f's steps have no row");
                assert_eq!(exact(&with), exact(&without), "{level:?}");
            }
        }
    }

    /// GAE that keeps pass 1's results (the input fits in `hold_mib`).
    fn gae(level: GaeLevel) -> Gae {
        Gae {
            config: GaeConfig {
                gamma: 0.9,
                lam: 0.8,
                level,
                hold_mib: 48,
            },
        }
    }

    /// GAE that keeps nothing and reads the steps a second time.
    fn two_pass(level: GaeLevel) -> Gae {
        let mut gae = gae(level);
        gae.config.hold_mib = 0;
        gae
    }

    /// GAE over every kept trajectory at once, whitened over the whole
    /// batch (the in-memory formula), as (advantages, returns) per step.
    fn reference(
        f: &Fixture,
        steps: &[StepRow],
        level: GaeLevel,
        groups: &Groups,
    ) -> HashMap<(String, i32), (Vec<f32>, Vec<f32>)> {
        let (mut values, mut rewards, mut offsets) = (Vec::new(), Vec::new(), vec![0]);
        let mut layout = Vec::new();
        for episode in f.episodes.list.iter().filter(|e| groups.keeps(e)) {
            let mut own: Vec<&StepRow> = steps
                .iter()
                .filter(|s| s.trajectory_id == episode.trajectory_id)
                .collect();
            own.sort_by_key(|s| s.step_index);
            for s in own {
                let v = match level {
                    GaeLevel::Token => s.old_values.clone().unwrap(),
                    GaeLevel::Decision => vec![s.old_value.unwrap()],
                };
                layout.push((
                    s.trajectory_id.clone(),
                    s.step_index,
                    v.len(),
                    s.response_ids.len(),
                ));
                values.extend(v);
            }
            rewards.resize(values.len(), 0.0);
            if values.len() > *offsets.last().unwrap() {
                *rewards.last_mut().unwrap() = episode.score;
            }
            offsets.push(values.len());
        }
        let params = GaeParams {
            gamma: 0.9,
            lam: 0.8,
        };
        let (mut advantages, returns) = gae_tokens(&rewards, &values, &offsets, params);
        whiten(&mut advantages).unwrap();
        let mut at = 0;
        let mut out = HashMap::new();
        for (id, index, positions, tokens) in layout {
            let (a, r) = match level {
                GaeLevel::Token => (
                    advantages[at..at + positions].to_vec(),
                    returns[at..at + positions].to_vec(),
                ),
                GaeLevel::Decision => (vec![advantages[at]; tokens], vec![returns[at]; tokens]),
            };
            at += positions;
            out.insert((id, index), (a, r));
        }
        out
    }

    fn assert_close(
        rows: &[AdvantageRow],
        expected: &HashMap<(String, i32), (Vec<f32>, Vec<f32>)>,
    ) {
        assert_eq!(rows.len(), expected.len());
        for row in rows {
            let (a, r) = &expected[&(row.trajectory_id.clone(), row.step_index)];
            let returns = row.returns.as_ref().unwrap();
            assert_eq!(
                (row.advantages.len(), returns.len()),
                (a.len(), r.len()),
                "{row:?}"
            );
            for (x, y) in row.advantages.iter().zip(a).chain(returns.iter().zip(r)) {
                assert!(
                    (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "{row:?}: {x} vs {y}"
                );
            }
            let mean = if a.is_empty() {
                0.0
            } else {
                row.advantages.iter().sum::<f32>() / a.len() as f32
            };
            assert_eq!(row.episode_adv, mean);
            assert_eq!(row.estimator, "gae");
        }
    }

    #[test]
    fn streamed_gae_equals_the_in_memory_formula_at_both_levels_whatever_the_batch() {
        let f = Fixture::new(&TRAJECTORIES, &spread_steps());
        for level in [GaeLevel::Token, GaeLevel::Decision] {
            let expected = reference(&f, &spread_steps(), level, &f.all_groups());
            let (rows, stats, step) = f.run(&gae(level), &f.all_groups(), 2).unwrap();
            assert!(step.is_none());
            assert_close(&rows, &expected);
            assert_eq!(stats.steps, 9);
            assert_eq!(
                stats.tokens as usize,
                rows.iter().map(|r| r.advantages.len()).sum::<usize>()
            );
            // Batches of one row hold every multi-step trajectory open; one
            // batch holds none. The output is the same to the bit.
            // Keeping pass 1's results or reading twice: the same too.
            for batch_rows in [1, 3, 64] {
                for estimator in [gae(level), two_pass(level)] {
                    let (again, ..) = f.run(&estimator, &f.all_groups(), batch_rows).unwrap();
                    assert_eq!(
                        again, rows,
                        "{level:?}, batch_rows {batch_rows}, hold_mib {}",
                        estimator.config.hold_mib
                    );
                }
            }
        }
    }

    #[test]
    fn dropped_groups_leave_the_whitening_and_shards_share_it() {
        let f = Fixture::new(&TRAJECTORIES, &spread_steps());
        let level = GaeLevel::Token;
        // Dynamic sampling drops g1 (all 0.5): neither written nor whitened over.
        let kept = Groups {
            kept: vec![true, false, true],
            owned: vec![true, false, true],
        };
        let (rows, ..) = f.run(&gae(level), &kept, 2).unwrap();
        assert_eq!(f.run(&two_pass(level), &kept, 2).unwrap().0, rows);
        assert!(
            rows.iter()
                .all(|r| r.trajectory_id != "c" && r.trajectory_id != "d")
        );
        assert_close(&rows, &reference(&f, &spread_steps(), level, &kept));
        // Owning a part of the kept groups writes that part of the same rows.
        let part = |owned: Vec<bool>| {
            let groups = Groups {
                kept: vec![true; 3],
                owned,
            };
            let rows = f.run(&gae(level), &groups, 2).unwrap().0;
            assert_eq!(f.run(&two_pass(level), &groups, 2).unwrap().0, rows);
            rows
        };
        let (whole, ..) = f.run(&gae(level), &f.all_groups(), 2).unwrap();
        let mut union = part(vec![true, false, false]);
        union.extend(part(vec![false, true, true]));
        union.sort_by(|a, b| {
            (&a.trajectory_id, a.step_index).cmp(&(&b.trajectory_id, b.step_index))
        });
        assert_eq!(union, whole);
    }

    #[test]
    fn missing_duplicated_or_extra_steps_and_missing_values_are_bad_input() {
        let run = |steps: Vec<StepRow>, level: GaeLevel| {
            let f = Fixture::new(&[("a", "g", 1.0, 2), ("b", "g", 0.0, 1)], &steps);
            f.run(&gae(level), &f.all_groups(), 2)
                .unwrap_err()
                .to_string()
        };
        let token = GaeLevel::Token;
        let error = run(vec![step("a", 0, 1), step("b", 0, 1)], token);
        assert!(
            error.contains("`a`: steps table has step indices [0], expected 0..2"),
            "{error}"
        );
        let error = run(
            vec![step("a", 0, 1), step("a", 0, 1), step("b", 0, 1)],
            token,
        );
        assert!(
            error.contains("step indices [0, 0], expected 0..2"),
            "{error}"
        );
        let error = run(
            vec![
                step("a", 0, 1),
                step("a", 1, 1),
                step("b", 0, 1),
                step("b", 1, 1),
            ],
            token,
        );
        assert!(
            error.contains("`b`: steps table has more steps than num_steps = 1"),
            "{error}"
        );
        let mut no_value = step("b", 0, 1);
        no_value.old_value = None;
        let error = run(
            vec![step("a", 0, 1), step("a", 1, 1), no_value],
            GaeLevel::Decision,
        );
        assert!(
            error.contains("steps table, trajectory `b` step 0: `old_value` is null"),
            "{error}"
        );
        let mut short = step("b", 0, 3);
        short.old_values = Some(vec![0.0; 2]);
        let error = run(vec![step("a", 0, 1), step("a", 1, 1), short], token);
        assert!(
            error.contains("old_values has 2 entries, expected 3"),
            "{error}"
        );
        let error = run(vec![step("b", 0, 1)], token);
        assert!(error.contains("expected 0..2"), "{error}");
    }

    /// The trajectories of [`holed`]: `(id, group, score, num_steps)`.
    const HOLED: [(&str, &str, f32, i32); 5] = [
        ("a", "g0", 5.0, 3),
        ("b", "g0", 0.0, 1),
        ("c", "g1", 0.5, 1),
        ("d", "g1", 0.5, 2),
        ("e", "g2", 2.0, 1),
    ];

    /// Steps with holes (first, middle and last token; a step all holes)
    /// and token rewards on several tokens, holes included.
    fn holed() -> (Vec<StepRow>, Vec<(&'static str, Vec<f32>)>) {
        let masked = |id, index, tokens, mask: &[bool]| {
            let mut row = step(id, index, tokens);
            row.response_mask = Some(mask.to_vec());
            row
        };
        let steps = vec![
            masked("a", 0, 4, &[false, true, false, true]),
            masked("a", 1, 2, &[false, false]),
            masked("a", 2, 3, &[true, true, false]),
            step("b", 0, 3),
            masked("c", 0, 2, &[true, false]),
            step("d", 0, 2),
            step("d", 1, 1),
            masked("e", 0, 3, &[true, true, true]),
        ];
        let rewards = vec![
            ("a", vec![0.0, 0.5, 7.0, 0.0, -3.0, 0.0, 0.25, 0.0, 0.25]),
            ("b", vec![0.0, 0.0, 0.0]),
            ("c", vec![0.25, 0.25]),
            ("d", vec![0.5, 0.0, 0.0]),
            ("e", vec![0.0, 1.0, 1.0]),
        ];
        (steps, rewards)
    }

    fn with_rewards(mut f: Fixture, rewards: &[(&str, Vec<f32>)]) -> Fixture {
        for (id, r) in rewards {
            f = f.with_token_rewards(id, r).unwrap();
        }
        f
    }

    #[test]
    fn token_level_skips_holes_as_if_they_were_not_there() {
        // The same trajectories with every hole token cut out (and its
        // reward with it: veRL's GAE drops rewards on holes) give the same
        // advantages and returns on the valid tokens; the holes get 0.
        let (steps, rewards) = holed();
        let f = with_rewards(Fixture::new(&HOLED, &steps), &rewards);
        let mut cut_steps = Vec::new();
        let mut cut_rewards: Vec<(&str, Vec<f32>)> = Vec::new();
        let mut masks = HashMap::new();
        for (id, r) in &rewards {
            let mut own: Vec<&StepRow> = steps.iter().filter(|s| s.trajectory_id == *id).collect();
            own.sort_by_key(|s| s.step_index);
            let mut kept_rewards = Vec::new();
            let mut at = 0;
            for s in own {
                let mask = s
                    .response_mask
                    .clone()
                    .unwrap_or(vec![true; s.response_ids.len()]);
                let keep = |v: &[f32]| -> Vec<f32> {
                    v.iter()
                        .zip(&mask)
                        .filter(|(_, m)| **m)
                        .map(|(x, _)| *x)
                        .collect()
                };
                let mut cut = s.clone();
                cut.response_ids = s
                    .response_ids
                    .iter()
                    .zip(&mask)
                    .filter(|(_, m)| **m)
                    .map(|(x, _)| *x)
                    .collect();
                cut.old_logprobs = keep(&s.old_logprobs);
                cut.old_values = Some(keep(s.old_values.as_ref().unwrap()));
                cut.response_mask = None;
                cut_steps.push(cut);
                kept_rewards.extend(keep(&r[at..at + mask.len()]));
                at += mask.len();
                masks.insert((id.to_string(), s.step_index), mask);
            }
            cut_rewards.push((id, kept_rewards));
        }
        // The scores without the hole rewards (a's 7 and -3, c's 0.25).
        let cut_scores: Vec<(&str, &str, f32, i32)> = HOLED
            .iter()
            .zip(&cut_rewards)
            .map(|(&(id, group, _, n), (_, r))| (id, group, r.iter().sum(), n))
            .collect();
        let cut = with_rewards(Fixture::new(&cut_scores, &cut_steps), &cut_rewards);
        let (want, ..) = cut
            .run(&gae(GaeLevel::Token), &cut.all_groups(), 64)
            .unwrap();
        for batch_rows in [1, 3, 64] {
            for estimator in [gae(GaeLevel::Token), two_pass(GaeLevel::Token)] {
                let (rows, ..) = f.run(&estimator, &f.all_groups(), batch_rows).unwrap();
                assert_eq!(rows.len(), want.len());
                for (row, cut_row) in rows.iter().zip(&want) {
                    let mask = &masks[&(row.trajectory_id.clone(), row.step_index)];
                    let returns = row.returns.as_ref().unwrap();
                    let valid = |v: &[f32]| -> Vec<f32> {
                        v.iter()
                            .zip(mask)
                            .filter(|(_, m)| **m)
                            .map(|(x, _)| *x)
                            .collect()
                    };
                    for (x, y) in valid(&row.advantages).iter().zip(&cut_row.advantages) {
                        assert!(
                            (x - y).abs() <= 1e-6 * y.abs().max(1.0),
                            "{row:?} vs {cut_row:?}"
                        );
                    }
                    for (x, y) in valid(returns).iter().zip(cut_row.returns.as_ref().unwrap()) {
                        assert!(
                            (x - y).abs() <= 1e-6 * y.abs().max(1.0),
                            "{row:?} vs {cut_row:?}"
                        );
                    }
                    assert_eq!(valid(&row.advantages).len(), cut_row.advantages.len());
                    for (t, &m) in mask.iter().enumerate() {
                        if !m {
                            assert_eq!((row.advantages[t], returns[t]), (0.0, 0.0), "{row:?}");
                        }
                    }
                    assert!(
                        (row.episode_adv - cut_row.episode_adv).abs() <= 1e-6,
                        "{row:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn token_rewards_on_the_last_token_are_the_score_and_decisions_sum_their_tokens() {
        // Token rewards that put the score on the last token are the score.
        let (steps, _) = holed();
        let plain: Vec<StepRow> = steps
            .into_iter()
            .map(|mut s| {
                s.response_mask = None;
                s
            })
            .collect();
        let tokens = |id: &str| -> usize {
            plain
                .iter()
                .filter(|s| s.trajectory_id == id)
                .map(|s| s.response_ids.len())
                .sum()
        };
        let f = Fixture::new(&HOLED, &plain);
        let mut last = Fixture::new(&HOLED, &plain);
        for &(id, _, score, _) in &HOLED {
            let mut r = vec![0.0; tokens(id)];
            *r.last_mut().unwrap() = score;
            last = last.with_token_rewards(id, &r).unwrap();
        }
        for level in [GaeLevel::Token, GaeLevel::Decision] {
            let (want, ..) = f.run(&gae(level), &f.all_groups(), 4).unwrap();
            let (got, ..) = last.run(&gae(level), &last.all_groups(), 4).unwrap();
            assert_eq!(got, want, "{level:?}");
        }
        // Decision level: a decision's reward is the sum of its tokens'.
        // a's steps have 4, 2 and 3 tokens; rewards 1 on step 0, 1 on step 2:
        // the same as rewards [1, 0, 1] per decision.
        let p = GaeParams {
            gamma: 0.9,
            lam: 0.8,
        };
        let f = Fixture::new(&[("a", "g", 2.0, 3), ("b", "g", 0.0, 1)], &plain[..4])
            .with_token_rewards("a", &[0.25, 0.75, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
            .unwrap();
        let (rows, ..) = f.run(&gae(GaeLevel::Decision), &f.all_groups(), 4).unwrap();
        let values: Vec<f32> = plain[..4].iter().map(|s| s.old_value.unwrap()).collect();
        let (mut adv, _) = gae_tokens(&[1.0, 0.0, 1.0, 0.0], &values, &[0, 3, 4], p);
        whiten(&mut adv).unwrap();
        for (row, a) in rows.iter().zip(&adv) {
            assert!(
                row.advantages.iter().all(|x| (x - a).abs() < 1e-6),
                "{row:?} vs {a}"
            );
        }
    }

    #[test]
    fn one_position_in_all_is_too_few_to_whiten() {
        let f = Fixture::new(&[("a", "g", 1.0, 1)], &[step("a", 0, 1)]);
        let error = f
            .run(&gae(GaeLevel::Token), &f.all_groups(), 4)
            .unwrap_err()
            .to_string();
        assert!(error.contains("the batch is too small"), "{error}");
    }

    #[test]
    fn golden_reinforce_plus_plus_equals_verl_held_or_read_twice() {
        for hold_mib in [48, 0] {
            crate::testdata::matches_verl(&REINFORCE_PLUS_PLUS, |case| {
                vec![
                    format!("reinforce_plus_plus.gamma={}", case.config["gamma"]),
                    format!("gae.hold_mib={hold_mib}"),
                ]
            });
        }
    }
}
