//! The per-token heatmap of a variant's first responses (the seeds'
//! `*_total.png` / `*_stepReward.png`): each token's text, A and A^S per
//! token, red positive, blue negative, each response named by trajectory
//! id and step.
//!
//! ```text
//! advantages ⋈ rewards (success) → first N by (trajectory_id, step_index) ⋈ steps (response_ids)
//! ```

use std::path::Path;

use polars::prelude::*;

use crate::{ReportError, Result, query};

/// Responses drawn in each variant's heatmap (each with its token text, at
/// 12 pixels a token).
pub(crate) const HEATMAP_RESPONSES: u32 = 8;

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
    use embodyflow_plots::{TOKEN_CELL, TOKEN_STRIP, canvas, colour_bar, token_axis};
    let longest = rows.iter().map(|r| r.advantages.len()).max().unwrap_or(0);
    let scale = rows
        .iter()
        .flat_map(|r| r.advantages.iter())
        .fold(0.0f32, |m, v| m.max(v.abs()));
    let band = TOKEN_STRIP + 2 * ROW + 10;
    let body = rows.len().max(1) as i32 * band;
    let width = (LEFT + longest.max(40) as i32 * TOKEN_CELL + BARS).max(640) as u32;
    let height = (TOP + body.max(260) + 60) as u32;
    let draw = || -> std::result::Result<(), embodyflow_plots::PlotError> {
        let root = canvas(path, (width, height))?;
        draw_header(&root, rows, width, scale, tokenizer)?;
        for (i, row) in rows.iter().enumerate() {
            draw_band(&root, row, TOP + i as i32 * band, scale, tokenizer)?;
        }
        token_axis(&root, (LEFT, TOP + body + 2), TOKEN_CELL, longest)?;
        let bars_x = LEFT + longest.max(40) as i32 * TOKEN_CELL + 10;
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

/// Height of a band's A and A^S rows, pixels.
const ROW: i32 = 14;
/// Width of the outcome strip left of a band's rows.
const STRIP: i32 = 8;
/// Where the tokens start: the names of the responses are left of it.
const LEFT: i32 = 190;
/// Where the first band starts, under the title, the key and the note.
const TOP: i32 = 76;
/// Room for the two colour bars right of the tokens.
const BARS: i32 = 220;
/// The outcome strip's colours.
const OUTCOMES: [(plotters::style::RGBColor, &str); 2] = [
    (
        plotters::style::RGBColor(40, 160, 60),
        "successful trajectory",
    ),
    (
        plotters::style::RGBColor(150, 150, 150),
        "failed trajectory",
    ),
];

type Canvas<'a> =
    plotters::drawing::DrawingArea<plotters::backend::BitMapBackend<'a>, plotters::coord::Shift>;

/// The title, the outcome key and the note on what a band shows (and when
/// every A and A^S is 0).
fn draw_header(
    root: &Canvas<'_>,
    rows: &[HeatmapRow],
    width: u32,
    scale: f32,
    tokenizer: Option<&tokenizers::Tokenizer>,
) -> embodyflow_plots::Result<()> {
    use embodyflow_plots::{swatch, text};
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    root.draw(&Text::new(
        format!("Per-token advantages of the first {} responses", rows.len()),
        (width as i32 / 2, 8),
        text(18).pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    for (k, (colour, name)) in OUTCOMES.into_iter().enumerate() {
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
    Ok(())
}

/// One response's band from `top` down: its name and outcome strip, its
/// token texts, and its rows of A (scaled to `scale`) and A^S (to 1).
fn draw_band(
    root: &Canvas<'_>,
    row: &HeatmapRow,
    top: i32,
    scale: f32,
    tokenizer: Option<&tokenizers::Tokenizer>,
) -> embodyflow_plots::Result<()> {
    use embodyflow_plots::{TOKEN_CELL, TOKEN_STRIP, diverging, text, token_strip, token_texts};
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let cells = top + TOKEN_STRIP;
    let outcome = if row.success {
        OUTCOMES[0].0
    } else {
        OUTCOMES[1].0
    };
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
    token_strip(root, (LEFT, cells - 3), TOKEN_CELL, &texts)?;
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
            let x = LEFT + t as i32 * TOKEN_CELL;
            root.draw(&Rectangle::new(
                [(x, y), (x + TOKEN_CELL, y + ROW)],
                diverging(f64::from(value), f64::from(line_scale)).filled(),
            ))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
