//! The `compute-advantages` stage: reads trajectories, steps and rewards and
//! writes the advantages table (one row per step, one advantage per response
//! token) plus a diagnostics summary.
//!
//! Estimators (`estimator = ...`):
//! - `grpo`: A^E_i = (R_i - mean_g R) / (std_g R + eps), broadcast to every
//!   response token of every step of trajectory i (veRL numerics, see
//!   `embodyflow_algos::grpo`);
//! - `dr_grpo`: A^E_i = R_i - mean_g R;
//! - `gae`: GAE with `gae.level = "token"` (per-token `old_values`, the
//!   trajectory's steps concatenated, outcome on the last token; veRL's
//!   `compute_gae_advantage_return`) or `"decision"` (one `old_value` per step,
//!   outcome on the last step, LaST-R1): per position t of a trajectory,
//!   `delta_t = r_t + gamma V_{t+1} - V_t`, `A_t = delta_t + gamma lambda
//!   A_{t+1}` (V after the last position = 0), returns = A + V before
//!   whitening, then `A <- (A - mean) * rsqrt(var + 1e-8)` over every position
//!   of the kept batch (veRL's `masked_whiten`: mean = sum / (n + 1e-8),
//!   unbiased variance; fewer than two positions is bad input). A decision
//!   step's advantage is broadcast to its response tokens. E.g. decision level,
//!   gamma = 0.99, lambda = 0.95, score 1, V = [0.1, 0.2]: A_1 = 1 - 0.2 = 0.8,
//!   A_0 = 0.99 * 0.2 - 0.1 + 0.99 * 0.95 * 0.8 = 0.8504, before whitening.
//!   GAE streams the steps table twice, so its memory is bounded by the record
//!   batch, not the dataset: pass 1 computes each trajectory's advantages and
//!   merges the whitening statistics (count, mean, squared deviations in f64,
//!   `embodyflow_algos::gae::WhitenStats`); pass 2 recomputes them, whitens and
//!   writes record batches as it goes. What is held for the whole input is the
//!   trajectories join (id, group, score and step count per trajectory), plus
//!   the trajectories whose steps are still arriving: a trajectory's steps are
//!   gathered until it has `num_steps` of them, so with each trajectory's steps
//!   adjacent (as rollouts are written) only those cut by a batch boundary are
//!   open, and steps spread over the table are held until their trajectory is
//!   complete (correct, but then memory grows with the spread). Rows come out
//!   in the order trajectories complete, each trajectory's steps by index;
//! - `grpo_step`: `A_token = A^E + step.omega * A^S_token` with A^S on the
//!   `step.credit_target` tokens of each plan step (`action_name`, `action_id`
//!   or `semantic`), from `step.kind = rule` (+1 / -1 from the rewards table's
//!   `step_match`) or `forward_proxy` (the teacher_logp table's contrast, see
//!   `embodyflow_algos::step_adv`); tokens are aligned with the policy's
//!   tokenizer (`--policy CKPT` or `step.tokenizer`), see
//!   `embodyflow_algos::spans`. A response without a plan gets A^S = 0.
//!
//! `stepopsd.enabled = true` applies StepOPSD's sign-preserving reweighting to
//! the final advantage of grpo, dr_grpo or grpo_step (needs teacher_logp).
//! The step path reports responses with non-zero A^S, parse failures, offset
//! fallbacks, span check failures and sign-flip ratios (overall, where
//! A^E != 0, success vs failure, rule-correct vs rule-wrong steps) in
//! `diagnostics.json` and the summary.
//!
//! `filter.dynamic_sampling = true` drops groups whose scores are all equal.
//! With `--shard i/n` a process writes the steps of the groups it owns
//! (stable hash of `group_id`); group statistics and GAE whitening are always
//! computed over the whole input, so the shards' outputs together equal the
//! unsharded output.
//!
//! ```text
//! compute-advantages --input runs/it0/rollouts --input runs/it0/rewards \
//!     --out runs/it0/adv --set estimator=gae --set gae.level=decision
//! ```
//!
//! Bad input (exit 2, nothing written): a trajectory without a rewards row or
//! with two, a rewards row whose trajectory or group is unknown, a score that
//! is NaN or infinite, missing, duplicated or extra steps, values missing or of the
//! wrong length for GAE, teacher_logp rows missing, of the wrong length or not
//! finite when forward_proxy or StepOPSD needs them.

mod heatmap;
mod step;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float32Array, Int32Array, ListArray, RecordBatch, StringArray,
    new_null_array,
};
use arrow::compute::filter_record_batch;
use arrow::datatypes::DataType;
use embodyflow_algos::gae::{GaeParams, WhitenStats, gae_tokens};
use embodyflow_algos::grpo::{GroupNorm, episode_advantages, is_mixed};
use embodyflow_core::cli::StageArgs;
use embodyflow_core::dataset::{TableReader, column};
use embodyflow_core::schemas::{AdvantageRow, TableName};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, Result, progress};
use serde::{Deserialize, Serialize};

