//! The `compute-advantages` stage: reads trajectories, steps and rewards and
//! writes the advantages table (one row per step, one advantage per response
//! token), `diagnostics.json` and a summary.
//!
//! One estimator runs per call (`estimator = ...`), each declared once
//! ([`Estimator`]: name, what it computes, config sections, checks, extra
//! tables, how to build it) and listed once in [`ESTIMATORS`]
//! (`registry.rs`); the stage iterates that list and never names an
//! estimator (`--help` lists them with what each computes):
//! - `outcome.rs` — the outcome-estimator shape (an advantage per
//!   trajectory from its group's scores; the streaming, faults, sharding,
//!   valid tokens and the broadcast to tokens written once) and veRL's
//!   outcome family declared on it: `rloo`, `opo`, `gpg`, `grpo_passk`,
//!   `reinforce_plus_plus_baseline` (veRL 0.9.1's numerics);
//! - `grpo.rs` — `grpo`: A^E_i = (R_i - mean_g R) / (std_g R + eps), and
//!   `dr_grpo`: A^E_i = R_i - mean_g R, outcome estimators too (veRL
//!   numerics);
//! - `gae.rs` — `gae`: GAE over token-level (`old_values`) or decision-level
//!   (`old_value`) critic values, whitened over the kept batch (veRL's
//!   `compute_gae_advantage_return` and `masked_whiten`), streamed in two
//!   passes; `reinforce_plus_plus`: the same without a critic (V = 0,
//!   lambda = 1), each token's discounted return whitened;
//! - `step.rs` — `grpo_step`: A = A^E + omega * A^S on plan-step tokens
//!   (rule or forward_proxy A^S), and StepOPSD's sign-preserving reweighting
//!   on grpo, dr_grpo or grpo_step (`stepopsd.enabled`);
//! - `gigpo.rs` — `gigpo`: A = A^E + omega * A^S, A^S the discounted return
//!   of a decision normalised among the group's decisions from the same
//!   anchor state (`steps.anchor_key`), broadcast to the decision's tokens
//!   (verl-agent's GiGPO numerics).
//!
//! What they share lives in one place each, below them: the interface
//! (`estimator.rs`), the join of trajectories, rewards and steps and the
//! choice of groups (`episodes.rs`), the response masks (`holes.rs`), the
//! writer that counts every row it writes (`output.rs`), the run's
//! statistics, `diagnostics.json` and summary (`diagnostics.rs`) and the
//! shared keys and section type (`config.rs`); `--heatmaps` draws in
//! `heatmap.rs`.
//!
//! The advantages table, `diagnostics.json`, the `--heatmaps N` directory
//! and the summary appear together or not at all (`embodyflow_core::commit`).
//!
//! `filter.dynamic_sampling = true` drops groups whose scores are all equal.
//! A trajectory ended by infrastructure (`trajectories.infra_fault`) is left
//! out of its group by every estimator and gets no row (`episodes.rs`); a
//! group-relative estimator drops a group that faults leave with fewer than
//! 2. A run that keeps no group of a non-empty input warns.
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
//! **Token rewards and masks** (veRL's `token_level_rewards` and
//! `response_mask`): a rewards row's `token_rewards` (one per response token
//! of the trajectory, steps in order) makes their sum the score (GRPO, Dr.
//! GRPO, grpo_step's A^E, GiGPO's A^E; `score` must agree within 1e-4
//! relative), token-level GAE's r_t, and, summed per step, the step reward
//! of decision-level GAE and GiGPO. A step's `response_mask` marks tool or
//! observation tokens (false): advantage 0 there from every estimator
//! (`holes.rs`), skipped by token-level GAE and left out of its whitening.
//!
//! Bad input (exit 2, nothing written): a trajectory without a rewards row or
//! with two, a rewards row whose trajectory or group is unknown, a score that
//! is NaN or infinite, missing, duplicated or extra steps, values missing or of the
//! wrong length for GAE, teacher_logp rows missing, of the wrong length or not
//! finite when forward_proxy or StepOPSD needs them, token rewards whose sum is
//! not the score or whose length is not the trajectory's response tokens, a
//! response mask whose length is not the step's response.

mod config;
mod diagnostics;
mod episodes;
mod estimator;
mod gae;
mod gigpo;
mod grpo;
mod heatmap;
mod holes;
mod outcome;
mod output;
mod registry;
mod step;
#[cfg(test)]
mod testdata;
#[cfg(test)]
mod toy;

use std::path::{Path, PathBuf};

use embodyflow_core::cli::StageArgs;
use embodyflow_core::commit::{self, Digest};
use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{AdvantageRow, TableName};
use embodyflow_core::spec::{self, DIAGNOSTICS_FILE};
use embodyflow_core::stage::Stage;
use embodyflow_core::{Error, Result};

pub use config::{Config, FilterConfig, Section};
pub use diagnostics::{AdvantageStats, Diagnostics};
pub use episodes::{Episode, Episodes, GrpoConfig};
pub use estimator::Estimator;
pub use gae::{GaeConfig, GaeLevel};
pub use gigpo::GigpoConfig;
pub use registry::ESTIMATORS;
pub use step::{Gate, StepConfig, StepDiagnostics, StepKind, StepOpsdConfig};

