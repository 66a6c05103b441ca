//! The `report` tool: step-credit analyses over saved tables, as Markdown and
//! PNG, for comparing advantage variants computed offline on one rollout set
//! (`step-reward-gigpo-opsd-notes` §7, `easyr1-embody-stepopsd-notes` §8,
//! §11).
//!
//! Each `--variant NAME=DIR` is a `compute-advantages` output directory
//! (`advantages/` and `diagnostics.json`); the rewards it was computed from
//! are found through its manifest's lineage and checked by content hash. Each
//! `--teacher NAME=DIR` is a `teacher-logp` output directory. Per variant,
//! lazy polars queries over the shards explode the per-token advantages and
//! join the trajectories' success:
//!
//! - credited tokens: tokens with a non-zero A^S;
//! - sign-flip ratio `mean[sign(A) != sign(A^E)]` over credited tokens, all /
//!   successful / failed trajectories (the rule-correct / rule-wrong split and
//!   the AUC of A^S between rule-correct and rule-wrong steps come from the
//!   variant's `diagnostics.json`, where the step alignment is known);
//! - the A^S distribution on credited tokens of successful and failed
//!   trajectories, and a PNG histogram of both (successful in blue, failed in
//!   red, A^S from -1 to 1 left to right, each as a share of its own tokens);
//! - a per-token heatmap of the first 8 responses (the seeds' `*_total.png` /
//!   `*_stepReward.png`): each token's text (the steps' `response_ids`, found
//!   through the lineage like the rewards, decoded by `--tokenizer FILE` or
//!   `--policy CKPT`'s tokenizer.json; `#id` without), A and A^S per token,
//!   red positive, blue negative, each response named by trajectory id and
//!   step, a colour bar for each;
//!
//! every PNG with a title, axes labelled with units and a legend or colour
//! bar, in the font [`embodyflow_plots`] embeds;
//! - the settings it was computed with (estimator, rule match mode, credit
//!   target, score source, omega, gate), so rule-mode and credit-target
//!   ablations read as rows of one table;
//!
//! and per teacher the contrast `teacher_logp - student_logp` per token
//! (mean, std, min, max) and the spread of its per-step mean.
//!
//! Each `--curve NAME=FILE` is an RL run's success per iteration
//! (scripts/rl_loop's `curve.tsv`): a table of its first and last figures
//! and `success.png`, the train success of the sampled rollouts and the
//! greedy val success per iteration ([`embodyflow_plots::success_curves`]);
//! with curves alone the Markdown is `success.md`:
//!
//! ```text
//! report --curve household-grpo=runs/demo/rl/curve.tsv --out runs/demo/report
//! ```
//!
//! ```text
//! report --variant rule=runs/adv-rule --variant proxy-self=runs/adv-proxy-self \
//!     --teacher self=runs/teacher-self --teacher generalist=runs/teacher-gen \
//!     --policy runs/policy --out runs/report
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::TableName;
use embodyflow_core::spec;
use polars::prelude::*;
use serde::Deserialize;

/// Command line of `report`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "report",
    version,
    about = "Step-credit analyses of advantage variants and teachers, as Markdown and PNG"
)]
pub struct Args {
    /// An advantages variant: NAME=DIR (a compute-advantages output).
    #[arg(long = "variant", value_name = "NAME=DIR", value_parser = named_dir)]
    pub variants: Vec<(String, PathBuf)>,
    /// A teacher: NAME=DIR (a teacher-logp output).
    #[arg(long = "teacher", value_name = "NAME=DIR", value_parser = named_dir)]
    pub teachers: Vec<(String, PathBuf)>,
    /// An RL run's success per iteration: NAME=FILE, a tab-separated
    /// `iteration, train_success, val_success` file with a header line
    /// (scripts/rl_loop's RUN/curve.tsv; `-` where a value is missing),
    /// drawn as `success.png`.
    #[arg(long = "curve", value_name = "NAME=FILE", value_parser = named_dir)]
    pub curves: Vec<(String, PathBuf)>,
    /// The policy's tokenizer.json, to draw each token's text in the
    /// heatmaps (token ids as #id without it or --policy).
    #[arg(long, value_name = "FILE", conflicts_with = "policy")]
    pub tokenizer: Option<PathBuf>,
    /// A policy checkpoint whose tokenizer.json decodes the heatmaps' tokens.
    #[arg(long, value_name = "CKPT")]
    pub policy: Option<PathBuf>,
    /// Directory for `step-credit.md` (`success.md` with only --curve) and
    /// the PNGs.
    #[arg(long)]
    pub out: PathBuf,
}

fn named_dir(text: &str) -> std::result::Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(format!("`{text}`: expected NAME=DIR")),
    }
}