pub use step::{Gate, StepConfig, StepDiagnostics, StepKind, StepOpsdConfig};

/// Command line of `compute-advantages`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::COMPUTE_ADVANTAGES.name,
    version,
    about = spec::COMPUTE_ADVANTAGES.purpose,
    after_help = spec::COMPUTE_ADVANTAGES.help()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
    /// Policy checkpoint whose tokenizer.json aligns tokens with plan steps
    /// (grpo_step and StepOPSD; `step.tokenizer` names the file directly).
    #[arg(long, value_name = "CKPT")]
    policy: Option<PathBuf>,
    /// Draw per-token heatmaps of N responses into OUT/heatmaps/ (PNG + index.md).
    #[arg(long, value_name = "N")]
    heatmaps: Option<usize>,
}

/// The advantage estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// Group-normalised outcome (GRPO).
    Grpo,
    /// Group-centred outcome (Dr. GRPO).
    DrGrpo,
    /// Generalised advantage estimation with a critic.
    Gae,
    /// GRPO plus omega times a step advantage on plan-step tokens.
    GrpoStep,
}

impl Estimator {
    fn name(self) -> &'static str {
        match self {
            Estimator::Grpo => "grpo",
            Estimator::DrGrpo => "dr_grpo",
            Estimator::Gae => "gae",
            Estimator::GrpoStep => "grpo_step",
        }
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

/// `grpo.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    /// Added to the group's standard deviation.
    pub eps: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig { eps: 1e-6 }
    }
}

/// `gae.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GaeConfig {
    /// Discount.
    pub gamma: f32,
    /// GAE lambda.
    pub lam: f32,
    /// Token-level or decision-level values.
    pub level: GaeLevel,
}

impl Default for GaeConfig {
    fn default() -> Self {
        GaeConfig {
            gamma: 0.99,
            lam: 0.95,
            level: GaeLevel::Token,
        }
    }
}

/// `filter.*` settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Drop groups whose scores are all equal.
    pub dynamic_sampling: bool,
}

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The estimator.
    pub estimator: Estimator,
    /// GRPO settings.
    pub grpo: GrpoConfig,
    /// GAE settings.
    pub gae: GaeConfig,
    /// Group filter.
    pub filter: FilterConfig,
    /// grpo_step settings.
    pub step: StepConfig,
    /// StepOPSD reweighting (grpo, dr_grpo, grpo_step).
    pub stepopsd: StepOpsdConfig,
    /// Rows per record batch read from the steps table.
    pub batch_rows: usize,
    /// Output layout.
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            estimator: Estimator::Grpo,
            grpo: GrpoConfig::default(),
            gae: GaeConfig::default(),
            filter: FilterConfig::default(),
            step: StepConfig::default(),
            stepopsd: StepOpsdConfig::default(),
            batch_rows: 4096,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn output(&self) -> &OutputConfig {
        &self.output
    }
}

/// One trajectory with its reward, as the estimators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Trajectory id.
    pub trajectory_id: String,
    /// Dense index of its group.
    pub group: u32,
    /// Its score R_i.
    pub score: f32,
    /// Decision steps it has.
    pub num_steps: i32,
}

/// The batch's trajectories joined with their rewards, grouped.
#[derive(Debug, Clone, Default)]
pub struct Episodes {
    /// Trajectories in input order.
    pub list: Vec<Episode>,
    /// Group ids by dense index.
    pub group_ids: Vec<String>,
    index: HashMap<String, usize>,
}

