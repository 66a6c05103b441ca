//! Per-token heatmaps of advantages (`--heatmaps N`), as in the step-reward
//! notes §9.7: for each of N responses a PNG titled with its trajectory and
//! step, one column per response token,
//! 0. the token's text, read bottom to top (decoded by the policy's
//!    tokenizer, `step.tokenizer` or `--policy CKPT`/tokenizer.json; the token
//!    ids where there is none),
//! 1. the step advantage A^S (red positive, blue negative, white zero),
//! 2. the total advantage A (same colours, the colour bar at the right gives
//!    the scale: the response's largest |A| or |A^S|),
//! 3. a line plot of A^E (grey), A (black) and A^S (green) with the zero
//!    line, its x axis the token position, with a legend at its right.
//!
//! Text is drawn in the font [`embodyflow_plots`] embeds; `heatmaps/index.md`
//! names each file's trajectory, step and value range too.
//!
//! ```text
//! compute-advantages ... --set estimator=grpo_step --policy ckpt --heatmaps 8
//! # OUT/heatmaps/000.png ... 007.png, OUT/heatmaps/index.md
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use arrow::array::{Int32Array, ListArray, StringArray};
use embodyflow_core::dataset::{TableReader, column};
use embodyflow_core::schemas::AdvantageRow;
use embodyflow_core::{Error, Result};
use embodyflow_plots::{
    PlotError, TOKEN_CELL, TOKEN_STRIP, canvas, colour_bar, diverging, text, token_strip,
};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const LEFT: u32 = 70;
const RIGHT: u32 = 130;
const TITLE: u32 = 56;
const TOKENS: u32 = TOKEN_STRIP as u32;
const PANEL: u32 = 40;
const GAP: u32 = 6;
const LINES: u32 = 240;