/// Errors of the report tool.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A table failed the core's checks.
    #[error(transparent)]
    Core(#[from] embodyflow_core::Error),
    /// A polars query failed.
    #[error("query over {what}: {source}")]
    Query {
        /// What was queried.
        what: String,
        /// The polars error.
        source: PolarsError,
    },
    /// Inputs that do not fit together.
    #[error("{0}")]
    BadInput(String),
    /// Writing the report failed.
    #[error("writing {path}: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

impl embodyflow_core::Classify for ReportError {
    fn kind(&self) -> embodyflow_core::ErrorKind {
        match self {
            ReportError::Core(error) => error.kind(),
            ReportError::BadInput(_) => embodyflow_core::ErrorKind::BadInput,
            ReportError::Query { .. } | ReportError::Write { .. } => {
                embodyflow_core::ErrorKind::Failure
            }
        }
    }
}

type Result<T> = std::result::Result<T, ReportError>;

fn query<T>(what: &str, result: PolarsResult<T>) -> Result<T> {
    result.map_err(|source| ReportError::Query {
        what: what.to_string(),
        source,
    })
}

/// A validated table as a lazy scan over exactly the shards its manifest
/// lists (no globbing, no hive partitions: run directories such as
/// `adv@omega=0.5` are paths, not partition keys).
pub fn scan(dir: &Path, table: TableName) -> Result<(LazyFrame, TableReader)> {
    let reader = TableReader::open(dir, table)?;
    let paths = reader
        .manifest()
        .shards
        .iter()
        .map(|shard| PlRefPath::new(dir.join(&shard.file).to_string_lossy().into_owned()));
    let args = ScanArgsParquet {
        hive_options: HiveOptions::new_disabled(),
        glob: false,
        ..ScanArgsParquet::default()
    };
    let frame = query(
        &dir.display().to_string(),
        LazyFrame::scan_parquet_sources(ScanSources::Paths(paths.collect()), args),
    )?;
    Ok((frame, reader))
}

/// `frame` without the rows of episodes that infrastructure ended (a
/// crashed, hung or malformed environment worker): they are no outcome of
/// the policy. Rewards and trajectories mark them in `infra_fault`, eval
/// rows by a `failure_reason`; a table written before those columns has
/// none.
fn without_infra_faults(frame: LazyFrame, dir: &Path) -> Result<LazyFrame> {
    let mut frame = frame;
    let schema = query(&dir.display().to_string(), frame.collect_schema())?;
    Ok(if schema.contains("infra_fault") {
        frame.filter(col("infra_fault").fill_null(lit(false)).not())
    } else if schema.contains("failure_reason") {
        frame.filter(col("failure_reason").is_null())
    } else {
        frame
    })
}

/// Means of columns of a validated table (a boolean column's mean is its
/// share of true; nulls are left out), in one lazy pass over its shards.
/// Rows of episodes ended by infrastructure are left out
/// ([`without_infra_faults`]).
pub fn column_means(dir: &Path, table: TableName, names: &[&str]) -> Result<Vec<Option<f64>>> {
    let (frame, _) = scan(dir, table)?;
    let frame = without_infra_faults(frame, dir)?;
    let means = query(
        &dir.display().to_string(),
        frame
            .select(
                names
                    .iter()
                    .map(|name| col(*name).cast(DataType::Float64).mean())
                    .collect::<Vec<_>>(),
            )
            .collect(),
    )?;
    names
        .iter()
        .map(|name| {
            let column = query(name, means.column(name).and_then(|c| c.f64().cloned()))?;
            Ok(column.get(0))
        })
        .collect()
}

/// The groups of a rewards table whose scores are not all equal — the
/// groups a group-relative estimator (GRPO, Dr. GRPO) draws a gradient
/// from — and all its groups: `(with_signal, groups)`, one lazy pass.
/// Rows of episodes ended by infrastructure (`infra_fault`) are no outcome
/// and left out (a table written before the column has none).
pub fn groups_with_signal(dir: &Path) -> Result<(u64, u64)> {
    let (frame, _) = scan(dir, TableName::Rewards)?;
    let frame = without_infra_faults(frame, dir)?;
    let counts = query(
        &dir.display().to_string(),
        frame
            .group_by([col("group_id")])
            .agg([(col("score").max() - col("score").min())
                .gt(lit(0.0))
                .alias("signal")])
            .select([
                col("signal")
                    .cast(DataType::UInt64)
                    .sum()
                    .alias("with_signal"),
                col("signal").count().alias("groups"),
            ])
            .collect(),
    )?;
    let count = |name: &str| -> Result<u64> {
        let column = query(
            name,
            counts.column(name).and_then(|c| c.cast(&DataType::UInt64)),
        )?;
        let column = query(name, column.u64().cloned())?;
        Ok(column.get(0).unwrap_or(0))
    };
    Ok((count("with_signal")?, count("groups")?))
}

const EXPLODE: ExplodeOptions = ExplodeOptions {
    empty_as_null: false,
    keep_nulls: true,
};

/// The `table` an advantages table was computed from (its lineage: the
/// rewards, the steps), checked to hold the same content now, as a scan.
fn lineage(advantages: &TableReader, table: TableName) -> Result<(LazyFrame, TableReader)> {
    let input = advantages
        .manifest()
        .inputs
        .iter()
        .find(|i| i.table == table.as_str())
        .ok_or_else(|| {
            ReportError::BadInput(format!(
                "{}: its manifest names no {table} input",
                advantages.dir().display()
            ))
        })?;
    let (frame, read) = scan(&input.path, table)?;
    if read.manifest().content_hash != input.content_hash {
        return Err(ReportError::BadInput(format!(
            "{}: the {table} at {} changed since these advantages were computed (content hash {} vs {})",
            advantages.dir().display(),
            input.path.display(),
            read.manifest().content_hash,
            input.content_hash
        )));
    }
    Ok((frame, read))
}

/// Token-level figures of one variant, by trajectory outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreditFigures {
    /// Response tokens.
    pub tokens: u64,
    /// Tokens with a non-zero A^S.
    pub credited: u64,
    /// Sign-flip ratio over credited tokens: all, successful, failed.
    pub flip: [Option<f64>; 3],
    /// Sign-flip ratio over the credited tokens whose A^E is not 0 (a group
    /// whose rollouts all scored the same has A^E = 0, and any A^S "flips"
    /// its sign).
    pub flip_decided: Option<f64>,
    /// A^S on credited tokens of successful trajectories: count, mean, std.
    pub success: (u64, f64, f64),
    /// ... of failed trajectories.
    pub failure: (u64, f64, f64),
    /// A^S values of credited tokens (successful, failed), for the histogram.
    pub values: (Vec<f32>, Vec<f32>),
}

fn sign(e: Expr) -> Expr {
    e.clone().gt(lit(0.0f32)).cast(DataType::Int32) - e.lt(lit(0.0f32)).cast(DataType::Int32)
}

/// The credited tokens of an advantages scan joined with the rewards'
/// success: columns success, step_adv, flipped, decided (A^E != 0).
fn credited_tokens(advantages: LazyFrame, rewards: LazyFrame) -> LazyFrame {
    advantages
        .select([
            col("trajectory_id"),
            col("episode_adv"),
            col("advantages"),
            col("step_adv"),
        ])
        .filter(col("step_adv").is_not_null())
        .explode(cols(["advantages", "step_adv"]), EXPLODE)
        .filter(col("step_adv").neq(lit(0.0f32)))
        .inner_join(
            rewards.select([col("trajectory_id"), col("success")]),
            col("trajectory_id"),
            col("trajectory_id"),
        )
        .select([
            col("success"),
            col("step_adv"),
            sign(col("advantages"))
                .neq(sign(col("episode_adv")))
                .alias("flipped"),
            col("episode_adv").neq(lit(0.0f32)).alias("decided"),
        ])
}

/// Figures of one variant (see [`CreditFigures`]).
pub fn credit_figures(advantages: LazyFrame, rewards: LazyFrame) -> Result<CreditFigures> {
    let total = query(
        "response tokens",
        advantages
            .clone()
            .select([col("advantages").list().len().sum().alias("tokens")])
            .collect(),
    )?;
    let tokens = u64_at(&total, "tokens")?;
    let tokens_frame = query(
        "credited tokens",
        credited_tokens(advantages, rewards).collect(),
    )?;
    let by_outcome = query(
        "credited tokens by outcome",
        tokens_frame
            .clone()
            .lazy()
            .group_by([col("success")])
            .agg([
                len().cast(DataType::UInt64).alias("n"),
                col("flipped").cast(DataType::Float64).mean().alias("flip"),
                col("step_adv").cast(DataType::Float64).mean().alias("mean"),
                col("step_adv").cast(DataType::Float64).std(0).alias("std"),
            ])
            .collect(),
    )?;
    let mut figures = CreditFigures {
        tokens,
        credited: tokens_frame.height() as u64,
        ..CreditFigures::default()
    };
    let success = query(
        "success",
        by_outcome.column("success").and_then(|c| c.bool().cloned()),
    )?;
    let n = query("n", by_outcome.column("n").and_then(|c| c.u64().cloned()))?;
    let flip = query(
        "flip",
        by_outcome.column("flip").and_then(|c| c.f64().cloned()),
    )?;
    let mean = query(
        "mean",
        by_outcome.column("mean").and_then(|c| c.f64().cloned()),
    )?;
    let std = query(
        "std",
        by_outcome.column("std").and_then(|c| c.f64().cloned()),
    )?;
    let mut flipped_total = 0.0;
    for i in 0..by_outcome.height() {
        let count = n.get(i).unwrap_or(0);
        let entry = (count, mean.get(i).unwrap_or(0.0), std.get(i).unwrap_or(0.0));
        let ratio = flip.get(i);
        flipped_total += ratio.unwrap_or(0.0) * count as f64;
        if success.get(i) == Some(true) {
            figures.success = entry;
            figures.flip[1] = ratio;
        } else {
            figures.failure = entry;
            figures.flip[2] = ratio;
        }
    }
    if figures.credited > 0 {
        figures.flip[0] = Some(flipped_total / figures.credited as f64);
    }
    let decided = query(
        "credited tokens with A^E != 0",
        tokens_frame
            .clone()
            .lazy()
            .filter(col("decided"))
            .select([col("flipped").cast(DataType::Float64).mean().alias("flip")])
            .collect(),
    )?;
    figures.flip_decided = query(
        "flip",
        decided.column("flip").and_then(|c| c.f64().cloned()),
    )?
    .get(0);
    let values = query(
        "A^S",
        tokens_frame
            .column("step_adv")
            .and_then(|c| c.f32().cloned()),
    )?;
    let outcome = query(
        "success",
        tokens_frame
            .column("success")
            .and_then(|c| c.bool().cloned()),
    )?;
    let (values, outcome) = (values.rechunk(), outcome.rechunk());
    for i in 0..values.len() {
        let (Some(value), Some(won)) = (values.get(i), outcome.get(i)) else {
            continue;
        };
        if won {
            figures.values.0.push(value)
        } else {
            figures.values.1.push(value)
        }
    }
    Ok(figures)
}

