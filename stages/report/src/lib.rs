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
//! (scripts/rl_loop's `curve.tsv`): a table of its figures before RL, first
//! and last, and `success.png`, the train success of the sampled rollouts
//! and the greedy val success per iteration, from the policy RL started
//! from (row `before`, drawn at -1) ([`embodyflow_plots::success_curves`]);
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
//!
//! One module per part of the report, their items re-exported here:
//! `tables` reads the validated tables (scans, the lineage, one-number
//! queries), `credit` the credit figures of a variant, `histogram` and
//! `heatmap` its two PNGs, `settings` the settings it was computed with,
//! `contrast` a teacher's contrast, `step_credit` the Markdown of variants
//! and teachers, `curves` the success per iteration; this file holds the
//! command line, the errors and the run that writes them all or nothing.

use std::path::{Path, PathBuf};

use polars::prelude::{PolarsError, PolarsResult};

mod contrast;
mod credit;
mod curves;
mod heatmap;
mod histogram;
mod settings;
mod step_credit;
mod tables;

pub use contrast::{ContrastFigures, contrast_figures};
pub use credit::{CreditFigures, credit_figures};
pub use curves::{Curve, curves_report, read_curve};
pub use embodyflow_core::diagnostics::{FlipPart, StepPart, VariantDiagnostics};
pub use heatmap::{HeatmapRow, heatmap_png, heatmap_rows};
pub use histogram::histogram_png;
pub use step_credit::build_report;
pub use tables::scan;

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
    /// (scripts/rl_loop's RUN/curve.tsv; `-` where a value is missing;
    /// iteration `before`: the policy RL started from), drawn as
    /// `success.png`.
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

pub(crate) type Result<T> = std::result::Result<T, ReportError>;

pub(crate) fn query<T>(what: &str, result: PolarsResult<T>) -> Result<T> {
    result.map_err(|source| ReportError::Query {
        what: what.to_string(),
        source,
    })
}

/// A figure to three decimals, `-` without one.
pub(crate) fn opt(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.3}"))
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
mod tests;