/// Draws one response's heatmap into `path`; `tokens` is the text of each
/// response token (drawn above the panels when given).
pub(crate) fn render(
    path: &Path,
    row: &AdvantageRow,
    tokens: Option<&[String]>,
) -> std::result::Result<(), PlotError> {
    let n = row.advantages.len().max(1);
    // A token's text needs a 12-pixel column; without text, columns narrow
    // so that long responses stay about 1200 pixels wide.
    let cell = if tokens.is_some() {
        TOKEN_CELL as u32
    } else {
        (1200 / n as u32).clamp(2, 12)
    };
    let strip = if tokens.is_some() { TOKENS } else { 0 };
    let body = cell * n as u32;
    let width = LEFT + body.max(300) + RIGHT;
    let height = TITLE + strip + 2 * (PANEL + GAP) + LINES + 10;
    let root = canvas(path, (width, height))?;
    let zeros = vec![0.0; row.advantages.len()];
    let step_adv = row.step_adv.as_deref().unwrap_or(&zeros);
    let scale = row
        .advantages
        .iter()
        .chain(step_adv)
        .fold(1e-6f32, |m, v| m.max(v.abs()));
    root.draw(&Text::new(
        format!(
            "Advantages per token: {}, step {}",
            row.trajectory_id, row.step_index
        ),
        (width as i32 / 2, 6),
        text(18).pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    root.draw(&Text::new(
        format!(
            "A^E = {:.3}, {} tokens; cells: red > 0, blue < 0, white 0",
            row.episode_adv,
            row.advantages.len()
        ),
        (width as i32 / 2, 32),
        text(12).pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    if let Some(tokens) = tokens {
        let bottom = (TITLE + strip - 4) as i32;
        root.draw(&Text::new(
            "token",
            (LEFT as i32 - 6, bottom),
            text(12).pos(Pos::new(HPos::Right, VPos::Bottom)),
        ))?;
        token_strip(&root, (LEFT as i32, bottom), cell as i32, tokens)?;
    }
    let panels = TITLE + strip;
    for (panel, (values, name)) in [(step_adv, "A^S"), (row.advantages.as_slice(), "A")]
        .into_iter()
        .enumerate()
    {
        let top = panels + panel as u32 * (PANEL + GAP);
        for (t, &v) in values.iter().enumerate() {
            let x = (LEFT + t as u32 * cell) as i32;
            let rect = [(x, top as i32), (x + cell as i32, (top + PANEL) as i32)];
            root.draw(&Rectangle::new(
                rect,
                diverging(f64::from(v), f64::from(scale)).filled(),
            ))?;
        }
        let frame = [
            (LEFT as i32, top as i32),
            ((LEFT + body) as i32, (top + PANEL) as i32),
        ];
        root.draw(&Rectangle::new(frame, BLACK.stroke_width(1)))?;
        root.draw(&Text::new(
            name,
            (LEFT as i32 - 6, (top + PANEL / 2) as i32),
            text(13).pos(Pos::new(HPos::Right, VPos::Center)),
        ))?;
    }
    let bar = root.clone().shrink(
        (LEFT + body.max(300) + 10, panels),
        (RIGHT - 10, 2 * (PANEL + GAP) + 110),
    );
    colour_bar(&bar, f64::from(scale), "advantage (A, A^S)")?;
    let top = panels + 2 * (PANEL + GAP);
    let area = root
        .clone()
        .shrink((LEFT - 60, top), (60 + body.max(300), LINES));
    let y = scale.max(row.episode_adv.abs()) as f64 * 1.1;
    let x_end = body.max(300) as f64 / cell as f64;
    let mut chart = ChartBuilder::on(&area)
        .y_label_area_size(60)
        .x_label_area_size(40)
        .build_cartesian_2d(0f64..x_end, -y..y)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("response token position (tokens)")
        .y_desc("advantage")
        .label_style(text(12))
        .axis_desc_style(text(13))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    let series = |values: &[f32]| {
        values
            .iter()
            .enumerate()
            .map(|(t, &v)| (t as f64 + 0.5, f64::from(v)))
            .collect::<Vec<_>>()
    };
    chart.draw_series(LineSeries::new(
        vec![(0.0, 0.0), (n as f64, 0.0)],
        RGBColor(200, 200, 200),
    ))?;
    let lines = [
        (
            vec![row.episode_adv; n],
            RGBColor(128, 128, 128),
            "A^E (episode)",
        ),
        (row.advantages.clone(), BLACK, "A (total)"),
        (step_adv.to_vec(), RGBColor(0, 150, 0), "A^S (step)"),
    ];
    // The lines' legend right of the plot, under the colour bar.
    let key_x = (LEFT + body.max(300) + 12) as i32;
    let key_y = (panels + 2 * (PANEL + GAP) + 140) as i32;
    for (k, (values, colour, name)) in lines.into_iter().enumerate() {
        chart.draw_series(LineSeries::new(series(&values), colour.stroke_width(2)))?;
        let y = key_y + 20 * k as i32;
        root.draw(&PathElement::new(
            vec![(key_x, y), (key_x + 18, y)],
            colour.stroke_width(2),
        ))?;
        root.draw(&Text::new(
            name,
            (key_x + 24, y),
            text(12).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    root.present()?;
    Ok(())
}

/// The response token ids of `rows` (by trajectory id and step), read from
/// the steps table in batches of `batch_rows`.
pub(crate) fn response_ids(
    steps: &TableReader,
    rows: &[AdvantageRow],
    batch_rows: usize,
) -> Result<Vec<Vec<i32>>> {
    let mut wanted: HashMap<&str, HashMap<i32, usize>> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        wanted
            .entry(r.trajectory_id.as_str())
            .or_default()
            .insert(r.step_index, i);
    }
    let mut left = rows.len();
    let mut ids = vec![Vec::new(); rows.len()];
    let columns = ["trajectory_id", "step_index", "response_ids"];
    for batch in steps.batches(Some(&columns), batch_rows)? {
        if left == 0 {
            break;
        }
        let batch = batch?;
        let trajectory = column::<StringArray>(&batch, "trajectory_id");
        let step = column::<Int32Array>(&batch, "step_index");
        let response = column::<ListArray>(&batch, "response_ids");
        for i in 0..batch.num_rows() {
            let found = wanted
                .get_mut(trajectory.value(i))
                .and_then(|steps| steps.remove(&step.value(i)));
            if let Some(k) = found {
                left -= 1;
                let list = response.value(i);
                let values = list.as_any().downcast_ref::<Int32Array>().ok_or_else(|| {
                    Error::BadInput("steps: response_ids is not a list of int32".into())
                })?;
                ids[k] = values.values().to_vec();
            }
        }
    }
    Ok(ids)
}

/// Each token's text (shared with the report's heatmap).
pub use embodyflow_plots::token_texts;

/// Renders `rows` into `out_dir` (created if absent), one PNG each, with an
/// index; returns how many were drawn. The rows are the ones the run kept as
/// it wrote them: the first N with a non-zero A^S, then the first without
/// ([`crate::output::AdvantagesOut`]); `tokens` holds each row's token texts
/// when known.
pub(crate) fn render_rows(
    rows: &[AdvantageRow],
    tokens: &[Option<Vec<String>>],
    out_dir: &Path,
) -> Result<usize> {
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let mut index = String::from(
        "# Advantage heatmaps\n\nEach PNG: the tokens' text, then panels A^S per token and A per token (red positive, blue negative, white zero, \
         scaled by the response's largest value, the colour bar at the right), and A^E (grey), A (black), A^S (green) as lines over the token position.\n\n\
         | file | trajectory | step | tokens | A^E | A min | A max |\n|---|---|---|---|---|---|---|\n",
    );
    for (i, row) in rows.iter().enumerate() {
        let file = format!("{i:03}.png");
        let path = out_dir.join(&file);
        let text = tokens.get(i).and_then(|t| t.as_deref());
        render(&path, row, text)
            .map_err(|e| Error::BadInput(format!("heatmap {}: {e}", path.display())))?;
        let min = row.advantages.iter().copied().fold(f32::INFINITY, f32::min);
        let max = row
            .advantages
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let _ = writeln!(
            index,
            "| [{file}]({file}) | {} | {} | {} | {:.4} | {min:.4} | {max:.4} |",
            row.trajectory_id,
            row.step_index,
            row.advantages.len(),
            row.episode_adv
        );
    }
    let index_path = out_dir.join("index.md");
    std::fs::write(&index_path, index).map_err(|e| Error::io(&index_path, e))?;
    Ok(rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_plots::Png;

    fn row(tokens: usize) -> AdvantageRow {
        AdvantageRow {
            trajectory_id: "it0-g3-r1".into(),
            step_index: 2,
            advantages: (0..tokens).map(|t| 0.5 + (t % 5) as f32 / 10.0).collect(),
            returns: None,
            episode_adv: 0.5,
            step_adv: Some((0..tokens).map(|t| (t % 5) as f32 / 10.0 - 0.2).collect()),
            estimator: "grpo_step".into(),
        }
    }

    #[test]
    fn a_heatmap_has_a_title_token_text_panels_axis_legend_and_colour_bar() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = embodyflow_plots::test_dir(tmp.path());
        let texts: Vec<String> = ["{\"", "plan", "\":", " [", "\"pick", " up", "\n"]
            .iter()
            .cycle()
            .take(40)
            .map(|s| s.to_string())
            .collect();
        let with = dir.join("advantages-heatmap-tokens.png");
        render(&with, &row(40), Some(&texts)).unwrap();
        let without = dir.join("advantages-heatmap.png");
        render(&without, &row(40), None).unwrap();
        let with = Png::read(&with).unwrap();
        let without = Png::read(&without).unwrap();
        // 40 tokens of 12 px between the margins; the token strip only with text.
        assert_eq!(
            (with.width, with.height),
            (70 + 480 + 130, 56 + 84 + 92 + 240 + 10)
        );
        assert_eq!(
            (without.width, without.height),
            (70 + 480 + 130, 56 + 92 + 240 + 10)
        );
        for (png, strip) in [(&with, 84), (&without, 0)] {
            assert!(png.colours() > 30, "{} colours", png.colours());
            assert!(png.dark_in(150..550, 0..30) > 50, "no title");
            // Panel names left of the panels, the colour bar's numbers right.
            let panels = 56 + strip;
            assert!(
                png.dark_in(30..68, panels..panels + 86) > 20,
                "no panel names"
            );
            assert!(
                png.dark_in(560..680, panels..panels + 300) > 40,
                "no colour bar"
            );
        }
        // The token strip above the panels holds the tokens' text.
        assert!(with.dark_in(70..550, 60..136) > 200);
        // The line plot's x axis label under the tokens.
        let axis = with.height - 30;
        assert!(
            with.dark_in(200..450, axis..with.height) > 30,
            "no x axis label"
        );
    }
}