use episodes::Groups;
use estimator::{Build, StepsInput};
use holes::Holes;
use output::AdvantagesOut;

/// Command line of `compute-advantages`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::COMPUTE_ADVANTAGES.name,
    version,
    about = spec::COMPUTE_ADVANTAGES.purpose,
    after_help = after_help()
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

/// `--help` after the options: the stage's reads, writes and config keys,
/// then the estimators with what each computes.
fn after_help() -> String {
    format!(
        "{}\n{}",
        spec::COMPUTE_ADVANTAGES.help_with_config::<Config>(),
        registry::listing()
    )
}

/// Runs the stage.
pub fn run(args: Args) -> Result<()> {
    let stage = Stage::<Config>::start(
        &spec::COMPUTE_ADVANTAGES,
        env!("CARGO_PKG_VERSION"),
        &args.stage,
    )?;
    let mut outputs = vec![TableName::Advantages.as_str(), DIAGNOSTICS_FILE];
    outputs.extend(args.heatmaps.map(|_| HEATMAPS));
    stage.check_output_names(&outputs)?;
    let trajectories = stage.input(TableName::Trajectories)?;
    let rewards = stage.input(TableName::Rewards)?;
    let steps = stage.input(TableName::Steps)?;
    let config = &stage.config;
    let chosen = registry::chosen(config);

    let episodes = Episodes::read(&trajectories, &rewards)?;
    let groups = Groups::select(
        &episodes,
        config.filter.dynamic_sampling,
        chosen.group_relative,
        stage.args.shard,
    );
    let estimator = (chosen.build)(&Build {
        config,
        estimator: chosen,
        policy: args.policy.as_deref(),
        rewards: &rewards,
        input: &|table| stage.input(table),
    })?;
    let holes = std::sync::Arc::new(Holes::read(&steps, config.batch_rows)?);
    let input = StepsInput {
        steps: &steps,
        episodes: &episodes,
        groups: &groups,
        batch_rows: config.batch_rows,
        holes: &holes,
    };
    let mut out = AdvantagesOut::new(
        stage.writer(TableName::Advantages)?,
        args.heatmaps.unwrap_or(0),
        holes.clone(),
    );
    let reported = estimator.write(&input, &mut out)?;
    let (writer, stats, heatmap_rows) = out.into_parts();
    stage.finish(writer)?;
    let diagnostics = Diagnostics::new(chosen.name, &episodes, &groups, &stats);
    let json = match &reported {
        Some(report) => report.to_json(&diagnostics),
        None => diagnostics.to_json(),
    };
    stage_file(&stage, DIAGNOSTICS_FILE, json.as_bytes())?;
    if args.heatmaps.is_some() {
        stage_heatmaps(&stage, &steps, args.policy.as_deref(), &heatmap_rows)?;
    }
    let mut summary = diagnostics.summary(stage.args.shard);
    if let Some(report) = &reported {
        report.add_lines(&mut summary);
    }
    stage.commit(&summary)?;
    Ok(())
}

/// The directory `--heatmaps` draws into.
const HEATMAPS: &str = "heatmaps";

/// Draws `rows` into a staged directory, to be committed as `heatmaps/`,
/// with each token's text when the policy's tokenizer is at hand
/// (`step.tokenizer`, else `--policy`/tokenizer.json), its id otherwise.
fn stage_heatmaps(
    stage: &Stage<Config>,
    steps: &TableReader,
    policy: Option<&Path>,
    rows: &[AdvantageRow],
) -> Result<()> {
    let staged = commit::staging_name(HEATMAPS);
    let dir = stage.args.out.join(&staged);
    let tokenizer = step::tokenizer_path(&stage.config, policy)
        .map(|path| {
            tokenizers::Tokenizer::from_file(&path)
                .map_err(|e| Error::BadInput(format!("tokenizer {}: {e}", path.display())))
        })
        .transpose()?;
    let ids = heatmap::response_ids(steps, rows, stage.config.batch_rows)?;
    let tokens: Vec<Option<Vec<String>>> = ids
        .iter()
        .map(|ids| Some(heatmap::token_texts(ids, tokenizer.as_ref())))
        .collect();
    let drawn = heatmap::render_rows(rows, &tokens, &dir)?;
    sync_files(&dir)?;
    stage.stage_output(&staged, HEATMAPS, Digest::DirAll)?;
    tracing::info!(drawn, dir = %stage.args.out.join(HEATMAPS).display(), "heatmaps");
    Ok(())
}

/// Writes `bytes` under a staged name in the output directory, fsynced, to
/// be committed as `name` with the run's other outputs.
fn stage_file(stage: &Stage<Config>, name: &str, bytes: &[u8]) -> Result<()> {
    let staged = commit::staging_name(name);
    let path = stage.args.out.join(&staged);
    std::fs::write(&path, bytes)
        .and_then(|()| std::fs::File::open(&path)?.sync_all())
        .map_err(|e| Error::io(&path, e))?;
    stage.stage_output(&staged, name, Digest::File)
}

/// Fsyncs every file in `dir` and the directory itself.
fn sync_files(dir: &Path) -> Result<()> {
    let sync = |path: &Path| std::fs::File::open(path)?.sync_all();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        sync(&path).map_err(|e| Error::io(&path, e))?;
    }
    sync(dir).map_err(|e| Error::io(dir, e))
}