impl Episodes {
    /// Joins trajectories `(trajectory_id, group_id, num_steps)` with rewards
    /// `(trajectory_id, group_id, score)`, checking that every trajectory has
    /// exactly one finite score and the same group on both sides.
    pub fn join(
        trajectories: impl IntoIterator<Item = (String, String, i32)>,
        rewards: impl IntoIterator<Item = (String, String, f32)>,
    ) -> Result<Episodes> {
        let mut episodes = Episodes::default();
        let mut group_index: HashMap<String, u32> = HashMap::new();
        let mut groups_of: Vec<String> = Vec::new();
        for (trajectory_id, group_id, num_steps) in trajectories {
            let next = group_index.len() as u32;
            let group = *group_index.entry(group_id.clone()).or_insert_with(|| {
                episodes.group_ids.push(group_id.clone());
                next
            });
            if episodes
                .index
                .insert(trajectory_id.clone(), episodes.list.len())
                .is_some()
            {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}` appears twice in trajectories"
                )));
            }
            groups_of.push(group_id);
            episodes.list.push(Episode {
                trajectory_id,
                group,
                score: f32::NAN,
                num_steps,
            });
        }
        let mut scored = vec![false; episodes.list.len()];
        for (trajectory_id, group_id, score) in rewards {
            let Some(&i) = episodes.index.get(&trajectory_id) else {
                let reason = if group_index.contains_key(&group_id) {
                    "trajectory"
                } else {
                    "trajectory and group"
                };
                return Err(Error::BadInput(format!(
                    "rewards row for trajectory `{trajectory_id}` (group `{group_id}`): unknown {reason}; is it from another rollout set?"
                )));
            };
            if groups_of[i] != group_id {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}`: rewards give group `{group_id}`, trajectories give group `{}`",
                    groups_of[i]
                )));
            }
            if scored[i] {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}` has two rewards rows"
                )));
            }
            if !score.is_finite() {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}`: score is {score}, expected a finite number"
                )));
            }
            scored[i] = true;
            episodes.list[i].score = score;
        }
        if let Some(i) = scored.iter().position(|s| !s) {
            return Err(Error::BadInput(format!(
                "trajectory `{}` has no rewards row ({} of {} trajectories are unscored); run score-rewards on this rollout set",
                episodes.list[i].trajectory_id,
                scored.iter().filter(|s| !**s).count(),
                scored.len()
            )));
        }
        Ok(episodes)
    }

    /// Index of a trajectory.
    pub fn get(&self, trajectory_id: &str) -> Option<usize> {
        self.index.get(trajectory_id).copied()
    }

    /// The episode of each steps row, counting the steps seen per episode;
    /// a row of an unknown trajectory is bad input.
    pub fn locate_steps(&self, ids: &StringArray, step_counts: &mut [i32]) -> Result<Vec<usize>> {
        (0..ids.len())
            .map(|i| {
                let e = self.get(ids.value(i)).ok_or_else(|| {
                    Error::BadInput(format!(
                        "steps row for trajectory `{}`, which is not in trajectories",
                        ids.value(i)
                    ))
                })?;
                step_counts[e] += 1;
                Ok(e)
            })
            .collect()
    }

    /// Per group: whether dynamic sampling keeps it (scores not all equal).
    pub fn mixed_groups(&self) -> Vec<bool> {
        let mut scores: Vec<Vec<f32>> = vec![Vec::new(); self.group_ids.len()];
        for e in &self.list {
            scores[e.group as usize].push(e.score);
        }
        scores.into_iter().map(is_mixed).collect()
    }
}

