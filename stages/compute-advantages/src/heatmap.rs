//! Per-token heatmaps of advantages (`--heatmaps N`), as in the step-reward
//! notes §9.7: for each of N responses a PNG with three panels, one column per
//! response token,
//! 1. the step advantage A^S (red positive, blue negative, white zero),
//! 2. the total advantage A (same colours),
//! 3. a line plot of A^E (grey), A (black) and A^S (green) with the zero line,
//!
//! colours scaled by the response's largest |A| or |A^S|. The images carry no
//! text (no font dependency); `heatmaps/index.md` names each file's
//! trajectory, step and value range.

use std::fmt::Write as _;
use std::path::Path;

use embodyflow_core::schemas::AdvantageRow;
use embodyflow_core::{Error, Result};
use plotters::prelude::*;

const PANEL: u32 = 60;
const LINES: u32 = 160;
const GAP: u32 = 10;

fn colour(value: f32, scale: f32) -> RGBColor {
    let t = (value.abs() / scale).clamp(0.0, 1.0);
    let fade = (255.0 * (1.0 - t)) as u8;
    if value > 0.0 {
        RGBColor(255, fade, fade)
    } else if value < 0.0 {
        RGBColor(fade, fade, 255)
    } else {
        WHITE
    }
}

/// Draws one response's heatmap into `path`.
pub fn render(path: &Path, row: &AdvantageRow) -> std::result::Result<(), String> {
    let n = row.advantages.len().max(1);
    let cell = (1200 / n as u32).clamp(2, 12);
    let width = cell * n as u32 + 2 * GAP;
    let height = 2 * PANEL + LINES + 4 * GAP;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let zeros = vec![0.0; row.advantages.len()];
    let step_adv = row.step_adv.as_deref().unwrap_or(&zeros);
    let scale = row
        .advantages
        .iter()
        .chain(step_adv)
        .fold(1e-6f32, |m, v| m.max(v.abs()));
    for (panel, values) in [step_adv, row.advantages.as_slice()]
        .into_iter()
        .enumerate()
    {
        let top = GAP + panel as u32 * (PANEL + GAP);
        for (t, &v) in values.iter().enumerate() {
            let x = (GAP + t as u32 * cell) as i32;
            let rect = [(x, top as i32), (x + cell as i32, (top + PANEL) as i32)];
            root.draw(&Rectangle::new(rect, colour(v, scale).filled()))
                .map_err(|e| e.to_string())?;
        }
        let frame = [
            (GAP as i32, top as i32),
            ((GAP + cell * n as u32) as i32, (top + PANEL) as i32),
        ];
        root.draw(&Rectangle::new(frame, BLACK.stroke_width(1)))
            .map_err(|e| e.to_string())?;
    }
    let top = GAP + 2 * (PANEL + GAP);
    let area = root.clone().shrink((GAP, top), (cell * n as u32, LINES));
    let y = scale.max(row.episode_adv.abs()) * 1.1;
    let mut chart = ChartBuilder::on(&area)
        .build_cartesian_2d(0f32..n as f32, -y..y)
        .map_err(|e| e.to_string())?;
    let series = |values: Vec<f32>| {
        values
            .into_iter()
            .enumerate()
            .map(|(t, v)| (t as f32 + 0.5, v))
            .collect::<Vec<_>>()
    };
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, 0.0), (n as f32, 0.0)],
            RGBColor(200, 200, 200),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            series(vec![row.episode_adv; n]),
            RGBColor(128, 128, 128),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            series(step_adv.to_vec()),
            RGBColor(0, 150, 0),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(series(row.advantages.clone()), BLACK))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Renders `rows` into `out_dir` (created if absent), one PNG each, with an
/// index; returns how many were drawn. The rows are the ones the run kept as
/// it wrote them: the first N with a non-zero A^S, then the first without
/// ([`crate::output::AdvantagesOut`]).
pub fn render_rows(rows: &[AdvantageRow], out_dir: &Path) -> Result<usize> {
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let mut index = String::from(
        "# Advantage heatmaps\n\nPanels, top to bottom: A^S per token, A per token (red positive, blue negative, white zero, \
         scaled by the response's largest value), and A^E (grey), A (black), A^S (green) as lines.\n\n\
         | file | trajectory | step | tokens | A^E | A min | A max |\n|---|---|---|---|---|---|---|\n",
    );
    for (i, row) in rows.iter().enumerate() {
        let file = format!("{i:03}.png");
        let path = out_dir.join(&file);
        render(&path, row)
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
