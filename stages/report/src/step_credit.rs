//! The step-credit Markdown: one row per advantages variant (its settings,
//! credit figures, flips from its diagnostics, links to its histogram and
//! heatmap, which it draws) and one per teacher (its contrast).
//!
//! ```text
//! | variant | settings | credited / tokens | flip all | … | histogram | heatmap |
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use embodyflow_core::schemas::TableName;

use crate::heatmap::HEATMAP_RESPONSES;
use crate::settings::variant_settings;
use crate::tables::lineage;
use crate::{
    FlipPart, ReportError, Result, VariantDiagnostics, contrast_figures, credit_figures,
    heatmap_png, heatmap_rows, histogram_png, opt, scan,
};

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

/// A share of flipped tokens to three decimals, `-` without tokens.
fn ratio(part: FlipPart) -> String {
    if part.tokens == 0 {
        "-".into()
    } else {
        format!("{:.3}", part.flipped as f64 / part.tokens as f64)
    }
}

/// A variant's name as a file name's part: ASCII letters, digits, `-` and
/// `_`, the rest `_`.
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