/// One response of the per-token heatmap: its trajectory's success, its
/// token ids, the final advantage A of each token and, for grpo_step, its A^S.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatmapRow {
    /// The response's trajectory id and step, as the heatmap names it.
    pub label: String,
    /// Whether the trajectory reached its goal.
    pub success: bool,
    /// The response's token ids (the steps table's `response_ids`).
    pub response_ids: Vec<i32>,
    /// A per token.
    pub advantages: Vec<f32>,
    /// A^S per token (null for estimators without one).
    pub step_adv: Option<Vec<f32>>,
}

/// The first `limit` responses (by trajectory id, then step) of an advantages
/// scan, with their success (rewards) and token ids (steps), for the
/// per-token heatmap.
pub fn heatmap_rows(
    advantages: LazyFrame,
    rewards: LazyFrame,
    steps: LazyFrame,
    limit: u32,
) -> Result<Vec<HeatmapRow>> {
    let keys = [col("trajectory_id"), col("step_index")];
    let frame = query(
        "heatmap rows",
        advantages
            .select([
                col("trajectory_id"),
                col("step_index"),
                col("advantages"),
                col("step_adv"),
            ])
            .inner_join(
                rewards.select([col("trajectory_id"), col("success")]),
                col("trajectory_id"),
                col("trajectory_id"),
            )
            .sort(
                ["trajectory_id", "step_index"],
                SortMultipleOptions::default(),
            )
            .limit(limit)
            .join(
                steps.select([col("trajectory_id"), col("step_index"), col("response_ids")]),
                keys.clone(),
                keys,
                JoinArgs::new(JoinType::Inner),
            )
            .sort(
                ["trajectory_id", "step_index"],
                SortMultipleOptions::default(),
            )
            .collect(),
    )?;
    let response_ids = query(
        "response_ids",
        frame.column("response_ids").and_then(|c| c.list().cloned()),
    )?;
    let response_ids = (0..response_ids.len())
        .map(|i| match response_ids.get_as_series(i) {
            Some(series) => query("response_ids", series.i32().cloned())
                .map(|ids| (0..ids.len()).map(|j| ids.get(j).unwrap_or(-1)).collect()),
            None => Ok(Vec::new()),
        })
        .collect::<Result<Vec<Vec<i32>>>>()?;
    let success = query(
        "success",
        frame.column("success").and_then(|c| c.bool().cloned()),
    )?;
    let list_at = |name: &str| -> Result<Vec<Option<Vec<f32>>>> {
        let column = query(name, frame.column(name).and_then(|c| c.list().cloned()))?;
        (0..column.len())
            .map(|i| {
                column
                    .get_as_series(i)
                    .map(|series| {
                        query(name, series.f32().cloned()).map(|values| {
                            (0..values.len())
                                .map(|j| values.get(j).unwrap_or(0.0))
                                .collect()
                        })
                    })
                    .transpose()
            })
            .collect()
    };
    let advantages = list_at("advantages")?;
    let step_adv = list_at("step_adv")?;
    let ids = query(
        "trajectory_id",
        frame.column("trajectory_id").and_then(|c| c.str().cloned()),
    )?;
    let steps = query(
        "step_index",
        frame
            .column("step_index")
            .and_then(|c| c.cast(&DataType::Int64))
            .and_then(|c| c.i64().cloned()),
    )?;
    Ok(advantages
        .into_iter()
        .zip(step_adv)
        .zip(response_ids)
        .enumerate()
        .map(|(i, ((advantages, step_adv), response_ids))| HeatmapRow {
            label: format!(
                "{} s{}",
                ids.get(i).unwrap_or("?"),
                steps.get(i).unwrap_or(0)
            ),
            success: success.get(i).unwrap_or(false),
            response_ids,
            advantages: advantages.unwrap_or_default(),
            step_adv,
        })
        .collect())
}

