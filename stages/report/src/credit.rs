//! The credit figures of one advantages variant, by trajectory outcome:
//! credited tokens (a non-zero A^S), the sign-flip ratio over them and the
//! A^S distribution of successful and failed trajectories.
//!
//! ```text
//! flip = mean[sign(A) != sign(A^E)] over credited tokens (all, A^E != 0, success, failure)
//! ```

use polars::prelude::*;

use crate::tables::{EXPLODE, u64_at};
use crate::{Result, query};

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

/// -1, 0 or 1 by the sign of `e`.
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