fn read_episodes(trajectories: &TableReader, rewards: &TableReader) -> Result<Episodes> {
    let mut traj = Vec::with_capacity(trajectories.num_rows() as usize);
    for batch in trajectories.batches(Some(&["trajectory_id", "group_id", "num_steps"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let groups = column::<StringArray>(&batch, "group_id");
        let steps = column::<Int32Array>(&batch, "num_steps");
        for i in 0..batch.num_rows() {
            traj.push((
                ids.value(i).to_string(),
                groups.value(i).to_string(),
                steps.value(i),
            ));
        }
    }
    let mut scores = Vec::with_capacity(rewards.num_rows() as usize);
    for batch in rewards.batches(Some(&["trajectory_id", "group_id", "score"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let groups = column::<StringArray>(&batch, "group_id");
        let score = column::<Float32Array>(&batch, "score");
        for i in 0..batch.num_rows() {
            scores.push((
                ids.value(i).to_string(),
                groups.value(i).to_string(),
                score.value(i),
            ));
        }
    }
    Episodes::join(traj, scores)
}

/// What a run did, for the summary and `diagnostics.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Diagnostics {
    /// Estimator used.
    pub estimator: String,
    /// Trajectories in the input.
    pub trajectories: usize,
    /// Groups in the input.
    pub groups: usize,
    /// Groups kept by dynamic sampling (all when it is off).
    pub kept_groups: usize,
    /// Groups dropped because every score was equal.
    pub dropped_groups: usize,
    /// Steps written by this process.
    pub steps_written: u64,
    /// Response tokens written by this process.
    pub tokens_written: u64,
    /// Mean episode advantage over written steps.
    pub episode_adv_mean: f64,
    /// Standard deviation of the episode advantage over written steps.
    pub episode_adv_std: f64,
    /// The step path's counts (grpo_step, StepOPSD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepDiagnostics>,
}

/// Runs the stage.
pub fn run(args: Args) -> Result<()> {
    let stage = Stage::<Config>::start(
        &spec::COMPUTE_ADVANTAGES,
        env!("CARGO_PKG_VERSION"),
        &args.stage,
    )?;
    stage.check_outputs(&[TableName::Advantages])?;
    let trajectories = stage.input(TableName::Trajectories)?;
    let rewards = stage.input(TableName::Rewards)?;
    let steps = stage.input(TableName::Steps)?;
    let config = &stage.config;

    let episodes = read_episodes(&trajectories, &rewards)?;
    let kept = if config.filter.dynamic_sampling {
        episodes.mixed_groups()
    } else {
        vec![true; episodes.group_ids.len()]
    };
    let shard = stage.args.shard;
    let owned: Vec<bool> = episodes
        .group_ids
        .iter()
        .zip(&kept)
        .map(|(g, &k)| k && shard.owns(g))
        .collect();

    let mut diagnostics = Diagnostics {
        estimator: config.estimator.name().to_string(),
        trajectories: episodes.list.len(),
        groups: episodes.group_ids.len(),
        kept_groups: kept.iter().filter(|k| **k).count(),
        dropped_groups: kept.iter().filter(|k| !**k).count(),
        ..Diagnostics::default()
    };
    let mut writer = stage.writer(TableName::Advantages)?;
    let mut adv_sum = 0f64;
    let mut adv_sq = 0f64;
    match config.estimator {
        Estimator::Grpo | Estimator::DrGrpo if !config.stepopsd.enabled => {
            let norm = GroupNorm {
                norm_by_std: config.estimator == Estimator::Grpo,
                eps: config.grpo.eps,
            };
            let scores: Vec<f32> = episodes.list.iter().map(|e| e.score).collect();
            let groups: Vec<u32> = episodes.list.iter().map(|e| e.group).collect();
            let advantages = episode_advantages(&scores, &groups, norm);
            let bar = progress::bar(steps.num_rows(), "advantages");
            let mut step_counts = vec![0i32; episodes.list.len()];
            for batch in steps.batches(
                Some(&["trajectory_id", "step_index", "response_ids"]),
                config.batch_rows,
            )? {
                let batch = batch?;
                bar.inc(batch.num_rows() as u64);
                let out = grpo_batch(
                    &batch,
                    &episodes,
                    &owned,
                    &advantages,
                    config.estimator.name(),
                    &mut step_counts,
                )?;
                let values = column::<Float32Array>(&out, "episode_adv");
                let lengths = column::<ListArray>(&out, "advantages");
                for i in 0..out.num_rows() {
                    let a = f64::from(values.value(i));
                    adv_sum += a;
                    adv_sq += a * a;
                    diagnostics.tokens_written += lengths.value_length(i) as u64;
                }
                diagnostics.steps_written += out.num_rows() as u64;
                writer.write_batch(&out)?;
            }
            bar.finish_and_clear();
            check_step_counts(&episodes, &step_counts)?;
        }
        Estimator::Grpo | Estimator::DrGrpo | Estimator::GrpoStep => {
            let step_diag = run_step_path(
                &stage,
                &args,
                &episodes,
                &owned,
                &rewards,
                &steps,
                &mut writer,
                &mut |row| {
                    adv_sum += f64::from(row.episode_adv);
                    adv_sq += f64::from(row.episode_adv).powi(2);
                    diagnostics.tokens_written += row.advantages.len() as u64;
                    diagnostics.steps_written += 1;
                },
            )?;
            diagnostics.step = Some(step_diag);
        }
        Estimator::Gae => {
            gae_rows(
                &steps,
                &episodes,
                &kept,
                &owned,
                &config.gae,
                config.batch_rows,
                &mut writer,
                &mut |episode_adv, tokens| {
                    adv_sum += f64::from(episode_adv);
                    adv_sq += f64::from(episode_adv).powi(2);
                    diagnostics.tokens_written += tokens as u64;
                    diagnostics.steps_written += 1;
                },
            )?;
        }
    }
    let n = diagnostics.steps_written.max(1) as f64;
    diagnostics.episode_adv_mean = adv_sum / n;
    diagnostics.episode_adv_std = (adv_sq / n - diagnostics.episode_adv_mean.powi(2))
        .max(0.0)
        .sqrt();
    stage.finish(writer)?;
    if let Some(count) = args.heatmaps {
        let drawn = heatmap::render_table(
            &stage.args.out.join("advantages"),
            count,
            &stage.args.out.join("heatmaps"),
        )?;
        tracing::info!(drawn, dir = %stage.args.out.join("heatmaps").display(), "heatmaps");
    }

    let json_path = stage.args.out.join("diagnostics.json");
    let json = serde_json::to_string_pretty(&diagnostics).expect("diagnostics serialise");
    std::fs::write(&json_path, json + "\n").map_err(|e| Error::io(&json_path, e))?;
    let mut summary = Summary::new(format!("compute-advantages ({})", diagnostics.estimator));
    summary
        .add("shard", shard)
        .add("trajectories", diagnostics.trajectories)
        .add(
            "groups (kept / dropped as all-equal)",
            format!(
                "{} ({} / {})",
                diagnostics.groups, diagnostics.kept_groups, diagnostics.dropped_groups
            ),
        )
        .add("steps written", diagnostics.steps_written)
        .add("tokens written", diagnostics.tokens_written)
        .add(
            "episode advantage mean ± std",
            format!(
                "{:.4} ± {:.4}",
                diagnostics.episode_adv_mean, diagnostics.episode_adv_std
            ),
        );
    if let Some(step) = &diagnostics.step {
        summary
            .add(
                "responses with non-zero A^S",
                format!("{} of {}", step.responses_with_step_adv, step.responses),
            )
            .add("plan parse failures (A^S = 0)", step.parse_failures)
            .add(
                "offset fallbacks / span check failures",
                format!("{} / {}", step.offset_fallbacks, step.span_verify_failures),
            )
            .add(
                "step-count mismatches with the rule match",
                step.step_count_mismatches,
            )
            .add(
                "steps without a teacher_logp row (A^S = 0)",
                step.teacher_missing,
            )
            .add(
                "sign-flip ratio: all",
                format!(
                    "{:.4} ({} tokens)",
                    step.sign_flips.ratio(),
                    step.sign_flips.tokens
                ),
            )
            .add(
                "sign-flip ratio: where A^E != 0",
                format!(
                    "{:.4} ({} tokens)",
                    step.sign_flips_episode_adv_nonzero.ratio(),
                    step.sign_flips_episode_adv_nonzero.tokens
                ),
            )
            .add(
                "sign-flip ratio: success / failure",
                format!(
                    "{:.4} / {:.4}",
                    step.sign_flips_success.ratio(),
                    step.sign_flips_failure.ratio()
                ),
            )
            .add(
                "sign-flip ratio: rule-correct / rule-wrong",
                format!(
                    "{:.4} / {:.4}",
                    step.sign_flips_rule_correct.ratio(),
                    step.sign_flips_rule_wrong.ratio()
                ),
            );
        if let (Some(right), Some(wrong)) = (&step.step_adv_rule_correct, &step.step_adv_rule_wrong)
        {
            let describe = |d: &embodyflow_algos::step_adv::Distribution| {
                format!(
                    "{:.3} ± {:.3} (p10 {:.3}, p50 {:.3}, p90 {:.3}; {} steps)",
                    d.mean, d.std, d.p10, d.p50, d.p90, d.count
                )
            };
            summary
                .add("A^S on rule-correct steps", describe(right))
                .add("A^S on rule-wrong steps", describe(wrong))
                .add(
                    "AUC of A^S (correct vs wrong)",
                    step.step_adv_auc
                        .map_or("n/a".into(), |a| format!("{a:.3}")),
                );
        }
    }
    stage.write_summary(&summary)?;
    Ok(())
}

/// grpo_step and StepOPSD: loads the tokenizer, rule matches and teacher
/// log-probs, then aligns and scores every owned step row.
#[allow(clippy::too_many_arguments)]
fn run_step_path(
    stage: &Stage<Config>,
    args: &Args,
    episodes: &Episodes,
    owned: &[bool],
    rewards: &TableReader,
    steps: &TableReader,
    writer: &mut embodyflow_core::dataset::TableWriter,
    on_row: &mut dyn FnMut(&AdvantageRow),
) -> Result<StepDiagnostics> {
    let config = &stage.config;
    let grpo_step = config.estimator == Estimator::GrpoStep;
    let tokenizer_path = config
        .step
        .tokenizer
        .clone()
        .or_else(|| args.policy.as_ref().map(|p| p.join("tokenizer.json")))
        .ok_or_else(|| Error::Usage(format!("estimator {} needs the policy's tokenizer: pass --policy CKPT or --set step.tokenizer=PATH", config.estimator.name())))?;
    let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| Error::BadInput(format!("tokenizer {}: {e}", tokenizer_path.display())))?;
    let needs_teacher =
        config.stepopsd.enabled || (grpo_step && config.step.kind == StepKind::ForwardProxy);
    let teacher_table = if needs_teacher {
        Some(stage.input(TableName::TeacherLogp)?)
    } else {
        None
    };
    let teacher = teacher_table.as_ref().map(step::read_teacher).transpose()?;
    if grpo_step
        && config.step.gate == Gate::ResidualContrast
        && config.step.kind != StepKind::ForwardProxy
    {
        return Err(Error::BadValue {
            key: "step.gate".into(),
            reason: "residual_contrast gates the teacher-student contrast: it needs step.kind = forward_proxy".into(),
        });
    }
    let gates = if grpo_step && config.step.gate == Gate::Prompt {
        Some(step::read_gates(&stage.input(TableName::StepGates)?)?)
    } else {
        None
    };
    let rule = step::read_rule_info(rewards)?;
    let norm = GroupNorm {
        norm_by_std: config.estimator != Estimator::DrGrpo,
        eps: config.grpo.eps,
    };
    let scores: Vec<f32> = episodes.list.iter().map(|e| e.score).collect();
    let groups: Vec<u32> = episodes.list.iter().map(|e| e.group).collect();
    let episode_adv = episode_advantages(&scores, &groups, norm);
    let aligner = embodyflow_algos::spans::Aligner::new(&tokenizer);
    let inputs = step::StepInputs {
        aligner: &aligner,
        rule: &rule,
        teacher: teacher.as_ref(),
        gates: gates.as_ref(),
        step: grpo_step.then_some(&config.step),
        stepopsd: &config.stepopsd,
        estimator: config.estimator.name(),
    };
    let mut diagnostics = StepDiagnostics::default();
    let mut step_counts = vec![0i32; episodes.list.len()];
    let bar = progress::bar(steps.num_rows(), "step advantages");
    for batch in steps.batches(
        Some(&["trajectory_id", "step_index", "response_ids"]),
        config.batch_rows,
    )? {
        let batch = batch?;
        bar.inc(batch.num_rows() as u64);
        let rows = step::step_batch(
            &batch,
            episodes,
            owned,
            &episode_adv,
            &inputs,
            &mut step_counts,
            &mut diagnostics,
        )?;
        rows.iter().for_each(&mut *on_row);
        writer.write_rows(&rows)?;
    }
    bar.finish_and_clear();
    check_step_counts(episodes, &step_counts)?;
    if teacher.is_some()
        && diagnostics.responses > 0
        && diagnostics.teacher_missing == diagnostics.responses
    {
        return Err(Error::BadInput(format!(
            "none of the {} steps has a teacher_logp row: the teacher_logp input belongs to another rollout set; run teacher-logp on this one",
            diagnostics.responses
        )));
    }
    diagnostics.finish();
    Ok(diagnostics)
}

fn check_step_counts(episodes: &Episodes, step_counts: &[i32]) -> Result<()> {
    match step_counts
        .iter()
        .enumerate()
        .find(|&(e, &c)| c != episodes.list[e].num_steps)
    {
        None => Ok(()),
        Some((e, &count)) => Err(Error::BadInput(format!(
            "trajectory `{}`: steps table has {count} steps, expected {} (num_steps)",
            episodes.list[e].trajectory_id, episodes.list[e].num_steps
        ))),
    }
}

/// The advantages rows of one steps batch under GRPO / Dr. GRPO: every
/// response token of a step gets its trajectory's episode advantage. The ids
/// and list offsets are reused from the input arrays.
fn grpo_batch(
    batch: &RecordBatch,
    episodes: &Episodes,
    owned: &[bool],
    advantages: &[f32],
    estimator: &str,
    step_counts: &mut [i32],
) -> Result<RecordBatch> {
    let located =
        episodes.locate_steps(column::<StringArray>(batch, "trajectory_id"), step_counts)?;
    let keep: Vec<bool> = located
        .iter()
        .map(|&e| owned[episodes.list[e].group as usize])
        .collect();
    let batch =
        filter_record_batch(batch, &BooleanArray::from(keep)).expect("mask has the batch's length");
    let ids = column::<StringArray>(&batch, "trajectory_id");
    let responses = column::<ListArray>(&batch, "response_ids");
    let per_step: Vec<f32> = (0..batch.num_rows())
        .map(|i| advantages[episodes.get(ids.value(i)).expect("checked above")])
        .collect();
    let offsets = responses.offsets();
    let base = offsets[0] as usize;
    let mut tokens = Vec::with_capacity(offsets[offsets.len() - 1] as usize - base);
    for (i, &a) in per_step.iter().enumerate() {
        tokens.resize(tokens.len() + responses.value_length(i) as usize, a);
    }
    let rebased =
        arrow::buffer::OffsetBuffer::new(offsets.iter().map(|&o| o - base as i32).collect());
    Ok(advantages_batch(
        batch.column_by_name("trajectory_id").expect("read").clone(),
        batch.column_by_name("step_index").expect("read").clone(),
        rebased,
        tokens,
        None,
        per_step,
        estimator,
    ))
}

/// An advantages record batch from its columns: per-token `advantages` (and
/// `returns`, same offsets) as flat values with list offsets; `step_adv` null.
fn advantages_batch(
    trajectory_ids: ArrayRef,
    step_index: ArrayRef,
    offsets: arrow::buffer::OffsetBuffer<i32>,
    advantages: Vec<f32>,
    returns: Option<Vec<f32>>,
    episode_adv: Vec<f32>,
    estimator: &str,
) -> RecordBatch {
    let schema = TableName::Advantages.def().arrow_schema();
    let item = match schema
        .field_with_name("advantages")
        .expect("schema column")
        .data_type()
    {
        DataType::List(item) => item.clone(),
        other => unreachable!("advantages is a list, not {other}"),
    };
    let list_type = DataType::List(item.clone());
    let n = episode_adv.len();
    let list = |values: Vec<f32>| -> ArrayRef {
        Arc::new(ListArray::new(
            item.clone(),
            offsets.clone(),
            Arc::new(Float32Array::from(values)),
            None,
        ))
    };
    let columns: Vec<ArrayRef> = vec![
        trajectory_ids,
        step_index,
        list(advantages),
        returns.map_or_else(|| new_null_array(&list_type, n), list),
        Arc::new(Float32Array::from(episode_adv)),
        new_null_array(&list_type, n),
        Arc::new(StringArray::from(vec![estimator; n])),
    ];
    RecordBatch::try_new(schema, columns).expect("columns follow the advantages schema")
}

/// GAE in two streaming passes over the steps table (whitening needs the
/// statistics of the whole input before the first row can be written):
/// pass 1 computes every kept trajectory's raw advantages and gathers the
/// whitening statistics ([`WhitenStats`], merged per trajectory); pass 2
/// recomputes the raw advantages and returns, whitens them with the pass-1
/// statistics and writes the owned steps' rows in record batches of
/// `batch_rows`. `on_row` sees each written row's episode advantage and token
/// count, in output order.
#[allow(clippy::too_many_arguments)]
fn gae_rows(
    steps: &TableReader,
    episodes: &Episodes,
    kept: &[bool],
    owned: &[bool],
    gae: &GaeConfig,
    batch_rows: usize,
    writer: &mut embodyflow_core::dataset::TableWriter,
    on_row: &mut dyn FnMut(f32, usize),
) -> Result<()> {
    let stream = GaeStream {
        steps,
        episodes,
        kept,
        gae,
        batch_rows,
    };
    // Pass 1: statistics (reads response_ids only to check old_values' lengths).
    let mut stats = WhitenStats::default();
    stream.run(
        gae.level == GaeLevel::Token,
        "gae statistics",
        |rows, advantages, _| {
            for row in rows.offsets.windows(2) {
                stats.add(&advantages[row[0]..row[1]]);
            }
            Ok(())
        },
    )?;
    let whitening = stats
        .whitening()
        .map_err(|err| Error::BadInput(format!("gae: {err} (the batch is too small)")))?;

    // Pass 2: whiten and write (token level: old_values' lengths are the token counts).
    let mut pending = GaeOutput::default();
    stream.run(
        gae.level == GaeLevel::Decision,
        "gae advantages",
        |rows, advantages, returns| {
            whitening.apply(advantages);
            for (row, &e) in rows.episodes.iter().enumerate() {
                let episode = &episodes.list[e];
                if !owned[episode.group as usize] {
                    continue;
                }
                let mut position = rows.offsets[row];
                for &(step_index, tokens) in
                    &rows.steps[rows.step_offsets[row]..rows.step_offsets[row + 1]]
                {
                    let start = pending.advantages.len();
                    match gae.level {
                        GaeLevel::Token => {
                            let range = position..position + tokens;
                            position += tokens;
                            pending
                                .advantages
                                .extend_from_slice(&advantages[range.clone()]);
                            pending.returns.extend_from_slice(&returns[range]);
                        }
                        GaeLevel::Decision => {
                            pending
                                .advantages
                                .resize(start + tokens, advantages[position]);
                            pending.returns.resize(start + tokens, returns[position]);
                            position += 1;
                        }
                    }
                    let adv = &pending.advantages[start..];
                    let episode_adv = if adv.is_empty() {
                        0.0
                    } else {
                        adv.iter().sum::<f32>() / adv.len() as f32
                    };
                    pending.ids.push(episode.trajectory_id.as_str());
                    pending.step_index.push(step_index);
                    pending.offsets.push(pending.advantages.len() as i32);
                    pending.episode_adv.push(episode_adv);
                    on_row(episode_adv, tokens);
                    if pending.step_index.len() >= batch_rows {
                        writer.write_batch(&std::mem::take(&mut pending).into_batch())?;
                    }
                }
            }
            Ok(())
        },
    )?;
    writer.write_batch(&pending.into_batch())
}

/// One pass of GAE over the steps table.
struct GaeStream<'a> {
    steps: &'a TableReader,
    episodes: &'a Episodes,
    kept: &'a [bool],
    gae: &'a GaeConfig,
    batch_rows: usize,
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
/// for [`gae_tokens`]: one row of positions (tokens or decisions) per
/// trajectory, its outcome on the last position.
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
    /// Row r's positions are `offsets[r]..offsets[r + 1]`.
    offsets: Vec<usize>,
}

impl GaeRows {
    /// Empty, with room for `positions` values.
    fn with_capacity(positions: usize) -> GaeRows {
        GaeRows {
            step_offsets: vec![0],
            offsets: vec![0],
            values: Vec::with_capacity(positions),
            rewards: Vec::with_capacity(positions),
            ..GaeRows::default()
        }
    }

    /// Appends a trajectory whose step count reached `num_steps`, checking
    /// that its steps are exactly 0..num_steps; `values` holds the steps'
    /// value ranges.
    fn push(
        &mut self,
        e: usize,
        episode: &Episode,
        steps: &mut [PendingStep],
        values: &[f32],
    ) -> Result<()> {
        steps.sort_by_key(|s| s.step_index);
        if !steps.iter().map(|s| s.step_index).eq(0..episode.num_steps) {
            return Err(step_indices_error(episode, steps));
        }
        for step in steps.iter() {
            self.values.extend_from_slice(&values[step.values.clone()]);
            self.steps.push((step.step_index, step.tokens));
        }
        self.rewards.resize(self.values.len(), 0.0);
        // A trajectory without positions (token level, every response empty)
        // has nowhere to carry its outcome: it adds nothing to GAE.
        if self.values.len() > *self.offsets.last().expect("leading 0") {
            *self.rewards.last_mut().expect("a position") = episode.score;
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
    /// the trajectories completed in each record batch go through
    /// [`gae_tokens`] together and `on_rows` gets them with their raw
    /// advantages and returns. `read_tokens`: read `response_ids` (token
    /// counts, checked against `old_values`); without it a step's token count
    /// is its number of values (0 at decision level).
    fn run(
        &self,
        read_tokens: bool,
        label: &str,
        mut on_rows: impl FnMut(&GaeRows, &mut [f32], &[f32]) -> Result<()>,
    ) -> Result<()> {
        let (episodes, gae) = (self.episodes, self.gae);
        let value_column = match gae.level {
            GaeLevel::Token => "old_values",
            GaeLevel::Decision => "old_value",
        };
        let mut columns = vec!["trajectory_id", "step_index", value_column];
        if read_tokens {
            columns.push("response_ids");
        }
        let params = GaeParams {
            gamma: gae.gamma,
            lam: gae.lam,
        };
        let mut open: HashMap<usize, OpenTrajectory> = HashMap::new();
        let mut complete = vec![false; episodes.list.len()];
        let bar = progress::bar(self.steps.num_rows(), label);
        for batch in self.steps.batches(Some(&columns), self.batch_rows)? {
            let batch = batch?;
            bar.inc(batch.num_rows() as u64);
            let ids = column::<StringArray>(&batch, "trajectory_id");
            let index = column::<Int32Array>(&batch, "step_index");
            let responses = read_tokens.then(|| column::<ListArray>(&batch, "response_ids"));
            let positions = match gae.level {
                GaeLevel::Token => {
                    let offsets = column::<ListArray>(&batch, "old_values").offsets();
                    (offsets[offsets.len() - 1] - offsets[0]) as usize
                }
                GaeLevel::Decision => batch.num_rows(),
            };
            let mut rows = GaeRows::with_capacity(positions);
            for i in 0..batch.num_rows() {
                let id = ids.value(i);
                let Some(e) = episodes.get(id) else {
                    return Err(Error::BadInput(format!(
                        "steps row for trajectory `{id}`, which is not in trajectories"
                    )));
                };
                let episode = &episodes.list[e];
                if !self.kept[episode.group as usize] {
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
                    Error::BadInput(format!(
                        "trajectory `{id}` step {}: `{value_column}` is null; gae.level = {:?} needs it (was the policy run with a value head?)",
                        index.value(i),
                        gae.level
                    ))
                };
                let decision: [f32; 1];
                let (step_values, tokens): (&[f32], usize) = match gae.level {
                    GaeLevel::Token => {
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
                    GaeLevel::Decision => {
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
                    rows.push(e, episode, &mut [step], step_values)?;
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
                    rows.push(e, episode, &mut trajectory.steps, &trajectory.values)?;
                }
            }
            if !rows.episodes.is_empty() {
                let (mut advantages, returns) =
                    gae_tokens(&rows.rewards, &rows.values, &rows.offsets, params);
                on_rows(&rows, &mut advantages, &returns)?;
            }
        }
        bar.finish_and_clear();
        // Kept trajectories whose steps never all arrived.
        for (e, episode) in episodes.list.iter().enumerate() {
            if self.kept[episode.group as usize] && !complete[e] && episode.num_steps > 0 {
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

impl GaeOutput<'_> {
    fn into_batch(self) -> RecordBatch {
        let offsets = arrow::buffer::OffsetBuffer::new(
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
            Estimator::Gae.name(),
        )
    }
}