/// Per-token heatmap, one band per response (named at the left by
/// trajectory id and step, with a strip green for a successful trajectory,
/// grey for a failed one), its tokens left to right ([`TOKEN_CELL`] pixels
/// each, positions numbered on the axis below): the band's token strip holds
/// each token's text read bottom to top (decoded by `tokenizer`, `#id`
/// without one), under it a row of A (scaled to the largest |A| of the
/// picture) and a row of A^S (scaled to 1); a colour bar for each at the
/// right.
///
/// [`TOKEN_CELL`]: embodyflow_plots::TOKEN_CELL
pub fn heatmap_png(
    path: &Path,
    rows: &[HeatmapRow],
    tokenizer: Option<&tokenizers::Tokenizer>,
) -> Result<()> {
    use embodyflow_plots::{
        TOKEN_CELL, TOKEN_STRIP, canvas, colour_bar, diverging, swatch, text, token_axis,
        token_strip, token_texts,
    };
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    const CELL: i32 = TOKEN_CELL;
    const ROW: i32 = 14;
    const STRIP: i32 = 8;
    const LEFT: i32 = 190;
    const TOP: i32 = 76;
    const BARS: i32 = 220;
    let longest = rows.iter().map(|r| r.advantages.len()).max().unwrap_or(0);
    let scale = rows
        .iter()
        .flat_map(|r| r.advantages.iter())
        .fold(0.0f32, |m, v| m.max(v.abs()));
    let band = TOKEN_STRIP + 2 * ROW + 10;
    let body = rows.len().max(1) as i32 * band;
    let width = (LEFT + longest.max(40) as i32 * CELL + BARS).max(640) as u32;
    let height = (TOP + body.max(260) + 60) as u32;
    let draw = || -> std::result::Result<(), embodyflow_plots::PlotError> {
        let root = canvas(path, (width, height))?;
        root.draw(&Text::new(
            format!("Per-token advantages of the first {} responses", rows.len()),
            (width as i32 / 2, 8),
            text(18).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
        let key = [
            (RGBColor(40, 160, 60), "successful trajectory"),
            (RGBColor(150, 150, 150), "failed trajectory"),
        ];
        for (k, (colour, name)) in key.into_iter().enumerate() {
            let x = 10 + k as i32 * 190;
            root.draw(&swatch(colour)((x, 40)))?;
            root.draw(&Text::new(
                name,
                (x + 16, 40),
                text(12).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        let step_zero = rows
            .iter()
            .flat_map(|r| r.step_adv.iter().flatten())
            .all(|&v| v == 0.0);
        let tokens = if tokenizer.is_some() {
            "token text (read bottom to top)"
        } else {
            "token ids (#id: no --tokenizer or --policy given)"
        };
        root.draw(&Text::new(
            format!(
                "per response: {tokens}, then rows A (upper) and A^S (lower){}",
                if scale == 0.0 && step_zero {
                    "; every A and A^S is 0"
                } else {
                    ""
                }
            ),
            (10, 58),
            text(12).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        for (i, row) in rows.iter().enumerate() {
            let top = TOP + i as i32 * band;
            let cells = top + TOKEN_STRIP;
            let outcome = if row.success { key[0].0 } else { key[1].0 };
            // Ids share their prefix: the end tells responses apart.
            let chars: Vec<char> = row.label.chars().collect();
            let label: String = if chars.len() > 26 {
                std::iter::once('…')
                    .chain(chars[chars.len() - 25..].iter().copied())
                    .collect()
            } else {
                row.label.clone()
            };
            root.draw(&Text::new(
                label,
                (LEFT - STRIP - 40, cells + ROW),
                text(11).pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
            let texts = token_texts(&row.response_ids, tokenizer);
            token_strip(&root, (LEFT, cells - 3), CELL, &texts)?;
            root.draw(&Text::new(
                "text",
                (LEFT - STRIP - 32, cells - 3),
                text(10).pos(Pos::new(HPos::Left, VPos::Bottom)),
            ))?;
            for (line, name) in ["A", "A^S"].into_iter().enumerate() {
                root.draw(&Text::new(
                    name,
                    (LEFT - STRIP - 32, cells + line as i32 * ROW + ROW / 2),
                    text(10).pos(Pos::new(HPos::Left, VPos::Center)),
                ))?;
            }
            root.draw(&Rectangle::new(
                [(LEFT - STRIP - 4, cells), (LEFT - 4, cells + 2 * ROW)],
                outcome.filled(),
            ))?;
            let lines = [(Some(&row.advantages), scale), (row.step_adv.as_ref(), 1.0)];
            for (line, (values, line_scale)) in lines.into_iter().enumerate() {
                let Some(values) = values else { continue };
                let y = cells + line as i32 * ROW;
                for (t, &value) in values.iter().enumerate() {
                    let x = LEFT + t as i32 * CELL;
                    root.draw(&Rectangle::new(
                        [(x, y), (x + CELL, y + ROW)],
                        diverging(f64::from(value), f64::from(line_scale)).filled(),
                    ))?;
                }
            }
        }
        token_axis(&root, (LEFT, TOP + body + 2), CELL, longest)?;
        let bars_x = LEFT + longest.max(40) as i32 * CELL + 10;
        let bar_h = body.clamp(260, 480) as u32;
        let a_bar = root
            .clone()
            .shrink((bars_x as u32, TOP as u32), (100, bar_h));
        colour_bar(&a_bar, f64::from(scale), "A (advantage units)")?;
        let s_bar = root
            .clone()
            .shrink((bars_x as u32 + 105, TOP as u32), (100, bar_h));
        colour_bar(&s_bar, 1.0, "A^S (advantage units)")?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| ReportError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn u64_at(frame: &DataFrame, name: &str) -> Result<u64> {
    let column = query(
        name,
        frame.column(name).and_then(|c| c.cast(&DataType::UInt64)),
    )?;
    Ok(query(name, column.u64().cloned())?.get(0).unwrap_or(0))
}

/// Contrast figures of one teacher-logp table.
#[derive(Debug, Clone, PartialEq)]
pub struct ContrastFigures {
    /// Steps (rows).
    pub steps: u64,
    /// Tokens.
    pub tokens: u64,
    /// Per-token contrast: mean, std, min, max.
    pub token: [f64; 4],
    /// Standard deviation of the per-step mean contrast.
    pub step_mean_std: f64,
}

/// The teacher-student contrast of a teacher_logp scan.
pub fn contrast_figures(teacher: LazyFrame) -> Result<ContrastFigures> {
    let per_token = teacher
        .clone()
        .select([
            col("trajectory_id"),
            col("step_index"),
            col("teacher_logp"),
            col("student_logp"),
        ])
        .explode(cols(["teacher_logp", "student_logp"]), EXPLODE)
        .select([
            col("trajectory_id"),
            col("step_index"),
            (col("teacher_logp").cast(DataType::Float64)
                - col("student_logp").cast(DataType::Float64))
            .alias("d"),
        ]);
    let token = query(
        "contrast per token",
        per_token
            .clone()
            .select([
                len().cast(DataType::UInt64).alias("n"),
                col("d").mean().alias("mean"),
                col("d").std(0).alias("std"),
                col("d").min().alias("min"),
                col("d").max().alias("max"),
            ])
            .collect(),
    )?;
    let per_step = query(
        "contrast per step",
        per_token
            .group_by([col("trajectory_id"), col("step_index")])
            .agg([col("d").mean().alias("step_mean")])
            .select([
                len().cast(DataType::UInt64).alias("steps"),
                col("step_mean").std(0).alias("spread"),
            ])
            .collect(),
    )?;
    let f = |frame: &DataFrame, name: &str| -> Result<f64> {
        let column = query(
            name,
            frame.column(name).and_then(|c| c.cast(&DataType::Float64)),
        )?;
        Ok(query(name, column.f64().cloned())?
            .get(0)
            .unwrap_or(f64::NAN))
    };
    Ok(ContrastFigures {
        steps: u64_at(&per_step, "steps")?,
        tokens: u64_at(&token, "n")?,
        token: [
            f(&token, "mean")?,
            f(&token, "std")?,
            f(&token, "min")?,
            f(&token, "max")?,
        ],
        step_mean_std: f(&per_step, "spread")?,
    })
}

pub use embodyflow_core::diagnostics::{FlipPart, StepPart, VariantDiagnostics};

fn ratio(part: FlipPart) -> String {
    if part.tokens == 0 {
        "-".into()
    } else {
        format!("{:.3}", part.flipped as f64 / part.tokens as f64)
    }
}

fn opt(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The compute-advantages settings a variant shows, read typed from its
/// advantages manifest ([`spec::StageSpec::config_of`]).
#[derive(Debug, Deserialize)]
struct AdvantagesSettings {
    estimator: String,
    stepopsd: StepOpsdSettings,
    step: StepSettings,
}

#[derive(Debug, Deserialize)]
struct StepOpsdSettings {
    enabled: bool,
}

#[derive(Debug, Deserialize)]
struct StepSettings {
    kind: String,
    credit_target: String,
    score_source: String,
    omega: f32,
    gate: String,
}

/// The score-rewards settings a variant shows.
#[derive(Debug, Deserialize)]
struct RewardsSettings {
    #[serde(rename = "match")]
    matching: MatchSettings,
}

#[derive(Debug, Deserialize)]
struct MatchSettings {
    mode: String,
}

/// The settings a variant was computed with, from the manifests of its
/// advantages (estimator, step kind, credit target, score source, omega, gate)
/// and of its rewards (the rule match mode).
fn variant_settings(advantages: &TableReader, rewards: &TableReader) -> Result<String> {
    let settings: AdvantagesSettings =
        spec::COMPUTE_ADVANTAGES.config_of(advantages.manifest(), advantages.dir())?;
    let mut estimator = settings.estimator;
    if settings.stepopsd.enabled {
        // Sign-preserving reweighting of A: no A^S, no flips by construction.
        estimator.push_str(" + StepOPSD reweighting");
    }
    if !estimator.starts_with("grpo_step") {
        return Ok(estimator);
    }
    let rewards: RewardsSettings =
        spec::SCORE_REWARDS.config_of(rewards.manifest(), rewards.dir())?;
    let step = settings.step;
    Ok(format!(
        "grpo_step {} (match {}, credit {}, score {}, omega {:?}, gate {})",
        step.kind,
        rewards.matching.mode,
        step.credit_target,
        step.score_source,
        step.omega,
        step.gate,
    ))
}

/// Histograms of A^S on credited tokens in [-1, 1] (40 bins, values
/// outside clamped to the end bins): successful trajectories in blue, failed
/// in red side by side in each bin, each as the percentage of its own tokens
/// so groups of different sizes compare; the legend gives each group's count.
pub fn histogram_png(path: &Path, values: &(Vec<f32>, Vec<f32>)) -> Result<()> {
    use embodyflow_plots::{Frame, PALETTE, canvas, legend, swatch, text};
    use plotters::prelude::*;
    const BINS: usize = 40;
    let shares = |v: &[f32]| {
        let mut bins = [0u64; BINS];
        for &x in v {
            let i = (((x.clamp(-1.0, 1.0) + 1.0) / 2.0) * BINS as f32) as usize;
            bins[i.min(BINS - 1)] += 1;
        }
        bins.map(|c| 100.0 * c as f64 / v.len().max(1) as f64)
    };
    let groups = [
        (
            shares(&values.0),
            PALETTE[0],
            "successful",
            values.0.len(),
            0.0,
        ),
        (shares(&values.1), PALETTE[1], "failed", values.1.len(), 0.5),
    ];
    let top = groups
        .iter()
        .flat_map(|g| g.0.iter().copied())
        .fold(10.0, f64::max)
        * 1.1;
    let draw = || -> std::result::Result<(), embodyflow_plots::PlotError> {
        let root = canvas(path, (640, 400))?;
        let mut chart = Frame::new(
            "A^S on credited tokens",
            "A^S (advantage units)",
            "share of the group's credited tokens (%)",
        )
        .ranges(-1.0..1.0, 0.0..top)
        .draw(&root)?;
        let width = 2.0 / BINS as f64;
        for (bins, colour, name, n, offset) in &groups {
            chart
                .draw_series(bins.iter().enumerate().filter(|(_, s)| **s > 0.0).map(
                    |(i, &share)| {
                        let x = -1.0 + (i as f64 + offset) * width;
                        Rectangle::new([(x, 0.0), (x + width / 2.0, share)], colour.filled())
                    },
                ))?
                .label(format!("{name} trajectories ({n} tokens)"))
                .legend(swatch(*colour));
        }
        chart.draw_series(LineSeries::new(vec![(0.0, 0.0), (0.0, top)], BLACK))?;
        if values.0.is_empty() && values.1.is_empty() {
            chart.draw_series(std::iter::once(Text::new(
                "no credited tokens (A^S = 0 everywhere)",
                (-0.6, top * 0.5),
                text(16),
            )))?;
        }
        legend(&mut chart)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| ReportError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Builds the report's Markdown (and writes the PNGs into `out`); the
/// heatmaps decode their tokens with `tokenizer` (`#id` without one).
pub fn build_report(
    variants: &[(String, PathBuf)],
    teachers: &[(String, PathBuf)],
    tokenizer: Option<&tokenizers::Tokenizer>,
    out: &Path,
) -> Result<String> {
    let mut md = String::from("# Step-credit report\n\n");
    if !variants.is_empty() {
        md.push_str("## Advantage variants\n\nCredited tokens have a non-zero A^S; a flip is sign(A) != sign(A^E) on one (in a group whose rollouts all scored the same, A^E = 0 and every credited token counts as flipped; \"flip A^E != 0\" leaves those groups out). Rule-correct / rule-wrong flips and the AUC of A^S between rule-correct and rule-wrong steps come from each variant's diagnostics.json.\n\n");
        md.push_str("| variant | settings | credited / tokens | flip all | flip A^E != 0 | flip success | flip failure | flip rule-correct | flip rule-wrong | A^S success (mean ± std) | A^S failure (mean ± std) | AUC correct vs wrong | histogram | heatmap |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    let mut seen = BTreeMap::new();
    for (name, dir) in variants {
        if seen.insert(name.clone(), ()).is_some() {
            return Err(ReportError::BadInput(format!(
                "variant `{name}` is named twice"
            )));
        }
        let (advantages, reader) = scan(&dir.join("advantages"), TableName::Advantages)?;
        let (rewards, rewards_reader) = lineage(&reader, TableName::Rewards)?;
        let (steps, _) = lineage(&reader, TableName::Steps)?;
        let figures = credit_figures(advantages.clone(), rewards.clone())?;
        let heatmap = format!("heatmap_{}.png", sanitize(name));
        heatmap_png(
            &out.join(&heatmap),
            &heatmap_rows(advantages, rewards, steps, HEATMAP_RESPONSES)?,
            tokenizer,
        )?;
        let diagnostics = VariantDiagnostics::read(dir)?.unwrap_or_default();
        let step = diagnostics.step.unwrap_or_default();
        let png = format!("step_adv_{}.png", sanitize(name));
        histogram_png(&out.join(&png), &figures.values)?;
        let _ = writeln!(
            md,
            "| {name} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {:.3} ± {:.3} ({}) | {:.3} ± {:.3} ({}) | {} | [png]({png}) | [png]({heatmap}) |",
            variant_settings(&reader, &rewards_reader)?,
            figures.credited,
            figures.tokens,
            opt(figures.flip[0]),
            opt(figures.flip_decided),
            opt(figures.flip[1]),
            opt(figures.flip[2]),
            ratio(step.sign_flips_rule_correct),
            ratio(step.sign_flips_rule_wrong),
            figures.success.1,
            figures.success.2,
            figures.success.0,
            figures.failure.1,
            figures.failure.2,
            figures.failure.0,
            opt(step.step_adv_auc),
        );
    }
    if !teachers.is_empty() {
        md.push_str("\n## Teachers: contrast d = teacher_logp - student_logp\n\n| teacher | steps | tokens | mean | std | min | max | std of per-step mean |\n|---|---|---|---|---|---|---|---|\n");
    }
    for (name, dir) in teachers {
        let (teacher, _) = scan(&dir.join("teacher_logp"), TableName::TeacherLogp)?;
        let c = contrast_figures(teacher)?;
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {:.3} | {:.3} | {:.2} | {:.2} | {:.3} |",
            c.steps, c.tokens, c.token[0], c.token[1], c.token[2], c.token[3], c.step_mean_std
        );
    }
    Ok(md)
}

/// One RL run's success per iteration: train success of the sampled
/// rollouts and, where evaluated, greedy val success.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Curve {
    /// (iteration, train success).
    pub train: Vec<(f64, f64)>,
    /// (iteration, val success), the evaluated iterations only.
    pub val: Vec<(f64, f64)>,
}

/// Reads a curve file (see [`Args::curves`]): a header line, then
/// `iteration<TAB>train<TAB>val` rows, `-` for a missing value. A row
/// that is not three fields, an iteration that is not an integer, or a
/// success outside [0, 1] is an error naming the file and line.
pub fn read_curve(path: &Path) -> Result<Curve> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ReportError::BadInput(format!("curve {}: {e}", path.display())))?;
    let mut curve = Curve::default();
    for (n, line) in text.lines().enumerate().skip(1) {
        let bad = |what: &str| {
            ReportError::BadInput(format!(
                "curve {} line {}: {what}: `{line}`",
                path.display(),
                n + 1
            ))
        };
        let fields: Vec<&str> = line.split('\t').collect();
        let [iteration, train, val] = fields[..] else {
            return Err(bad("expected iteration, train_success, val_success"));
        };
        let iteration: u32 = iteration
            .parse()
            .map_err(|_| bad("the iteration is not a whole number"))?;
        for (value, series) in [(train, &mut curve.train), (val, &mut curve.val)] {
            if value == "-" {
                continue;
            }
            let success: f64 = value
                .parse()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .ok_or_else(|| bad("a success is `-` or a number in [0, 1]"))?;
            series.push((f64::from(iteration), success));
        }
    }
    Ok(curve)
}

/// The curves' table and `success.png` in `out` (per curve a train line
/// and a val line, each drawn where it has points), as Markdown under a
/// heading the caller writes.
pub fn curves_report(curves: &[(String, PathBuf)], out: &Path) -> Result<String> {
    let mut series = Vec::new();
    let mut iterations = 0.0_f64;
    let mut md = String::from(
        "| run | iterations | first train success | last train success | last val success |\n|---|---|---|---|---|\n",
    );
    for (name, path) in curves {
        let curve = read_curve(path)?;
        let last = |points: &[(f64, f64)]| points.last().map(|p| p.1);
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            curve.train.len(),
            opt(curve.train.first().map(|p| p.1)),
            opt(last(&curve.train)),
            opt(last(&curve.val)),
        );
        iterations = curve
            .train
            .iter()
            .chain(&curve.val)
            .map(|p| p.0 + 1.0)
            .fold(iterations, f64::max);
        series.push((format!("{name}: train (sampled rollouts)"), curve.train));
        series.push((format!("{name}: val (greedy)"), curve.val));
    }
    series.retain(|(_, points)| !points.is_empty());
    let path = out.join("success.png");
    let title = match curves {
        [(name, _)] => format!("Success per iteration: {name}"),
        _ => format!("Success per iteration: {} runs", curves.len()),
    };
    embodyflow_plots::success_curves(&path, &title, &series, iterations).map_err(|e| {
        ReportError::Write {
            path: path.clone(),
            reason: e.to_string(),
        }
    })?;
    let _ = writeln!(
        md,
        "\n![success per iteration](success.png): x = iteration 0…{}, y = success 0…1; {}.",
        (iterations - 1.0).max(0.0),
        embodyflow_plots::colour_key(&series)
    );
    Ok(md)
}

/// Responses drawn in each variant's heatmap (each with its token text, at
/// 12 pixels a token).
const HEATMAP_RESPONSES: u32 = 8;

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Runs the tool: writes `out/step-credit.md` (`out/success.md` when only
/// curves are given) and the PNGs, all or nothing, and prints the Markdown.
pub fn run(args: Args) -> Result<()> {
    if args.variants.is_empty() && args.teachers.is_empty() && args.curves.is_empty() {
        return Err(ReportError::BadInput(
            "nothing to report: give --variant NAME=DIR, --teacher NAME=DIR and/or --curve NAME=FILE"
                .into(),
        ));
    }
    let tokenizer = match (&args.tokenizer, &args.policy) {
        (Some(file), _) => Some(file.clone()),
        (None, Some(policy)) => Some(policy.join("tokenizer.json")),
        (None, None) => None,
    }
    .map(|path| {
        tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ReportError::BadInput(format!("tokenizer {}: {e}", path.display())))
    })
    .transpose()?;
    let write_err = |path: &Path, e: std::io::Error| ReportError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(&args.out).map_err(|e| write_err(&args.out, e))?;
    // Everything is drawn into a staging directory and moved into `out`
    // only once all of it was written: bad input found after the first
    // PNG leaves nothing behind.
    let staging = args.out.join(".report.writing");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| write_err(&staging, e))?;
    }
    std::fs::create_dir(&staging).map_err(|e| write_err(&staging, e))?;
    let written = write_files(&args, tokenizer.as_ref(), &staging);
    let moved = written.and_then(|md| {
        for entry in std::fs::read_dir(&staging).map_err(|e| write_err(&staging, e))? {
            let from = entry.map_err(|e| write_err(&staging, e))?.path();
            let to = args
                .out
                .join(from.file_name().expect("a directory entry has a name"));
            std::fs::rename(&from, &to).map_err(|e| write_err(&to, e))?;
        }
        Ok(md)
    });
    let _ = std::fs::remove_dir_all(&staging);
    print!("{}", moved?);
    Ok(())
}

/// Writes the Markdown (`step-credit.md`, or `success.md` with only
/// curves) and the PNGs into `dir`; returns the Markdown.
fn write_files(
    args: &Args,
    tokenizer: Option<&tokenizers::Tokenizer>,
    dir: &Path,
) -> Result<String> {
    let step_credit = !args.variants.is_empty() || !args.teachers.is_empty();
    let mut md = if step_credit {
        build_report(&args.variants, &args.teachers, tokenizer, dir)?
    } else {
        String::new()
    };
    if !args.curves.is_empty() {
        md.push_str(if step_credit {
            "\n## Success per iteration\n\n"
        } else {
            "# Success per iteration\n\n"
        });
        md.push_str(&curves_report(&args.curves, dir)?);
    }
    let name = if step_credit {
        "step-credit.md"
    } else {
        "success.md"
    };
    let path = dir.join(name);
    std::fs::write(&path, &md).map_err(|e| ReportError::Write {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::dataset::{TableWriter, WriteOptions};
    use embodyflow_core::manifest::Producer;
    use embodyflow_core::schemas::{AdvantageRow, RewardRow, StepRow, TeacherLogpRow};

    fn producer(stage: &str, config: serde_json::Value) -> Producer {
        Producer {
            stage: stage.into(),
            version: "test".into(),
            config,
            seed: 0,
            shard: "0/1".into(),
        }
    }

    fn reward(id: &str, success: bool) -> RewardRow {
        RewardRow {
            infra_fault: None,
            trajectory_id: id.into(),
            group_id: "g".into(),
            score: if success { 1.0 } else { -1.0 },
            format: 1.0,
            accuracy: if success { 1.0 } else { -1.0 },
            success,
            parse_ok: true,
            pred_actions: None,
            step_match: None,
            step_valid: None,
            reward_fn: "verify".into(),
            ever_grasped: None,
            token_rewards: None,
        }
    }

    fn write_rewards(root: &Path, rows: &[RewardRow], overwrite: bool) -> TableReader {
        let mut writer = TableWriter::create(
            &root.join("rewards"),
            TableName::Rewards,
            WriteOptions::default(),
            overwrite,
        )
        .unwrap();
        writer.write_rows(rows).unwrap();
        writer
            .finish(
                &producer(
                    "score-rewards",
                    serde_json::json!({"match": {"mode": "prefix"}}),
                ),
                &[],
            )
            .unwrap();
        TableReader::open(&root.join("rewards/rewards"), TableName::Rewards).unwrap()
    }

    /// Two successful and two failed trajectories, one step each; A^E = +1 /
    /// -1 and A = A^E + A^S on every token.
    fn advantage_rows() -> Vec<AdvantageRow> {
        let row = |id: &str, episode: f32, step: Vec<f32>| AdvantageRow {
            trajectory_id: id.into(),
            step_index: 0,
            advantages: step.iter().map(|s| episode + s).collect(),
            returns: None,
            episode_adv: episode,
            step_adv: Some(step),
            estimator: "grpo_step".into(),
        };
        vec![
            // Success: one credited token flips (1 - 1.5 < 0), one does not.
            row("a", 1.0, vec![0.0, 0.5, -1.5]),
            row("b", 1.0, vec![0.0, 0.0, 0.5]),
            // Failure: one credited token flips (-1 + 2 > 0).
            row("c", -1.0, vec![2.0, 0.0, 0.0]),
            row("d", -1.0, vec![0.0, -0.5, 0.0]),
            // A group that scored the same throughout: A^E = 0, the credited
            // token counts as flipped in "all" but not among A^E != 0.
            row("e", 0.0, vec![0.0, 0.0, 0.5]),
        ]
    }

    /// The steps of [`advantage_rows`]: three response tokens each, ids
    /// 10 * k + t for the k-th trajectory.
    fn write_steps(root: &Path) -> TableReader {
        let mut writer = TableWriter::create(
            &root.join("rollouts"),
            TableName::Steps,
            WriteOptions::default(),
            false,
        )
        .unwrap();
        let rows: Vec<StepRow> = ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(k, id)| {
                let ids = (0..3).map(|t| 10 * k as i32 + t).collect();
                StepRow::one_shot(id.to_string(), vec![1, 2], ids, vec![-0.5; 3])
            })
            .collect();
        writer.write_rows(&rows).unwrap();
        writer
            .finish(&producer("collect-rollouts", serde_json::json!({})), &[])
            .unwrap();
        TableReader::open(&root.join("rollouts/steps"), TableName::Steps).unwrap()
    }

    fn write_variant(root: &Path, rewards: &TableReader) -> PathBuf {
        let steps = write_steps(root);
        let dir = root.join("adv");
        let mut writer =
            TableWriter::create(&dir, TableName::Advantages, WriteOptions::default(), false)
                .unwrap();
        writer.write_rows(&advantage_rows()).unwrap();
        let config = serde_json::json!({
            "estimator": "grpo_step",
            "step": {"kind": "rule", "credit_target": "action_id", "score_source": "action_name",
                     "omega": 1.0, "gate": "none"},
            "stepopsd": {"enabled": false}
        });
        writer
            .finish(
                &producer("compute-advantages", config),
                &[rewards.input_ref(), steps.input_ref()],
            )
            .unwrap();
        dir
    }

    #[test]
    fn bad_input_found_after_a_png_leaves_nothing_written() {
        let root = tempfile::tempdir().unwrap();
        let rewards = write_rewards(root.path(), &[reward("a", true), reward("b", false)], false);
        let variant = write_variant(root.path(), &rewards);
        let out = root.path().join("report");
        // The first variant draws its PNGs; the second, named the same, is
        // bad input.
        let args = Args {
            variants: vec![("v".into(), variant.clone()), ("v".into(), variant)],
            teachers: Vec::new(),
            curves: Vec::new(),
            tokenizer: None,
            policy: None,
            out: out.clone(),
        };
        let err = run(args).unwrap_err();
        assert_eq!(
            embodyflow_core::Classify::kind(&err),
            embodyflow_core::ErrorKind::BadInput,
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "written before the bad input: {left:?}");
    }

    #[test]
    fn credit_figures_count_flips_and_split_a_s_by_outcome() {
        let root = tempfile::tempdir().unwrap();
        let rewards = write_rewards(
            root.path(),
            &[
                reward("a", true),
                reward("b", true),
                reward("c", false),
                reward("d", false),
                reward("e", false),
            ],
            false,
        );
        let variant = write_variant(root.path(), &rewards);
        let (advantages, _) = scan(&variant.join("advantages"), TableName::Advantages).unwrap();
        let (rewards_scan, _) = scan(rewards.dir(), TableName::Rewards).unwrap();
        let figures = credit_figures(advantages.clone(), rewards_scan.clone()).unwrap();
        assert_eq!(figures.tokens, 15);
        assert_eq!(figures.credited, 6);
        assert_eq!(figures.flip[0], Some(3.0 / 6.0));
        assert_eq!(figures.flip_decided, Some(2.0 / 5.0));
        assert_eq!(figures.flip[1], Some(1.0 / 3.0));
        assert!((figures.flip[2].unwrap() - 2.0 / 3.0).abs() < 1e-12);
        // Successful A^S: 0.5, -1.5, 0.5 -> mean -1/6; failed: 2.0, -0.5, 0.5 -> 2/3.
        assert_eq!(figures.success.0, 3);
        assert!((figures.success.1 + 1.0 / 6.0).abs() < 1e-9);
        assert_eq!(figures.failure.0, 3);
        assert!((figures.failure.1 - 2.0 / 3.0).abs() < 1e-9);
        let mut won = figures.values.0.clone();
        won.sort_by(f32::total_cmp);
        assert_eq!(won, vec![-1.5, 0.5, 0.5]);

        let (steps_scan, _) = scan(&root.path().join("rollouts/steps"), TableName::Steps).unwrap();
        let rows = heatmap_rows(advantages, rewards_scan, steps_scan, 3).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].advantages, vec![1.0, 1.5, -0.5]);
        assert_eq!(rows[0].response_ids, vec![0, 1, 2]);
        assert_eq!(rows[2].response_ids, vec![20, 21, 22]);
        assert!(rows[0].success && rows[1].success && !rows[2].success);
        assert_eq!(rows[2].step_adv, Some(vec![2.0, 0.0, 0.0]));

        let out = root.path().join("report");
        std::fs::create_dir_all(&out).unwrap();
        let md = build_report(&[("rule".into(), variant)], &[], None, &out).unwrap();
        assert!(
            md.contains("grpo_step rule (match prefix, credit action_id, score action_name, omega 1.0, gate none)"),
            "{md}"
        );
        assert!(
            md.contains("| 6 / 15 | 0.500 | 0.400 | 0.333 | 0.667 |"),
            "{md}"
        );
        assert!(out.join("step_adv_rule.png").is_file());
        assert!(out.join("heatmap_rule.png").is_file());
    }

    #[test]
    fn column_means_of_bool_and_float_columns() {
        let root = tempfile::tempdir().unwrap();
        let rewards = write_rewards(
            root.path(),
            &[
                reward("a", true),
                reward("b", false),
                reward("c", false),
                reward("d", false),
            ],
            false,
        );
        let means = column_means(rewards.dir(), TableName::Rewards, &["success", "score"]).unwrap();
        assert_eq!(means, vec![Some(0.25), Some(-0.5)]);
    }

    #[test]
    fn column_means_leave_out_episodes_ended_by_infrastructure() {
        let root = tempfile::tempdir().unwrap();
        let faulted = RewardRow {
            infra_fault: Some(true),
            ..reward("e", false)
        };
        let rewards = write_rewards(
            root.path(),
            &[reward("a", true), reward("b", false), faulted],
            false,
        );
        let means = column_means(rewards.dir(), TableName::Rewards, &["success", "score"]).unwrap();
        assert_eq!(means, vec![Some(0.5), Some(0.0)]);
    }

    #[test]
    fn a_curve_is_read_with_its_missing_values_and_drawn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curve.tsv");
        std::fs::write(
            &path,
            "iteration\ttrain_success\tval_success\n0\t0.250\t-\n1\t0.5\t0.400\n",
        )
        .unwrap();
        let curve = read_curve(&path).unwrap();
        assert_eq!(curve.train, [(0.0, 0.25), (1.0, 0.5)]);
        assert_eq!(curve.val, [(1.0, 0.4)]);
        let out = embodyflow_plots::test_dir(dir.path());
        let md = curves_report(&[("grpo".into(), path.clone())], &out).unwrap();
        assert!(md.contains("| grpo | 2 | 0.250 | 0.500 | 0.400 |"), "{md}");
        assert!(
            md.contains("blue = grpo: train (sampled rollouts), red = grpo: val (greedy)"),
            "{md}"
        );
        let png = embodyflow_plots::Png::read(&out.join("success.png")).unwrap();
        assert!(png.dark_in(200..440, 0..30) > 50, "no title");
        for (text, why) in [
            ("h\n0\t0.5\n", "expected iteration"),
            ("h\nzero\t0.5\t-\n", "not a whole number"),
            ("h\n0\t1.5\t-\n", "in [0, 1]"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read_curve(&path).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("line 2"), "{err}");
        }
    }

    #[test]
    fn groups_with_signal_are_those_whose_scores_differ() {
        let root = tempfile::tempdir().unwrap();
        let in_group = |id: &str, group: &str, score: f32| RewardRow {
            infra_fault: None,
            group_id: group.into(),
            score,
            ..reward(id, score > 0.0)
        };
        let rewards = write_rewards(
            root.path(),
            &[
                in_group("a", "all-fail", -1.0),
                in_group("b", "all-fail", -1.0),
                in_group("c", "mixed", -1.0),
                in_group("d", "mixed", 1.0),
                in_group("e", "partial", 0.5),
                in_group("f", "partial", 0.5),
                in_group("g", "partial", 0.7),
                in_group("h", "alone", 1.0),
                // A fault is no outcome: "faulted" has one score, no signal.
                in_group("i", "faulted", 1.0),
                RewardRow {
                    infra_fault: Some(true),
                    ..in_group("j", "faulted", -1.0)
                },
            ],
            false,
        );
        assert_eq!(groups_with_signal(rewards.dir()).unwrap(), (2, 5));
    }

    #[test]
    fn rewards_changed_since_the_advantages_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let rewards = write_rewards(root.path(), &[reward("a", true), reward("c", false)], false);
        let variant = write_variant(root.path(), &rewards);
        write_rewards(root.path(), &[reward("a", false), reward("c", false)], true);
        let out = root.path().join("report");
        let error = build_report(&[("rule".into(), variant)], &[], None, &out).unwrap_err();
        assert!(error.to_string().contains("changed since"), "{error}");
    }

    #[test]
    fn contrast_figures_of_a_teacher_table() {
        let root = tempfile::tempdir().unwrap();
        let row = |id: &str, step: i32, teacher: Vec<f32>, student: Vec<f32>| TeacherLogpRow {
            trajectory_id: id.into(),
            step_index: step,
            teacher_logp: teacher,
            student_logp: student,
            teacher: "self".into(),
            template: "reference".into(),
        };
        let mut writer = TableWriter::create(
            root.path(),
            TableName::TeacherLogp,
            WriteOptions::default(),
            false,
        )
        .unwrap();
        // Contrasts: step a: 1, 3 (mean 2); step b: -2, 0 (mean -1).
        writer
            .write_rows(&[
                row("a", 0, vec![-1.0, -1.0], vec![-2.0, -4.0]),
                row("b", 0, vec![-3.0, -1.0], vec![-1.0, -1.0]),
            ])
            .unwrap();
        writer
            .finish(&producer("teacher-logp", serde_json::json!({})), &[])
            .unwrap();
        let (teacher, _) = scan(&root.path().join("teacher_logp"), TableName::TeacherLogp).unwrap();
        let c = contrast_figures(teacher).unwrap();
        assert_eq!((c.steps, c.tokens), (2, 4));
        assert!((c.token[0] - 0.5).abs() < 1e-9);
        // Population std of 1, 3, -2, 0 around 0.5.
        assert!((c.token[1] - 1.8027756).abs() < 1e-6, "{c:?}");
        assert_eq!((c.token[2], c.token[3]), (-2.0, 3.0));
        assert!((c.step_mean_std - 1.5).abs() < 1e-9);
    }

    #[test]
    fn histogram_has_a_title_axes_and_a_legend_and_says_when_empty() {
        use embodyflow_plots::Png;
        let tmp = tempfile::tempdir().unwrap();
        let dir = embodyflow_plots::test_dir(tmp.path());
        let some = dir.join("report-histogram.png");
        let values = (vec![0.5, 0.6, 0.55, -0.1], vec![-0.5, -0.45, 0.1]);
        histogram_png(&some, &values).unwrap();
        let empty = dir.join("report-histogram-empty.png");
        histogram_png(&empty, &(vec![], vec![])).unwrap();
        let (some, empty) = (Png::read(&some).unwrap(), Png::read(&empty).unwrap());
        for png in [&some, &empty] {
            assert_eq!((png.width, png.height), (640, 400));
            assert!(png.dark_in(200..440, 0..30) > 50, "no title");
            assert!(png.dark_in(0..25, 100..300) > 30, "no y axis label");
            assert!(png.dark_in(250..400, 370..400) > 30, "no x axis label");
            // The legend box, upper left of the plot.
            assert!(png.dark_in(70..300, 35..90) > 100, "no legend");
        }
        assert!(some.colours() > empty.colours());
        let middle = |png: &Png| png.dark_in(150..500, 150..250);
        assert!(middle(&empty) > middle(&some) + 50, "no note");
    }

    #[test]
    fn heatmap_names_its_rows_shows_token_text_and_has_colour_bars() {
        use embodyflow_plots::Png;
        let tmp = tempfile::tempdir().unwrap();
        let dir = embodyflow_plots::test_dir(tmp.path());
        let rows: Vec<HeatmapRow> = (0..3)
            .map(|i| HeatmapRow {
                label: format!("traj-{i}"),
                success: i == 0,
                response_ids: (0..60).map(|t| t % 3).collect(),
                advantages: (0..60).map(|t| (t as f32 - 30.0) / 30.0).collect(),
                step_adv: (i != 2).then(|| (0..60).map(|t| (t % 7) as f32 / 7.0 - 0.5).collect()),
            })
            .collect();
        let tokenizer: tokenizers::Tokenizer =
            r#"{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": null, "model": {"type": "WordLevel", "unk_token": "{\"",
            "vocab": {"{\"": 0, "pick": 1, "drawer": 2}}}"#
                .parse()
                .unwrap();
        let with = dir.join("report-heatmap-tokens.png");
        heatmap_png(&with, &rows, Some(&tokenizer)).unwrap();
        let without = dir.join("report-heatmap.png");
        heatmap_png(&without, &rows, None).unwrap();
        // LEFT + 60 tokens of 12 px + two colour bars; title, 3 bands of a
        // token strip (84 px) and two 14 px rows with a 10 px gap, the axis.
        let band = 84 + 28 + 10;
        for path in [&with, &without] {
            let png = Png::read(path).unwrap();
            assert_eq!(
                (png.width, png.height),
                (190 + 720 + 220, 76 + 3 * band + 60)
            );
            assert!(png.colours() > 50, "{} colours", png.colours());
            assert!(png.dark_in(300..800, 0..30) > 50, "no title");
            for i in 0..3 {
                let top = 76 + i * band;
                // Each response's token text in its strip over the cells,
                // its name left of its cells.
                assert!(
                    png.dark_in(190..910, top..top + 84) > 600,
                    "no token text in band {i}"
                );
                assert!(
                    png.dark_in(0..150, top + 84..top + 112) > 30,
                    "no name in band {i}"
                );
            }
            let axis = 76 + 3 * band;
            assert!(png.dark_in(190..910, axis..axis + 50) > 30, "no token axis");
            assert!(png.dark_in(920..1130, 76..336) > 60, "no colour bars");
        }
        // Words are longer than `#0`, `#1`, `#2`: more dark pixels in the strips.
        let strips = |path: &Path| Png::read(path).unwrap().dark_in(190..910, 76..160);
        assert!(strips(&with) > strips(&without) + 500);
    }
}
