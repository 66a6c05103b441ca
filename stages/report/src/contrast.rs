//! A teacher's contrast over a teacher-logp table: `d = teacher_logp -
//! student_logp` per token (mean, std, min, max) and the spread of its
//! per-step mean.
//!
//! ```text
//! d_t = teacher_logp_t - student_logp_t;  step_mean_std = std over steps of mean_t d_t
//! ```

use polars::prelude::*;

use crate::tables::{EXPLODE, u64_at};
use crate::{Result, query};

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
